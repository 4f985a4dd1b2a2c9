"""Largest batch that fits a memory budget: grow, then bisect. No TensorFlow.

The search is given a `measure(batch)` function (a trial worker runs real
steps; tests pass a formula) and decides from its peak whether a batch fits:

    fits  <=>  no out-of-memory error  and  peak <= usable_bytes,
    usable_bytes = budget * (1 - safety_margin)

The margin covers run-to-run variation and allocator fragmentation, so a batch
found here still fits when the training script runs it for hours.

1. Start at ``start`` (the simulator's prediction, so usually one probe from
   the answer).
2. Grow (or shrink) until the answer is bracketed. Peak memory is close to
   linear in the batch, so the next guess extrapolates the boundary from the
   measured peak and a bytes-per-sample slope (measured from two probes, else
   the simulator's), aiming a little past it so one probe brackets it; without
   a slope it doubles (halves).
3. Bisect the bracket until it is narrower than ``resolution`` (relative).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from ..budget import format_bytes

if TYPE_CHECKING:
    from lms.config import LMSConfig
    from lms.machine.devices import DeviceProfile
    from lms.graph import Graph
    from lms.sim.opcosts import OpCosts

__all__ = ["Measurement", "Probe", "BatchSearchResult", "usable_bytes", "search_max_batch", "smaller_timed_batch", "search_slope",
           "Prediction", "predict_max_batch", "predict_at_batch"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Measurement:
    """What one probe run saw: its peak (None when it failed before one was read) and whether it ran out of memory."""

    peak_bytes: int | None
    oom: bool = False
    detail: str = ""
    step_time_s: float | None = None


@dataclass(frozen=True)
class Probe:
    """One probed batch and the verdict."""

    batch: int
    fits: bool
    peak_bytes: int | None
    oom: bool = False
    detail: str = ""
    step_time_s: float | None = None

    def to_dict(self) -> dict:
        return {"batch": self.batch, "fits": self.fits, "peak_bytes": self.peak_bytes, "oom": self.oom,
                "detail": self.detail, "step_time_s": self.step_time_s}


@dataclass(frozen=True)
class BatchSearchResult:
    """The search outcome.

    Attributes:
        batch: largest probed batch that fits (0: even the smallest probed did not).
        peak_bytes: its measured peak (None when batch is 0).
        usable_bytes: the threshold used (budget minus the safety margin).
        probes: every probe, in order.
        converged: True when the bracket is within the resolution or the cap fits;
            False when the probe limit ran out first.
        smallest_failing: smallest probed batch that did not fit (None if none).
    """

    batch: int
    peak_bytes: int | None
    usable_bytes: int
    probes: tuple[Probe, ...] = field(default=())
    converged: bool = False
    smallest_failing: int | None = None

    @property
    def best_probe(self) -> Probe | None:
        return next((p for p in self.probes if p.fits and p.batch == self.batch), None)

    def to_dict(self) -> dict:
        return {"batch": self.batch, "peak_bytes": self.peak_bytes, "usable_bytes": self.usable_bytes,
                "converged": self.converged, "smallest_failing": self.smallest_failing,
                "probes": [p.to_dict() for p in self.probes]}


def usable_bytes(budget_bytes: int, safety_margin: float) -> int:
    """Budget minus the safety margin (a fraction in [0, 0.5])."""
    if not 0 <= safety_margin <= 0.5:
        raise ValueError(f"safety_margin={safety_margin!r}: must be a fraction between 0 and 0.5")
    return int(budget_bytes * (1.0 - safety_margin))


def search_max_batch(measure: Callable[[int], Measurement], *, usable: int, start: int, cap: int,
                     resolution: float = 0.05, max_probes: int = 8,
                     slope_bytes_per_sample: float | None = None,
                     on_probe: Callable[[Probe], None] | None = None) -> BatchSearchResult:
    """Find the largest batch in ``[1, cap]`` whose measured peak fits `usable` bytes.

    Args:
        measure: runs a batch and returns its `Measurement`.
        usable: bytes a batch may peak at (see `usable_bytes`).
        start: first batch to probe (clamped to ``[1, cap]``).
        cap: largest batch worth trying.
        resolution: stop when the bracket ``(fits, fails)`` is at most this
            fraction of the fitting batch wide (and at least 1).
        max_probes: probe limit.
        slope_bytes_per_sample: a prior for peak growth per sample (e.g. the
            simulator's); replaced by a measured slope once two probes have peaks.
        on_probe: called after each probe (progress reporting).
    """
    if cap < 1:
        raise ValueError(f"cap={cap}: must be >= 1")
    if max_probes < 1:
        raise ValueError(f"max_probes={max_probes}: must be >= 1")
    probes: list[Probe] = []
    lo, hi = 0, cap + 1  # lo fits (0: none yet), hi does not (cap + 1: none yet)
    lo_peak: int | None = None
    hi_peak: int | None = None
    batch = min(max(int(start), 1), cap)
    converged = False
    while len(probes) < max_probes:
        m = measure(batch)
        fits = (not m.oom) and m.peak_bytes is not None and m.peak_bytes <= usable
        probe = Probe(batch, fits, m.peak_bytes, m.oom, m.detail, m.step_time_s)
        probes.append(probe)
        if fits:
            log.info("batch %d fits (peak %s <= usable %s)", batch, _mib(m.peak_bytes), _mib(usable))
            lo, lo_peak = batch, m.peak_bytes
        else:
            why = "out of memory" if m.oom else f"peak {_mib(m.peak_bytes)} > usable {_mib(usable)}"
            log.info("batch %d does not fit (%s)", batch, why)
            hi, hi_peak = batch, m.peak_bytes
        if on_probe is not None:
            on_probe(probe)
        if lo >= cap or hi <= 1 or (hi <= cap and hi - lo <= max(1, math.floor(lo * resolution))):
            converged = True
            break
        slope = _slope(probes) or slope_bytes_per_sample
        batch = _next_batch(lo, hi, lo_peak, hi_peak, usable, slope, cap, resolution)
    return BatchSearchResult(batch=lo, peak_bytes=lo_peak if lo else None, usable_bytes=usable,
                             probes=tuple(probes), converged=converged,
                             smallest_failing=hi if hi <= cap else None)


def smaller_timed_batch(batch: int, peak_bytes: int | None, usable: int, *, slope_bytes_per_sample: float | None,
                        fitted_below: list[int] = ()) -> int:
    """The batch to time next when the timed run at `batch` peaked above `usable` (or ran out of memory).

    The timed run is longer than a probe and TF's allocator peak moves from step to
    step (it counts whole chunks, and which free chunk a request gets depends on
    the allocator's history: one pinned ResNet-50 64x64 step at batch 153 peaked at
    531 MB in a probe and 579 MB in the timed run after it), so it can miss the
    budget the probe met. Peaks are close to linear in the batch: remove the
    samples the excess is worth at `slope_bytes_per_sample`, plus 1% for the
    allocator's step-to-step spread; without a slope or a peak, 8% of the batch.
    Never below the largest smaller probe that fitted, and always smaller.

        >>> smaller_timed_batch(153, 579_000_000, 573_800_000, slope_bytes_per_sample=1.4e6)
        147
    """
    if peak_bytes is not None and slope_bytes_per_sample and slope_bytes_per_sample > 0:
        excess = max(0, peak_bytes - usable)
        new = batch - math.ceil(excess / slope_bytes_per_sample) - math.ceil(0.01 * batch)
    else:
        new = int(batch * 0.92)
    new = max([*[b for b in fitted_below if b < batch], new])
    return min(new, batch - 1)


def search_slope(probes: list[Probe], fallback: float | None = None) -> float | None:
    """Bytes per sample measured by the probes (`_slope`), else `fallback` (the simulator's)."""
    return _slope(probes) or fallback


def _slope(probes: list[Probe]) -> float | None:
    """Bytes per sample from the two most distant probes that have peaks (not OOM).

    None unless they are at least 20% apart: peaks vary by a few percent from
    run to run, so two close batches give a slope that is mostly noise.
    """
    measured = sorted({p.batch: p.peak_bytes for p in probes if p.peak_bytes is not None and not p.oom}.items())
    if len(measured) < 2:
        return None
    (b0, p0), (b1, p1) = measured[0], measured[-1]
    if b1 - b0 < 0.2 * b1:
        return None
    slope = (p1 - p0) / (b1 - b0)
    return slope if slope > 0 else None


def _next_batch(lo: int, hi: int, lo_peak: int | None, hi_peak: int | None, usable: int,
                slope: float | None, cap: int, resolution: float) -> int:
    if hi > cap:  # grow: nothing failed yet
        if slope and lo_peak is not None:
            guess = lo + (usable - lo_peak) / slope
            target = math.ceil(guess * (1 + resolution / 2))
        else:
            target = 2 * lo
        return min(cap, max(lo + 1, min(target, 4 * lo)))
    if lo == 0:  # shrink: nothing fitted yet
        if slope and hi_peak is not None:
            guess = hi - (hi_peak - usable) / slope
            target = math.floor(guess * (1 - resolution / 2))
        else:
            target = hi // 2
        return max(1, min(hi - 1, max(target, hi // 4)))
    return (lo + hi) // 2  # bisect


def _mib(nbytes: int | None) -> str:
    return "?" if nbytes is None else format_bytes(nbytes, digits=1)


# ------------------------------------------------------------------ simulator side

@dataclass(frozen=True)
class Prediction:
    """The simulator's view of one config under a budget (every figure PREDICTED).

    Attributes:
        batch: largest batch whose simulated peak fits (0: not even batch 1).
        peak_bytes: simulated peak at `batch` (at batch 1 when `batch` is 0).
        step_time_s / throughput: simulated at `batch` on the device profile.
        min_bytes: when nothing fits: the peak at batch 1 (what the budget would need).
        slope_bytes_per_sample: simulated peak growth per sample (seeds the measured search).
        n_swapped: tensors the plan swaps.
        capped: the batch hit the search's cap.
        reason: why it does not fit ("" when it does).
        peak_host_bytes: simulated host memory swapping holds at its peak, at `batch` (at batch 1 when
            `batch` is 0; `lms.sim.host`).
        limited_by: ``"device"`` or ``"host"``: which budget stopped the batch (or did not fit at all).
    """

    batch: int
    peak_bytes: int
    step_time_s: float
    throughput: float
    min_bytes: int | None = None
    slope_bytes_per_sample: float | None = None
    n_swapped: int = 0
    capped: bool = False
    reason: str = ""
    peak_host_bytes: int | None = None
    limited_by: str = "device"

    @property
    def feasible(self) -> bool:
        return self.batch > 0


def predict_max_batch(graph: "Graph", config: "LMSConfig", budget_bytes: int, *,
                      device: "DeviceProfile | str | None", cap: int, allocator: str = "exact",
                      op_costs: "OpCosts | None" = None, host_budget: int | None = None) -> Prediction:
    """Simulated max batch, peak and throughput of `config` on `graph` (no TensorFlow).

    ``allocator="exact"`` counts live bytes (fast: the simulate backend's
    thousands of configs); ``"bfc"`` then steps the batch down until TF's BFC
    allocator, replayed, fits the budget (`lms.simulator.bfc_adjusted_batch`,
    about 0.3 s on ResNet-50 at 64x64): what a measured trial sees, since its
    peak is that allocator's (ResNet-50 at 64x64 on the emulated device: live
    bytes predict batch 116 for ``n_tensors=-1``, the replay 80, measured 85).
    `op_costs`: measured per-op times (`lms.sim.OpCosts`) instead of the
    device profile's roofline. `host_budget`: host bytes swapping may hold (`lms.sim.host`; None: no bound).
    """
    from lms.simulator import InfeasibleBudget, bfc_adjusted_batch, max_batch, simulate

    from ..host import host_miss_reason

    if allocator not in ("exact", "bfc"):
        raise ValueError(f"allocator={allocator!r}: allowed values are 'exact', 'bfc'")
    try:
        r = max_batch(graph, config, budget_bytes, device=device, limit=cap, op_costs=op_costs,
                      host_budget_bytes=host_budget)
    except InfeasibleBudget as exc:
        first = simulate(graph, config, batch=1, device=device, timeline=False, op_costs=op_costs)
        need = int(getattr(exc, "min_bytes", first.peak_device_bytes))
        return Prediction(0, first.peak_device_bytes, first.step_time_s, 0.0, min_bytes=need, n_swapped=0,
                          reason=(f"simulator: even batch 1 with every candidate swapped needs {_mib(need)} "
                                  f"> {_mib(budget_bytes)}"), peak_host_bytes=first.peak_host_bytes)
    if r.batch == 0 and r.limited_by == "host":
        return Prediction(0, r.peak_bytes, r.step_time_s, 0.0, min_bytes=r.peak_bytes, n_swapped=r.n_swapped,
                          reason=host_miss_reason(1, r.peak_host_bytes, host_budget),
                          peak_host_bytes=r.peak_host_bytes, limited_by="host")
    if r.batch == 0:
        return Prediction(0, r.peak_bytes, r.step_time_s, 0.0, min_bytes=r.peak_bytes, n_swapped=r.n_swapped,
                          reason=(f"simulator: batch 1 needs {_mib(r.peak_bytes)} > "
                                  f"{_mib(budget_bytes)} with this config"))
    batch, peak, step_time, throughput, capped = r.batch, r.peak_bytes, r.step_time_s, r.throughput, r.capped
    peak_host = r.peak_host_bytes
    kind = "exact"
    if allocator == "bfc":
        adjusted = bfc_adjusted_batch(graph, config, r.batch, budget_bytes, device=device, op_costs=op_costs)
        if adjusted["batch"] == 0:
            return Prediction(0, r.peak_bytes, r.step_time_s, 0.0, min_bytes=r.peak_bytes, n_swapped=r.n_swapped,
                              reason=("simulator: batch 1 does not fit once TF's BFC allocator is replayed "
                                      f"({_mib(budget_bytes)})"))
        if adjusted["batch"] < batch:
            at = simulate(graph, config, batch=adjusted["batch"], device=device, timeline=False,
                          op_costs=op_costs)
            batch, step_time, throughput, capped = adjusted["batch"], at.step_time_s, at.throughput, False
            peak_host = at.peak_host_bytes
        peak, kind = adjusted["bfc_peak_bytes"], "bfc"
    slope = None
    if batch >= 2:
        half = simulate(graph, config, batch=max(1, batch // 2), device=device, timeline=False,
                        allocator=kind, op_costs=op_costs)
        if batch // 2 < batch and peak > half.peak_device_bytes:
            slope = (peak - half.peak_device_bytes) / (batch - max(1, batch // 2))
    return Prediction(batch, peak, step_time, throughput, slope_bytes_per_sample=slope,
                      n_swapped=r.n_swapped, capped=capped, peak_host_bytes=peak_host,
                      limited_by=r.limited_by if batch == r.batch else "device")


def predict_at_batch(graph: "Graph", config: "LMSConfig", budget_bytes: int, *, batch: int,
                     device: "DeviceProfile | str | None", allocator: str = "exact",
                     op_costs: "OpCosts | None" = None, host_budget: int | None = None) -> Prediction:
    """Simulated peak and throughput of `config` at a fixed `batch` (``--batch``; no TensorFlow).

    Feasible when the simulated peak (live bytes, or TF's BFC allocator replayed
    with ``allocator="bfc"``) fits `budget_bytes` and its host peak `host_budget` (None: no
    host bound); then ``batch`` is `batch`. When it does not fit, ``batch`` is 0 and
    ``min_bytes`` the peak it needs at `batch`.
    """
    from lms.simulator import simulate

    from ..host import host_miss_reason

    if allocator not in ("exact", "bfc"):
        raise ValueError(f"allocator={allocator!r}: allowed values are 'exact', 'bfc'")
    r = simulate(graph, config, batch=batch, device=device, timeline=False, allocator=allocator, op_costs=op_costs)
    peak = int(r.peak_device_bytes)
    if peak > budget_bytes:
        return Prediction(0, peak, r.step_time_s, 0.0, min_bytes=peak, n_swapped=r.n_swap_outs,
                          reason=f"simulator: batch {batch} needs {_mib(peak)} > {_mib(budget_bytes)} with this config",
                          peak_host_bytes=r.peak_host_bytes)
    if host_budget is not None and r.peak_host_bytes > host_budget:
        return Prediction(0, peak, r.step_time_s, 0.0, min_bytes=peak, n_swapped=r.n_swap_outs,
                          reason=host_miss_reason(batch, r.peak_host_bytes, host_budget),
                          peak_host_bytes=r.peak_host_bytes, limited_by="host")
    return Prediction(batch, peak, r.step_time_s, r.throughput, n_swapped=r.n_swap_outs,
                      peak_host_bytes=r.peak_host_bytes)
