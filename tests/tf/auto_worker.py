"""One ``config="auto"`` run on the emulated device, in a fresh process; prints its figures as JSON.

    python -m tests.tf.auto_worker '{"programs": [["zoo:residual", 256], ["loop:vae", 8192]]}'
    python -m tests.tf.auto_worker '{"program": "zoo:residual", "batch": 256, "budget": 18000000}'

``programs`` measures each plain step's peak (``tf.function``); a ``program``
with a budget runs ``lms.function(step, config="auto", budget=...)`` first thing in the process
(so TF's allocator peak is the step's own), then trains `K_STEPS` steps from the
same initial state with and without it and compares them bit for bit. Programs:
``zoo:<name>`` (a `tuner.models` workload with the standard step at ``batch``)
and ``loop:<name>`` (a `tests.tf.realworld` custom loop, its batch repeated to ``batch`` rows).
Used by `tests/tf/test_auto.py`.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

K_STEPS = 3


def _program(name: str, batch: int | None):  # noqa: ANN202
    """(step, batch tuple, variables) of a program."""
    kind, _, which = name.partition(":")
    if kind == "zoo":
        import keras

        from lms.tf.train import make_train_step
        from tuner.models.base import load_workload

        workload = load_workload(which)
        keras.utils.set_random_seed(0)
        model = workload.build_model()
        optimizer = workload.make_optimizer()
        optimizer.build(model.trainable_variables)
        step = make_train_step(model, workload.loss_fn, optimizer)
        return step, tuple(workload.make_batch(batch, 0)), [*model.variables, *optimizer.variables]
    if kind == "loop":
        from tests.tf.realworld import LOOPS

        import numpy as np

        loop = LOOPS[which]()
        data = loop.batch
        if batch:  # the loop's own batch repeated to `batch` rows: a step with activations worth swapping
            data = tuple(np.resize(a, (batch, *np.shape(a)[1:])) for a in data)
        return loop.step, data, loop.variables
    raise ValueError(f"unknown program {name!r}")


def main(spec: dict) -> dict:
    from lms.tf.allocator import configure_cpu_allocator
    from lms.tf.measure import measure_step

    configure_cpu_allocator()
    import numpy as np
    import tensorflow as tf

    import lms

    if "programs" in spec:  # plain peaks of several programs, one after another
        peaks = {}
        for name, batch in spec["programs"]:
            step, data, _ = _program(name, batch)
            # TF's single-threaded executor: one op order, so the same peak in every process (the default
            # executor's order, and so its peak, moves with the machine's load)
            peaks[name] = measure_step(tf.function(step), data, warmup=2, steps=3,
                                       executor="single_threaded").peak_device_bytes
        return {"plain_peaks": peaks}
    step, batch, variables = _program(spec["program"], spec.get("batch"))
    initial = [v.numpy() for v in variables]
    fn = lms.function(step, config="auto", budget=spec["budget"])
    m = measure_step(fn, batch, warmup=2, steps=3)
    summary = fn.summary

    def train(wrapped) -> list:  # noqa: ANN001
        for v, value in zip(variables, initial):
            v.assign(value)
        losses = [np.asarray([np.asarray(t) for t in tf.nest.flatten(wrapped(*batch))]) for _ in range(K_STEPS)]
        return losses + [v.numpy() for v in variables]

    got, want = train(fn), train(tf.function(step))
    bitwise = len(got) == len(want) and all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(got, want))
    return {"peak": m.peak_device_bytes, "budget": spec["budget"], "bitwise": bitwise,
            "config": summary.config.to_dict(), "auto": summary.auto.to_dict(), "n_swapped": summary.n_swapped,
            "n_recomputed": len(summary.recomputed), "pinned_whole": fn.pinned_whole is not None,
            "timings": fn.timings}


if __name__ == "__main__":
    from tuner.trial import exit_now

    print(json.dumps(main(json.loads(sys.argv[1]))))
    exit_now(0)  # without TF's teardown (about 2 s)
