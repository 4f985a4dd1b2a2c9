"""What a search leaves behind: ``recommended.json`` and ``trials.csv``, both written atomically.

``recommended.json`` (schema ``"tuner.recommendation"``, version 1) holds the
chosen `LMSConfig` under ``"config"`` (so ``lms.LMSConfig.load(path)`` reads
it), the batch size, throughput and peak memory, the budget, the backend and
the environment. Every figure says where it comes from in ``"sources"``:

- ``simulate`` backend: *predicted* by the simulator (device profile named);
- ``emulated``: *measured* on the emulated device (CPU, TensorFlow's BFC allocator);
- ``gpu``: *measured* on the GPU.

Which Pareto point is recommended: `tuner.policy.selection.select_recommendation`.
The whole front is listed too, so another trade-off is one copy-paste away.
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from lms.config import LMSConfig, atomic_write_text
from lms.tuned import describe_conditions
from lms.jsonfile import finite_float, no_constant

from . import RECOMMENDATION_SCHEMA
from . import RECOMMENDATION_VERSION as SCHEMA_VERSION
from .backends import Backend, get_backend
from .budget import format_bytes
from .worker.programs import conditions
from .policy.bracket import CONFIRMATIONS_ATTR, confirmed_figures, start_origin
from .policy.knobs import KNOB_TABLE, KnobTable, swap_note
from .policy.records import corrections_warning
from .policy.selection import Confirmed, baseline_trial, feasible_trials, select_recommendation, throughput_peak_front

if TYPE_CHECKING:
    from .study.settings import SearchSettings

__all__ = [
    "RECOMMENDATION_SCHEMA", "SCHEMA_VERSION", "source_label", "build_recommendation", "trials_rows",
    "write_trials_csv", "write_outputs", "read_recommendation", "strict_json_loads", "format_recommendation",
]

log = logging.getLogger(__name__)



def source_label(backend: "str | Backend", *, measured: bool, device: str = "", device_name: str = "") -> str:
    """Where a figure comes from, in words (goes next to every number; `tuner.backends.Backend.source_label`)."""
    return get_backend(backend).source_label(measured=measured, device=device, device_name=device_name)


def _confirmation_line(conf: Mapping[str, Any]) -> str:
    """``batch 170 fitted in 2 fresh processes, 171 did not (the trial's 166, the simulator's 175; one batch per
    process: 175 no, 170 fits, 171 no, 170 fits)``."""
    hi = conf.get("smallest_failing")
    tried = ", ".join(f"{b} {v}" for b, v in conf.get("tried") or ())
    source = start_origin(conf)
    if conf.get("trial_batch") is None:  # the trial was these processes (the default)
        origin = f" (from {source} {conf['start']}" if conf.get("start") else " ("
    else:
        origin = (f" (the trial's {conf['trial_batch']}"
                  + (f", {source} {conf['start']}" if conf.get("start") else ""))
    return (f"batch {conf['batch_size']} fitted in {conf['fits']} fresh process{'es' if conf['fits'] != 1 else ''}"
            + (f", {hi} did not" if hi is not None else "")
            + origin + ("; " if origin != " (" else "") + f"one batch per process: {tried})"
            + ("" if conf.get("closed") else "; not finished (time limit): resume the search to finish it"))


def _figures(t: Any) -> dict[str, Any]:
    a = t.user_attrs
    if isinstance(t, Confirmed):  # the fresh processes' figures (see select_recommendation)
        return {"batch_size": int(t.values[0]), "throughput": t.values[1],
                "peak_device_bytes": a.get("peak_device_bytes"), "confirmed": True}
    return {"batch_size": int(a.get("batch_size") or 0), "throughput": float(a.get("throughput") or 0.0),
            "peak_device_bytes": a.get("peak_device_bytes")}


#: What recommended.json's ``confirmation`` holds of `tuner.backends.confirm.confirmed_figures` (plus ``runs`` and
#: ``rule`` for the recommendation itself).
_CONFIRMATION_KEYS = ("batch_size", "closed", "processes", "fits", "process", "trial_batch", "start", "start_from",
                      "smallest_failing", "tried", "unconfirmed")


def build_recommendation(*, study: str, chosen: Any, front: Sequence[Any], trials: Sequence[Any],
                         settings: "SearchSettings", budget_bytes: int, budget_source: str, usable_bytes: int,
                         environment: Mapping[str, Any], notes: Sequence[str] = (),
                         predicted_only_reason: str = "",
                         confirmations: Mapping[str, Any] | None = None, cut_short: str = "") -> dict[str, Any]:
    """The recommended.json document for `chosen` (a FrozenTrial with a trial record).

    Where `chosen` or the baseline was measured in fresh processes (`confirmations`, `tuner.backends.confirm`),
    their figures are the largest batch that fitted there, and ``confirmation`` lists the processes. A
    measured largest-batch search says whether the recommendation is confirmed (``confirmed``) and, when
    not, why (``unconfirmed``): `cut_short` (the time limit or an interruption came first: the finished
    search may recommend another config), a bracket not closed, or ``--confirm 0``.
    """
    a = chosen.user_attrs
    measured = bool(a.get("measured"))
    device_name = str(environment.get("device_name") or "")
    label = source_label(settings.backend, measured=measured, device=settings.device, device_name=device_name)
    predicted_label = source_label(settings.backend, measured=False, device=settings.device)
    config = LMSConfig.from_dict(a["config"])
    doc: dict[str, Any] = {
        "schema": RECOMMENDATION_SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "study": study,
        "model": settings.model,
        "model_options": dict(settings.model_options),
        "workload": dict(settings.workload),
        "config": config.to_dict(),
        "batch_size": int(a["batch_size"]),
        "throughput": float(a["throughput"]),
        "peak_device_bytes": a.get("peak_device_bytes"),
        "peak_source": a.get("peak_source"),
        "budget_bytes": int(budget_bytes),
        "usable_bytes": int(usable_bytes),
        "safety_margin": settings.safety_margin,
        "budget_source": budget_source,
        "backend": settings.backend,
        "measured": measured,
        "sources": {"batch_size": label, "throughput": label, "peak_device_bytes": label,
                    "predicted": predicted_label},
        "predicted": {"batch_size": a.get("predicted_batch"), "throughput": a.get("predicted_throughput"),
                      "peak_device_bytes": a.get("predicted_peak_bytes"), "device_profile": settings.device},
        "trial": chosen.number,
        "goal": settings.goal.describe(),
        "tuned_for": {"batch_size": int(a["batch_size"])},
        "selection": {"prefer": settings.prefer, "min_throughput_ratio": settings.min_throughput_ratio,
                      "rule": settings.goal.rule(prefer=settings.prefer,
                                                 min_throughput_ratio=settings.min_throughput_ratio)},
        "environment": {**dict(environment),
                        **({"worker_tensorflow": a["tensorflow"]} if a.get("tensorflow") else {}),
                        **({"worker_device": a["device"]} if a.get("device") else {})},
        "storage": settings.storage.display,
        "notes": list(notes),
    }
    if measured:  # where the peak holds: the program, batch dimension, executor and pins it was measured under
        doc["measured_under"] = conditions(settings.workload, get_backend(settings.backend), a.get("lms_summary"))
    from .host import add_host_fields

    add_host_fields(doc, a, settings, label=label, predicted_label=predicted_label)
    if measured and "step_time_median_s" in a:
        doc["step_time_s"] = {"median": a.get("step_time_median_s"), "spread": a.get("step_time_spread_s"),
                              "timed_steps": settings.steps, "warmup_steps": settings.warmup}
        for key in ("host_peak_rss_bytes", "nvml_process_peak_bytes", "nvml_device_peak_bytes"):
            if a.get(key) is not None:
                doc[key] = a[key]
    if predicted_only_reason:
        doc["notes"].append(predicted_only_reason)
    summary = a.get("lms_summary") or {}
    warning = corrections_warning(summary)
    if warning:  # the config's name says more than ran (lms.tf.equivalence)
        doc["plan_corrections"] = {"warning": warning, **{k: summary[k] for k in (
            "n_corrections", "corrections_by_kind", "corrections", "n_swapped", "n_recomputed") if k in summary}}
    confirmed = confirmed_figures(chosen, confirmations)
    if confirmed is not None:
        doc.update({k: confirmed[k] for k in ("batch_size", "throughput", "peak_device_bytes")})
        doc["tuned_for"] = {"batch_size": confirmed["batch_size"]}
        if "step_time_s" in doc and confirmed["step_time_median_s"] is not None:
            doc["step_time_s"] = {**doc["step_time_s"], "median": confirmed["step_time_median_s"], "spread": None}
        doc["confirmation"] = {k: confirmed[k] for k in _CONFIRMATION_KEYS + ("runs", "rule")}
    base = baseline_trial(trials)
    base_confirmed = confirmed_figures(base, confirmations) if base is not None else None
    if measured and settings.batch is None and get_backend(settings.backend).measured:
        why = _unconfirmed(settings, confirmed, base_confirmed,
                           cut_short=cut_short,
                           has_baseline=base is not None and base.user_attrs.get("status") == "ok")
        doc["confirmed"] = not why
        if why:
            doc["unconfirmed"] = why
    if base is not None and base.user_attrs.get("status") == "ok":
        b = _figures(base)
        if base_confirmed is not None:
            b = {k: base_confirmed[k] for k in ("batch_size", "throughput", "peak_device_bytes")}
            b["confirmation"] = {k: base_confirmed[k] for k in _CONFIRMATION_KEYS}
        doc["baseline"] = {**b, "source": source_label(settings.backend, measured=bool(base.user_attrs.get("measured")),
                                                        device=settings.device, device_name=device_name),
                           "trial": base.number}
        if b["batch_size"] and b["throughput"]:
            doc["gain_vs_baseline"] = {"batch_size_ratio": round(doc["batch_size"] / b["batch_size"], 3),
                                       "throughput_ratio": round(doc["throughput"] / b["throughput"], 3)}
    if settings.batch is not None:
        doc["at_batch"] = [
            {"trial": t.number, "config": t.user_attrs["config"], **_figures(t),
             "measured": bool(t.user_attrs.get("measured"))}
            for t in throughput_peak_front(feasible_trials(trials))]
    doc["pareto_front"] = [
        {"trial": t.number, "config": t.user_attrs["config"], **_figures(t), "measured": bool(t.user_attrs.get("measured")),
         "source": source_label(settings.backend, measured=bool(t.user_attrs.get("measured")),
                                device=settings.device, device_name=device_name)}
        for t in front]
    return doc


def _unconfirmed(settings: "SearchSettings", chosen: Mapping[str, Any] | None, base: Mapping[str, Any] | None, *,
                 cut_short: str, has_baseline: bool) -> str:
    """Why a measured recommendation is not confirmed ("" when it is; see `build_recommendation`)."""
    if settings.confirm <= 0:
        return "--confirm 0: measured in one process that searched in-process, not in fresh processes"
    if cut_short:
        return cut_short
    for name, conf in (("recommended config", chosen), ("no-LMS baseline", base if has_baseline else {})):
        if conf is None:
            return f"the {name} was not measured in fresh processes"
        if conf and not (conf.get("closed") and conf.get("fits", 0) >= settings.confirm):
            return (f"the {name}'s fresh-process bracket is not finished (batch {conf['batch_size']} fitted in "
                    f"{conf['fits']} of the {settings.confirm} processes --confirm asks)")
    return ""


def read_recommendation(path: Path) -> dict[str, Any]:
    """Load a recommended.json and check it: strict JSON, its schema, and the figures it states.

    Strict: no ``NaN``/``Infinity``, no number too large for a float (``1e400``), no key given
    twice, no nesting too deep. The figures `format_recommendation` prints must have their types
    and ranges (a batch size an integer >= 1, a throughput a finite number >= 0, ...).

    Raises:
        ValueError: one line naming the file and what is wrong (`OSError` when it cannot be read).
    """
    path = Path(path)
    try:
        doc = strict_json_loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != RECOMMENDATION_SCHEMA:
        raise ValueError(f"{path}: not a tuner recommendation (schema {doc.get('schema') if isinstance(doc, dict) else None!r})")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {doc.get('schema_version')!r}; this version reads {SCHEMA_VERSION}")
    try:
        LMSConfig.from_dict(doc.get("config"))  # type: ignore[arg-type]
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: key 'config': {exc}") from None
    for key, check, allowed in _RECOMMENDATION_FIELDS:
        if not check(doc.get(key)):
            raise ValueError(f"{path}: key {key!r}={_shown(doc.get(key))}: expected {allowed}")
    sources = doc["sources"]
    for key in ("batch_size", "throughput", "peak_device_bytes"):
        if not isinstance(sources.get(key), str):
            raise ValueError(f"{path}: key 'sources.{key}'={_shown(sources.get(key))}: expected a string")
    return doc


def strict_json_loads(text: str) -> Any:
    """`json.loads` refusing what is not plain JSON data: NaN, infinities, duplicate keys, deep nesting (ValueError)."""
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise ValueError(f"key {key!r} given twice")
            out[key] = value
        return out

    try:
        return json.loads(text, parse_constant=no_constant, parse_float=finite_float, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:30] + "..."


def _count(minimum: int) -> Any:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= minimum


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf") and v >= 0


#: The figures recommended.json must state, each with its check and what is allowed.
_RECOMMENDATION_FIELDS: tuple[tuple[str, Any, str], ...] = (
    ("study", lambda v: isinstance(v, str) and v != "", "a study name"),
    ("model", lambda v: isinstance(v, str), "a string"),
    ("backend", lambda v: isinstance(v, str), "a string"),
    ("batch_size", _count(1), "an integer >= 1"),
    ("throughput", _finite, "a finite number >= 0"),
    ("budget_bytes", _count(0), "an integer >= 0"),
    ("usable_bytes", lambda v: v is None or _count(0)(v), "an integer >= 0"),
    ("peak_device_bytes", lambda v: v is None or _count(0)(v), "an integer >= 0 or null"),
    ("sources", lambda v: isinstance(v, dict), "an object"),
    ("measured", lambda v: v is None or isinstance(v, bool), "true or false"),
    ("model_options", lambda v: v is None or isinstance(v, dict), "an object"),
    ("tuned_for", lambda v: v is None or isinstance(v, dict), "an object"),
    ("notes", lambda v: v is None or (isinstance(v, list) and all(isinstance(n, str) for n in v)), "a list of strings"),
)


def format_recommendation(doc: Mapping[str, Any]) -> str:
    """Human-readable summary; every figure carries its source."""
    cfg = doc["config"]
    knobs = " ".join(f"{k}={cfg[k]}" for k in KNOB_TABLE.columns if k in cfg)
    src = doc["sources"]["batch_size"]
    options = " ".join(f"{k}={v}" for k, v in (doc.get("model_options") or {}).items())
    lines = [
        f"study {doc['study']}: model {doc['model']}{' (' + options + ')' if options else ''}, "
        f"backend {doc['backend']}, budget {format_bytes(doc['budget_bytes'])} "
        f"(usable {format_bytes(doc.get('usable_bytes'))})",
        *([f"  budget: {doc['budget_source']}"] if doc.get("budget_source") not in (None, "", "--budget") else []),
        f"recommended LMS config: {knobs}" + (f"  ({note})" if (note := swap_note(cfg)) else ""),
        *([f"  tuned for    " + ", ".join(f"{k}={v}" for k, v in doc["tuned_for"].items())
           + ("  (fixed by --batch: the fastest config that fits)" if (doc.get("goal") or {}).get("batch") else "")]
          if doc.get("tuned_for") else []),
        *([f"  measured under {describe_conditions(doc['measured_under'])}"] if doc.get("measured_under") else []),
        f"  batch size   {doc['batch_size']:<12d} {src}",
        f"  throughput   {doc['throughput']:<12.1f} samples/s, {doc['sources']['throughput']}",
        f"  peak memory  {format_bytes(doc.get('peak_device_bytes')):<12} {doc['sources']['peak_device_bytes']}",
    ]
    from .host import host_lines

    lines += host_lines(doc)
    conf = doc.get("confirmation")
    if conf:
        lines.append(f"  processes    {_confirmation_line(conf)}")
        for miss in conf.get("unconfirmed") or ():
            lines.append(f"    process {miss['process']} (batch {miss['batch']}): {miss['status']} "
                         f"{miss.get('reason') or ''}".rstrip())
    if doc.get("unconfirmed"):
        lines.append(f"  NOT CONFIRMED: {doc['unconfirmed']}")
    corrected = doc.get("plan_corrections")
    if isinstance(corrected, dict) and corrected.get("warning"):
        lines.append(f"  WARNING: {corrected['warning']}")
    pred = doc.get("predicted") or {}
    if doc.get("measured") and pred.get("batch_size") is not None:
        thr = pred.get("throughput")
        lines.append(f"  simulator    batch {pred['batch_size']}, peak {format_bytes(pred.get('peak_device_bytes'))}"
                     + (f", {thr:.1f} samples/s" if thr else "") + f"  {doc['sources']['predicted']}")
    base = doc.get("baseline")
    if base:
        gain = doc.get("gain_vs_baseline") or {}
        lines.append(f"  no-LMS baseline: batch {base['batch_size']}, {base['throughput']:.1f} samples/s, peak "
                     f"{format_bytes(base.get('peak_device_bytes'))}  {base['source']}"
                     + (f"  -> batch x{gain['batch_size_ratio']:.2f}, throughput x{gain['throughput_ratio']:.2f}"
                        if gain else ""))
    at_batch = doc.get("at_batch") or []
    if at_batch:
        lines.append(f"  at batch {doc['batch_size']}, throughput vs peak (fastest first): "
                     + ", ".join(f"({p['throughput']:.1f}/s, {format_bytes(p.get('peak_device_bytes'))})"
                                 for p in at_batch))
    front = doc.get("pareto_front") or []
    if len(front) > 1 and not at_batch:
        lines.append("  Pareto front (batch, samples/s): "
                     + ", ".join(f"({p['batch_size']}, {p['throughput']:.1f})" for p in front))
    for note in doc.get("notes") or ():
        lines.append(f"  note: {note}")
    return "\n".join(lines)


# ---------------------------------------------------------------- trials.csv

def trials_rows(study: Any, *, label: str, table: KnobTable = KNOB_TABLE) -> list[dict[str, Any]]:
    """One dict per trial: the trial-record columns, the knobs (`table`'s columns), timing and provenance.

    A trial measured in fresh processes (`tuner.backends.confirm`) shows the figures the recommendation uses
    (`confirmed_figures`: the bracket's batch, its fastest process's throughput, the highest peak), as
    recommended.json, ``tuner best`` and the report do; ``trial_batch_size`` / ``trial_throughput`` keep
    the trial's own record and ``fresh_processes`` counts the processes.
    """
    rows = []
    confirmations = study.user_attrs.get(CONFIRMATIONS_ATTR)
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        cfg = a.get("config") or {}
        duration = (t.datetime_complete - t.datetime_start).total_seconds() \
            if t.datetime_complete and t.datetime_start else None
        measured = bool(a.get("measured"))
        row = {
            "study": label, "number": t.number, "state": t.state.name.lower(), "status": a.get("status"),
            "backend": a.get("backend"), "measured": measured,
            "figures": "measured" if measured else ("predicted" if a.get("backend") else ""),
            "batch_size": a.get("batch_size"), "throughput": a.get("throughput"),
            "peak_device_bytes": a.get("peak_device_bytes"), "peak_source": a.get("peak_source"),
            "peak_host_bytes": a.get("host_copies_peak_bytes") if measured else a.get("peak_host_bytes"),
            "predicted_batch": a.get("predicted_batch"), "predicted_peak_bytes": a.get("predicted_peak_bytes"),
            "predicted_throughput": a.get("predicted_throughput"),
            "constraint": (a.get("constraint") or [None])[0], "reason": a.get("reason", ""),
        }
        summary = a.get("lms_summary") or {}  # a measured trial: what ran (the equivalence check may cut the plan)
        row["n_swapped"] = summary.get("n_swapped") if summary else a.get("n_swapped")
        row["n_corrections"] = int(summary.get("n_corrections") or 0) if summary else None
        for k in table.columns:
            row[k] = cfg.get(k, t.params.get(k))
        row["config"] = json.dumps(cfg, sort_keys=True) if cfg else ""
        for k in ("step_time_median_s", "step_time_spread_s", "host_peak_rss_bytes", "nvml_process_peak_bytes",
                  "nvml_device_peak_bytes", "duplicate_of", "warm_start", "from_screen", "retry_of",
                  "skipped_by_simulator", "trial_dir"):
            row[k] = a.get(k)
        row["datetime_start"] = t.datetime_start.isoformat() if t.datetime_start else None
        row["duration_s"] = duration
        figures = confirmed_figures(t, confirmations) if confirmations and a.get("status") == "ok" else None
        row.update(trial_batch_size=a.get("batch_size"), trial_throughput=a.get("throughput"),
                   fresh_processes=figures["processes"] if figures is not None else None)
        if figures is not None:
            row.update({k: figures[k] for k in ("batch_size", "throughput", "peak_device_bytes")})
        rows.append(row)
    return rows


def write_trials_csv(path: Path, studies: Sequence[tuple[str, Any]], *, table: KnobTable = KNOB_TABLE) -> Path:
    """trials.csv (pandas) of the main study and, after it, the screening study."""
    import pandas as pd

    rows = [r for label, study in studies for r in trials_rows(study, label=label, table=table)]
    frame = pd.DataFrame(rows)
    buf = io.StringIO()
    frame.to_csv(buf, index=False)
    return atomic_write_text(path, buf.getvalue())


def write_outputs(study_dir: Path, *, main: Any, screen: Any | None, settings: "SearchSettings",
                  budget_bytes: int, budget_source: str, usable_bytes: int, environment: Mapping[str, Any],
                  notes: Sequence[str] = (), measure_advice: str = "rerun the search to measure",
                  cut_short: str = "") -> tuple[dict[str, Any] | None, Path | None, Path]:
    """Write trials.csv always, recommended.json when some config is feasible.

    With no feasible measured config, the screening study's predicted pick is
    written, labelled PREDICTED, with `measure_advice` (a command that measures).
    """
    studies: list[tuple[str, Any]] = [(main.study_name, main)]
    if screen is not None:
        studies.append((screen.study_name, screen))
    csv_path = write_trials_csv(study_dir / "trials.csv", studies)
    trials = main.get_trials(deepcopy=False)
    chosen, front = select_recommendation(trials, prefer=settings.prefer,
                                          min_throughput_ratio=settings.min_throughput_ratio,
                                          confirmations=main.user_attrs.get(CONFIRMATIONS_ATTR))
    fallback = ""
    if chosen is None and screen is not None:
        trials = screen.get_trials(deepcopy=False)
        chosen, front = select_recommendation(trials, prefer=settings.prefer,
                                              min_throughput_ratio=settings.min_throughput_ratio)
        if chosen is not None:
            fallback = ("no config was confirmed by a real run yet: these figures are PREDICTED by the "
                        f"simulator; {measure_advice}")
    if chosen is None:
        # at a fixed batch (and each value of --grow) nothing fitting is an answer, said by the caller
        (log.info if settings.batch is not None else log.warning)(
            "no feasible config yet: recommended.json not written")
        return None, None, csv_path
    doc = build_recommendation(study=main.study_name, chosen=chosen, front=front, trials=trials, settings=settings,
                               budget_bytes=budget_bytes, budget_source=budget_source, usable_bytes=usable_bytes,
                               environment=environment, notes=notes, predicted_only_reason=fallback,
                               confirmations=None if fallback else main.user_attrs.get(CONFIRMATIONS_ATTR),
                               cut_short=cut_short)
    rec_path = atomic_write_text(study_dir / "recommended.json",
                                 json.dumps(doc, indent=2, default=str, allow_nan=False) + "\n")
    LMSConfig.load(rec_path)  # what a training script does: it must read back
    return doc, rec_path, csv_path
