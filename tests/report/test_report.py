"""`build_report` end to end: files, a self-contained page, escaping, and the numbers it shows."""

from __future__ import annotations

import base64
import html
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from tuner.report import build_report, report_folder_name
from tuner.report.html import CSP

from .conftest import EVIL_MODEL, EVIL_NAME, EVIL_REASON, EVIL_SCOPE
from .studies import KNOWN, make_study, record

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = ("pareto_batch", "pareto_memory", "knobs", "timeline")


class _Tags(HTMLParser):
    """Every start tag with its attributes, and the page's visible text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def _parse(page: str) -> _Tags:
    p = _Tags()
    p.feed(page)
    return p


def test_files_beside_the_page(known_report):
    folder = known_report.index.parent
    assert known_report.index.name == "index.html" and folder.name == "known"
    expected = {"index.html", "trials.csv"} | {f"{f}.{ext}" for f in FIGURES for ext in ("png", "svg")}
    assert {p.name for p in folder.iterdir()} == expected  # and no temporary files left behind
    assert {oct(p.stat().st_mode & 0o777) for p in folder.iterdir()} == {"0o644"}  # shareable
    for f in FIGURES:
        assert (folder / f"{f}.png").read_bytes().startswith(PNG_MAGIC)
        assert b"<svg" in (folder / f"{f}.svg").read_bytes()[:2000]


def test_page_is_self_contained(known_report):
    page = known_report.index.read_text(encoding="utf-8")
    tags = _parse(page).tags
    csp = [a["content"] for t, a in tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp == [CSP] and "default-src 'none'" in CSP and "img-src data:" in CSP
    # no scripts, stylesheets, frames or fonts from anywhere; no URL that leaves the file
    assert not [t for t, _ in tags if t in ("script", "link", "iframe", "object", "embed", "base")]
    for tag, attrs in tags:
        for name in ("src", "href", "srcset", "action", "poster"):
            value = (attrs.get(name) or "").strip().lower()
            assert not re.match(r"^(https?:|//|ftp:|ws)", value), (tag, name, value[:80])
    assert not re.search(r"url\(|@import", page)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*https?://""", page, re.I)
    # each figure is embedded once, byte-identical to the PNG written beside the page
    images = [a for t, a in tags if t == "img"]
    assert len(images) == len(FIGURES)
    embedded = [base64.b64decode(a["src"].split(",", 1)[1]) for a in images]
    beside = [(known_report.index.parent / f"{f}.png").read_bytes() for f in FIGURES]
    assert sorted(embedded) == sorted(beside)
    assert all(a["src"].startswith("data:image/png;base64,") and a.get("alt") for a in images)


def test_recommendation_box_shows_the_numbers(known_report):
    page = known_report.index.read_text(encoding="utf-8")
    box = page[page.index('id="recommendation"'):page.index('id="pareto"')]
    text = html.unescape(re.sub(r"<[^>]+>", " ", box))
    assert "trial #2" in text and "predicted (simulator, device profile V100-16GB)" in text
    assert "Chosen as the largest batch on the Pareto front with throughput >= 0.5 x the front's best." in text
    assert "24" in text and "3.00× the no-LMS maximum of 8" in text
    assert "90.0 samples/s" in text and "0.90× no LMS (100.0 samples/s at batch 8)" in text  # as `tuner best` says
    assert "952.32 MiB" in text and "998,579,896 bytes" in text   # int(0.93 GiB)
    assert "71.68 MiB" in text and "7.0% of the 1.00 GiB budget" in text
    rec_path = (known_report.studies / "known" / "recommended.json").as_posix()
    assert "import lms" in text
    assert f'cfg = lms.LMSConfig.load("{rec_path}")' in text
    assert "step = lms.function(train_step, config=cfg)" in text
    assert "n_tensors=10, lb=3" in text


def test_header_and_measurement_paragraph(known_report):
    text = html.unescape(" ".join(_parse(known_report.index.read_text(encoding="utf-8")).text))
    for expected in ("V100-16GB", "1.00 GiB (1,073,741,824 bytes)", "simulate",
                     "python -m tuner search --study known --model mlp --backend simulate", "7 (5 feasible)"):
        assert expected in text
    assert "No trial was measured: all 7 figures are predictions" in text


def test_timeline_section(known_report):
    page = known_report.index.read_text(encoding="utf-8")
    section = page[page.index('id="timeline"'):page.index('id="knobs"')]
    text = html.unescape(re.sub(r"<[^>]+>", " ", section))
    assert "Simulated on the V100-16GB profile" in text and "graph.json" in text
    assert "batch size 24" in text and "<img" in section
    rows = re.findall(r"<tr><td>(no LMS|recommended)</td><td>simulated</td>", section)
    assert rows == ["no LMS", "recommended"]


