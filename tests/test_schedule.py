"""The scheduling pass (`lms.schedule`) on synthetic graphs: valid orders, lower peaks, minimal pins. No TF."""

from __future__ import annotations

import pytest

from lms import LMSConfig, plan_swaps
from lms.graph import GraphBuilder, Role
from lms.plan import SWAP_IN_TYPE, rewrite_graph
from lms.plan.anchor import pinnable_ops, trigger_ops
from lms.rules import merged_pairs
from lms.schedule import (EXECUTOR_KINDS, Schedule, ScheduleError, anchor_edges, merge_edges, order_peak, pin_graph,
                          resource_edges, resource_order_edges,
                          schedule_ops)
from lms.sim.interpreter import compiled_for
from lms.order import executed_order
from lms.simulator import NO_TEMPORARIES, simulate
from tests.synthetic import MiB, chain, diamond, residual

GRAPHS = [pytest.param(lambda: chain(6), id="chain6"), pytest.param(diamond, id="diamond"),
          pytest.param(lambda: residual(2), id="residual2"), pytest.param(lambda: residual(4), id="residual4")]


def two_branches(width: int = 3):
    """x -> a_i (branch A) and b_i (branch B), joined by an add; each backward op makes a full-size temporary."""
    b = GraphBuilder(batch_size=1, name="two_branches")
    b.op("x", "Placeholder", per_sample_bytes=MiB)
    prev_a, prev_b = "x:0", "x:0"
    for i in range(width):
        prev_a = b.op(f"a{i}", "Relu", prev_a, per_sample_bytes=MiB)
        prev_b = b.op(f"b{i}", "Tanh", prev_b, per_sample_bytes=MiB)
    b.op("join", "AddV2", prev_a, prev_b, per_sample_bytes=MiB)
    b.op("loss", "Sum", "join:0", shape=(), fixed_bytes=4)
    g = b.op("gradient_tape/loss/Fill", "Fill", "loss:0", role=Role.BACKWARD, grad_of="loss", per_sample_bytes=MiB)
    ga = gb = g
    for i in reversed(range(width)):
        # two full-size ops per layer and branch: a temporary, then the input gradient
        t = b.op(f"gradient_tape/a{i}/tmp", "Mul", ga, f"a{i}:0", role=Role.BACKWARD, grad_of=f"a{i}",
                 per_sample_bytes=MiB)
        ga = b.op(f"gradient_tape/a{i}/Grad", "ReluGrad", t, f"a{i}:0", role=Role.BACKWARD, grad_of=f"a{i}",
                  per_sample_bytes=MiB)
        t = b.op(f"gradient_tape/b{i}/tmp", "Mul", gb, f"b{i}:0", role=Role.BACKWARD, grad_of=f"b{i}",
                 per_sample_bytes=MiB)
        gb = b.op(f"gradient_tape/b{i}/Grad", "TanhGrad", t, f"b{i}:0", role=Role.BACKWARD, grad_of=f"b{i}",
                  per_sample_bytes=MiB)
    b.op("gradient_tape/x/AddN", "AddN", ga, gb, role=Role.BACKWARD, grad_of="x", per_sample_bytes=MiB)
    return b.build()


@pytest.mark.parametrize("make", GRAPHS)
@pytest.mark.parametrize("n_tensors", [0, -1])
def test_memory_schedule_is_a_valid_order_of_the_rewritten_graph(make, n_tensors):
    graph = make()
    plan = plan_swaps(graph, LMSConfig(n_tensors=n_tensors, schedule="memory"))
    sched = schedule_ops(graph, plan)
    rewritten = rewrite_graph(graph, plan) if plan.swaps else graph
    sched.validate(rewritten)  # also done inside; raises on a problem
    assert sched.kind == "memory" and sorted(sched.order) == sorted(rewritten.ops)
    pos = {n: i for i, n in enumerate(sched.order)}
    for op in rewritten.ops.values():
        assert all(pos[p] < pos[op.name] for p in rewritten.predecessors(op.name))
    assert sched.chosen in sched.candidates
    assert sched.candidates[sched.chosen] == min(sched.candidates.values())


