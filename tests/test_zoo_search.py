"""The paper's other workloads through the real CLI: 3D U-Net and the GPT-2-like transformer.

Small sizes (the CLI takes --model-option), simulate backend: the search runs end to end
and its recommended.json loads and trains with lms.function.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lms import LMSConfig
from tests import forked_cli

ROOT = Path(__file__).resolve().parents[1]

CASES = {
    "unet3d": {"input_size": 16, "base_filters": 4, "levels": 3, "in_channels": 1, "n_classes": 2},
    "gpt2_small": {"seq_len": 32, "n_layers": 2, "d_model": 64, "n_heads": 2, "vocab_size": 128},
}


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(CASES))
def test_simulate_search_end_to_end_and_the_result_trains(model: str, tmp_path: Path) -> None:
    options = CASES[model]
    args = ["search", "--model", model, "--backend", "simulate",
            "--budget", "64MiB", "--trials", "6", "--study", "zoo", "--seed", "0", "-q"]
    for key, value in options.items():
        args += ["--model-option", f"{key}={value}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = forked_cli.run(args, cwd=tmp_path, env=env, timeout=600)  # `python -m tuner ARGS`
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = tmp_path / "studies" / "zoo" / "recommended.json"
    doc = json.loads(rec.read_text())
    assert doc["backend"] == "simulate" and doc["measured"] is False
    assert doc["batch_size"] >= 1 and doc["budget_bytes"] == 64 << 20
    assert "predicted" in proc.stdout

    import numpy as np
    import lms
    from lms.tf.train import make_train_step
    from tuner.models import load_workload

    config = LMSConfig.load(rec)
    w = load_workload(model, **options)
    step = lms.function(make_train_step(w.build_model(), w.loss_fn, w.make_optimizer()), config=config,
                        emulate=True)
    x, y = w.make_batch(2, seed=0)
    losses = [float(step(x, y)) for _ in range(2)]
    assert all(np.isfinite(losses))
    if config.enabled:
        assert step.summary.n_swapped > 0
    else:
        assert step.summary.n_swapped == 0
