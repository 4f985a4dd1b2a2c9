"""The recommendation measured again in fresh processes (`tuner.confirm`, ``--confirm N``).

One config's peak varies between processes (TensorFlow orders unpinned ops per
process), so the search re-measures the config it recommends and the no-LMS
baseline in N more fresh workers and recommends the smallest largest batch.
The workers here are the test-only synthetic ones (``LMS_TUNER_FAULT``, no
TensorFlow): ``ok`` fits at the batch asked for, ``smaller@N.K`` at 3/4 of it
in trial N's K-th re-measurement, as a process whose op order peaks higher.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import optuna

from tuner.confirm import CONFIRMATIONS_ATTR, confirmed_figures
from tuner.faults import injected_fault

from .conftest import TINY_MODEL, run_cli

STUDY = "confirm"


def _search(tmp_path: Path, *extra: str, fault: str = "ok@*") -> dict:
    proc = run_cli(["search", "--model", TINY_MODEL, "--backend", "emulated", "--budget", "128MiB", "--study", STUDY,
                    "--seed", "0", "--trials", "3", "--screen-trials", "4", "--timeout", "0", "--no-report",
                    "--json", *extra], cwd=tmp_path, timeout=180, env={"LMS_TUNER_FAULT": fault})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_fault_hook_targets_a_re_measurement() -> None:
    spec = "smaller@3.1,kill@3,ok@*"
    assert injected_fault(3, spec) == "kill"
    assert injected_fault(3, spec, confirm=1) == "smaller"
    assert injected_fault(3, spec, confirm=2) == "ok"
    assert injected_fault(4, spec, confirm=1) == "ok"
    assert injected_fault(4, "smaller@3.1") is None


def test_smallest_largest_batch_is_recommended_and_kept_on_resume(tmp_path: Path, seed_graph) -> None:
    seed_graph(tmp_path / "studies", STUDY)
    first = _search(tmp_path, "--confirm", "0")
    assert "confirmation" not in first
    chosen, batch = first["trial"], first["batch_size"]
    base = first["baseline"]
    assert base["trial"] != chosen and batch > base["batch_size"] > 0

    # the same study resumed with --confirm 2: no new trial, the two re-measurements of each run now;
    # trial `chosen`'s first re-measurement fits only 3/4 of its batch
    doc = _search(tmp_path, "--confirm", "2", fault=f"smaller@{chosen}.1,ok@*")
    smaller = batch * 3 // 4
    assert doc["trial"] == chosen
    assert doc["confirmation"]["batch_sizes"] == [batch, smaller, batch]
    assert doc["confirmation"]["processes"] == 3 and doc["confirmation"]["process"] == 1
    assert doc["batch_size"] == smaller and doc["tuned_for"] == {"batch_size": smaller}
    assert doc["throughput"] == 100.0 + smaller  # the synthetic worker's throughput at that batch
    assert doc["baseline"]["batch_size"] == base["batch_size"]
    assert doc["baseline"]["confirmation"]["batch_sizes"] == [base["batch_size"]] * 3
    assert doc["gain_vs_baseline"]["batch_size_ratio"] == round(smaller / base["batch_size"], 3)
    # each re-measurement was asked for at most the trial's batch, in its own folder
    requests = sorted((tmp_path / "studies" / STUDY / "confirm").glob("*/request.json"))
    assert len(requests) == 4
    for path in requests:
        req = json.loads(path.read_text())["request"]
        assert req["cap"] == req["start_batch"] and req["confirm"] in (1, 2)
    # the written file says the same, and the summary names every process
    written = json.loads((tmp_path / "studies" / STUDY / "recommended.json").read_text())
    assert written["batch_size"] == smaller
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{tmp_path / 'studies' / STUDY / 'study.db'}")
    stored = study.user_attrs[CONFIRMATIONS_ATTR]
    assert sorted(stored) == sorted([str(chosen), str(base["trial"])])

    # resumed again: nothing measured twice (the stored runs are reused)
    mtimes = {p: p.stat().st_mtime_ns for p in requests}
    again = _search(tmp_path, "--confirm", "2")
    assert again["batch_size"] == smaller
    assert {p: p.stat().st_mtime_ns for p in requests} == mtimes
    proc = run_cli(["best", "--study", STUDY], cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"largest batch {batch}, {smaller}, {batch} in 3 fresh processes" in proc.stdout


def _trial(number: int, batch: int, throughput: float) -> SimpleNamespace:
    return SimpleNamespace(number=number, user_attrs={"status": "ok", "batch_size": batch, "throughput": throughput,
                                                      "peak_device_bytes": 1000 + batch, "step_time_median_s": 0.5})


def test_confirmed_figures_take_the_smallest_and_name_runs_without_a_verdict() -> None:
    trial = _trial(7, 188, 90.0)
    runs = [{"process": 1, "status": "ok", "batch_size": 136, "throughput": 80.0, "peak_device_bytes": 5,
             "step_time_median_s": 1.7},
            {"process": 2, "status": "killed", "reason": "SIGKILL"},
            {"process": 3, "status": "ok", "batch_size": 136, "throughput": 70.0, "peak_device_bytes": 6,
             "step_time_median_s": 1.9}]
    got = confirmed_figures(trial, {"7": {"runs": runs}})
    assert got["batch_size"] == 136 and got["throughput"] == 70.0 and got["process"] == 3  # the slower on a tie
    assert got["peak_device_bytes"] == 6 and got["step_time_median_s"] == 1.9
    assert got["batch_sizes"] == [188, 136, 0, 136] and got["processes"] == 4
    assert got["unconfirmed"] == [{"process": 2, "status": "killed", "reason": "SIGKILL"}]
    assert confirmed_figures(trial, {"8": {"runs": runs}}) is None
    assert confirmed_figures(trial, None) is None
    # the trial's own process is the smallest: its figures stay
    assert confirmed_figures(_trial(7, 100, 50.0), {"7": {"runs": runs[:1]}})["batch_size"] == 100
