"""The models `lms.schedule.schedule_ops` scores orders with: liveness, and TF's executor. No TensorFlow.

- The liveness model (`buffer_model`, `live_peak`, `order_peak`): each output allocated
  when its op runs and freed after its last reader, views share their input's
  buffer, variables and inputs resident.
- The executor model (`ExecutorModel`): the orders TF's executor models
  (`lms.order.executed_order`, both kinds) run the graph in once pins are
  added, over the liveness model's op indexes, without building a graph per
  pin set.

Both size buffers at one batch: `scoring_batch`, where the per-sample tensors
outweigh the fixed ones and the order matters.
"""

from __future__ import annotations

import collections
import copy
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from ..graph import Graph, GraphError, Role, group_pairs
from ..optypes import INPUT_TYPES, RESIDENT_TYPES, VIEW_TYPES
from ..order import root_rank
from ..plan.swap_plan import HOST_DEVICE

__all__ = ["BufferModel", "buffer_model", "live_bytes", "live_peak", "order_peak", "scoring_batch", "ExecutorModel",
           "EXECUTOR_KINDS"]

# Resident values (constants, variables, the step's inputs): no new device memory (as in `lms.sim.compiled`).
_RESIDENT_TYPES = RESIDENT_TYPES | INPUT_TYPES


# ---- the liveness model ------------------------------------------------------------------------

@dataclass(frozen=True)
class BufferModel:
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
    read_ops: np.ndarray       # every buffer's readers, buffer after buffer (`live_peak`)
    read_starts: np.ndarray    # where each buffer's readers start in `read_ops`, for buffers with readers
    has_readers: np.ndarray    # bool per buffer


def buffer_model(g: Graph, batch: int) -> BufferModel:
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
            if op.type in VIEW_TYPES and op.inputs:
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
    return BufferModel(names=names, index=index, preds=preds, succs=succs, alloc=alloc, reads=tuple(reads),
                  owns=tuple(owns), buf_size=sizes, buf_readers=buf_readers,
                  roles=tuple(g.ops[n].role for n in names), types=tuple(g.ops[n].type for n in names),
                  buf_owner=np.asarray(buf_owner, dtype=np.int64),
                  read_ops=np.asarray([r for rs in buf_readers for r in rs], dtype=np.int64),
                  read_starts=starts[counts > 0], has_readers=counts > 0)


def live_peak(m: BufferModel, order: list[int]) -> int:
    """Peak live bytes of `order` (positions of op indices) under the liveness model."""
    return int(live_bytes(m, order).max()) if order else 0


def live_bytes(m: BufferModel, order: list[int]) -> np.ndarray:
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
    m = buffer_model(graph, graph.batch_size if batch is None else batch)
    return live_peak(m, [m.index[n] for n in order])


# ---- the batch orders are scored at -----------------------------------------------------------

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



# ---- TF's executor ----------------------------------------------------------------------------

EXECUTOR_KINDS = ("executor", "single_threaded")


class ExecutorModel:
    """`lms.order.executed_order`'s two models over `BufferModel`'s op indexes, for one graph and many pin sets.

    Same orders as ``executed_order(pin_graph(g, pins), kind)`` for ``"executor"``
    (no op expensive: each root's task runs its ops FIFO) and
    ``"single_threaded"`` (a reverse post-order), without building a graph per
    pin set: a pin ``(a, b)`` adds ``b`` to ``a``'s successors, kept in creation
    (index) order as `Graph.successors` keeps them.
    """

    def __init__(self, g: Graph, m: BufferModel) -> None:
        self.m = m
        self.succs = m.succs
        self.n_preds = [len(p) for p in m.preds]
        self.roots = [i for i in range(len(m.names)) if not m.preds[i]]  # pins end on ops with inputs
        self.ranked_roots = sorted(self.roots, key=lambda i: root_rank(g, m.names[i]))

    def resized(self, m: BufferModel) -> "ExecutorModel":
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
        return live_peak(self.m, executor), live_peak(self.m, single)

    def peak(self, pins: tuple[tuple[str, str], ...]) -> int:
        """The peak of the orders TF's executor models run the graph in with `pins` added (the larger of the two)."""
        return max(self.peaks(pins))
