"""Issue 33's planner rules on synthetic graphs (no TensorFlow): pruned readers, Grappler's look-through
rewrites, another trigger for the equivalence check, and the fingerprint that lets a second trace reuse a plan."""

import dataclasses

from lms import LMSConfig, Role, plan_swaps
from lms.plan.anchor import alternative_trigger, anchor_triggers
from lms.graph import Graph, GraphBuilder
from lms.rules import folds_into, hides_rewrite, recompute_changes_readers
from tests.synthetic import MiB, chain


def _frozen_middle() -> Graph:
    """x -> conv1 -> frozen (conv2) -> conv3 -> loss; the frozen layer's filter gradient reads conv1's output
    and nothing uses it (TensorFlow prunes it)."""
    b = GraphBuilder(batch_size=4)
    x = b.op("x", "Placeholder", per_sample_bytes=MiB)
    c1 = b.op("conv1", "Conv2D", x, per_sample_bytes=MiB)
    c2 = b.op("frozen", "Conv2D", c1, per_sample_bytes=MiB)
    c3 = b.op("conv3", "Conv2D", c2, per_sample_bytes=MiB)
    loss = b.op("loss", "Sum", c3, shape=(), fixed_bytes=4)
    g = b.op("gradient_tape/loss", "Fill", loss, role=Role.BACKWARD, grad_of="loss", per_sample_bytes=MiB)
    g3 = b.op("gradient_tape/conv3/input", "Conv2DBackpropInput", g, role=Role.BACKWARD, grad_of="conv3",
              per_sample_bytes=MiB)
    b.op("gradient_tape/conv3/filter", "Conv2DBackpropFilter", c2, g, role=Role.BACKWARD, grad_of="conv3",
         fixed_bytes=64)
    g2 = b.op("gradient_tape/frozen/input", "Conv2DBackpropInput", g3, role=Role.BACKWARD, grad_of="frozen",
              per_sample_bytes=MiB)
    b.op("gradient_tape/frozen/filter", "Conv2DBackpropFilter", c1, g3, role=Role.BACKWARD, grad_of="frozen",
         fixed_bytes=64)
    b.op("gradient_tape/conv1/filter", "Conv2DBackpropFilter", x, g2, role=Role.BACKWARD, grad_of="conv1",
         fixed_bytes=64)
    graph = b.build()
    ops = [dataclasses.replace(op, live=op.name != "gradient_tape/frozen/filter") for op in graph.ops.values()]
    return Graph(ops, graph.tensors.values(), batch_size=4)


def test_a_tensor_read_only_by_a_pruned_gradient_is_not_swapped():
    graph = _frozen_middle()
    plan = plan_swaps(graph, LMSConfig(lb=1))
    plan.validate(graph)
    assert "conv1:0" not in {s.tensor for s in plan.swaps}
    assert "TensorFlow prunes" in {k.tensor: k.reason for k in plan.skipped}["conv1:0"]
    assert "frozen:0" in {s.tensor for s in plan.swaps}  # read by conv3's filter gradient, which runs
    for s in plan.swaps:
        assert all(graph.ops[si.trigger].live for si in s.swap_ins if si.trigger)


def test_liveness_round_trips_through_dict_and_changes_the_fingerprint():
    graph = _frozen_middle()
    again = Graph.from_dict(graph.to_dict())
    assert not again.ops["gradient_tape/frozen/filter"].live and again.ops["conv1"].live
    assert again.fingerprint() == graph.fingerprint()
    all_live = Graph([dataclasses.replace(o, live=True) for o in graph.ops.values()], graph.tensors.values(),
                     batch_size=4)
    assert all_live.fingerprint() != graph.fingerprint()
    other_only = Graph([dataclasses.replace(o, type="Relu") if o.role is Role.OTHER else o
                        for o in graph.ops.values()], graph.tensors.values(), batch_size=4)
    assert other_only.fingerprint() == graph.fingerprint()  # forward and backward ops only


def _nt_xent() -> Graph:
    """p2 -> transpose -> MatMul(p1, transpose) -> loss; the backward MatMul reads the transpose too."""
    b = GraphBuilder(batch_size=6)
    p1 = b.op("p1", "Placeholder", per_sample_bytes=32)
    p2 = b.op("p2", "Mul", p1, per_sample_bytes=32)
    t = b.op("transpose", "Transpose", p2, per_sample_bytes=32)
    sim = b.op("MatMul", "MatMul", p1, t, per_sample_bytes=24)
    loss = b.op("loss", "Sum", sim, shape=(), fixed_bytes=4)
    g = b.op("gradient_tape/loss", "Fill", loss, role=Role.BACKWARD, grad_of="loss", per_sample_bytes=24)
    g1 = b.op("gradient_tape/MatMul/MatMul", "MatMul", g, t, role=Role.BACKWARD, grad_of="MatMul",
              per_sample_bytes=32)
    b.op("gradient_tape/p2/Mul", "Mul", g1, p1, role=Role.BACKWARD, grad_of="p2", per_sample_bytes=32)
    return b.build()


def test_a_swap_in_never_hides_a_transpose_from_the_matmul_that_absorbs_it():
    graph = _nt_xent()
    assert "MatMul" in hides_rewrite(graph, "transpose:0", "gradient_tape/MatMul/MatMul")
    assert hides_rewrite(graph, "p1:0", "gradient_tape/p2/Mul") == ""
    plan = plan_swaps(graph, LMSConfig(incl_types=["Transpose"], lb=1))
    assert plan.n_swapped == 0
    assert "Grappler reads MatMul" in {k.tensor: k.reason for k in plan.skipped}["transpose:0"]


