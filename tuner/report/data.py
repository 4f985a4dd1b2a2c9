"""The data behind every part of the report: plain DataFrames and frozen dataclasses.

The knob panels are computed in `tuner.report.knob_effects` (re-exported here).
Nothing here draws (no matplotlib); `tuner.report.plots` draws what this module
computes, and `tuner.report.html` lays it out. Each function takes what the
tuner wrote (Optuna trials following the trial-record contract, the
``recommended.json`` document, study attributes) and returns numbers a test can
check by hand.

Trial record (Optuna ``user_attrs``): ``batch_size``, ``throughput`` (samples/s),
``peak_device_bytes``, ``peak_source``, ``backend``, ``measured``,
``predicted_peak_bytes``, ``predicted_throughput``, ``status`` (``"ok"`` or a
failure), ``reason``, ``config`` (an `LMSConfig` dict) and ``constraint``
(``[v]``, ``v > 0`` = infeasible).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from ..policy.knobs import KNOB_TABLE, KnobTable
from ..policy.pareto import dominates
from ..study.study import study_record
from .knob_effects import KnobEffect, knob_effect, knob_effects, knob_label
from .provenance import Recommendation, environment_rows, measurement_note

__all__ = [
    "KNOB_COLUMNS", "FAILURE_STATUSES", "Recommendation", "ParetoFront", "KnobEffect",
    "trials_frame", "pareto_mask", "pareto_front", "recommended_trial", "baseline_trial",
    "knob_effect", "knob_effects", "knob_label", "measurement_note", "environment_rows", "trial_table", "prediction_check",
    "ReportData", "report_data",
]

FAILURE_STATUSES = ("infeasible", "oom", "timeout", "killed", "error")

# LMSConfig fields, as trial-table columns (the config dict of each trial record): `tuner.policy.knobs`.
KNOB_COLUMNS = KNOB_TABLE.columns

_RECORD_COLUMNS = ("batch_size", "throughput", "peak_device_bytes", "peak_source", "backend",
                   "measured", "predicted_peak_bytes", "predicted_throughput", "status", "reason",
                   "predicted_batch",  # the simulator's max batch, recorded by the search
                   "step_time_median_s")  # a measured trial's median step time


# ---- trials ----------------------------------------------------------------------------------

def trials_frame(trials: Iterable[Any], *, table: KnobTable = KNOB_TABLE,
                 confirmations: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """One row per Optuna trial (``FrozenTrial``), in trial-number order.

    Columns: ``number``, ``state`` (Optuna's, lower case), the record fields,
    the knobs (`table`'s columns, from the trial's ``config``, falling back to its
    params), ``params`` (the searched values, a dict), ``constraint`` (max of the
    constraint values, NaN if none), ``feasible`` (finished, status ``ok`` and no
    constraint above 0), ``lms`` (the config swaps something), ``peak_bytes``
    (measured or simulated peak, else the predicted one), ``peak_is_predicted``,
    ``duplicate`` (a repeat of an evaluated config: not counted), ``confirmed``
    and ``processes`` (see below).

    `confirmations` (the study's user attr ``"confirmations"``, `tuner.policy.bracket`):
    a trial measured in fresh processes shows the figures the recommendation
    uses (`tuner.policy.bracket.confirmed_figures`: the bracket's batch, its fastest
    process's throughput, the highest peak there), so every table and plot
    agrees with ``recommended.json`` and ``tuner best``; ``confirmed`` marks
    them and ``processes`` counts their fresh processes.
    """
    from ..policy.bracket import confirmed_figures

    rows: list[dict[str, Any]] = []
    for t in trials:
        attrs = dict(t.user_attrs)
        state = getattr(t.state, "name", str(t.state)).lower()
        row: dict[str, Any] = {"number": int(t.number), "state": state}
        for key in _RECORD_COLUMNS:
            row[key] = attrs.get(key)
        figures = confirmed_figures(t, confirmations) if confirmations and attrs.get("status") == "ok" else None
        row["confirmed"] = figures is not None
        row["processes"] = figures["processes"] if figures is not None else None
        row["duplicate"] = "duplicate_of" in attrs
        if figures is not None:
            row.update({k: figures[k] for k in ("batch_size", "throughput", "peak_device_bytes")})
        if row["status"] is None:
            row["status"] = {"complete": "ok", "fail": "error", "pruned": "infeasible"}.get(state, state)
        config = attrs.get("config") if isinstance(attrs.get("config"), Mapping) else {}
        params = dict(t.params)
        for knob in table.columns:
            row[knob] = config.get(knob, params.get(knob))
        row["config"] = dict(config)
        row["params"] = params
        row["constraint"] = _constraint(t, attrs)
        rows.append(row)
    columns = ["number", "state", *_RECORD_COLUMNS, "confirmed", "processes", "duplicate", *table.columns, "config",
               "params", "constraint"]
    df = pd.DataFrame(rows, columns=columns)
    for col in ("batch_size", "throughput", "peak_device_bytes", "predicted_peak_bytes",
                "predicted_throughput", "predicted_batch", "step_time_median_s", "constraint"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    df["measured"] = df["measured"].map(lambda v: bool(v) if v is not None and v == v else False)
    for col in ("confirmed", "duplicate"):
        df[col] = df[col].map(lambda v: bool(v) if v is not None and v == v else False)
    df["reason"] = df["reason"].fillna("").astype(str)
    df["status"] = df["status"].astype(str)
    df["feasible"] = ((df["state"] == "complete") & (df["status"] == "ok")
                      & ~(df["constraint"] > 0) & df["batch_size"].notna())
    df["lms"] = df["n_tensors"].map(lambda v: None if v is None or v != v else int(v) != 0)
    df["peak_is_predicted"] = df["peak_device_bytes"].isna() & df["predicted_peak_bytes"].notna()
    df["peak_bytes"] = df["peak_device_bytes"].fillna(df["predicted_peak_bytes"])
    return df.sort_values("number", kind="stable").reset_index(drop=True)


def _constraint(trial: Any, attrs: Mapping[str, Any]) -> float:
    values: list[float] = []
    raw = attrs.get("constraint")
    if isinstance(raw, (list, tuple)):
        values += [float(v) for v in raw if isinstance(v, (int, float))]
    elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
        values.append(float(raw))
    constraints = getattr(trial, "constraints", None)  # Optuna 5: {name: value} set by trial.set_constraint
    if isinstance(constraints, Mapping):
        constraints = list(constraints.values())
    if isinstance(constraints, (list, tuple)):
        values += [float(v) for v in constraints if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return max(values) if values else math.nan


def recommended_trial(df: pd.DataFrame, recommendation: "Recommendation | None") -> int | None:
    """Number of the trial the recommendation came from, or None.

    The document's ``trial_number`` when it names a trial of the study;
    otherwise the first feasible trial with the same config and batch size.
    """
    if recommendation is None or df.empty:
        return None
    if recommendation.trial_number is not None and recommendation.trial_number in set(df["number"]):
        return int(recommendation.trial_number)
    for row in df[df["feasible"]].itertuples():
        if row.batch_size == recommendation.batch_size and _same_config(row.config, recommendation.config):
            return int(row.number)
    return None


def _same_config(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    keys = set(a) | set(b)
    return all(_norm(a.get(k)) == _norm(b.get(k)) for k in keys)


def _norm(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def baseline_trial(df: pd.DataFrame) -> int | None:
    """Number of the best feasible no-LMS trial (``n_tensors == 0``): largest batch, then throughput."""
    base = df[df["feasible"] & (df["lms"] == False)]  # noqa: E712 (None = unknown)
    if base.empty:
        return None
    best = base.sort_values(["batch_size", "throughput", "number"], ascending=[False, False, True],
                            na_position="last", kind="stable")
    return int(best.iloc[0]["number"])


# ---- Pareto fronts ------------------------------------------------------------------------------

def pareto_mask(points: np.ndarray | Sequence[Sequence[float]], *, maximize: Sequence[bool]) -> np.ndarray:
    """Which rows of `points` (n x k) no other row dominates.

    Row ``a`` dominates ``b`` when it is at least as good in every column and
    better in one ("good" = larger where `maximize`, else smaller). Equal rows
    do not dominate each other, so duplicates on the front all stay. Rows with
    NaN are never on the front.
    """
    pts = np.asarray(points, dtype=float)
    if pts.ndim != 2 or pts.shape[1] != len(maximize):
        raise ValueError(f"points must be n x {len(maximize)}, got shape {pts.shape}")
    signs = np.where(np.asarray(maximize, dtype=bool), 1.0, -1.0)
    goal = pts * signs  # larger is better in every column
    valid = ~np.isnan(goal).any(axis=1)
    mask = valid.copy()
    others = goal[valid]
    for i in np.flatnonzero(valid):
        mask[i] = not any(dominates(o, goal[i]) for o in others)
    return mask


@dataclass(frozen=True, eq=False)
class ParetoFront:
    """One trade-off plot's data.

    Attributes:
        x, y: trial-frame columns plotted.
        x_label, y_label: axis titles.
        maximize_x: whether larger x is better (batch size) or smaller (memory).
        points: one row per plottable trial: ``number``, ``x``, ``y``, ``kind``
            (``"front"``, ``"dominated"`` or ``"failed"``), ``status``,
            ``baseline``, ``recommended``, ``predicted`` (x is a prediction).
        front: the front trials sorted by x (the line to draw).
        n_unplotted: trials with no x value (e.g. failed before a batch was chosen).
        screen: feasible trials of the simulated screening study (``number``,
            ``x``, ``y``; predicted figures), drawn for context; may be empty.
        screen_configs: how many configs that study simulated (as the search's summary line counts them).
    """

    x: str
    y: str
    x_label: str
    y_label: str
    maximize_x: bool
    points: pd.DataFrame
    front: pd.DataFrame
    n_unplotted: int
    screen: pd.DataFrame = field(default_factory=lambda: _empty_points())
    screen_configs: int = 0  # configs the screening study simulated (repeats not counted: the CLI's count)


def _empty_points() -> pd.DataFrame:
    return pd.DataFrame({"number": pd.Series(dtype=int), "x": pd.Series(dtype=float),
                         "y": pd.Series(dtype=float)})


_AXIS_LABELS = {"batch_size": "batch size", "peak_bytes": "peak device memory",
                "peak_device_bytes": "peak device memory", "throughput": "throughput (samples/s)"}


def pareto_front(df: pd.DataFrame, *, x: str, maximize_x: bool, x_label: str = "",
                 y: str = "throughput", y_label: str = "throughput (samples/s)",
                 baseline: int | None = None, recommended: int | None = None,
                 screen: pd.DataFrame | None = None) -> ParetoFront:
    """Front of feasible trials maximizing `y` and maximizing (or minimizing) `x`.

    Failed trials (any non-feasible one) are kept as ``kind="failed"`` with
    their y (often NaN: no throughput) so the plot can show them apart.
    `screen` (the trials of the simulated screening study that preceded
    measured runs) only adds context points; it never joins the front.
    """
    has_x = df[x].notna()
    plot = df[has_x]
    feasible = plot[plot["feasible"] & plot[y].notna()]
    mask = pareto_mask(feasible[[x, y]].to_numpy(), maximize=(maximize_x, True))
    front_numbers = set(feasible["number"][mask])
    feasible_numbers = set(feasible["number"])
    kind = plot["number"].map(lambda n: "front" if n in front_numbers
                              else "dominated" if n in feasible_numbers else "failed")
    predicted = plot["peak_is_predicted"] if x == "peak_bytes" else pd.Series(False, index=plot.index)
    points = pd.DataFrame({
        "number": plot["number"].astype(int), "x": plot[x].astype(float), "y": plot[y].astype(float),
        "kind": kind, "status": plot["status"], "baseline": plot["number"] == baseline,
        "recommended": plot["number"] == recommended, "predicted": predicted.astype(bool),
    }).reset_index(drop=True)
    front = points[points["kind"] == "front"].sort_values(["x", "y"], kind="stable").reset_index(drop=True)
    context = _empty_points()
    configs = int((~screen["duplicate"] & (screen["state"] == "complete")).sum()) if screen is not None else 0
    if screen is not None and not screen.empty:  # repeats of an evaluated config are not drawn twice
        ok = screen[screen["feasible"] & ~screen["duplicate"] & screen[x].notna() & screen[y].notna()]
        context = pd.DataFrame({"number": ok["number"].astype(int), "x": ok[x].astype(float),
                                "y": ok[y].astype(float)}).reset_index(drop=True)
    return ParetoFront(x=x, y=y, x_label=x_label or _AXIS_LABELS.get(x, x), y_label=y_label, maximize_x=maximize_x,
                       points=points, front=front, n_unplotted=int((~has_x).sum()), screen=context,
                       screen_configs=configs)


def _document_baseline(df: pd.DataFrame, recommendation: "Recommendation | None") -> int | None:
    """The baseline ``recommended.json`` compares with (its ``baseline.trial``), else `baseline_trial`."""
    doc = recommendation.document if recommendation is not None else {}
    number = (doc.get("baseline") or {}).get("trial") if isinstance(doc.get("baseline"), Mapping) else None
    if isinstance(number, int) and not isinstance(number, bool) and number in set(df["number"]):
        return number
    return baseline_trial(df)


# ---- the simulator against the measurements --------------------------------------------------------

def prediction_check(df: pd.DataFrame) -> pd.DataFrame:
    """Measured trials that also carry the simulator's prediction for the same config.

    Both figures are at each side's own largest fitting batch, so the comparison
    is of max batch (``batch_ratio`` = measured / predicted) and of throughput
    there (``throughput_ratio``). Columns: ``number``, ``predicted_batch``,
    ``batch_size``, ``batch_ratio``, ``predicted_throughput``, ``throughput``,
    ``throughput_ratio``.
    """
    ok = df[df["feasible"] & df["measured"] & (df["predicted_batch"] > 0)]
    out = pd.DataFrame({
        "number": ok["number"].astype(int), "predicted_batch": ok["predicted_batch"],
        "batch_size": ok["batch_size"], "batch_ratio": ok["batch_size"] / ok["predicted_batch"],
        "predicted_throughput": ok["predicted_throughput"], "throughput": ok["throughput"],
        "throughput_ratio": ok["throughput"] / ok["predicted_throughput"].where(ok["predicted_throughput"] > 0),
    })
    return out.reset_index(drop=True)


# ---- the table -------------------------------------------------------------------------------------

def trial_table(df: pd.DataFrame, *, recommended: int | None = None, baseline: int | None = None,
                fronts: Sequence[ParetoFront] = (), table: KnobTable = KNOB_TABLE) -> pd.DataFrame:
    """The full trial table as written to CSV: one row per trial, plain values.

    Adds ``recommended``, ``baseline`` and ``pareto_<x>`` columns (on that front).
    """
    out = df[["number", "state", "status", "feasible", "batch_size", "throughput", "peak_device_bytes",
              "predicted_peak_bytes", "predicted_throughput", "peak_source", "backend", "measured",
              *table.columns, "constraint", "reason"]].copy()
    out["params"] = df["params"].map(lambda p: ", ".join(f"{k}={v}" for k, v in sorted(p.items())))
    out["recommended"] = df["number"] == recommended
    out["baseline"] = df["number"] == baseline
    for front in fronts:
        out[f"pareto_{front.x}"] = df["number"].isin(set(front.front["number"]))
    return out


# ---- everything the page shows --------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class ReportData:
    """Everything the report shows, computed; `tuner.report.html` only lays it out.

    Attributes:
        study_name: as the user spelled it (escaped when rendered).
        generated: ISO timestamp of this report.
        environment: (label, value) header rows.
        measurement_note: how memory and throughput were measured or predicted.
        trials: `trials_frame` of the study.
        table: `trial_table` (also written as CSV).
        recommendation: the parsed ``recommended.json``, or None.
        recommendation_path: how the user's script should name that file.
        recommended_trial / baseline_trial: trial numbers, or None.
        budget_bytes: the memory budget, or None.
        fronts: (throughput vs batch, throughput vs peak memory).
        knobs: `KnobEffect` for n_tensors and lb.
        prediction: `prediction_check` (measured trials against the simulator).
        screen_name / screen_trials: the simulated screening study that came before
            measured runs (``<study>.simulated``) and its `trials_frame`, if any.
        timeline: the memory timeline (`tuner.report.timeline.Timeline`), or None.
        timeline_note: what the timeline shows, or why there is none.
        schedule: the recommended config's ordering (`tuner.report.schedule.ScheduleSummary`), or None
            (no recommendation or no traced graph).
        recompute: what recomputation bought the recommended config
            (`tuner.report.recompute.RecomputeSummary`), or None.
        recompute_note: why there is no `recompute` although the config recomputes ("" otherwise).
        knob_table: the knobs shown (`tuner.policy.knobs.KNOB_TABLE`: `LMSConfig`'s fields).
        peers: the peers measured on this workload and budget (`tuner.report.peers.Peers`), drawn on the
            Pareto plots when the report is asked for them (``--peers``), else None.
    """

    study_name: str
    generated: str
    environment: Sequence[tuple[str, str]]
    measurement_note: str
    trials: pd.DataFrame
    table: pd.DataFrame
    recommendation: Recommendation | None
    recommendation_path: str
    recommended_trial: int | None
    baseline_trial: int | None
    budget_bytes: int | None
    fronts: Sequence[ParetoFront]
    knobs: Sequence[KnobEffect]
    prediction: pd.DataFrame | None = None
    screen_name: str = ""
    screen_trials: pd.DataFrame | None = None
    timeline: Any = None
    timeline_note: str = ""
    knob_table: KnobTable = KNOB_TABLE
    schedule: Any = None
    recompute: Any = None
    recompute_note: str = ""
    peers: Any = None

    def row(self, number: int | None) -> Mapping[str, Any] | None:
        """The trials-frame row of trial `number` as a dict, or None."""
        if number is None:
            return None
        match = self.trials[self.trials["number"] == number]
        return None if match.empty else match.iloc[0].to_dict()


def report_data(study_name: str, trials: Iterable[Any], *, study_attrs: Mapping[str, Any],
                recommendation: Recommendation | None, recommendation_path: str, generated: str,
                timeline: Any = None, timeline_note: str = "", screen_name: str = "",
                screen_trials: Iterable[Any] | None = None, table: KnobTable = KNOB_TABLE) -> ReportData:
    """Compute every table and plot's data from a study's trials and recommendation.

    `screen_trials`: trials of the simulated screening study (``screen_name``)
    of a measured search, shown for context next to the measured ones.
    """
    confirmations = study_attrs.get("confirmations") if isinstance(study_attrs.get("confirmations"), Mapping) else None
    df = trials_frame(trials, table=table, confirmations=confirmations)
    screen = trials_frame(screen_trials, table=table) if screen_trials is not None else None
    rec_number = recommended_trial(df, recommendation)
    base_number = _document_baseline(df, recommendation)
    budget = recommendation.budget_bytes if recommendation is not None else None
    if budget is None:  # the study's own, from its settings record
        try:
            record = study_record(study_attrs)
        except ValueError:
            record = None
        if record is not None and record.budget_bytes and record.budget_bytes > 0:
            budget = record.budget_bytes
    fronts = (
        pareto_front(df, x="batch_size", maximize_x=True, baseline=base_number, recommended=rec_number,
                     screen=screen),
        pareto_front(df, x="peak_bytes", maximize_x=False, baseline=base_number, recommended=rec_number,
                     screen=screen),
    )
    knobs = knob_effects(df, screen=screen, table=table)
    env = environment_rows(study_attrs=study_attrs, recommendation=recommendation, df=df,
                           study_name=study_name)
    device = dict(env).get("device", "")
    return ReportData(
        study_name=study_name, generated=generated, environment=env,
        measurement_note=measurement_note(df, device=device), trials=df,
        table=trial_table(df, recommended=rec_number, baseline=base_number, fronts=fronts, table=table),
        recommendation=recommendation, recommendation_path=recommendation_path,
        recommended_trial=rec_number, baseline_trial=base_number, budget_bytes=budget,
        fronts=fronts, knobs=knobs, prediction=prediction_check(df), screen_name=screen_name,
        screen_trials=screen, timeline=timeline, timeline_note=timeline_note, knob_table=table)
