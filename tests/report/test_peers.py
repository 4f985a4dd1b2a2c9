"""``report --peers``: the peers measured on a study's workload and budget, on its plots and in its page."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.report.peers import PeersMismatch, load_peers, match_model

from .studies import BUDGET, KNOWN, KNOWN_RECORDS, MiB, make_study

REPO = Path(__file__).resolve().parents[2]


def peers_doc(*, workload: str = "mlp", options: dict | None = None, budget: int = BUDGET,
              margin: float = 0.05) -> dict:
    """A benchmarks/peers.py document (the members the report reads), measured for the known study."""
    def measured(batch: int, thr: float, peak_mib: float, closed: bool = True) -> dict:
        return {"status": "measured", "largest": {"batch": batch, "throughput": thr,
                                                  "peak_bytes": int(peak_mib * MiB), "closed": closed}}

    return {"schema": "benchmarks.peers", "schema_version": 1, "created": "2026-12-06T01:02:03Z",
            "command": "python benchmarks/peers.py", "labels": {"measured": "MEASURED (emulated device)"},
            "methods": {"plain": {"label": "plain tf.function"},
                        "remat_activations": {"label": "RematScope(activations)"},
                        "remat_full": {"label": "RematScope(full)"},
                        "recompute_grad_stage": {"label": "tf.recompute_grad per stage"},
                        "lms_config": {"label": "LMS, given config"}},
            "measured": {"m": {"workload": workload, "options": options or {}, "title": "an MLP",
                               "budget_bytes": budget, "safety_margin": margin, "label": "MEASURED (emulated)",
                               "methods": {"plain": measured(8, 95.0, 500),
                                           "remat_activations": measured(6, 99.0, 480),
                                           "remat_full": {"status": "unsupported",
                                                          "reason": "does not run under tf.function"},
                                           "recompute_grad_stage": measured(12, 60.0, 900, closed=False),
                                           "lms_config": measured(40, 80.0, 950)}}}}


def test_the_peers_of_the_studys_workload_are_read_without_lms_and_with_why_one_did_not_run(tmp_path):
    path = tmp_path / "peers.json"
    path.write_text(json.dumps(peers_doc()))
    peers = load_peers(path, workload="mlp", options={}, budget_bytes=BUDGET, safety_margin=0.05)
    assert [(p.key, p.batch_size, p.throughput, p.peak_bytes // MiB, p.closed) for p in peers.points] == [
        ("plain", 8, 95.0, 500, True), ("remat_activations", 6, 99.0, 480, True),
        ("recompute_grad_stage", 12, 60.0, 900, False)]
    assert peers.not_run == (("RematScope(full)", "does not run under tf.function"),)
    assert peers.label == "MEASURED (emulated)" and peers.title == "an MLP"


@pytest.mark.parametrize("change, says", [
    (dict(workload="resnet50"), "measured for another study: resnet50 (no options) at budget 1024 MiB"),
    (dict(budget=512 * MiB), "at budget 512 MiB, margin 0.05; this study: mlp (no options) at budget 1024 MiB"),
    (dict(margin=0.1), "margin 0.1; this study"),
    (dict(options={"image_size": 64}), "mlp (image_size=64)"),
])
def test_peers_measured_for_another_workload_budget_or_margin_are_refused_saying_what_differs(change, says):
    with pytest.raises(PeersMismatch, match="^measured for another study: ") as info:
        match_model(peers_doc(**change), workload="mlp", options={}, budget_bytes=BUDGET, safety_margin=0.05)
    assert says in str(info.value)


def test_extra_options_of_the_study_are_the_workloads_defaults_and_do_not_refuse():
    doc = peers_doc(options={"image_size": 64})
    model = match_model(doc, workload="mlp", options={"image_size": 64, "num_classes": 1000},
                        budget_bytes=BUDGET, safety_margin=0.05)
    assert model["title"] == "an MLP"


@pytest.mark.parametrize("text, says", [
    ("{", "not JSON"), ('{"schema": "lms.config"}', "not a benchmarks.peers document"),
    ('{"schema": "benchmarks.peers", "measured": {}}', "no measured model in it"),
])
def test_a_file_that_is_no_peers_document_is_refused(tmp_path, text, says):
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(PeersMismatch, match=says):
        load_peers(path, workload="mlp", options={}, budget_bytes=BUDGET, safety_margin=0.05)
    with pytest.raises(PeersMismatch, match="cannot read it"):
        load_peers(tmp_path / "missing.json", workload="mlp", options={}, budget_bytes=BUDGET, safety_margin=0.05)


def _report(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "tuner", "report", "--study", "known", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


def test_report_with_peers_draws_them_and_lists_them_against_the_recommendation(tmp_path):
    make_study(tmp_path, "known", KNOWN_RECORDS, recommended=KNOWN["recommended"])
    (tmp_path / "peers.json").write_text(json.dumps(peers_doc()))
    done = _report(tmp_path, "--peers", "peers.json")
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "reports" / "known" / "index.html").read_text()
    section = page[page.index('<div id="peers">'):]
    section = section[:section.index("</div>")]
    # recommended: trial #2 at batch 24; ratios to each peer's largest batch, the largest first
    for label, batch, ratio in (("tf.recompute_grad per stage", "12 ?", "2.00x"), ("plain tf.function", "8", "3.00x"),
                                ("RematScope(activations)", "6", "4.00x")):
        row = section[section.index(label):]
        row = row[:row.index("</tr>")]
        assert f">{batch}<" in row and ratio in row, row
    assert "did not run: does not run under tf.function" in section and "LMS, given config" not in section
    assert "MEASURED (emulated), by python benchmarks/peers.py (2026-12-06T01:02:03Z" in section
    without = tmp_path / "plain"
    make_study(without, "known", KNOWN_RECORDS, recommended=KNOWN["recommended"])
    assert _report(without).returncode == 0
    plain_page = (without / "reports" / "known" / "index.html").read_text()
    assert 'id="peers"' not in plain_page
    # the diamonds change both plots
    for stem in ("pareto_batch", "pareto_memory"):
        assert (tmp_path / "reports" / "known" / f"{stem}.svg").read_bytes() != \
            (without / "reports" / "known" / f"{stem}.svg").read_bytes()
    svg = (tmp_path / "reports" / "known" / "pareto_batch.svg").read_text()
    assert "peers, largest batch (MEASURED)" in svg and "RematScope(activations)" in svg  # legend, a label


def test_report_with_peers_of_another_study_exits_2_in_one_line_and_writes_nothing(tmp_path):
    make_study(tmp_path, "known", KNOWN_RECORDS, recommended=KNOWN["recommended"])
    (tmp_path / "peers.json").write_text(json.dumps(peers_doc(budget=512 * MiB)))
    done = _report(tmp_path, "--peers", "peers.json")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lms-tuner: --peers peers.json: measured for another study: ")
    assert not (tmp_path / "reports").exists()