def test_fold_rules():
    assert folds_into("Mul", "AddV2") and folds_into("Neg", "Exp") and folds_into("Transpose", "MatMul")
    assert folds_into("BiasAdd", "Relu") and not folds_into("Relu", "Conv2D")
    assert not folds_into("Mul", "Square") and not folds_into("Conv2DBackpropInput", "ReluGrad")


def test_a_clone_read_by_one_op_where_the_original_had_two_is_refused():
    g = chain(3)  # Relu -> Relu -> Relu: each read by the next and by its gradient
    why = recompute_changes_readers(g, "f0:0", ["f0"], ("gradient_tape/f1/Grad",))
    assert "keep one reader" in why


def test_alternative_trigger_is_another_safe_ancestor_of_the_first_consumer():
    graph = chain(6)
    plan = anchor_triggers(graph, plan_swaps(graph, LMSConfig(lb=2)))
    swap = next(s for s in plan.swaps if s.swap_ins[0].trigger)
    si = swap.swap_ins[0]
    other = alternative_trigger(graph, si.trigger, swap.tensor, si.consumers, avoid=frozenset({si.trigger}))
    assert other is not None and other != si.trigger
    first = min(si.consumers, key=graph.levels.__getitem__)
    assert graph.is_ancestor(other, first) and other not in si.consumers
    assert graph.levels[other] > graph.levels[graph.forward_end]
    everything = frozenset(o for o in graph.ops if graph.ops[o].role is Role.BACKWARD)
    assert alternative_trigger(graph, si.trigger, swap.tensor, si.consumers, avoid=everything) is None


def _pooled() -> Graph:
    """x -> conv -> MaxPool -> conv2 -> loss; the MaxPool's output is read back by its gradient and conv2's."""
    b = GraphBuilder(batch_size=4)
    x = b.op("x", "Placeholder", per_sample_bytes=MiB)
    c = b.op("conv", "Conv2D", x, per_sample_bytes=4 * MiB)
    p = b.op("pool", "MaxPool", c, per_sample_bytes=MiB)
    c2 = b.op("conv2", "Conv2D", p, per_sample_bytes=MiB)
    loss = b.op("loss", "Sum", c2, shape=(), fixed_bytes=4)
    g = b.op("gradient_tape/loss", "Fill", loss, role=Role.BACKWARD, grad_of="loss", per_sample_bytes=MiB)
    g2 = b.op("gradient_tape/conv2/input", "Conv2DBackpropInput", g, role=Role.BACKWARD, grad_of="conv2",
              per_sample_bytes=MiB)
    b.op("gradient_tape/conv2/filter", "Conv2DBackpropFilter", p, g, role=Role.BACKWARD, grad_of="conv2",
         fixed_bytes=64)
    gp = b.op("gradient_tape/pool/MaxPoolGrad", "MaxPoolGrad", c, p, g2, role=Role.BACKWARD, grad_of="pool",
              per_sample_bytes=4 * MiB)
    b.op("gradient_tape/conv/filter", "Conv2DBackpropFilter", x, gp, role=Role.BACKWARD, grad_of="conv",
         fixed_bytes=64)
    return b.build()


def test_the_pooling_workspace_rule_holds_for_onednn_kernels_only():
    """oneDNN's MaxPoolGrad needs its direct edge from the MaxPool (issue 55); a GPU's does not (issue 50)."""
    from lms.pipeline import resolve_plan
    from lms.simulator import simulate

    graph = _pooled()
    why = hides_rewrite(graph, "pool:0", "gradient_tape/pool/MaxPoolGrad")
    assert "oneDNN" in why
    assert hides_rewrite(graph, "pool:0", "gradient_tape/pool/MaxPoolGrad", kernels="gpu") == ""
    config = LMSConfig(n_tensors=-1, lb=1)
    on_cpu, on_gpu = plan_swaps(graph, config), plan_swaps(graph, config, kernels="gpu")
    readers = {s.tensor: {c for si in s.swap_ins for c in si.consumers} for s in on_cpu.swaps}
    assert readers["pool:0"] == {"gradient_tape/conv2/filter"}  # the gradient keeps the device copy
    readers = {s.tensor: {c for si in s.swap_ins for c in si.consumers} for s in on_gpu.swaps}
    assert readers["pool:0"] == {"gradient_tape/conv2/filter", "gradient_tape/pool/MaxPoolGrad"}
    # a plan made for a device profile follows its kernels, and so does its simulation
    assert resolve_plan(graph, config, kernels="gpu") == on_gpu
    assert resolve_plan(graph, config) == on_cpu
    gpu_peak = simulate(graph, config, batch=4, device="P100-16GB", timeline=False).peak_device_bytes
    assert gpu_peak == simulate(graph, on_gpu, batch=4, device="P100-16GB", timeline=False).peak_device_bytes
    cpu_peak = simulate(graph, config, batch=4, device="cpu", timeline=False).peak_device_bytes
    assert cpu_peak == simulate(graph, on_cpu, batch=4, device="cpu", timeline=False).peak_device_bytes


def test_plan_swaps_refuses_unknown_kernels():
    import pytest

    with pytest.raises(ValueError, match="kernels='tpu': allowed values are 'cpu' and 'gpu'"):
        plan_swaps(_pooled(), LMSConfig(), kernels="tpu")
