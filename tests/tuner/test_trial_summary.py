"""What a measured trial records of the LMS that ran (`tuner.trial.lms_summary_record`), with a real worker.

A fixed-batch trial (``--batch N``, and every fresh process of a measured search's bracket,
`tuner.backends.confirm`) once recorded its summary before the step's first call had traced it: ``n_swapped=0``
in trials.csv for trials that swapped (issue 51). One worker on the emulated device, a few seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.worker.protocol import MeasureRequest
from tuner.worker.run import run_worker, worker_env

from .conftest import TINY_MODEL

pytestmark = [pytest.mark.tf, pytest.mark.slow]


def test_a_fixed_batch_trial_records_the_swaps_its_step_ran_with(tmp_path: Path) -> None:
    request = MeasureRequest(workload=TINY_MODEL, config={"n_tensors": 3, "lb": 1}, backend="emulated",
                             usable_bytes=1 << 30, start_batch=4, cap=4, fixed_batch=True, warmup=1, steps=2,
                             probe_warmup=1, probe_steps=1, trial=0)
    out = run_worker(request, workdir=tmp_path / "work", timeout_s=300, env=worker_env())
    assert out.status == "ok", (out.reason, (tmp_path / "work" / "worker.log").read_text()[-3000:])
    summary = out.result.lms_summary
    assert out.result.batch_size == 4
    assert summary["n_swapped"] == 3 and summary["n_swap_ins"] >= 3  # n_tensors=3: the three largest candidates
    assert summary["swapped_bytes"] > 0 and summary["swap_ops"] == "emulated"
