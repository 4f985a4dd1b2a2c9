"""The headline figures in README.md and docs/ are the ones in benchmarks/results/*.json.

A figure is quoted in prose and tables; the benchmark that makes it writes JSON. Each check here renders the
quoted text from that JSON and looks for it in the doc (whitespace folded, so a sentence may wrap anywhere):
re-running a benchmark without updating the doc, or editing a figure by hand, fails here. No TensorFlow.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _doc(name: str) -> str:
    return re.sub(r"\s+", " ", (ROOT / name).read_text(encoding="utf-8"))


def _json(name: str) -> dict:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def _in(doc: str, text: str) -> None:
    text = re.sub(r"\s+", " ", text)
    assert text in _doc(doc), f"{doc} does not say {text!r} (what benchmarks/results holds)"


def _join(values: list) -> str:
    """'a, b and c' as the docs write three runs."""
    return ", ".join(values[:-1]) + " and " + values[-1]


# ---- the default search (benchmarks/default_search_repeat.py) ---------------------------------------------------

def test_the_default_search_figures_are_the_last_repeat_runs():
    d = _json("default_search_repeat.json")
    runs = d["runs"]
    walls = [f"{r['wall_s']:.0f}" for r in runs]
    median = f"{d['median_wall_s']:.0f}"
    assert median == f"{statistics.median(r['wall_s'] for r in runs):.0f}"
    batches = {r["batch"] for r in runs}
    assert len(batches) == 1, "the docs say one batch every run"
    batch = batches.pop()
    ratios = ", ".join(f"{r['batch_ratio']:.2f}" for r in runs)
    baselines = ", ".join(str(r["baseline_batch"]) for r in runs)
    _in("README.md", f"It took **{_join(walls)} s (median {median} s)**")
    _in("README.md", f"wall {', '.join(walls)} s, **median {median} s**")
    _in("README.md", f"batch **{batch}** every run")
    _in("README.md", f"batch {batch} vs {baselines} (**{ratios}x**)")
    _in("docs/results.md", f"wall **{', '.join(walls)} s, median {median} s**; batch **{batch}** every run")
    _in("docs/default_search.md", f"**{_join(walls)} s, median {median} s**")


def test_the_readmes_annotated_summary_is_the_runs_own_output():
    """The README quotes one run's summary lines (`run3_stdout.txt`) and its recommended.json."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quoted = re.search(r"default_search_resnet50_emulated/(run\d)_stdout\.txt", readme).group(1)
    stdout = (RESULTS / "default_search_resnet50_emulated" / f"{quoted}_stdout.txt").read_text(encoding="utf-8")
    summary = stdout.split("--- log", 1)[0]
    for key in ("  tuned for ", "  batch size ", "  throughput ", "  peak memory ", "  processes ", "  simulator ",
                "  no-LMS baseline: ", "wrote studies/"):
        line = next(ln for ln in summary.splitlines() if ln.startswith(key))
        assert line in readme, f"README.md's summary differs from {quoted}_stdout.txt at {line!r}"
    rec = json.loads((RESULTS / "default_search_resnet50_emulated" / f"{quoted}_recommended.json").read_text())
    _in("README.md", f'"batch_size": {rec["batch_size"]}, "throughput": {rec["throughput"]:.2f}, '
                     f'"peak_device_bytes": {rec["peak_device_bytes"]}')
    _in("README.md", f'"baseline": {{"batch_size": {rec["baseline"]["batch_size"]}, '
                     f'"throughput": {rec["baseline"]["throughput"]:.2f}')


# ---- the peers (benchmarks/peers.py) ------------------------------------------------------------------------------

#: docs/results.md's row label of each method in the largest-batch table
PEER_ROWS = {
    "plain": "plain `tf.function`",
    "remat_activations": 'Keras `RematScope("activations")`',
    "remat_list_of_layers": '`RematScope("list_of_layers")` (layers whose call takes no keywords)',
    "recompute_grad_stage": "`tf.recompute_grad` per stage (per block for the GPT)",
}


