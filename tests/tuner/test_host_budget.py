"""``--host-budget``: bad input, the default, and a simulated ResNet-50 search bounded by host memory."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tuner.host import (PINNED_DEFAULT_BYTES, add_host_fields, default_host_budget, host_lines, parse_host_budget,
                        pinned_limit_mb)

from .conftest import run_cli

GiB = 1 << 30


def _files(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("value, fragment", [
    ("0", "host budget '0' is zero"),
    ("-1GiB", "host budget '-1GiB' is negative"),
    ("8XB", "unknown unit 'XB'"),
    ("lots", "host budget 'lots' is not a size"),
    ("2048TiB", "more than 1 PiB"),
    ("", "host budget is empty"),
])
def test_bad_host_budget_is_one_line_exit_2_nothing_written(value: str, fragment: str, tmp_path: Path) -> None:
    proc = run_cli(["search", "--model", "mlp", "--backend", "simulate", "--host-budget", value], cwd=tmp_path,
                   timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert fragment in lines[0], lines[0]
    assert proc.stdout == ""
    assert _files(tmp_path) == []


def test_parse_host_budget() -> None:
    assert parse_host_budget("8GiB") == 8 * GiB
    assert parse_host_budget("none") is None and parse_host_budget(" OFF ") is None


def test_default_host_budget_is_three_quarters_of_ram_and_the_pinned_limit_on_a_gpu(monkeypatch) -> None:
    monkeypatch.delenv("TF_GPU_HOST_MEM_LIMIT_IN_MB", raising=False)
    assert default_host_budget(gpu=False, ram_bytes=64 * GiB) == (48 * GiB, "75% of this machine's RAM (64.00 GiB)")
    budget, source = default_host_budget(gpu=True, ram_bytes=1024 * GiB)
    assert budget == PINNED_DEFAULT_BYTES == 128 * GiB and "TF's pinned host allocator default" in source
    assert default_host_budget(gpu=True, ram_bytes=64 * GiB)[0] == 48 * GiB
    monkeypatch.setenv("TF_GPU_HOST_MEM_LIMIT_IN_MB", "4096")
    assert default_host_budget(gpu=True, ram_bytes=64 * GiB) == (
        4 * GiB, "TF_GPU_HOST_MEM_LIMIT_IN_MB=4096 (TF's pinned host allocator limit), below 75% of this "
                 "machine's RAM (64.00 GiB)")


def test_a_prediction_for_a_gpu_machine_takes_the_targets_pinned_limit_not_this_machines_ram(monkeypatch) -> None:
    """A 24 GiB laptop predicting for a GPU server gets the server's cap (TF's pinned host default), whatever
    its own RAM; the source says so."""
    monkeypatch.delenv("TF_GPU_HOST_MEM_LIMIT_IN_MB", raising=False)
    for ram in (24 * GiB, 1024 * GiB):
        budget, source = default_host_budget(gpu=True, ram_bytes=ram, elsewhere=True)
        assert budget == PINNED_DEFAULT_BYTES == 128 * GiB
        assert "on the GPU machine predicted for" in source and "--host-budget" in source
    monkeypatch.setenv("TF_GPU_HOST_MEM_LIMIT_IN_MB", "65536")
    assert default_host_budget(gpu=True, ram_bytes=24 * GiB, elsewhere=True)[0] == 64 * GiB


def test_a_recommendation_above_the_pinned_default_names_the_limit_it_needs() -> None:
    from types import SimpleNamespace

    assert pinned_limit_mb(100 * GiB) is None and pinned_limit_mb(PINNED_DEFAULT_BYTES) is None
    assert pinned_limit_mb(140 * GiB) == 140 * 1024
    settings = SimpleNamespace(backend="gpu", device="V100-16GB", host_budget_bytes=200 * GiB,
                               host_budget_source="--host-budget")
    doc = {"sources": {}, "notes": []}
    add_host_fields(doc, {"peak_host_bytes": 140 * GiB, "measured": False}, settings, label="x", predicted_label="p")
    assert doc["peak_host_bytes"] == 140 * GiB and doc["sources"]["peak_host_bytes"] == "p"
    assert doc["TF_GPU_HOST_MEM_LIMIT_IN_MB"] == 143360
    assert "TF_GPU_HOST_MEM_LIMIT_IN_MB=143360" in doc["notes"][0]
    assert any("needs TF_GPU_HOST_MEM_LIMIT_IN_MB=143360" in line for line in host_lines(doc))


def _search(tmp: Path, study: str, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = run_cli(["search", "--model", "resnet50", "--backend", "simulate", "--budget", "16GiB", "--trials", "3",
                    "--min-throughput-ratio", "0.5", "--seed", "0", "--no-report", "--study", study, *extra],
                   cwd=tmp, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads((tmp / "studies" / study / "recommended.json").read_text())


@pytest.mark.slow
def test_simulated_resnet50_search_under_an_8gib_host_budget(tmp_path: Path) -> None:
    """3 trials each (no LMS, every tensor swapped lb=1, the schedule=memory variant): about 35 s per search
    on a loaded 2-core machine. --min-throughput-ratio 0.5 lets the unbounded search recommend its largest batch."""
    _, free = _search(tmp_path, "free", "--host-budget", "none")
    (tmp_path / "studies" / "bound").mkdir()  # the same model: the second search reuses the first's trace
    shutil.copy(tmp_path / "studies" / "free" / "graph.json", tmp_path / "studies" / "bound" / "graph.json")
    proc, bound = _search(tmp_path, "bound", "--host-budget", "8GiB")
    assert free["host_budget"]["bytes"] is None and free["peak_host_bytes"] > 8 * GiB
    assert bound["host_budget"] == {"bytes": 8 * GiB, "source": "--host-budget"}
    assert isinstance(bound["peak_host_bytes"], int) and bound["peak_host_bytes"] <= 8 * GiB
    assert bound["sources"]["peak_host_bytes"].startswith("predicted (simulator")
    assert bound["batch_size"] < free["batch_size"]
    assert "host memory" in proc.stdout and "host budget 8.00 GiB" in proc.stdout
    rows = (tmp_path / "studies" / "bound" / "trials.csv").read_text().splitlines()
    assert "peak_host_bytes" in rows[0].split(",")
    best = run_cli(["best", "--study", "bound"], cwd=tmp_path, timeout=120)
    assert best.returncode == 0 and "host memory" in best.stdout, best.stderr
    # resuming with another host budget is refused (the study's settings must match)
    again = run_cli(["search", "--model", "resnet50", "--backend", "simulate", "--budget", "16GiB", "--trials", "3",
                     "--min-throughput-ratio", "0.5", "--no-report", "--study", "bound", "--host-budget", "4GiB"],
                    cwd=tmp_path, timeout=120)
    assert again.returncode == 2 and "host budget 8.00 GiB, not 4.00 GiB" in again.stderr, again.stderr


def test_gpu_workers_get_a_pinned_limit_that_fits_the_host_budget(monkeypatch) -> None:
    from types import SimpleNamespace

    from tuner.backends import get_backend
    from tuner.host import worker_host_limit_bytes

    assert worker_host_limit_bytes(SimpleNamespace(host_budget_bytes=8 * GiB), 12 * GiB) == 12 * GiB
    assert worker_host_limit_bytes(SimpleNamespace(host_budget_bytes=None), 12 * GiB) == 12 * GiB
    assert worker_host_limit_bytes(SimpleNamespace(host_budget_bytes=200 * GiB), 96 * GiB) == 200 * GiB
    monkeypatch.setattr("tuner.environment.host_memory_bytes", lambda: 128 * GiB)
    settings = SimpleNamespace(budget_bytes=16 * GiB, gpus=(), gpu="GPU-x", workers=1, host_budget_bytes=300 * GiB)
    assert get_backend("gpu").worker_limits(settings)["host_memory_limit_bytes"] == 300 * GiB


def test_a_measured_trial_over_the_host_budget_is_infeasible_with_its_reason() -> None:
    from tuner.host import host_verdict
    from tuner.policy.records import TrialRecord

    ok = TrialRecord(config=None, backend="emulated", measured=True, status="ok", batch_size=64, throughput=10.0,
                     peak_device_bytes=100, peak_source="tf", predicted_peak_bytes=90, predicted_throughput=9.0,
                     constraint=-0.1, extra={"host_copies_peak_bytes": 3 * GiB})
    assert host_verdict(ok, None) is ok and host_verdict(ok, 4 * GiB) is ok
    miss = host_verdict(ok, 2 * GiB)
    assert (miss.status, miss.batch_size, miss.extra["limited_by"]) == ("infeasible", 0, "host")
    assert miss.constraint > 0 and "held 3.00 GiB of swapped tensors in host memory > host budget 2.00 GiB" in miss.reason
