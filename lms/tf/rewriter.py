"""The rewrite at the end of each trace: the step's graph read, planned, checked and edited. TensorFlow.

`Rewriter` does what `lms.function` (`lms.tf.function.LMSFunction`) and
`lms.tf.keras.KerasLMS` share: at the end of a trace (`Rewriter.session`), the
graph built so far is read into the graph model, planned (or the plan of an
earlier trace with the same ops reused), checked for equivalence and applied;
its `LatestTrace` mixin tells what the latest trace did. `lms.tf.function`
describes the flow.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Mapping

import tensorflow as tf
from tensorflow.python.ops import control_flow_util

from ..auto import AUTO, DEFAULT_MARGIN, NoConfigFits
from ..config import LMSConfig
from ..graph import Graph
from ..plan import SwapPlan
from ..plan import plan_swaps
from ..plan.candidates import LOOP_ACCUMULATOR_REASON
from ..pipeline import resolve_plan, schedule_for
from .apply import AppliedPlan, apply_plan, default_compute_device
from .auto import AutoSettings
from .batch import batch_argument, call_batch, observe_batch, static_batch
from .emulate import default_emulate
from .equivalence import Correction, ensure_equivalent
from .summary import LMSSummary, as_config
from .extract import extract_graph
from .train import GradientRecord, record_gradients

__all__ = ["Rewriter", "LatestTrace"]

log = logging.getLogger(__name__)

_MiB = 1 << 20


_EAGER_NOTE = ("running eagerly (tf.config.run_functions_eagerly(True) or called outside a traced function): "
               "LMS rewrites traced graphs only, nothing swapped")
_XLA_MESSAGE = ("LMS cannot rewrite a step compiled by XLA: {owner} is called inside a function with "
                "jit_compile=True, which compiles it as one cluster and bypasses graph-level swap ops; "
                "call it outside that function or use jit_compile=False")


@dataclass(frozen=True)
class _Trace:
    graph: Graph | None
    plan: SwapPlan
    applied: AppliedPlan | None
    summary: LMSSummary
    timings: Mapping[str, float]
    observed: dict = field(default_factory=dict)  # {"batch": n} once a step with an unknown batch ran
    schedule: Any = None  # the lms.schedule.Schedule pinned (None: no ordering edges)

    def current_summary(self) -> LMSSummary:
        """The summary at the batch that ran, when the batch was unknown at trace time (with the host
        bytes its plan holds at peak, predicted on first use: `lms.sim.host.predicted_host_peak`)."""
        batch = self.observed.get("batch")
        if batch is None or self.graph is None or batch == self.summary.batch_size:
            if self.observed.get("base") is None:
                self.observed["base"] = _with_host_peak(self.summary, self.graph, self.plan)
            return self.observed["base"]
        if self.observed.get("summary") is None or self.observed["summary"].batch_size != batch:
            self.observed["summary"] = _with_host_peak(self.summary.at_batch(self.graph, batch), self.graph,
                                                       self.plan)
        return self.observed["summary"]


def _with_host_peak(summary: LMSSummary, graph: Graph | None, plan: SwapPlan) -> LMSSummary:
    from dataclasses import replace

    from ..sim.host import predicted_host_peak

    if not plan.swaps:
        return replace(summary, peak_host_bytes=0)
    if graph is None:
        return summary
    return replace(summary, peak_host_bytes=predicted_host_peak(graph, plan, summary.batch_size))


class Rewriter:
    """Runs a step's Python function inside a trace and applies LMS to what it built.

    Shared by `LMSFunction` and `lms.tf.keras`.
    """

    def __init__(self, config: Any, *, emulate: bool | None, bandwidth: float | None,
                 device: str | None, owner: str, pin_whole: bool = False, budget: Any = None,
                 margin: float = DEFAULT_MARGIN, check: bool = True) -> None:
        self.auto: AutoSettings | None = None
        self.pending_error: Exception | None = None  # an lms error raised while tracing (see `LMSFunction._call`)
        if isinstance(config, str) and config == AUTO:
            emulating = default_emulate() if emulate is None else bool(emulate)
            self.auto = AutoSettings.create(budget=budget, margin=margin, emulate=emulating)
            config = LMSConfig()  # each trace plans with the config chosen for it (`lms.auto`)
        elif budget is not None:
            raise ValueError("budget= applies to config='auto' only (a given LMSConfig swaps what it says)")
        self.config = as_config(config)
        if check not in (True, False):
            raise ValueError(f"check={check!r}: allowed values are True (check that Grappler optimizes the step as "
                             "without LMS, and correct the plan) and False")
        self.check = check
        # the caller runs memory-scheduled steps pinned whole when it can (`lms.tf.exact`): the order is
        # then chosen for what runs exactly (`schedule_ops(..., exact=True)`)
        self.pin_whole = pin_whole
        if bandwidth is not None and (isinstance(bandwidth, bool) or not bandwidth > 0):
            raise ValueError(f"bandwidth={bandwidth!r}: must be a positive number of bytes/s or None")
        self.emulate = default_emulate() if emulate is None else bool(emulate)
        if bandwidth is not None and not self.emulate:
            raise ValueError("bandwidth emulates a link and needs emulated swap ops (emulate=True)")
        self.swap_ops = "emulated" if self.emulate else "device"
        self.bandwidth = bandwidth
        self.device = device
        self.owner = owner
        self.last: _Trace | None = None
        self.traces: "weakref.WeakKeyDictionary[tf.Graph, _Trace]" = weakref.WeakKeyDictionary()
        # fingerprint of a trace's forward and backward ops -> the plan applied to it (as checked and corrected)
        self._plans: dict[tuple[str, LMSConfig], tuple[SwapPlan, tuple[Correction, ...]]] = {}
        self._lock = threading.Lock()
        self._warned_eager = False

    @tf.autograph.experimental.do_not_convert
    def session(self, args: tuple, kwargs: dict, *, batch_hint: int | None) -> "_Session":
        """Context for one trace of the step: records gradients, rewrites on a clean exit.

        Not converted by AutoGraph (planning is plain Python); the step's own
        code inside the ``with`` block still is.
        """
        return _Session(self, args, kwargs, batch_hint=batch_hint)

    def _rewrite(self, graph: tf.Graph, rec: GradientRecord, args: tuple, kwargs: dict, *,
                 batch_hint: int | None, outputs: Any = None) -> None:
        """Extract, plan, anchor triggers, validate and apply, on the graph being traced."""
        start = time.perf_counter()
        known = static_batch(args, kwargs)
        symbolic = known is None
        batch = known or batch_hint or 1
        model = extract_graph(graph, loss_tensor=rec.targets, batch_size=batch, symbolic_batch=symbolic,
                              backward_ops=rec.backward_ops, name=self.owner, outputs=outputs)
        extracted = time.perf_counter()
        config, choice = self.config, None
        may_pin_whole = self.pin_whole and _may_pin_whole(graph)
        if self.auto is not None:
            if symbolic and not batch_hint:
                self.pending_error = ValueError(
                    f"config='auto' in {self.owner} needs the batch the step runs at, and the trace has no static "
                    "batch: give it (enable_lms(..., batch_size=N) for a dataset, or call with a known batch)")
                raise self.pending_error
            try:
                choice = self.auto.choose(model, batch=batch, exact=may_pin_whole, owner=self.owner)
            except NoConfigFits as exc:
                # raised through AutoGraph, which would turn it into a StagingError: the caller re-raises it
                self.pending_error = exc
                raise
            config = choice.config
        if choice is not None and config.off:
            plan = SwapPlan(config=config, batch_size=batch, graph_name=self.owner)
            trace = _Trace(model, plan, None, LMSSummary.from_plan(plan, swap_ops=self.swap_ops, auto=choice,
                                                                   note="auto: the step fits without LMS"),
                           {"extract_s": extracted - start, "choose_s": choice.elapsed_s})
            with self._lock:
                self.last = trace
                self.traces[graph] = trace
            return
        fingerprint = (model.fingerprint(), config)
        with self._lock:
            reused = self._plans.get(fingerprint)
        if reused is not None:  # a second trace of the same step: the plan made (and checked) for the first
            plan, corrections = reused
            log.debug("LMS: %s traced again with the same forward and backward ops: reusing its plan", self.owner)
        else:
            # with auto, the plan and schedule simulated for the choice are reused (cached per graph and config)
            kernels = self.kernels()
            plan = resolve_plan(model, config, kernels=kernels) if choice is not None \
                else plan_swaps(model, config, kernels=kernels)
            corrections = ()
        plan.validate(model)
        planned = time.perf_counter()
        plain_def = graph.as_graph_def() if self.check and (plan.rewrites or config.pins_order) and reused is None \
            else None
        applied = apply_plan(graph, plan, swap_ops=self.swap_ops, bandwidth=self.bandwidth, device=self.device)
        swapped = time.perf_counter()
        exact = may_pin_whole and config.schedule == "memory"
        schedule, scheduled_s = self._pinned_and_checked(graph, plain_def, model, plan, exact=exact, outputs=outputs) \
            if plain_def is not None and plan.rewrites and config.pins_order else (None, 0.0)
        if schedule is None and plain_def is not None and plan.rewrites:
            checked = ensure_equivalent(graph, plain_def, model, plan, outputs=outputs, device=self.device)
            plan, corrections = checked.plan, checked.corrections
            if corrections:
                plan.validate(model)
        checked_at = time.perf_counter()
        if schedule is None and config.pins_order:  # the order chosen over the graph model, pinned by control edges
            from .pin import apply_schedule

            schedule = schedule_for(model, plan, exact=exact)
            pinned = apply_schedule(graph, schedule.edges)
            if plain_def is not None and pinned.edges:
                schedule, corrections = self._check_pins(graph, plain_def, plan, pinned, schedule, corrections,
                                                         outputs=outputs)
        done = time.perf_counter()
        note = _loop_note(plan)
        if not plan.rewrites and any(c.kind != "order dropped" for c in corrections):
            note = ("LMS did nothing: the equivalence check dropped every swap and recompute of the plan "
                    f"({len(corrections)} corrections, e.g. {corrections[0]}); the step runs as without LMS")
            log.warning("LMS: %s: %s", self.owner, note)
        summary = LMSSummary.from_plan(plan, swap_ops=self.swap_ops, auto=choice, corrections=corrections,
                                       note=note)
        timings = {"extract_s": extracted - start, "plan_s": planned - extracted, "apply_s": swapped - planned,
                   "check_s": checked_at - swapped - scheduled_s, "schedule_s": done - checked_at + scheduled_s}
        if choice is not None:
            timings["choose_s"] = choice.elapsed_s
        trace = _Trace(model, plan, applied, summary, timings, schedule=schedule)
        with self._lock:
            self.last = trace
            self.traces[graph] = trace
            self._plans[fingerprint] = (plan, corrections)
            while len(self._plans) > 8:
                self._plans.pop(next(iter(self._plans)))
        if symbolic and not batch_hint:
            observing = _observe_batch(graph, plan, trace, batch_argument(args, kwargs), owner=self.owner)
            if reused is not None:
                return  # logged when it was planned
            log.info("LMS: swapped %d tensors (%s per sample; the batch is unknown until the step runs%s) of "
                     "%d candidates with %d swap-ins (%s swap ops) in %s; extract+plan+apply %.2f s",
                     plan.n_swapped, _format_bytes(_per_sample_bytes(model, plan)),
                     "" if observing else " and is not observed", plan.n_candidates, plan.n_swap_ins,
                     self.swap_ops, self.owner, done - start)
            return
        if reused is not None:
            return  # logged when it was planned
        log.info("LMS: swapped %d tensors (%.1f MiB at batch %d) of %d candidates with %d swap-ins "
                 "(%s swap ops) in %s; extract+plan+apply %.2f s", plan.n_swapped,
                 plan.swapped_bytes / _MiB, batch, plan.n_candidates, plan.n_swap_ins, self.swap_ops,
                 self.owner, done - start)
        if plan.n_recomputed:
            log.info("LMS: recomputes %d tensors (%.1f MiB at batch %d) with %d cloned ops in %s",
                     plan.n_recomputed, plan.recomputed_bytes / _MiB, batch, summary.n_clones, self.owner)

    def kernels(self) -> str:
        """Whose kernels run the step's ops (`lms.plan.plan_swaps`): a GPU's when they are placed on one."""
        device = self.device if self.device is not None else default_compute_device()
        return "gpu" if tf.DeviceSpec.from_string(device).device_type == "GPU" else "cpu"

    def _pinned_and_checked(self, graph: tf.Graph, plain_def: Any, model: Graph, plan: SwapPlan, *, exact: bool,
                            outputs: Any) -> tuple[Any, float]:
        """The schedule pinned and the finished rewrite (swaps and pins) checked in one Grappler run, and the
        seconds the scheduling took; the schedule is None (the pins taken out again) when Grappler optimizes it
        differently, so that the swaps and the pins are then checked apart, each correction attributed to one
        of them (`ensure_equivalent`, `_check_pins`).

        Most rewrites pass: one Grappler run of the finished graph instead of two (the swapped graph, then the
        pinned one), about 1.6 s of a ResNet-50 trace on a 2-core CPU."""
        from .equivalence import order_differences
        from .pin import apply_schedule, remove_schedule

        t0 = time.perf_counter()
        schedule = schedule_for(model, plan, exact=exact)
        pinned = apply_schedule(graph, schedule.edges)
        scheduled_s = time.perf_counter() - t0
        if not order_differences(graph, plain_def, plan, outputs=outputs, device=self.device):
            return schedule, scheduled_s
        remove_schedule(graph, pinned)
        return None, scheduled_s

    def _check_pins(self, graph: tf.Graph, plain_def: Any, plan: SwapPlan, pinned: Any, schedule: Any,
                    corrections: tuple[Correction, ...], *, outputs: Any) -> tuple[Any, tuple[Correction, ...]]:
        """The equivalence check of the finished rewrite, pins included (`lms.tf.equivalence.order_differences`):
        when the ordering edges make Grappler optimize the step differently, they are taken out (the step runs in
        TF's order, with the checked plan) and a correction says so. Returns (schedule or None, corrections)."""
        from .equivalence import order_differences
        from .pin import remove_schedule

        diffs = order_differences(graph, plain_def, plan, outputs=outputs, device=self.device)
        if not diffs:
            return schedule, corrections
        remove_schedule(graph, pinned)
        log.warning("LMS: %s: the memory schedule's %d ordering edges make Grappler optimize the step differently "
                    "(e.g. %s): they are dropped, the step runs in TensorFlow's order", self.owner,
                    len(pinned.edges), diffs[0])
        dropped = Correction("order dropped", "schedule", "", f"{len(pinned.edges)} ordering edges", str(diffs[0]))
        return None, (*corrections, dropped)

    def set_disabled(self, args: tuple, kwargs: dict, *, graph: tf.Graph, batch_hint: int | None) -> None:
        """Record an empty plan for a trace with LMS off (``n_tensors=0``)."""
        batch = static_batch(args, kwargs) or batch_hint or 1
        plan = SwapPlan(config=self.config, batch_size=batch, graph_name=self.owner)
        with self._lock:
            self.last = _Trace(None, plan, None, LMSSummary.from_plan(plan, swap_ops=self.swap_ops,
                                                                      note="LMS off (n_tensors=0)"), {})
        log.info("LMS: off (n_tensors=0) in %s", self.owner)

    def set_eager(self, args: tuple, kwargs: dict, *, batch_hint: int | None) -> None:
        """Record an empty plan for a step running eagerly; warn the first time only."""
        batch = call_batch(args, kwargs) or batch_hint or 1
        plan = SwapPlan(config=self.config, batch_size=batch, graph_name=self.owner)
        with self._lock:
            self.last = _Trace(None, plan, None, LMSSummary.from_plan(plan, swap_ops=self.swap_ops,
                                                                      note=_EAGER_NOTE), {})
            warn, self._warned_eager = not self._warned_eager, True
        if warn:
            log.warning("%s: %s", self.owner, _EAGER_NOTE)


class _Session:
    """One trace: ``with rewriter.session(...): step(...)`` (see `Rewriter.session`)."""

    def __init__(self, rewriter: Rewriter, args: tuple, kwargs: dict, *, batch_hint: int | None) -> None:
        self._rewriter = rewriter
        self._args = args
        self._kwargs = kwargs
        self._batch_hint = batch_hint
        self._graph: tf.Graph | None = None
        self._recorder: record_gradients | None = None
        self._record: GradientRecord | None = None
        self._outputs: Any = None

    def returns(self, outputs: Any) -> Any:
        """Note what the step returns (its outputs decide which ops TensorFlow runs); returns `outputs`."""
        self._outputs = outputs
        return outputs

    def __enter__(self) -> "_Session":
        rw = self._rewriter
        graph = tf.compat.v1.get_default_graph()
        if tf.executing_eagerly() or not _building_function(graph):
            rw.set_eager(self._args, self._kwargs, batch_hint=self._batch_hint)
            return self
        if control_flow_util.GraphOrParentsInXlaContext(graph):
            raise ValueError(_XLA_MESSAGE.format(owner=rw.owner))
        if rw.config.off:
            rw.set_disabled(self._args, self._kwargs, graph=graph, batch_hint=self._batch_hint)
            return self
        self._graph = graph
        self._recorder = record_gradients(graph)
        self._record = self._recorder.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._recorder is None:
            return
        self._recorder.__exit__(exc_type, exc, tb)
        if exc_type is not None:
            return
        rw = self._rewriter
        if not self._record.calls:  # raised through AutoGraph, which would wrap it: the caller re-raises it
            rw.pending_error = ValueError(
                f"{rw.owner}: the step computes its gradients only inside a loop or a nested function (a `for` "
                "over a dataset, tf.while_loop, tf.cond, a tf.function or lms.function it calls); LMS rewrites "
                "only the gradients of the decorated step's own graph: decorate the per-batch step and loop "
                "over the data outside it" if self._record.nested_calls else
                f"{rw.owner}: the step computed no gradients with tf.GradientTape, so there are no "
                "activations kept for a backward pass to swap; use tf.function for this function")
            raise rw.pending_error
        rw._rewrite(self._graph, self._record, self._args, self._kwargs,  # noqa: SLF001
                    batch_hint=self._batch_hint, outputs=self._outputs)


def _loop_note(plan: SwapPlan) -> str:
    """Why a recurrent layer's saved activations are not swapped ('' without While-loop accumulators)."""
    loops = sum(k.reason == LOOP_ACCUMULATOR_REASON for k in plan.skipped)
    if not loops:
        return ""
    return (f"{loops} tensor(s) the backward pass reads are While-loop accumulators (recurrent layers keep every "
            "step's activations in TensorLists), which graph rewriting cannot swap; "
            f"{plan.n_swapped} tensor(s) outside the loops swapped")


def _per_sample_bytes(model: Graph, plan: SwapPlan) -> int:
    return sum(model.tensors[s.tensor].per_sample_bytes for s in plan.swaps)


def _format_bytes(n: int) -> str:
    return f"{n / _MiB:.2f} MiB" if n >= _MiB else f"{n / 1024:.1f} KiB"


def _observe_batch(graph: tf.Graph, plan: SwapPlan, trace: _Trace, data: tf.Tensor | None, *, owner: str) -> bool:
    """When the batch is unknown at trace time (``fit`` on a ``tf.data`` pipeline), learn it when the step runs.

    The data argument's leading dimension (`lms.tf.batch.observe_batch`) of the
    first step that runs goes into ``trace.observed`` (the summary then reports
    the bytes at that batch; logged once). Returns False when there is no data
    argument or nothing inserted to keep the observer in the step.
    """
    anchor = next((si.name for s in plan.swaps for si in s.swap_ins), None)
    if anchor is None and plan.recompute is not None:
        anchor = next((g.name for r in plan.recompute.recomputes for g in r.gates), None)
    if data is None or anchor is None:
        return False

    def observe(batch: int) -> None:
        from .exact import in_dry_run

        if "batch" not in trace.observed and not in_dry_run():
            trace.observed["batch"] = max(batch, 1)
            summary = trace.current_summary()
            log.info("LMS: %s swaps %.1f MiB at batch %d (the batch of the first step that ran)",
                     owner, summary.swapped_bytes / _MiB, summary.batch_size)

    observe_batch(graph, data, anchor, observe)
    return True


def _may_pin_whole(graph: tf.Graph) -> bool:
    """Whether a step traced into `graph` may be pinned whole (`lms.tf.exact`): no GPU, no distribution
    strategy, and nothing `lms.tf.exact.unpinnable_reason` refuses."""
    from .exact import unpinnable_reason

    if tf.config.list_logical_devices("GPU") or tf.distribute.has_strategy():
        return False
    return not unpinnable_reason(graph)


def _building_function(graph: tf.Graph) -> bool:
    """True for a graph being traced into a function (a FuncGraph)."""
    return bool(getattr(graph, "building_function", False))


class LatestTrace:
    """What the latest trace did: shared by `LMSFunction` and `lms.tf.keras.KerasLMS`."""

    _rewriter: Rewriter

    @property
    def config(self) -> LMSConfig:
        """The `LMSConfig`; with ``config="auto"``, the one chosen for the latest trace (None before it)."""
        rw = self._rewriter
        if rw.auto is None:
            return rw.config
        return rw.last.plan.config if rw.last else None

    @property
    def swap_ops(self) -> str:
        """``"emulated"`` or ``"device"``."""
        return self._rewriter.swap_ops

    @property
    def plan(self) -> SwapPlan | None:
        """Plan of the latest trace (None before the first trace)."""
        last = self._rewriter.last
        return last.plan if last else None

    @property
    def schedule(self) -> Any:
        """The `lms.schedule.Schedule` pinned on the latest trace (None: no ordering edges, or no trace yet)."""
        last = self._rewriter.last
        return last.schedule if last else None

    @property
    def graph(self) -> Graph | None:
        """Graph model the latest plan was made for (the step as traced, before rewriting)."""
        last = self._rewriter.last
        return last.graph if last else None

    @property
    def summary(self) -> LMSSummary | None:
        """`LMSSummary` of the latest trace (None before the first trace)."""
        last = self._rewriter.last
        return last.current_summary() if last else None