def _largest(model: dict, key: str) -> tuple[int, float]:
    big = model["methods"][key]["largest"]
    return big["batch"], big["throughput"]


@pytest.mark.parametrize("key", list(PEER_ROWS))
def test_each_peers_row_of_the_largest_batch_table_is_peers_json(key):
    d = _json("peers.json")
    r50, gpt = d["measured"]["resnet50"], d["measured"]["gpt2"]
    batch, thr = _largest(r50, key)
    plain = _largest(r50, "plain")[0]
    at = r50["common"]["throughput"][key]
    g_batch, g_plain = _largest(gpt, key)[0], _largest(gpt, "plain")[0]
    g_at = gpt["common"]["throughput"][key]
    _in("docs/results.md", f"| {PEER_ROWS[key]} | {batch} ({batch / plain:.2f}), {thr:.1f} | "
                           f"{at['fastest']:.1f} / {at['median']:.1f} | {g_batch} ({g_batch / g_plain:.2f}) | "
                           f"{g_at['fastest']:.1f} / {g_at['median']:.1f} |")


def test_lms_rows_of_the_largest_batch_table_and_the_readme_row_are_peers_json():
    d = _json("peers.json")
    r50 = d["measured"]["resnet50"]
    plain = _largest(r50, "plain")[0]
    batch, thr = _largest(r50, "lms_config")
    auto = _largest(r50, "lms_auto")[0]
    _in("docs/results.md", f"| **{batch} ({batch / plain:.2f})**, {thr:.1f} |")
    _in("README.md", f"plain {plain}; Keras `RematScope` {_largest(r50, 'remat_list_of_layers')[0]}-"
                     f"{_largest(r50, 'remat_activations')[0]}; `tf.recompute_grad` per stage "
                     f"{_largest(r50, 'recompute_grad_stage')[0]}; Grappler recompute "
                     f"{_largest(r50, 'grappler_recompute')[0]}; **LMS {batch}** (auto {auto})")


#: docs/results.md's row label of each method in the common-batch table
COMMON_ROWS = {
    "plain": "plain `tf.function`",
    "remat_activations": '`RematScope("activations")`',
    "remat_list_of_layers": '`RematScope("list_of_layers")`',
    "recompute_grad_stage": "`tf.recompute_grad` per stage / block",
    "grappler_recompute": "Grappler's recompute",
    "lms_config": "LMS, the config tuned for the largest batch",
    "lms_auto": 'LMS, `config="auto"`',
}


@pytest.mark.parametrize("key", [*COMMON_ROWS, "lms_tuned"])
def test_each_row_of_the_common_batch_table_is_peers_common_json(key):
    cells = []
    for model in ("resnet50", "gpt2"):
        t = _json(f"peers_common_{model}.json")["measured"][model]["common"]["throughput"][key]
        cells.append(f"{t['fastest']:.1f} / {t['median']:.1f}")
    if key == "lms_tuned":
        _in("docs/results.md", "| **LMS, the tuner's `--batch` pick (no LMS)** | **" + "** | **".join(cells) + "** |")
        for model in ("resnet50", "gpt2"):
            assert _json(f"peers_common_{model}.json")["measured"][model]["tuned"]["config"]["n_tensors"] == 0
    else:
        _in("docs/results.md", f"| {COMMON_ROWS[key]} | " + " | ".join(cells) + " |")


# ---- the paper's workload, PREDICTED (benchmarks/paper.py) -----------------------------------------------------

def test_the_resnet50_prediction_at_16_gib_is_paper_table_json():
    row = next(r for r in _json("paper_table.json")["rows"] if r["key"] == "resnet50")
    p100 = next(d for d in row["devices"] if d["device"] == "P100-16GB")
    before, after = p100["no_lms"]["batch"], p100["lms"]["batch"]
    _in("README.md", f"{before} -> **{after:,} ({after / before:.1f}x)** at {100 * p100['throughput_cost']:.0f}% "
                     "throughput cost")
    _in("docs/results.md", f"**{before} -> {after:,} ({after / before:.1f}x)**")
