"""`schedule_ops(graph, plan) -> Schedule`: choose and pin the order the step's ops run in. No TensorFlow.

Without it TensorFlow's executor decides the order, and the order decides the
peak: on Keras 3 ResNet-50 the two branches of a block run their BatchNorm
backward interleaved and hold both branches' full-size temporaries at once, and
SGD computes ``momentum * m`` for every variable as soon as the step starts.
Three kinds of ordering edges, all made here and applied as control edges
(`lms.tf.pin`):

- ``serialization`` / ``serialization_by_size`` (TFLMS v2): the ops of the
  named topological levels of the graph (before swap ops are added) run one
  after another, in creation order: ``(a) (b) (c)`` at one level becomes
  ``(a) ..> (b) ..> (c)``. Levels are those of `Graph.levels`.
- ``sync_mode`` (TFLMS v2): ``1``: every forward reader of a swapped tensor
  waits for its swap-out (``[swap_out] ..> (reader)``), so the forward pass
  cannot run ahead of the link; ``2``: every swap-in is triggered by the
  latest other input of its first reader (no prefetch); ``3``: both.
- ``schedule="memory"``: a whole-step order, pinned by a chain over the ops
  that allocate or read device memory, only where the graph does not already
  order two neighbours (a transitive reduction along the chain: a few hundred
  edges on ResNet-50, not one per op).

Only *pinnable* ops carry these edges (`lms.anchor.pinnable_ops`): a control
edge on an op that Grappler's remapper or arithmetic optimizer would rewrite
(``Conv2D+BiasAdd+Relu`` -> ``_FusedConv2D``, BatchNorm's ``Mul``/``AddV2``)
stops the rewrite, and the step computes with other kernels (results differ in
the last bits); one between two ops oneDNN merges closes a cycle. A requested
edge ``(a) ..> (b)`` whose ends are not pinnable is *anchored*: ``a`` moves to
its nearest pinnable ancestor, ``b`` to its nearest pinnable descendant (a
weaker order, never a cycle); with none, it is dropped (`Schedule.dropped`).
The memory order is pinned through its pinnable ops only, plus one edge into
each swap-in from the last op before it that may carry a control output (the
rule swap-in triggers follow, `lms.anchor.trigger_ops`), so the copy comes in
where the order put it; the others run when TF's executor reaches them, so each candidate is scored by the peak of the
order TF's executor models (`lms.sim.order.executed_order`, both kinds) run
over the graph with its pins, not by the order asked for.

The memory order (anchor: XLA's ``DefaultMemoryScheduler``, which runs a list,
a DFS and a post-order scheduler and keeps the lowest simulated peak) is the
lowest-peak of a few candidates under a liveness model (each output allocated
when its op runs and freed after its last reader, views share their input's
buffer, variables and inputs resident). The candidate built for training
graphs is a list scheduler that at each step runs, among the ready ops:

1. an op that frees at least as much as it allocates (a weight gradient that
   is the last reader of its swapped-in input; a swap-out), or allocates at
   most 4 KiB (shapes, per-channel statistics), most freeing first;
2. else an op some consumer is waiting for (every other input of that consumer
   is ready): the forward and backward chains, and the optimizer's
   ``momentum * m`` only once that variable's gradient exists;
3. else any other op, smallest allocation first, ``OTHER``-role ops last.

Ties go to the op that became ready last, so one branch's backward runs to
completion before the next starts (a depth-first walk). A variant then moves
each backward op that frees no more than it allocates to just before its first
reader (`_sink`): ops such as a per-channel gradient's ``BroadcastTo`` only add
memory, and the list scheduler ran them as soon as they were ready. A swap-in is taken
only when its reader is waiting for it (just in time) and then moved ``lb - 1``
ops earlier (``sync_mode`` 2/3: not moved), never before its trigger. The
other candidates: the same with first-ready ties (breadth-first), a post-order
DFS from the step's outputs, and the creation order.

With ``prefetch="headroom"`` the chosen order's swap-ins then move earlier,
into the memory the order leaves free below its peak (`_prefetched`): a copy
placed just in time stalls its reader for the whole transfer, one placed where
memory is free overlaps compute. How far is checked against TF's executor
models, which run an unpinned reader of an early swap-in early.
"""

from __future__ import annotations

import collections
import copy
import heapq
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .anchor import merged_pairs, pinnable_ops, trigger_ops
from .config import LMSConfig, serialization_levels
from .graph import SHAPE_ONLY_TYPES, Graph, GraphError, Op, Role, group_pairs
from .plan import HOST_DEVICE, SWAP_IN_TYPE, SWAP_OUT_TYPE, SwapPlan, rewrite_graph

__all__ = ["Schedule", "ScheduleError", "schedule_ops", "pin_graph", "order_peak", "ordering_edges",
           "anchor_edges", "merge_edges", "resource_edges", "resource_order_edges", "scoring_batch", "PIN_MIN_BYTES",
           "EXECUTOR_KINDS", "CANDIDATES"]

