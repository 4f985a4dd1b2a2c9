"""HTML report of a tuning study: the memory / throughput trade-off and the recommendation.

`build_report` writes ``reports/<study>/index.html`` (one self-contained file:
images embedded, no network requests) and beside it ``trials.csv`` and each
figure as PNG and SVG. The work is split the house way:

    study + recommended.json --data.py--> ReportData --plots.py--> figures --html.py--> index.html

    provenance.py     what recommended.json says (`Recommendation`), the environment rows, how figures were got
    knob_effects.py   how batch, throughput and peak move with each knob's values
    data.py           everything the page shows, computed from the trials (`ReportData`, the Pareto fronts)
    timeline.py       device memory over one step, no LMS against the recommended config (simulated)
    schedule.py       which order the recommended config runs the ops in, and the candidates scored
    recompute.py      what recomputation bought the recommended config (PREDICTED, and a measured pair)
    peers.py          remat's, per-stage recompute's and Grappler's points from benchmarks/peers.py (``--peers``)
    plots.py          the figures (the only matplotlib code)
    markup.py         HTML pieces: escaping, numbers, tables, images
    card.py           the recommendation's card at the top of the page
    html.py           the page, laid out from `ReportData` and the rendered figures

Only `tuner.report.plots` imports matplotlib, and only when a report is built.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from lms.config import atomic_write_bytes, atomic_write_text

from ..study.study import SCREEN_SUFFIX, screens_for  # the simulated screening before measured runs
from .data import Recommendation, ReportData, report_data

__all__ = ["build_report", "report_folder_name", "study_peers", "ReportData", "Recommendation"]

log = logging.getLogger(__name__)

RECOMMENDED_JSON = "recommended.json"
# Every figure the report may write, by key: (file stem, alt text).
FIGURES = {
    "pareto_batch": ("pareto_batch", "Throughput against batch size, Pareto front highlighted"),
    "pareto_memory": ("pareto_memory", "Throughput against peak device memory, Pareto front highlighted"),
    "timeline": ("timeline", "Device memory over one training step, no LMS versus the recommended config"),
    "knobs": ("knobs", "Batch size, throughput and peak memory against n_tensors and lb"),
}


def build_report(study_name: str, *, storage: str | None = None, studies_dir: str | os.PathLike[str] = "studies",
                 reports_dir: str | os.PathLike[str] = "reports",
                 out_dir: str | os.PathLike[str] | None = None, peers: str | os.PathLike[str] | None = None) -> Path:
    """Write the report of `study_name`; return the path of its ``index.html``.

    Args:
        study_name: the Optuna study.
        storage: an Optuna storage URL (``sqlite:///...``, ``journal:...``, ...);
            default: ``<studies_dir>/<study>/study.db``.
        studies_dir: where the tuner keeps ``<study>/recommended.json`` and ``<study>/graph.json``.
        reports_dir: the report goes to ``<reports_dir>/<study>/``.
        out_dir: write into this folder instead (``--out``).
        peers: a `benchmarks/peers.py` JSON file measured on this study's workload and budget: its peers'
            points are drawn on the Pareto plots (`tuner.report.peers`).

    Raises:
        FileNotFoundError: the default study database does not exist.
        KeyError: the storage has no study of that name.
        tuner.report.peers.PeersMismatch: `peers` cannot be drawn on this study (nothing is written).
    """
    if not isinstance(study_name, str):
        raise TypeError(f"build_report(study_name=...) takes the study's name as a str, got "
                        f"{type(study_name).__name__} {study_name!r}; pass studies_dir= for the folder")
    study, opened = _load_study(study_name, storage=storage, studies_dir=Path(studies_dir))
    study_dir = Path(studies_dir) / report_folder_name(study_name)
    recommendation = _load_recommendation(study_dir / RECOMMENDED_JSON)
    trials = study.get_trials(deepcopy=False)
    attrs = dict(study.user_attrs)
    rec_path = (Path(studies_dir) / report_folder_name(study_name) / RECOMMENDED_JSON).as_posix()
    generated = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()

    screen = _screening_study(study, opened)
    data = report_data(study_name, trials, study_attrs=attrs, recommendation=recommendation,
                       recommendation_path=rec_path, generated=generated,
                       screen_name=screen.study_name if screen is not None else "",
                       screen_trials=screen.get_trials(deepcopy=False) if screen is not None else None)
    traced = _traced_graph(study_dir, attrs)
    timeline, note = _timeline(data, study_dir=study_dir, study_attrs=attrs, trials=trials, traced=traced)
    data = _with_timeline(data, timeline, note)
    data = _with_schedule_and_recompute(data, traced=traced, study_attrs=attrs)
    if peers is not None:
        data = replace(data, peers=study_peers(peers, recommendation))
    target = Path(out_dir) if out_dir is not None else Path(reports_dir) / report_folder_name(study_name)
    return write_report(data, target)


def write_report(data: ReportData, out_dir: Path) -> Path:
    """Draw the figures of `data` and write the page, the CSV and the figure files into `out_dir`."""
    from . import plots
    from .html import Image, render_html

    out_dir.mkdir(parents=True, exist_ok=True)
    peers = data.peers.points if data.peers is not None else ()
    figures: dict[str, Any] = {
        "pareto_batch": plots.plot_pareto(data.fronts[0], peers=peers),
        "pareto_memory": plots.plot_pareto(data.fronts[1], budget_bytes=data.budget_bytes, x_in_bytes=True,
                                           peers=peers),
        "knobs": plots.plot_knobs(data.knobs, budget_bytes=data.budget_bytes),
    }
    if data.timeline is not None:
        figures["timeline"] = plots.plot_timeline(data.timeline, budget_bytes=data.budget_bytes)
    images: dict[str, Image] = {}
    written: list[str] = []
    for key, fig in figures.items():
        stem, alt = FIGURES[key]
        rendered = plots.render(fig)
        atomic_write_bytes(out_dir / f"{stem}.png", rendered.png)
        atomic_write_bytes(out_dir / f"{stem}.svg", rendered.svg)
        names = (f"{stem}.png", f"{stem}.svg")
        written += names
        images[key] = Image(key=key, png=rendered.png, alt=alt, files=names, width_px=rendered.width_px,
                            height_px=rendered.height_px)
    for key, (stem, _) in FIGURES.items():  # a figure this report did not draw must not linger
        if key not in figures:
            for suffix in (".png", ".svg"):
                (out_dir / f"{stem}{suffix}").unlink(missing_ok=True)
    csv = _csv_frame(data).to_csv(index=False)
    atomic_write_text(out_dir / "trials.csv", csv)
    files = ["trials.csv", *written]
    index = out_dir / "index.html"
    atomic_write_text(index, render_html(data, images, files=files))
    log.debug("report written to %s", index)
    return index


def report_folder_name(study_name: str) -> str:
    """The study's folder name: the name itself when it is a plain folder name (as the tuner
    requires), else a safe slug plus a short hash, so any study in a shared storage gets a report."""
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", study_name) and ".." not in study_name:
        return study_name
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", study_name).strip("._-")[:60] or "study"
    return f"{slug}-{hashlib.sha256(study_name.encode('utf-8')).hexdigest()[:8]}"


# ---- inputs ---------------------------------------------------------------------------------------

def _load_study(study_name: str, *, storage: str | None, studies_dir: Path) -> tuple[Any, Any]:
    """(the study, the opened storage it lives in)."""
    import optuna

    from tuner.study.storage import open_storage, resolve_storage

    spec = resolve_storage(storage, report_folder_name(study_name) if storage is None else study_name,
                           studies_dir=studies_dir)
    if not spec.exists():
        raise FileNotFoundError(f"no study database at {spec.path}: run `python -m tuner search --study "
                                f"{study_name}` first, or pass --storage")
    opened = open_storage(spec, read_only=True)  # a report changes nothing in the study (a read-only folder works)
    names = optuna.study.get_all_study_names(storage=opened)
    if study_name not in names:
        shown = ", ".join(repr(n) for n in names[:10]) or "none"
        raise KeyError(f"storage {spec.display} has no study {study_name!r} (studies: {shown})")
    return optuna.load_study(study_name=study_name, storage=opened), opened




def _screening_study(study: Any, storage: Any) -> Any | None:
    """The screening study ``<study>.simulated`` in the same storage, if the search made one."""
    import optuna

    name = study.study_name + SCREEN_SUFFIX
    if study.user_attrs.get("role") == "screen" or name not in optuna.study.get_all_study_names(storage=storage):
        return None
    screen = optuna.load_study(study_name=name, storage=storage)
    if not screens_for(screen, study.study_name):  # another study of that name: its trials are not read
        log.warning("study %r is not the screening study of study %r (lms-tuner did not make it so); the report "
                    "leaves it out", name, study.study_name)
        return None
    return screen


def study_peers(path: str | os.PathLike[str], recommendation: Recommendation | None) -> Any:
    """The peers of `path` measured for this study (its workload, options, budget and margin, as its
    recommendation records them); `tuner.report.peers.PeersMismatch` otherwise."""
    from .peers import PeersMismatch, load_peers

    if recommendation is None:
        raise PeersMismatch("the study has no valid recommended.json to say its workload and budget")
    doc = recommendation.document
    workload = doc.get("workload") if isinstance(doc.get("workload"), Mapping) else {}
    options = {**(workload.get("options") or {}), **(doc.get("model_options") or {})}
    return load_peers(path, workload=str(doc.get("model") or workload.get("name") or ""), options=options,
                      budget_bytes=recommendation.budget_bytes, safety_margin=doc.get("safety_margin"))


def _load_recommendation(path: Path) -> Recommendation | None:
    if not path.is_file():
        log.info("no %s: the report will say there is no recommendation", path)
        return None
    from tuner.outputs import read_recommendation

    try:  # checked strictly first (no NaN, no 1e400, no deep nesting, the figures' types and ranges)
        return Recommendation.from_document(read_recommendation(path))
    except (ValueError, KeyError, TypeError, OSError) as exc:
        log.warning("%s is not a valid recommendation (%s); reporting without it", path, exc)
        return None


@dataclass(frozen=True)
class _Traced:
    """The traced graph beside the study: the graph, its file, or why there is none."""

    graph: Any = None
    path: Path | None = None
    error: str = ""


def _traced_graph(study_dir: Path, study_attrs: Mapping[str, Any]) -> _Traced:
    """Load the graph the search cached (`_graph_file`), once for every section that simulates it."""
    path = _graph_file(study_dir, study_attrs)
    if path is None:
        return _Traced()
    try:
        from lms.graph import Graph

        doc = json.loads(path.read_text(encoding="utf-8"))
        return _Traced(graph=Graph.from_dict(doc["graph"] if "graph" in doc else doc), path=path)
    except Exception as exc:  # a broken cache must not cost the whole report
        log.warning("could not load the traced graph %s: %s", path, exc)
        return _Traced(path=path, error=f"{type(exc).__name__}: {exc}")


def _timeline(data: ReportData, *, study_dir: Path, study_attrs: Mapping[str, Any],
              trials: Any = (), traced: _Traced | None = None) -> tuple[Any, str]:
    """(Timeline or None, caption / reason) for the recommended config versus no LMS.

    The caption names the order the recommended curve runs in (`tuner.report.schedule`).
    """
    from .schedule import schedule_summary
    from .timeline import Timeline, load_measured_series, simulated_timeline

    rec = data.recommendation
    if rec is None:
        return None, "No recommendation, so no timeline to compare."
    series: list[Any] = []
    notes: list[str] = []
    traced = _traced_graph(study_dir, study_attrs) if traced is None else traced
    graph_path = traced.path
    if traced.error:
        notes.append(f"The simulated timeline could not be computed ({traced.error}).")
    elif traced.graph is not None:
        try:
            from lms.config import LMSConfig

            graph = traced.graph
            device = _simulator_device(study_attrs, rec)
            config = LMSConfig.from_dict(rec.config)
            compared = [("no LMS", LMSConfig(n_tensors=0)), ("recommended", config)]
            off = config.off
            if off:  # the recommendation is no LMS: one curve says it all
                compared = [("recommended (no LMS)", config)]
            tl = simulated_timeline(graph, compared, batch=rec.batch_size, device=device)
            series += tl.series
            where = f" on the {device} profile" if device else " (no device profile: memory order only)"
            what = "the recommended config swaps nothing (LMS off)" if off else "both configs"
            notes.append(f"Simulated{where} with lms.simulator from the traced graph ({graph_path.name}), "
                         f"{what} at the recommended batch size {rec.batch_size}.")
            simulated = tl.series[-1].peak_bytes if tl.series else 0
            if rec.measured and rec.peak_device_bytes and simulated:
                from ..budget import format_bytes

                notes.append(
                    f"The simulated curves count the bytes tensors hold (live bytes: within about 1.3% of the "
                    f"measured live bytes of a pinned step); the recommendation's measured peak, "
                    f"{format_bytes(rec.peak_device_bytes)}, is TensorFlow's allocator's, which also holds its "
                    f"rounding and unsplit chunks: {rec.peak_device_bytes / simulated - 1:+.0%} against the "
                    f"simulated {format_bytes(simulated)} here (the search predicts batches with that allocator "
                    "replayed).")
            notes.append(schedule_summary(graph, config, device=device).sentence)
        except Exception as exc:  # a broken cache must not cost the whole report
            log.warning("could not simulate the timeline from %s: %s", graph_path, exc)
            notes.append(f"The simulated timeline could not be computed ({type(exc).__name__}: {exc}).")
    else:
        notes.append("No traced graph was found beside the study, so there is no simulated timeline.")
    by_number = {t.number: t for t in trials}
    for label, number in (("no LMS", data.baseline_trial), ("recommended", data.recommended_trial)):
        trace = _measured_trace(study_dir, by_number.get(number), number)
        if trace is not None:
            try:
                series.append(load_measured_series(trace, label=f"{label}, trial #{number}"))
                notes.append(f"Measured: trial #{number} ({trace}).")
            except ValueError as exc:
                log.warning("%s", exc)
    if not series:
        return None, " ".join(notes)
    notes.append("Curves: device bytes in use (the dot marks each peak); dotted line: end of the forward "
                 "pass; strips: swap-out (device to host) and swap-in (host to device) copies.")
    return Timeline(series=tuple(series)), " ".join(notes)


MEASURED_TIMELINE = "timeline.json"


def _measured_trace(study_dir: Path, trial: Any, number: int | None) -> Path | None:
    """A measured step of trial `number`: ``<trial_dir>/timeline.json`` (``Timeline.to_dict()`` format
    plus ``batch_size``), the trial dir being the record's ``trial_dir`` or ``<study>/trials/<NNNN>``."""
    if number is None:
        return None
    folders = []
    if trial is not None and isinstance(trial.user_attrs.get("trial_dir"), str):
        folders.append(Path(trial.user_attrs["trial_dir"]))
    folders.append(study_dir / "trials" / f"{number:04d}")
    for folder in folders:
        if (folder / MEASURED_TIMELINE).is_file():
            return folder / MEASURED_TIMELINE
    return None


