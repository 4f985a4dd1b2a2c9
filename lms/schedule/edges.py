"""The edges a schedule adds to the graph model: ordering knobs, resource order, oneDNN's merged pairs.

No TensorFlow. `pin_graph` adds control edges to a graph model (the model twin of
`lms.tf.pin`); the others say which edges: the ``serialization`` knobs'
(`ordering_edges`), moved onto pinnable ops (`anchor_edges`), the order of
reads and writes of each resource variable (`resource_order_edges`), and the
model-only edges of oneDNN's merged pairs (`merge_edges`).
"""

from __future__ import annotations

from typing import Iterable

from ..config import LMSConfig, serialization_levels
from ..graph import SHAPE_ONLY_TYPES, Graph, Op, Role
from ..rules import merged_pairs
from ..plan.swap_plan import SWAP_IN_TYPE, SWAP_OUT_TYPE

__all__ = ["pin_graph", "ordering_edges", "anchor_edges", "resource_order_edges", "resource_edges",
           "merge_edges", "RESOURCE_READ_TYPES"]


# ---- the graph the schedule is for -------------------------------------------------------------

def pin_graph(graph: Graph, edges: Iterable[tuple[str, str]]) -> Graph:
    """`graph` with control edges added: ``(a) ..> (b)`` for each ``(a, b)`` (the model twin of `lms.tf.pin`)."""
    extra: dict[str, list[str]] = {}
    for a, b in edges:
        if a != b:
            extra.setdefault(b, []).append(a)
    if not extra:
        return graph
    ops = []
    for op in graph.ops.values():
        if op.name in extra:
            ctrl = tuple(dict.fromkeys(op.control_inputs + tuple(extra[op.name])))
            op = Op(name=op.name, type=op.type, role=op.role, inputs=op.inputs, control_inputs=ctrl,
                    outputs=op.outputs, grad_of=op.grad_of, device=op.device, live=op.live)
        ops.append(op)
    return Graph(ops, graph.tensors.values(), batch_size=graph.batch_size, name=graph.name)


def ordering_edges(graph: Graph, rewritten: Graph, config: LMSConfig) -> tuple[tuple[tuple[str, str], ...],
                                                                             tuple[int, ...]]:
    """The ``serialization``/``serialization_by_size``/``sync_mode`` edges, and the levels serialized.

    Args:
        graph: the graph before swap ops (its levels are the ones a user names).
        rewritten: the graph with swap ops (`rewrite_graph`).
        config: the knobs.
    """
    edges: list[tuple[str, str]] = []
    levels: set[int] = set()
    by_level = graph.ops_by_level
    n_levels = max(by_level) + 1 if by_level else 0
    if config.serialization:
        levels.update(serialization_levels(config.serialization, n_levels))
    if config.serialization_by_size > 0:
        limit = config.serialization_by_size * (1 << 30)
        for lvl, names in by_level.items():
            total = sum(graph.tensor_bytes(t) for n in names for t in graph.ops[n].outputs)
            if total > limit and len(names) > 1:
                levels.add(lvl)
    for lvl in sorted(levels):
        names = [n for n in by_level.get(lvl, ()) if graph.predecessors(n)]  # sources need no order
        edges.extend(zip(names, names[1:]))
    if config.sync_mode in (1, 3):
        for op in rewritten.ops.values():
            if op.type != SWAP_OUT_TYPE:
                continue
            for r in rewritten.data_consumers(op.inputs[0]):
                if r != op.name and rewritten.ops[r].role is Role.FORWARD and rewritten.ops[r].type != SWAP_OUT_TYPE:
                    edges.append((op.name, r))
    if config.sync_mode in (2, 3):
        pinned = pin_graph(rewritten, edges)
        position = {n: i for i, n in enumerate(pinned.topological_order)}
        for op in rewritten.ops.values():
            if op.type != SWAP_IN_TYPE:
                continue
            readers = [r for r in rewritten.data_consumers(op.outputs[0])]
            if not readers:
                continue
            first = min(readers, key=pinned.levels.__getitem__)
            others = [p for p in pinned.predecessors(first)
                      if p != op.name and not pinned.is_ancestor(op.name, p)
                      and pinned.ops[p].type not in SHAPE_ONLY_TYPES and pinned.predecessors(p)]
            if others:
                edges.append((max(others, key=lambda p: (pinned.levels[p], position[p])), op.name))
    return tuple(dict.fromkeys(edges)), tuple(sorted(levels))