log = logging.getLogger(__name__)

# Views and resident values: no new device memory (as in `lms.sim.compiled`).
_ALIAS_TYPES = frozenset({"Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "StopGradient",
                          "PreventGradient", "EnsureShape", "CheckNumerics", "CheckNumericsV2", "Bitcast"})
_RESIDENT_TYPES = frozenset({"Const", "HostConst", "VarHandleOp", "ReadVariableOp", "VariableV2", "Variable",
                             "Placeholder", "PlaceholderWithDefault", "_Arg"})
# An op joins the pinned chain when it allocates or reads a buffer at least this large (at the traced
# batch): smaller ones cannot move the peak by more than a few KiB, and they are the ops Grappler folds.
PIN_MIN_BYTES = 4096
# The list scheduler runs ops allocating at most this much as soon as they are ready (shapes,
# per-channel statistics): they cannot raise the peak, and a shape read of a large tensor holds it.
_SMALL_BYTES = 4096
KINDS = ("tf", "memory")
# The candidate orders ``schedule="memory"`` scores (`Schedule.candidates`), in tie-break order, and what each is.
CANDIDATES = {
    "list_lifo_sunk": "list scheduler, newest-ready first, then each backward op that frees nothing run as late "
                      "as its readers allow",
    "list_lifo": "list scheduler, newest-ready first (one branch at a time)",
    "list_fifo": "list scheduler, first-ready first (breadth-first)",
    "post_order": "post-order DFS from the step's outputs (XLA's)",
    "creation": "the order the ops were created in",
    "tf": "TF's executor order, nothing pinned",
}


class ScheduleError(ValueError):
    """A schedule is inconsistent with its graph (not a permutation, not topological, a cyclic pin)."""


