"""Which trial is recommended: the feasible trials, their Pareto front, the rule's pick, the no-LMS baseline.

Which Pareto point is recommended (`select_recommendation`):
``prefer="batch"`` (default): the largest batch among the Pareto-optimal
configs whose throughput is at least ``min_throughput_ratio`` (default 0.8) of
the best throughput on the front; ``prefer="throughput"``: the fastest.

Below the backends and the confirmation (`tuner.backends.confirm`), which choose with it
during a search; `tuner.outputs` writes the choice into recommended.json.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from .bracket import confirmed_figures
from .pareto import dominates, rule_pick

__all__ = ["feasible_trials", "pareto_front", "Confirmed", "select_recommendation", "throughput_peak_front",
           "baseline_trial"]


def feasible_trials(trials: Iterable[Any]) -> list[Any]:
    """COMPLETE trials with status ok, batch > 0 and no violated constraint."""
    out = []
    for t in trials:
        if getattr(t.state, "name", "") != "COMPLETE" or t.values is None:
            continue
        if t.user_attrs.get("status") != "ok" or t.values[0] <= 0:
            continue
        if any(v > 0 for v in t.constraints.values()):
            continue
        out.append(t)
    return out


def pareto_front(trials: Sequence[Any]) -> list[Any]:
    """Non-dominated trials (both objectives maximised), sorted by batch size, one per (batch, throughput)."""
    front = [t for t in trials if not any(dominates(o.values, t.values) for o in trials)]
    seen: set[tuple[float, float]] = set()
    unique = []
    for t in sorted(front, key=lambda t: (t.values[0], -t.values[1], t.number)):
        key = (t.values[0], t.values[1])
        if key not in seen:
            seen.add(key)
            unique.append(t)
    return unique


class Confirmed:
    """A trial seen through its figures from fresh processes (`tuner.backends.confirm`): its values are those."""

    def __init__(self, trial: Any, figures: Mapping[str, Any]) -> None:
        self._trial = trial
        self.values = [float(figures["batch_size"]), float(figures["throughput"])]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trial, name)


def select_recommendation(trials: Sequence[Any], *, prefer: str = "batch", min_throughput_ratio: float = 0.8,
                          confirmations: Mapping[str, Any] | None = None) -> tuple[Any | None, list[Any]]:
    """(chosen trial or None, the Pareto front) among the feasible `trials` (see module docstring).

    A trial re-measured in fresh processes (`confirmations`, `tuner.backends.confirm`) takes part with its confirmed
    batch and throughput: the throughput rule then compares figures measured the same way (one ResNet-50
    64x64 search's no-LMS trial ran at 87.9 samples/s and its LMS trials at 63-66, where other searches
    measured the same configs the other way round).
    """
    if confirmations:
        trials = [Confirmed(t, f) if (f := confirmed_figures(t, confirmations)) is not None else t
                  for t in trials]
    front = pareto_front(feasible_trials(trials))
    if not front:
        return None, front
    return rule_pick(front, prefer=prefer, min_throughput_ratio=min_throughput_ratio), front


def throughput_peak_front(trials: Sequence[Any]) -> list[Any]:
    """At a fixed batch: the feasible trials no other beats on both throughput (higher) and peak (lower), fastest first."""
    def point(t: Any) -> tuple[float, float]:
        return float(t.user_attrs.get("throughput") or 0.0), float(t.user_attrs.get("peak_device_bytes") or 0)

    front = [t for t in trials if not any(dominates(point(o), point(t), maximize=(True, False)) for o in trials)]
    seen: set[tuple[float, float]] = set()
    out = []
    for t in sorted(front, key=lambda t: (-point(t)[0], point(t)[1], t.number)):
        if point(t) not in seen:
            seen.add(point(t))
            out.append(t)
    return out


def baseline_trial(trials: Iterable[Any]) -> Any | None:
    """The first completed no-LMS (``n_tensors=0``) trial, or None."""
    for t in sorted(trials, key=lambda t: t.number):
        cfg = t.user_attrs.get("config") or {}
        if cfg.get("n_tensors") == 0 and getattr(t.state, "name", "") == "COMPLETE":
            return t
    return None
