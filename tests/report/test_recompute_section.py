"""The report says what recomputation bought (issue 15): tensors, link bytes, time; PREDICTED and MEASURED."""

from __future__ import annotations

import html
import json
import re

import pytest

from lms import LMSConfig, plan_swaps
from lms.simulator import simulate
from tests.synthetic import MiB, bn_relu_blocks
from tuner.report.data import trials_frame
from tuner.report.recompute import measured_pair, recompute_summary

from .studies import make_study, record

CHEAP = LMSConfig(n_tensors=-1, recompute="cheap")
BATCH = 16


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", fragment)))


def test_summary_lists_the_planned_tensors_and_simulates_both_configs():
    """bn_relu_blocks(4): the four Relu outputs (1 MiB per sample) are rebuilt from the saved BiasAdd.

    With recompute='none' they are swapped: out once, in twice (ReluGrad and the next conv's filter
    gradient), in once for the last block. Recomputing removes 4 swap-outs and 7 swap-ins of 16 MiB.
    """
    graph = bn_relu_blocks(4)
    s = recompute_summary(graph, CHEAP, batch=BATCH, device="V100-16GB")
    plan = plan_swaps(graph, CHEAP)
    assert [t.tensor for t in s.tensors] == list(plan.recompute.tensors) == [f"block{i}/relu:0" for i in range(4)]
    for t in s.tensors:
        i = t.tensor.split("/")[0]
        assert t.op_type == "Relu" and t.nbytes == graph.tensor_bytes(t.tensor, BATCH) == 16 * MiB
        assert t.cloned_ops == (f"{i}/bn/mul_1", f"{i}/bn/add_1", f"{i}/relu")
    assert [t.link_bytes_without for t in s.tensors] == [48 * MiB, 48 * MiB, 48 * MiB, 32 * MiB]
    assert s.recomputed_bytes == 64 * MiB
    with_r = simulate(graph, CHEAP, batch=BATCH, device="V100-16GB")
    without = simulate(graph, CHEAP.replace(recompute="none"), batch=BATCH, device="V100-16GB")
    assert (s.link_bytes, s.link_bytes_without) == (with_r.transfer_bytes, without.transfer_bytes)
    assert s.link_bytes_saved == (4 + 7 - 4) * 16 * MiB  # each BiasAdd now swapped in once more, for the clones
    assert (s.step_time_s, s.step_time_without_s) == (with_r.step_time_s, without.step_time_s)
    assert s.time_cost_s == pytest.approx(with_r.step_time_s - without.step_time_s)
    assert (s.peak_bytes, s.peak_bytes_without) == (with_r.peak_device_bytes, without.peak_device_bytes)
    assert s.recompute == "cheap" and s.device == "V100-16GB" and s.batch == BATCH


def test_without_a_device_profile_there_is_no_time_prediction():
    graph = bn_relu_blocks(2)
    s = recompute_summary(graph, LMSConfig(n_tensors=0, recompute=("Relu", "Mul", "AddV2")), batch=4)
    assert s.step_time_s is None and s.time_cost_s is None and s.recompute == "Relu, Mul, AddV2"
    assert s.link_bytes == s.link_bytes_without == 0  # nothing swapped either way
    assert s.peak_bytes < s.peak_bytes_without
    with pytest.raises(ValueError, match="recompute='none'"):
        recompute_summary(graph, LMSConfig(), batch=4)


def _trials(records):
    import optuna

    trials = []
    for i, attrs in enumerate(records):
        t = optuna.trial.create_trial(values=[attrs["batch_size"], attrs["throughput"]], user_attrs=attrs)
        t.number = i
        trials.append(t)
    return trials_frame(trials)


def _measured(batch, step, backend="emulated", **knobs):
    r = record(batch=batch, throughput=batch / step, peak=1 << 28, backend=backend, measured=True, **knobs)
    r["step_time_median_s"] = step
    return r


def test_measured_pair_is_the_same_config_without_recompute_at_the_same_batch():
    records = [
        _measured(BATCH, 0.30, n_tensors=-1, recompute="cheap"),                  # 0
        _measured(BATCH, 0.20, n_tensors=-1),                                     # 1 the pair, recompute none
        _measured(BATCH, 0.10, n_tensors=3),                                      # 2 another config
        _measured(BATCH * 2, 0.50, n_tensors=-1),                                 # 3 another batch
        _measured(BATCH, 0.25, backend="gpu", n_tensors=-1, recompute="cheap"),   # 4 gpu: emulated goes first
        _measured(BATCH, 0.15, backend="gpu", n_tensors=-1),                      # 5
    ]
    pair, note = measured_pair(_trials(records), CHEAP, batch=BATCH)
    assert (pair.backend, pair.trial, pair.trial_without) == ("emulated", 0, 1)
    assert (pair.step_time_s, pair.step_time_without_s) == (0.30, 0.20)
    assert pair.time_cost_s == pytest.approx(0.10)
    assert note == ("MEASURED on the emulated backend: trial #0 (recompute='cheap') against trial #1 "
                    "(recompute='none'), both at batch 16.")
    # no step_time_median_s: batch / throughput
    del records[0]["step_time_median_s"]
    pair, _ = measured_pair(_trials(records), CHEAP, batch=BATCH)
    assert pair.step_time_s == pytest.approx(0.30)
    # without the recompute='none' trial at that batch there is no pair
    pair, note = measured_pair(_trials([records[0], records[3]]), CHEAP, batch=BATCH)
    assert pair is None
    assert note == ("MEASURED: no measured pair exists: the study has no measured trial of both this config "
                    "(recompute='cheap') and the same config with recompute='none' at batch 16.")