@dataclass(frozen=True)
class Schedule:
    """The ordering decided for one graph, plan and config.

    Attributes:
        kind: ``"tf"`` (TF's executor orders the ops; only `constraints` are
            added) or ``"memory"`` (`order` is pinned).
        order: every op of the rewritten graph in the order chosen (``()``
            for ``"tf"``).
        constraints: ordering edges ``(before, after)`` from ``serialization``,
            ``serialization_by_size`` and ``sync_mode``, as requested.
        pins: the edges applied: the constraints anchored, then for
            ``"memory"`` the chain that pins `order`'s pinnable ops that
            allocate or read device memory, minus neighbours the graph already
            orders, and one edge into each swap-in from the last trigger op
            before it (`lms.anchor.trigger_ops`; all other edges join
            pinnable ops).
        dropped: requested constraints no pinnable pair can express.
        candidates: estimated peak bytes of each candidate order at `batch`, as
            TF's executor models run it with the candidate's pins (the larger of
            the ``"executor"`` and ``"single_threaded"`` models).
        chosen: the candidate kept.
        prefetch_share: with ``prefetch="headroom"``, the share of the order's
            peak its swap-ins were moved into (0: none moved; see `_prefetched`).
        batch: batch the sizes were taken at.
        serialized_levels: the levels ``serialization`` chained.
        schedule_s: wall time of the pass.
    """

    kind: str
    order: tuple[str, ...] = ()
    constraints: tuple[tuple[str, str], ...] = ()
    pins: tuple[tuple[str, str], ...] = ()
    dropped: tuple[tuple[str, str], ...] = ()
    candidates: Mapping[str, int] = field(default_factory=dict)
    chosen: str = ""
    prefetch_share: float = 0.0
    batch: int = 1
    serialized_levels: tuple[int, ...] = ()
    schedule_s: float = 0.0

    @property
    def edges(self) -> tuple[tuple[str, str], ...]:
        """Every control edge to add (`pins`)."""
        return self.pins

    @property
    def pinned(self) -> bool:
        return bool(self.order)

    def summary(self) -> dict[str, Any]:
        """JSON-ready description (without the full order)."""
        return {"kind": self.kind, "n_ops": len(self.order), "n_constraints": len(self.constraints),
                "n_pins": len(self.pins), "n_dropped": len(self.dropped), "candidates": dict(self.candidates),
                "chosen": self.chosen, "prefetch_share": self.prefetch_share,
                "batch": self.batch, "serialized_levels": list(self.serialized_levels),
                "schedule_s": round(self.schedule_s, 4)}

    def validate(self, graph: Graph, *, pinnable: frozenset[str] | None = None,
                 triggers: frozenset[str] | None = None) -> None:
        """Check against the rewritten graph (`rewrite_graph(graph, plan)`, before pinning).

        Checks: every edge names known ops; the graph plus every edge is acyclic;
        every pin joins two pinnable ops (`lms.anchor.pinnable_ops`), or a
        trigger op and a swap-in (`lms.anchor.trigger_ops`); a pinned
        order is a permutation of the graph's ops, topological for the graph
        plus `constraints` and the pins.

        Raises:
            ScheduleError: naming the first problem.
        """
        for a, b in self.constraints + self.pins:
            for name in (a, b):
                if name not in graph.ops:
                    raise ScheduleError(f"edge {a!r} -> {b!r}: unknown op {name!r}")
        pinnable = pinnable_ops(graph) if pinnable is None else pinnable
        for a, b in self.pins:
            if a not in pinnable and b in pinnable and graph.ops[b].type == SWAP_IN_TYPE:
                triggers = trigger_ops(graph, pinnable=pinnable) if triggers is None else triggers
                if a in triggers:
                    continue  # a swap-in's trigger: only a control output on `a`
            for name in (a, b):
                if name not in pinnable:
                    raise ScheduleError(f"pin {a!r} -> {b!r}: {name!r} ({graph.ops[name].type}) is not pinnable: "
                                        "a control edge on it would change TF's rewrites")
        if self.order and self._is_topological(graph):
            return  # a topological order of the graph plus the pins: acyclic, a permutation, respected
        try:
            pinned = pin_graph(graph, self.pins)
            pinned.topological_order
        except GraphError as exc:
            raise ScheduleError(f"the ordering edges make a cycle: {exc}") from None
        if not self.order:
            return
        if len(self.order) != len(pinned.ops) or set(self.order) != set(pinned.ops):
            missing = sorted(set(pinned.ops) - set(self.order))[:3]
            raise ScheduleError(f"order has {len(self.order)} ops, the graph {len(pinned.ops)}; e.g. missing {missing}")
        pos = {n: i for i, n in enumerate(self.order)}
        for op in pinned.ops.values():  # the order respects the graph and every pin
            for p in pinned.predecessors(op.name):
                if pos[p] > pos[op.name]:
                    raise ScheduleError(f"order runs {op.name!r} before its input {p!r}")

    def _is_topological(self, graph: Graph) -> bool:
        """True when `order` is a permutation of `graph`'s ops that runs every op after its inputs and pins."""
        if len(self.order) != len(graph.ops):
            return False
        pos = {n: i for i, n in enumerate(self.order)}
        if len(pos) != len(graph.ops) or any(n not in pos for n in graph.ops):
            return False
        return (all(pos[p] < i for i, n in enumerate(self.order) for p in graph.predecessors(n))
                and all(pos[a] < pos[b] for a, b in self.pins if a != b))


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
                    outputs=op.outputs, grad_of=op.grad_of, device=op.device)
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
    """Model-only edges for oneDNN's merged pairs (`lms.anchor.merged_pairs`): the merged op runs after
    every input of both, so ``b`` is ordered after ``a``'s inputs (no pin may then run between them)."""
    edges = []
    for a, b in merged_pairs(graph):
        edges.extend((p, b) for p in graph.predecessors(a) if not graph.is_ancestor(b, p))
    return tuple(edges)


# ---- the liveness model ------------------------------------------------------------------------

@dataclass(frozen=True)
class _Model:
    """Buffers of a graph: which tensor is a view of which, sizes, readers (batch-specific sizes)."""

    names: tuple[str, ...]
    index: Mapping[str, int]
    preds: tuple[tuple[int, ...], ...]
    succs: tuple[tuple[int, ...], ...]
    alloc: np.ndarray          # bytes an op allocates (its own buffers that someone reads)
    reads: tuple[tuple[int, ...], ...]   # buffers an op reads (data, through views; shape-only readers too)
    owns: tuple[tuple[int, ...], ...]    # buffers an op allocates
    buf_size: np.ndarray
    buf_readers: tuple[tuple[int, ...], ...]
    roles: tuple[Role, ...]
    types: tuple[str, ...]
    buf_owner: np.ndarray      # op that allocates each buffer
    read_ops: np.ndarray       # every buffer's readers, buffer after buffer (`_peak`)
    read_starts: np.ndarray    # where each buffer's readers start in `read_ops`, for buffers with readers
    has_readers: np.ndarray    # bool per buffer


