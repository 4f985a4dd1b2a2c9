"""`benchmarks/paper.py`'s table building on synthetic graphs (no TensorFlow): ratios, rows, labels.

Sizes: `tests.synthetic` gives every activation ``MiB`` bytes per sample; with
the GPU profiles' temporaries (none on graphs without variables) the peak of
``chain(n)`` without swapping is ``(n + 1) MiB x batch + 256`` bytes (the loss).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import paper
from lms import LMSConfig
from lms.machine.devices import get_device
from tests.synthetic import MiB, chain, long_skip

ROOT = Path(__file__).resolve().parents[1]
LOSS = 256
SPEC = paper.RowSpec(key="chain8", title="synthetic chain", workload="synthetic", options={}, paper=None,
                     why="test")
SMALL_GRID = (LMSConfig(), LMSConfig(lb=2), LMSConfig(lb=2, fuse_swapins=True),
              LMSConfig(lb=1, ctrld_strategy="direct_order"))


# A link so fast that a swapped tensor leaves the device as soon as its last forward reader ran (on the
# real profiles the tiny synthetic ops outrun the copies and swapping frees nothing).
FAST = get_device("P100-16GB").replace(name="fast-link", link_bandwidth=1e18, transfer_latency_s=0.0)


@pytest.fixture(scope="module")
def chain_row() -> paper.RowResult:
    return paper.evaluate_row(chain(8), SPEC, devices=(FAST, "A100-40GB"), budget_bytes=100 * MiB,
                              configs=SMALL_GRID, bfc_device="fast-link")


# ---- the arithmetic ------------------------------------------------------------------------
@pytest.mark.parametrize("lms, base, expected, text", [
    (832, 176, 832 / 176, "4.7x"), (645, 198, 645 / 198, "3.3x"), (4, 2, 2.0, "2.0x"), (3, 0, None, "n/a"),
])
def test_ratio_and_its_text(lms, base, expected, text):
    assert paper.ratio(lms, base) == expected
    assert paper.fmt_ratio(paper.ratio(lms, base)) == text


@pytest.mark.parametrize("lms, base, expected, text", [
    (102.0, 144.0, 1 - 102 / 144, "29%"), (105.0, 100.0, -0.05, "-5%"), (1.0, 0.0, None, "n/a"),
])
def test_throughput_cost_and_its_text(lms, base, expected, text):
    cost = paper.throughput_cost(lms, base)
    if expected is None:
        assert cost is None
    else:
        assert cost == pytest.approx(expected)
    assert paper.fmt_pct(cost) == text


def outcome(batch, throughput=0.0, peak=0, **config):
    cfg = LMSConfig(**config).to_dict()
    return paper.ConfigOutcome(cfg, batch, peak, throughput, 0.0, 0, "op")


def test_pick_tuned_prefers_batch_then_throughput_then_the_smallest_need():
    a, b, c = outcome(10, 5.0, lb=1), outcome(12, 1.0, lb=2), outcome(12, 2.0, lb=3)
    assert paper.pick_tuned([a, b, c]) is c
    none_fit = [outcome(0, peak=20 * MiB, lb=1), outcome(0, peak=12 * MiB, lb=2), outcome(0, peak=15 * MiB, lb=3)]
    assert paper.pick_tuned(none_fit).peak_bytes == 12 * MiB


def test_config_grid_sizes_and_values():
    grid = paper.config_grid(40)  # n_tensors -1, 20, 10
    assert len(grid) == len(set(grid)) == 3 * 4 * 2 + 3 * 2 + 3 * 2 * 3 + 3 * 3 + 1 + 3 * 2
    assert {c.n_tensors for c in grid} == {-1, 20, 10}
    assert sum(c.schedule == "memory" for c in grid) == 3 * 3 + 1 + 3 * 2
    assert {c.sync_mode for c in grid if c.schedule == "memory"} == {0, 1}
    # prefetch="headroom" at lb 1 and 3, every n_tensors, asynchronous swap-ins
    assert {(c.n_tensors, c.lb) for c in grid if c.prefetch == "headroom"} == {(n, lb) for n in (-1, 20, 10)
                                                                              for lb in (1, 3)}
    assert all(c.sync_mode == 0 for c in grid if c.prefetch == "headroom")
    assert {c.branch_threshold for c in grid if c.swap_branches} == {10, 20, 40}
    assert {c.ctrld_strategy for c in grid} == {"chain_rule", "direct_order"}
    # values at or above the candidate count are dropped: they would plan like -1
    assert {c.n_tensors for c in paper.config_grid(80, n_tensors=(-1, 100, 50))} == {-1, 50}


# ---- one row on a synthetic graph --------------------------------------------------------------
def test_row_no_lms_batch_is_the_known_answer(chain_row):
    # (8 + 1) MiB per sample + the loss: floor((100 MiB - 256) / 9 MiB) = 11
    for dev in chain_row.devices:
        assert dev.no_lms.batch == 11
        assert dev.no_lms.peak_bytes == 9 * MiB * 11 + LOSS
        assert dev.no_lms.config["n_tensors"] == 0


def test_row_ratio_cost_and_tuned_config_follow_from_the_grid(chain_row):
    assert chain_row.n_candidates == 7 and len(chain_row.grid) == len(SMALL_GRID)
    for dev in chain_row.devices:
        grid = chain_row.outcomes[dev.device]
        assert len(grid) == len(SMALL_GRID)
        assert dev.lms.batch == max(o.batch for o in grid)
        assert dev.ratio == dev.lms.batch / 11
        assert dev.throughput_cost == pytest.approx(1 - dev.lms.throughput / dev.no_lms.throughput)
        assert dev.swap_overhead == pytest.approx(1 - dev.lms.throughput / dev.no_lms_throughput_at_lms_batch)
        assert dev.lms_infinite_link_batch >= dev.lms.batch
        assert dev.without_branches_infinite_link_batch >= dev.lms_without_branches.batch
        assert dev.label == "PREDICTED"
    fast = chain_row.device("fast-link")
    assert fast.lms.batch > 11  # swapping 7 of the 9 activations pays on an ideal link
    assert 1 <= fast.bfc["no_lms"]["batch"] <= 11 and 1 <= fast.bfc["lms"]["batch"] <= fast.lms.batch
    assert chain_row.device("A100-40GB").bfc is None


def test_row_where_only_lms_fits_batch_1():
    row = paper.evaluate_row(chain(8), SPEC, devices=(FAST,), budget_bytes=5 * MiB, configs=SMALL_GRID,
                             bfc_device=None)
    dev = row.devices[0]
    assert dev.no_lms.batch == 0 and dev.no_lms.peak_bytes == 9 * MiB + LOSS
    assert dev.lms.batch >= 1 and dev.ratio is None and dev.throughput_cost is None
    assert paper.fmt_batch(dev.no_lms) == "0 (needs 9.0 MiB)"
    cells = paper.throughput_row(row, dev)
    assert cells[2] == "does not fit" and cells[4] == "n/a"


# ---- formatting -------------------------------------------------------------------------------
def hand_row() -> paper.RowResult:
    cfg = LMSConfig(lb=5, fuse_swapins=True, swap_branches=True, branch_threshold=10).to_dict()
    dev = paper.DeviceOutcome(
        device="P100-16GB", link="NVLink 1.0",
        no_lms=paper.ConfigOutcome(LMSConfig(n_tensors=0).to_dict(), 198, 15 << 30, 144.0, 1.375, 0, "a"),
        lms=paper.ConfigOutcome(cfg, 645, 16 << 30, 102.0, 6.3, 213, "b", 50 << 30),
        lms_without_branches=paper.ConfigOutcome(LMSConfig(n_tensors=100, lb=5).to_dict(), 641, 1, 115.0, 5.6,
                                                 100, "c"),
        ratio=paper.ratio(645, 198), throughput_cost=paper.throughput_cost(102.0, 144.0),
        no_lms_throughput_at_lms_batch=146.0, swap_overhead=paper.throughput_cost(102.0, 146.0),
        lms_infinite_link_batch=650, without_branches_infinite_link_batch=644,
        bfc={"no_lms": {"batch": 190}, "lms": {"batch": 637}})
    spec = paper.ROWS[0]
    return paper.RowResult(key=spec.key, title=spec.title, workload={"name": "resnet50", "options": {}},
                           why=spec.why, paper=spec.paper, n_ops=9199, n_candidates=213,
                           grid=(cfg, LMSConfig(n_tensors=100, lb=5).to_dict()), devices=(dev,),
                           outcomes={"P100-16GB": (dev.lms, dev.lms_without_branches)})


def test_batch_and_throughput_rows_are_formatted_exactly():
    row = hand_row()
    dev = row.devices[0]
    assert paper.batch_row(row, dev) == ["resnet50", "176 -> 832 (4.7x)", "P100-16GB", "198", "645", "50.0 GiB", "3.3x",
                                         "190 -> 637", "n_tensors=-1, lb=5, fuse, branches@10"]
    assert paper.throughput_row(row, dev) == ["resnet50", "P100-16GB", "144 @ 198", "102 @ 645", "29%", "30%", "-"]
    assert paper.limits_row(row, "P100-16GB") == ["resnet50", "641 (115/s)", "645 (102/s)", "644 / 650", "`b`"]


@pytest.mark.parametrize("config, text", [
    (LMSConfig(n_tensors=0).to_dict(), "LMS off"),
    (LMSConfig(n_tensors=0, recompute="cheap").to_dict(), "no swaps, recompute=cheap"),
    (LMSConfig(n_tensors=0, schedule="memory").to_dict(), "no swaps, schedule=memory"),
    (LMSConfig(n_tensors=100, lb=5).to_dict(), "n_tensors=100, lb=5"),
    (LMSConfig(lb=5, ctrld_strategy="direct_order").to_dict(), "n_tensors=-1, lb=5, direct_order"),
    (LMSConfig(lb=3, fuse_swapins=True, swap_branches=True, branch_threshold=20).to_dict(),
     "n_tensors=-1, lb=3, fuse, branches@20"),
])
def test_config_text(config, text):
    assert paper.fmt_config(config) == text


def _header_cells(markdown: str) -> list[list[str]]:
    lines = markdown.splitlines()
    return [[c.strip() for c in line.strip("|").split("|")] for line, nxt in zip(lines, lines[1:])
            if line.startswith("|") and re.fullmatch(r"\|[-:|]+\|", nxt)]


def test_every_heading_table_header_and_record_says_predicted(chain_row):
    skip = paper.evaluate_row(long_skip(30), SPEC, devices=(FAST, "A100-40GB"), budget_bytes=200 * MiB,
                              configs=[c for c in paper.config_grid(31, n_tensors=(-1,)) if c.lb == 1],
                              bfc_device=None)
    rows = [chain_row, hand_row(), skip]
    doc = paper.build_doc(budget_bytes=100 * MiB, devices=("fast-link", "A100-40GB"), bfc_device="fast-link")
    text = paper.markdown(doc, rows)
    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert len(headings) >= 6 and all("PREDICTED" in h for h in headings)
    headers = _header_cells(text)
    assert len(headers) >= 3 + len(rows)
    labels = {"workload", "device profile", "config", "swap_branches"}
    for header in headers:
        for cell in header:
            assert cell in labels or cell.startswith("paper") or "PREDICTED" in cell, cell
    data = paper.to_json(doc, rows)
    assert data["label"].startswith("PREDICTED")
    for row in data["rows"]:
        assert row["label"] == "PREDICTED"
        assert all(dev["label"] == "PREDICTED" for dev in row["devices"])
    json.dumps(data)  # JSON-ready


def test_the_table_code_imports_and_runs_without_tensorflow():
    code = ("import sys; sys.modules['tensorflow'] = None\n"
            "from benchmarks import paper\nfrom tests.synthetic import chain, MiB\n"
            "r = paper.evaluate_row(chain(4), paper.ROWS[0], devices=('V100-16GB',), budget_bytes=50 * MiB,\n"
            "                       configs=(paper.LMSConfig(),), bfc_device=None)\n"
            "print(r.devices[0].no_lms.batch)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str((50 * MiB - LOSS) // (5 * MiB))