@pytest.mark.parametrize("make", GRAPHS + [pytest.param(two_branches, id="two_branches")])
@pytest.mark.parametrize("n_tensors", [0, -1])
def test_memory_schedule_peak_is_never_above_tf_executor_order(make, n_tensors):
    graph = make()
    tf_order = simulate(graph, LMSConfig(n_tensors=n_tensors), batch=8, temporaries=NO_TEMPORARIES)
    memory = simulate(graph, LMSConfig(n_tensors=n_tensors, schedule="memory"), batch=8,
                      temporaries=NO_TEMPORARIES)
    # The pass ranks candidates with its own liveness model (no in-place forwarding, no 256-byte rounding
    # of tiny tensors), so on a tie it may pick an order the simulator rates a few hundred bytes higher.
    assert memory.peak_device_bytes <= tf_order.peak_device_bytes + 1024


def test_memory_schedule_runs_one_branch_backward_before_the_other():
    graph = two_branches(3)
    sched = schedule_ops(graph, plan_swaps(graph, LMSConfig(n_tensors=0, schedule="memory")))
    backward = [n for n in sched.order if n.startswith("gradient_tape/") and n[14] in "ab"]
    branches = [n[14] for n in backward]
    # all of one branch, then all of the other: exactly one switch
    assert sum(1 for x, y in zip(branches, branches[1:]) if x != y) == 1
    # the executor model interleaves them (FIFO per op): more live temporaries at once
    tf_peak = simulate(graph, None, batch=1, temporaries=NO_TEMPORARIES).peak_device_bytes
    mem_peak = simulate(graph, LMSConfig(n_tensors=0, schedule="memory"), batch=1,
                        temporaries=NO_TEMPORARIES).peak_device_bytes
    assert mem_peak <= tf_peak


def test_swap_ins_are_placed_just_in_time_and_lb_moves_them_earlier():
    graph = chain(8)
    for lb, lead in ((1, 0), (3, 2)):
        plan = plan_swaps(graph, LMSConfig(n_tensors=-1, lb=lb, schedule="memory"))
        assert all(si.trigger is None for s in plan.swaps for si in s.swap_ins)  # the schedule places them
        sched = schedule_ops(graph, plan)
        rewritten = rewrite_graph(graph, plan)
        pos = {n: i for i, n in enumerate(sched.order)}
        gaps = []
        for op in rewritten.ops.values():
            if op.type == SWAP_IN_TYPE:
                first = min(pos[c] for c in rewritten.consumers(op.outputs[0]))
                between = sched.order[pos[op.name] + 1:first]
                # just in time: at most the reader's other input and other swap-ins in between, plus the lead
                gaps.append(sum(rewritten.ops[n].type != SWAP_IN_TYPE for n in between))
        assert gaps and max(gaps) <= lead + 1
        if lead == 0:
            assert set(gaps) <= {0, 1}


def _all_swapped_memory_schedule(graph):
    """(schedule, rewritten graph, pinnable ops, trigger ops) of ``n_tensors=-1, schedule="memory"``."""
    plan = plan_swaps(graph, LMSConfig(n_tensors=-1, schedule="memory"))
    rewritten = rewrite_graph(graph, plan)
    pinnable = pinnable_ops(rewritten)
    return schedule_ops(graph, plan), rewritten, pinnable, trigger_ops(rewritten, pinnable=pinnable)