def _model(g: Graph, batch: int) -> _Model:
    names = tuple(g.ops)
    index = {n: i for i, n in enumerate(names)}
    buf_of: dict[str, int] = {}
    buf_size: list[int] = []
    buf_owner: list[int] = []
    owns: list[tuple[int, ...]] = [()] * len(names)  # tuples, not lists: see `lms.graph.group_pairs`
    for name in g.topological_order:
        op = g.ops[name]
        i = index[name]
        for k, t in enumerate(op.outputs):
            if op.type in _ALIAS_TYPES and op.inputs:
                src = op.inputs[k if op.type == "IdentityN" and k < len(op.inputs) else 0]
                buf_of[t] = buf_of.get(src, -1)
                continue
            if op.type in _RESIDENT_TYPES or op.device == HOST_DEVICE:
                buf_of[t] = -1
                continue
            size = g.tensors[t].nbytes(batch)
            if size <= 0:
                buf_of[t] = -1
                continue
            buf_of[t] = len(buf_size)
            buf_size.append(-(-size // 256) * 256)
            buf_owner.append(i)
            owns[i] += (buf_of[t],)
    reads: list[tuple[int, ...]] = []
    for name in names:
        bufs = {buf_of[t] for t in g.ops[name].inputs if buf_of.get(t, -1) >= 0}  # a view holds its buffer too
        reads.append(tuple(sorted(bufs)))
    readers = group_pairs((b, i) for i, bufs in enumerate(reads) for b in bufs)  # ascending op indexes
    preds = tuple(tuple(index[p] for p in g.predecessors(n) if p in index) for n in names)
    succs = tuple(tuple(index[s] for s in g.successors[n]) for n in names)
    sizes = np.asarray(buf_size, dtype=np.int64)
    alloc = np.asarray([sum(buf_size[b] for b in o) for o in owns], dtype=np.int64)
    buf_readers = tuple(readers.get(b, ()) for b in range(len(buf_size)))
    counts = np.asarray([len(r) for r in buf_readers], dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1])) if len(counts) else counts
    return _Model(names=names, index=index, preds=preds, succs=succs, alloc=alloc, reads=tuple(reads),
                  owns=tuple(owns), buf_size=sizes, buf_readers=buf_readers,
                  roles=tuple(g.ops[n].role for n in names), types=tuple(g.ops[n].type for n in names),
                  buf_owner=np.asarray(buf_owner, dtype=np.int64),
                  read_ops=np.asarray([r for rs in buf_readers for r in rs], dtype=np.int64),
                  read_starts=starts[counts > 0], has_readers=counts > 0)


def _peak(m: _Model, order: list[int]) -> int:
    """Peak live bytes of `order` (positions of op indices) under the liveness model."""
    return int(_live_bytes(m, order).max()) if order else 0


def _live_bytes(m: _Model, order: list[int]) -> np.ndarray:
    """Live bytes at each position of `order` (positions of op indices) under the liveness model.

    Each buffer is live from its owner's position to its last reader's (its
    owner's if nobody reads it): one vectorized pass, +size at the start, -size
    after the end, a running sum.
    """
    n = len(order)
    pos = np.empty(n, dtype=np.int64)
    pos[np.asarray(order, dtype=np.int64)] = np.arange(n)
    start = pos[m.buf_owner]
    end = start.copy()
    if m.read_ops.size:
        last_read = np.maximum.reduceat(pos[m.read_ops], m.read_starts)
        end[m.has_readers] = np.maximum(last_read, start[m.has_readers])
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, start, m.buf_size)
    np.add.at(delta, end + 1, -m.buf_size)
    return np.cumsum(delta[:n])


def order_peak(graph: Graph, order: Iterable[str], *, batch: int | None = None) -> int:
    """Peak live bytes of `order` over `graph` under the schedule's liveness model (no temporaries)."""
    m = _model(graph, graph.batch_size if batch is None else batch)
    return _peak(m, [m.index[n] for n in order])


# ---- candidate orders --------------------------------------------------------------------------

