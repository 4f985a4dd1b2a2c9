"""The simulator on synthetic graphs (no TensorFlow): exact peaks by hand, swaps, time, search.

Sizes: `tests.synthetic` gives every activation ``MiB`` bytes per sample; the
loss is 4 bytes (one 256-byte allocation). ``NO_TEMPORARIES`` isolates the
liveness model; the temporaries are tested on their own.
"""

from __future__ import annotations

import json
import random

import pytest

from lms import LMSConfig, plan_swaps
from lms.machine.devices import DeviceProfile, get_device
from lms.graph import GraphBuilder, Role
from lms.plan import rewrite_graph
from lms.order import bypass_identities, executed_order
from lms.shapes import complete_sizes, is_noop_reduction
from lms.sim.costs import op_flops, op_temporary
from lms.simulator import (CPU_TEMPORARIES, NO_TEMPORARIES, InfeasibleBudget, TemporaryModel, TemporaryRule,
                           max_batch, simulate)
from tests.synthetic import MiB, chain, diamond, residual

LOSS = 256  # the 4-byte loss, as the allocator rounds it


def sim(graph, plan=None, **kw):
    kw.setdefault("temporaries", NO_TEMPORARIES)
    return simulate(graph, plan, **kw)


def fast_link(name="test", link=1e15):
    return DeviceProfile(name=name, memory_bytes=1 << 40, peak_flops=1e12, mem_bandwidth=1e11,
                         link_bandwidth=link, link="test link", source="test", op_overhead_s=0.0,
                         transfer_latency_s=0.0)


# ---- exact peaks, no swapping --------------------------------------------------------------
@pytest.mark.parametrize("n", [3, 5, 8, 12])
@pytest.mark.parametrize("batch", [1, 4])
def test_chain_peak_is_every_activation_plus_input_at_the_loss(n, batch):
    # x, f0..f{n-1} are all alive when the loss runs; gradients then reuse buffers in place.
    r = sim(chain(n), batch=batch)
    assert r.peak_device_bytes == (n + 1) * MiB * batch + LOSS
    assert r.peak_op == "loss"
    assert r.peak_host_bytes == 0 and r.transfer_bytes == 0


@pytest.mark.parametrize("batch", [1, 3])
def test_diamond_peak_is_at_the_add_gradient(batch):
    # x, a, b, c, the gradient of e and the two outputs of d's gradient: 7 activations.
    r = sim(diamond(), batch=batch)
    assert r.peak_device_bytes == 7 * MiB * batch
    assert r.peak_op == "gradient_tape/d/Grad"


@pytest.mark.parametrize("blocks", [1, 2, 3, 5])
def test_residual_peak_grows_by_five_activations_per_block(blocks):
    r = sim(residual(blocks), batch=2)
    assert r.peak_device_bytes == (5 * blocks + 3) * MiB * 2
    assert r.peak_op == f"gradient_tape/block{blocks - 1}/add/Grad"


# ---- swapping -------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [3, 5, 8, 12])
def test_swapping_every_activation_just_in_time_leaves_three_on_a_chain(n):
    g = chain(n)
    plan = plan_swaps(g, LMSConfig(n_tensors=-1, lb=1))
    base, swapped = sim(g, batch=2), sim(g, plan, batch=2)
    # forward: x, f_i, f_{i+1}; backward: x, the gradient, one swapped-in tensor
    assert swapped.peak_device_bytes == 3 * MiB * 2
    assert base.peak_device_bytes - swapped.peak_device_bytes == (n - 2) * MiB * 2 + LOSS
    assert swapped.peak_host_bytes == (n - 1) * MiB * 2  # every swapped copy is on the host
    assert swapped.n_swap_outs == swapped.n_swap_ins == plan.n_swapped == n - 1
    assert swapped.transfer_bytes == 2 * (n - 1) * MiB * 2


@pytest.mark.parametrize("graph,expected", [(diamond, 6), (lambda: residual(1), 6), (lambda: residual(4), 6)])
def test_swapping_lowers_the_peak_of_branchy_graphs(graph, expected):
    g = graph()
    r = sim(g, plan_swaps(g, LMSConfig()), batch=1)
    assert r.peak_device_bytes == expected * MiB


