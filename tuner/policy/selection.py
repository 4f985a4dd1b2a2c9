"""Which trial is recommended: the feasible trials, their Pareto front, the rule's pick, the no-LMS baseline.

Which Pareto point is recommended (`select_recommendation`):
``prefer="batch"`` (default): the largest batch among the Pareto-optimal
configs whose throughput is at least ``min_throughput_ratio`` (default 0.8) of
the best throughput on the front; ``prefer="throughput"``: the fastest. Where the
no-LMS step reaches the chosen batch (always so at a fixed batch, ``--batch N``,
when it fits), runs within `PLAIN_TOLERANCE` of the chosen config's throughput
and leaves `PLAIN_HEADROOM` of the usable budget free, no LMS is recommended
instead (`prefer_plain`).

Below the backends and the confirmation (`tuner.backends.confirm`), which choose with it
during a search; `tuner.outputs` writes the choice into recommended.json.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from lms.config import LMSConfig

from .bracket import confirmed_figures
from .pareto import dominates, rule_pick

__all__ = ["feasible_trials", "pareto_front", "Confirmed", "select_recommendation", "throughput_peak_front",
           "baseline_trial", "prefer_plain", "is_plain", "PLAIN_TOLERANCE", "PLAIN_HEADROOM"]

#: An LMS config is recommended over the no-LMS step at the same batch only when it is faster by more than
#: this fraction. A swap costs transfer time and a pinned order saves none that separate processes can show:
#: at the common batch 16 of benchmarks/peers.py (ResNet-50 64x64, emulated device) the tuner's ``--batch 16``
#: search measured swapping every tensor at 45.9 samples/s and no LMS at 41.1 (one process each, a loaded
#: 2-core box), and the same plain step ranged 56-85 samples/s between processes that hour (MEASURED
#: 2026-12-06): a 12% "gain" was the machine's noise.
PLAIN_TOLERANCE = 0.15
#: ... and only when the no-LMS step's peak leaves this fraction of the usable budget free. At the edge of the
#: budget the config's lower peak is what keeps the user's own program inside it: keras.io's DCGAN under its
#: own ``fit`` (benchmarks/user_programs.py, budget from its peak at batch 8) reached batch 7 without LMS
#: (40.21 of 40.88 MiB usable in the tuner's processes) as with LMS, and its own runs without LMS then peaked
#: at 42.45 MiB, over the usable budget, where the config the tuner used to pick stayed under it (MEASURED
#: 2026-12-06).
PLAIN_HEADROOM = 0.05


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
    feasible = feasible_trials(trials)
    front = pareto_front(feasible)
    if not front:
        return None, front
    chosen = rule_pick(front, prefer=prefer, min_throughput_ratio=min_throughput_ratio)
    return prefer_plain(chosen, feasible), front


def is_plain(trial: Any) -> bool:
    """The trial ran the step without LMS (`lms.config.LMSConfig.off`: nothing swapped or recomputed, TF's order)."""
    try:
        return LMSConfig.from_dict(trial.user_attrs.get("config") or {"n_tensors": -1}).off
    except (TypeError, ValueError):  # not a config this version reads: not known to be plain
        return False


def prefer_plain(chosen: Any, feasible: Sequence[Any], *, tolerance: float = PLAIN_TOLERANCE,
                 headroom: float = PLAIN_HEADROOM) -> Any:
    """`chosen`, or the fastest feasible no-LMS trial at the same batch when it is within `tolerance` of
    `chosen`'s throughput and its peak leaves `headroom` of the usable budget free (its ``constraint``,
    peak / usable - 1, at most ``-headroom``; module docstring): what LMS would add there is a cost the
    figures cannot tell from noise.

        >>> class T:
        ...     def __init__(self, n, values, c=-0.2):
        ...         self.user_attrs, self.values = {"config": {"n_tensors": n}, "constraint": [c]}, values
        >>> lms, plain = T(-1, [16, 45.9]), T(0, [16, 41.1])
        >>> prefer_plain(lms, [lms, plain]) is plain, prefer_plain(lms, [lms, T(0, [16, 38.0])]) is lms
        (True, True)
        >>> prefer_plain(lms, [lms, T(0, [8, 60.0])]) is lms   # no LMS does not reach the batch
        True
        >>> prefer_plain(lms, [lms, T(0, [16, 45.0], c=-0.016)]) is lms   # no LMS at the edge of the budget
        True
    """
    if is_plain(chosen):
        return chosen

    def free(t: Any) -> bool:
        c = t.user_attrs.get("constraint")
        value = c[0] if isinstance(c, (list, tuple)) and c else None
        return isinstance(value, (int, float)) and value <= -headroom

    same = [t for t in feasible if is_plain(t) and t.values[0] == chosen.values[0] and free(t)]
    if not same:
        return chosen
    plain = max(same, key=lambda t: t.values[1])
    return plain if plain.values[1] >= (1.0 - tolerance) * chosen.values[1] else chosen


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