def _list_schedule(m: _Model, *, lifo: bool) -> list[int]:
    """The training-graph list scheduler of the module docstring."""
    n = len(m.names)
    pending = [len(p) for p in m.preds]
    ready_pending = [0] * n        # of a consumer: its preds that are ready but not run
    remaining = [len(r) for r in m.buf_readers]
    is_ready = [False] * n
    done = [False] * n
    version = [0] * n
    seq = [0] * n
    counter = 0
    heap: list[tuple[int, int, int, int, int]] = []
    swap_in = [t == SWAP_IN_TYPE for t in m.types]
    other = [r is Role.OTHER for r in m.roles]

    def wanted(i: int) -> bool:
        return any(pending[c] == ready_pending[c] for c in m.succs[i])

    def key(i: int) -> tuple[int, int]:
        freed = 0
        for b in m.reads[i]:
            if remaining[b] == 1:
                freed += int(m.buf_size[b])
        delta = int(m.alloc[i]) - freed
        if swap_in[i]:
            return (1 if wanted(i) else 4), delta
        if delta <= 0 or m.alloc[i] <= _SMALL_BYTES:
            return 0, delta
        if wanted(i):
            return 1, delta
        return (3 if other[i] else 2), delta

    def push(i: int) -> None:
        version[i] += 1
        cat, delta = key(i)
        order_key = -seq[i] if lifo else seq[i]
        # freeing ops: most freeing first; the rest: newest first (stay on one branch until it is done)
        heapq.heappush(heap, (cat, delta if cat == 0 else 0, order_key, i, version[i]))

    def make_ready(i: int) -> None:
        nonlocal counter
        is_ready[i] = True
        counter += 1
        seq[i] = counter
        for c in m.succs[i]:
            ready_pending[c] += 1
            if ready_pending[c] == pending[c]:
                wake(c, skip=i)
        push(i)

    def wake(c: int, skip: int = -1) -> None:
        """Every input of `c` is ready: its waiting inputs become the newest (depth-first focus)."""
        nonlocal counter
        for p in m.preds[c]:
            if is_ready[p] and not done[p] and p != skip:
                counter += 1
                seq[p] = counter
                push(p)

    for i in range(n):
        if pending[i] == 0:
            make_ready(i)
    order: list[int] = []
    while heap:
        cat, delta, _, i, ver = heapq.heappop(heap)
        if done[i] or ver != version[i]:
            continue
        now = key(i)
        if (cat, delta) != (now[0], now[1] if now[0] == 0 else 0):  # stale priority: retry with the current one
            push(i)
            continue
        done[i] = True
        order.append(i)
        for b in m.reads[i]:
            remaining[b] -= 1
            if remaining[b] == 1:
                last = next(r for r in m.buf_readers[b] if not done[r])
                if is_ready[last]:
                    push(last)
        for c in m.succs[i]:
            pending[c] -= 1
            ready_pending[c] -= 1
            if pending[c] == 0:
                make_ready(c)
            elif pending[c] == ready_pending[c]:
                wake(c)
    if len(order) != n:
        raise GraphError("graph has a cycle (the list scheduler could not order every op)")
    return order


def _sink(m: _Model, order: list[int]) -> list[int]:
    """`order` with each backward op that frees no more than it allocates moved to just before its first reader.

    Such an op (a ``BroadcastTo`` of a per-channel gradient; a ``RealDiv`` that
    replaces its input with a same-size output) only adds memory where it runs,
    so it should run as late as possible. The list scheduler runs it as soon as
    it is ready, which on ResNet-50 starts one BatchNorm branch's mean gradient
    (two 3 GiB tensors at batch 1,012) and keeps it through the other branch's
    whole backward pass. Ops are visited from the last to the first, so a chain
    (``BroadcastTo -> RealDiv -> AddN``) sinks as a whole. Swap ops keep their
    places (`_place_swap_ins` moves swap-ins); forward ops are not moved.
    """
    order = list(order)
    n = len(order)
    pos = np.empty(n, dtype=np.int64)
    pos[np.asarray(order, dtype=np.int64)] = np.arange(n)
    for x in reversed(list(order)):
        if (m.alloc[x] < PIN_MIN_BYTES or m.roles[x] is not Role.BACKWARD or not m.succs[x]
                or m.types[x] in (SWAP_IN_TYPE, SWAP_OUT_TYPE)):
            continue
        px = int(pos[x])
        target = min(int(pos[c]) for c in m.succs[x])
        if target <= px + 1:
            continue
        freed = sum(int(m.buf_size[b]) for b in m.reads[x]
                    if max(int(pos[r]) for r in m.buf_readers[b]) <= px)
        if int(m.alloc[x]) - freed < -_SMALL_BYTES:  # frees memory: the earlier the better
            continue
        order.pop(px)
        order.insert(target - 1, x)
        pos[np.asarray(order[px:target], dtype=np.int64)] = np.arange(px, target)
    return order


def _post_order(m: _Model) -> list[int]:
    """XLA's post-order scheduler: a DFS from the sinks, each op after its inputs, inputs in graph order."""
    n = len(m.names)
    done = [False] * n
    order: list[int] = []
    sinks = [i for i in range(n) if not m.succs[i]]
    for root in sinks:
        stack: list[tuple[int, int]] = [(root, 0)]
        while stack:
            i, k = stack.pop()
            if done[i]:
                continue
            preds = m.preds[i]
            while k < len(preds) and done[preds[k]]:
                k += 1
            if k < len(preds):
                stack.append((i, k + 1))
                stack.append((preds[k], 0))
                continue
            done[i] = True
            order.append(i)
    return order


def _place_swap_ins(m: _Model, order: list[int], lead: int) -> list[int]:
    """Move each swap-in up to `lead` ops earlier, never before its inputs (trigger, swap-out)."""
    if lead <= 0:
        return order
    out = list(order)
    pos = {x: k for k, x in enumerate(out)}
    for i in [i for i in order if m.types[i] == SWAP_IN_TYPE]:
        p = pos[i]
        floor = max((pos[q] for q in m.preds[i]), default=-1)
        target = max(floor + 1, p - lead)
        if target < p:
            out[target + 1:p + 1] = out[target:p]  # shift the window right by one
            out[target] = i
            for k in range(target, p + 1):
                pos[out[k]] = k
    return out