def test_csv_matches_the_study(known_report):
    csv = pd.read_csv(known_report.index.parent / "trials.csv")
    assert csv["number"].tolist() == list(range(7))
    assert csv.loc[csv["recommended"], "number"].tolist() == [KNOWN["recommended"]]
    assert csv.loc[csv["baseline"], "number"].tolist() == [KNOWN["baseline"]]
    assert csv.loc[csv["pareto_batch_size"], "number"].tolist() == sorted(KNOWN["front_batch"])
    assert csv.loc[csv["pareto_peak_bytes"], "number"].tolist() == KNOWN["front_memory"]
    assert csv.loc[4, "status"] == "oom" and csv.loc[4, "reason"] == "batch 40 does not fit: out of memory"
    assert csv["batch_size"].tolist() == [8, 32, 24, 16, 0, 0, 24]


def test_trial_table_rows(known_report):
    page = known_report.index.read_text(encoding="utf-8")
    section = page[page.index('id="trials"'):]
    rows = re.findall(r'<tr class="([^"]*)"><td>#(\d+)</td>', section)
    assert ("rec", "2") in rows and ("base", "0") in rows
    assert ("failed", "4") in rows and ("failed", "5") in rows
    assert len(re.findall(r"<tr[ >]", section)) == 1 + 7  # header + one row per trial


def test_user_text_is_escaped(evil_report):
    page = evil_report.index.read_text(encoding="utf-8")
    assert "<script" not in page.lower()
    assert "<img src=x" not in page and "<b>bold</b>" not in page
    assert html.escape(EVIL_NAME) in page
    assert html.escape(EVIL_MODEL) in page and html.escape(EVIL_REASON) in page
    assert html.escape(EVIL_SCOPE) in page
    parsed = _parse(page)
    text = "".join(parsed.text)
    assert EVIL_NAME in text and EVIL_REASON in text  # shown as text, literally
    assert [t for t, _ in parsed.tags if t in ("script", "b")] == []
    assert len([t for t, _ in parsed.tags if t == "img"]) == 3  # no timeline, and no injected image


def test_screening_study_is_shown_for_context(evil_report):
    text = html.unescape(re.sub(r"<[^>]+>", " ", evil_report.index.read_text(encoding="utf-8")))
    assert (f"Hollow circles: the 2 feasible trials of the simulated screening study {EVIL_NAME}.simulated "
            "(predicted figures)") in text
    csv = pd.read_csv(evil_report.index.parent / "trials.csv")
    assert len(csv) == 2  # the report's table is the main study's


def test_study_name_that_is_no_folder_name(evil_report):
    folder = evil_report.index.parent
    assert folder.name == report_folder_name(EVIL_NAME)
    assert re.fullmatch(r"evil_script_alert_1_script_q-[0-9a-f]{8}", folder.name)
    assert report_folder_name("resnet50-16g") == "resnet50-16g"
    assert report_folder_name("..") != ".." and "/" not in report_folder_name("a/../b")


def test_without_recommendation(evil_report):
    page = evil_report.index.read_text(encoding="utf-8")
    box = page[page.index('id="recommendation"'):page.index('id="pareto"')]
    text = html.unescape(re.sub(r"<[^>]+>", " ", box))
    assert "No recommendation" in text and "error: 1 trials" in text
    assert "No recommendation, so no timeline to compare." in page
    assert not (evil_report.index.parent / "timeline.png").exists()  # the stale one was removed
    assert not (evil_report.index.parent / "timeline.svg").exists()


def test_missing_study_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no study database"):
        build_report("nothing", studies_dir=tmp_path / "studies", reports_dir=tmp_path / "reports")
    assert not (tmp_path / "studies").exists()  # nothing created
    url, studies = make_study(tmp_path, "present", [record(n_tensors=0, batch=4, throughput=1.0, peak=1 << 20)])
    with pytest.raises(KeyError, match="no study 'absent'.*'present'"):
        build_report("absent", storage=url, studies_dir=studies, reports_dir=tmp_path / "reports")


