"""A memory-scheduled step pinned whole (`lms.tf.exact`): bitwise-identical training, one order, safe fallbacks.

Each case trains k steps with a plain ``tf.function`` and with ``lms.function``
under a memory schedule; on this CPU the step must run pinned whole (every op of
TF's optimized graph on one chain, Grappler off), train bit for bit like the
plain step, and run its ops in the same order in every process. Steps that
cannot be pinned whole (a ``tf.print``, control flow) keep the partial pins and
say why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import lms  # noqa: E402
from lms import LMSConfig  # noqa: E402
from lms.tf.exact import ExactUnavailable, build_exact_step, unpinnable_reason  # noqa: E402
from tests.tf.conftest import assert_bitwise, check_pinned_schedule  # noqa: E402

pytestmark = [pytest.mark.tf]

ROOT = Path(__file__).resolve().parents[2]

CONFIGS = {
    "memory-all": LMSConfig(n_tensors=-1, schedule="memory"),
    "memory-lb3-sync3": LMSConfig(n_tensors=-1, lb=3, schedule="memory", sync_mode=3),
    "memory-prefetch": LMSConfig(n_tensors=-1, lb=2, schedule="memory", prefetch="headroom"),
    "memory-recompute-fused": LMSConfig(n_tensors=-1, schedule="memory", recompute="cheap", fuse_swapins=True),
    "memory-no-swaps": LMSConfig(n_tensors=0, schedule="memory"),
}


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("model", ["mlp", "cnn_bn", "residual"])
@pytest.mark.parametrize("emulate", [True, False])
def test_a_step_pinned_whole_trains_bitwise_identically(cases, model, config_name, emulate):
    case = cases[model]
    step = lms.function(case.step_fn(), config=CONFIGS[config_name], emulate=emulate)
    assert_bitwise(case.baseline, case.run(step))
    whole = step.pinned_whole
    assert whole is not None, step.whole_reason
    assert whole.order.n_chained > 0 and whole.kernels
    # the chain is in the function that runs: every edge is a control input there
    ops = {op.name: op for op in whole.function.graph.get_operations()}
    assert whole.order.edges
    for a, b in whole.order.edges:
        assert a in {c.name for c in ops[b].control_inputs}, (a, b)
    check_pinned_schedule(step, model)  # what tests/tf/test_pin.py checked of these configs


def test_the_dry_runs_leave_the_step_and_its_variables_untouched(cases):
    case = cases["cnn_bn"]
    case.reset()
    step = lms.function(case.step_fn(), config=CONFIGS["memory-all"], emulate=True)
    x, y = tf.constant(case.x), tf.constant(case.y)
    concrete = step.get_concrete_function(x, y)
    before = [v.numpy() for v in case.model.weights + case.optimizer.variables]
    trace = step._rewriter.traces[concrete.graph]  # noqa: SLF001
    whole = build_exact_step(concrete, [x, y], trace.schedule.order)
    after = [v.numpy() for v in case.model.weights + case.optimizer.variables]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert whole.timings["capture_s"] > 0 and whole.n_nodes > whole.order.n_chained
    case.reset()


def test_an_unknown_batch_is_learnt_from_the_first_real_step_not_the_dry_runs(cases):
    """The dry runs use one sample; the summary's batch must still be the batch that ran."""
    case = cases["cnn_bn"]
    spec = [tf.TensorSpec((None, *case.x.shape[1:]), tf.float32), tf.TensorSpec((None,), tf.int32)]
    step = lms.function(case.step_fn(), config=CONFIGS["memory-all"], emulate=True, input_signature=spec)
    case.run(step, k=1)
    assert step.pinned_whole is not None, step.whole_reason
    assert step.summary.batch_size == len(case.x)


def _printing_step(case):
    inner = case.step_fn()

    def step(x, y):
        loss = inner(x, y)
        tf.print("loss", loss, output_stream=sys.stderr)
        return loss

    return step


def test_a_step_with_another_stateful_op_keeps_the_partial_pins_and_says_why(cases):
    case = cases["mlp"]
    step = lms.function(_printing_step(case), config=CONFIGS["memory-all"], emulate=True)
    got = case.run(step)
    assert step.pinned_whole is None
    assert "PrintV2" in step.whole_reason and "stateful" in step.whole_reason
    plain = case.run(tf.function(_printing_step(case)))
    assert_bitwise(plain, got)
    with pytest.raises(ExactUnavailable, match="PrintV2"):
        case.run(lms.function(_printing_step(case), config=CONFIGS["memory-all"], emulate=True, pin_whole=True))
    case.reset()


