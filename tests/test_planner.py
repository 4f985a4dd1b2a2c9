import pytest

from lms import LMSConfig, PlanError, Role, plan_swaps
from lms.graph import GraphBuilder, GraphError
from lms.plan import Swap, SwapIn, SwapPlan, rewrite_graph, SWAP_IN_TYPE, SWAP_OUT_TYPE, swap_op_name
from tests.synthetic import MiB, chain, diamond, long_skip, residual

GRAPHS = {
    "chain8": lambda: chain(8), "chain30": lambda: chain(30), "diamond": diamond,
    "residual1": lambda: residual(1), "residual4": lambda: residual(4), "long_skip12": lambda: long_skip(12),
}
CONFIGS = [
    LMSConfig(), LMSConfig(lb=3), LMSConfig(lb=2, ub=5, fuse_swapins=True),
    LMSConfig(ctrld_strategy="direct_order"), LMSConfig(ctrld_strategy="direct_order", lb=4, fuse_swapins=True),
    LMSConfig(n_tensors=2), LMSConfig(swap_branches=True, branch_threshold=3),
    LMSConfig(swap_branches=True, branch_threshold=0, ctrld_strategy="direct_order", lb=2),
]


@pytest.mark.parametrize("graph_name", GRAPHS)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: str(c.to_dict()))
def test_every_plan_validates_and_is_acyclic(graph_name, config):
    g = GRAPHS[graph_name]()
    plan = plan_swaps(g, config)
    rewritten = plan.validate(g)
    assert len(rewritten.ops) == len(g.ops) + plan.n_swapped + plan.n_swap_ins
    for s in plan.swaps:
        for si in s.swap_ins:
            for c in si.consumers:
                assert rewritten.levels[si.trigger] < rewritten.levels[c]
                assert not g.is_ancestor(c, si.trigger)
                assert f"{si.name}:0" in rewritten.ops[c].inputs
                assert s.tensor not in rewritten.ops[c].inputs


def test_candidates_are_forward_tensors_read_by_backward_ops():
    g = chain(5)
    plan = plan_swaps(g, LMSConfig())
    # Each gradient op reads its forward op's inputs: f0..f3 are read by the gradient of
    # the next op; f4 only feeds the loss; x is a Placeholder (skipped).
    assert [s.tensor for s in plan.swaps] == [f"f{i}:0" for i in range(4)]
    assert plan.n_candidates == 4
    assert {k.tensor: k.reason for k in plan.skipped} == {
        "x:0": "producer type Placeholder is not worth swapping", "loss:0": "rank <= 1 or unknown rank"}
    for s in plan.swaps:
        assert all(g.ops[c].role is Role.BACKWARD for c in s.consumers)
    assert plan.swapped_bytes == 4 * g.tensor_bytes("f0:0")


@pytest.mark.parametrize("n", [0, 1, 3, 7])
def test_n_tensors_caps_the_count_in_forward_order(n):
    g = chain(10)
    plan = plan_swaps(g, LMSConfig(n_tensors=n))
    assert plan.n_swapped == n
    assert [s.tensor for s in plan.swaps] == [f"f{i}:0" for i in range(n)]
    assert plan.n_candidates == (9 if n else 0)  # n_tensors=0: LMS off, nothing examined



@pytest.mark.parametrize("strategy", ["chain_rule", "direct_order"])
@pytest.mark.parametrize("lb", [1, 2, 4, 6])
def test_lb_moves_the_trigger_by_exactly_lb_levels_on_a_chain(strategy, lb):
    g = chain(12)
    plan = plan_swaps(g, LMSConfig(lb=lb, ctrld_strategy=strategy))
    assert plan.n_swapped > 0
    for s in plan.swaps:
        (si,) = s.swap_ins
        (c,) = si.consumers
        assert g.levels[c] - g.levels[si.trigger] == lb == si.distance
        assert si.strategy == strategy
        assert g.ops[si.trigger].role is Role.BACKWARD


def test_larger_lb_leaves_the_last_tensors_without_trigger():
    g = chain(12)
    few = plan_swaps(g, LMSConfig(lb=6))
    assert plan_swaps(g, LMSConfig(lb=1)).n_swapped == 11
    # the last activations' gradients run right after the loss: no backward op 6 levels earlier
    assert few.n_swapped < 11
    assert any("no backward op 6..10000" in k.reason for k in few.skipped)


def test_ub_limits_the_search():
    g = chain(12)
    # lb=ub forces the exact distance; where no backward op sits there, nothing is swapped
    plan = plan_swaps(g, LMSConfig(lb=3, ub=3))
    assert all(si.distance == 3 for s in plan.swaps for si in s.swap_ins)


