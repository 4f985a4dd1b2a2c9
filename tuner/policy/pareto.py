"""Pareto dominance, once: the fronts of the recommendation, the screening picks and the report use it."""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

__all__ = ["dominates", "pareto_picks", "rule_pick"]


def dominates(a: Sequence[float], b: Sequence[float], *, maximize: Sequence[bool] | None = None) -> bool:
    """Whether point `a` Pareto-dominates `b`: no worse in every objective, better in one.

    Args:
        maximize: per objective, larger is better (default: every objective maximised).
    """
    signs = [1.0 if m else -1.0 for m in maximize] if maximize is not None else [1.0] * len(a)
    better = False
    for x, y, s in zip(a, b, signs):
        if x * s < y * s:
            return False
        better = better or x * s > y * s
    return better


def rule_pick(points: Sequence[Any], *, prefer: str = "batch", min_throughput_ratio: float = 0.8,
              best_throughput: float | None = None) -> Any:
    """The recommendation rule on `points` (non-empty; ``values`` = (batch, throughput)).

    ``prefer="batch"``: the largest batch whose throughput is at least
    `min_throughput_ratio` x `best_throughput` (default: the best of `points`),
    or the largest batch if none is; ``"throughput"``: the fastest.
    """
    if prefer == "throughput":
        return max(points, key=lambda t: (t.values[1], t.values[0]))
    if prefer != "batch":
        raise ValueError(f"prefer={prefer!r}: use 'batch' or 'throughput'")
    best = max(t.values[1] for t in points) if best_throughput is None else best_throughput
    eligible = [t for t in points if t.values[1] >= min_throughput_ratio * best] or points
    return max(eligible, key=lambda t: (t.values[0], t.values[1]))


def pareto_picks(trials: Sequence[Any], k: int, *, exclude: Iterable[str] = (), table: Any = None,
                 prefer: str = "batch", min_throughput_ratio: float = 0.8) -> list[dict[str, Any]]:
    """Up to `k` param sets from the feasible Pareto front, spread along it.

    First the point the recommendation's rule would choose among them
    (`tuner.policy.selection.select_recommendation`: with ``prefer="batch"`` the largest
    batch whose throughput is at least `min_throughput_ratio` x the front's
    best), then each time the point farthest from those already picked.
    Configs whose canonical key (`tuner.policy.knobs.KnobTable.canonical_key` of
    `table`) is in `exclude` (already queued or run) are not picked.

    The first pick used to be the best sum of normalised batch and
    throughput; on a screen whose throughputs come from timed op profiles that
    sum moved with the timing noise, so the same screen measured different
    configs (issue 14), and it was not the point the recommendation wanted.
    """
    from .knobs import KNOB_TABLE

    table = table or KNOB_TABLE
    front = [t for t in trials if t.user_attrs.get("status") == "ok" and t.values is not None]
    front = [t for t in front if not any(dominates(o.values, t.values) for o in front)]
    if not front or k <= 0:
        return []
    best_throughput = max(t.values[1] for t in front)  # the whole front's, as the recommendation's rule
    excluded = set(exclude)
    uniq: dict[str, Any] = {}
    for t in sorted(front, key=lambda t: (-t.values[0], -t.values[1], t.number)):
        key = table.canonical_key(table.from_dict(t.user_attrs["config"]))
        if key not in excluded:
            uniq.setdefault(key, t)
    front = list(uniq.values())
    if not front:
        return []
    b_max = max(t.values[0] for t in front) or 1.0
    r_max = max(t.values[1] for t in front) or 1.0
    points = {t.number: (t.values[0] / b_max, t.values[1] / r_max) for t in front}
    picked = [rule_pick(front, prefer=prefer, min_throughput_ratio=min_throughput_ratio,
                        best_throughput=best_throughput)]
    while len(picked) < min(k, len(front)):
        rest = [t for t in front if t not in picked]
        far = max(rest, key=lambda t: min(math.dist(points[t.number], points[p.number]) for p in picked))
        picked.append(far)
    return [dict(t.params) for t in picked]
