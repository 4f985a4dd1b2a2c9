"""Host memory swapping holds (`lms.sim.host`): peaks by hand on small graphs, host budgets. No TensorFlow.

Sizes: every activation of `tests.synthetic` is ``MiB`` bytes per sample. A swapped
tensor's host copy is held from its swap-out until its last swap-in has run.
"""

from __future__ import annotations

import pytest

from lms import LMSConfig, plan_swaps
from lms.sim.host import HostBudgetError, fits, host_peak, plan_within_host_budget
from lms.simulator import NO_TEMPORARIES, max_batch, simulate
from tests.synthetic import MiB, chain, long_skip, residual


def sim(graph, plan=None, **kw):
    kw.setdefault("temporaries", NO_TEMPORARIES)
    return simulate(graph, plan, **kw)


def held_at(result, plan, index):
    """Bytes of the swapped tensors whose host copy is live at `index`: an independent count from the timeline."""
    names = result.timeline.op_names
    pos = {n: i for i, n in enumerate(names)}
    total = 0
    for s in plan.swaps:
        out = next(i for i, n in enumerate(names) if n.startswith("lms/swap_out/") and n.endswith(
            s.tensor.replace(":", "_")))
        last_in = max(pos[i.name] for i in s.swap_ins)
        if out <= index <= last_in:
            total += s.nbytes // plan.batch_size * result.batch
    return total


def test_chain_all_swapped_peak_is_every_swapped_tensor_at_the_last_swap_out():
    # chain(4), every candidate swapped (f0, f1, f2: 3 tensors of 1 MiB/sample), batch 2:
    # all three copies are on the host from f2's swap-out until f2's swap-in -> 6 MiB
    g = chain(4)
    plan = plan_swaps(g, LMSConfig(n_tensors=-1, lb=1))
    r = sim(g, plan, batch=2)
    assert [s.tensor for s in plan.swaps] == ["f0:0", "f1:0", "f2:0"]
    assert host_peak(r) == (3 * 2 * MiB, r.peak_host_index, "lms/swap_out/f2_0")
    assert r.timeline.op_names[r.peak_host_index] == "lms/swap_out/f2_0"
    assert r.peak_host_bytes == held_at(r, plan, r.peak_host_index)
    # f2 comes back first: after its swap-in ran, two copies remain, then one, then none
    host = dict(zip(r.timeline.op_names, r.timeline.host_bytes))
    assert host["f2-lms_swap_in_0_0"] == 6 * MiB
    assert host["gradient_tape/f3/Grad"] == 4 * MiB
    assert host["gradient_tape/f2/Grad"] == 2 * MiB
    assert host["gradient_tape/f1/Grad"] == 0


@pytest.mark.parametrize("n_tensors,expected", [(1, 1), (2, 2), (5, 5), (-1, 7)])
@pytest.mark.parametrize("batch", [1, 3])
def test_chain_host_peak_is_the_swapped_count(n_tensors, expected, batch):
    g = chain(8)
    plan = plan_swaps(g, LMSConfig(n_tensors=n_tensors, lb=1))
    r = sim(g, plan, batch=batch)
    assert plan.n_swapped == expected
    assert r.peak_host_bytes == expected * MiB * batch
    assert r.peak_host_bytes == held_at(r, plan, r.peak_host_index)


def test_a_tensor_swapped_in_twice_stays_on_the_host_until_its_last_swap_in():
    # long_skip(6): enc is read by m0 and by dec; its backward readers get two swap-ins, the
    # second (for enc's own gradient) at the very end. 8 tensors swapped: peak 8 MiB at dec's swap-out.
    g = long_skip(6)
    plan = plan_swaps(g, LMSConfig(n_tensors=-1, lb=1, branch_threshold=2))
    enc = next(s for s in plan.swaps if s.tensor == "enc:0")
    assert len(enc.swap_ins) == 2
    r = sim(g, plan, batch=1)
    assert r.peak_host_bytes == 8 * MiB == held_at(r, plan, r.peak_host_index)
    host = dict(zip(r.timeline.op_names, r.timeline.host_bytes))
    # m0's gradient runs after every other copy came back: only enc (1 MiB) is still held for its last swap-in
    assert host["gradient_tape/m1/Grad"] == 1 * MiB
    assert host[enc.swap_ins[-1].name] == 1 * MiB
    assert host["gradient_tape/m0/Grad"] == 0


