"""Pareto dominance, once: the fronts of the recommendation, the screening picks and the report use it."""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

__all__ = ["dominates", "pareto_picks"]


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


def pareto_picks(trials: Sequence[Any], k: int, *, exclude: Iterable[str] = (), table: Any = None) -> list[dict[str, Any]]:
    """Up to `k` param sets from the feasible Pareto front, spread along it.

    First the point with the best sum of normalised batch and throughput (a
    balanced one, likely close to the recommendation), then each time the
    point farthest from those already picked. Configs whose canonical key
    (`tuner.knobs.KnobTable.canonical_key` of `table`) is in `exclude`
    (already queued or run) are not picked.
    """
    from .knobs import KNOB_TABLE

    table = table or KNOB_TABLE
    front = [t for t in trials if t.user_attrs.get("status") == "ok" and t.values is not None]
    front = [t for t in front if not any(dominates(o.values, t.values) for o in front)]
    if not front or k <= 0:
        return []
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
    picked = [max(front, key=lambda t: (points[t.number][0] + points[t.number][1], t.values[0]))]
    while len(picked) < min(k, len(front)):
        rest = [t for t in front if t not in picked]
        far = max(rest, key=lambda t: min(math.dist(points[t.number], points[p.number]) for p in picked))
        picked.append(far)
    return [dict(t.params) for t in picked]
