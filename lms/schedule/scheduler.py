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

Only *pinnable* ops carry these edges (`lms.plan.anchor.pinnable_ops`): a control
edge on an op that Grappler's remapper or arithmetic optimizer would rewrite
(``Conv2D+BiasAdd+Relu`` -> ``_FusedConv2D``, BatchNorm's ``Mul``/``AddV2``)
stops the rewrite, and the step computes with other kernels (results differ in
the last bits); one between two ops oneDNN merges closes a cycle. A requested
edge ``(a) ..> (b)`` whose ends are not pinnable is *anchored*: ``a`` moves to
its nearest pinnable ancestor, ``b`` to its nearest pinnable descendant (a
weaker order, never a cycle); with none, it is dropped (`Schedule.dropped`).
The memory order is pinned through its pinnable ops only, plus one edge into
each swap-in from the last op before it that may carry a control output (the
rule swap-in triggers follow, `lms.plan.anchor.trigger_ops`), so the copy comes in
where the order put it; the others run when TF's executor reaches them, so each candidate is scored by the peak of the
order TF's executor models (`lms.order.executed_order`, both kinds) run
over the graph with its pins, not by the order asked for.

The memory order (anchor: XLA's ``DefaultMemoryScheduler``, which runs a list,
a DFS and a post-order scheduler and keeps the lowest simulated peak) is the
lowest-peak of a few candidates (`CANDIDATES`, built by
`lms.schedule.candidate_orders`: list schedulers, a post-order DFS, the creation
order, and TF's own order with nothing pinned) under a liveness model
(`lms.schedule.models`). With ``prefetch="headroom"`` the chosen order's
swap-ins then move earlier, into the memory the order leaves free below its
peak.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..config import LMSConfig
from ..graph import Graph, GraphError, Role
from ..plan.anchor import pinnable_ops, trigger_ops
from ..plan.swap_plan import SWAP_IN_TYPE, SWAP_OUT_TYPE, SwapPlan, rewrite_graph
from ..shapes import complete_sizes
from .candidate_orders import (PIN_MIN_BYTES, PREFETCH_DOMINANCE, list_schedule, place_swap_ins, post_order,
                               prefetch_order, prefetched, sink)
from .edges import anchor_edges, merge_edges, ordering_edges, pin_graph, resource_edges
from .models import BufferModel, ExecutorModel, buffer_model, live_peak, scoring_batch

__all__ = ["Schedule", "ScheduleError", "schedule_ops", "KINDS", "CANDIDATES"]

log = logging.getLogger(__name__)

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
            before it (`lms.plan.anchor.trigger_ops`; all other edges join
            pinnable ops).
        dropped: requested constraints no pinnable pair can express.
        candidates: estimated peak bytes of each candidate order at `batch`, as
            TF's executor models run it with the candidate's pins (the larger of
            the ``"executor"`` and ``"single_threaded"`` models).
        chosen: the candidate kept.
        prefetch_share: with ``prefetch="headroom"``, the share of the order's
            peak its swap-ins were moved into (0: none moved; see `lms.schedule.candidate_orders.prefetched`).
        exact: the order is for a step whose executed graph is pinned whole
            (`lms.schedule.exact_order`, one CPU device): candidates were scored by their own
            liveness, since that order is the one that runs; `pins` are still
            the partial pins, for when the executed graph cannot be pinned.
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
    exact: bool = False
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
                "chosen": self.chosen, "prefetch_share": self.prefetch_share, "exact": self.exact,
                "batch": self.batch, "serialized_levels": list(self.serialized_levels),
                "schedule_s": round(self.schedule_s, 4)}

    def validate(self, graph: Graph, *, pinnable: frozenset[str] | None = None,
                 triggers: frozenset[str] | None = None) -> None:
        """Check against the rewritten graph (`rewrite_graph(graph, plan)`, before pinning).

        Checks: every edge names known ops; the graph plus every edge is acyclic;
        every pin joins two pinnable ops (`lms.plan.anchor.pinnable_ops`), or a
        trigger op and a swap-in (`lms.plan.anchor.trigger_ops`); a pinned
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


# ---- pins --------------------------------------------------------------------------------------

def _chain_pins(g: Graph, m: BufferModel, order: list[int], pinnable: frozenset[str]) -> tuple[tuple[str, str], ...]:
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


def _trigger_pins(m: BufferModel, order: list[int], triggers: frozenset[str]) -> tuple[tuple[str, str], ...]:
    """For each swap-in of `order`: an edge from the last trigger op before it (stopping at a swap op or an input).

    The chain pins a swap-in behind the previous pinnable op of the order; in a
    stretch of elementwise backward ops (BatchNorm's gradient) that op may be far
    earlier, and TF's executor would copy the tensor in long before its reader
    needs it (seen: ResNet-50's ``pool1`` output held 0.7 GiB through a whole
    BatchNorm backward at the peak). An edge from the latest op before the
    swap-in that may carry a control output (`lms.plan.anchor.trigger_ops`) keeps the
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
                 batch: int | None = None, exact: bool = False) -> Schedule:
    """Decide the ordering edges (and, for ``schedule="memory"``, the whole order) of one step.

    Args:
        graph: the training graph model, before swap ops.
        plan: its swap plan (``None``: no swaps).
        config: the knobs (default: the plan's config, else `LMSConfig()`).
        batch: batch the liveness model sizes tensors at (default: the graph's),
            raised to `scoring_batch` where resident bytes would hide the order.
        exact: the step's executed graph will be pinned whole (`lms.schedule.exact_order`:
            one CPU device), so the order chosen is the order that runs: each
            candidate is scored by its own liveness peak, not by the orders
            TF's executor models run with its partial pins, and
            ``prefetch="headroom"`` uses the whole headroom.

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

    # The order respects every edge of the graph as built, identities included (pins that relied on
    # Grappler bypassing an identity -- Keras passes all gradients through one -- would close a cycle),
    # the anchored constraints, oneDNN's merges, and the variable reads and writes in program order.
    g = complete_sizes(pin_graph(rewritten, anchored + merge_edges(rewritten) + resource_edges(rewritten)))
    batch = max(batch, scoring_batch(g))
    m = buffer_model(g, batch)
    lead = 0 if config.sync_mode in (2, 3) else config.lb - 1
    lifo = list_schedule(m, lifo=True)
    candidates: dict[str, list[int]] = {
        "list_lifo_sunk": place_swap_ins(m, sink(m, lifo), lead),
        "list_lifo": place_swap_ins(m, lifo, lead),
        "list_fifo": place_swap_ins(m, list_schedule(m, lifo=False), lead),
        "post_order": post_order(m),
        "creation": [m.index[n] for n in g.topological_order],
    }
    triggers = trigger_ops(rewritten, pinnable=pinnable)
    def pins_for(order: list[int]) -> tuple[tuple[str, str], ...]:
        return _chain_pins(g, m, order, pinnable) + _trigger_pins(m, order, triggers)

    executor = ExecutorModel(g, m)
    tf_orders = executor.orders(())
    if exact:
        return _exact_schedule(graph, g, m, rewritten, config, candidates, tf_orders[1], pins_for, lead,
                               constraints=constraints, anchored=anchored, dropped=dropped, levels=levels,
                               batch=batch, pinnable=pinnable, triggers=triggers, t0=t0)
    pins_of = {name: pins_for(order) for name, order in candidates.items()}
    pins_of["tf"] = ()  # TF's own order, nothing pinned: the pass never does worse than without it
    candidates["tf"] = tf_orders[1]
    # candidates often pin alike: score each pin set once
    scored: dict[tuple[tuple[str, str], ...], int] = {(): max(live_peak(m, order) for order in tf_orders)}
    peaks = {name: scored.setdefault(pins, executor.peak(pins)) if pins not in scored else scored[pins]
             for name, pins in pins_of.items()}
    chosen = min(peaks, key=lambda k: (peaks[k], list(candidates).index(k)))
    order = candidates[chosen]
    share = 0.0
    if config.prefetch == "headroom" and chosen != "tf" and lead == config.lb - 1:
        order, share = prefetched(g, order, pins_for, executor)
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


def _exact_schedule(graph: Graph, g: Graph, m: BufferModel, rewritten: Graph, config: LMSConfig,
                    candidates: dict[str, list[int]], tf_order: list[int], pins_for: Any, lead: int, *,
                    constraints: tuple[tuple[str, str], ...], anchored: tuple[tuple[str, str], ...],
                    dropped: tuple[tuple[str, str], ...], levels: tuple[int, ...], batch: int,
                    pinnable: frozenset[str], triggers: frozenset[str], t0: float) -> Schedule:
    """`schedule_ops` for a step pinned whole: the candidate with the lowest liveness peak of its own order.

    TF's own order (the single-threaded executor's, nothing pinned) competes as
    one more order. With ``prefetch="headroom"`` the swap-ins move into the whole
    headroom below the order's peak (`prefetch_order` at share 1): nothing but
    the order decides where they run.
    """
    orders = dict(candidates, tf=tf_order)
    peaks = {name: live_peak(m, order) for name, order in orders.items()}
    chosen = min(peaks, key=lambda k: (peaks[k], list(orders).index(k)))
    order = orders[chosen]
    share = 0.0
    if config.prefetch == "headroom" and lead == config.lb - 1:
        big = buffer_model(g, scoring_batch(g, dominance=PREFETCH_DOMINANCE))
        moved = prefetch_order(big, order, 1.0)
        if moved != order:
            order, share = moved, 1.0
    sched = Schedule(kind="memory", order=tuple(m.names[i] for i in order), constraints=constraints,
                     pins=tuple(dict.fromkeys(anchored + pins_for(order))), dropped=dropped, candidates=peaks,
                     chosen=chosen, prefetch_share=share, exact=True, batch=batch, serialized_levels=levels,
                     schedule_s=time.perf_counter() - t0)
    sched.validate(rewritten, pinnable=pinnable, triggers=triggers)
    log.debug("exact schedule %s: %s of %s, %.3f s", graph.name, chosen, peaks, sched.schedule_s)
    return sched