def test_chain_rule_triggers_on_the_gradient_of_a_downstream_forward_op():
    g = residual(3)
    plan = plan_swaps(g, LMSConfig(lb=2))
    for s in plan.swaps:
        for si in s.swap_ins:
            if si.strategy != "chain_rule":
                continue
            fwd = g.ops[si.trigger].grad_of
            start = g.ops[si.consumers[0]].grad_of
            assert g.is_ancestor(start, fwd)
            assert g.forward_levels[fwd] - g.forward_levels[start] >= 2


def test_fusing_lowers_the_number_of_swap_ins():
    g = residual(4)  # block inputs are read by two backward ops (add grad, then conv1 grad 3 levels later)
    unfused = plan_swaps(g, LMSConfig(lb=3))
    fused = plan_swaps(g, LMSConfig(lb=3, fuse_swapins=True))
    assert fused.n_swap_ins < unfused.n_swap_ins
    multi = [s for s in unfused.swaps if len(s.consumers) > 1]
    assert multi and all(len(s.swap_ins) == len(s.consumers) for s in unfused.swaps)
    fused_by_tensor = {s.tensor: s for s in fused.swaps}
    merged = [s for s in multi if len(fused_by_tensor[s.tensor].swap_ins) == 1]
    assert merged, "some multi-reader tensor got a single fused swap-in"
    for s in merged:
        assert set(fused_by_tensor[s.tensor].consumers) == set(s.consumers)


def test_fusing_keeps_far_apart_consumers_separate():
    g = long_skip(10)
    plan = plan_swaps(g, LMSConfig(lb=1, fuse_swapins=True))
    enc = next(s for s in plan.swaps if s.tensor == "enc:0")
    # enc:0 is read by the gradient of m0 and of dec, which are ~10 levels apart in backward
    assert len(enc.swap_ins) == 2


def test_swap_branches_swaps_the_long_skip_tensor():
    g = long_skip(12)
    off = plan_swaps(g, LMSConfig(n_tensors=0))
    assert off.n_swapped == 0
    plan = plan_swaps(g, LMSConfig(swap_branches=True, branch_threshold=5, lb=2, ctrld_strategy="direct_order"))
    enc = next(s for s in plan.swaps if s.tensor == "enc:0")
    assert enc.kind == "backward+branch"
    branch_in = [si for si in enc.swap_ins if si.consumers == ("dec",)]
    assert len(branch_in) == 1
    trigger = branch_in[0].trigger
    assert g.ops[trigger].role is Role.FORWARD
    assert g.levels["dec"] - g.levels[trigger] == 2
    assert g.levels[trigger] > g.levels["m0"]  # after the near reader
    plan.validate(g)
    # below the threshold nothing is branch-swapped
    none = plan_swaps(g, LMSConfig(n_tensors=0, swap_branches=True, branch_threshold=100))
    assert none.n_swapped == 0


@pytest.mark.parametrize("config, expected", [
    # block1/out:0 feeds only the loss, so no gradient op reads it
    (LMSConfig(incl_scopes=("block1",)), {"block1/conv1:0", "block1/relu1:0", "block1/conv2:0", "block1/add:0"}),
    (LMSConfig(incl_types=("Relu",)), {"block0/relu1:0", "block0/out:0", "block1/relu1:0"}),
])
def test_incl_filters(config, expected):
    g = residual(2)
    assert {s.tensor for s in plan_swaps(g, config).swaps} == expected


def test_excl_filters():
    g = residual(2)
    everything = {s.tensor for s in plan_swaps(g, LMSConfig()).swaps}
    no_block0 = {s.tensor for s in plan_swaps(g, LMSConfig(excl_scopes=("block0",))).swaps}
    assert no_block0 == {t for t in everything if not t.startswith("block0/")}
    no_conv = {s.tensor for s in plan_swaps(g, LMSConfig(excl_types=("Conv2D",))).swaps}
    assert no_conv == {t for t in everything if g.producer(t).type != "Conv2D"}
    # scope matching is on path components: "block" is not a prefix scope of "block0/..."
    assert {s.tensor for s in plan_swaps(g, LMSConfig(excl_scopes=("block",))).swaps} == everything


