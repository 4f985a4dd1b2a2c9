"""The report names the order the recommended config runs in (issue 14): data, timeline and page."""

from __future__ import annotations

import html
import json
import re

import pytest

from lms import LMSConfig, plan_swaps
from lms.schedule import CANDIDATES, schedule_ops
from lms.simulator import simulate
from tests.synthetic import residual
from tuner.report.schedule import schedule_summary
from tuner.report.timeline import simulated_timeline

from .studies import make_study, record

PINNED = LMSConfig(n_tensors=-1, schedule="memory")


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", fragment)))


def test_summary_is_the_schedule_the_pass_computes():
    graph = residual(3)
    summary = schedule_summary(graph, PINNED)
    sched = schedule_ops(graph, plan_swaps(graph, PINNED))
    assert summary.pinned and summary.kind == "memory"
    assert summary.chosen == sched.chosen == "list_lifo_sunk"
    assert (summary.n_ordered, summary.n_pins) == (len(sched.order), len(sched.pins)) and summary.n_pins > 0
    assert summary.scoring_batch == sched.batch
    assert {c.name: c.peak_bytes for c in summary.candidates} == dict(sched.candidates)
    assert {c.name for c in summary.candidates} == set(CANDIDATES)  # every candidate has a description
    peaks = [c.peak_bytes for c in summary.candidates]
    assert peaks == sorted(peaks)
    assert [c.name for c in summary.candidates if c.chosen] == [sched.chosen]
    assert summary.candidates[0].chosen and peaks[0] < dict(sched.candidates)["tf"]
    assert summary.sentence.startswith("The recommended config pins the order (schedule='memory'): scheduler "
                                       f"'list_lifo_sunk' was chosen of {len(CANDIDATES)} candidates")
    assert f"it orders {len(sched.order)} ops with {len(sched.pins)} control edges" in summary.sentence
    assert summary.prefetch_share == 0.0 and "prefetch" not in summary.sentence


def test_on_the_emulated_device_the_summary_is_of_the_order_that_runs_exactly():
    """On a CPU profile the step is pinned whole: the summary is the exact schedule, scored by each order's peak."""
    graph = residual(3)
    summary = schedule_summary(graph, PINNED, device="cpu")
    sched = schedule_ops(graph, plan_swaps(graph, PINNED), exact=True)
    assert summary.exact and not schedule_summary(graph, PINNED, device="V100-16GB").exact
    assert summary.chosen == sched.chosen and {c.name: c.peak_bytes for c in summary.candidates} == dict(sched.candidates)
    assert summary.candidates[0].chosen
    assert "executed graph is pinned whole" in summary.sentence
    assert f"its {len(sched.order)} ops run in that order" in summary.sentence


def test_summary_says_how_far_swap_ins_were_prefetched():
    graph = residual(4)
    config = LMSConfig(n_tensors=-1, schedule="memory", prefetch="headroom")
    summary = schedule_summary(graph, config)
    share = schedule_ops(graph, plan_swaps(graph, config)).prefetch_share
    assert summary.prefetch_share == share == 1.0
    assert summary.sentence.endswith("Its swap-ins were moved earlier into 100% of the memory the order leaves free "
                                     "below its peak (prefetch='headroom').")


def test_the_timeline_simulates_the_pinned_order():
    """residual(3) at batch 16 on V100: the pinned order peaks at 96 MiB, TF's executor order at 240 MiB."""
    graph = residual(3)
    tl = simulated_timeline(graph, [("recommended", PINNED)], batch=16, device="V100-16GB")
    (series,) = tl.series
    pinned = simulate(graph, PINNED, batch=16, device="V100-16GB")
    unpinned = simulate(graph, PINNED.replace(schedule="tf"), batch=16, device="V100-16GB")
    assert series.peak_bytes == pinned.peak_device_bytes == 96 << 20
    assert unpinned.peak_device_bytes == 240 << 20
    assert series.device_bytes[:-1].tolist() == list(pinned.timeline.device_bytes)
    order = {name: i for i, name in enumerate(pinned.timeline.op_names)}
    pins = schedule_ops(graph, plan_swaps(graph, PINNED)).pins
    assert pins and all(order[a] < order[b] for a, b in pins)