def _graph_file(study_dir: Path, study_attrs: Mapping[str, Any]) -> Path | None:
    """The traced graph the search cached (``tuner.graph`` JSON), if any."""
    named = study_attrs.get("graph_file") or study_attrs.get("graph_path")
    if isinstance(named, str):
        path = Path(named) if Path(named).is_absolute() else study_dir / named
        if path.is_file():
            return path
    candidates = sorted(study_dir.glob("graph*.json")) + sorted(study_dir.glob("*.graph.json"))
    return candidates[0] if candidates else None


def _simulator_device(study_attrs: Mapping[str, Any], rec: Recommendation) -> str | None:
    """The simulator's device profile the search used: its settings record's ``device``
    (`tuner.study.record.StudyRecord`), else the profile recommended.json's prediction names; None when
    neither names a known profile."""
    from lms.machine.devices import get_device

    from ..study.study import study_record

    try:
        record = study_record(study_attrs)
    except ValueError:
        record = None
    predicted = rec.document.get("predicted") if isinstance(rec.document.get("predicted"), Mapping) else {}
    for name in (record.device if record is not None else None, predicted.get("device_profile")):
        if isinstance(name, str) and name:
            try:
                return get_device(name).name
            except (KeyError, ValueError):  # not a profile
                continue
    return None