def test_a_later_trigger_raises_the_peak():
    g = chain(8)
    peaks = [sim(g, plan_swaps(g, LMSConfig(lb=lb)), batch=1).peak_device_bytes for lb in (1, 2)]
    # lb=2 brings each tensor back one gradient op earlier: two swapped-in copies coexist
    assert peaks == [3 * MiB, 4 * MiB]


def test_n_tensors_swaps_the_earliest_first_and_saves_their_bytes():
    g = chain(8)
    r = sim(g, plan_swaps(g, LMSConfig(n_tensors=3)), batch=1)
    # f0..f2 leave; at the loss x, f3..f7 and the loss are resident
    assert r.peak_device_bytes == 6 * MiB + LOSS
    assert r.peak_host_bytes == 3 * MiB


def test_config_and_plan_give_the_same_result():
    g = residual(2)
    config = LMSConfig(lb=2)
    assert sim(g, config, batch=3).peak_device_bytes == sim(g, plan_swaps(g, config), batch=3).peak_device_bytes


# ---- executed order --------------------------------------------------------------------------
def _two_branches():
    b = GraphBuilder()
    x = b.op("x", "Placeholder", per_sample_bytes=16)
    a1 = b.op("a1", "Conv2D", x, per_sample_bytes=16)
    a2 = b.op("a2", "Conv2D", a1, per_sample_bytes=16)
    a3 = b.op("a3", "Conv2D", a2, per_sample_bytes=16)
    b1 = b.op("b1", "Conv2D", x, per_sample_bytes=16)
    b2 = b.op("b2", "Conv2D", b1, per_sample_bytes=16)
    b.op("c", "AddV2", a3, b2, per_sample_bytes=16)
    return b.build()


def test_fifo_order_interleaves_branches_creation_order_does_not():
    g = _two_branches()
    assert executed_order(g, "fifo") == ("x", "a1", "b1", "a2", "b2", "a3", "c")
    assert executed_order(g, "creation") == ("x", "a1", "a2", "a3", "b1", "b2", "c")
    with pytest.raises(ValueError, match="order='lifo'"):
        executed_order(g, "lifo")


def test_executor_order_runs_expensive_ops_as_lifo_tasks():
    g = _two_branches()
    # GPU: every op inline -> breadth-first from the input
    assert executed_order(g, "executor") == ("x", "a1", "b1", "a2", "b2", "a3", "c")
    # CPU, every op expensive: of a1 and b1 (both ready after x) the last runs inline, the
    # other waits as a task; c waits for a3, so the a-branch runs after the b-branch.
    assert executed_order(g, "executor", expensive_op_bytes=0) == ("x", "b1", "b2", "a1", "a2", "a3", "c")
    # ops touching up to 64 bytes are cheap: inline FIFO again
    assert executed_order(g, "executor", expensive_op_bytes=64) == executed_order(g, "fifo")


def test_single_threaded_order_is_a_depth_first_reverse_post_order():
    g = _two_branches()
    # x's consumers a1 (created first) and b1: a1 is explored first, so its chain finishes first
    # and, reversed, runs last; c, needing both branches, comes after both
    assert executed_order(g, "single_threaded") == ("x", "b1", "b2", "a1", "a2", "a3", "c")
    # a valid topological order of a bigger graph, and the same every time
    r = residual(3)
    order = executed_order(r, "single_threaded")
    pos = {n: i for i, n in enumerate(order)}
    assert sorted(order) == sorted(r.ops)
    assert all(pos[p] < pos[n] for n in r.ops for p in r.predecessors(n))
    assert order == executed_order(residual(3), "single_threaded")


