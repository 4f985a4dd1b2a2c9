"""recommended.json and trials.csv: the choice, the labels, the schema, atomic and loadable."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from lms import LMSConfig
from tuner.outputs import format_recommendation, read_recommendation, source_label, write_outputs
from tuner.policy.selection import pareto_front, select_recommendation
from tuner.study.settings import SearchSettings
from tuner.study.storage import resolve_storage

MiB = 1 << 20
DIST = {"n_tensors": optuna.distributions.IntDistribution(0, 100, step=10)}


def _study(points, *, measured=True, backend="emulated", lms_summary=None):
    """points: (n_tensors, batch, throughput, status); lms_summary: {n_tensors: the worker's lms_summary}"""
    study = optuna.create_study(directions=["maximize", "maximize"], study_name="s")
    for n, batch, thr, status in points:
        ok = status == "ok"
        attrs = {"status": status, "config": LMSConfig(n_tensors=n).to_dict(), "batch_size": batch,
                 "throughput": thr, "peak_device_bytes": 90 * MiB if ok else None, "peak_source": "tf-bfc-cpu",
                 "backend": backend, "measured": measured and ok, "predicted_peak_bytes": 91 * MiB,
                 "predicted_throughput": thr * 1.1, "predicted_batch": batch + 1, "reason": "",
                 "constraint": [-0.1 if ok else 1.0], "step_time_median_s": 0.5, "step_time_spread_s": 0.01}
        if lms_summary and n in lms_summary:
            attrs["lms_summary"] = lms_summary[n]
        trial = optuna.trial.create_trial(params={"n_tensors": n}, distributions=DIST,
                                          values=[batch, thr], user_attrs=attrs,
                                          system_attrs={"constraints:memory": attrs["constraint"][0]})
        study.add_trial(trial)
    return study


POINTS = [(0, 30, 100.0, "ok"), (10, 40, 95.0, "ok"), (20, 60, 70.0, "ok"), (30, 90, 45.0, "ok"),
          (40, 80, 40.0, "ok"), (50, 0, 0.0, "oom"), (60, 200, 500.0, "infeasible")]


def test_pareto_front_excludes_dominated_and_infeasible() -> None:
    front = pareto_front([t for t in _study(POINTS).trials if t.user_attrs["status"] == "ok"])
    assert [t.params["n_tensors"] for t in front] == [0, 10, 20, 30]


@pytest.mark.parametrize("prefer, ratio, expected", [
    ("batch", 0.5, 20),       # 60 @ 70/s keeps >= 50% of 100/s; 90 @ 45/s does not
    ("batch", 0.4, 30),
    ("batch", 0.0, 30),
    ("batch", 0.99, 0),
    ("throughput", 0.5, 0),
])
def test_select_recommendation(prefer: str, ratio: float, expected: int) -> None:
    chosen, front = select_recommendation(_study(POINTS).trials, prefer=prefer, min_throughput_ratio=ratio)
    assert chosen.params["n_tensors"] == expected
    assert len(front) == 4


@pytest.mark.parametrize("plain_throughput, expected", [(41.1, 0), (45.9, 0), (50.0, 0), (38.0, 100)])
def test_at_one_batch_no_lms_is_chosen_unless_a_config_is_faster_beyond_the_noise(plain_throughput, expected):
    """benchmarks/peers.py's common batch: the tuner's --batch 16 search measured every tensor swapped at 45.9
    samples/s and no LMS at 41.1; within 15% of each other, no LMS is the answer (a swap costs, it saves nothing
    that fits already); 38.0 is 17% slower, beyond the noise."""
    trials = _study([(0, 16, plain_throughput, "ok"), (100, 16, 45.9, "ok")]).trials
    chosen, front = select_recommendation(trials)
    assert chosen.params["n_tensors"] == expected
    chosen, _ = select_recommendation(_study([(0, 8, 60.0, "ok"), (100, 16, 50.0, "ok")]).trials)
    assert chosen.params["n_tensors"] == 100  # no LMS does not reach the batch: the rule's pick stands


def test_no_lms_at_the_edge_of_the_budget_is_not_preferred():
    """keras.io's DCGAN under its own fit (benchmarks/user_programs.py): no LMS reached the LMS config's batch 7
    with 1.6% of the usable budget left, and the program's own runs then went over it; the config is kept."""
    trials = _study([(0, 7, 41.1, "ok"), (100, 7, 45.9, "ok")]).trials
    trials[0].user_attrs["constraint"] = [40.21 / 40.88 - 1]
    chosen, _ = select_recommendation(trials)
    assert chosen.params["n_tensors"] == 100
    trials[0].user_attrs["constraint"] = [-0.06]
    assert select_recommendation(trials)[0].params["n_tensors"] == 0


def test_no_feasible_trial_gives_none() -> None:
    chosen, front = select_recommendation(_study([(50, 0, 0.0, "oom")]).trials)
    assert chosen is None and front == []


def _settings(tmp_path: Path, backend: str = "emulated") -> SearchSettings:
    return SearchSettings(study="s", model="cnn_bn", model_options={"image_size": 16}, backend=backend,
                          budget_bytes=100 * MiB, budget_source="--budget", device="cpu", trials=4, screen_trials=2,
                          storage=resolve_storage("postgresql://bob:hunter2@db/x", "s"),
                          studies_dir=tmp_path, steps=5, warmup=2)


def test_write_outputs_measured(tmp_path: Path) -> None:
    study = _study(POINTS)
    env = {"tensorflow": "2.21.0", "device_name": "emulated device on CPU", "driver_version": None}
    doc, rec, csv = write_outputs(tmp_path, main=study, screen=None, settings=_settings(tmp_path), budget_bytes=100 * MiB,
                                  budget_source="--budget", usable_bytes=95 * MiB, environment=env)
    assert rec == tmp_path / "recommended.json" and csv == tmp_path / "trials.csv"
    on_disk = read_recommendation(rec)
    # default rule: the largest batch keeping >= 80% of the front's best throughput (100/s): 40 @ 95/s
    assert on_disk["config"] == LMSConfig(n_tensors=10).to_dict()
    assert LMSConfig.load(rec) == LMSConfig(n_tensors=10)
    assert (on_disk["batch_size"], on_disk["throughput"]) == (40, 95.0)
    assert on_disk["measured"] is True and on_disk["backend"] == "emulated"
    assert on_disk["sources"]["batch_size"] == "measured on the emulated device (CPU, TensorFlow BFC allocator)"
    assert on_disk["sources"]["predicted"].startswith("predicted")
    assert on_disk["predicted"] == {"batch_size": 41, "throughput": pytest.approx(104.5),
                                    "peak_device_bytes": 91 * MiB, "device_profile": "cpu"}
    assert on_disk["baseline"]["batch_size"] == 30
    assert on_disk["gain_vs_baseline"] == {"batch_size_ratio": 1.333, "throughput_ratio": 0.95}
    assert on_disk["budget_bytes"] == 100 * MiB and on_disk["usable_bytes"] == 95 * MiB
    assert on_disk["environment"]["tensorflow"] == "2.21.0"
    assert [p["batch_size"] for p in on_disk["pareto_front"]] == [30, 40, 60, 90]
    assert "hunter2" not in rec.read_text() and "bob:***@db" in on_disk["storage"]
    assert not list(tmp_path.glob("*.tmp"))  # atomic writes leave no temp files
    text = format_recommendation(on_disk)
    for key in ("batch size", "throughput", "peak memory"):  # each figure labelled
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(key))
        assert "measured on the emulated device" in line, line
    assert "(LMS off)" not in text and "(no swaps)" not in text
    # a recompute-only config saves memory: its summary line does not say "LMS off" (issue 51)
    for config, note in ((LMSConfig(n_tensors=0, recompute="cheap"), "  (no swaps)"), (LMSConfig(n_tensors=0), "  (LMS off)")):
        line = next(ln for ln in format_recommendation({**on_disk, "config": config.to_dict()}).splitlines()
                    if ln.startswith("recommended LMS config:"))
        assert line.endswith(f" recompute={config.recompute} prefetch=lb{note}"), line


