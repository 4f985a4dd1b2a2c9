"""The compile stage: a graph model and a config -> its plan -> its schedule, each made once per graph. No TensorFlow.

Every consumer of a plan goes through here, so the step `lms.function` rewrites, the simulator's prediction
and the tuner's report are made from the same objects::

    LMSConfig --resolve_plan--> SwapPlan --schedule_for--> Schedule
                  (lms.plan)                  (lms.schedule)

Below `lms.sim` (which interprets a plan and its schedule over an executed order) and `lms.tf` (which applies
them to a traced graph); above `lms.plan` and `lms.schedule`. Results are kept per graph while the graph model
lives (`cached`, at most `MAX_PER_GRAPH` entries each), keyed by what they were made from: the same config
planned for the same kernels is the same plan object, which later caches key on.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from .config import LMSConfig
from .graph import Graph
from .machine.devices import DeviceProfile
from .plan import SwapPlan, plan_swaps
from .schedule import schedule_ops

__all__ = ["resolve_plan", "plan_kernels", "schedule_for", "cached", "per_graph", "MAX_PER_GRAPH"]

_CACHE: "weakref.WeakKeyDictionary[Graph, dict]" = weakref.WeakKeyDictionary()
MAX_PER_GRAPH = 64


def per_graph(graph: Graph) -> dict:
    """The cache of `graph` (created empty on first use; gone with the graph)."""
    return _CACHE.setdefault(graph, {})


def _trim(entries: dict) -> None:
    while len(entries) >= MAX_PER_GRAPH:
        entries.pop(next(iter(entries)))


def cached(graph: Graph, key: tuple, make: Callable[[], Any]) -> Any:
    """``make()``, computed once per (`graph`, `key`) while `graph` lives."""
    entries = per_graph(graph)
    if key not in entries:
        _trim(entries)
        entries[key] = make()
    return entries[key]


def store(graph: Graph, key: tuple, value: Any) -> Any:
    """Keep `value` under `key` in `graph`'s cache (oldest entries dropped past `MAX_PER_GRAPH`); returns it."""
    entries = per_graph(graph)
    _trim(entries)
    entries[key] = value
    return value


def resolve_plan(graph: Graph, config_or_plan: LMSConfig | SwapPlan | None, *,
                 kernels: str = "cpu") -> SwapPlan | None:
    """A plan for `graph`: as given, planned from a config for `kernels` (cached), or ``None``."""
    if config_or_plan is None or isinstance(config_or_plan, SwapPlan):
        return config_or_plan
    if not isinstance(config_or_plan, LMSConfig):
        raise TypeError(f"expected an LMSConfig, a SwapPlan or None, got {type(config_or_plan).__name__}")
    return cached(graph, ("plan", config_or_plan, kernels),
                  lambda: plan_swaps(graph, config_or_plan, kernels=kernels))


def plan_kernels(device: DeviceProfile | None) -> str:
    """Whose kernels a plan for `device` is made for (`lms.plan.plan_swaps`): its own, oneDNN's without one."""
    return device.kernels if device is not None else "cpu"


def schedule_for(graph: Graph, plan: SwapPlan, *, exact: bool = False) -> Any:
    """The `lms.schedule.Schedule` of (graph, plan) under the plan's config, cached while `graph` lives.

    Computed at the graph's own batch size, as `lms.function` computes it for the
    graph it traced, so the simulator predicts the order that is pinned (with
    `exact`: the order of a step whose executed graph is pinned whole).
    """
    return cached(graph, ("schedule", plan, exact), lambda: schedule_ops(graph, plan, exact=exact))
