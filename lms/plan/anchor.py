"""Keep control edges off ops that Grappler or oneDNN may fold into a rewrite. No TensorFlow.

Two users, one concern: a control edge (or a ``_grappler_do_not_remove`` mark)
on an op changes which rewrites TensorFlow applies to it, so the step would
compute with other kernels and differ from the step without LMS in the last
bits -- or, where oneDNN merges two ops that a pinned path connects, not run.

- Swap-in triggers (`anchor_triggers`, called last by `lms.plan.plan_swaps`):
  a trigger only gets a control *output*; it moves off an op that Grappler may
  fold as an inner node of a fusion.
- Ordering pins (`pinnable_ops`, used by `lms.schedule`): a pinned op gets
  control inputs *and* outputs; only ops no rewrite touches may carry them.

Both are part of planning, so the simulator and the tuner predict with exactly
the edges the TensorFlow adapter applies.
"""

from __future__ import annotations

import dataclasses

from ..graph import SHAPE_ONLY_TYPES, Graph, Role
from ..rules import REWRITABLE_TYPES, UNPINNABLE_TYPES, may_vanish, merged_pairs, safe_trigger, static_ops
from .swap_plan import SWAP_IN_TYPE, SWAP_OUT_TYPE, Swap, SwapIn, SwapPlan
from .recompute import GATE_TYPE, is_gate_op_name, is_recompute_op_name

__all__ = ["anchor_triggers", "anchored_trigger", "alternative_trigger", "pinnable_ops", "trigger_ops"]


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
        forward = [r for r in graph.live_readers(swap.tensor) if graph.ops[r].role is Role.FORWARD]
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
    forward = [r for r in graph.live_readers(tensor) if graph.ops[r].role is Role.FORWARD]
    return anchor if all(graph.is_ancestor(r, anchor) for r in forward) else trigger


def alternative_trigger(graph: Graph, trigger: str, tensor: str, consumers: tuple[str, ...], *,
                        avoid: frozenset[str] = frozenset()) -> str | None:
    """Another trigger for a swap-in (or a recompute gate) of `tensor` serving `consumers`, or None.

    The op nearest in level to `trigger` (earlier ones first) that the planner
    could have taken: an ancestor of the first consumer (so the edge cannot
    close a cycle) of the same role, run by TensorFlow, safe (`lms.rules.safe_trigger`),
    neither a shape read nor a clone, after every forward reader of `tensor`
    (a forward swap-in: after the readers of the original) and, for backward
    consumers, deeper than `Graph.forward_end`; not `trigger` and not in `avoid`
    (triggers found to change a Grappler rewrite: `lms.tf.equivalence`).
    """
    if trigger not in graph.ops:
        return None
    levels = graph.levels
    first = min(consumers, key=levels.__getitem__)
    backward = graph.ops[first].role is Role.BACKWARD
    forward = [r for r in graph.live_readers(tensor) if graph.ops[r].role is Role.FORWARD]
    after = forward if backward else [r for r in forward if r not in consumers]
    end = graph.forward_end
    floor = levels[end] if backward and end is not None else -1
    role = graph.ops[trigger].role

    def valid(name: str) -> bool:
        op = graph.ops[name]
        return (name != trigger and name not in avoid and op.role is role and op.live and bool(op.inputs)
                and op.type not in SHAPE_ONLY_TYPES and not is_recompute_op_name(name) and name not in consumers
                and safe_trigger(graph, name) and graph.is_ancestor(name, first)
                and all(graph.is_ancestor(r, name) for r in after))

    start = levels[trigger]
    order = [*range(start, floor, -1), *range(start + 1, levels[first])]
    for level in order:
        found = [n for n in graph.ops_by_level.get(level, ()) if valid(n)]
        if found:
            return max(found, key=graph._position.__getitem__)  # noqa: SLF001
    return None


def _anchor(graph: Graph, trigger: str, position: dict[str, int]) -> str:
    """`trigger` if safe, else its nearest safe same-role data ancestor (not a source)."""
    if safe_trigger(graph, trigger):
        return trigger
    role = graph.ops[trigger].role
    seen = {trigger}
    layer = [trigger]
    while layer:
        parents: list[str] = []
        for op in layer:
            for p in graph.ops[op].input_ops:
                if (p not in seen and p in graph.ops and graph.ops[p].role is role and graph.ops[p].inputs
                        and graph.ops[p].live):
                    seen.add(p)
                    parents.append(p)
        safe = [p for p in parents if safe_trigger(graph, p)]
        if safe:
            return max(safe, key=lambda p: (graph.levels[p], position[p]))
        layer = parents
    return trigger


