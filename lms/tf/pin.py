"""Apply a finished `lms.schedule.Schedule` to a TensorFlow graph: one control edge per ordering edge.

The order was decided elsewhere (`lms.schedule.schedule_ops`, no TensorFlow);
this adds exactly the edges the schedule lists, after `lms.tf.apply.apply_plan`
inserted the swap ops they may name::

    (a) -> ... (b)          (a) ..> (b)   control edge

The schedule only pins ops that no Grappler or oneDNN rewrite touches
(`lms.plan.anchor.pinnable_ops`), and nothing is marked ``_grappler_do_not_remove``
here: the mark puts an op in Grappler's preserve set, which also stops rewrites
(the swap ops already carry it). Grappler's dependency optimizer may drop a
pin that the graph already implies, never the order; check with
`pinned_edges_survived` on `lms.tf.graphdefs.executed_graph_defs`. An edge to an
emulated swap-in goes to every op of that swap-in without an input inside it
(the op that takes the trigger).

Before adding anything the edges are checked against the graph being traced:
every op must be in it (not inside a ``tf.while_loop`` or ``tf.cond`` body:
those are other functions) and the graph plus the edges must stay acyclic,
counting the edges tf.function's automatic control dependencies will add when
the traced function returns (variable reads and writes in program order,
`lms.schedule.resource_order_edges`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable

import tensorflow as tf

from ..graph import group_pairs


__all__ = ["PinnedSchedule", "apply_schedule", "remove_schedule", "pinned_edges_survived"]

log = logging.getLogger(__name__)

_SWAP_IN_MARK = "-lms_swap_in_"  # in every swap-in's op name (`lms.plan.swap_op_name`)


@dataclass(frozen=True)
class PinnedSchedule:
    """What `apply_schedule` added: the edges ``(before, after)`` by op name, and the control inputs it added
    (``(source op, destination op)``: an emulated swap-in's entry ops, none the graph had already)."""

    edges: tuple[tuple[str, str], ...]
    added: tuple[tuple[str, str], ...] = ()


def _swap_in_parts(graph: tf.Graph) -> dict[str, list[tf.Operation]]:
    """Ops named ``<swap-in>/<part>`` by the swap-in they belong to (emulated swap-ins are several ops).

    Swap-ins are named ``<producer>-lms_swap_in_<output>_<i>`` (`lms.plan.swap_op_name`),
    their parts ``<swap-in>/transfer``, ``<swap-in>/shaped``, ... (`lms.tf.emulate`).
    """
    parts: dict[str, list[tf.Operation]] = {}
    for op in graph.get_operations():
        head, sep, _ = op.name.rpartition("/")
        if sep and _SWAP_IN_MARK in head.rpartition("/")[2]:
            parts.setdefault(head, []).append(op)
    return parts


def _entry_ops(graph: tf.Graph, name: str, parts: dict[str, list[tf.Operation]]) -> list[tf.Operation]:
    """The ops an edge *to* `name` must reach: `name`, or for an emulated swap-in its first ops."""
    op = graph.get_operation_by_name(name)
    group = parts.get(name, [])
    if not group:
        return [op]
    members = {o.name for o in group} | {name}
    return [o for o in [*group, op] if not any(t.op.name in members for t in o.inputs)]


def apply_schedule(graph: tf.Graph, edges: Iterable[tuple[str, str]]) -> PinnedSchedule:
    """Add ``(a) ..> (b)`` for every ``(a, b)`` in `edges` (the graph is edited in place).

    Nothing is added unless every edge can be: all checked first.

    Raises:
        ValueError: an edge names an op that is not in the graph (e.g. one inside
            a loop or branch body), or the edges would make a cycle with the
            graph's own data and control edges.
    """
    edges = list(edges)
    parts = _swap_in_parts(graph)
    resolved: list[tuple[tf.Operation, list[tf.Operation]]] = []
    for a, b in edges:
        try:
            resolved.append((graph.get_operation_by_name(a), _entry_ops(graph, b, parts)))
        except (KeyError, ValueError):
            raise ValueError(f"the schedule pins {a!r} -> {b!r}, which is not in the graph being traced "
                             "(ops inside a tf.while_loop/tf.cond body cannot be pinned)") from None
    cycle = _cycle_with(graph, [(src, dst) for src, dsts in resolved for dst in dsts])
    if cycle:
        raise ValueError(f"the schedule's {len(edges)} ordering edges would make a cycle in the traced graph "
                         f"through {' -> '.join(cycle[:6])}{' ...' if len(cycle) > 6 else ''}; nothing pinned "
                         "(use schedule='tf' and no serialization/sync_mode for this step)")
    added: list[tuple[str, str]] = []
    for src, dsts in resolved:
        for dst in dsts:
            if src not in dst.control_inputs:
                dst._add_control_input(src)  # noqa: SLF001
                added.append((src.name, dst.name))
    log.debug("pinned %d ordering edges", len(edges))
    return PinnedSchedule(tuple(edges), tuple(added))


def remove_schedule(graph: tf.Graph, pinned: PinnedSchedule) -> None:
    """Take out the control inputs `apply_schedule` added (the graph's own stay)::

        (a) ..> (b)   becomes   (a)   (b)
    """
    by_dst: dict[str, set[str]] = {}
    for src, dst in pinned.added:
        by_dst.setdefault(dst, set()).add(src)
    for dst_name, srcs in by_dst.items():
        dst = graph.get_operation_by_name(dst_name)
        keep = [c for c in dst.control_inputs if c.name not in srcs]
        dst._remove_all_control_inputs()  # noqa: SLF001
        dst._add_control_inputs(keep)  # noqa: SLF001
    log.debug("unpinned %d control inputs", len(pinned.added))


def _cycle_with(graph: tf.Graph, extra: list[tuple[tf.Operation, tf.Operation]]) -> list[str]:
    """Op names along a cycle of `graph` plus the `extra` edges ``(src, dst)`` and the resource-order edges
    tf.function will add (`lms.schedule.resource_order_edges`); empty if acyclic.

    One pass over the ops reads each op's inputs once (the edges and the resource accesses).
    """
    from ..schedule import RESOURCE_READ_TYPES, resource_order_edges

    ops = graph.get_operations()
    index = {op.name: i for i, op in enumerate(ops)}
    edges: list[tuple[int, int]] = []
    accesses: list[tuple[str, str, bool]] = []
    for i, op in enumerate(ops):
        inputs = op.inputs
        edges.extend((index[p], i) for p in {t.op.name for t in inputs} | {c.name for c in op.control_inputs}
                     if p in index)
        accesses.extend((op.name, t.name, op.type not in RESOURCE_READ_TYPES) for t in inputs
                        if t.dtype == tf.resource)
    edges += [(index[src.name], index[dst.name]) for src, dst in extra]
    edges += [(index[a], index[b]) for a, b in resource_order_edges(accesses)]
    grouped = group_pairs(edges)  # tuples, not a list per op: see `lms.graph.group_pairs`
    succs = [grouped.get(i, ()) for i in range(len(ops))]
    indeg = [0] * len(ops)
    for _, dst in edges:
        indeg[dst] += 1
    ready = [i for i, d in enumerate(indeg) if d == 0]
    seen = 0
    while ready:
        i = ready.pop()
        seen += 1
        for j in succs[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    if seen == len(ops):
        return []
    left = [i for i, d in enumerate(indeg) if d > 0]  # on a cycle or downstream of one: walk back to a cycle
    on = set(left)
    preds: dict[int, int] = {}
    for i in left:
        for j in succs[i]:
            if j in on:
                preds.setdefault(j, i)
    path, pos, i = [], {}, left[0]
    while i not in pos:
        pos[i] = len(path)
        path.append(i)
        i = preds[i]
    return [ops[k].name for k in reversed(path[pos[i]:])]


def pinned_edges_survived(graph_defs: Iterable[Any], edges: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The edges whose order is *not* kept in the optimized graphs (empty: every pin survived).

    An edge is kept when both ops are still there and ``b`` still depends on ``a``
    (through data or control inputs).
    """
    preds: dict[str, set[str]] = {}
    for gd in graph_defs:
        nodes = list(gd.node) + [n for f in gd.library.function for n in f.node_def]
        for n in nodes:
            preds.setdefault(n.name, set()).update(i.lstrip("^").split(":")[0] for i in n.input)
    lost = []
    for a, b in edges:
        if a not in preds or b not in preds:
            lost.append((a, b))
            continue
        seen, stack, found = set(), [b], False
        while stack and not found:
            x = stack.pop()
            for p in preds.get(x, ()):
                if p == a:
                    found = True
                    break
                if p not in seen:
                    seen.add(p)
                    stack.append(p)
        if not found:
            lost.append((a, b))
    return lost
