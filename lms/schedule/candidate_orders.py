"""The candidate orders `lms.schedule.schedule_ops` scores for ``schedule="memory"``. No TensorFlow.

Each is a list of op indexes of the liveness model (`lms.schedule.models`). The
candidate built for training graphs is a list scheduler that at each step runs,
among the ready ops:

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
reader (`sink`): ops such as a per-channel gradient's ``BroadcastTo`` only add
memory, and the list scheduler ran them as soon as they were ready. A swap-in is taken
only when its reader is waiting for it (just in time) and then moved ``lb - 1``
ops earlier (``sync_mode`` 2/3: not moved), never before its trigger. The
other candidates: the same with first-ready ties (breadth-first), a post-order
DFS from the step's outputs, and the creation order.

With ``prefetch="headroom"`` the chosen order's swap-ins then move earlier,
into the memory the order leaves free below its peak (`prefetched`): a copy
placed just in time stalls its reader for the whole transfer, one placed where
memory is free overlaps compute. How far is checked against TF's executor
models, which run an unpinned reader of an early swap-in early.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from ..graph import Graph, GraphError, Role
from ..plan.swap_plan import SWAP_IN_TYPE, SWAP_OUT_TYPE
from .models import ExecutorModel, live_bytes, BufferModel, buffer_model, scoring_batch

__all__ = ["PIN_MIN_BYTES", "list_schedule", "sink", "post_order", "place_swap_ins", "prefetch_order", "prefetched",
           "PREFETCH_SHARES", "PREFETCH_DOMINANCE"]

# An op joins the pinned chain when it allocates or reads a buffer at least this large (at the traced
# batch): smaller ones cannot move the peak by more than a few KiB, and they are the ops Grappler folds.
PIN_MIN_BYTES = 4096
# The list scheduler runs ops allocating at most this much as soon as they are ready (shapes,
# per-channel statistics): they cannot raise the peak, and a shape read of a large tensor holds it.
_SMALL_BYTES = 4096


# ---- candidate orders --------------------------------------------------------------------------

def list_schedule(m: BufferModel, *, lifo: bool) -> list[int]:
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


def sink(m: BufferModel, order: list[int]) -> list[int]:
    """`order` with each backward op that frees no more than it allocates moved to just before its first reader.

    Such an op (a ``BroadcastTo`` of a per-channel gradient; a ``RealDiv`` that
    replaces its input with a same-size output) only adds memory where it runs,
    so it should run as late as possible. The list scheduler runs it as soon as
    it is ready, which on ResNet-50 starts one BatchNorm branch's mean gradient
    (two 3 GiB tensors at batch 1,012) and keeps it through the other branch's
    whole backward pass. Ops are visited from the last to the first, so a chain
    (``BroadcastTo -> RealDiv -> AddN``) sinks as a whole. Swap ops keep their
    places (`place_swap_ins` moves swap-ins); forward ops are not moved.
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


def post_order(m: BufferModel) -> list[int]:
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


def place_swap_ins(m: BufferModel, order: list[int], lead: int) -> list[int]:
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


def prefetch_order(m: BufferModel, order: list[int], share: float) -> list[int]:
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
    live = live_bytes(m, order)
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


# Headroom shares `prefetched` tries, largest first; 0 keeps the order as it is.
PREFETCH_SHARES = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.0)
# Prefetch is checked at a batch where the per-sample tensors hold this many times the fixed ones.
PREFETCH_DOMINANCE = 256


def prefetched(g: Graph, order: list[int], pins_of: Any, executor: "ExecutorModel") -> tuple[list[int], float]:
    """`order` with its swap-ins moved into the headroom (`prefetch_order`) as far as the executed peak allows.

    TF's executor runs an unpinned reader of a moved swap-in as soon as its
    other inputs exist, earlier than the order put it, so the order's own
    liveness under-counts what prefetching costs. The largest share of
    `PREFETCH_SHARES` whose pins do not raise the peak of the orders TF's
    executor models run (each of `ExecutorModel.peaks`) is kept, judged at a batch
    where activations dominate (`PREFETCH_DOMINANCE`): the batches LMS is for.
    """
    m = buffer_model(g, scoring_batch(g, dominance=PREFETCH_DOMINANCE))
    big = executor.resized(m)
    limits = big.peaks(pins_of(order))
    for share in PREFETCH_SHARES[:-1]:
        moved = prefetch_order(m, order, share)
        if moved != order and all(p <= q for p, q in zip(big.peaks(pins_of(moved)), limits)):
            return moved, share
    return order, 0.0
