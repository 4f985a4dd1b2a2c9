"""`lms.auto.choose_config`: the fastest predicted config that fits a budget, from a fixed ladder. No TensorFlow.

Synthetic graphs (`tests.synthetic`); the budgets are set from the simulator's
own predictions of the rungs, so each case knows which rungs fit.
"""

from __future__ import annotations

import pytest

from lms import LMSConfig
from lms.auto import DEFAULT_MARGIN, AutoChoice, NoConfigFits, batch_shaped, choose_config, ladder
from lms.machine.devices import get_device
from lms.sim import simulate
from tests.synthetic import bn_relu_blocks, chain, gan_step, residual

MiB = 1 << 20
CPU = get_device("cpu")
GPU = get_device("V100-16GB")


def _peak(graph, config, batch, device):  # noqa: ANN001
    return simulate(graph, config, batch=batch, device=device, timeline=False, allocator="bfc").peak_device_bytes


def _budget_for(peak: int, margin: float = DEFAULT_MARGIN) -> int:
    """The smallest budget whose usable part holds `peak`."""
    budget = int(peak / (1 - margin)) + 1
    while int(budget * (1 - margin)) < peak:
        budget += 1
    return budget


@pytest.mark.parametrize("graph", [chain(8), residual(3), bn_relu_blocks(4)], ids=lambda g: g.name)
@pytest.mark.parametrize("device", [CPU, GPU], ids=["cpu", "gpu"])
def test_a_step_that_fits_gets_no_lms_and_nothing_else_is_simulated(graph, device):
    plain = _peak(graph, LMSConfig(n_tensors=0), 16, device)
    choice = choose_config(graph, batch=16, budget=_budget_for(plain), device=device)
    assert choice.config == LMSConfig(n_tensors=0) and choice.label == "no LMS"
    assert [c.label for c in choice.candidates] == ["no LMS"]
    assert choice.peak_bytes == plain and choice.throughput_cost == 0.0
    assert "fits without LMS" in choice.reason


@pytest.mark.parametrize("graph", [chain(12), residual(4), bn_relu_blocks(6)], ids=lambda g: g.name)
@pytest.mark.parametrize("device", [CPU, GPU], ids=["cpu", "gpu"])
def test_the_choice_is_the_fastest_rung_that_fits(graph, device):
    batch = 16
    plain = _peak(graph, LMSConfig(n_tensors=0), batch, device)
    rungs = {label: _peak(graph, config, batch, device) for label, config in ladder(device)}
    smallest = min(rungs.values())
    assert smallest < plain  # swapping saves memory on these graphs
    budget = _budget_for(smallest)
    choice = choose_config(graph, batch=batch, budget=budget, device=device)
    fitting = [c for c in choice.candidates if c.fits]
    assert [c.label for c in choice.candidates] == ["no LMS", *(label for label, _ in ladder(device))]
    assert choice.candidates[0].fits is False and choice.candidates[0].peak_bytes == plain
    assert fitting and all(c.peak_bytes <= choice.usable_bytes for c in fitting)
    assert all(c.peak_bytes > choice.usable_bytes for c in choice.candidates if not c.fits)
    assert choice.step_s == min(c.step_s for c in fitting)
    assert choice.peak_bytes <= choice.usable_bytes == int(budget * (1 - DEFAULT_MARGIN))
    assert choice.baseline_step_s == choice.candidates[0].step_s
    assert choice.label in choice.reason


def test_recompute_is_tried_only_when_no_swap_rung_fits():
    graph = residual(4)
    swaps = min(_peak(graph, config, 16, CPU) for _, config in ladder(CPU))
    recompute = _peak(graph, LMSConfig(n_tensors=-1, lb=1, schedule="memory", recompute="cheap"), 16, CPU)
    assert recompute < swaps  # the blocks' cheap Relu outputs are rebuilt, not kept
    choice = choose_config(graph, batch=16, budget=_budget_for(recompute), device=CPU)
    assert choice.config.recompute == "cheap" and choice.candidates[-1].label.endswith("recompute")
    assert choose_config(graph, batch=16, budget=_budget_for(swaps), device=CPU).config.recompute == "none"


def test_headroom_prefetch_is_a_rung_only_where_copies_overlap_compute():
    assert [c.prefetch for _, c in ladder(GPU)] == ["lb", "lb", "headroom"]
    assert [c.prefetch for _, c in ladder(CPU)] == ["lb", "lb"]


def test_nothing_fits_names_the_smallest_peak_its_config_and_a_batch_that_fits():
    graph = residual(4)
    with pytest.raises(NoConfigFits) as info:
        choose_config(graph, batch=64, budget=40 * MiB, device=CPU)
    err = info.value
    assert err.batch == 64 and err.budget_bytes == 40 * MiB
    assert err.smallest_peak_bytes > err.usable_bytes
    assert 0 < err.max_batch < 64
    assert f"batch {err.max_batch} would fit" in str(err) and "smallest predicted peak" in str(err)
    assert len(str(err).splitlines()) == 1
    # the batch it names does fit, with that config, and one more does not
    assert _peak(graph, err.config, err.max_batch, CPU) <= err.usable_bytes
    assert _peak(graph, err.config, err.max_batch + 1, CPU) > err.usable_bytes
    assert isinstance(choose_config(graph, batch=err.max_batch, budget=40 * MiB, device=CPU), AutoChoice)