@pytest.mark.parametrize("make", GRAPHS + [pytest.param(two_branches, id="two_branches")])
def test_pins_are_few_join_pinnable_ops_and_score_the_order_the_executor_runs(make):
    graph = make()
    sched, rewritten, pinnable, triggers = _all_swapped_memory_schedule(graph)
    assert all((a in pinnable or (a in triggers and rewritten.ops[b].type == SWAP_IN_TYPE)) and b in pinnable
               for a, b in sched.pins)
    pos = {n: i for i, n in enumerate(sched.order)}
    assert all(pos[a] < pos[b] for a, b in sched.pins)
    chained = {n for e in sched.pins for n in e}
    assert len(sched.pins) < max(len(chained), 1)  # a chain, not a clique
    # the score is the peak of what TF's executor models run with these pins, not of the order asked for
    pinned = pin_graph(rewritten, sched.edges + merge_edges(rewritten))
    executed = max(order_peak(pinned, executed_order(pinned, kind), batch=sched.batch) for kind in EXECUTOR_KINDS)
    assert sched.batch >= graph.batch_size
    assert executed == sched.candidates[sched.chosen] == min(sched.candidates.values())
    assert sched.candidates[sched.chosen] <= sched.candidates["tf"]


def bn_like(width: int = 3):
    """A chain of Tanh whose backward does BatchNorm-like arithmetic: a full-size Mul with two readers."""
    b = GraphBuilder(batch_size=1, name="bn_like")
    b.op("x", "Placeholder", per_sample_bytes=MiB)
    prev = "x:0"
    for i in range(width):
        prev = b.op(f"f{i}", "Tanh", prev, per_sample_bytes=MiB)
    b.op("loss", "Sum", prev, shape=(), fixed_bytes=4)
    g = b.op("gradient_tape/loss/Fill", "Fill", "loss:0", role=Role.BACKWARD, grad_of="loss", per_sample_bytes=MiB)
    for i in reversed(range(width)):
        m = b.op(f"gradient_tape/f{i}/Mul", "Mul", g, f"f{i}:0", role=Role.BACKWARD, grad_of=f"f{i}",
                 per_sample_bytes=MiB)
        s = b.op(f"gradient_tape/f{i}/Sum", "Sum", m, role=Role.BACKWARD, grad_of=f"f{i}", fixed_bytes=4)
        n = b.op(f"gradient_tape/f{i}/Neg", "Neg", m, role=Role.BACKWARD, grad_of=f"f{i}", per_sample_bytes=MiB)
        g = b.op(f"gradient_tape/f{i}/TanhGrad", "TanhGrad", n, f"f{i - 1}:0" if i else "x:0", s,
                 role=Role.BACKWARD, grad_of=f"f{i}", per_sample_bytes=MiB)
    return b.build()


def test_swap_ins_are_pinned_behind_the_last_op_that_may_trigger_them():
    graph = bn_like()
    sched, rewritten, pinnable, triggers = _all_swapped_memory_schedule(graph)
    # a Mul with two readers can never be an inner node of a fusion: it may drive a control edge, not take one
    assert {"gradient_tape/f1/Mul", "gradient_tape/f2/Mul"} <= triggers - pinnable
    assert "gradient_tape/f1/Neg" not in triggers and "gradient_tape/f1/Sum" not in triggers  # one reader each
    trigger_pins = [(a, b) for a, b in sched.pins if a not in pinnable]
    assert ("gradient_tape/f2/Mul", "f1-lms_swap_in_0_0") in trigger_pins
    assert all(a in triggers and rewritten.ops[b].type == SWAP_IN_TYPE for a, b in trigger_pins)
    pos = {n: i for i, n in enumerate(sched.order)}
    for a, b in trigger_pins:  # the last trigger op before the swap-in in the chosen order
        between = sched.order[pos[a] + 1:pos[b]]
        assert not set(between) & triggers, (a, b, between)
    # the same edge from an op with one reader (a fusion's inner node) is refused
    bad = Schedule(kind="tf", pins=(("gradient_tape/f1/Neg", "f0-lms_swap_in_0_0"),))
    with pytest.raises(ScheduleError, match="not pinnable"):
        bad.validate(rewritten)