def test_trials_csv_columns(tmp_path: Path) -> None:
    import pandas as pd

    write_outputs(tmp_path, main=_study(POINTS), screen=_study(POINTS[:2], measured=False, backend="simulate"),
                  settings=_settings(tmp_path), budget_bytes=100 * MiB, budget_source="x", usable_bytes=95 * MiB,
                  environment={})
    frame = pd.read_csv(tmp_path / "trials.csv")
    assert len(frame) == len(POINTS) + 2
    for col in ("batch_size", "throughput", "peak_device_bytes", "peak_source", "backend", "measured",
                "predicted_peak_bytes", "predicted_throughput", "status", "reason", "config", "n_tensors", "lb",
                "figures", "constraint"):
        assert col in frame.columns, col
    assert list(frame["status"][:7]) == [p[3] for p in POINTS]
    assert set(frame["figures"][7:]) == {"predicted"}
    assert json.loads(frame["config"][2]) == LMSConfig(n_tensors=20).to_dict()


def test_predicted_fallback_when_nothing_measured(tmp_path: Path) -> None:
    main = _study([(50, 0, 0.0, "oom")])
    screen = _study(POINTS[:3], measured=False, backend="simulate")
    doc, rec, _ = write_outputs(tmp_path, main=main, screen=screen, settings=_settings(tmp_path),
                                budget_bytes=100 * MiB, budget_source="x", usable_bytes=95 * MiB, environment={})
    assert doc["measured"] is False and doc["sources"]["batch_size"].startswith("predicted")
    assert any("PREDICTED" in n for n in doc["notes"])


