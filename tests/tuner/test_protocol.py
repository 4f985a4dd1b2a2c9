"""The worker protocol: typed requests and results survive JSON, defaults live in one place, versions are checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.worker.protocol import (PROTOCOL_VERSION, DescribeRequest, Envelope, MeasureRequest, MeasureResult,
                                   ProtocolError, TraceRequest)

from .conftest import ROOT


@pytest.mark.parametrize("request_", [
    DescribeRequest(workload="mlp", options={"width": 8}),
    TraceRequest(workload="residual", output="/tmp/g.json", key={"model": "residual"}, profile_batches=(8,)),
    MeasureRequest(workload="mlp", config={"n_tensors": 3}, backend="emulated", usable_bytes=64 << 20,
                   start_batch=12, slope_bytes_per_sample=1024.5, trial=7),
])
def test_requests_round_trip_through_json(request_) -> None:
    envelope = Envelope(request_, events="/e.jsonl", result="/r.json")
    back = Envelope.from_json(envelope.to_json())
    assert back == envelope and type(back.request) is type(request_)


def test_measure_defaults_are_the_parents() -> None:
    """One place for defaults: the budget travels as usable bytes (no margin to apply twice), probes 2+2 steps."""
    r = MeasureRequest(workload="mlp", config={}, backend="gpu", usable_bytes=1)
    assert (r.start_batch, r.cap, r.warmup, r.steps, r.probe_warmup, r.probe_steps, r.max_probes) == (1, 4096, 2, 5, 2, 2, 6)
    assert not hasattr(r, "safety_margin")


def test_other_versions_and_unknown_fields_are_refused() -> None:
    doc = json.loads(Envelope(DescribeRequest(workload="mlp")).to_json())
    with pytest.raises(ProtocolError, match=f"this worker speaks {PROTOCOL_VERSION}"):
        Envelope.from_json(json.dumps({**doc, "protocol": PROTOCOL_VERSION + 1}))
    with pytest.raises(ProtocolError, match="unknown field 'budget_bytes'"):
        Envelope.from_json(json.dumps({**doc, "request": {**doc["request"], "budget_bytes": 5}}))
    with pytest.raises(ProtocolError, match="unknown worker mode"):
        Envelope.from_json(json.dumps({**doc, "mode": "train"}))


def test_results_are_typed() -> None:
    r = MeasureResult.from_dict({"status": "ok", "batch_size": 4, "throughput": 2.5, "step_times_s": [0.1, 0.2]})
    assert r.batch_size == 4 and r.step_times_s == (0.1, 0.2) and r.peak_device_bytes is None
    assert MeasureResult.from_dict(r.to_dict()) == r


def test_a_worker_refuses_a_request_of_another_version(tmp_path: Path) -> None:
    path = tmp_path / "request.json"
    path.write_text(json.dumps({"protocol": 99, "mode": "describe", "request": {"workload": "mlp"}}))
    proc = subprocess.run([sys.executable, "-m", "tuner.trial", str(path)], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert proc.returncode == 1 and "worker protocol 99" in proc.stderr