def test_sizes_lost_by_the_trace_come_back_through_reshape_and_a_noop_sum_is_a_view():
    # the gradient of a broadcasting Add: Sum over run-time axes (shape unknown), then Reshape
    b = GraphBuilder()
    x = b.op("x", "Placeholder", per_sample_bytes=MiB)
    g = b.op("g", "Relu", x, per_sample_bytes=MiB)
    axes = b.op("axes", "BroadcastGradientArgs", shape=(None,), dtype="int32", per_sample_bytes=4)
    s = b.op("sum", "Sum", g, axes, shape=(None, None, None), per_sample_bytes=4)
    shp = b.op("shape", "Shape", g, shape=(3,), dtype="int32", fixed_bytes=12)
    r = b.op("reshape", "Reshape", s, shp, shape=(None, 8, 8), per_sample_bytes=MiB)
    b.op("out", "Conv2D", r, per_sample_bytes=MiB)  # not element-wise: writes a new buffer
    graph = b.build()
    done = complete_sizes(graph)
    assert done.tensors["sum:0"].per_sample_bytes == MiB and done.tensors["sum:0"].shape == (None, 8, 8)
    assert graph.tensors["sum:0"].per_sample_bytes == 4  # the input graph is not changed
    assert is_noop_reduction(done, done.ops["sum"]) and not is_noop_reduction(graph, graph.ops["sum"])
    # at out: x, g (viewed by sum and reshape: alive until out reads it) and out; before the
    # fix, g died at the 4-byte sum and the peak was one activation lower
    assert sim(graph, batch=2).peak_device_bytes == 3 * 2 * MiB


def test_executor_starts_with_variable_reads_and_ends_with_the_step_data():
    b = GraphBuilder()
    x = b.op("x", "Placeholder", per_sample_bytes=16)
    h = b.op("w", "Placeholder", shape=(), dtype="resource")
    c = b.op("c", "Const", fixed_bytes=4)
    r = b.op("read", "ReadVariableOp", h, fixed_bytes=64)
    b.op("y", "MatMul", x, r, c, per_sample_bytes=16)
    order = executed_order(b.build())
    assert order[:2] == ("w", "read") and order.index("x") > order.index("c")


def test_identities_do_not_delay_their_readers():
    # Keras passes all gradients through one IdentityN; Grappler bypasses it, so an update may run
    # as soon as its own gradient exists (and free it) instead of after the last gradient.
    b = GraphBuilder()
    x = b.op("x", "Placeholder", per_sample_bytes=MiB)
    g1 = b.op("g1", "Conv2D", x, per_sample_bytes=MiB)
    g2 = b.op("g2", "Conv2D", g1, per_sample_bytes=MiB)
    g3 = b.op("g3", "Conv2D", g2, per_sample_bytes=MiB)
    b.op("ids", "IdentityN", g1, g3, per_sample_bytes=MiB, n_outputs=2)
    b.op("update1", "Conv2D", "ids:0", fixed_bytes=256)
    b.op("update3", "Conv2D", "ids:1", fixed_bytes=256)
    g = b.build()
    order = executed_order(bypass_identities(g))
    assert "ids" not in order and order.index("update1") < order.index("g3")
    # g1 is freed by update1 before g3 exists: x, g2, g3 at most
    assert sim(g, batch=1).peak_device_bytes == 3 * MiB + 256


def test_a_swap_in_runs_only_after_its_trigger():
    g = chain(10)
    plan = plan_swaps(g, LMSConfig(lb=3))
    order = executed_order(rewrite_graph(g, plan))
    pos = {name: i for i, name in enumerate(order)}
    for s in plan.swaps:
        for si in s.swap_ins:
            assert pos[si.trigger] < pos[si.name] < min(pos[c] for c in si.consumers)
            assert pos[s.swap_out] < pos[si.name]


