"""`benchmarks/plan_bound.py` on synthetic graphs (no TensorFlow, no tracing): every zoo workload has a row,
no config beats the bound, and the U-Net input-size search finds the sizes a scan over every size finds.
"""

from __future__ import annotations

import json

import pytest

from benchmarks import paper, plan_bound
from lms.sim.bound import peak_floor
from tests.synthetic import MiB, chain
from tuner.models import builtin_names, load_workload

DEVICE = "P100-16GB"


def test_every_zoo_workload_has_a_spec_the_paper_rows_theirs_the_small_models_their_defaults():
    assert plan_bound.WORKLOADS == builtin_names()
    assert set(plan_bound.WORKLOADS) >= {"mlp", "cnn_bn", "residual", "resnet50", "unet3d", "gpt2_small"}
    for name in builtin_names():
        spec = plan_bound.workload_spec(name)
        assert spec.workload == name and spec.key == name
        row = next((r for r in paper.ROWS if r.key == name), None)
        assert spec == row if row is not None else dict(spec.options) == {}
        load_workload(name, **spec.options)  # options the zoo accepts (describing a workload imports no TF)
    with pytest.raises(ValueError, match="not a zoo workload"):
        plan_bound.workload_spec("vgg16")


def test_an_input_size_spec_has_a_key_of_its_own_unless_it_is_the_rows_own_size():
    assert plan_bound.workload_spec("unet3d", {"input_size": 192}) is plan_bound.workload_spec("unet3d")
    spec = plan_bound.workload_spec("unet3d", {"input_size": 240})
    assert spec.key == "unet3d-input_size-240"
    assert dict(spec.options) == {**plan_bound.workload_spec("unet3d").options, "input_size": 240}


@pytest.mark.parametrize("n", [3, 6])
def test_no_config_beats_the_bound_and_the_row_says_what_sets_it(n):
    graph = chain(n)
    row = plan_bound.evaluate(graph.name, graph, DEVICE, plan_bound.plans_for(graph, plan_bound.CONFIGS))
    # without swapping, chain(n) peaks at (n + 1) MiB per sample plus the 256-byte loss (tests/test_paper_table.py)
    assert row["no_lms_batch"] == (plan_bound.BUDGET - 256) // ((n + 1) * MiB)
    assert 0 < row["no_lms_batch"] <= row["best"]["batch"] <= row["bound_batch"] <= row["op_only_bound_batch"]
    assert row["bound_batch"] < plan_bound.BUDGET // MiB  # every op holds at least one MiB per sample
    assert not (row["no_lms_capped"] or row["bound_capped"] or row["best"]["capped"])
    assert row["bound_at"]["batch"] == row["bound_batch"] and row["bound_at"]["bytes"] <= plan_bound.BUDGET
    assert row["bound_next"]["bytes"] > plan_bound.BUDGET
    assert len(row["configs"]) == len(plan_bound.CONFIGS) and row["target_batch"] is None
    text = plan_bound.report(row)
    assert "PREDICTED" in text and row["bound_at"]["op"]["name"] in text
    assert row["bound_at"]["op"]["name"] in plan_bound.summary([row], DEVICE)
    json.dumps(row)


def test_a_capped_batch_says_so():
    assert plan_bound.fmt_batch(1 << 26, True) == ">= 67,108,864 (capped at the limit)"
    assert plan_bound.fmt_batch(1184, False) == "1,184"


def _volume_chain(size: int):
    """A chain whose tensors grow with the cube of `size` (as the U-Net's feature maps do with its input)."""
    return chain(3, per_sample_bytes=size ** 3 * 4)


@pytest.mark.parametrize("budget_mib", [16, 40, 100])
def test_input_size_search_finds_what_a_scan_of_every_size_finds(budget_mib):
    budget, step = budget_mib * MiB, 16
    loaded: list[int] = []

    def load(size: int):
        loaded.append(size)
        return _volume_chain(size)

    d = plan_bound.input_size_bound(load=load, budget_bytes=budget, device=DEVICE, start=192, step=step,
                                    highest=step * 64)
    sizes = range(step, step * 64 + 1, step)
    floor_fits = [s for s in sizes if peak_floor(_volume_chain(s), 1, device=DEVICE).bytes <= budget]
    assert d["bound"]["largest"] == max(floor_fits)
    assert d["bound"]["first_failing"] == max(floor_fits) + step
    assert d["no_lms"]["largest"] <= d["best"]["largest"] <= d["bound"]["largest"]
    assert d["best_configs"] and d["bound_first_failing"]["fitting_configs"] == []
    assert d["bound_first_failing"]["no_lms_fits"] is False
    assert d["bound_at"]["floor_bytes"] <= budget < d["bound_first_failing"]["floor_bytes"]
    assert len(loaded) == len(set(loaded)) <= 12  # each size loaded (traced) once; bisection, not a scan
    assert [s["size"] for s in d["sizes"]] == sorted(set(loaded))
    assert "PREDICTED" in plan_bound.input_size_report(d)
    json.dumps(d)