def anchor_edges(graph: Graph, edges: Iterable[tuple[str, str]], pinnable: frozenset[str], *,
                 search_limit: int = 256) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    r"""Requested edges as edges between pinnable ops, and the ones that cannot be: ``(anchored, dropped)``.

    ``(a) ..> (b)`` becomes ``(a') ..> (b')``: ``a'`` the nearest pinnable
    ancestor of ``a`` (the deepest of the nearest), ``b'`` the nearest pinnable
    descendant of ``b`` (the shallowest)::

        (p) -> (a) -> ...          (p) ..> (d)   a weaker order: p before d
        (b) -> (d)                 (a, b not pinnable: Conv2D, BatchNorm's Mul)

    ``a'`` precedes ``a`` and ``b'`` follows ``b``, so the anchored edges make a
    cycle only where the requested ones did. An edge the graph already implies
    is left out; one without a pinnable end within `search_limit` ops, dropped.
    """
    anchored: list[tuple[str, str]] = []
    dropped: list[tuple[str, str]] = []
    up: dict[str, str | None] = {}
    down: dict[str, str | None] = {}
    for a, b in edges:
        if a not in up:
            up[a] = _nearest_pinnable(graph, a, pinnable, upward=True, limit=search_limit)
        if b not in down:
            down[b] = _nearest_pinnable(graph, b, pinnable, upward=False, limit=search_limit)
        src, dst = up[a], down[b]
        if src is None or dst is None or src == dst:
            dropped.append((a, b))
        elif not graph.is_ancestor(src, dst):
            anchored.append((src, dst))
    return tuple(dict.fromkeys(anchored)), tuple(dropped)


def _nearest_pinnable(graph: Graph, name: str, pinnable: frozenset[str], *, upward: bool, limit: int) -> str | None:
    if name in pinnable:
        return name
    levels = graph.levels
    seen = {name}
    layer = [name]
    while layer and len(seen) < limit:
        nxt: list[str] = []
        for n in layer:
            for m in (graph.predecessors(n) if upward else graph.successors[n]):
                if m not in seen:
                    seen.add(m)
                    nxt.append(m)
        found = [m for m in nxt if m in pinnable]
        if found:
            return max(found, key=levels.__getitem__) if upward else min(found, key=levels.__getitem__)
        layer = nxt
    return None


# Ops that only read a resource (a variable): they may run in any order among themselves.
RESOURCE_READ_TYPES = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape"})


def resource_order_edges(accesses: Iterable[tuple[str, str, bool]]) -> tuple[tuple[str, str], ...]:
    """Program-order edges between ops that use one resource, as TF's automatic control dependencies add them.

    Args:
        accesses: ``(op, resource, writes)`` in program (creation) order.

    Returns:
        ``(a, b)`` edges: each write after the reads and the write before it,
        each read after the last write before it. tf.function adds these when the
        traced function returns -- after LMS has rewritten it -- so an order that
        read a variable after its update would be a cycle there (and wrong).
    """
    last_write: dict[str, str] = {}
    reads: dict[str, list[str]] = {}
    edges: list[tuple[str, str]] = []
    for op, resource, writes in accesses:
        if writes:
            prior = reads.pop(resource, [])
            edges.extend((r, op) for r in prior if r != op)
            if not prior and resource in last_write and last_write[resource] != op:
                edges.append((last_write[resource], op))
            last_write[resource] = op
        else:
            if resource in last_write and last_write[resource] != op:
                edges.append((last_write[resource], op))
            reads.setdefault(resource, []).append(op)
    return tuple(dict.fromkeys(edges))


def resource_edges(graph: Graph) -> tuple[tuple[str, str], ...]:
    """`resource_order_edges` of a graph model: its ``resource`` tensors, their readers in creation order."""
    accesses = [(op.name, t, op.type not in RESOURCE_READ_TYPES) for op in graph.ops.values() for t in op.inputs
                if graph.tensors[t].dtype == "resource"]
    return tuple((a, b) for a, b in resource_order_edges(accesses) if not graph.is_ancestor(b, a))


def merge_edges(graph: Graph) -> tuple[tuple[str, str], ...]:
    """Model-only edges for oneDNN's merged pairs (`lms.rules.merged_pairs`): the merged op runs after
    every input of both, so ``b`` is ordered after ``a``'s inputs (no pin may then run between them)."""
    edges = []
    for a, b in merged_pairs(graph):
        edges.extend((p, b) for p in graph.predecessors(a) if not graph.is_ancestor(b, p))
    return tuple(edges)