def early_broadcast():
    """A backward BroadcastTo of a scalar (1 MiB out of 4 bytes) that is ready long before its only reader."""
    b = GraphBuilder(batch_size=1, name="early_broadcast")
    b.op("x", "Placeholder", per_sample_bytes=MiB)
    b.op("f", "Tanh", "x:0", per_sample_bytes=MiB)
    b.op("loss", "Sum", "f:0", shape=(), fixed_bytes=4)
    g = b.op("gradient_tape/Fill", "Fill", "loss:0", role=Role.BACKWARD, per_sample_bytes=MiB)
    small = b.op("gradient_tape/mean", "Sum", g, role=Role.BACKWARD, fixed_bytes=4)
    wide = b.op("gradient_tape/BroadcastTo", "BroadcastTo", small, role=Role.BACKWARD, per_sample_bytes=MiB)
    prev = g
    for i in range(4):
        prev = b.op(f"gradient_tape/c{i}", "TanhGrad", prev, "f:0", role=Role.BACKWARD, per_sample_bytes=MiB)
    b.op("gradient_tape/AddN", "AddN", wide, prev, role=Role.BACKWARD, per_sample_bytes=MiB)
    return b.build()


def test_sink_runs_an_op_that_only_adds_memory_just_before_its_reader():
    from lms.schedule.candidate_orders import sink
    from lms.schedule.models import buffer_model

    graph = early_broadcast()
    m = buffer_model(graph, 8)
    early = [m.index[n] for n in ("x", "f", "loss", "gradient_tape/Fill", "gradient_tape/mean",
                                  "gradient_tape/BroadcastTo", "gradient_tape/c0", "gradient_tape/c1",
                                  "gradient_tape/c2", "gradient_tape/c3", "gradient_tape/AddN")]
    sunk = [m.names[i] for i in sink(m, early)]
    # the BroadcastTo (and nothing that frees memory) moved to just before its reader
    assert sunk == ["x", "f", "loss", "gradient_tape/Fill", "gradient_tape/mean", "gradient_tape/c0",
                    "gradient_tape/c1", "gradient_tape/c2", "gradient_tape/c3", "gradient_tape/BroadcastTo",
                    "gradient_tape/AddN"]
    before = order_peak(graph, [m.names[i] for i in early], batch=8)
    assert before - order_peak(graph, sunk, batch=8) > 7 * MiB  # one 8 MiB tensor (at batch 8) less at the peak
    # the pass offers the sunk order as a candidate; it never scores worse than the plain list order
    sched = schedule_ops(graph, plan_swaps(graph, LMSConfig(n_tensors=0, schedule="memory")))
    assert sched.candidates["list_lifo_sunk"] <= sched.candidates["list_lifo"]


def test_simulator_runs_the_executor_model_over_the_pinned_graph():
    graph = residual(3)
    config = LMSConfig(n_tensors=-1, schedule="memory")
    plan = plan_swaps(graph, config)
    sched = schedule_ops(graph, plan)
    cg = compiled_for(graph, plan, temporaries=NO_TEMPORARIES)
    pos = {n: i for i, n in enumerate(cg.op_names)}
    assert sched.pins and all(pos[a] < pos[b] for a, b in sched.pins if a in pos and b in pos)


