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
from tests import forked_cli
from tuner.policy.knobs import canonical_key
from tuner.policy.records import counted
from tuner.study.storage import engine_url

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
    evaluated = sum(1 for t in trials if counted(t))
    # each process stops once done + running reaches --trials; one trial per other process may be in flight then
    assert TRIALS <= evaluated <= TRIALS + WORKERS - 1
    keys = [canonical_key(LMSConfig.from_dict(t.user_attrs["config"])) for t in trials if counted(t)]
    assert len(keys) == len(set(keys)), Counter(keys).most_common(3)
    doc = json.loads((tmp_path / "studies" / study_name / "recommended.json").read_text())
    assert doc["schema"] == "tuner.recommendation" and doc["backend"] == "simulate"
    assert LMSConfig.load(tmp_path / "studies" / study_name / "recommended.json") == LMSConfig.from_dict(doc["config"])
    assert doc["peak_device_bytes"] <= doc["usable_bytes"]
    f = figures(study, {})
    report_fault_figures(f"{WORKERS} processes on PostgreSQL", f)
    assert f["lost"] == 0 and f["duplicates"] == 0

    # ------------------------------------------------ the password appears nowhere
    best = forked_cli.run(["best", "--study", study_name, "--storage", postgres_url], cwd=tmp_path, env=env,
                          timeout=60)
    listed = forked_cli.run(["list", "--storage", postgres_url, "-v"], cwd=tmp_path, env=env, timeout=60)
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


def _dump(admin_url: str) -> str:
    """Every row of every table of the optuna database, as text (the study database dump)."""
    import psycopg2

    from sqlalchemy.engine import make_url

    u = make_url(admin_url)
    con = psycopg2.connect(host=u.host, port=u.port, user=u.username, password=u.password, dbname=u.database)
    try:
        with con.cursor() as cur:
            cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            tables = [r[0] for r in cur.fetchall()]
            rows = []
            for table in tables:
                cur.execute(f'SELECT t::text FROM "{table}" t')
                rows += [r[0] for r in cur.fetchall()]
    finally:
        con.close()
    assert len(rows) > 10
    return "\n".join(rows)


def test_no_kind_of_password_leaks_into_outputs(postgres_url: str, tmp_path: Path, seed_graph) -> None:
    """Issue 12, item 1: a password with / @ : # ? % + space or non-ASCII: masked in every output, stdout,
    stderr and the study's stored settings."""
    import psycopg2
    from urllib.parse import quote

    from sqlalchemy.engine import make_url

    from .test_storage import TRICKY_PASSWORDS, _leaks

    admin = make_url(postgres_url)
    con = psycopg2.connect(host=admin.host, port=admin.port, user=admin.username, password=admin.password,
                           dbname=admin.database)
    con.autocommit = True
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("LMS_TUNER_FAULT", None)
    printed = []
    for i, password in enumerate(TRICKY_PASSWORDS):
        with con.cursor() as cur:
            cur.execute(f"ALTER ROLE {admin.username} PASSWORD %s", (password,))
        # raw where SQLAlchemy reads it raw ('/' as in the issue), %-encoded where it must be
        written = password if password == "Sl4sh/SeKrit" else quote(password, safe="")
        url = f"postgresql://{admin.username}:{written}@{admin.host}:{admin.port}/{admin.database}"
        study = f"mask-{i}"
        seed_graph(tmp_path / "studies", study)
        commands = [["search", "--model", TINY_MODEL, "--backend", "simulate", "--budget", "160MiB", "--study", study,
                     "--trials", "2", "--storage", url, "-v", *(["--no-report"] if i >= 2 else [])]]
        if i < 2:  # list, best and the report read the same storage display (the search writes it); twice is enough
            commands += [["list", "--storage", url], ["best", "--study", study, "--storage", url]]
        for cmd in commands:  # `python -m tuner CMD`, forked from a process that imported the CLI
            proc = forked_cli.run(cmd, cwd=tmp_path, env=env, timeout=120)
            assert proc.returncode == 0, proc.stderr[-2000:]
            printed.append((password, proc.stdout + proc.stderr))
        assert f"{admin.username}:***@" in printed[-len(commands)][1]  # the INFO line shows the masked URL
    with con.cursor() as cur:
        cur.execute(f"ALTER ROLE {admin.username} PASSWORD %s", (admin.password,))
    con.close()
    dump = _dump(postgres_url)
    files = {str(p): p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()}
    assert any(p.endswith("recommended.json") for p in files) and any(p.endswith("index.html") for p in files)
    for password in TRICKY_PASSWORDS:
        for where, text in [("database dump", dump), *files.items(),
                            *[("output", out) for pw, out in printed if pw == password]]:
            assert not _leaks(text, password), (password, where)