@pytest.mark.parametrize("blocks", [1, 3])
def test_residual_host_peak_equals_the_copies_held_at_that_moment(blocks):
    g = residual(blocks)
    plan = plan_swaps(g, LMSConfig())
    r = sim(g, plan, batch=2)
    assert r.peak_host_bytes > 0
    assert r.peak_host_bytes == held_at(r, plan, r.peak_host_index)
    assert max(r.timeline.host_bytes) == r.peak_host_bytes


def test_no_swapping_holds_no_host_memory():
    r = sim(chain(5), batch=4)
    assert (r.peak_host_bytes, r.peak_host_op) == (0, "")
    assert fits(r, r.peak_device_bytes, 1) and not fits(r, r.peak_device_bytes - 1)


# ---- max_batch with a host budget -------------------------------------------------------------
def test_max_batch_stops_at_the_host_budget():
    # chain(8), everything swapped: 3 MiB/sample on the device, 7 MiB/sample on the host
    g = chain(8)
    config = LMSConfig(n_tensors=-1, lb=1)
    free = max_batch(g, config, 300 * MiB, temporaries=NO_TEMPORARIES)
    assert (free.batch, free.limited_by, free.host_budget_bytes) == (100, "device", None)
    assert free.peak_host_bytes == 700 * MiB
    bound = max_batch(g, config, 300 * MiB, temporaries=NO_TEMPORARIES, host_budget_bytes=70 * MiB)
    assert (bound.batch, bound.limited_by, bound.peak_host_bytes) == (10, "host", 70 * MiB)
    loose = max_batch(g, config, 300 * MiB, temporaries=NO_TEMPORARIES, host_budget_bytes=1 << 40)
    assert (loose.batch, loose.limited_by) == (100, "device")


def test_max_batch_is_zero_when_batch_one_holds_too_much_host_memory():
    g = chain(8)
    r = max_batch(g, LMSConfig(n_tensors=-1, lb=1), 300 * MiB, temporaries=NO_TEMPORARIES,
                  host_budget_bytes=6 * MiB)
    assert (r.batch, r.limited_by, r.peak_host_bytes) == (0, "host", 7 * MiB)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_max_batch_refuses_a_bad_host_budget(bad):
    with pytest.raises(ValueError, match="host_budget"):
        max_batch(chain(3), None, 300 * MiB, host_budget_bytes=bad)


# ---- the planner under a host budget ----------------------------------------------------------
def test_planning_under_a_host_budget_drops_the_latest_swaps():
    g = chain(8, batch_size=4)  # 4 MiB per swapped tensor at the graph's batch
    full = plan_swaps(g, LMSConfig(n_tensors=-1, lb=1))
    assert full.n_swapped == 7
    plan = plan_within_host_budget(g, LMSConfig(n_tensors=-1, lb=1), 13 * MiB)
    assert plan.n_swapped == 3 and plan.config.n_tensors == 3
    assert [s.tensor for s in plan.swaps] == [s.tensor for s in full.swaps[:3]]
    assert sim(g, plan, batch=4).peak_host_bytes == 12 * MiB
    assert plan_within_host_budget(g, LMSConfig(n_tensors=-1, lb=1), 1 << 40).n_swapped == 7
    assert plan_within_host_budget(g, LMSConfig(n_tensors=5, lb=1), 16 * MiB, batch=2).n_swapped == 5


def test_planning_under_a_host_budget_too_small_for_one_tensor():
    with pytest.raises(HostBudgetError, match="even one swapped tensor"):
        plan_within_host_budget(chain(8, batch_size=4), LMSConfig(n_tensors=-1, lb=1), 1 * MiB)
