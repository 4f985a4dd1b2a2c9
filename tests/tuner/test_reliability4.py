"""Issue 52, reliability round four: eight defects found by hostile use, each with its regression test.

Each test names its defect by number (see ``issues show 52``). The CLI ones run the real command line
(`run_cli`) on the simulate backend and the tiny cached graph, or on the emulated backend's test-only
synthetic workers (``LMS_TUNER_FAULT``, no TensorFlow); the library ones that need TensorFlow are
marked ``tf`` and run their SavedModel in a fresh process.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from .conftest import TINY_MODEL, run_cli

SIM = ("--backend", "simulate", "--no-report")


def _one_line(proc: subprocess.CompletedProcess, code: int) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("lms-tuner: ") and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def _files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# ================================================================ 1 (high): the finish command masks the password

def test_01_the_command_that_finishes_a_cut_short_confirmation_masks_the_storage_password(
        postgres_url: str, tmp_path: Path, seed_graph) -> None:
    password = postgres_url.split("//", 1)[1].split("@", 1)[0].split(":", 1)[1]
    study = "finish"
    seed_graph(tmp_path / "studies", study)
    common = ["search", "--model", TINY_MODEL, "--backend", "emulated", "--budget", "128MiB", "--study", study,
              "--seed", "0", "--screen-trials", "4", "--trials", "2", "--no-report", "--json", "--storage",
              postgres_url]
    done = run_cli([*common, "--confirm", "1"], cwd=tmp_path, timeout=300, env={"LMS_TUNER_FAULT": "fits120@*"})
    assert done.returncode == 0, done.stderr[-3000:]
    # --confirm 2 asks for one more fresh process each; they hang until the time limit ends the search
    cut = run_cli([*common, "--confirm", "2", "--timeout", "3"], cwd=tmp_path, timeout=300,
                  env={"LMS_TUNER_FAULT": "hang@*"})
    assert cut.returncode == 1, cut.stderr[-3000:]
    last = cut.stderr.strip().splitlines()[-1]
    finish = re.search(r"Finish it with: (.*)$", last).group(1)
    masked = postgres_url.replace(password, "***")
    assert finish.endswith(f"--storage '{masked}' --confirm 2 --timeout 0"), finish
    assert password not in cut.stdout + cut.stderr
