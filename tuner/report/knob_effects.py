"""How the knobs matter: per knob value, the medians and maxima of batch, throughput and peak (plain data).

`knob_effects` chooses the panels the report draws (`tuner.report.plots.plot_knobs`): ``n_tensors`` and the
other knobs that took more than one value, over the measured trials, or over the simulated screening study's
(PREDICTED) when too few configs were measured to show anything.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..policy.knobs import KNOB_TABLE, KnobTable

__all__ = ["KnobEffect", "knob_label", "knob_effect", "knob_effects"]


def knob_label(knob: str, value: Any) -> str:
    """How a knob value reads in the report: ``n_tensors`` -1 is "all", 0 is "0 (off)" (no LMS)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if knob == "n_tensors":
        value = int(value)
        return "all" if value == -1 else "0 (off)" if value == 0 else str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _knob_order(knob: str, value: Any) -> tuple:
    if knob == "n_tensors" and value is not None and int(value) == -1:
        return (1, math.inf, "")
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (0, math.inf, str(value))


@dataclass(frozen=True, eq=False)
class KnobEffect:
    """How one knob relates to the outcome over the feasible trials.

    Attributes:
        knob: the knob's column name.
        summary: one row per knob value, in display order: ``value``, ``label``,
            ``position`` (0, 1, ...: the x position in the plot), ``n_trials``,
            ``batch_median``, ``throughput_median``, ``throughput_max``,
            ``peak_median``, ``peak_max``.
        points: the feasible trials: ``number``, ``position``, ``batch_size``,
            ``throughput``, ``peak_bytes``.
        n_failed: trials that set this knob but failed (not in `points`).
    """

    knob: str
    summary: pd.DataFrame
    points: pd.DataFrame
    n_failed: int
    predicted: bool = False  # over the screening study's trials (PREDICTED), not the measured ones


def knob_effect(df: pd.DataFrame, knob: str, *, lms_only: bool = False) -> KnobEffect:
    """Per-value medians and maxima of batch, throughput and peak memory for `knob`.

    `lms_only` leaves out trials that swap nothing (``n_tensors == 0``), for
    knobs that mean nothing without swapping (``lb``, ``fuse_swapins``, ...).
    """
    with_knob = df[df[knob].notna()]
    if lms_only:
        with_knob = with_knob[with_knob["lms"] == True]  # noqa: E712 (None = unknown)
    ok = with_knob[with_knob["feasible"]]
    values = sorted({_hashable(v) for v in ok[knob]}, key=lambda v: _knob_order(knob, v))
    position = {v: i for i, v in enumerate(values)}
    rows = []
    for v in values:
        group = ok[ok[knob].map(_hashable) == v]
        rows.append({
            "value": v, "label": knob_label(knob, v), "position": position[v], "n_trials": len(group),
            "batch_median": float(group["batch_size"].median()),
            "throughput_median": float(group["throughput"].median()),
            "throughput_max": float(group["throughput"].max()),
            "peak_median": float(group["peak_bytes"].median()),
            "peak_max": float(group["peak_bytes"].max()),
        })
    summary = pd.DataFrame(rows, columns=["value", "label", "position", "n_trials", "batch_median",
                                          "throughput_median", "throughput_max", "peak_median",
                                          "peak_max"])
    points = pd.DataFrame({
        "number": ok["number"].astype(int), "position": ok[knob].map(lambda v: position[_hashable(v)]),
        "batch_size": ok["batch_size"], "throughput": ok["throughput"], "peak_bytes": ok["peak_bytes"],
    }).reset_index(drop=True)
    return KnobEffect(knob=knob, summary=summary, points=points,
                      n_failed=int(len(with_knob) - len(ok)))


def _hashable(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return tuple(value)
    return value


def knob_effects(df: pd.DataFrame, *, screen: pd.DataFrame | None = None, table: KnobTable = KNOB_TABLE,
                 most: int = 3) -> tuple[KnobEffect, ...]:
    """The knobs worth a panel: ``n_tensors`` and the others that took two or more values in feasible trials.

    Over the measured trials when three or more fitted, else over the screening
    study's (PREDICTED; ``KnobEffect.predicted``): a search of a few measured
    configs varies almost nothing. Knobs other than ``n_tensors`` count only
    trials that swap. A knob seen at one value has no panel (it shows nothing),
    at most `most` panels, those with the most values first.
    """
    source, predicted = df, False
    if int(df["feasible"].sum()) < 3 and screen is not None and int(screen["feasible"].sum()) >= 3:
        source, predicted = screen[~screen["duplicate"]], True
    effects = [knob_effect(source, "n_tensors")]
    others = []
    for knob in table.columns:
        if knob == "n_tensors" or knob not in source:
            continue
        effect = knob_effect(source, knob, lms_only=True)
        if len(effect.summary) >= 2:
            others.append(effect)
    others.sort(key=lambda e: -len(e.summary))
    out = tuple(effects + others[:max(0, most - 1)])
    return tuple(dataclasses.replace(e, predicted=predicted) for e in out)
