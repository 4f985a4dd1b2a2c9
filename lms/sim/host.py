"""Host memory that swapping holds: its peak, a host budget, and a plan that stays under one. No TensorFlow.

Every swapped tensor has a host copy from its swap-out until its last swap-in
has read it (`lms.sim.compiled`: the swap-out's output is a host buffer freed
after its last reader). On a GPU that copy lives in TF's pinned host allocator
(``gpu_host_bfc``), which the OS cannot page out; on the emulated device it is a
numpy buffer outside TF's allocator (`lms.tf.emulate`). The simulator's
`SimResult.peak_host_bytes` is the largest sum of those copies at one position of
the executed order (``peak_host_index`` / ``peak_host_op``): a PREDICTION.

- `host_peak(result)`: (bytes, index, op) of a simulated step's host peak.
- `fits(result, budget, host_budget)`: the device peak fits `budget` and the host
  peak fits `host_budget` (``None``: no host bound).
- `plan_within_host_budget(graph, config, host_budget)`: the plan of `config`
  with ``n_tensors`` lowered (the latest swaps dropped) until its predicted host
  peak fits (here, above the planner: the simulator judges the planner's plans, so the planner
  itself takes no host budget).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import LMSConfig
    from ..graph import Graph
    from ..plan import SwapPlan
    from .result import SimResult

__all__ = ["host_peak", "fits", "host_fits", "plan_within_host_budget", "HostBudgetError", "check_host_budget",
           "predicted_host_peak"]


class HostBudgetError(ValueError):
    """Even the config's fewest swaps hold more host memory than the host budget (not raised for ``n_tensors=0``)."""


def check_host_budget(host_budget: int | None) -> None:
    """ValueError unless `host_budget` is None or a positive integer number of bytes."""
    if host_budget is None:
        return
    if isinstance(host_budget, bool) or not isinstance(host_budget, int) or host_budget <= 0:
        raise ValueError(f"host_budget={host_budget!r}: must be a positive number of bytes or None")


def host_peak(result: "SimResult") -> tuple[int, int, str]:
    """(peak host bytes, its position in the executed order, the op there) of a simulated step (PREDICTED)."""
    return result.peak_host_bytes, result.peak_host_index, result.peak_host_op


def host_fits(result: "SimResult", host_budget: int | None) -> bool:
    """True when `host_budget` is None or the simulated host peak is at most `host_budget`."""
    return host_budget is None or result.peak_host_bytes <= host_budget


def fits(result: "SimResult", budget: int, host_budget: int | None = None) -> bool:
    """True when the device peak fits `budget` and the host peak fits `host_budget` (None: no host bound)."""
    return result.peak_device_bytes <= budget and host_fits(result, host_budget)


def _host_peak_of(graph: "Graph", plan: "SwapPlan", batch: int) -> int:
    from .interpreter import simulate

    return simulate(graph, plan, batch=batch, timeline=False).peak_host_bytes


def predicted_host_peak(graph: "Graph", plan: "SwapPlan", batch: int | None = None) -> int:
    """Host bytes `plan`'s swapped tensors hold at once at their peak at `batch` (default: the plan's), PREDICTED
    by the order-based simulator (no device: copies take no time)."""
    if not plan.swaps:
        return 0
    at = batch or plan.batch_size or graph.batch_size or 1
    return _host_peak_of(graph, plan, int(at))


def plan_within_host_budget(graph: "Graph", config: "LMSConfig", host_budget: int, *,
                            batch: int | None = None) -> "SwapPlan":
    """The plan of `config`, with fewer swaps when needed, whose predicted host peak is at most `host_budget`.

    Swaps are taken in the planner's order (the earliest forward tensors first,
    ``n_tensors``), so lowering ``n_tensors`` drops the latest ones. The host
    peak is the order-based simulator's (no device: copies take no time) at
    `batch` (default: the graph's own batch size). The config of the plan
    returned says the ``n_tensors`` used.

    Raises:
        HostBudgetError: even one swapped tensor needs more than `host_budget`.
        ValueError: `host_budget` is not a positive integer.
    """
    from ..plan import find_candidates, plan_swaps

    check_host_budget(host_budget)
    at = graph.batch_size if batch is None else batch
    at = at if isinstance(at, int) and at >= 1 else 1
    plan = plan_swaps(graph, config)
    if not plan.swaps or _host_peak_of(graph, plan, at) <= host_budget:
        return plan
    n_candidates = len(find_candidates(graph, config)[0])
    hi = plan.n_swapped if config.n_tensors < 0 else min(config.n_tensors, n_candidates)
    lo = 0  # n_tensors=0 swaps nothing: no host bytes
    best = dataclasses.replace(config, n_tensors=0)
    while hi - lo > 1:  # lo fits, hi does not
        mid = (lo + hi) // 2
        trial = dataclasses.replace(config, n_tensors=mid)
        if _host_peak_of(graph, plan_swaps(graph, trial), at) <= host_budget:
            lo, best = mid, trial
        else:
            hi = mid
    if lo == 0 and config.recompute == "none":
        first = plan_swaps(graph, dataclasses.replace(config, n_tensors=1))
        raise HostBudgetError(
            f"host_budget={host_budget} bytes: even one swapped tensor holds "
            f"{_host_peak_of(graph, first, at)} bytes of host memory at batch {at}; give a larger host budget "
            "or n_tensors=0")
    return plan_swaps(graph, best)


def describe(result: "SimResult") -> dict[str, Any]:
    """The host figures of a simulated step, JSON-ready (all PREDICTED)."""
    return {"peak_host_bytes": result.peak_host_bytes, "peak_host_index": result.peak_host_index,
            "peak_host_op": result.peak_host_op}