def test_control_flow_keeps_the_partial_pins(cases):
    case = cases["mlp"]
    inner = case.step_fn()

    def step(x, y):
        return tf.cond(tf.reduce_sum(x) > -1e9, lambda: inner(x, y), lambda: tf.constant(0.0))

    graph = tf.function(step).get_concrete_function(tf.constant(case.x), tf.constant(case.y)).graph
    assert "control flow" in unpinnable_reason(graph)


def test_pin_whole_false_and_a_recording_tape_run_the_partial_pins(cases):
    case = cases["cnn_bn"]
    off = lms.function(case.step_fn(), config=CONFIGS["memory-all"], emulate=True, pin_whole=False)
    assert_bitwise(case.baseline, case.run(off))
    assert off.pinned_whole is None and off.whole_reason == ""
    taped = lms.function(case.step_fn(), config=CONFIGS["memory-all"], emulate=True)
    case.reset()
    with tf.GradientTape():
        taped(tf.constant(case.x), tf.constant(case.y))
    assert taped.pinned_whole is None
    case.reset()
    with pytest.raises(ValueError, match="pin_whole"):
        lms.function(case.step_fn(), config=CONFIGS["memory-all"], pin_whole="yes")
    eager = lms.function(case.step_fn(), config=CONFIGS["memory-all"], emulate=True)
    tf.config.run_functions_eagerly(True)
    try:
        eager(tf.constant(case.x), tf.constant(case.y))
    finally:
        tf.config.run_functions_eagerly(False)
    assert eager.pinned_whole is None and eager.summary.note  # ran eagerly, as asked: nothing rebuilt
    case.reset()


_CHILD = r"""
import json, os, sys, tempfile
sys.path.insert(0, os.environ["LMS_ROOT"])
import tensorflow as tf
tf.config.threading.set_inter_op_parallelism_threads(1)
import lms
from lms.tf.train import make_train_step
from tuner.models import load_workload
w = load_workload("residual")
step = lms.function(make_train_step(w.build_model(), w.loss_fn, w.make_optimizer()),
                    config=lms.LMSConfig(n_tensors=-1, lb=2, schedule="memory"), emulate=True,
                    input_signature=[w.x_spec(), w.y_spec()], autograph=False)
from lms.tf.measure import device_batch, measure_step
x, y = device_batch(w.make_batch(8, 0), "CPU:0")
m = measure_step(step, (x, y), warmup=2, steps=3, device="CPU:0", executor="single_threaded")
with tf.experimental.function_executor_type("SINGLE_THREADED_EXECUTOR"):
    logdir = tempfile.mkdtemp()
    tf.profiler.experimental.start(logdir)
    step(x, y).numpy()
    tf.profiler.experimental.stop()
from lms.tf.live import allocation_events
events = allocation_events(logdir)
print(json.dumps({"whole": step.pinned_whole is not None, "sizes": [s for _, s in events if s > 0],
                  "peaks": list(m.step_peaks_bytes)}))
from tuner.trial import exit_now
exit_now(0)  # without TF's teardown (about 2 s)
"""


@pytest.mark.slow
def test_the_executed_allocation_sequence_and_the_peak_are_the_same_in_every_process():
    """Pinned whole, the ops run in one order: TF's allocator sees the same requests in every process, and
    (the batch in its memory, the dry runs leaving nothing where they ran) reports the same peak per step."""
    env = dict(os.environ, LMS_ROOT=str(ROOT), TF_CPU_ALLOCATOR_USE_BFC="true", TF_CPP_MIN_LOG_LEVEL="2",
               CUDA_VISIBLE_DEVICES="")
    runs = []
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert all(r["whole"] for r in runs)
    assert len(runs[0]["sizes"]) > 50
    assert runs[0]["sizes"] == runs[1]["sizes"] == runs[2]["sizes"]
    assert runs[0]["peaks"] == runs[1]["peaks"] == runs[2]["peaks"]  # to the byte


