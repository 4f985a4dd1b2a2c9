"""Reports built once per test session and shared by the report tests (rendering costs seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest

from tests.synthetic import chain

from .studies import KNOWN, KNOWN_RECORDS, make_study, record

optuna.logging.set_verbosity(optuna.logging.WARNING)

REPO = Path(__file__).resolve().parents[2]
EVIL_NAME = 'evil <script>alert(1)</script> & "q"'
EVIL_MODEL = "<img src=x onerror=alert(2)>"
EVIL_REASON = "</td><script>alert(3)</script>"
EVIL_SCOPE = "<b>bold</b>"


@dataclass(frozen=True)
class Built:
    index: Path
    studies: Path
    storage: str


@pytest.fixture(scope="session")
def known_report(tmp_path_factory) -> Built:
    """The known study (default SQLite storage), its recommendation and a traced graph for the timeline,
    reported the way a user does it: ``python -m tuner report`` in a subprocess, from the study's folder."""
    root = tmp_path_factory.mktemp("known-report")
    url, studies = make_study(root, "known", KNOWN_RECORDS, recommended=KNOWN["recommended"])
    doc = {"schema": "tuner.graph", "schema_version": 1, "graph": chain(6).to_dict()}
    (studies / "known" / "graph.json").write_text(json.dumps(doc))
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-m", "tuner", "report", "--study", "known"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "report: reports/known/index.html"
    return Built(index=root / "reports" / "known" / "index.html", studies=Path("studies"), storage=url)


@pytest.fixture(scope="session")
def evil_report(tmp_path_factory) -> Built:
    """A study whose name, model, failure reason and config carry HTML; no recommendation."""
    from tuner.report import build_report, report_folder_name

    root = tmp_path_factory.mktemp("evil-report")
    storage = f"sqlite:///{root / 'shared.db'}"
    ok = record(n_tensors=4, batch=8, throughput=12.5, peak=1 << 28)
    ok["config"]["excl_scopes"] = [EVIL_SCOPE]
    failed = record(n_tensors=0, batch=0, throughput=0.0, peak=None, status="error", reason=EVIL_REASON)
    make_study(root, EVIL_NAME, [ok, failed], storage=storage, folder=report_folder_name(EVIL_NAME),
               study_attrs={"tuner": {"model": EVIL_MODEL, "command_line": ["tuner", "search", "--study", EVIL_NAME]}})
    # the simulated screening study a measured search runs first, in the same storage
    screen = [record(n_tensors=n, batch=b, throughput=t, peak=1 << 28) for n, b, t in ((2, 6, 10.0), (6, 9, 8.0))]
    screen.append(record(n_tensors=9, batch=0, throughput=0.0, peak=None, status="infeasible"))
    make_study(root, EVIL_NAME + ".simulated", screen, storage=storage, folder=report_folder_name(EVIL_NAME),
               study_attrs={"role": "screen", "screen_of": EVIL_NAME,
                            "tuner": {"role": "screen", "screen_of": EVIL_NAME}})  # as tuner.study.study marks it
    # a figure from an earlier run that this report does not draw must go
    stale = root / "reports" / report_folder_name(EVIL_NAME) / "timeline.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    index = build_report(EVIL_NAME, storage=storage, studies_dir=root / "studies", reports_dir=root / "reports")
    return Built(index=index, studies=root / "studies", storage=storage)
