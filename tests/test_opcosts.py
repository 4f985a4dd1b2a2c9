"""Measured per-op times in the simulator (`lms.sim.OpCosts`): the fit, and how simulate uses them."""

from __future__ import annotations

import pytest

from lms import LMSConfig
from lms.simulator import OpCosts, max_batch, simulate
from tests.synthetic import MiB, residual


def test_fit_is_affine_per_op_and_clips_noise():
    measured = {8: {"a": 0.010, "b": 0.002, "c": 0.004, "only8": 0.001},
                32: {"a": 0.034, "b": 0.002, "c": 0.003, "only32": 0.005}}
    costs = OpCosts.fit(measured, source="test")
    assert costs.batches == (8, 32)
    assert costs.fixed["a"] == pytest.approx(0.002) and costs.per_sample["a"] == pytest.approx(0.001)
    assert costs.fixed["b"] == pytest.approx(0.002) and costs.per_sample["b"] == 0.0
    assert costs.per_sample["c"] == 0.0 and costs.fixed["c"] == pytest.approx(0.004)  # falling: noise
    assert (costs.fixed["only8"], costs.per_sample["only8"]) == (0.001, 0.0)
    assert (costs.fixed["only32"], costs.per_sample["only32"]) == (0.005, 0.0)
    assert list(costs.seconds(["a", "b", "unknown"], 16)) == pytest.approx([0.018, 0.002, 0.0])
    assert costs.step_seconds(16) == pytest.approx(0.018 + 0.002 + 0.004 + 0.001 + 0.005)
    one = OpCosts.fit({4: {"a": 0.008}})
    assert (one.fixed["a"], one.per_sample["a"]) == (0.0, pytest.approx(0.002))  # a line through 0
    assert OpCosts.from_dict(costs.to_dict()) == costs


def test_bad_input():
    with pytest.raises(ValueError, match="batches must be >= 1"):
        OpCosts.fit({0: {"a": 1.0}})
    with pytest.raises(ValueError, match=r"OpCosts.fixed\['a'\]=-1.0: must be >= 0"):
        OpCosts({"a": -1.0}, {})
    with pytest.raises(ValueError, match="not an op-cost document"):
        OpCosts.from_dict({"schema": "other"})


def test_simulate_times_each_op_by_its_measured_cost():
    g = residual(3, per_sample_bytes=MiB)
    names = list(g.ops)
    costs = OpCosts({n: 0.001 for n in names}, {n: 0.0005 for n in names})
    for batch in (1, 4, 16):
        r = simulate(g, None, batch=batch, device="cpu", op_costs=costs, timeline=False)
        # no swaps: the step is every op's time, in series
        assert r.step_time_s == pytest.approx(len(names) * (0.001 + 0.0005 * batch))
        # the same times given as a plain table at that batch
        table = {n: 0.001 + 0.0005 * batch for n in names}
        assert r.step_time_s == pytest.approx(
            simulate(g, None, batch=batch, device="cpu", op_costs=table, timeline=False).step_time_s)
    # max_batch scales them per batch it tries, and memory does not depend on them
    m = max_batch(g, LMSConfig(n_tensors=-1, lb=1), 200 * MiB, device="cpu", op_costs=costs)
    assert m.step_time_s > 0 and m.throughput == pytest.approx(m.batch / m.step_time_s)
    assert m.batch == max_batch(g, LMSConfig(n_tensors=-1, lb=1), 200 * MiB, device="cpu").batch


def test_ops_the_profile_never_saw_cost_nothing():
    g = residual(2, per_sample_bytes=MiB)
    one = next(iter(g.ops))
    r = simulate(g, None, batch=2, device="cpu", op_costs=OpCosts({one: 0.25}, {}), timeline=False)
    assert r.step_time_s == pytest.approx(0.25)
