"""`max_batch`: the largest batch whose simulated peak fits a memory budget. No TensorFlow.

The peak grows with the batch (tensor sizes are affine in it, and so is the
work between a swap-out and the copy finishing), so the search is a bracket
and a bisection: an affine guess from batches 1 and 2, doubling from the
guess until a batch does not fit, then bisection. For ResNet-50 that is about
15-25 simulations of a few milliseconds each, on one compiled graph.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import numpy as np

from ..config import LMSConfig
from ..machine.devices import DeviceProfile, get_device
from ..graph import Graph
from ..plan import SwapPlan
from .costs import TemporaryModel
from .host import check_host_budget, fits
from ..pipeline import plan_kernels, resolve_plan
from .interpreter import SimResult, compiled_for, cost_array, default_temporaries, exact_on, layout_transposes_on, run
from .opcosts import OpCosts

__all__ = ["max_batch", "MaxBatchResult", "InfeasibleBudget", "ALL_SWAPPED", "bfc_adjusted_batch"]

log = logging.getLogger(__name__)

# The most memory-saving config: every candidate swapped, each brought back just in time.
ALL_SWAPPED = LMSConfig(n_tensors=-1, lb=1)


class InfeasibleBudget(ValueError):
    """Even batch 1 with every candidate tensor swapped does not fit the budget.

    Attributes:
        budget_bytes: the budget asked for.
        min_bytes: the smallest peak found at batch 1 (the budget needed).
        peak_op: the op at that peak.
    """

    def __init__(self, message: str, *, budget_bytes: int, min_bytes: int, peak_op: str) -> None:
        super().__init__(message)
        self.budget_bytes = budget_bytes
        self.min_bytes = min_bytes
        self.peak_op = peak_op


@dataclass(frozen=True)
class MaxBatchResult:
    """The largest fitting batch (PREDICTED by the simulator).

    Attributes:
        batch: largest batch whose peak fits; 0 when this config does not fit
            at batch 1 but the all-swapped config would.
        peak_bytes: simulated peak at `batch` (at batch 1 when `batch` is 0).
        budget_bytes: the budget.
        step_time_s / throughput: simulated at `batch` (0 without a time model).
        peak_op: op at the peak.
        n_swapped: tensors the plan swaps.
        n_simulations: simulations the search ran.
        capped: the search stopped at `limit` (the peak hardly grows with the batch).
        search_s: wall time of the search.
        peak_host_bytes: simulated host memory swapping holds at its peak, at `batch` (`lms.sim.host`).
        host_budget_bytes: the host budget (None: no host bound).
        limited_by: what stopped the batch from growing: ``"device"`` or ``"host"`` (the host budget).
    """

    batch: int
    peak_bytes: int
    budget_bytes: int
    step_time_s: float
    throughput: float
    peak_op: str
    n_swapped: int
    n_simulations: int
    capped: bool = False
    search_s: float = 0.0
    peak_host_bytes: int = 0
    host_budget_bytes: int | None = None
    limited_by: str = "device"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fmt(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def max_batch(graph: Graph, config_or_plan: LMSConfig | SwapPlan | None, budget_bytes: int, *,
              device: DeviceProfile | str | None = None, op_costs: Mapping[str, float] | OpCosts | None = None,
              op_costs_batch: int | None = None, resident_bytes: int | None = None,
              temporaries: TemporaryModel | None = None, order: str | None = None,
              limit: int = 1 << 20, exact: bool | None = None,
              host_budget_bytes: int | None = None) -> MaxBatchResult:
    """Largest batch whose simulated peak device memory is at most `budget_bytes`.

    With `host_budget_bytes`, a batch also needs its simulated host peak (the
    swapped tensors' host copies, `lms.sim.host`) to be at most that.

    Args:
        graph: the training graph model.
        config_or_plan: an `LMSConfig` (planned once), a `SwapPlan`, or ``None`` (no LMS).
        budget_bytes: device memory available to the step.
        device, op_costs, op_costs_batch, resident_bytes, temporaries, order, exact:
            as for `simulate`.
        limit: largest batch tried.
        host_budget_bytes: host memory swapping may hold (None: no host bound).

    Raises:
        InfeasibleBudget: batch 1 does not fit even with every candidate swapped.
        ValueError: a non-positive budget or limit.
    """
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes={budget_bytes}: must be > 0")
    if limit < 1:
        raise ValueError(f"limit={limit}: must be >= 1")
    check_host_budget(host_budget_bytes)
    t0 = time.perf_counter()
    dev = get_device(device) if device is not None else None
    plan = resolve_plan(graph, config_or_plan, kernels=plan_kernels(dev))
    temporaries = default_temporaries(dev) if temporaries is None else temporaries
    if order is None:
        order = dev.order if dev is not None else "executor"
    kw = dict(order=order, temporaries=temporaries, resident_bytes=resident_bytes,
              expensive_op_bytes=dev.expensive_op_bytes if dev is not None else None,
              exact=exact_on(dev) if exact is None else exact, layout_transposes=layout_transposes_on(graph, dev))
    cg = compiled_for(graph, plan, **kw)
    base_costs = None if isinstance(op_costs, OpCosts) else cost_array(cg, op_costs, None, 1)
    count = 0

    def sim(b: int) -> SimResult:
        nonlocal count
        count += 1
        costs = base_costs
        if isinstance(op_costs, OpCosts):
            costs = op_costs.seconds(cg.op_names, b)
        elif costs is not None and op_costs_batch:
            costs = costs * (b / op_costs_batch)
        return run(cg, b, device=dev, op_costs=costs, want_timeline=False)

    n_swapped = plan.n_swapped if plan is not None else 0

    def ok(r: SimResult) -> bool:
        return fits(r, budget_bytes, host_budget_bytes)

    limited = {"by": "device"}

    def result(r: SimResult, *, capped: bool = False, batch: int | None = None) -> MaxBatchResult:
        return MaxBatchResult(
            batch=r.batch if batch is None else batch, peak_bytes=r.peak_device_bytes,
            budget_bytes=budget_bytes, step_time_s=r.step_time_s, throughput=r.throughput,
            peak_op=r.peak_op, n_swapped=n_swapped, n_simulations=count, capped=capped,
            search_s=time.perf_counter() - t0, peak_host_bytes=r.peak_host_bytes,
            host_budget_bytes=host_budget_bytes, limited_by=limited["by"])

    def miss(r: SimResult) -> None:  # a batch that does not fit: say which budget it missed
        limited["by"] = "device" if r.peak_device_bytes > budget_bytes else "host"

    first = sim(1)
    if first.peak_device_bytes > budget_bytes:
        all_plan = resolve_plan(graph, ALL_SWAPPED, kernels=plan_kernels(dev))
        everything = run(compiled_for(graph, all_plan, **kw), 1, device=dev,
                         op_costs=cost_array(compiled_for(graph, all_plan, **kw), op_costs,
                                              op_costs_batch, 1), want_timeline=False)
        count += 1
        best = min((first, everything), key=lambda r: r.peak_device_bytes)
        if best.peak_device_bytes > budget_bytes:
            raise InfeasibleBudget(
                f"budget {_fmt(budget_bytes)} ({budget_bytes} bytes) is too small for "
                f"{graph.name or 'the graph'}: even batch 1 with every candidate tensor swapped needs "
                f"{_fmt(best.peak_device_bytes)} ({best.peak_device_bytes} bytes; peak at op "
                f"{best.peak_op!r}, of which {_fmt(best.resident_bytes)} resident weights and "
                f"optimizer state)", budget_bytes=budget_bytes, min_bytes=best.peak_device_bytes,
                peak_op=best.peak_op)
        log.info("config does not fit at batch 1 (%d bytes); all-swapped would (%d bytes)",
                 first.peak_device_bytes, everything.peak_device_bytes)
        return result(first, batch=0)
    if not ok(first):  # the device fits, the host copies do not
        miss(first)
        return result(first, batch=0)
    if limit == 1:
        return result(first, capped=True)

    lo, lo_r = 1, first
    second = sim(2)
    if not ok(second):
        miss(second)
        return result(first)
    lo, lo_r = 2, second
    slope = second.peak_device_bytes - first.peak_device_bytes
    guess = limit if slope <= 0 else 2 + (budget_bytes - second.peak_device_bytes) // slope
    host_slope = second.peak_host_bytes - first.peak_host_bytes
    if host_budget_bytes is not None and host_slope > 0:
        guess = min(guess, 2 + (host_budget_bytes - second.peak_host_bytes) // host_slope)
    guess = int(np.clip(guess, 3, limit))
    hi = None
    probe = guess
    while True:  # bracket: [lo fits, hi does not]
        if probe <= lo:
            probe = lo + 1
        if probe > limit:
            break
        r = sim(probe)
        if ok(r):
            lo, lo_r = probe, r
            if probe == limit:
                break
            probe = min(limit, probe * 2)
        else:
            miss(r)
            hi = probe
            break
    if hi is None:
        return result(lo_r, capped=lo >= limit)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        r = sim(mid)
        if ok(r):
            lo, lo_r = mid, r
        else:
            miss(r)
            hi = mid
    log.debug("max_batch: %d (%d simulations)", lo, count)
    return result(lo_r)


def bfc_adjusted_batch(graph: Graph, plan: LMSConfig | SwapPlan | None, batch: int, budget: int,
                       **simulate_kwargs: Any) -> dict[str, Any]:
    """The largest batch <= `batch` whose BFC-replayed peak (fragmentation included) fits `budget`.

    `max_batch` counts live bytes; this replays TF's BFC allocator (slow: a check,
    not a search) and steps down from `batch` (10% at a time above 10, then by 1)
    until a batch fits, then bisects. `simulate_kwargs` go to `simulate`.

    Returns:
        ``{"batch", "bfc_peak_bytes", "replays"}``; batch 0 when batch 1 does not fit.
    """
    from .interpreter import simulate

    def peak(b: int) -> int:
        return simulate(graph, plan, batch=b, timeline=False, allocator="bfc", **simulate_kwargs).peak_device_bytes

    if batch < 1:
        return {"batch": 0, "bfc_peak_bytes": None, "replays": 0}
    replays = 1
    top = peak(batch)
    if top <= budget:
        return {"batch": batch, "bfc_peak_bytes": top, "replays": replays}
    lo, hi = batch, batch
    while lo > 1:  # step down until a batch fits
        lo = max(1, int(lo * 0.9)) if lo > 10 else lo - 1
        replays += 1
        if peak(lo) <= budget:
            break
        hi = lo
    else:
        replays += 1
        if peak(1) > budget:
            return {"batch": 0, "bfc_peak_bytes": None, "replays": replays}
    while hi - lo > 1:
        mid = (lo + hi) // 2
        replays += 1
        if peak(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return {"batch": lo, "bfc_peak_bytes": peak(lo), "replays": replays + 1}
