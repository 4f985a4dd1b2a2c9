"""Recompute planning (keep / swap / recompute) on synthetic graphs; no TensorFlow."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lms import LMSConfig, PlanError, Role, plan_swaps, rewrite_graph
from lms.optypes import RECOMPUTABLE_TYPES
from lms.plan.recompute import Clone, RecomputePlan, gate_op_name, is_gate_op_name, is_recompute_op_name, recompute_op_name
from lms.plan import plan_recompute
from lms.simulator import simulate
from tests.synthetic import MiB, bn_relu_blocks, chain, residual, training_graph

CHEAP = LMSConfig(recompute="cheap")


@pytest.mark.parametrize("blocks", [1, 3, 6])
def test_relu_after_batchnorm_is_recomputed_from_the_saved_biasadd(blocks):
    g = bn_relu_blocks(blocks)
    plan = plan_swaps(g, CHEAP)
    rewritten = plan.validate(g)
    rp = plan.recompute
    assert rp.tensors == tuple(f"block{i}/relu:0" for i in range(blocks))
    assert rp.recomputed_bytes == blocks * 4 * MiB  # batch 4, 1 MiB per sample each
    for r in rp.recomputes:
        i = r.tensor.split("/")[0]
        assert [c.op for c in r.clones] == [f"{i}/bn/mul_1", f"{i}/bn/add_1", f"{i}/relu"]
        assert set(r.sources) == {f"{i}/BiasAdd:0", f"{i}/bn/scale:0", f"{i}/bn/shift:0"}
        k = int(i[len("block"):])
        expected = {f"gradient_tape/{i}/ReluGrad"}
        if k + 1 < blocks:  # the next conv's filter gradient reads it too
            expected.add(f"gradient_tape/block{k + 1}/Conv2DBackpropFilter")
        assert set(r.consumers) == expected
        # the consumers read the last clone's output, not the original
        for c in r.consumers:
            assert r.output in rewritten.ops[c].inputs and r.tensor not in rewritten.ops[c].inputs
        assert r.output == f"{i}/relu-lms_recompute_{i}_relu_0_0:0" and is_recompute_op_name(r.output)
        assert [c.name for c in r.clones] == [f"{c.op}-lms_recompute_{i}_relu_0_0" for c in r.clones]
        # the chain's first clone reads its sources through gates that wait for the trigger; the
        # clones themselves carry no control edge (Grappler must see them as it sees the originals)
        (gate,) = r.gates  # constants need no gate
        assert gate.tensor == f"{i}/BiasAdd:0" and gate.control_inputs == (r.trigger,)
        assert gate.name == f"{i}/BiasAdd-lms_gate_{i}_relu_0_0" and is_gate_op_name(gate.name)
        assert r.clones[0].inputs == (gate.output, f"{i}/bn/scale:0")
        assert not any(c.control_inputs for c in r.clones)
        for gate in r.gates:
            assert rewritten.ops[gate.name].type == "Identity" and rewritten.ops[gate.name].role is Role.BACKWARD
        assert rewritten.ops[r.trigger].role is Role.BACKWARD
        assert rewritten.is_ancestor(f"{i}/relu", r.trigger)  # after the original
        for c in r.clones:
            assert rewritten.ops[c.name].role is Role.BACKWARD
            assert rewritten.ops[c.name].type in RECOMPUTABLE_TYPES
            assert rewritten.is_ancestor(r.trigger, c.name)
    # the originals no longer have backward readers: nothing keeps them past the forward pass
    for t in rp.tensors:
        assert all(rewritten.ops[c].role is Role.FORWARD for c in rewritten.consumers(t))


def test_fused_sources_are_swapped_in_once_for_the_clones_and_their_gradient():
    g = bn_relu_blocks(4)
    swap_only = plan_swaps(g, LMSConfig())
    both = plan_swaps(g, LMSConfig(recompute="cheap", fuse_swapins=True))
    unfused = plan_swaps(g, CHEAP)
    assert all(len(s.swap_ins) == 2 for s in unfused.swaps)  # one per reader, as TFLMS does
    assert {s.tensor for s in swap_only.swaps} >= {f"block{i}/relu:0" for i in range(4)}
    swapped = {s.tensor: s for s in both.swaps}
    assert not any(t.endswith("relu:0") for t in swapped)
    for i in range(4):
        s = swapped[f"block{i}/BiasAdd:0"]
        # one swap-in serves the clone chain and the BatchNorm gradient right after it
        assert len(s.swap_ins) == 1
        assert set(s.swap_ins[0].consumers) == {f"block{i}/BiasAdd-lms_gate_block{i}_relu_0_0",
                                               f"gradient_tape/block{i}/bn/mul_1/Mul_1"}
    assert both.swapped_bytes < swap_only.swapped_bytes
    assert both.swapped_bytes + both.recomputed_bytes == swap_only.swapped_bytes


def test_simulator_runs_and_times_the_clones_like_any_other_op():
    g = bn_relu_blocks(4)
    swap_only = simulate(g, LMSConfig(), batch=64, device="P100-16GB", timeline=False)
    both = simulate(g, CHEAP, batch=64, device="P100-16GB", timeline=False)
    none = simulate(g, None, batch=64, device="P100-16GB", timeline=False)
    # 4 Relu outputs of 1 MiB per sample no longer cross the link: 4 swap-outs and 7 swap-ins
    # (three are read by the next conv's filter gradient and by their ReluGrad); each BiasAdd
    # output is now swapped in twice: for the clones and for the BatchNorm gradient
    assert (swap_only.n_swap_outs, swap_only.n_swap_ins, both.n_swap_outs, both.n_swap_ins) == (8, 11, 4, 8)
    assert swap_only.transfer_bytes - both.transfer_bytes == (4 + 7 - 4) * 64 * MiB
    # three elementwise clones per block cost compute time
    assert both.compute_time_s > none.compute_time_s == swap_only.compute_time_s
    plan = plan_swaps(g, CHEAP)
    cost = {name: 1.0 for name in g.ops}
    timed = simulate(g, plan, batch=4, op_costs=cost, timeline=False)
    assert timed.compute_time_s == pytest.approx(len(g.ops) + plan.recompute.n_clones)  # clones take their original's time


def test_recompute_alone_lowers_the_peak_without_the_link():
    g = bn_relu_blocks(6)
    none = simulate(g, None, batch=32, timeline=False)
    recompute_only = simulate(g, LMSConfig(n_tensors=0, recompute="cheap"), batch=32, timeline=False)
    assert recompute_only.transfer_bytes == 0
    assert recompute_only.peak_device_bytes < none.peak_device_bytes


def test_dropout_tensors_are_never_recomputed():
    g = bn_relu_blocks(3, dropout=True)
    plan = plan_swaps(g, CHEAP)
    plan.validate(g)
    rp = plan.recompute
    drawn = {t for t in g.tensors if "/dropout/" in t}
    assert not drawn & set(rp.tensors)
    assert not any("/dropout/" in c.op for r in rp.recomputes for c in r.clones)
    assert not any("/dropout/" in s for r in rp.recomputes for s in r.sources)
    reasons = {k.tensor: k.reason for k in rp.skipped}
    assert "random draw" in reasons["block0/dropout/Cast:0"]
    assert reasons["block0/dropout/Cast:0"].startswith("recompute: comes from a random draw")
    assert "random draw" in reasons["block0/dropout/Mul:0"]
    # the mask is saved: swapped like any other tensor, not drawn again
    assert "block0/dropout/Cast:0" in {s.tensor for s in plan.swaps}
    assert rp.tensors == ("block0/relu:0", "block1/relu:0", "block2/relu:0")


def test_a_list_of_types_limits_what_is_cloned():
    g = bn_relu_blocks(2)
    only_relu = plan_recompute(g, LMSConfig(recompute=["Relu"]))
    assert only_relu.n_recomputed == 0
    assert all("AddV2" in k.reason for k in only_relu.skipped if k.tensor.endswith("relu:0"))
    enough = plan_recompute(g, LMSConfig(recompute=["Relu", "AddV2", "Mul"]))
    assert enough.tensors == ("block0/relu:0", "block1/relu:0")


def test_filters_apply_to_recomputed_tensors():
    g = bn_relu_blocks(3)
    plan = plan_recompute(g, LMSConfig(recompute="cheap", excl_scopes=["block1"]))
    assert plan.tensors == ("block0/relu:0", "block2/relu:0")


def _conv_relu_chain(n: int):
    fwd = []
    for i in range(n):
        fwd += [(f"c{i}", "Conv2D", (f"r{i - 1}" if i else "x",)), (f"r{i}", "Relu", (f"c{i}",))]
    return training_graph(fwd, name=f"conv_relu{n}")


@pytest.mark.parametrize("graph", [_conv_relu_chain(3), residual(3)], ids=["chain", "residual"])
def test_relu_chains_recompute_where_the_input_is_saved_anyway(graph):
    plan = plan_swaps(graph, CHEAP)
    rewritten = plan.validate(graph)
    rp = plan.recompute
    assert rp.n_recomputed > 0
    for r in rp.recomputes:
        for s in r.sources:
            assert s not in rp.tensors  # never rebuilt from a rebuilt tensor
    rewritten.lint()
    assert rewrite_graph(graph, plan).ops.keys() == rewritten.ops.keys()


def test_an_op_left_with_one_reader_that_grappler_folds_it_into_is_not_recomputed():
    """Relu -> Relu: without LMS each Relu is read by the next and by its gradient; rebuilt for the
    gradient, the original keeps one reader, and Grappler composes the pair into one
    ``_UnaryOpsComposition`` (issue 33: a ViT's GELU ``0.5 * x`` was reassociated that way)."""
    plan = plan_recompute(chain(4), CHEAP)
    assert plan.tensors == ()
    reasons = {k.tensor: k.reason for k in plan.skipped}
    assert sorted(reasons) == ["f0:0", "f1:0", "f2:0"]
    assert "keep one reader, Relu 'f1'" in reasons["f0:0"] and "Grappler folds" in reasons["f0:0"]


def test_recompute_none_is_exactly_the_swap_plan():
    g = bn_relu_blocks(3)
    a, b = plan_swaps(g, LMSConfig()), plan_swaps(g, LMSConfig(recompute="none"))
    assert a == b and a.recompute is None and a.n_recomputed == 0
    assert plan_recompute(g, LMSConfig()) == RecomputePlan()


def test_summary_lists_recomputed_tensors_and_is_json():
    g = bn_relu_blocks(2)
    summary = plan_swaps(g, CHEAP).summary()
    json.dumps(summary)
    rec = summary["recompute"]
    assert rec["n_recomputed"] == 2 and rec["n_clones"] == 6 and rec["recomputed_bytes"] == 2 * 4 * MiB
    assert rec["recomputed"][0]["ops"] == ["block0/bn/mul_1", "block0/bn/add_1", "block0/relu"]


# ---- validate catches bad plans ------------------------------------------------------------

def _broken(change):
    g = bn_relu_blocks(2)
    plan = plan_swaps(g, CHEAP)
    rp = plan.recompute
    first = rp.recomputes[0]
    return g, dataclasses.replace(plan, recompute=dataclasses.replace(rp, recomputes=(change(first), *rp.recomputes[1:])))


@pytest.mark.parametrize("change,match", [
    (lambda r: dataclasses.replace(r, consumers=("gradient_tape/block1/ReluGrad",)), "does not read"),
    (lambda r: dataclasses.replace(r, clones=r.clones[:-1]), "not the tensor's producer"),
    (lambda r: dataclasses.replace(r, trigger="gradient_tape/block0/ReluGrad"), "cycle"),
    (lambda r: dataclasses.replace(r, clones=(dataclasses.replace(r.clones[0], inputs=("x:0", "x:0")),
                                              *r.clones[1:])), "reads 'x:0'"),
    (lambda r: dataclasses.replace(r, clones=(Clone("c", "block0/dropout_missing", ()),)), "not the tensor's"),
    (lambda r: dataclasses.replace(r, clones=(dataclasses.replace(r.clones[0], name="block0/conv"),
                                              *r.clones[1:])), "already in use"),
])
def test_validate_rejects_inconsistent_recompute_plans(change, match):
    g, plan = _broken(change)
    with pytest.raises(PlanError, match=match):
        plan.validate(g)


def test_validate_rejects_a_clone_of_a_random_op():
    g = bn_relu_blocks(1, dropout=True)
    rp = plan_recompute(g, CHEAP)
    r = rp.recomputes[0]
    bad = dataclasses.replace(r, tensor="block0/dropout/Cast:0", consumers=("gradient_tape/block0/dropout/Mul",),
                              clones=(Clone("lms/recompute/d/draw", "block0/dropout/RandomUniform", ()),
                                      Clone("lms/recompute/d/ge", "block0/dropout/GreaterEqual",
                                            ("lms/recompute/d/draw:0",)),
                                      Clone("lms/recompute/d/cast", "block0/dropout/Cast", ("lms/recompute/d/ge:0",))))
    with pytest.raises(PlanError, match="random or stateful"):
        RecomputePlan(recomputes=(bad,)).validate(g)


@pytest.mark.parametrize("blocks", [2, 5])
def test_the_memory_schedule_orders_the_clones_like_any_other_op(blocks):
    from lms.schedule import schedule_ops

    g = bn_relu_blocks(blocks)
    config = LMSConfig(recompute="cheap", schedule="memory")
    plan = plan_swaps(g, config)
    rewritten = plan.validate(g)
    schedule = schedule_ops(g, plan)
    position = {name: i for i, name in enumerate(schedule.order)}
    assert set(position) == set(rewritten.ops)  # clones and gates are in the pinned order
    pinned = {n for edge in schedule.pins for n in edge}
    for r in plan.recompute.recomputes:
        gate = r.gates[0]
        assert position[r.trigger] < position[gate.name] < position[r.clones[0].name]
        assert position[r.clones[-1].name] < min(position[c] for c in r.consumers)
        assert gate.name in pinned  # the gate carries the pin in TF, not the clones
        assert not pinned & {c.name for c in r.clones}
    # and the simulator runs that order
    result = simulate(g, plan, batch=8, timeline=False)
    assert result.peak_device_bytes > 0


# ---- names: Grappler sorts a commutative op's inputs by name (issue 11, issue 15) -----------

_OTHERS = ["gradient_tape/mul_1/Mul", "a", "zeta", "Exp_1", "Exp/x", "Exp.x", "Exp0", "Exp:1", "Exp:2",
           "Exp:10", "bn/FusedBatchNormV3", "bn/FusedBatchNormV3_1", "bn/FusedBatchNormV3/x", "bn/FusedBatchNormV30",
           "bn/FusedBatchNormV3:2", "bn/FusedBatchNormV3:10", "mul/x", "lms/swap_out/Exp_0", "Exp-lms_swap_in_1_0"]


def _key(tensor: str) -> str:  # a tensor as a GraphDef input: ``op`` for output 0, else ``op:k``
    return tensor[:-2] if tensor.endswith(":0") else tensor


@pytest.mark.parametrize("source", ["Exp:0", "Exp:1", "Exp:2", "bn/FusedBatchNormV3:1", "bn/FusedBatchNormV3:0"])
def test_gate_names_sort_among_other_inputs_where_the_source_did(source):
    """A gate stands in for its source among a clone's inputs: it must not move when Grappler sorts them."""
    name = gate_op_name("block/relu:0", 3, source)
    # a clone that reads two outputs of one op reads both through gates (next test)
    others = [o for o in _OTHERS if not o.startswith(source.rpartition(":")[0] + ":") and o != _key(source)]
    assert [name < o for o in others] == [_key(source) < o for o in others]
    assert is_gate_op_name(name) and is_recompute_op_name(name) and "/" not in name.rpartition("lms_gate_")[2]


def test_gates_of_several_outputs_of_one_op_keep_their_order():
    keys = ["Exp", "Exp:1", "Exp:10", "Exp:2"]  # sorted as strings
    names = [gate_op_name("t:0", 0, k if ":" in k else f"{k}:0") for k in keys]
    assert sorted(names) == names
    others = [o for o in _OTHERS if not o.startswith("Exp:") and o != "Exp"]
    for key, name in zip(keys, names):
        assert [name < o for o in others] == [key < o for o in others]


@pytest.mark.parametrize("op", ["Exp", "bn/mul_1", "functional/mha/softmax/Softmax"])
def test_clone_names_sort_among_other_inputs_where_the_original_did(op):
    """A clone stands in for its original's output 0 among its readers' inputs (and the next clones')."""
    name = recompute_op_name("model/block_1/relu:0", 0, op)
    others = _OTHERS + [f"{op}_1", f"{op}/x", f"{op}:1", f"{op}0", "functional/mha/softmax/Softmax_1"]
    assert [name < o for o in others] == [op < o for o in others]
    # no scope separator after the op's name: Grappler's rewritten nodes get the original's scope
    assert name.startswith(f"{op}-lms_recompute_") and "/" not in name[len(op):]
    assert is_recompute_op_name(name) and not is_gate_op_name(name)


def test_one_op_cloned_in_two_chains_gets_two_names():
    assert recompute_op_name("a/b:0", 0, "x/y") != recompute_op_name("a/c:0", 0, "x/y")
    assert recompute_op_name("a:0", 0, "x") != recompute_op_name("a:0", 1, "x")
