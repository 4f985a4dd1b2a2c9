"""Shared helpers for tuner tests: run the real CLI in a subprocess; a tiny model's traced graph, once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = "residual"
TINY_OPTIONS: dict = {}


def run_cli(args: list[str], *, cwd: Path, timeout: float = 300, env: dict | None = None,
            python_prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    """``python -m tuner ARGS`` the way a user runs it (from `cwd`)."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT) + (os.pathsep + full_env["PYTHONPATH"] if full_env.get("PYTHONPATH") else "")
    full_env.update(env or {})
    cmd = [sys.executable, *(["-m", "tuner"] if python_prefix is None else python_prefix), *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)


@pytest.fixture(scope="session")
def tiny_graph_doc(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The trace worker's graph.json for the tiny residual CNN (TensorFlow runs once, in a worker)."""
    from tuner.trial import run_worker, worker_env

    tmp = tmp_path_factory.mktemp("trace")
    out = tmp / "graph.json"
    outcome = run_worker({"mode": "trace", "workload": TINY_MODEL, "options": TINY_OPTIONS,
                          "key": {"model": TINY_MODEL, "model_options": TINY_OPTIONS}, "output": str(out)},
                         workdir=tmp / "work", timeout_s=300, env=worker_env("emulated"))
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