def _build(root, name, records, recommended):
    from tuner.report import build_report

    _, studies = make_study(root, name, records, recommended=recommended)
    doc = {"schema": "tuner.graph", "schema_version": 1, "graph": bn_relu_blocks(4).to_dict()}
    (studies / name / "graph.json").write_text(json.dumps(doc))
    return build_report(name, studies_dir=studies, reports_dir=root / "reports").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def measured_page(tmp_path_factory) -> str:
    """Emulated measurements of the recommended config and of the same without recompute, at batch 16."""
    records = [_measured(8, 0.1, n_tensors=0), _measured(BATCH, 0.30, n_tensors=-1, recompute="cheap"),
               _measured(BATCH, 0.20, n_tensors=-1)]
    return _build(tmp_path_factory.mktemp("recompute-report"), "recompute", records, recommended=1)


def _rows(section: str, cls: str) -> list[list[str]]:
    table = re.search(rf'<table class="{cls}">(.*?)</table>', section, re.S).group(1)
    return [[_text(c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)[1:]]


def test_page_lists_recomputed_tensors_with_predicted_and_measured_figures(measured_page):
    graph = bn_relu_blocks(4)
    section = measured_page[measured_page.index('id="recompute"'):measured_page.index('id="knobs"')]
    text = _text(section)
    assert ("rebuilds 4 saved tensors in the backward pass (recompute='cheap') by running 12 forward ops again"
            in text)
    tensors = _rows(section, "recompute")
    assert [r[0] for r in tensors] == [f"block{i}/relu:0" for i in range(4)]
    assert all(r[1] == "Relu" and r[2] == "16.00 MiB (16,777,216 B)" for r in tensors)
    assert tensors[0][4] == "block0/bn/mul_1 block0/bn/add_1 block0/relu"
    with_r = simulate(graph, CHEAP, batch=BATCH, device="V100-16GB")
    without = simulate(graph, CHEAP.replace(recompute="none"), batch=BATCH, device="V100-16GB")
    figures = {r[0]: r[1:] for r in _rows(section, "recompute-figures")}
    link = figures["host link bytes per step"]
    saved = without.transfer_bytes - with_r.transfer_bytes
    assert link[:3] == [f"{with_r.transfer_bytes / MiB:.2f} MiB ({with_r.transfer_bytes:,} B)",
                        f"{without.transfer_bytes / MiB:.2f} MiB ({without.transfer_bytes:,} B)",
                        f"{saved / MiB:.2f} MiB ({saved:,} B) saved"]
    assert link[3] == "PREDICTED (simulator, V100-16GB profile)"
    step = figures["step time"]
    assert step[:3] == [f"{with_r.step_time_s * 1e3:.2f} ms", f"{without.step_time_s * 1e3:.2f} ms",
                        f"{(with_r.step_time_s - without.step_time_s) * 1e3:+.2f} ms"]
    assert step[3].startswith("PREDICTED") and figures["peak device memory"][3].startswith("PREDICTED")
    assert figures["step time (trials #1 and #2)"] == ["300.00 ms", "200.00 ms", "+100.00 ms",
                                                        "MEASURED (emulated backend)"]
    assert "MEASURED on the emulated backend: trial #1 (recompute='cheap') against trial #2" in text


def test_page_says_plainly_when_no_measured_pair_exists(tmp_path):
    records = [record(n_tensors=0, batch=8, throughput=100.0, peak=1 << 28),
               record(n_tensors=-1, batch=BATCH, throughput=80.0, peak=1 << 29, recompute="cheap")]
    page = _build(tmp_path, "predicted", records, recommended=1)
    section = _text(page[page.index('id="recompute"'):page.index('id="knobs"')])
    assert "MEASURED: no measured pair exists" in section
    assert "MEASURED (" not in section and "PREDICTED (simulator, V100-16GB profile)" in section
    assert "Nothing is recomputed" not in page


def test_without_a_traced_graph_the_section_says_why(tmp_path):
    from tuner.report import build_report

    records = [record(n_tensors=-1, batch=BATCH, throughput=80.0, peak=1 << 29, recompute="cheap")]
    _, studies = make_study(tmp_path, "nograph", records, recommended=0)
    page = build_report("nograph", studies_dir=studies, reports_dir=tmp_path / "reports").read_text(encoding="utf-8")
    section = _text(page[page.index('id="recompute"'):page.index('id="knobs"')])
    assert "Recomputed tensors are not listed: no traced graph was found beside the study." in section
    assert 'id="schedule"' not in page