def _prefetch(m: _Model, order: list[int], share: float) -> list[int]:
    """`order` with each swap-in moved as early as `share` of the order's peak leaves room for it.

    A swap-in steps back op by op, never before its inputs (its trigger, its
    swap-out) nor before the swap-in placed before it (the host-to-device
    copies stay in the order their readers need them), while its buffer fits
    under ``share * peak`` at every position it newly spans; the bytes it adds
    there count for the swap-ins after it.
    """
    n = len(order)
    if not n:
        return order
    live = _live_bytes(m, order)
    cap = int(live.max() * share)
    pos = np.empty(n, dtype=np.int64)
    pos[np.asarray(order, dtype=np.int64)] = np.arange(n)
    target: dict[int, int] = {}
    prev = 0
    for p, i in enumerate(order):
        if m.types[i] != SWAP_IN_TYPE:
            continue
        size = int(sum(int(m.buf_size[b]) for b in m.owns[i]))
        floor = max(max((int(pos[q]) for q in m.preds[i]), default=-1) + 1, prev)
        t = p
        while t > floor and live[t - 1] + size <= cap:
            t -= 1
        live[t:p] += size
        target[i] = prev = t
    # a moved swap-in runs before the op that was at its target; ties keep their order
    keyed = sorted((target[i], 0, k, i) if i in target else (k, 1, k, i) for k, i in enumerate(order))
    return [i for *_, i in keyed]


# Headroom shares `_prefetched` tries, largest first; 0 keeps the order as it is.
_PREFETCH_SHARES = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.0)
# Prefetch is checked at a batch where the per-sample tensors hold this many times the fixed ones.
_PREFETCH_DOMINANCE = 256


def _prefetched(g: Graph, order: list[int], pins_of: Any, executor: "_ExecutorModel") -> tuple[list[int], float]:
    """`order` with its swap-ins moved into the headroom (`_prefetch`) as far as the executed peak allows.

    TF's executor runs an unpinned reader of a moved swap-in as soon as its
    other inputs exist, earlier than the order put it, so the order's own
    liveness under-counts what prefetching costs. The largest share of
    `_PREFETCH_SHARES` whose pins do not raise the peak of the orders TF's
    executor models run (each of `_ExecutorModel.peaks`) is kept, judged at a batch
    where activations dominate (`_PREFETCH_DOMINANCE`): the batches LMS is for.
    """
    m = _model(g, scoring_batch(g, dominance=_PREFETCH_DOMINANCE))
    big = executor.resized(m)
    limits = big.peaks(pins_of(order))
    for share in _PREFETCH_SHARES[:-1]:
        moved = _prefetch(m, order, share)
        if moved != order and all(p <= q for p, q in zip(big.peaks(pins_of(moved)), limits)):
            return moved, share
    return order, 0.0


# ---- pins --------------------------------------------------------------------------------------

def _chain_pins(g: Graph, m: _Model, order: list[int], pinnable: frozenset[str]) -> tuple[tuple[str, str], ...]:
    """Edges that pin `order` among its pinnable ops that allocate or read >= `PIN_MIN_BYTES` (and swap ops).

    Consecutive chain members ``a, b`` get ``a ..> b`` unless the graph already
    runs ``a`` before ``b``: ``a`` is an input of ``b``, or an input of an input
    of ``b`` that is not itself in the chain.
    """
    big = m.buf_size >= PIN_MIN_BYTES
    chain = []
    for i in order:
        if m.names[i] not in pinnable or not m.preds[i]:
            continue
        if (m.types[i] in (SWAP_IN_TYPE, SWAP_OUT_TYPE) or any(big[b] for b in m.owns[i])
                or any(big[b] for b in m.reads[i])):
            chain.append(i)
    member = set(chain)
    pins: list[tuple[str, str]] = []
    for a, b in zip(chain, chain[1:]):
        preds = m.preds[b]
        if a in preds or any(a in m.preds[p] for p in preds if p not in member):
            continue
        pins.append((m.names[a], m.names[b]))
    return tuple(pins)


def _trigger_pins(m: _Model, order: list[int], triggers: frozenset[str]) -> tuple[tuple[str, str], ...]:
    """For each swap-in of `order`: an edge from the last trigger op before it (stopping at a swap op or an input).

    The chain pins a swap-in behind the previous pinnable op of the order; in a
    stretch of elementwise backward ops (BatchNorm's gradient) that op may be far
    earlier, and TF's executor would copy the tensor in long before its reader
    needs it (seen: ResNet-50's ``pool1`` output held 0.7 GiB through a whole
    BatchNorm backward at the peak). An edge from the latest op before the
    swap-in that may carry a control output (`lms.anchor.trigger_ops`) keeps the
    copy where the order put it. Skipped where that op is already an input.
    """
    pins: list[tuple[str, str]] = []
    for k, i in enumerate(order):
        if m.types[i] != SWAP_IN_TYPE or m.names[i] not in triggers:  # not pinnable (e.g. folded)
            continue
        preds = m.preds[i]
        for j in (order[p] for p in range(k - 1, -1, -1)):
            if j in preds or m.types[j] in (SWAP_IN_TYPE, SWAP_OUT_TYPE):
                break  # already an input, or a swap op the chain orders it behind
            if m.names[j] in triggers:
                if m.roles[j] is Role.BACKWARD:
                    pins.append((m.names[j], m.names[i]))
                break
    return tuple(pins)