def test_source_labels() -> None:
    assert source_label("simulate", measured=False, device="V100-16GB") == \
        "predicted (simulator, device profile V100-16GB)"
    assert source_label("gpu", measured=True, device_name="NVIDIA H200") == "measured on GPU (NVIDIA H200)"
    assert "emulated" in source_label("emulated", measured=True)


def test_read_recommendation_rejects_other_files(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    LMSConfig().save(path)
    with pytest.raises(ValueError, match="not a tuner recommendation"):
        read_recommendation(path)


def test_outputs_are_atomic_a_failed_write_keeps_the_old_files(tmp_path: Path, monkeypatch) -> None:
    """A write that fails (disk full, a kill) before the rename leaves the previous files whole, no temp file."""
    import os

    settings = _settings(tmp_path)
    kwargs = dict(screen=None, settings=settings, budget_bytes=100 * MiB, budget_source="--budget",
                  usable_bytes=95 * MiB, environment={})
    write_outputs(tmp_path, main=_study(POINTS), **kwargs)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(before) == {"recommended.json", "trials.csv"}

    def fail(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space left"):
        write_outputs(tmp_path, main=_study(POINTS[:2]), **kwargs)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # old files, no .tmp left
    assert "hunter2" not in "".join(b.decode() for b in before.values())  # storage URL stored masked


#: A worker's ``lms_summary`` (`tuner.trial`) for a config whose plan the equivalence check cut down, in the
#: shape `tests/tf/test_equivalence.py::test_the_trial_record_carries_the_checks_corrections` checks it has.
CORRECTED = {"n_swapped": 3, "n_swap_ins": 3, "swapped_bytes": 1 << 20, "n_candidates": 9, "swap_ops": "emulated",
             "n_clones": 0, "n_recomputed": 0, "n_corrections": 2,
             "corrections_by_kind": {"swap-in dropped": 1, "trigger moved": 1},
             "corrections": [{"kind": "swap-in dropped", "tensor": "a:0", "reason": "MatMul reads a transpose"},
                             {"kind": "trigger moved", "tensor": "b:0", "reason": "Mul folded"}]}
DROPPED = {**CORRECTED, "n_swapped": 0, "n_swap_ins": 0, "corrections_by_kind": {"swap-in dropped": 2}}


@pytest.mark.parametrize("summary, says", [
    (CORRECTED, "changed this config's plan, 2 corrections (swap-in dropped 1, trigger moved 1), leaving 3 swapped "
                "and 0 recomputed tensors, so that TensorFlow optimizes the step as without LMS"),
    (DROPPED, "dropped this config's whole plan, 2 corrections (swap-in dropped 2): TensorFlow optimizes the step "
              "differently with it, so it ran without LMS"),
])
def test_a_plan_the_equivalence_check_corrected_is_said_everywhere(tmp_path: Path, summary, says) -> None:
    """The recommended config (n_tensors=10) ran with fewer swaps than its name says: recommended.json, ``tuner
    best``'s text and trials.csv say so; the trials whose plans ran whole say nothing."""
    import pandas as pd

    study = _study(POINTS, lms_summary={10: summary, 20: {"n_swapped": 20, "n_recomputed": 0}})
    doc, rec, csv = write_outputs(tmp_path, main=study, screen=None, settings=_settings(tmp_path),
                                  budget_bytes=100 * MiB, budget_source="--budget", usable_bytes=95 * MiB,
                                  environment={})
    on_disk = read_recommendation(rec)
    assert on_disk["config"]["n_tensors"] == 10
    corrected = on_disk["plan_corrections"]
    assert says in corrected["warning"]
    assert corrected["n_corrections"] == 2 and corrected["n_swapped"] == summary["n_swapped"]
    assert corrected["corrections"][0] == {"kind": "swap-in dropped", "tensor": "a:0",
                                           "reason": "MatMul reads a transpose"}
    warning = [ln for ln in format_recommendation(on_disk).splitlines() if "WARNING" in ln]
    assert warning == [f"  WARNING: {corrected['warning']}"]
    frame = pd.read_csv(csv)
    by_n = dict(zip(frame["n_tensors"], frame["n_corrections"]))
    assert by_n[10] == 2 and by_n[20] == 0  # a trial without lms_summary (no worker) has none
    assert frame["n_corrections"][frame["n_tensors"] == 0].isna().all()
    assert dict(zip(frame["n_tensors"], frame["n_swapped"]))[10] == summary["n_swapped"]


def test_a_plan_run_whole_has_no_warning(tmp_path: Path) -> None:
    study = _study(POINTS, lms_summary={10: {"n_swapped": 10, "n_recomputed": 0}})
    doc, rec, _ = write_outputs(tmp_path, main=study, screen=None, settings=_settings(tmp_path),
                                budget_bytes=100 * MiB, budget_source="--budget", usable_bytes=95 * MiB,
                                environment={})
    assert "plan_corrections" not in doc and "WARNING" not in format_recommendation(doc)