def fused_block():
    """x -> Conv2D -> BiasAdd -> Relu -> loss, and its backward with Conv2DBackpropFilter + BiasAddGrad siblings."""
    b = GraphBuilder(batch_size=2, name="fused_block")
    b.op("x", "Placeholder", per_sample_bytes=MiB)
    b.op("w", "ReadVariableOp", fixed_bytes=4096)
    b.op("conv", "Conv2D", "x:0", "w:0", per_sample_bytes=MiB)
    b.op("bias", "BiasAdd", "conv:0", per_sample_bytes=MiB)
    b.op("relu", "Relu", "bias:0", per_sample_bytes=MiB)
    b.op("loss", "Sum", "relu:0", shape=(), fixed_bytes=4)
    b.op("gradient_tape/loss/Fill", "Fill", "loss:0", role=Role.BACKWARD, grad_of="loss", per_sample_bytes=MiB)
    b.op("gradient_tape/relu/ReluGrad", "ReluGrad", "gradient_tape/loss/Fill:0", "relu:0", role=Role.BACKWARD,
         grad_of="relu", per_sample_bytes=MiB)
    b.op("gradient_tape/bias/BiasAddGrad", "BiasAddGrad", "gradient_tape/relu/ReluGrad:0", role=Role.BACKWARD,
         grad_of="bias", fixed_bytes=64)
    b.op("gradient_tape/conv/Conv2DBackpropFilter", "Conv2DBackpropFilter", "x:0",
         "gradient_tape/relu/ReluGrad:0", role=Role.BACKWARD, grad_of="conv", fixed_bytes=4096)
    b.op("gradient_tape/conv/Conv2DBackpropInput", "Conv2DBackpropInput", "w:0", "gradient_tape/relu/ReluGrad:0",
         role=Role.BACKWARD, grad_of="conv", per_sample_bytes=MiB)
    b.op("sgd/mul", "Mul", "gradient_tape/bias/BiasAddGrad:0", role=Role.OTHER, fixed_bytes=64)
    b.op("sgd/Assign", "AssignVariableOp", "sgd/mul:0", role=Role.OTHER, n_outputs=0)
    b.op("gradient_tape/x/use", "Tanh", "gradient_tape/conv/Conv2DBackpropInput:0", role=Role.BACKWARD,
         per_sample_bytes=MiB)
    return b.build()


def test_ops_grappler_or_onednn_rewrite_are_not_pinnable():
    graph = fused_block()
    pinnable = pinnable_ops(graph)
    # the fused forward kernel, identities/reads, and oneDNN's merged Conv2DBackpropFilter+BiasAddGrad
    for name in ("conv", "bias", "relu", "w", "sgd/mul", "gradient_tape/bias/BiasAddGrad",
                 "gradient_tape/conv/Conv2DBackpropFilter", "x"):
        assert name not in pinnable, name
    assert {"gradient_tape/relu/ReluGrad", "gradient_tape/conv/Conv2DBackpropInput", "sgd/Assign"} <= pinnable
    assert merged_pairs(graph) == (("gradient_tape/conv/Conv2DBackpropFilter", "gradient_tape/bias/BiasAddGrad"),)


def test_edges_between_unpinnable_ops_are_anchored_on_pinnable_neighbours_or_dropped():
    graph = fused_block()
    pinnable = pinnable_ops(graph)
    # (bias) before (sgd/mul): from bias's nearest pinnable ancestor -- none (x, w are sources) -> dropped
    anchored, dropped = anchor_edges(graph, [("bias", "sgd/mul")], pinnable)
    assert anchored == () and dropped == (("bias", "sgd/mul"),)
    # BiasAddGrad before Conv2DBackpropInput: from ReluGrad (its pinnable ancestor); already implied
    anchored, dropped = anchor_edges(graph, [("gradient_tape/bias/BiasAddGrad",
                                               "gradient_tape/conv/Conv2DBackpropInput")], pinnable)
    assert anchored == () and dropped == ()
    # sgd/mul before the input gradient's reader: sgd/mul -> ReluGrad (ancestor), reader -> itself is Tanh,
    # so its nearest pinnable descendant -- none -> dropped
    anchored, dropped = anchor_edges(graph, [("sgd/mul", "gradient_tape/x/use")], pinnable)
    assert dropped == (("sgd/mul", "gradient_tape/x/use"),)
    anchored, dropped = anchor_edges(graph, [("sgd/mul", "gradient_tape/conv/Conv2DBackpropInput")], pinnable)
    assert anchored == () and dropped == ()  # ReluGrad -> Conv2DBackpropInput: the graph already orders it