def test_a_dry_runs_stand_ins_are_freed_at_once_and_collected_only_when_a_cycle_holds_one(monkeypatch):
    """The full collection after each dry run cost 0.2-0.4 s and found nothing: reference counting frees the
    stand-ins. It runs only when a cycle still holds one, and then frees it before the next dry run."""
    import gc
    import weakref

    from lms.tf import exact

    collected = []
    real = gc.collect
    monkeypatch.setattr(exact.gc, "collect", lambda *a: (collected.append(1), real(*a))[1])

    v = tf.Variable(tf.zeros([4]))
    ref = weakref.ref(v)
    stand_ins, keep = [v.handle], [v]
    del v
    exact._free(stand_ins, keep)  # noqa: SLF001
    assert ref() is None and collected == [] and stand_ins == [] and keep == []

    w = tf.Variable(tf.zeros([4]))
    ref = weakref.ref(w)
    cycle: list = [w]
    cycle.append(cycle)
    stand_ins, keep = [w.handle], [w]
    del w, cycle
    exact._free(stand_ins, keep)  # noqa: SLF001
    assert collected == [1] and ref() is None


# ---- order-dependent sums: Grappler's memory optimizer turns a large AddN into an accumulation ------------

_ADAM_CHILD = r"""
import json, logging, sys
import numpy as np, tensorflow as tf, keras, lms
logging.basicConfig(level=logging.INFO)
mode = sys.argv[1]
keras.utils.set_random_seed(3)
x = inp = keras.Input((64, 64, 3))
x = keras.layers.Conv2D(32, 3, padding="same")(x)
h = keras.layers.Conv2D(32, 3, padding="same")(x)
h = keras.layers.Activation("relu")(keras.layers.BatchNormalization()(h))
h = keras.layers.Conv2D(32, 3, padding="same")(h)
x = keras.layers.Add()([x, keras.layers.BatchNormalization()(h)])
m = keras.Model(inp, keras.layers.Dense(7)(keras.layers.GlobalAveragePooling2D()(x)))
opt = keras.optimizers.Adam(1e-3)
lf = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
def step(x, y):
    with tf.GradientTape() as t:
        loss = lf(y, m(x, training=True))
    opt.apply_gradients(zip(t.gradient(loss, m.trainable_variables), m.trainable_variables))
    return loss
f = tf.function(step) if mode == "plain" else lms.function(step, config=lms.LMSConfig(n_tensors=0, schedule="memory"))
xs = tf.random.stateless_normal([48, 64, 64, 3], seed=(1, 2)); ys = tf.zeros([48], tf.int32)
for _ in range(2):
    f(xs, ys)
flat = np.concatenate([v.numpy().ravel() for v in m.variables])
print(json.dumps({"sha": __import__("hashlib").sha1(flat.tobytes()).hexdigest()}))
"""


@pytest.mark.slow
def test_a_step_with_an_order_dependent_sum_is_not_pinned_whole_and_trains_bitwise():
    """Issue 55's reproduction, one block: at this size Grappler's memory optimizer makes one AddN of the
    BatchNorm backward an accumulation whose bits follow the order TF's executor adds its terms in. Pinned
    whole, the memory schedule's order summed them otherwise (every weight differed after 3 Adam steps);
    the step now keeps the partial pins and trains as plain does. Single-threaded, where plain repeats."""
    env = dict(os.environ, TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")

    def run(mode):  # noqa: ANN001, ANN202
        proc = subprocess.run([sys.executable, "-c", _ADAM_CHILD, mode], env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])["sha"], proc.stderr

    plain, _ = run("plain")
    assert run("plain")[0] == plain  # plain repeats itself under these settings
    mem, log = run("mem")
    assert "an accumulation whose bits depend on the order" in log
    assert mem == plain


def test_order_dependent_sums_are_found_by_their_accumulate_terms():
    from lms.schedule.exact_order import Node, order_dependent_sums

    nodes = [Node("a", "Relu"), Node("AddN_1/tmp_var", "TemporaryVariable"),
             Node("AddN_1/tmp_var_accum_0", "AssignAdd", ("AddN_1/tmp_var", "a")),
             Node("AddN_1/tmp_var_accum_1", "AssignAdd", ("AddN_1/tmp_var", "a")),
             Node("g/tmp_var_accum_0", "Identity", ("a",)), Node("AddN", "AddN", ("a", "a"))]
    assert order_dependent_sums(nodes) == ("AddN_1",)
    assert order_dependent_sums(nodes[:1] + nodes[-2:]) == ()