def test_a_budget_too_small_for_batch_one_says_so():
    with pytest.raises(NoConfigFits, match="not even batch 1 fits") as info:
        choose_config(residual(2), batch=8, budget=1 << 21, device=CPU)
    assert info.value.max_batch == 0


def test_a_trace_whose_tensors_hide_the_batch_does_not_claim_batch_one_does_not_fit():
    # A GAN traced at a static batch 16: the random draw and the 2B concatenation keep their traced size at every
    # batch in the graph model, so by that model no batch fits; the message used to say "not even batch 1 fits"
    # where the step fits at a smaller batch (issue 51). The same step traced with an unknown batch is the truth.
    static, symbolic = gan_step(16), gan_step(16, static=False)
    budget = _budget_for(_peak(symbolic, LMSConfig(n_tensors=-1, lb=1), 6, CPU))
    with pytest.raises(NoConfigFits) as info:
        choose_config(static, batch=16, budget=budget, device=CPU)
    err = info.value
    assert _peak(static, err.config, 1, CPU) > err.usable_bytes  # the static model alone: not even batch 1
    truth = max(b for b in range(1, 16) if _peak(symbolic, err.config, b, CPU) <= err.usable_bytes)
    assert truth >= 6
    assert err.max_batch is None and err.estimated_max_batch == truth
    message = str(err)
    assert "not even batch 1" not in message and len(message.splitlines()) == 1
    # 5 tensors of one row (4 MiB at batch 16) and 6 of two rows
    assert "cannot be told from this trace: 11 tensors (68.00 MiB in all) lead with the traced batch 16" in message
    assert f"batch {truth} would fit with it" in message
    # traced with an unknown batch, the same step and budget name that batch as known
    with pytest.raises(NoConfigFits, match=f"with it batch {truth} would fit$") as known:
        choose_config(symbolic, batch=16, budget=budget, device=CPU)
    assert known.value.max_batch == known.value.estimated_max_batch == truth


def test_batch_shaped_tensors_are_those_after_a_draw_or_a_concatenation_not_weights_or_their_gradients():
    static, symbolic = gan_step(16), gan_step(16, static=False)
    scaled, names = batch_shaped(static)
    assert set(names) == {n for n, t in symbolic.tensors.items() if t.per_sample_bytes and n != "x:0"}
    assert "gradient_tape/discriminator/MatMul_1:0" not in names  # (32, 8): a kernel's shape, 32 = 2 x 16
    for batch in (1, 5, 16, 40):
        assert {n: t.nbytes(batch) for n, t in scaled.tensors.items()} == \
            {n: t.nbytes(batch) for n, t in symbolic.tensors.items()}
    assert batch_shaped(symbolic) == (None, ())
    assert batch_shaped(gan_step(1)) == (None, ())  # at batch 1 every leading dimension is a multiple


def test_the_same_inputs_give_the_same_choice():
    graph = residual(4)
    budget = _budget_for(min(_peak(graph, c, 16, GPU) for _, c in ladder(GPU)))
    a = choose_config(graph, batch=16, budget=budget, device=GPU)
    b = choose_config(graph, batch=16, budget=budget, device=GPU)
    assert (a.config, a.peak_bytes, a.step_s, a.candidates) == (b.config, b.peak_bytes, b.step_s, b.candidates)


@pytest.mark.parametrize("budget, match", [
    (0, "zero"), (-5, "negative"), ("twelve", "not a size"), ("3 parsecs", "unknown unit"), ("16XB", "unknown unit"),
    ("5", "below 1 MiB"), (True, "not a size"), ("2000000 TiB", "more than 1 PiB")])
def test_bad_budgets_are_one_line_errors(budget, match):
    with pytest.raises(ValueError, match=match) as info:
        choose_config(chain(4), batch=4, budget=budget, device=CPU)
    assert len(str(info.value).splitlines()) == 1


def test_budgets_are_bytes_or_sizes_and_small_int_budgets_are_taken_as_given():
    graph = chain(4, per_sample_bytes=1024)
    assert choose_config(graph, batch=4, budget="1GiB", device=CPU).budget_bytes == 1 << 30
    assert choose_config(graph, batch=4, budget="1.5 GB", device=CPU).budget_bytes == 1_500_000_000
    small = _budget_for(_peak(graph, LMSConfig(n_tensors=0), 4, CPU))
    assert small < 1 << 20 and choose_config(graph, batch=4, budget=small, device=CPU).budget_bytes == small


@pytest.mark.parametrize("kwargs, match", [({"margin": 0.6}, "margin"), ({"margin": -0.1}, "margin"),
                                           ({"batch": 0}, "batch"), ({"device": "TPU-v9"}, "unknown device")])
def test_bad_arguments_name_what_is_allowed(kwargs, match):
    args = {"batch": 4, "budget": "1GiB", "device": CPU, **kwargs}
    with pytest.raises(ValueError, match=match):
        choose_config(chain(4), **args)


def test_the_choice_serialises_with_its_config():
    choice = choose_config(residual(2), batch=4, budget="1GiB", device=CPU)
    d = choice.to_dict()
    assert LMSConfig.from_dict(d["config"]) == choice.config and d["predicted"] is True
    assert d["candidates"][0]["label"] == "no LMS"