def test_tensors_read_by_non_gradient_ops_are_not_swapped():
    b = GraphBuilder(batch_size=2)
    b.op("x", "Placeholder", per_sample_bytes=8)
    b.op("a", "Conv2D", "x:0", per_sample_bytes=64)
    b.op("ema", "AssignMovingAvg", "a:0", role=Role.OTHER, per_sample_bytes=64)
    b.op("loss", "Sum", "a:0", shape=())
    b.op("gradient_tape/a/Grad", "Conv2DGrad", "loss:0", "a:0", role=Role.BACKWARD, grad_of="a")
    g = b.build()
    plan = plan_swaps(g, LMSConfig())
    assert plan.n_swapped == 0
    assert "non-gradient op 'ema'" in plan.skipped[0].reason


def test_plan_validate_rejects_a_trigger_after_its_consumer():
    g = chain(6)
    good = plan_swaps(g, LMSConfig(n_tensors=1))
    s = good.swaps[0]
    (c,) = s.consumers
    late = g.successors[c][0]  # runs after the consumer
    bad = SwapPlan(config=good.config, swaps=(Swap(s.tensor, s.swap_out, (SwapIn(s.swap_ins[0].name, (c,), late),),
                                                   s.nbytes),))
    with pytest.raises(PlanError, match="runs after consumer"):
        bad.validate(g)
    not_reader = SwapPlan(config=good.config,
                          swaps=(Swap(s.tensor, s.swap_out, (SwapIn("lms/swap_in/x", ("f5",), None),), s.nbytes),))
    with pytest.raises(PlanError, match="does not read"):
        not_reader.validate(g)


def test_rewrite_graph_places_swap_ops():
    g = chain(4)
    plan = plan_swaps(g, LMSConfig(n_tensors=1))
    r = rewrite_graph(g, plan)
    out = r.ops["lms/swap_out/f0_0"]
    (si,) = plan.swaps[0].swap_ins
    inn = r.ops[si.name]
    assert out.type == SWAP_OUT_TYPE and out.device == "host" and out.inputs == ("f0:0",)
    assert inn.type == SWAP_IN_TYPE and inn.inputs == ("lms/swap_out/f0_0:0",)
    assert inn.control_inputs == (si.trigger,)
    order = list(r.topological_order)
    assert order.index(si.trigger) < order.index(si.name) < order.index(si.consumers[0])


def test_graph_lint_catches_dangling_inputs_and_cycles():
    from lms.graph import Graph, Op, Tensor
    with pytest.raises(GraphError, match="unknown tensor"):
        Graph([Op("a", "Relu", inputs=("zz:0",), outputs=("a:0",))], [Tensor("a:0")]).lint()
    cyc = Graph([Op("a", "Relu", inputs=("b:0",), outputs=("a:0",)),
                 Op("b", "Relu", inputs=("a:0",), outputs=("b:0",))], [Tensor("a:0"), Tensor("b:0")])
    with pytest.raises(GraphError, match="cycle"):
        cyc.lint()


def test_graph_round_trips_through_dict():
    from lms.graph import Graph
    g = residual(2)
    h = Graph.from_dict(g.to_dict())
    assert h.to_dict() == g.to_dict()
    assert plan_swaps(h, LMSConfig(lb=2)).summary() == plan_swaps(g, LMSConfig(lb=2)).summary()


def test_backward_ops_that_may_run_during_the_forward_pass_never_trigger():
    # A gradient constant has level 0 and may run during the forward pass: with a large lb
    # direct_order would otherwise pick it and bring the tensor back while it is still alive.
    b = GraphBuilder(batch_size=2)
    b.op("x", "Placeholder", per_sample_bytes=8)
    prev = "x:0"
    for i in range(6):
        prev = b.op(f"f{i}", "Relu", prev, per_sample_bytes=64)
    b.op("loss", "Sum", prev, shape=())
    b.op("gradient_tape/const", "Const", role=Role.BACKWARD, per_sample_bytes=0, shape=(2, 2))
    # as in TF graphs, the gradient seed is a constant: nothing in the backward pass reads the loss
    g_ = b.op("gradient_tape/loss/Fill", "Fill", "gradient_tape/const:0", role=Role.BACKWARD, grad_of="loss")
    for i in reversed(range(1, 6)):
        g_ = b.op(f"gradient_tape/f{i}/ReluGrad", "ReluGrad", g_, f"f{i - 1}:0", role=Role.BACKWARD,
                  grad_of=f"f{i}")
    g = b.build()
    assert not g.is_ancestor("f5", "gradient_tape/const")
    assert g.forward_end == "f4"  # read by gradient_tape/f5/ReluGrad
    for strategy in ("chain_rule", "direct_order"):
        plan = plan_swaps(g, LMSConfig(lb=1, ctrld_strategy=strategy))
        # f0..f3; f4 is read right at the start of the backward pass: no trigger deeper than it
        assert plan.n_swapped == 4
        for s in plan.swaps:
            readers = [r for r in g.data_consumers(s.tensor) if g.ops[r].role is Role.FORWARD]
            for si in s.swap_ins:
                assert all(g.is_ancestor(r, si.trigger) for r in readers)
        deep = plan_swaps(g, LMSConfig(lb=5, ctrld_strategy=strategy))
        assert all(si.trigger != "gradient_tape/const" for s in deep.swaps for si in s.swap_ins)


