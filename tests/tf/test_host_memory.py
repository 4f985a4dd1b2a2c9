"""Host memory of emulated swaps: MEASURED (`lms.tf.emulate.HOST_COPIES`) equals the summary's PREDICTION.

The workload ``cnn_bn`` (16x16x3 images) at batch 32, every candidate swapped just in time
(``n_tensors=-1, lb=1``), measured under TF's single-threaded executor (the order the simulator
models for the emulated device). About 10 s.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.tf

tf = pytest.importorskip("tensorflow")


def test_emulated_host_copies_peak_matches_the_predicted_host_peak() -> None:
    import lms
    from lms import LMSConfig
    from lms.simulator import simulate
    from lms.tf.emulate import HOST_COPIES
    from lms.tf.measure import device_batch, measure_step
    from lms.tf.train import make_train_step
    from tuner.models import load_workload

    w = load_workload("cnn_bn")
    x, y = device_batch(w.make_batch(32, seed=0), "/CPU:0")
    step = lms.function(make_train_step(w.build_model(), w.loss_fn, w.make_optimizer()),
                        config=LMSConfig(n_tensors=-1, lb=1), emulate=True,
                        input_signature=[w.x_spec(), w.y_spec()])
    m = measure_step(step, (x, y), warmup=1, steps=2, device="CPU:0", executor="single_threaded")
    summary = step.summary
    assert summary.n_swapped > 0 and summary.peak_host_bytes == summary.swapped_bytes
    assert m.host_copies_peak_bytes == summary.peak_host_bytes
    assert m.to_dict()["sources"]["host_copies_peak_bytes"] == "emulated-swap-copies"
    assert simulate(step.graph, step.plan, batch=32, device="cpu", timeline=False).peak_host_bytes \
        == summary.peak_host_bytes
    assert HOST_COPIES.live_bytes == 0  # every copy released after the steps
