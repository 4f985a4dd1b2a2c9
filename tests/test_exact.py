"""`lms.schedule.exact_order`: one order over the optimized graph, and a chain that leaves TF no other (no TensorFlow)."""

from __future__ import annotations

import itertools

import pytest

from lms import LMSConfig, plan_swaps
from lms.schedule.exact_order import ExactOrder, ExactOrderError, Node, exact_order
from lms.schedule import schedule_ops
from lms.sim.interpreter import compiled_for, simulate
from tests.synthetic import bn_relu_blocks, residual


def _graph(*spec: str) -> list[Node]:
    """Nodes from ``"name:Type<-a,b|^c"`` strings (data inputs after ``<-``, control inputs after ``|``)."""
    nodes = []
    for item in spec:
        head, _, rest = item.partition("<-")
        name, _, op_type = head.partition(":")
        data, _, control = rest.partition("|")
        nodes.append(Node(name, op_type, tuple(d for d in data.split(",") if d),
                          tuple(c.lstrip("^") for c in control.split(",") if c)))
    return nodes


def _only_orders(nodes: list[Node], chain: ExactOrder) -> set[tuple[str, ...]]:
    """Every order of the chained nodes that the graph plus the chain edges allow (brute force, tiny graphs)."""
    chained = chain.chained(nodes)
    preds = {n.name: set(n.inputs) | set(n.control_inputs) for n in nodes}
    for a, b in chain.edges:
        preds[b].add(a)

    def ancestors(name: str, seen: set[str] | None = None) -> set[str]:
        seen = set() if seen is None else seen
        for p in preds[name]:
            if p not in seen:
                seen.add(p)
                ancestors(p, seen)
        return seen

    anc = {n: ancestors(n) for n in chained}
    return {perm for perm in itertools.permutations(chained)
            if not any(b in anc[a] for a, b in itertools.combinations(perm, 2))}  # never a node before its ancestor


BRANCHES = _graph("x:_Arg", "w:_Arg", "a:MatMul<-x,w", "b:Relu<-a", "c:Tanh<-a", "d:AddV2<-b,c", "out:_Retval<-d")


def test_the_chain_leaves_one_order_and_follows_the_schedule():
    for schedule in (["a", "c", "b", "d"], ["a", "b", "c", "d"]):
        chain = exact_order(BRANCHES, schedule)
        assert [n for n in chain.order if n in schedule] == schedule
        assert chain.edges == ((schedule[1], schedule[2]),)  # the only pair the graph leaves unordered
        assert _only_orders(BRANCHES, chain) == {tuple(schedule)}
        assert chain.n_placed == 4 and chain.n_chained == 4


def test_without_a_schedule_the_nodes_keep_their_own_order():
    chain = exact_order(BRANCHES)
    assert [n for n in chain.order if n in "abcd"] == ["a", "b", "c", "d"]
    assert _only_orders(BRANCHES, chain) == {("a", "b", "c", "d")}


def test_an_unplaced_reader_of_a_computed_tensor_runs_right_after_it():
    """An emulated swap-out's Shape read of the tensor it copies: run late, it would hold the tensor."""
    nodes = _graph("x:_Arg", "big:Conv2D<-x", "out:PyFuncStateless<-big", "shape:Shape<-big",
                   "fwd:Relu<-big", "loss:Sum<-fwd", "host:Reshape<-out,shape", "in:Snapshot<-host|^loss",
                   "grad:ReluGrad<-in,loss")
    chain = exact_order(nodes, ["big", "out", "fwd", "loss", "in", "grad"])
    order = list(chain.order)
    assert order.index("shape") == order.index("big") + 1
    assert order.index("host") == order.index("out") + 1  # right after its last placed input


def test_an_unplaced_op_on_variables_only_runs_just_before_its_reader():
    """A rewritten ``momentum * m`` (reads only arguments) must not hold its output from the step's start."""
    nodes = _graph("x:_Arg", "m:_Arg", "k:Const", "f1:Relu<-x", "f2:Relu<-f1", "g:ReluGrad<-f2,f1",
                   "mm:Mul<-m,k", "upd:AddV2<-mm,g")
    chain = exact_order(nodes, ["f1", "f2", "g", "upd"])
    order = [n for n in chain.order if n not in ("x", "m", "k")]
    assert order == ["f1", "f2", "g", "mm", "upd"]