def test_importing_the_report_package_stays_light():
    code = ("import sys, tuner.report, tuner.report.data, tuner.report.html, tuner.report.timeline, "
            "tuner.report.schedule, tuner.report.recompute; "
            "bad = [m for m in ('matplotlib', 'tensorflow') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"


def _frozen_trials(records):
    """Optuna trials numbered 0.. from `studies.record` attributes (no storage)."""
    import optuna

    from .studies import DISTRIBUTIONS

    trials = []
    for i, attrs in enumerate(records):
        t = optuna.trial.create_trial(values=[attrs["batch_size"], attrs["throughput"]], user_attrs=attrs,
                                      params={"n_tensors": attrs["config"]["n_tensors"]},
                                      distributions={"n_tensors": DISTRIBUTIONS["n_tensors"]})
        t.number = i
        trials.append(t)
    return trials


def test_measured_study_page_without_figures():
    """render_html alone (no plots): a measured study shows the simulator-vs-measurement check."""
    from tuner.report.data import report_data
    from tuner.report.html import render_html

    records = [record(n_tensors=0, batch=30, throughput=90.0, peak=900 << 20, backend="gpu", measured=True,
                      predicted_batch=40, predicted_throughput=100.0),
               record(n_tensors=4, batch=60, throughput=70.0, peak=950 << 20, backend="gpu", measured=True,
                      predicted_batch=48, predicted_throughput=70.0)]
    trials = _frozen_trials(records)
    data = report_data("gpu-study", trials, study_attrs={"tuner": {"backend": "gpu"}}, recommendation=None,
                       recommendation_path="studies/gpu-study/recommended.json", generated="now")
    page = render_html(data, {})
    text = html.unescape(re.sub(r"<[^>]+>", " ", page))
    assert "All 2 trials were measured." in text
    assert ("Simulator vs measurement, 2 measured trials: measured max batch = 1.00× the predicted one "
            "(median; range 0.75×–1.25×); measured throughput = 0.95× the predicted (median).") in text
    assert "<img" not in page and "Generated now." in text


def test_front_table_marks_each_front(known_report):
    page = known_report.index.read_text(encoding="utf-8")
    table = re.search(r'<table class="front">(.*?)</table>', page, re.S).group(1)
    rows = [[html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)[1:]]
    # (trial, batch, samples/s, batch front, memory front), sorted by batch, throughput, peak
    assert [(r[0], r[1], r[2], r[5], r[6]) for r in rows] == [
        ("#0", "8", "100.0", "✓", "✓"), ("#6", "24", "90.0", "✓", ""), ("#2", "24", "90.0", "✓", ""),
        ("#1", "32", "70.0", "✓", "")]
    assert rows[2][7] == "n_tensors=10, lb=3" and rows[0][7] == "n_tensors=0 (LMS off)"


@pytest.mark.parametrize("n_tensors, labels", [(0, ["recommended (no LMS)"]), (3, ["no LMS", "recommended"])])
def test_timeline_series_follow_the_recommendation(tmp_path, n_tensors, labels):
    """No LMS recommended: one curve, not two identical ones. Otherwise: no LMS vs recommended."""
    import json

    from tests.synthetic import chain
    from tuner.report import _timeline
    from tuner.report.data import Recommendation, report_data

    from .studies import recommendation_doc

    graph = tmp_path / "graph.json"
    graph.write_text(json.dumps({"schema": "tuner.graph", "graph": chain(6).to_dict()}))
    rec = Recommendation.from_document(
        recommendation_doc([record(n_tensors=n_tensors, batch=4, throughput=1.0, peak=1 << 20)], 0))
    data = report_data("t", [], study_attrs={}, recommendation=rec, recommendation_path="r.json", generated="now")
    timeline, note = _timeline(data, study_dir=tmp_path, study_attrs={"tuner": {"device": "V100-16GB"}})
    assert [s.label for s in timeline.series] == labels
    assert note.startswith("Simulated on the V100-16GB profile with lms.simulator from the traced graph (graph.json)")
    assert ("swaps nothing (LMS off)" in note) == (n_tensors == 0)


def test_the_card_warns_when_the_check_corrected_the_plan():
    """recommended.json's ``plan_corrections`` (`tuner.outputs`) is a warning on the card, as in `tuner best`."""
    from tuner.report.card import recommendation_section
    from tuner.report.data import report_data
    from tuner.report.provenance import Recommendation

    from .studies import recommendation_doc

    records = [record(n_tensors=0, batch=30, throughput=90.0, peak=900 << 20),
               record(n_tensors=4, batch=60, throughput=70.0, peak=950 << 20)]
    trials = _frozen_trials(records)
    doc = recommendation_doc(records, 1)

    def card(doc):
        data = report_data("s", trials, study_attrs={}, recommendation=Recommendation.from_document(doc),
                           recommendation_path="studies/s/recommended.json", generated="now")
        return html.unescape(re.sub(r"<[^>]+>", " ", recommendation_section(data)))

    assert "Plan corrected" not in card(doc)
    doc["plan_corrections"] = {"warning": "the equivalence check dropped this config's whole plan, 1 correction",
                               "n_corrections": 1}
    assert "Plan corrected: the equivalence check dropped this config's whole plan, 1 correction." in card(doc)
