"""Issue 12, reliability round two: defects found by hostile or careless use, each through the real CLI.

Fault-injection cases with figures (a killed parent, simultaneous starts,
machine-caused failures) are in test_faults.py; PostgreSQL password masking in
test_postgres.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from lms import LMSConfig

from .conftest import ROOT, TINY_MODEL, run_cli

STUDY = "rel"


def _search(tmp_path: Path, *extra: str, env: dict | None = None, timeout: float = 120,
            study: str = STUDY) -> subprocess.CompletedProcess:
    return run_cli(["search", "--model", TINY_MODEL, "--study", study, "--seed", "0", "--no-report", *extra],
                   cwd=tmp_path, env=env, timeout=timeout)


def _trials(tmp_path: Path, study: str = STUDY) -> list:
    db = tmp_path / "studies" / study / "study.db"
    return optuna.load_study(study_name=study, storage=f"sqlite:///{db}").get_trials(deepcopy=False)


# ---------------------------------------------------------------- 2. every measured trial failed

def test_all_measured_trials_failing_exits_1_with_advice_that_measures(tmp_path: Path, seed_graph) -> None:
    seed_graph(tmp_path / "studies", STUDY)
    common = ("--backend", "emulated", "--budget", "1GiB", "--screen-trials", "4", "--timeout", "0")
    first = _search(tmp_path, *common, "--trials", "3", env={"LMS_TUNER_FAULT": "kill@*"})
    assert first.returncode == 1, (first.returncode, first.stderr)
    line = first.stderr.strip().splitlines()[-1]
    assert "every measured trial failed or timed out (3 killed)" in line and "PREDICTED" in line
    assert "--trials 6" in line, line
    doc = json.loads((tmp_path / "studies" / STUDY / "recommended.json").read_text())
    assert doc["measured"] is False and any("--trials 6" in n for n in doc["notes"])
    # the advice works: it measures 3 more configs
    second = _search(tmp_path, *common, "--trials", "6", env={"LMS_TUNER_FAULT": "ok@*"})
    assert second.returncode == 0, second.stderr
    measured_ok = [t for t in _trials(tmp_path) if t.user_attrs.get("measured") and t.user_attrs["status"] == "ok"
                   and "duplicate_of" not in t.user_attrs]
    assert len(measured_ok) == 3


# ---------------------------------------------------------------- 5. another process holds the last slot

def test_stopping_because_another_process_runs_the_last_trial_says_so(tmp_path: Path, seed_graph) -> None:
    seed_graph(tmp_path / "studies", STUDY)
    cmd = [sys.executable, "-m", "tuner", "search", "--model", TINY_MODEL, "--study", STUDY, "--seed", "0",
           "--backend", "emulated", "--budget", "1GiB", "--screen-trials", "4", "--timeout", "0", "--trials", "3",
           "--no-report", "-q"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), LMS_TUNER_FAULT="ok@0,ok@1,hang@*")
    holder = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # trial 2 is a bracket of fresh processes (--confirm 2): its first process wrote its first event
        trial = tmp_path / "studies" / STUDY / "trials" / "0002"
        deadline = time.monotonic() + 120
        while not any(p.stat().st_size for p in trial.glob("process-*/events.jsonl")):
            assert holder.poll() is None, holder.communicate()
            assert time.monotonic() < deadline, "the holder's trial 2 did not start within 120 s"
            time.sleep(0.05)
        other = run_cli(cmd[3:], cwd=tmp_path, env={"LMS_TUNER_FAULT": "ok@*"}, timeout=120)
    finally:
        holder.send_signal(2)
        holder.communicate(timeout=30)
    assert other.returncode == 0, other.stderr
    assert "time limit" not in other.stdout + other.stderr
    assert "stopped before 3 trials: the other 1 trial(s) are running in another process" in other.stdout


# ---------------------------------------------------------------- 6, 7 and minor: bad input at parse time

@pytest.mark.parametrize("args, fragment", [
    (["--seed", "-1"], "must be between 0 and 4294967295"),
    (["--seed", "12345678901234567890"], "must be between 0 and 4294967295"),
    (["--budget", "9" * 400], "more than 1 PiB"),
    (["--budget", "1000000TiB"], "more than 1 PiB"),
    (["--workers", "2"], "--workers needs --backend emulated or gpu"),
])
def test_bad_numbers_are_bad_input_and_write_nothing(args: list[str], fragment: str, tmp_path: Path) -> None:
    proc = run_cli(["search", "--model", "mlp", "--backend", "simulate", *args], cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- 9. LMSConfig.load guards

@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "oversized"])
def test_lms_config_load_refuses_what_is_not_a_small_regular_file(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_text('{"schema": "lms.config", "schema_version": 1, "config": {}, "pad": "' + "x" * (5 << 20) + '"}')
    # in a child with a memory cap and a timeout: the unguarded load reads /dev/zero until memory runs out
    code = ("import resource, sys, lms\n"
            "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
            "try:\n    lms.LMSConfig.load(sys.argv[1])\n"
            "except ValueError as e:\n    print('ValueError:', e)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    expected = {"dev-zero": "not a regular file", "fifo": "not a regular file (a FIFO)",
                "oversized": "larger than 4 MiB"}[kind]
    assert proc.returncode == 0 and expected in proc.stdout, (proc.returncode, proc.stdout, proc.stderr[-500:])


# ---------------------------------------------------------------- 10. the time ran out first

def test_a_time_limit_that_runs_out_first_says_so(tmp_path: Path, seed_graph) -> None:
    seed_graph(tmp_path / "studies", STUDY)
    proc = _search(tmp_path, "--backend", "simulate", "--timeout", "0.001")
    assert proc.returncode == 1, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "time limit (0.001 s) ran out before any config was evaluated" in line, proc.stderr
    assert "no config fits" not in proc.stderr


# ---------------------------------------------------------------- 12. warm start survives an early Ctrl-C

def test_warm_start_is_queued_again_after_an_interrupt_right_after_creation(tmp_path: Path, seed_graph,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.cli.args import build_parser
    from tuner.cli.search_settings import build_search_settings
    from tuner.search import run_search

    seed_graph(tmp_path / "studies", STUDY)
    argv = ["search", "--model", TINY_MODEL, "--study", STUDY, "--backend", "simulate", "--trials", "4",
            "--seed", "0", "--studies-dir", str(tmp_path / "studies")]
    settings = build_search_settings(build_parser().parse_args(argv))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C at the first enqueue: the study exists, nothing is queued

    monkeypatch.setattr(optuna.study.Study, "enqueue_trial", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_search(settings)
    monkeypatch.undo()
    assert _trials(tmp_path) == []
    proc = _search(tmp_path, "--backend", "simulate", "--trials", "4")
    assert proc.returncode == 0, proc.stderr
    trials = _trials(tmp_path)
    warm = [t for t in trials if t.user_attrs.get("warm_start")]
    assert [t.number for t in warm] == [0, 1, 2]
    assert warm[0].user_attrs["config"]["n_tensors"] == 0 and warm[1].user_attrs["config"]["n_tensors"] == -1
    assert warm[2].user_attrs["config"] == LMSConfig(schedule="memory").to_dict()


def test_warm_start_is_queued_once_over_many_starts(tmp_path: Path, seed_graph) -> None:
    seed_graph(tmp_path / "studies", STUDY)
    for trials in ("2", "3"):
        assert _search(tmp_path, "--backend", "simulate", "--trials", trials).returncode == 0
    trials = _trials(tmp_path)
    assert sum(1 for t in trials if t.user_attrs.get("warm_start")) == 3  # no LMS, TFLMS's defaults, + memory order
    assert all(t.state != optuna.trial.TrialState.WAITING for t in trials)


# ---------------------------------------------------------------- 13. list with a corrupt study.db

def test_list_shows_every_readable_study_and_flags_a_corrupt_one(tmp_path: Path) -> None:
    from tuner.study.storage import open_storage, resolve_storage

    studies = tmp_path / "studies"
    for name in ("alpha", "gamma"):
        optuna.create_study(study_name=name, storage=open_storage(resolve_storage(None, name, studies_dir=studies)))
    (studies / "beta").mkdir()
    (studies / "beta" / "study.db").write_bytes(b"this is not a database\x00" * 100)
    proc = run_cli(["list"], cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[1:]}
    assert set(rows) == {"alpha", "beta", "gamma"}, proc.stdout
    assert "UNREADABLE" in rows["beta"] and "UNREADABLE" not in rows["alpha"] + rows["gamma"]
    assert "beta" in proc.stderr and "Traceback" not in proc.stderr


# ---------------------------------------------------------------- 14. the README's journal recipe

def test_readme_journal_recipe_works_in_a_fresh_directory(tmp_path: Path, seed_graph) -> None:
    seed_graph(tmp_path / "seed", STUDY)  # the graph, cached where this study keeps it
    (tmp_path / "studies" / STUDY).mkdir(parents=True)
    (tmp_path / "seed" / STUDY / "graph.json").rename(tmp_path / "studies" / STUDY / "graph.json")
    storage = f"journal:./studies/{STUDY}-shared/journal.log"  # a folder that does not exist yet
    proc = _search(tmp_path, "--backend", "simulate", "--trials", "2", "--storage", storage)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "studies" / f"{STUDY}-shared" / "journal.log").stat().st_size > 0


def test_journal_storage_in_a_missing_folder_outside_the_current_one_is_still_unreachable(tmp_path: Path) -> None:
    proc = run_cli(["search", "--model", "mlp", "--backend", "simulate", "--storage",
                    f"journal:{tmp_path}/no/such/j.log"], cwd="/proc", timeout=60)
    assert proc.returncode == 2 and "does not exist" in proc.stderr, proc.stderr
    assert not (tmp_path / "no").exists()


# ---------------------------------------------------------------- 15. the cause of a tracing failure

NO_WEIGHTS = '''
from tuner.models import Workload, sparse_softmax_cross_entropy
import numpy as np


def build_model():
    import keras
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Activation("relu")(inputs))


def make_optimizer():
    import keras
    return keras.optimizers.SGD(0.01)


def make_batch(batch_size, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch_size, 4)).astype("float32"), rng.integers(0, 4, batch_size).astype("int32")


def make_workload():
    return Workload(name="no_weights", description="a model without trainable weights", build_model=build_model,
                    loss_fn=sparse_softmax_cross_entropy, make_optimizer=make_optimizer, x_shape=(4,), y_shape=(),
                    x_dtype="float32", y_dtype="int32", make_batch=make_batch, default_batch=2, options={})
'''


@pytest.mark.slow
def test_a_tracing_failure_names_its_cause(tmp_path: Path) -> None:
    (tmp_path / "no_weights.py").write_text(NO_WEIGHTS)
    proc = run_cli(["search", "--model", "no_weights.py:make_workload", "--backend", "simulate", "--no-report"],
                   cwd=tmp_path, timeout=300)
    assert proc.returncode == 1, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "search failed: tracing" in line and "in user code:" in line
    cause = line.split(" ... ", 1)[1]
    assert "ValueError" in cause or "gradient" in cause.lower() or "variable" in cause.lower(), line
    assert len(cause.split("(log:")[0].strip()) > 10, line