def test_shape_ops_under_gradient_tape_never_trigger():
    # TF puts Shape ops of activations under gradient_tape/: they read only forward ops, so
    # they can run during the forward pass even though they depend on the tensor's readers.
    b = GraphBuilder(batch_size=2)
    b.op("x", "Placeholder", per_sample_bytes=8)
    prev = "x:0"
    for i in range(8):
        prev = b.op(f"f{i}", "Relu", prev, per_sample_bytes=64)
    b.op("loss", "Sum", prev, shape=())
    b.op("gradient_tape/seed", "Const", role=Role.BACKWARD, shape=(), fixed_bytes=4)
    shapes = {i: b.op(f"gradient_tape/f{i}/Shape", "Shape", f"f{i}:0", role=Role.BACKWARD, grad_of=f"f{i}",
                      shape=(2,), fixed_bytes=8) for i in range(8)}
    g_ = "gradient_tape/seed:0"
    for i in reversed(range(1, 8)):
        g_ = b.op(f"gradient_tape/f{i}/ReluGrad", "ReluGrad", g_, f"f{i - 1}:0", shapes[i], role=Role.BACKWARD,
                  grad_of=f"f{i}")
    g = b.build()
    for strategy in ("chain_rule", "direct_order"):
        for lb in (1, 3, 6):
            plan = plan_swaps(g, LMSConfig(lb=lb, ctrld_strategy=strategy))
            plan.validate(g)
            triggers = {si.trigger for s in plan.swaps for si in s.swap_ins}
            assert triggers and not any(t.endswith("/Shape") for t in triggers), triggers
            assert all(g.levels[t] > g.levels[g.forward_end] for t in triggers)


def test_branch_swap_in_names_are_unique_when_some_groups_find_no_trigger():
    g = long_skip(30)
    plan = plan_swaps(g, LMSConfig(lb=3, swap_branches=True, branch_threshold=10))
    plan.validate(g)
    names = [si.name for s in plan.swaps for si in s.swap_ins]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("tensor,producer_input", [
    ("Exp:0", "Exp"), ("functional/mha/softmax/Softmax:0", "functional/mha/softmax/Softmax"),
    ("bn/FusedBatchNormV3:1", "bn/FusedBatchNormV3:1"),
])
def test_swap_in_names_sort_among_other_inputs_where_the_tensor_did(tensor, producer_input):
    """Grappler sorts a commutative op's inputs by name: a swap-in must not move (issue 11)."""
    others = ["gradient_tape/mul_1/Mul", "a", "zeta", "Exp_1", "Exp/x", "functional/mha/softmax/Softmax_1",
              "functional/mha/softmax/Softmax/sub", "bn/FusedBatchNormV3", "bn/FusedBatchNormV3_1", "mul/x"]
    name = swap_op_name("swap_in", tensor, 2)
    assert [name < o for o in others] == [producer_input < o for o in others]
    assert not name.startswith("lms/")


# ---- early backward readers and views (schedule="memory") -------------------------------------------

