"""The CLI as a user runs it: ``python -m tuner ...`` in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lms import LMSConfig

from tests import forked_cli

from .conftest import ROOT, TINY_MODEL, run_cli

MiB = 1 << 20
BUDGET = "160MiB"  # the tiny residual CNN: no LMS fits a few hundred samples, LMS more


def _files(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("lms-tuner: ")
    return lines[0]


# ---------------------------------------------------------------- help

@pytest.mark.parametrize("args", [[], ["search"], ["best"], ["list"], ["report"]])
def test_help(args: list[str], tmp_path: Path) -> None:
    proc = run_cli([*args, "--help"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: lms-tuner") and "--help" in proc.stdout
    assert _files(tmp_path) == []


def test_no_command_is_bad_input(tmp_path: Path) -> None:
    proc = run_cli([], cwd=tmp_path)
    assert proc.returncode == 2
    _one_line_error(proc)


# ---------------------------------------------------------------- bad input: one line, exit 2, nothing written

BAD_MODULE = '''
def returns_int():
    return 42

def raises():
    raise RuntimeError("model construction failed")
'''


@pytest.mark.parametrize("args, fragment", [
    (["search", "--model", "no_such_model"], "unknown model 'no_such_model'; built-ins: mlp, cnn_bn, residual, resnet50"),
    (["search", "--model", "no_such_pkg.mod:make"], "cannot import module 'no_such_pkg.mod'"),
    (["search", "--model", "badmod.py:returns_int"], "returned builtins.int; expected tuner.models.Workload"),
    (["search", "--model", "badmod.py:raises"], "raised RuntimeError: model construction failed"),
    (["search", "--model", "badmod.py:missing"], "has no attribute 'missing'"),
    (["search", "--model", "mlp", "--budget", "0"], "budget '0' is zero"),
    (["search", "--model", "mlp", "--budget", "-1GiB"], "budget '-1GiB' is negative"),
    (["search", "--model", "mlp", "--budget", "16XB"], "unknown unit 'XB'"),
    (["search", "--model", "mlp", "--budget", "abc"], "budget 'abc' is not a size"),
    (["search", "--model", "mlp", "--storage", "sqlite:////no/such/dir/s.db"], "unreachable"),
    (["search", "--model", "mlp", "--storage", "journal:/no/such/dir/s.log"], "unreachable"),
    (["search", "--model", "mlp", "--storage", "redis://localhost:6379"], "unknown scheme 'redis'"),
    (["search", "--model", "mlp", "--study", "a/b"], "contains a path separator"),
    (["search", "--model", "mlp", "--study", "..\\x"], "path separator"),
    (["search", "--model", "mlp", "--model-option", "depth=3"], "has no option 'depth'"),
    (["search", "--model", "mlp", "--device", "Z80"], "unknown device 'Z80'"),
    (["search", "--model", "mlp", "--backend", "tpu"], "invalid choice: 'tpu'"),
    (["search", "--model", "mlp", "--trials", "0"], "must be >= 1"),
    (["search", "--model", "mlp", "--backend", "simulate", "--gpus", "0"], "--gpus needs --backend gpu"),
    (["search", "--model", "mlp", "--backend", "simulate", "--workers", "2"], "--workers needs --backend emulated"),
    (["search", "--model", "mlp", "--backend", "simulate", "--gpu", "7"], "--gpu 7: no such GPU"),
    (["search", "--model", "mlp", "--backend", "emulated", "--gpu", "0"], "--gpu needs --backend gpu or simulate"),
    (["best", "--study", "nope"], "study 'nope' does not exist"),
    (["report", "--study", "nope"], "study 'nope' does not exist"),
    (["best", "--study", "x/y"], "path separator"),
])
def test_bad_input(args: list[str], fragment: str, tmp_path: Path) -> None:
    (tmp_path / "badmod.py").write_text(BAD_MODULE)
    before = _files(tmp_path)
    proc = run_cli([*args, "--backend", "simulate"] if args[0] == "search" and "--backend" not in args else args,
                   cwd=tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert fragment in _one_line_error(proc)
    assert _files(tmp_path) == before  # no study folder, no database
    assert proc.stdout == ""


def test_unreachable_database_masks_password(tmp_path: Path) -> None:
    proc = run_cli(["search", "--model", "mlp", "--backend", "simulate", "--storage",
                    "postgresql://tuner:Sup3r-S3cret@127.0.0.1:1/optuna"], cwd=tmp_path)
    assert proc.returncode == 2
    line = _one_line_error(proc)
    assert "Sup3r-S3cret" not in proc.stderr + proc.stdout
    assert "tuner:***@127.0.0.1:1/optuna" in line
    assert _files(tmp_path) == []


# ---------------------------------------------------------------- simulate end to end (cached tiny graph)

def _search(tmp_path: Path, study: str, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_cli(["search", "--model", TINY_MODEL, "--backend", "simulate", "--budget", BUDGET,
                    "--study", study, "--seed", "0", *extra], cwd=tmp_path, timeout=timeout)


def test_simulate_search_best_list(tmp_path: Path, seed_graph) -> None:
    seed_graph(tmp_path / "studies", "sim")
    proc = _search(tmp_path, "sim", "--trials", "12")
    assert proc.returncode == 0, proc.stderr
    rec = tmp_path / "studies" / "sim" / "recommended.json"
    doc = json.loads(rec.read_text())
    assert doc["schema"] == "tuner.recommendation" and doc["backend"] == "simulate"
    assert doc["measured"] is False
    assert doc["sources"]["batch_size"] == "predicted (simulator, device profile V100-16GB)"
    assert doc["budget_bytes"] == 160 * MiB and doc["peak_device_bytes"] <= doc["usable_bytes"]
    assert LMSConfig.load(rec) == LMSConfig.from_dict(doc["config"])
    # every figure printed carries its source
    for key in ("batch size", "throughput", "peak memory"):
        line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith(key))
        assert "predicted (simulator" in line, line
    assert "12 trials" in proc.stdout
    # the HTML report is written at the end of the search
    report = tmp_path / "reports" / "sim" / "index.html"
    assert f"report: {report}" in proc.stdout.replace("report: reports/", f"report: {tmp_path}/reports/")
    assert report.is_file() and "<html" in report.read_text()[:200].lower()
    import pandas as pd
    frame = pd.read_csv(tmp_path / "studies" / "sim" / "trials.csv")
    evaluated = frame[frame["duplicate_of"].isna()]  # repeats of an evaluated config are free and not counted
    assert len(evaluated) == 12 and (frame["figures"] == "predicted").all()
    assert evaluated["config"].nunique() == 12

    best = run_cli(["best", "--study", "sim", "--json"], cwd=tmp_path)
    assert best.returncode == 0 and json.loads(best.stdout) == doc
    listed = run_cli(["list"], cwd=tmp_path)
    assert listed.returncode == 0
    row = next(ln for ln in listed.stdout.splitlines() if ln.startswith("sim "))
    assert row.split()[1] == "12" and TINY_MODEL in row and "simulate" in row and "(predicted)" in row


def test_parent_process_never_imports_tensorflow(tmp_path: Path, seed_graph) -> None:
    """The whole simulate search runs with TensorFlow made unimportable in the CLI process."""
    seed_graph(tmp_path / "studies", "notf")
    code = ("import sys; sys.modules['tensorflow'] = None; sys.modules['keras'] = None\n"
            "from tuner.cli import main\n"
            f"rc = main(['search', '--model', '{TINY_MODEL}', '--backend', 'simulate', '--budget', '{BUDGET}', "
            "'--study', 'notf', '--trials', '4', '-q'])\n"
            "assert sys.modules.get('tensorflow') is None\n"
            "sys.exit(rc)")
    proc = run_cli(["-c", code], cwd=tmp_path, python_prefix=[])
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "studies" / "notf" / "recommended.json").is_file()


def _completed(db: Path, study: str) -> list[tuple]:
    if not db.exists():
        return []
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        rows = con.execute(
            "SELECT t.number, t.datetime_start FROM trials t JOIN studies s ON s.study_id = t.study_id "
            "WHERE s.study_name = ? AND t.state = 'COMPLETE' ORDER BY t.number", (study,)).fetchall()
        con.close()
        return rows
    except sqlite3.Error:
        return []


def test_resume_after_kill_does_not_redo_trials(tmp_path: Path, seed_graph) -> None:
    seed_graph(tmp_path / "studies", "res")
    db = tmp_path / "studies" / "res" / "study.db"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "tuner", "search", "--model", TINY_MODEL, "--backend", "simulate", "--budget",
           BUDGET, "--study", "res", "--seed", "0", "--trials", "40", "-q"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while len(_completed(db, "res")) < 6:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the search made no progress"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # no chance to clean up: a trial may be left RUNNING
    proc.wait()
    before = _completed(db, "res")
    assert 6 <= len(before) < 40
    assert not (tmp_path / "studies" / "res" / "recommended.json").exists()

    import optuna

    def evaluated() -> int:  # configs evaluated (repeats of an evaluated config are not counted)
        study = optuna.load_study(study_name="res", storage=f"sqlite:///{db}")
        return sum(1 for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
                   if "duplicate_of" not in t.user_attrs)

    done_before = evaluated()
    rerun = forked_cli.run(cmd[3:-1], cwd=tmp_path, env=env, timeout=300)  # `python -m tuner ARGS`, forked
    assert rerun.returncode == 0, rerun.stderr
    after = _completed(db, "res")
    assert after[:len(before)] == before  # the same trials, started at the same times: none redone
    assert evaluated() == 40
    assert f"{40 - done_before} run now" in rerun.stdout
    study = optuna.load_study(study_name="res", storage=f"sqlite:///{db}")
    interrupted = [t for t in study.trials if t.user_attrs.get("status") == "interrupted"]
    retried = [t for t in study.trials if "retry_of" in t.user_attrs]
    assert len(interrupted) <= 1
    # killed after its params were drawn: queued again; killed before: nothing to redo
    assert len(retried) == len([t for t in interrupted if t.params])
    for t in retried:  # the interrupted config was run again with the params it had drawn
        drawn = study.trials[t.user_attrs["retry_of"]].params  # (all, or the first few if killed mid-draw)
        assert drawn.items() <= t.params.items()


def test_journal_storage_and_report(tmp_path: Path, seed_graph) -> None:
    seed_graph(tmp_path / "studies", "jr")
    journal = f"journal:{tmp_path}/shared.log"
    proc = _search(tmp_path, "jr", "--trials", "5", "--storage", journal)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "shared.log").is_file() and not (tmp_path / "studies" / "jr" / "study.db").exists()
    listed = run_cli(["list", "--storage", journal], cwd=tmp_path)
    assert listed.returncode == 0 and any(ln.startswith("jr ") for ln in listed.stdout.splitlines())
    best = run_cli(["best", "--study", "jr", "--storage", journal], cwd=tmp_path)
    assert best.returncode == 0 and "predicted" in best.stdout
    report = run_cli(["report", "--study", "jr", "--storage", journal], cwd=tmp_path)
    import importlib.util
    if importlib.util.find_spec("tuner.report") is None:
        assert report.returncode == 1 and "tuner.report" in report.stderr
    else:
        assert report.returncode == 0, report.stderr
        assert (tmp_path / "reports" / "jr" / "index.html").is_file()


# ---------------------------------------------------------------- real runs (TensorFlow)

def _train_with(rec: Path, model: str, options: dict, *, batch: int, steps: int = 3) -> list[float]:
    """Load a recommendation and train a few steps with lms.function (what a user's script does)."""
    import numpy as np
    import tensorflow as tf

    import lms
    from lms.tf.train import make_train_step
    from tuner.models import load_workload

    config = LMSConfig.load(rec)
    w = load_workload(model, **options)
    model_ = w.build_model()
    step = lms.function(make_train_step(model_, w.loss_fn, w.make_optimizer()), config=config, emulate=True)
    x, y = w.make_batch(batch, 0)
    losses = [float(step(tf.constant(x), tf.constant(y))) for _ in range(steps)]
    assert all(np.isfinite(losses))
    if config.enabled:
        assert step.summary is not None and step.summary.n_swapped > 0
    return losses


@pytest.mark.slow
def test_emulated_search_end_to_end(tmp_path: Path) -> None:
    proc = run_cli(["search", "--model", "cnn_bn", "--backend", "emulated", "--budget", "48MiB", "--trials", "2",
                    "--screen-trials", "4", "--max-batch", "256", "--study", "emu", "--seed", "0", "--steps", "3"],
                   cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = tmp_path / "studies" / "emu" / "recommended.json"
    doc = json.loads(rec.read_text())
    assert doc["backend"] == "emulated" and doc["measured"] is True
    assert doc["sources"]["peak_device_bytes"] == "measured on the emulated device (CPU, TensorFlow BFC allocator)"
    assert doc["peak_source"] == "tf-bfc-cpu" and 0 < doc["peak_device_bytes"] <= doc["usable_bytes"]
    assert doc["batch_size"] >= 1 and doc["throughput"] > 0
    assert doc["step_time_s"]["timed_steps"] == 3
    env = doc["environment"]
    assert env["tensorflow"] and "emulated" in env["device_name"]
    assert env["worker_tensorflow"].startswith("2.") and "BFC" in env["worker_device"]
    assert "batch" in proc.stderr and ("fits" in proc.stderr or "does not fit" in proc.stderr)
    for key in ("batch size", "throughput", "peak memory"):
        line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith(key))
        assert "measured on the emulated device" in line
    import pandas as pd
    frame = pd.read_csv(tmp_path / "studies" / "emu" / "trials.csv")
    main = frame[(frame["study"] == "emu") & (frame["state"] != "waiting")]  # a warm start left for the next run
    assert len(main) == 2 and main["measured"].all()
    assert (frame[frame["study"] == "emu.simulated"]["figures"] == "predicted").all()
    # the trace worker profiled the step: the screening simulated with measured op times
    graph_doc = json.loads((tmp_path / "studies" / "emu" / "graph.json").read_text())
    from lms.sim.opcosts import OpCosts
    costs = OpCosts.from_dict(graph_doc["op_costs"])
    lo, hi = costs.batches  # fixed: twice and eight times the default batch (8), whatever the load
    assert (lo, hi) == (16, 64) and costs.step_seconds(hi) > costs.step_seconds(lo) > 0
    assert any(name.endswith("Conv2DBackpropFilter") for name, t in costs.per_sample.items() if t > 0)
    assert "simulator op times: measured on this CPU (tf.profiler" in proc.stdout
    _train_with(rec, "cnn_bn", {}, batch=4)


@pytest.mark.slow
def test_resnet50_simulate_end_to_end(tmp_path: Path) -> None:
    proc = run_cli(["search", "--model", "resnet50", "--backend", "simulate", "--budget", "16GiB", "--trials", "5",
                    "--study", "r50", "--seed", "0"], cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = tmp_path / "studies" / "r50" / "recommended.json"
    doc = json.loads(rec.read_text())
    assert doc["backend"] == "simulate" and doc["measured"] is False and doc["budget_bytes"] == 16 << 30
    assert doc["baseline"]["batch_size"] > 50  # no-LMS ResNet-50 fits well over 50 samples in 16 GiB
    assert doc["batch_size"] >= doc["baseline"]["batch_size"]
    # the recommended config trains ResNet-50 (small images, batch 2 on this CPU)
    _train_with(rec, "resnet50", {"image_size": 32, "num_classes": 10}, batch=2, steps=2)
