"""Shared helpers for tuner tests: run the real CLI in a subprocess; a tiny model's traced graph, once."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import forked_cli
from tests.figures import FIGURES_PROPERTY, format_figures

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = "residual"
TINY_OPTIONS: dict = {}


def run_cli(args: list[str], *, cwd: Path, timeout: float = 300, env: dict | None = None,
            python_prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    """``python -m tuner ARGS`` the way a user runs it (from `cwd`)."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT) + (os.pathsep + full_env["PYTHONPATH"] if full_env.get("PYTHONPATH") else "")
    full_env.update(env or {})
    if python_prefix is None:  # forked from a process that imported the CLI once (tests/forked_cli.py)
        return forked_cli.run(args, cwd=cwd, env=full_env, timeout=timeout)
    cmd = [sys.executable, *python_prefix, *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)


@pytest.fixture(scope="session")
def tiny_graph_doc(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The trace worker's graph.json for the tiny residual CNN (TensorFlow runs once, in a worker)."""
    from tuner.worker.protocol import TraceRequest
    from tuner.worker.run import run_worker, worker_env

    tmp = tmp_path_factory.mktemp("trace")
    out = tmp / "graph.json"
    outcome = run_worker(TraceRequest(workload=TINY_MODEL, options=TINY_OPTIONS,
                                      key={"model": TINY_MODEL, "model_options": TINY_OPTIONS}, output=str(out)),
                         workdir=tmp / "work", timeout_s=300, env=worker_env())
    assert outcome.status == "ok", (outcome.reason, outcome.log_path.read_text()[-2000:])
    return json.loads(out.read_text())


@pytest.fixture
def seed_graph(tiny_graph_doc: dict):
    """Put the cached tiny graph where a study would keep it: studies/<study>/graph.json."""
    def seed(studies_dir: Path, study: str) -> Path:
        path = studies_dir / study / "graph.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(tiny_graph_doc))
        return path
    return seed


# ---------------------------------------------------------------- fault-suite figures

def report_fault_figures(name: str, figures: dict) -> None:
    """Record one fault test's figures: printed at once on the real stderr and again in the summary.

    They travel on the test's report (``user_properties``), so that under pytest-xdist the
    summary, printed by the controlling process (tests/conftest.py), sees what its workers recorded.
    """
    _PENDING.append({"test": name, **figures})
    print(f"\n[fault figures] {name}: {format_figures(figures)}", file=sys.__stderr__, flush=True)


#: Figures recorded by the running test, not yet attached to its report.
_PENDING: list[dict] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # noqa: ARG001
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        report.user_properties.extend((FIGURES_PROPERTY, f) for f in _PENDING)
        _PENDING.clear()


# ---------------------------------------------------------------- a throwaway PostgreSQL server

PG_PASSWORD = "Pg-S3cret-9f2c"  # the tests grep every output for it


def _pg_bin() -> Path | None:
    import glob
    import shutil

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory: pytest.TempPathFactory):
    """``postgresql://tuner:PASSWORD@127.0.0.1:PORT/optuna`` on a cluster started for this session.

    initdb/pg_ctl from Debian's postgresql package, run as the ``postgres`` user
    when the tests run as root; loopback only; stopped at the end. Skipped
    (with the reason) only when the binaries are absent and ``CI`` is not set.
    """
    with postgres_server() as server:
        yield server.url


class PostgresServer:
    """A throwaway PostgreSQL cluster (`postgres_server`): its URL, and `stop` to take it down mid-test."""

    def __init__(self, url: str, stop) -> None:
        self.url = url
        self.stop = stop


@contextlib.contextmanager
def postgres_server():
    """Start a throwaway PostgreSQL cluster (see `postgres_url`); yields a `PostgresServer`, removed at the end."""
    import shutil
    import tempfile

    bindir = _pg_bin()
    if bindir is None or importlib_find("psycopg2") is None:
        missing = "PostgreSQL binaries (initdb, pg_ctl)" if bindir is None else "psycopg2"
        if os.environ.get("CI"):
            pytest.fail(f"{missing} not found; CI must run the PostgreSQL tests (apt-get install -y postgresql; "
                        "pip install psycopg2-binary)")
        pytest.skip(f"{missing} not installed (apt-get install -y postgresql; pip install psycopg2-binary)")
    root = Path(tempfile.mkdtemp(prefix="lms-pg-"))
    data = root / "data"
    run_as: list[str] = []
    if os.geteuid() == 0:
        runuser = shutil.which("runuser")
        assert runuser, "running as root needs runuser to start PostgreSQL as the postgres user"
        run_as = [runuser, "-u", "postgres", "--"]
        shutil.chown(root, "postgres")
    os.chmod(root, 0o700)
    pwfile = root / "pw"
    pwfile.write_text("admin-pw\n")
    if run_as:
        shutil.chown(pwfile, "postgres")
    port = _free_port()
    subprocess.run([*run_as, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=scram-sha-256",
                    f"--pwfile={pwfile}", "-E", "UTF8", "--no-sync"], check=True, capture_output=True, timeout=120)
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100"
    subprocess.run([*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-o", opts, "-w",
                    "-t", "60", "start"], check=True, capture_output=True, timeout=90)

    def stop() -> None:
        subprocess.run([*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                       capture_output=True, timeout=60)

    try:
        import psycopg2

        con = psycopg2.connect(host="127.0.0.1", port=port, user="postgres", password="admin-pw", dbname="postgres")
        con.autocommit = True
        with con.cursor() as cur:
            cur.execute(f"CREATE ROLE tuner LOGIN PASSWORD '{PG_PASSWORD}'")
            cur.execute("CREATE DATABASE optuna OWNER tuner")
        con.close()
        yield PostgresServer(f"postgresql://tuner:{PG_PASSWORD}@127.0.0.1:{port}/optuna", stop)
    finally:
        stop()
        shutil.rmtree(root, ignore_errors=True)


def importlib_find(name: str):
    import importlib.util

    return importlib.util.find_spec(name)