def test_no_pin_path_runs_between_the_ops_onednn_merges():
    graph = fused_block()
    for config in (LMSConfig(n_tensors=0, schedule="memory"), LMSConfig(n_tensors=-1, schedule="memory"),
                   LMSConfig(n_tensors=-1, schedule="memory", sync_mode=3)):
        plan = plan_swaps(graph, config)
        sched = schedule_ops(graph, plan)
        rewritten = rewrite_graph(graph, plan)
        pinned = pin_graph(rewritten, sched.edges)
        (a, b), = merged_pairs(rewritten)
        assert not pinned.is_ancestor(a, b) and not pinned.is_ancestor(b, a)


def test_tf_schedule_adds_no_pins_and_leaves_the_plan_triggers():
    graph = residual(2)
    plan = plan_swaps(graph, LMSConfig(n_tensors=-1))
    sched = schedule_ops(graph, plan)
    assert sched == Schedule(kind="tf", batch=graph.batch_size, schedule_s=sched.schedule_s)
    assert all(si.trigger is not None for s in plan.swaps for si in s.swap_ins)


def test_serialization_chains_the_ops_of_the_named_levels_in_creation_order():
    graph = two_branches(3)
    level = graph.levels["a0"]
    same = [n for n in graph.ops_by_level[level]]
    assert set(same) == {"a0", "b0"}
    sched = schedule_ops(graph, None, config=LMSConfig(n_tensors=0, serialization=[level]))
    assert sched.constraints == (("a0", "b0"),) and sched.serialized_levels == (level,)
    ranged = schedule_ops(graph, None, config=LMSConfig(n_tensors=0, serialization=[f"{level}:{level + 2}"]))
    assert ranged.constraints == (("a0", "b0"), ("a1", "b1"), ("a2", "b2"))


def test_serialization_by_size_picks_levels_whose_outputs_exceed_the_size():
    graph = two_branches(3)  # batch 1: two 1 MiB outputs per branch level
    sched = schedule_ops(graph, None, config=LMSConfig(n_tensors=0, serialization_by_size=1.5 / 1024))
    assert ("a0", "b0") in sched.constraints and ("a2", "b2") in sched.constraints
    none = schedule_ops(graph, None, config=LMSConfig(n_tensors=0, serialization_by_size=2.5 / 1024))
    assert not any(e in none.constraints for e in (("a0", "b0"), ("a1", "b1")))


def test_sync_mode_1_makes_forward_readers_wait_for_the_swap_out():
    graph = chain(4)
    plan = plan_swaps(graph, LMSConfig(n_tensors=-1, sync_mode=1))
    sched = schedule_ops(graph, plan)
    rewritten = rewrite_graph(graph, plan)
    for s in plan.swaps:
        forward = [r for r in rewritten.data_consumers(s.tensor)
                   if rewritten.ops[r].role is Role.FORWARD and r != s.swap_out]
        for r in forward:
            assert (s.swap_out, r) in sched.constraints


def test_sync_mode_1_stalls_the_forward_pass_on_a_slow_link():
    from lms.machine.devices import DeviceProfile
    slow = DeviceProfile(name="slow", memory_bytes=1 << 40, peak_flops=1e12, mem_bandwidth=1e11,
                         link_bandwidth=1e8, link="slow link", source="test", op_overhead_s=0.0,
                         transfer_latency_s=0.0)
    graph = chain(6)
    free = simulate(graph, LMSConfig(n_tensors=-1), batch=8, device=slow, temporaries=NO_TEMPORARIES)
    sync = simulate(graph, LMSConfig(n_tensors=-1, sync_mode=1), batch=8, device=slow, temporaries=NO_TEMPORARIES)
    assert sync.stall_time_s > free.stall_time_s
    assert sync.peak_device_bytes <= free.peak_device_bytes