def _is_gate(op) -> bool:  # noqa: ANN001
    return op.type == GATE_TYPE and is_gate_op_name(op.name)


def pinnable_ops(graph: Graph) -> frozenset[str]:
    r"""Ops that may carry an ordering pin (control inputs and outputs) without changing TF's rewrites.

    Grappler's remapper fuses ``Conv2D/MatMul + BiasAdd (+ activation)`` only
    when no op of the pattern has a control input or output, and never through an
    op marked ``_grappler_do_not_remove``; its arithmetic optimizer skips nodes
    driven by or driving control dependencies in most stages. Either way the op
    runs with another kernel and results differ in the last bits (seen: mlp's
    loss by 1 ulp once its ``MatMul``/``BiasAdd`` were pinned; a residual block's
    BatchNorm ``Mul``/``AddV2`` likewise). So an op is pinnable when:

    - it is a swap op LMS inserted or a recompute gate (`lms.plan.recompute.Gate`:
      a protected identity the clones of a chain wait on), or
    - its type is not one Grappler rewrites (`REWRITABLE_TYPES`), not an
      identity, view, shape read, constant, variable read or control-flow op,
      it has inputs, not all of them computed from constants and shapes
      (Grappler folds it into a constant), something reads one of its outputs
      (Grappler prunes dead ops: a pin would keep them alive), and it is not
      one of a pair oneDNN merges (`merged_pairs`).

    In a training step that leaves the gradient kernels (``Conv2DBackpropInput``,
    ``ReluGrad``, ``MaxPoolGrad``, ...), the variable updates and the swap ops::

        (Conv2D) -> (BiasAdd) -> (Relu)      none pinnable: one fused kernel
        (ReluGrad) -> (Conv2DBackpropInput)  pinnable
    """
    merged = {n for pair in merged_pairs(graph) for n in pair}
    static = static_ops(graph)
    out: set[str] = set()
    for op in graph.ops.values():
        if op.name in static:
            continue
        if op.type in (SWAP_IN_TYPE, SWAP_OUT_TYPE) or _is_gate(op):
            out.add(op.name)
            continue
        if (op.type in REWRITABLE_TYPES or op.type in UNPINNABLE_TYPES or op.name in merged
                or not (op.inputs or op.control_inputs) or not op.live):
            continue
        if op.outputs and not any(graph.consumers(t) for t in op.outputs) and not graph.control_outputs(op.name):
            continue
        out.add(op.name)
    return frozenset(out)


def trigger_ops(graph: Graph, *, pinnable: frozenset[str] | None = None) -> frozenset[str]:
    r"""Ops that may carry a control *output* (a swap-in's trigger) without changing TF's rewrites.

    The rule swap-in triggers have always followed (`anchor_triggers`), for the
    schedule: every pinnable op (`pinnable_ops`), and every backward op a control
    output cannot take out of a rewrite (`lms.rules.safe_trigger`: its type is not one
    Grappler rewrites, or it does not have exactly one reader -- an op with two
    readers is never an inner node of a fusion) that Grappler does not remove or
    merge (`lms.rules.may_vanish`: its control edges would move), not an identity, shape
    read, constant or control-flow op, not folded to a constant, read by
    something, and not one of a pair oneDNN merges. A swap-in gets its control
    input from such an op, so it is copied in right after the op it is
    scheduled behind, not whenever the last pinnable op before it ran::

        (ReluGrad) -> (Mul) -> (Mul_1)   (Mul) has two readers: a trigger
                        \-> (Sum)        ..> [swap-in] -> (Conv2DBackpropFilter)
    """
    pinnable = pinnable_ops(graph) if pinnable is None else pinnable
    merged = {n for pair in merged_pairs(graph) for n in pair}
    static = static_ops(graph)
    out = set(pinnable)
    for op in graph.ops.values():
        if (op.name in out or op.role is not Role.BACKWARD or op.type in UNPINNABLE_TYPES
                or op.name in static or op.name in merged or not op.inputs or may_vanish(graph, op)
                or not op.live):
            continue
        if not any(graph.consumers(t) for t in op.outputs):
            continue
        if safe_trigger(graph, op.name):
            out.add(op.name)
    return frozenset(out)