def gelu_like(*, source_read_by_backward: bool = False):
    """x -> a (MatMul) -> g (Tanh) -> 8 Relus -> t (Transpose) -> v (Reshape) -> y (MatMul) -> loss; backward:

    ``gradient_tape/g/Pow`` reads only the forward ``a`` (a tanh-GELU gradient's ``Pow(a, 2)``: it may run
    during the forward pass) and ``y``'s gradient reads the view ``v`` of the transpose ``t``.
    """
    b = GraphBuilder(batch_size=2, name="gelu_like")
    b.op("x", "Placeholder", per_sample_bytes=MiB)
    b.op("w", "ReadVariableOp", shape=(4, 4), fixed_bytes=64)
    b.op("a", "MatMul", "x:0", "w:0", per_sample_bytes=MiB)
    b.op("g", "Tanh", "a:0", per_sample_bytes=MiB)
    h = "g:0"
    for i in range(8):  # a forward pass long enough after `a` for its early reader to be worth a swap-in
        h = b.op(f"h{i}", "Relu", h, per_sample_bytes=MiB)
    b.op("t", "Transpose", h, per_sample_bytes=MiB)
    b.op("v", "Reshape", "t:0", per_sample_bytes=MiB)
    b.op("y", "MatMul", "v:0", "w:0", per_sample_bytes=MiB)
    b.op("loss", "Sum", "y:0", shape=(), fixed_bytes=4)
    bw = dict(role=Role.BACKWARD)
    b.op("gradient_tape/loss/Fill", "Fill", "loss:0", grad_of="loss", per_sample_bytes=MiB, **bw)
    b.op("gradient_tape/y/MatMul_1", "MatMul", "v:0", "gradient_tape/loss/Fill:0", grad_of="y", fixed_bytes=64, **bw)
    b.op("gradient_tape/y/MatMul", "MatMul", "gradient_tape/loss/Fill:0", "w:0", grad_of="y", per_sample_bytes=MiB,
         **bw)
    b.op("gradient_tape/v/Reshape", "Reshape", "gradient_tape/y/MatMul:0", grad_of="v", per_sample_bytes=MiB, **bw)
    dt = b.op("gradient_tape/t/Transpose", "Transpose", "gradient_tape/v/Reshape:0", grad_of="t",
              per_sample_bytes=MiB, **bw)
    if source_read_by_backward:
        dt = b.op("gradient_tape/t/Mul", "Mul", dt, "t:0", grad_of="t", per_sample_bytes=MiB, **bw)
    b.op("gradient_tape/g/Pow", "Pow", "a:0", grad_of="g", per_sample_bytes=MiB, **bw)
    # an early reader right before the loss (as the loss's own gradient reads its logits): not worth a swap-in
    b.op("gradient_tape/y/Square", "Square", "y:0", grad_of="y", per_sample_bytes=MiB, **bw)
    dt = b.op("gradient_tape/y/Mul", "Mul", dt, "gradient_tape/y/Square:0", grad_of="y", per_sample_bytes=MiB, **bw)
    b.op("gradient_tape/g/Mul", "Mul", dt, "gradient_tape/g/Pow:0", grad_of="g", per_sample_bytes=MiB, **bw)
    b.op("gradient_tape/a/MatMul_1", "MatMul", "x:0", "gradient_tape/g/Mul:0", grad_of="a", fixed_bytes=64, **bw)
    return b.build()


def test_an_early_backward_reader_gets_a_swap_in_only_under_a_memory_schedule():
    g = gelu_like()
    assert g.levels["gradient_tape/g/Pow"] <= g.levels[g.forward_end]  # it may run in the forward pass
    tf_plan = plan_swaps(g, LMSConfig(n_tensors=-1))
    served = {c for s in tf_plan.swaps if s.tensor == "a:0" for si in s.swap_ins for c in si.consumers}
    assert "gradient_tape/g/Pow" not in served  # TF's order: no trigger, it keeps reading the device copy
    plan = plan_swaps(g, LMSConfig(n_tensors=-1, schedule="memory"))
    (swap,) = [s for s in plan.swaps if s.tensor == "a:0"]
    early = [si for si in swap.swap_ins if "gradient_tape/g/Pow" in si.consumers]
    assert len(early) == 1 and early[0].trigger is None and early[0].strategy.startswith("early reader")
    rewritten = plan.validate(g)
    assert rewritten.ops["gradient_tape/g/Pow"].inputs == (f"{early[0].name}:0",)
    assert rewritten.ops["gradient_tape/y/Square"].inputs == ("y:0",)  # one level before the loss: kept
    # the schedule runs that swap-in, and so the reader, after the forward pass
    from lms.schedule import schedule_ops
    order = schedule_ops(g, plan).order
    assert g.forward_end == "loss"
    assert order.index("gradient_tape/g/Pow") > order.index(early[0].name) > order.index("loss")


def test_a_view_that_alone_holds_its_source_is_a_candidate():
    plan = plan_swaps(gelu_like(), LMSConfig(n_tensors=-1))
    assert "v:0" in {s.tensor for s in plan.swaps}  # the Reshape of the Transpose: swapping it frees t
    # a view of a tensor the backward pass reads itself is not: that tensor is swapped
    plan = plan_swaps(gelu_like(source_read_by_backward=True), LMSConfig(n_tensors=-1))
    swapped = {s.tensor for s in plan.swaps}
    assert "t:0" in swapped and "v:0" not in swapped
    assert any(k.tensor == "v:0" and "producer type Reshape" in k.reason for k in plan.skipped)
