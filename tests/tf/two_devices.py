"""Run LMS steps on two logical CPU devices, host ``/CPU:0`` and "device" ``/CPU:1``; print what TF ran, as JSON.

A GPU step is partitioned into a host graph and a device graph joined by
``_Send``/``_Recv`` pairs; two logical CPU devices are partitioned the same way,
so where the swap copies sit and when they start can be checked without a GPU
(memory cannot: both devices share one allocator). Run as a script (the logical
devices must be set up before TensorFlow starts), by `tests/tf/test_placement.py`::

    python -m tests.tf.two_devices [config names...]

For each config: a fresh `lms.function` (real swap ops, ``emulate=False``) of a
small residual CNN's training step placed on ``/CPU:1``; its partition graphs on
the first call (`lms.tf.placement.swap_transfers`); one profiled step
(`lms.tf.placement.transfers_started_early`); 3 steps from the same weights as a
plain ``tf.function``, compared bit for bit (loss, weights, optimizer variables).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402

import lms  # noqa: E402
from lms.tf.placement import executed_partition_graphs, op_intervals, swap_transfers, transfers_started_early  # noqa: E402

DEVICE = "/device:CPU:1"
CONFIGS = {
    "all-lb1": lms.LMSConfig(n_tensors=-1, lb=1),
    "lb3-fused": lms.LMSConfig(lb=3, fuse_swapins=True),
    "direct-branches": lms.LMSConfig(ctrld_strategy="direct_order", swap_branches=True, branch_threshold=1),
    "memory-headroom": lms.LMSConfig(lb=1, schedule="memory", prefetch="headroom"),
    "recompute-fused": lms.LMSConfig(recompute="cheap", fuse_swapins=True),
}
STEPS = 3


def _model() -> tuple[keras.Model, keras.optimizers.Optimizer]:
    keras.utils.set_random_seed(7)
    with tf.device(DEVICE):
        inp = keras.Input((16, 16, 3))
        h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inp)
        for _ in range(2):  # residual blocks: skip connections for swap_branches
            b = keras.layers.Conv2D(8, 3, padding="same")(h)
            b = keras.layers.BatchNormalization()(b)
            b = keras.layers.Activation("relu")(b)
            b = keras.layers.Conv2D(8, 3, padding="same")(b)
            h = keras.layers.Activation("relu")(keras.layers.Add()([h, b]))
        out = keras.layers.Dense(4)(keras.layers.Flatten()(h))
        model = keras.Model(inp, out)
        opt = keras.optimizers.SGD(0.05, momentum=0.9)
        opt.build(model.trainable_variables)
    return model, opt


MODEL, OPT = _model()
INITIAL = [v.numpy() for v in (*MODEL.variables, *OPT.variables)]
rng = np.random.default_rng(0)
X = tf.constant(rng.uniform(size=(4, 16, 16, 3)).astype("float32"))
Y = tf.constant(rng.normal(size=(4, 4)).astype("float32"))


def _step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    with tf.device(DEVICE):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(MODEL(x, training=True) - y))
        grads = tape.gradient(loss, MODEL.trainable_variables)
        OPT.apply_gradients(zip(grads, MODEL.trainable_variables))
    return loss


def _restore() -> None:
    for v, value in zip((*MODEL.variables, *OPT.variables), INITIAL):
        v.assign(value)


def _train(fn) -> tuple[list, list]:  # noqa: ANN001
    losses = [fn(X, Y).numpy() for _ in range(STEPS)]
    return losses, [v.numpy() for v in (*MODEL.variables, *OPT.variables)]


def _bitwise(a: tuple[list, list], b: tuple[list, list]) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a[0] + a[1], b[0] + b[1])) and len(a[1]) == len(b[1])


def run(name: str, baseline: tuple[list, list]) -> dict:
    _restore()
    # pin_whole=False: as on a GPU, a memory schedule is pinned through the pinnable ops only (the
    # whole-step pinning of `lms.tf.exact` is for one CPU device and would run the step first)
    fn = lms.function(_step, config=CONFIGS[name], emulate=False, pin_whole=False)
    partitions = executed_partition_graphs(fn, X, Y)  # step 1 (instantiates, records the graphs)
    plan = fn.plan
    transfers = swap_transfers(partitions, plan, edges=fn.schedule.edges if fn.schedule is not None else ())
    logdir = tempfile.mkdtemp(prefix="lms-two-devices-")
    try:
        tf.profiler.experimental.start(logdir)
        try:
            fn(X, Y).numpy()
        finally:
            tf.profiler.experimental.stop()
        intervals = op_intervals(logdir)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    early, timed = transfers_started_early(transfers, intervals)
    _restore()
    bitwise = _bitwise(baseline, _train(fn))
    swap_in_device = {n.name: n.device for pg in partitions for n in pg.node
                      if any(n.name == si.name for s in plan.swaps for si in s.swap_ins)}
    clones = [n for pg in partitions for n in pg.node if "-lms_recompute_" in n.name or "-lms_gate_" in n.name]
    return {
        "config": name,
        "n_swaps": len(plan.swaps),
        "n_swap_ins": sum(len(s.swap_ins) for s in plan.swaps),
        "n_recomputed": len(plan.recompute.recomputes) if plan.recompute is not None else 0,
        "swap_in_devices": sorted(set(swap_in_device.values())),
        "clone_devices": sorted({n.device for n in clones}),
        "to_device": [t.swap_ins for t in transfers if t.swap_ins and t.dst_device.endswith("CPU:1")],
        "ungated": [[t.tensor, list(t.swap_ins), t.send] for t in transfers if t.after_trigger is False],
        "unknown": [[t.tensor, list(t.swap_ins)] for t in transfers if t.swap_ins and t.after_trigger is None],
        "served": sorted({si for t in transfers for si in t.swap_ins}),
        "timed": timed,
        "early": [[t.tensor, t.send] for t in early],
        "bitwise": bitwise,
    }


def main(names: list[str]) -> None:
    _restore()
    baseline = _train(tf.function(_step))
    results = [run(name, baseline) for name in names or list(CONFIGS)]
    print(json.dumps(results))


if __name__ == "__main__":
    from tuner.trial import exit_now

    main(sys.argv[1:])
    exit_now(0)  # without TF's teardown (about 2 s)