# ---- the pass ----------------------------------------------------------------------------------

def schedule_ops(graph: Graph, plan: SwapPlan | None = None, *, config: LMSConfig | None = None,
                 batch: int | None = None) -> Schedule:
    """Decide the ordering edges (and, for ``schedule="memory"``, the whole order) of one step.

    Args:
        graph: the training graph model, before swap ops.
        plan: its swap plan (``None``: no swaps).
        config: the knobs (default: the plan's config, else `LMSConfig()`).
        batch: batch the liveness model sizes tensors at (default: the graph's),
            raised to `scoring_batch` where resident bytes would hide the order.

    Returns:
        A `Schedule` over ``rewrite_graph(graph, plan)``; validated.
    """
    t0 = time.perf_counter()
    if config is None:
        config = plan.config if plan is not None else LMSConfig()
    batch = graph.batch_size if batch is None else batch
    rewritten = rewrite_graph(graph, plan) if plan is not None and plan.rewrites else graph
    constraints, levels = ordering_edges(graph, rewritten, config)
    pinnable = pinnable_ops(rewritten)
    anchored, dropped = anchor_edges(rewritten, constraints, pinnable)
    if dropped:
        log.info("schedule %s: %d of %d ordering edges dropped: no op near them can carry a control edge "
                 "without changing TF's rewrites", graph.name, len(dropped), len(constraints))
    if config.schedule == "tf":
        sched = Schedule(kind="tf", constraints=constraints, pins=anchored, dropped=dropped, batch=batch,
                         serialized_levels=levels, schedule_s=time.perf_counter() - t0)
        sched.validate(rewritten, pinnable=pinnable)
        return sched
    from .sim.shapes import complete_sizes  # lms.sim imports this module lazily: no cycle

    # The order respects every edge of the graph as built, identities included (pins that relied on
    # Grappler bypassing an identity -- Keras passes all gradients through one -- would close a cycle),
    # the anchored constraints, oneDNN's merges, and the variable reads and writes in program order.
    g = complete_sizes(pin_graph(rewritten, anchored + merge_edges(rewritten) + resource_edges(rewritten)))
    batch = max(batch, scoring_batch(g))
    m = _model(g, batch)
    lead = 0 if config.sync_mode in (2, 3) else config.lb - 1
    lifo = _list_schedule(m, lifo=True)
    candidates: dict[str, list[int]] = {
        "list_lifo_sunk": _place_swap_ins(m, _sink(m, lifo), lead),
        "list_lifo": _place_swap_ins(m, lifo, lead),
        "list_fifo": _place_swap_ins(m, _list_schedule(m, lifo=False), lead),
        "post_order": _post_order(m),
        "creation": [m.index[n] for n in g.topological_order],
    }
    triggers = trigger_ops(rewritten, pinnable=pinnable)
    def pins_for(order: list[int]) -> tuple[tuple[str, str], ...]:
        return _chain_pins(g, m, order, pinnable) + _trigger_pins(m, order, triggers)

    pins_of = {name: pins_for(order) for name, order in candidates.items()}
    pins_of["tf"] = ()  # TF's own order, nothing pinned: the pass never does worse than without it
    executor = _ExecutorModel(g, m)
    tf_orders = executor.orders(())
    candidates["tf"] = tf_orders[1]
    # candidates often pin alike: score each pin set once
    scored: dict[tuple[tuple[str, str], ...], int] = {(): max(_peak(m, order) for order in tf_orders)}
    peaks = {name: scored.setdefault(pins, executor.peak(pins)) if pins not in scored else scored[pins]
             for name, pins in pins_of.items()}
    chosen = min(peaks, key=lambda k: (peaks[k], list(candidates).index(k)))
    order = candidates[chosen]
    share = 0.0
    if config.prefetch == "headroom" and chosen != "tf" and lead == config.lb - 1:
        order, share = _prefetched(g, order, pins_for, executor)
        if share:
            pins_of[chosen] = pins_for(order)
    sched = Schedule(kind="memory", order=tuple(m.names[i] for i in order), constraints=constraints,
                     pins=tuple(dict.fromkeys(anchored + pins_of[chosen])), dropped=dropped, candidates=peaks,
                     chosen=chosen, prefetch_share=share, batch=batch, serialized_levels=levels,
                     schedule_s=time.perf_counter() - t0)
    sched.validate(rewritten, pinnable=pinnable, triggers=triggers)
    log.debug("schedule %s: %s of %s, %d pins, %.3f s", graph.name, chosen, peaks, len(sched.pins),
              sched.schedule_s)
    return sched