# ---- an independent reference interpreter -------------------------------------------------------
def _reference_peak(graph, batch):
    """Refcounting over the FIFO order; no views, no in-place reuse (op types here allow none)."""
    order = executed_order(graph)
    readers = {t: 0 for t in graph.tensors}
    for op in graph.ops.values():
        for t in set(op.inputs):
            readers[t] += 1
    live, peak = 0, 0
    rounded = {t: -(-graph.tensors[t].nbytes(batch) // 256) * 256 for t in graph.tensors}
    for name in order:
        op = graph.ops[name]
        if op.type == "Placeholder":
            continue
        live += sum(rounded[t] for t in op.outputs)
        peak = max(peak, live)
        for t in set(op.inputs):
            readers[t] -= 1
            if readers[t] == 0 and graph.ops[t.rsplit(":", 1)[0]].type != "Placeholder":
                live -= rounded[t]
        live -= sum(rounded[t] for t in op.outputs if readers[t] == 0)
    pinned = sum(rounded[t] for op in graph.ops.values() if op.type == "Placeholder" for t in op.outputs)
    return peak + pinned


@pytest.mark.parametrize("seed", range(12))
def test_vectorised_interpreter_matches_a_plain_refcounting_loop(seed):
    rng = random.Random(seed)
    b = GraphBuilder(batch_size=2)
    names = [b.op("x", "Placeholder", per_sample_bytes=rng.randrange(1, 5000))]
    for i in range(rng.randrange(5, 40)):
        inputs = rng.sample(names, k=min(len(names), rng.randrange(1, 4)))
        names.append(b.op(f"op{i}", "Conv2D", *inputs, per_sample_bytes=rng.randrange(0, 5000),
                          fixed_bytes=rng.randrange(0, 3000), n_outputs=rng.randrange(1, 3)))
    g = b.build()
    for batch in (1, 7):
        assert sim(g, batch=batch).peak_device_bytes == _reference_peak(g, batch)


# ---- views, in-place reuse, resident bytes ------------------------------------------------------
def test_views_share_their_input_buffer():
    b = GraphBuilder()
    x = b.op("x", "Placeholder", per_sample_bytes=MiB)
    a = b.op("a", "Conv2D", x, per_sample_bytes=MiB)
    v = b.op("view", "Reshape", a, per_sample_bytes=MiB)
    b.op("out", "Conv2D", v, per_sample_bytes=MiB)
    assert sim(b.build(), batch=1).peak_device_bytes == 3 * MiB  # x, a (= view), out


def test_elementwise_ops_reuse_a_dying_input_but_not_a_live_one():
    b = GraphBuilder()
    x = b.op("x", "Placeholder", per_sample_bytes=MiB)
    a = b.op("a", "Conv2D", x, per_sample_bytes=MiB)
    r = b.op("relu", "Relu", a, per_sample_bytes=MiB)  # a dies here: relu writes into it
    b.op("out", "Conv2D", r, per_sample_bytes=MiB)
    assert sim(b.build(), batch=1).peak_device_bytes == 3 * MiB
    b2 = GraphBuilder()
    x = b2.op("x", "Placeholder", per_sample_bytes=MiB)
    a = b2.op("a", "Conv2D", x, per_sample_bytes=MiB)
    r = b2.op("relu", "Relu", a, per_sample_bytes=MiB)  # a is read again later: a new buffer
    b2.op("out", "Conv2D", r, a, per_sample_bytes=MiB)
    assert sim(b2.build(), batch=1).peak_device_bytes == 4 * MiB


def _masked_softmax_gradient(*, dead_live: bool):
    """``where(mask, g, 0)`` and the dead gradient of ``where``'s constant branch, as TF's tape leaves them."""
    b = GraphBuilder()
    x = b.op("x", "Placeholder", per_sample_bytes=MiB)
    g = b.op("g", "Conv2D", x, per_sample_bytes=4 * MiB, role=Role.BACKWARD)
    sel = b.op("select", "SelectV2", x, g, per_sample_bytes=4 * MiB, role=Role.BACKWARD)
    # the gradient of the constant: nobody reads it, TF prunes it (Op.live=False) unless marked live
    b.op("select_1", "SelectV2", x, g, per_sample_bytes=4 * MiB, role=Role.BACKWARD, live=dead_live)
    b.op("out", "Sum", sel, per_sample_bytes=MiB, role=Role.BACKWARD)
    return b.build()


def test_an_op_tensorflow_prunes_takes_no_memory_and_holds_no_input():
    pruned = _masked_softmax_gradient(dead_live=False)
    run = _masked_softmax_gradient(dead_live=True)
    # x + g + select's output; with the dead op run, its output and g held until it ran come on top
    assert sim(pruned, batch=1).peak_device_bytes == 9 * MiB
    assert sim(run, batch=1).peak_device_bytes == 13 * MiB
    assert "select_1" not in sim(pruned, batch=1).timeline.op_names
    # the memory schedule's liveness model still counts it (left alone: changing it moves the pinned order
    # of ResNet-50 64x64, the default search's model, whose measured answer the README quotes)
    from lms.schedule.models import buffer_model, live_peak
    for graph in (pruned, run):
        m = buffer_model(graph, 1)
        assert live_peak(m, [m.index[n] for n in graph.topological_order]) == 12 * MiB


def _variable_graph(*, late_read: bool):
    b = GraphBuilder()
    h = b.op("w", "VarHandleOp", shape=(), dtype="resource")
    x = b.op("x", "Placeholder", per_sample_bytes=MiB)
    r = b.op("read", "ReadVariableOp", h, fixed_bytes=10_000, shape=(50, 50))
    y = b.op("y", "MatMul", x, r, per_sample_bytes=MiB)
    d = b.op("delta", "Conv2D", y, fixed_bytes=10_000, shape=(50, 50))
    b.op("update", "AssignAddVariableOp", h, d, n_outputs=0)
    if late_read:
        # reads the old value of w after the update ran: TF must copy the variable
        b.op("late", "MatMul", y, r, per_sample_bytes=MiB, control_inputs=("update",))
    return b.build()


def test_resident_bytes_count_each_variable_once_or_take_the_given_value():
    g = _variable_graph(late_read=False)
    r = sim(g, batch=1)
    assert r.resident_bytes == 10_240  # 10,000 rounded to 256
    # x, y, delta (at the update y is gone): x + y + delta at `delta`
    assert r.peak_device_bytes == 10_240 + 2 * MiB + 10_240
    assert sim(g, batch=1, resident_bytes=5 * MiB).resident_bytes == 5 * MiB


def test_updating_a_variable_that_is_still_read_later_costs_a_copy():
    g = _variable_graph(late_read=True)
    cow = TemporaryModel("cow", {}, copy_on_write=True)
    plain = sim(g, batch=1)
    copied = sim(g, batch=1, temporaries=cow)
    assert copied.peak_device_bytes - plain.peak_device_bytes == 10_240


# ---- temporaries ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [3, 6])
def test_per_op_temporaries_add_at_their_op(n):
    model = TemporaryModel("relu-half", {"Relu": TemporaryRule(0.5, "output")})
    r = sim(chain(n), batch=2, temporaries=model)
    # the last forward Relu: x, f0..f{n-1} and half an activation of scratch
    assert r.peak_device_bytes == (n + 1.5) * MiB * 2
    assert r.peak_op == f"f{n - 1}" and r.peak_temporary_bytes == MiB


def _conv_grads(h=32, w=32, ci=64, co=64, k=3):
    b = GraphBuilder(batch_size=16)
    x = b.op("x", "Placeholder", per_sample_bytes=h * w * ci * 4, shape=(None, h, w, ci))
    f = b.op("f", "ReadVariableOp", fixed_bytes=k * k * ci * co * 4, shape=(k, k, ci, co))
    dy = b.op("dy", "Placeholder", per_sample_bytes=h * w * co * 4, shape=(None, h, w, co))
    s = b.op("sizes", "Const", fixed_bytes=16, shape=(4,), dtype="int32")
    b.op("gf", "Conv2DBackpropFilter", x, s, dy, fixed_bytes=k * k * ci * co * 4, shape=(k, k, ci, co),
         role=Role.BACKWARD)
    b.op("gi", "Conv2DBackpropInput", s, f, dy, per_sample_bytes=h * w * ci * 4, shape=(None, h, w, ci),
         role=Role.BACKWARD)
    b.op("pool", "MaxPool", x, per_sample_bytes=h * w * ci, shape=(None, h // 2, w // 2, ci))
    b.op("pool_grad", "MaxPoolGrad", x, "pool:0", "pool:0", per_sample_bytes=h * w * ci * 4,
         shape=(None, h, w, ci), role=Role.BACKWARD)
    return b.build()


def test_conv_gradient_scratch_follows_tf_cpu_kernels():
    g = _conv_grads()
    # filter gradient: P=1024 positions, F=576, Co=64 -> work 692,224 elements per image;
    # ceil(30 MiB / 4 / work) = 12 images of P*F floats (seen in a TF profile: [12,1024,576])
    assert op_temporary(g, g.ops["gf"], CPU_TEMPORARIES) == (12 * 1024 * 576 * 4, 0.0)
    # input gradient: one image's patch matrix
    assert op_temporary(g, g.ops["gi"], CPU_TEMPORARIES) == (1024 * 576 * 4, 0.0)
    # max-pool gradient: a copy of the pooled output and an int64 argmax: 3x it per sample
    assert op_temporary(g, g.ops["pool_grad"], CPU_TEMPORARIES) == (0.0, 3 * 32 * 32 * 64)
    assert op_temporary(g, g.ops["gf"], NO_TEMPORARIES) == (0.0, 0.0)


def test_the_emulated_device_simulates_onednn_kernels_whose_conv_gradients_take_no_patch_buffer():
    """The CPU profile is the emulated device, whose workers run oneDNN: no Eigen patch buffers."""
    from lms.machine.devices import get_device
    from lms.sim.costs import ONEDNN_TEMPORARIES
    from lms.sim.interpreter import default_temporaries

    g = _conv_grads()
    assert default_temporaries(get_device("cpu")) is ONEDNN_TEMPORARIES is default_temporaries(None)
    for op in ("gf", "gi", "pool_grad"):
        assert op_temporary(g, g.ops[op], ONEDNN_TEMPORARIES) == (0.0, 0.0)
    assert ONEDNN_TEMPORARIES.copy_on_write  # a variable updated while still read is copied, as with Eigen


def test_flops_of_convolutions_and_matmuls():
    g = _conv_grads()
    per_sample = 2 * 32 * 32 * 64 * (3 * 3 * 64)
    assert op_flops(g, g.ops["gf"]) == (0.0, per_sample)
    assert op_flops(g, g.ops["gi"]) == (0.0, per_sample)
    assert op_flops(g, g.ops["pool_grad"]) is None  # memory-bound
    b = GraphBuilder(batch_size=8)
    x = b.op("x", "Placeholder", per_sample_bytes=32 * 4, shape=(None, 32))
    w = b.op("w", "ReadVariableOp", fixed_bytes=32 * 10 * 4, shape=(32, 10))
    b.op("mm", "MatMul", x, w, per_sample_bytes=10 * 4, shape=(None, 10))
    g2 = b.build()
    assert op_flops(g2, g2.ops["mm"]) == pytest.approx((0.0, 2 * 10 * 32))


def test_temporary_rule_validates_its_basis():
    with pytest.raises(ValueError, match="basis='weird'"):
        TemporaryRule(1.0, "weird")
    with pytest.raises(ValueError, match="working_set"):
        TemporaryRule(1.0, "conv_filter_col")


# ---- time model --------------------------------------------------------------------------------
def test_roofline_time_of_a_memory_bound_chain():
    dev = fast_link()
    g = chain(4)
    r = sim(g, batch=1, device=dev)
    # each Relu / ReluGrad moves its inputs and output; Fill, Sum likewise; no swaps, no stalls
    moved = 0
    for op in g.ops.values():
        if op.type in ("Placeholder",):
            continue
        moved += sum(g.tensor_bytes(t, 1) for t in (*dict.fromkeys(op.inputs), *op.outputs))
    assert r.compute_time_s == pytest.approx(moved / (dev.mem_bandwidth * dev.memory_efficiency))
    assert r.step_time_s == pytest.approx(r.compute_time_s) and r.stall_time_s == 0


def test_measured_op_costs_replace_the_roofline_and_scale_with_the_batch():
    g = chain(3)
    costs = {name: 0.001 for name in g.ops}
    r = sim(g, batch=4, op_costs=costs)
    assert r.compute_time_s == pytest.approx(0.001 * len(g.ops))
    r8 = sim(g, batch=8, op_costs=costs, op_costs_batch=4)
    assert r8.compute_time_s == pytest.approx(0.002 * len(g.ops))
    assert r8.throughput == pytest.approx(8 / r8.step_time_s)


def test_a_slow_link_stalls_the_backward_pass_and_holds_memory_longer():
    g = chain(8)
    plan = plan_swaps(g, LMSConfig(lb=1))
    fast = sim(g, plan, batch=4, device=fast_link(link=1e15))
    slow = sim(g, plan, batch=4, device=fast_link(link=1e8))
    assert fast.stall_time_s < 1e-3 * fast.compute_time_s  # only the copy itself, nanoseconds
    assert fast.step_time_s == pytest.approx(fast.compute_time_s, rel=1e-3)
    assert slow.compute_time_s == pytest.approx(fast.compute_time_s)
    assert slow.stall_time_s > 10 * fast.compute_time_s
    assert slow.step_time_s >= slow.compute_time_s + slow.stall_time_s - 1e-12
    # device copies stay until their device->host copy finished
    assert slow.peak_device_bytes > fast.peak_device_bytes == 3 * MiB * 4
    # with a fast link the memory is the order-only model's
    assert fast.peak_device_bytes == sim(g, plan, batch=4).peak_device_bytes


def test_device_names_are_accepted():
    g = chain(3)
    assert sim(g, batch=1, device="v100-16gb").step_time_s == sim(g, batch=1, device=get_device("V100-16GB")).step_time_s


# ---- timeline ------------------------------------------------------------------------------------
def test_timeline_is_consistent_with_the_result():
    g = residual(3)
    plan = plan_swaps(g, LMSConfig(lb=2))
    r = sim(g, plan, batch=2, device="V100-16GB")
    tl = r.timeline
    rewritten = rewrite_graph(g, plan)
    assert len(tl) == len(rewritten.ops)
    assert max(tl.device_bytes) == r.peak_device_bytes == tl.device_bytes[r.peak_index]
    assert tl.op_names[r.peak_index] == r.peak_op
    assert list(tl.start_s) == sorted(tl.start_s)
    outs = {e.tensor: e for e in tl.events if e.kind == "swap_out"}
    ins = [e for e in tl.events if e.kind == "swap_in"]
    assert len(outs) == plan.n_swapped and len(ins) == plan.n_swap_ins
    for e in ins:
        out = outs[e.tensor]
        assert out.index < e.index and out.end_s <= e.start_s + 1e-12
        assert e.bytes == out.bytes == g.tensor_bytes(e.tensor, 2)
    assert sum(e.bytes for e in tl.events if e.kind in ("swap_in", "swap_out")) == r.transfer_bytes
    assert sum(e.end_s - e.start_s for e in tl.events if e.kind == "stall") == pytest.approx(r.stall_time_s)
    kinds = {e.kind: e for e in tl.events}
    assert kinds["forward_end"].index == tl.forward_end_index
    assert tl.roles[tl.backward_start_index] == "backward"
    json.dumps(r.to_dict(timeline=True))  # plain data
    # the compiled graph the run simulated, its ops in the timeline's order
    assert r.compiled is not None and list(r.compiled.op_names) == list(tl.op_names)


def test_timeline_can_be_skipped():
    r = sim(chain(3), batch=1, timeline=False)
    assert r.timeline is None and r.compiled is None and r.feasible(r.peak_device_bytes) and not r.feasible(r.peak_device_bytes - 1)


def test_batch_must_be_a_positive_int():
    with pytest.raises(ValueError, match="batch=0"):
        sim(chain(3), batch=0)


# ---- max_batch -----------------------------------------------------------------------------------
@pytest.mark.parametrize("budget_mib,expected", [(10, 1), (100, 11), (1000, 111), (4096, 455)])
def test_max_batch_is_exact_on_an_affine_peak(budget_mib, expected):
    g = chain(8)  # peak(batch) = 9 MiB * batch + 256
    m = max_batch(g, None, budget_mib * MiB, temporaries=NO_TEMPORARIES)
    assert m.batch == expected == (budget_mib * MiB - LOSS) // (9 * MiB)
    assert m.peak_bytes == 9 * MiB * expected + LOSS <= m.budget_bytes
    assert sim(g, batch=expected + 1).peak_device_bytes > budget_mib * MiB
    assert m.n_simulations < 30 and not m.capped


def test_max_batch_with_swapping_and_resident_bytes():
    g = chain(8)
    m = max_batch(g, LMSConfig(lb=1), 100 * MiB, temporaries=NO_TEMPORARIES, resident_bytes=10 * MiB)
    assert m.batch == (90 * MiB) // (3 * MiB) == 30 and m.n_swapped == 7


def test_max_batch_stops_at_the_limit_when_nothing_grows_with_the_batch():
    b = GraphBuilder()
    x = b.op("x", "Placeholder", fixed_bytes=MiB)
    b.op("y", "Conv2D", x, fixed_bytes=MiB)
    m = max_batch(b.build(), None, 10 * MiB, limit=1000)
    assert m.batch == 1000 and m.capped


def test_max_batch_is_zero_when_only_more_swapping_would_fit():
    g = chain(8)
    m = max_batch(g, None, 5 * MiB, temporaries=NO_TEMPORARIES)  # no LMS needs 9 MiB, all-swapped 3 MiB
    assert m.batch == 0 and m.peak_bytes == 9 * MiB + LOSS


def test_infeasible_budget_names_the_minimum():
    g = chain(8)
    with pytest.raises(InfeasibleBudget) as info:
        max_batch(g, LMSConfig(n_tensors=2), 2 * MiB, temporaries=NO_TEMPORARIES)
    err = info.value
    assert isinstance(err, ValueError)
    assert err.min_bytes == 3 * MiB and err.budget_bytes == 2 * MiB
    assert "3145728 bytes" in str(err) and "every candidate tensor swapped" in str(err)


def test_max_batch_rejects_bad_arguments():
    with pytest.raises(ValueError, match="budget_bytes=0"):
        max_batch(chain(3), None, 0)
    with pytest.raises(TypeError, match="LMSConfig"):
        max_batch(chain(3), {"n_tensors": 1}, MiB)


def test_max_batch_on_a_large_graph_is_fast():
    import time

    g = residual(400)  # about 4,400 ops
    t0 = time.perf_counter()
    m = max_batch(g, LMSConfig(n_tensors=100, lb=3), 16 << 30, device="V100-16GB")
    assert time.perf_counter() - t0 < 2.0
    assert m.batch >= 1


# ---- against TensorFlow (slow: a measurement subprocess per case) ---------------------------------
@pytest.mark.slow
@pytest.mark.tf
@pytest.mark.parametrize("model,options,config,bound", [
    ("cnn_bn", {"image_size": 32, "filters": 16}, None, 0.06),
    ("cnn_bn", {"image_size": 32, "filters": 16}, {"n_tensors": -1, "lb": 2}, 0.12),
    ("residual", {"image_size": 32, "filters": 16, "n_blocks": 2}, {"n_tensors": -1, "lb": 1}, 0.12),
], ids=["no_lms", "emulated_swap", "residual_swap"])
def test_simulated_peak_tracks_the_tensorflow_cpu_peak(tmp_path, model, options, config, bound):
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed")
    from benchmarks.simulator_accuracy import compare, load_graph, measure

    spec = {"model": model, "options": options, "batch": 8, "config": config, "inter_op": 1,
            "executor": "single_threaded"}
    record = measure(spec, tmp_path, remeasure=True, timeout=600)
    assert record is not None, "the measurement subprocess failed"
    row = compare([record], load_graph(tmp_path, record))
    assert row["order"] == "single_threaded"
    # the allocator replay against TF's single-threaded executor (a fixed order, modelled); a
    # little looser than the benchmark's targets (5% / 10%) so that noise does not fail the suite
    assert abs(row["bfc_error"]) <= bound, row
    assert row["measured_peak_bytes"] > row["resident_bytes"]


def test_bfc_adjusted_batch_is_the_largest_batch_whose_replayed_peak_fits():
    from lms.simulator import bfc_adjusted_batch, simulate
    from tests.synthetic import chain

    g = chain(6)

    def bfc(b):
        return simulate(g, None, batch=b, timeline=False, allocator="bfc").peak_device_bytes

    budget = (bfc(20) + bfc(21)) // 2
    out = bfc_adjusted_batch(g, None, 40, budget)
    assert out["batch"] == 20 and out["bfc_peak_bytes"] == bfc(20) <= budget < bfc(21)
    assert bfc_adjusted_batch(g, None, 15, budget)["batch"] == 15  # already fits: unchanged
    assert bfc_adjusted_batch(g, None, 40, bfc(1) - 1)["batch"] == 0