def test_sync_mode_2_triggers_each_swap_in_right_before_its_reader():
    graph = chain(6)
    plan = plan_swaps(graph, LMSConfig(n_tensors=-1, lb=3, sync_mode=2))
    sched = schedule_ops(graph, plan)
    rewritten = rewrite_graph(graph, plan)
    pinned = pin_graph(rewritten, sched.edges)
    for s in plan.swaps:
        for si in s.swap_ins:
            first = min(si.consumers, key=pinned.levels.__getitem__)
            triggers = [a for a, b in sched.constraints if b == si.name]
            assert len(triggers) == 1 and triggers[0] in pinned.predecessors(first)


def test_validate_rejects_orders_that_break_a_dependency_or_miss_ops():
    graph = chain(3)
    sched = schedule_ops(graph, None, config=LMSConfig(n_tensors=0, schedule="memory"))
    bad = Schedule(kind="memory", order=tuple(reversed(sched.order)))
    with pytest.raises(ScheduleError, match="before its input"):
        bad.validate(graph)
    with pytest.raises(ScheduleError, match="missing"):
        Schedule(kind="memory", order=sched.order[:-1]).validate(graph)
    with pytest.raises(ScheduleError, match="cycle"):
        Schedule(kind="tf", pins=(("gradient_tape/f1/Grad", "gradient_tape/f2/Grad"),)).validate(graph)
    with pytest.raises(ScheduleError, match="not pinnable"):
        Schedule(kind="tf", pins=(("f0", "gradient_tape/f1/Grad"),)).validate(graph)
    with pytest.raises(ScheduleError, match="unknown op"):
        Schedule(kind="tf", constraints=(("nope", "f0"),)).validate(graph)


def test_resource_order_edges_keep_reads_and_writes_in_program_order():
    accesses = [("r1", "v", False), ("r2", "v", False), ("w1", "v", True), ("r3", "v", False), ("w2", "v", True),
                ("w3", "v", True), ("q", "u", False)]
    assert resource_order_edges(accesses) == (("r1", "w1"), ("r2", "w1"), ("w1", "r3"), ("r3", "w2"), ("w2", "w3"))


def test_memory_schedule_never_reads_a_variable_after_its_update():
    """A late read of a variable would lower the peak (its consumer is small and late), but tf.function's
    automatic control dependencies order the read before the update: the schedule must too."""
    b = GraphBuilder(batch_size=4, name="late_read")
    b.op("x", "Placeholder", per_sample_bytes=MiB)
    b.op("v", "Placeholder", shape=(), dtype="resource", n_outputs=1)
    b.op("w", "ReadVariableOp", "v:0", fixed_bytes=4 * MiB)
    b.op("h", "Relu", "x:0", per_sample_bytes=MiB)
    b.op("pos", "Slice", "w:0", fixed_bytes=4 * MiB)  # read early by creation, consumed only at the end
    b.op("loss", "Sum", "h:0", shape=(), fixed_bytes=4)
    b.op("gradient_tape/h/ReluGrad", "ReluGrad", "loss:0", "h:0", role=Role.BACKWARD, grad_of="h",
         per_sample_bytes=MiB)
    b.op("sgd/Assign", "AssignSubVariableOp", "v:0", "gradient_tape/h/ReluGrad:0", role=Role.OTHER, n_outputs=0)
    b.op("out", "AddV2", "pos:0", "loss:0", role=Role.OTHER, fixed_bytes=4)
    graph = b.build()
    assert resource_edges(graph) == (("w", "sgd/Assign"),)
    sched = schedule_ops(graph, None, config=LMSConfig(n_tensors=0, schedule="memory"))
    pos = {n: i for i, n in enumerate(sched.order)}
    assert pos["w"] < pos["sgd/Assign"]
    pinned = pin_graph(graph, sched.edges + resource_edges(graph))
    pinned.topological_order  # acyclic with the edges tf.function adds


# ---- prefetch="headroom" ---------------------------------------------------------------------

