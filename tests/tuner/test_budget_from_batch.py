"""``--budget-from-batch N``: the no-LMS step's peak at batch N becomes the budget (issue 51).

Run as a user runs it (the CLI in a subprocess), on the simulate backend with the tiny model's graph cached,
so no trial imports TensorFlow; the budget asserted is the simulator's no-LMS peak at N, computed here.
On the emulated backend one fresh worker measures it (a test marked tf, about 10 s).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from lms.graph import Graph
from lms.simulator import simulate
from tuner.policy.batch import usable_bytes

from .conftest import TINY_MODEL, run_cli

DEVICE = "V100-16GB"  # the simulate backend's default profile


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("lms-tuner: ")
    return lines[0]


@pytest.mark.parametrize("args, fragment", [
    (["--budget-from-batch", "0"], "argument --budget-from-batch: 0 must be between 1 and 2147483647"),
    (["--budget-from-batch", "eight"], "argument --budget-from-batch: 'eight' is not an integer"),
    (["--budget-from-batch", "8", "--budget", "1GiB"], "argument --budget: not allowed with argument "
                                                         "--budget-from-batch"),
    (["--budget", "1GiB", "--budget-from-batch", "8"], "argument --budget-from-batch: not allowed with argument "
                                                         "--budget"),
])
def test_a_bad_budget_from_batch_exits_2_with_one_line(args: list[str], fragment: str, tmp_path: Path) -> None:
    proc = run_cli(["search", "--model", "mlp", "--backend", "simulate", *args], cwd=tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert fragment in _one_line_error(proc)
    assert proc.stdout == "" and list(tmp_path.iterdir()) == []


def test_the_budget_is_the_no_lms_peak_at_that_batch(tmp_path: Path, seed_graph, tiny_graph_doc: dict) -> None:
    seed_graph(tmp_path / "studies", "from8")
    proc = run_cli(["search", "--model", TINY_MODEL, "--backend", "simulate", "--budget-from-batch", "8",
                    "--study", "from8", "--seed", "0", "--trials", "3", "--no-report"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "studies" / "from8" / "recommended.json").read_text())
    graph = Graph.from_dict(tiny_graph_doc["graph"])
    peak = {b: simulate(graph, None, batch=b, device=DEVICE, timeline=False).peak_device_bytes for b in range(1, 10)}
    assert peak[8] < peak[9]  # the peak grows with the batch: batch 8 names one budget
    assert doc["budget_bytes"] == peak[8]
    assert doc["budget_source"] == ("--budget-from-batch 8: the no-LMS step's peak at batch 8, predicted by the "
                                    f"simulator (device profile {DEVICE})")
    assert f"budget: {doc['budget_source']}" in proc.stdout
    # the no-LMS baseline fits just under 8: the safety margin keeps 5% of the budget free
    usable = usable_bytes(peak[8], 0.05)
    assert doc["usable_bytes"] == usable
    assert doc["baseline"]["batch_size"] == max(b for b in range(1, 9) if peak[b] <= usable)

    # resuming with another batch is refused (the study's budget came from batch 8), in one line
    again = run_cli(["search", "--model", TINY_MODEL, "--backend", "simulate", "--budget-from-batch", "16",
                     "--study", "from8", "--trials", "3", "--no-report"], cwd=tmp_path)
    assert again.returncode == 2
    assert "not the no-LMS peak at batch 16 (--budget-from-batch); use another --study name" in _one_line_error(again)


@pytest.mark.tf
@pytest.mark.slow
def test_a_measured_backend_measures_the_no_lms_peak_in_a_fresh_process(tmp_path: Path, tiny_graph_doc: dict) -> None:
    from tuner.graphs import derive_budget
    from tuner.study.settings import SearchSettings
    from tuner.study.storage import resolve_storage

    settings = SearchSettings(study="m", model=TINY_MODEL, model_options={}, backend="emulated", budget_bytes=None,
                              budget_source="--budget-from-batch 4", device="cpu", trials=1, screen_trials=0,
                              storage=resolve_storage(None, "m", studies_dir=tmp_path), studies_dir=tmp_path,
                              steps=2, warmup=1, budget_from_batch=4)
    budget, source = derive_budget(settings, Graph.from_dict(tiny_graph_doc["graph"]))
    result = json.loads((tmp_path / "m" / "budget" / "result.json").read_text())
    request = json.loads((tmp_path / "m" / "budget" / "request.json").read_text())["request"]
    assert (request["config"]["n_tensors"], request["start_batch"], request["fixed_batch"]) == (0, 4, True)
    assert result["status"] == "ok" and result["batch_size"] == 4
    assert budget == result["peak_device_bytes"]
    assert source.startswith("--budget-from-batch 4: the no-LMS step's peak at batch 4, measured in a fresh process "
                             "(measured on the emulated device")
    # the simulator's prediction of the same peak (TF's BFC allocator replayed) is close, and far from other batches
    graph = Graph.from_dict(tiny_graph_doc["graph"])
    predicted = {b: simulate(graph, None, batch=b, device="cpu", allocator="bfc", timeline=False).peak_device_bytes
                 for b in (2, 4, 8)}
    # (seen: measured 693,504 and 718,848 bytes in two processes; predicted 401,664 / 689,920 / 1,273,600)
    assert abs(budget - predicted[4]) < 0.2 * predicted[4]
    assert abs(budget - predicted[2]) > 0.2 * predicted[4] and abs(budget - predicted[8]) > 0.2 * predicted[4]
