"""Move swap-in triggers off ops that Grappler may fold into a rewrite. No TensorFlow.

Part of planning (`lms.planner.plan_swaps` calls `anchor_triggers` last), so
the simulator and the tuner predict with exactly the triggers the TensorFlow
adapter applies.
"""

from __future__ import annotations

import dataclasses

from .graph import Graph, Role
from .plan import Swap, SwapIn, SwapPlan

__all__ = ["anchor_triggers", "anchored_trigger", "REWRITABLE_TYPES"]


# Op types Grappler may fold into a rewrite as an inner node (remapper fusions such as
# Conv2D+BiasAdd+Add+Relu or Keras' unfused batch norm -> FusedBatchNorm, the arithmetic
# optimizer's add-chain, broadcast and factor rewrites, layout and cast rewrites).
# Gradient kernels (ReluGrad, Conv2DBackprop*, MaxPoolGrad, ...) are not among them.
REWRITABLE_TYPES = frozenset({
    "Add", "AddV2", "AddN", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "Neg", "Square", "Sqrt",
    "Rsqrt", "Reciprocal", "SquaredDifference", "Maximum", "Minimum", "Pow", "Exp", "Log", "Log1p",
    "Cast", "BiasAdd", "Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul", "BatchMatMul",
    "BatchMatMulV2", "BatchMatMulV3", "Einsum", "FusedBatchNorm", "FusedBatchNormV2",
    "FusedBatchNormV3", "Pad", "Reshape", "Transpose", "Squeeze", "ExpandDims", "Identity", "Relu",
    "Relu6", "Elu", "Selu", "LeakyRelu", "Sigmoid", "Tanh", "Softplus", "Softmax", "LogSoftmax",
    "Mean", "Sum",
})


def anchor_triggers(graph: Graph, plan: SwapPlan) -> SwapPlan:
    r"""Move triggers off ops that Grappler may fold into a rewrite, to the nearest safe ancestor.

    Grappler folds an op into a rewrite (a remapper fusion such as
    Conv2D+BiasAdd+Add, the arithmetic optimizer's add-chain rewrite, ...) only
    when the op has exactly one reader and drives no control edge. A trigger's
    control edge changes that, so the graph with LMS would be optimized
    differently from the graph without it and results would differ in the last
    bits (seen on a residual block: a batch-norm ``add_1`` that triggers the
    skip connection's swap-in). So a trigger of a `REWRITABLE_TYPES` type with
    one reader moves to its nearest ancestor of the same role that is safe: not
    a source, and with several readers or of another type::

        (a) -> (b) -> (c)        trigger (b): an AddV2 with one reader, (c)
          \--> (d)              -> anchored at (a): readers (b) and (d)

    The anchor is an ancestor of the planned trigger, so it runs a little
    earlier and cannot create a cycle. Like the planner's triggers it must
    depend on every forward reader of the swapped tensor (for a forward
    swap-in: on every reader of the original) and, for a backward swap-in, lie
    deeper than `Graph.forward_end`; else the planned trigger is kept.

    Args:
        graph: the graph model the plan was made for.
        plan: the planner's plan.

    Returns:
        The plan with anchored triggers (``SwapIn.strategy`` gains ``"+anchored"``);
        `plan` itself when nothing moved.
    """
    levels = graph.levels
    position = {name: i for i, name in enumerate(graph.ops)}
    cache: dict[str, str] = {}
    changed = False
    swaps: list[Swap] = []
    for swap in plan.swaps:
        forward = [r for r in graph.data_consumers(swap.tensor) if graph.ops[r].role is Role.FORWARD]
        near = [r for r in forward if r not in swap.consumers]  # still read the original
        ins: list[SwapIn] = []
        for si in swap.swap_ins:
            if si.trigger is not None and si.trigger in graph.ops:
                if si.trigger not in cache:
                    cache[si.trigger] = _anchor(graph, si.trigger, position)
                anchor = cache[si.trigger]
                # As the planner's: after every forward reader (backward swap-in), or after
                # the readers of the original (forward swap-in of a skip connection).
                after = forward if graph.ops[si.consumers[0]].role is Role.BACKWARD else near
                backward = graph.ops[si.consumers[0]].role is Role.BACKWARD
                deep_enough = (not backward or graph.forward_end is None
                               or levels[anchor] > levels[graph.forward_end])
                if anchor != si.trigger and deep_enough and all(graph.is_ancestor(r, anchor) for r in after):
                    first = min(si.consumers, key=levels.__getitem__)
                    si = dataclasses.replace(si, trigger=anchor, distance=levels[first] - levels[anchor],
                                             strategy=f"{si.strategy}+anchored")
                    changed = True
            ins.append(si)
        swaps.append(dataclasses.replace(swap, swap_ins=tuple(ins)))
    return dataclasses.replace(plan, swaps=tuple(swaps)) if changed else plan


def anchored_trigger(graph: Graph, trigger: str, tensor: str, *, backward: bool = True) -> str:
    """`trigger`, or its anchor when that is safe, for one backward trigger of `tensor`'s readers.

    The rule of `anchor_triggers` for one trigger (used for the recompute
    planner's clone triggers): the anchor must lie deeper than
    `Graph.forward_end` and depend on every forward reader of `tensor`.
    """
    anchor = _anchor(graph, trigger, graph._position)  # noqa: SLF001
    if anchor == trigger:
        return trigger
    levels = graph.levels
    if backward and graph.forward_end is not None and levels[anchor] <= levels[graph.forward_end]:
        return trigger
    forward = [r for r in graph.data_consumers(tensor) if graph.ops[r].role is Role.FORWARD]
    return anchor if all(graph.is_ancestor(r, anchor) for r in forward) else trigger


def _readers(graph: Graph, op: str) -> int:
    return len({c for t in graph.ops[op].outputs for c in graph.data_consumers(t)})


def _safe_trigger(graph: Graph, op: str) -> bool:
    """A control edge from `op` cannot change a Grappler rewrite."""
    o = graph.ops[op]
    return (o.type not in REWRITABLE_TYPES or _readers(graph, op) != 1
            or bool(graph.control_outputs(op)))


def _anchor(graph: Graph, trigger: str, position: dict[str, int]) -> str:
    """`trigger` if safe, else its nearest safe same-role data ancestor (not a source)."""
    if _safe_trigger(graph, trigger):
        return trigger
    role = graph.ops[trigger].role
    seen = {trigger}
    layer = [trigger]
    while layer:
        parents: list[str] = []
        for op in layer:
            for p in graph.ops[op].input_ops:
                if p not in seen and p in graph.ops and graph.ops[p].role is role and graph.ops[p].inputs:
                    seen.add(p)
                    parents.append(p)
        safe = [p for p in parents if _safe_trigger(graph, p)]
        if safe:
            return max(safe, key=lambda p: (graph.levels[p], position[p]))
        layer = parents
    return trigger