@pytest.mark.parametrize("config, sentence", [
    (LMSConfig(n_tensors=3), "TF's executor decides the order (schedule='tf')."),
    (LMSConfig(n_tensors=0), "TF's executor decides the order (schedule='tf')."),
])
def test_an_unpinned_config_leaves_the_order_to_tf(config, sentence):
    summary = schedule_summary(residual(2), config)
    assert not summary.pinned and summary.kind == "tf" and summary.candidates == ()
    assert summary.sentence == sentence


def test_sync_mode_edges_are_counted_but_pin_no_order():
    graph = residual(2)
    config = LMSConfig(n_tensors=-1, sync_mode=1)
    summary = schedule_summary(graph, config)
    sched = schedule_ops(graph, plan_swaps(graph, config))
    assert not summary.pinned and summary.n_pins == len(sched.pins) > 0
    assert summary.sentence.startswith(f"TF's executor decides the order (schedule='tf'), with {len(sched.pins)} "
                                       "ordering edges added")


@pytest.fixture(scope="module")
def pinned_page(tmp_path_factory) -> str:
    from tuner.report import build_report

    root = tmp_path_factory.mktemp("pinned-report")
    records = [record(n_tensors=0, batch=8, throughput=100.0, peak=1 << 28),
               record(n_tensors=-1, batch=16, throughput=80.0, peak=1 << 29, schedule="memory")]
    _, studies = make_study(root, "pinned", records, recommended=1)
    doc = {"schema": "tuner.graph", "schema_version": 1, "graph": residual(3).to_dict()}
    (studies / "pinned" / "graph.json").write_text(json.dumps(doc))
    return build_report("pinned", studies_dir=studies, reports_dir=root / "reports").read_text(encoding="utf-8")


def test_page_names_the_chosen_scheduler_and_each_candidates_peak(pinned_page):
    graph = residual(3)
    sched = schedule_ops(graph, plan_swaps(graph, PINNED))
    section = pinned_page[pinned_page.index('id="timeline"'):pinned_page.index('id="knobs"')]
    caption = _text(re.search(r"<figcaption>(.*?)</figcaption>", section, re.S).group(1))
    chosen = sched.chosen
    tied = [n for n in CANDIDATES if n != chosen and sched.candidates[n] == sched.candidates[chosen]]
    assert chosen == "list_lifo_sunk" and tied == ["list_lifo", "list_fifo", "creation"]
    assert (f"scheduler '{chosen}' was chosen of {len(CANDIDATES)} candidates (tied with {', '.join(tied)}; kept by "
            f"tie-break order); it orders {len(sched.order)} ops with {len(sched.pins)} control edges") in caption
    block = section[section.index('id="schedule"'):]
    assert f"Op order: scheduler {chosen}, pinned" in _text(block)
    rows = [[_text(c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", re.search(r'<table class="schedule">(.*?)</table>',
                                                                    block, re.S).group(1), re.S)[1:]]
    # (scheduler, exact bytes) per row, lowest peak first: the pass's own scores
    expected = sorted(sched.candidates.items(), key=lambda kv: (kv[1], list(CANDIDATES).index(kv[0])))
    assert [(r[0].replace(" ✓", ""), r[3]) for r in rows] == [(n, f"{p:,}") for n, p in expected]
    assert rows[0][0] == f"{chosen} ✓" and rows[0][4] == "chosen"
    assert "peak (PREDICTED)" in block and f"at batch {sched.batch}" in _text(block)
    # a config that swaps but recomputes nothing says so, and has no recompute section
    assert "Nothing is recomputed (recompute='none')" in _text(section)
    assert 'id="recompute"' not in pinned_page


def test_known_report_says_tf_decides_the_order(known_report):
    page = known_report.index.read_text(encoding="utf-8")
    section = _text(page[page.index('id="timeline"'):page.index('id="knobs"')])
    assert "TF's executor decides the order (schedule='tf')." in section
    assert "Op order" in section and "Nothing is recomputed (recompute='none')" in section
    assert 'id="recompute"' not in page and 'class="schedule"' not in page