def test_constants_are_on_the_chain_just_before_their_first_reader():
    """A constant allocates its tensor when the executor makes its kernel, in the executor's node order:
    left off the chain, it could be made anywhere (TF's walk over pointer-ordered edge sets) and land
    elsewhere in TF's allocator in each process."""
    nodes = _graph("x:_Arg", "k1:Const", "k2:Const", "a:Mul<-x,k1", "b:AddV2<-x,k2", "c:AddV2<-a,b",
                   "out:_Retval<-c")
    chain = exact_order(nodes, ["b", "a", "c"])
    assert chain.chained(nodes) == ("k2", "b", "k1", "a", "c")
    assert _only_orders(nodes, chain) == {("k2", "b", "k1", "a", "c")}
    assert ("b", "k1") in chain.edges  # the constant waits for the op before it


def test_onednn_merged_siblings_stay_adjacent_entered_through_the_filter_gradient():
    nodes = _graph("x:_Arg", "dy:_Arg", "s:Const", "other:Relu<-x", "filt:Conv2DBackpropFilter<-x,s,dy",
                   "late:Tanh<-x", "bias:BiasAddGrad<-dy", "sum:AddN<-other,late")
    chain = exact_order(nodes, ["other", "bias", "late", "filt", "sum"])
    # the bias gradient waits for its mate: it cannot run ahead of the filter gradient
    # (the constant is chained too, just before its reader: it allocates when its kernel is made)
    assert chain.chained(nodes) == ("other", "late", "s", "filt", "bias", "sum")
    assert chain.merged == (("filt", "bias"),)
    # into both alike (oneDNN does not merge a BiasAddGrad whose control inputs differ), out of both,
    # none between them (a cycle once merged)
    assert set(chain.edges) == {("other", "late"), ("late", "s"), ("s", "filt"), ("s", "bias"), ("filt", "sum"),
                                ("bias", "sum")}
    # with oneDNN off nothing is merged: the bias gradient is chained like any other op
    plain = exact_order(nodes, ["other", "bias", "late", "filt", "sum"], onednn=False)
    assert plain.merged == () and plain.chained(nodes) == ("other", "bias", "late", "s", "filt", "sum")


def test_a_pad_fused_into_its_convolution_leads_on_through_the_convolution_only():
    """oneDNN fuses Pad -> Conv2D (ResNet-50's conv1) when the pad is the convolution's only data reader
    and both have the same control inputs (a control reader, like Grappler's folded ShapeN of the pad,
    does not stop it): the convolution runs right after its pad, the pad waits for the convolution's
    filter, both are entered alike, and no chain edge leaves the pad."""
    nodes = _graph("x:_Arg", "w:_Arg", "p:Const", "a:Relu<-x", "pad:Pad<-a,p", "side:Tanh<-a",
                   "filt:ReadVariableOp<-w", "conv:_FusedConv2D<-pad,filt", "folded:Const|^pad",
                   "out:AddN<-conv,side")
    chain = exact_order(nodes, ["a", "pad", "side", "filt", "conv", "out"])
    chained = chain.chained(nodes)
    assert chained.index("conv") == chained.index("pad") + 1
    assert chained.index("filt") < chained.index("pad")
    assert chain.fused == (("pad", "conv"),) and ("pad", "conv") in chain.merged
    assert not [e for e in chain.edges if e[0] == "pad"]
    before = chained[chained.index("pad") - 1]
    assert {(before, "pad"), (before, "conv")} <= set(chain.edges)
    with pytest.raises(ExactOrderError, match="control inputs are the same"):
        ExactOrder(order=chain.order, edges=tuple(e for e in chain.edges if e != (before, "conv")),
                   merged=chain.merged, fused=chain.fused).validate(nodes)
    assert exact_order(nodes, ["a", "pad", "side", "filt", "conv", "out"], onednn=False).fused == ()


