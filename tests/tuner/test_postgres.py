"""Several search processes on one study in a real PostgreSQL server; the password never leaks.

The server is a throwaway cluster started by the session fixture `postgres_url`
(tests/tuner/conftest.py); the processes run the simulate backend on the tiny
cached graph, so each takes seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import optuna

from lms import LMSConfig
from tuner.search import _counted, canonical_key
from tuner.storage import engine_url

from .conftest import PG_PASSWORD, ROOT, TINY_MODEL, report_fault_figures
from .test_faults import figures

WORKERS = 4
TRIALS = 24


def _cmd(url: str, study: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tuner", "search", "--model", TINY_MODEL, "--backend", "simulate",
            "--budget", "160MiB", "--study", study, "--trials", str(TRIALS), "--storage", url, *extra]


def test_concurrent_workers_share_one_study(postgres_url: str, tmp_path: Path, seed_graph) -> None:
    study_name = "pg-concurrent"
    seed_graph(tmp_path / "studies", study_name)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("LMS_TUNER_FAULT", None)
    # the same command on WORKERS processes at once (one of them with debug logging, for the secrets check)
    procs = [subprocess.Popen(_cmd(postgres_url, study_name, *(["-v"] if i == 0 else [])), cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(WORKERS)]
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]

    study = optuna.load_study(study_name=study_name, storage=engine_url(postgres_url))
    trials = study.get_trials(deepcopy=False)
    owners = {t.user_attrs["owner"]["pid"] for t in trials if "owner" in t.user_attrs}
    assert len(owners) >= 2  # the work was shared
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    evaluated = sum(1 for t in trials if _counted(t))
    # each process stops once done + running reaches --trials; one trial per other process may be in flight then
    assert TRIALS <= evaluated <= TRIALS + WORKERS - 1
    keys = [canonical_key(LMSConfig.from_dict(t.user_attrs["config"])) for t in trials if _counted(t)]
    assert len(keys) == len(set(keys)), Counter(keys).most_common(3)
    doc = json.loads((tmp_path / "studies" / study_name / "recommended.json").read_text())
    assert doc["schema"] == "tuner.recommendation" and doc["backend"] == "simulate"
    assert LMSConfig.load(tmp_path / "studies" / study_name / "recommended.json") == LMSConfig.from_dict(doc["config"])
    assert doc["peak_device_bytes"] <= doc["usable_bytes"]
    f = figures(study, {})
    report_fault_figures(f"{WORKERS} processes on PostgreSQL", f)
    assert f["lost"] == 0 and f["duplicates"] == 0

    # ------------------------------------------------ the password appears nowhere
    best = subprocess.run([sys.executable, "-m", "tuner", "best", "--study", study_name, "--storage", postgres_url],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    listed = subprocess.run([sys.executable, "-m", "tuner", "list", "--storage", postgres_url, "-v"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=60)
    assert best.returncode == 0 and listed.returncode == 0, best.stderr + listed.stderr
    assert study_name in listed.stdout
    texts = [o for pair in outs for o in pair] + [best.stdout, best.stderr, listed.stdout, listed.stderr]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "recommended.json" for p in files) and any(p.name == "trials.csv" for p in files)
    texts += [p.read_bytes().decode("utf-8", "replace") for p in files]
    assert "tuner:***@127.0.0.1" in "".join(outs[0])  # the storage is named, masked
    leaks = [i for i, text in enumerate(texts) if PG_PASSWORD in text]
    assert leaks == [], f"password found in {len(leaks)} output(s)"
    # nor in what the study stores
    assert PG_PASSWORD not in json.dumps(study.user_attrs, default=str)


def test_bad_password_is_one_line_and_masked(postgres_url: str, tmp_path: Path) -> None:
    wrong = postgres_url.replace(PG_PASSWORD, "Wr0ng-Pass-77")
    proc = subprocess.run(_cmd(wrong, "pg-bad"), cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "unreachable" in lines[0] and "tuner:***@" in lines[0], proc.stderr
    assert "Wr0ng-Pass-77" not in proc.stderr + proc.stdout
    assert list(tmp_path.iterdir()) == []