def _with_schedule_and_recompute(data: ReportData, *, traced: _Traced, study_attrs: Mapping[str, Any]) -> ReportData:
    """`data` with the recommended config's ordering and, when it recomputes, what that bought."""
    import dataclasses

    from lms.config import LMSConfig

    from .schedule import schedule_summary

    rec = data.recommendation
    if rec is None:
        return data
    try:
        config = LMSConfig.from_dict(rec.config)
    except (TypeError, ValueError) as exc:
        log.warning("the recommended config is not an LMSConfig (%s): no schedule or recompute section", exc)
        return data
    recomputes = config.recompute != "none"
    if traced.graph is None:
        why = (f"the traced graph could not be loaded ({traced.error})" if traced.error
               else "no traced graph was found beside the study")
        return dataclasses.replace(data, recompute_note=(f"Recomputed tensors are not listed: {why}."
                                                         if recomputes else ""))
    schedule = recompute = None
    note = ""
    try:
        schedule = schedule_summary(traced.graph, config, device=_simulator_device(study_attrs, rec))
    except Exception as exc:  # a graph the scheduler cannot order must not cost the whole report
        log.warning("could not summarise the schedule: %s", exc)
    if recomputes:
        from .recompute import recompute_summary

        try:
            recompute = recompute_summary(traced.graph, config, batch=rec.batch_size,
                                          device=_simulator_device(study_attrs, rec), trials=data.trials,
                                          prefer_trial=data.recommended_trial)
        except Exception as exc:
            log.warning("could not simulate recomputation: %s", exc)
            note = f"Recomputation could not be simulated ({type(exc).__name__}: {exc})."
    return dataclasses.replace(data, schedule=schedule, recompute=recompute, recompute_note=note)


def _with_timeline(data: ReportData, timeline: Any, note: str) -> ReportData:
    import dataclasses

    return dataclasses.replace(data, timeline=timeline, timeline_note=note)


def _csv_frame(data: ReportData) -> Any:
    table = data.table.copy()
    for col in ("batch_size",):
        table[col] = table[col].astype("Int64")
    return table