EXECUTOR_KINDS = ("executor", "single_threaded")
# Score orders at a batch where per-sample tensors hold at least this many times the fixed bytes.
_PER_SAMPLE_DOMINANCE = 4
_MAX_SCORING_BATCH = 4096


def scoring_batch(graph: Graph, *, dominance: int = _PER_SAMPLE_DOMINANCE) -> int:
    """The smallest batch at which the per-sample tensors hold `dominance` times the fixed ones.

    At the batch a step is traced at (often 1 or 2) the weights and optimizer
    slots can outweigh the activations, and every order then peaks alike; the
    order matters at the batches LMS is for, so candidates are compared there.
    """
    fixed = sum(t.fixed_bytes for t in graph.tensors.values())
    per_sample = sum(t.per_sample_bytes for t in graph.tensors.values())
    if per_sample <= 0:
        return 1
    return int(min(_MAX_SCORING_BATCH, max(1, -(-dominance * fixed // per_sample))))


class _ExecutorModel:
    """`lms.sim.order.executed_order`'s two models over `_Model`'s op indexes, for one graph and many pin sets.

    Same orders as ``executed_order(pin_graph(g, pins), kind)`` for ``"executor"``
    (no op expensive: each root's task runs its ops FIFO) and
    ``"single_threaded"`` (a reverse post-order), without building a graph per
    pin set: a pin ``(a, b)`` adds ``b`` to ``a``'s successors, kept in creation
    (index) order as `Graph.successors` keeps them.
    """

    def __init__(self, g: Graph, m: _Model) -> None:
        from .sim.order import root_rank

        self.m = m
        self.succs = m.succs
        self.n_preds = [len(p) for p in m.preds]
        self.roots = [i for i in range(len(m.names)) if not m.preds[i]]  # pins end on ops with inputs
        self.ranked_roots = sorted(self.roots, key=lambda i: root_rank(g, m.names[i]))

    def resized(self, m: _Model) -> "_ExecutorModel":
        """The same graph's executor models over `m` (the graph's buffers sized at another batch)."""
        other = copy.copy(self)
        other.m = m
        return other

    def _pinned(self, pins: tuple[tuple[str, str], ...]) -> tuple[Sequence[Sequence[int]], Sequence[int]]:
        """Successor lists and predecessor counts of the graph with `pins` added."""
        if not pins:
            return self.succs, self.n_preds
        index, preds = self.m.index, self.m.preds
        added: dict[int, set[int]] = {}
        n_preds = list(self.n_preds)
        for a, b in pins:
            i, j = index[a], index[b]
            if i == j or i in preds[j] or j in added.get(i, ()):
                continue
            added.setdefault(i, set()).add(j)
            n_preds[j] += 1
        succs = list(self.succs)
        for i, extra in added.items():
            succs[i] = sorted(extra.union(succs[i]))
        return succs, n_preds

    def orders(self, pins: tuple[tuple[str, str], ...]) -> tuple[list[int], list[int]]:
        """The ``"executor"`` and ``"single_threaded"`` orders of the graph with `pins` added."""
        succs, n_preds = self._pinned(pins)
        pending = list(n_preds)
        executor: list[int] = []
        for root in self.ranked_roots:  # one task per root; nothing expensive, so no task is ever pushed
            inline = collections.deque((root,))
            while inline:
                i = inline.popleft()
                executor.append(i)
                for s in succs[i]:
                    pending[s] -= 1
                    if not pending[s]:
                        inline.append(s)
        visited = bytearray(len(succs))
        post: list[int] = []
        stack = list(self.roots)  # ~i: leave i (all its successors are done)
        while stack:
            i = stack.pop()
            if i < 0:
                post.append(~i)
                continue
            if visited[i]:
                continue
            visited[i] = 1
            stack.append(~i)
            stack.extend(reversed(succs[i]))  # visited ones are skipped when popped
        post.reverse()
        if len(executor) != len(succs) or len(post) != len(succs):
            raise GraphError("the pins make a cycle (TF's executor could not run every op)")
        return executor, post

    def peaks(self, pins: tuple[tuple[str, str], ...]) -> tuple[int, int]:
        """The peaks of the ``"executor"`` and ``"single_threaded"`` orders of the graph with `pins` added."""
        executor, single = self.orders(pins)
        return _peak(self.m, executor), _peak(self.m, single)

    def peak(self, pins: tuple[tuple[str, str], ...]) -> int:
        """The peak of the orders TF's executor models run the graph in with `pins` added (the larger of the two)."""
        return max(self.peaks(pins))