def _reader_gaps(graph, plan, sched):
    """Ops between each swap-in and its first reader in `sched.order`, by swap-in."""
    rewritten = rewrite_graph(graph, plan)
    pos = {n: i for i, n in enumerate(sched.order)}
    return {op.name: min(pos[c] for c in rewritten.consumers(op.outputs[0])) - pos[op.name]
            for op in rewritten.ops.values() if op.type == SWAP_IN_TYPE}


def test_prefetch_moves_swap_ins_earlier_without_raising_the_peak_and_cuts_stalls():
    graph = residual(4)
    late = plan_swaps(graph, LMSConfig(n_tensors=-1, lb=1, schedule="memory"))
    early = plan_swaps(graph, LMSConfig(n_tensors=-1, lb=1, schedule="memory", prefetch="headroom"))
    s_late, s_early = schedule_ops(graph, late), schedule_ops(graph, early)
    assert s_late.prefetch_share == 0.0 and s_early.prefetch_share == 1.0
    assert s_early.summary()["prefetch_share"] == 1.0
    g_late, g_early = _reader_gaps(graph, late, s_late), _reader_gaps(graph, early, s_early)
    assert g_late.keys() == g_early.keys()
    assert all(g_early[n] >= g_late[n] for n in g_late)
    assert sum(g_early.values()) > sum(g_late.values())
    # what the simulator runs (TF's executor model over the pinned graph): the same peak (the 3 GiB of
    # activations, give or take a scalar live elsewhere), shorter stalls
    r_late = simulate(graph, late, batch=512, device="P100-16GB")
    r_early = simulate(graph, early, batch=512, device="P100-16GB")
    assert r_late.peak_device_bytes == 3072 * MiB
    assert 0 <= r_early.peak_device_bytes - r_late.peak_device_bytes <= 4096
    assert r_early.stall_time_s < 0.95 * r_late.stall_time_s
    assert r_early.transfer_bytes == r_late.transfer_bytes


@pytest.mark.parametrize("make", GRAPHS + [pytest.param(two_branches, id="two_branches")])
def test_prefetch_never_raises_the_peak_of_the_orders_tf_runs(make):
    from lms.schedule.candidate_orders import PREFETCH_DOMINANCE
    from lms.schedule import scoring_batch  # the batch the pass checks at
    graph = make()
    plans = [plan_swaps(graph, LMSConfig(n_tensors=-1, lb=2, schedule="memory", prefetch=p))
             for p in ("lb", "headroom")]
    batch = scoring_batch(graph, dominance=PREFETCH_DOMINANCE)
    peaks = []
    for plan in plans:
        sched = schedule_ops(graph, plan)  # validated: topological, pins only where allowed
        pinned = pin_graph(rewrite_graph(graph, plan), sched.pins)
        peaks.append([order_peak(pinned, executed_order(pinned, kind), batch=batch) for kind in EXECUTOR_KINDS])
    assert all(e <= lb for e, lb in zip(peaks[1], peaks[0]))


def test_prefetch_keeps_swap_ins_behind_their_trigger_and_swap_out():
    graph = residual(4)
    plan = plan_swaps(graph, LMSConfig(n_tensors=-1, lb=3, schedule="memory", prefetch="headroom"))
    sched = schedule_ops(graph, plan)
    rewritten = rewrite_graph(graph, plan)
    pos = {n: i for i, n in enumerate(sched.order)}
    swap_ins = [op for op in rewritten.ops.values() if op.type == SWAP_IN_TYPE]
    assert swap_ins and sched.prefetch_share > 0
    for op in swap_ins:
        assert all(pos[p] < pos[op.name] for p in rewritten.predecessors(op.name))
    ordered = sorted(swap_ins, key=lambda op: pos[op.name])  # copies keep the order their readers need them in
    first_reader = [min(pos[c] for c in rewritten.consumers(op.outputs[0])) for op in ordered]
    assert first_reader == sorted(first_reader)