@pytest.mark.parametrize("flow", ["Switch", "Merge", "Enter", "NextIteration"])
def test_control_flow_is_refused(flow):
    nodes = _graph("x:_Arg", f"s:{flow}<-x", "y:Relu<-s")
    with pytest.raises(ExactOrderError, match="control flow"):
        exact_order(nodes)


def test_a_cycle_or_a_dangling_input_is_refused():
    with pytest.raises(ExactOrderError, match="cycle"):
        exact_order(_graph("a:Relu<-b", "b:Relu<-a"))
    with pytest.raises(ExactOrderError, match="not in the graph"):
        exact_order(_graph("a:Relu<-ghost"))


def test_validate_names_a_broken_chain_a_bad_order_and_an_edge_between_merged_mates():
    chain = exact_order(BRANCHES, ["a", "b", "c", "d"])
    with pytest.raises(ExactOrderError, match="chain is broken"):
        ExactOrder(order=chain.order, edges=()).validate(BRANCHES)
    swapped = tuple(reversed(chain.order))
    with pytest.raises(ExactOrderError, match="before its input"):
        ExactOrder(order=swapped, edges=chain.edges).validate(BRANCHES)
    with pytest.raises(ExactOrderError, match="missing"):
        ExactOrder(order=chain.order[:-1], edges=chain.edges).validate(BRANCHES)
    nodes = _graph("x:_Arg", "dy:_Arg", "s:Const", "filt:Conv2DBackpropFilter<-x,s,dy", "bias:BiasAddGrad<-dy")
    good = exact_order(nodes)
    with pytest.raises(ExactOrderError, match="merge"):
        ExactOrder(order=good.order, edges=(("filt", "bias"),), merged=good.merged).validate(nodes)
    with pytest.raises(ExactOrderError, match="control inputs are the same"):
        ExactOrder(order=good.order, edges=(("x", "bias"),), merged=good.merged).validate(nodes)


@pytest.mark.parametrize("graph", [residual(4), bn_relu_blocks(3)], ids=lambda g: g.name)
@pytest.mark.parametrize("config", [LMSConfig(n_tensors=-1, lb=3, schedule="memory"),
                                    LMSConfig(n_tensors=-1, lb=1, schedule="memory", prefetch="headroom"),
                                    LMSConfig(n_tensors=0, schedule="memory")], ids=["lb3", "headroom", "noswap"])
def test_an_exact_schedule_keeps_the_candidate_whose_own_order_peaks_lowest(graph, config):
    plan = plan_swaps(graph, config)
    sched = schedule_ops(graph, plan, exact=True)
    assert sched.exact and sched.chosen in sched.candidates
    assert sched.candidates[sched.chosen] == min(sched.candidates.values())
    assert sched.candidates["tf"] >= sched.candidates[sched.chosen]
    if config.prefetch == "headroom":
        assert sched.prefetch_share in (0.0, 1.0)
    # the order runs as it is: the simulator's executed order on a CPU device is the schedule's order
    cg = compiled_for(graph, plan, order="single_threaded", exact=True)
    assert cg.order_kind == "exact"
    assert [n for n in sched.order if n in cg.op_names] == list(cg.op_names)


def test_the_simulator_pins_whole_on_cpu_devices_only():
    from lms.machine.devices import get_device
    from lms.sim.interpreter import exact_on

    graph = bn_relu_blocks(3)
    config = LMSConfig(n_tensors=-1, lb=3, schedule="memory")
    assert exact_on(get_device("cpu")) and not exact_on(get_device("P100-16GB")) and not exact_on(None)
    batch = 4 * graph.batch_size
    cpu = simulate(graph, config, batch=batch, device="cpu")
    assert cpu.peak_device_bytes == simulate(graph, config, batch=batch, device="cpu", exact=True).peak_device_bytes
    plan = plan_swaps(graph, config)
    assert compiled_for(graph, plan, order="executor", exact=False).order_kind == "executor"
    unpinned = plan_swaps(graph, LMSConfig(n_tensors=-1))  # schedule="tf": nothing to run exactly
    assert compiled_for(graph, unpinned, order="single_threaded", exact=True).order_kind == "single_threaded"
