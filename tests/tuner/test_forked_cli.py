"""The suite's forked ``python -m tuner`` (tests/forked_cli.py) behaves as the command started from nothing."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import forked_cli

from .conftest import ROOT, TINY_MODEL


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **extra)
    env.pop(forked_cli.ENV, None)
    return env


def test_no_module_of_the_project_reads_the_environment_when_imported() -> None:
    """The server imports the CLI before the command's environment exists: a module that read a variable at
    import would see the server's. Every read is inside a function (called when the command runs)."""
    found = []
    for package in ("lms", "tuner"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for stmt in ast.parse(path.read_text()).body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    continue
                names = {n.attr for n in ast.walk(stmt) if isinstance(n, ast.Attribute)}
                names |= {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}
                if names & {"environ", "getenv", "environb"}:
                    found.append(f"{path.relative_to(ROOT)}:{stmt.lineno}")
    assert found == []


@pytest.mark.parametrize("args", [["--help"], ["search", "--help"], ["search", "--model", "nosuch"],
                                  ["search", "--model", "localmodel:nosuch", "--backend", "simulate"],
                                  ["best", "--study", "none"], ["list"]])
def test_a_forked_command_prints_and_exits_as_one_started_from_nothing(args: list[str], tmp_path: Path) -> None:
    # a module in the working directory is importable by `package.module:function` (sys.path[0], as -m sets it)
    (tmp_path / "localmodel.py").write_text("X = 1\n")
    fresh = subprocess.run([sys.executable, "-m", "tuner", *args], cwd=tmp_path, env=_env(), capture_output=True,
                           text=True, timeout=120)
    forked = forked_cli.run(args, cwd=tmp_path, env=_env(), timeout=120)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert fresh.returncode == (0 if args[-1] in ("--help", "list") else 2), fresh.stderr
    if "localmodel:nosuch" in args:
        assert "nosuch" in fresh.stderr and "localmodel" in fresh.stderr


def test_each_command_gets_its_callers_environment_and_is_ended_past_its_timeout(tmp_path: Path,
                                                                                 seed_graph) -> None:
    """The same search with a test fault that makes its trial workers hang, between two without: the fault
    reaches the command only through the environment the caller gave it, and is gone for the next."""
    def search(study: str, fault: str, timeout: float) -> subprocess.CompletedProcess:
        seed_graph(tmp_path / "studies", study)
        return forked_cli.run(["search", "--model", TINY_MODEL, "--backend", "emulated", "--budget", "1GiB",
                               "--study", study, "--trials", "1", "--screen-trials", "2", "--no-report", "-q"],
                              cwd=tmp_path, env=_env(LMS_TUNER_FAULT=fault), timeout=timeout)

    def synthetic(study: str) -> bool:  # the "ok" fault's measurement: throughput 100 + batch, never a real one
        doc = json.loads((tmp_path / "studies" / study / "recommended.json").read_text())
        return doc["throughput"] == pytest.approx(100.0 + doc["batch_size"])

    assert search("first", "ok@*", 120).returncode == 0 and synthetic("first")
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        search("hangs", "hang@*", 8)
    assert time.monotonic() - start < 30
    done = search("third", "ok@*", 120)
    assert done.returncode == 0 and synthetic("third"), done.stderr


_PROBE = """import os, sys
try:
    import tests.figures
    tests_importable = True
except ImportError:
    tests_importable = False
print(__name__, sys.argv[1:], sys.path[0], os.getcwd(), os.environ.get("PROBE_VALUE"), tests_importable)
raise SystemExit(int(sys.argv[-1]))
"""


@pytest.mark.parametrize("as_module", [False, True])
def test_a_forked_script_or_module_sees_what_one_started_from_nothing_sees(tmp_path: Path, as_module: bool) -> None:
    """`run_python`: arguments, ``sys.path[0]`` (the script's folder; the working directory for -m), working
    directory, environment, exit code, and the server's own package not importable unless on the path."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "probe.py").write_text(_PROBE)
    (tmp_path / "work").mkdir()
    argv = ["-m", "pkg.probe"] if as_module else [str(tmp_path / "pkg" / "probe.py")]
    cwd = tmp_path if as_module else tmp_path / "work"
    for value, code in (("a", "0"), ("b", "3")):
        env = dict(os.environ, PROBE_VALUE=value)
        env.pop("PYTHONPATH", None)
        fresh = subprocess.run([sys.executable, *argv, "x y", code], cwd=cwd, env=env, capture_output=True,
                               text=True, timeout=60)
        forked = forked_cli.run_python([*argv, "x y", code], cwd=cwd, env=env, timeout=60, preload=("json",))
        assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
        assert fresh.returncode == int(code) and f"'x y', '{code}'] " in fresh.stdout and value in fresh.stdout
