"""The search: a plain Optuna study over the LMS knobs, two objectives, a memory constraint.

Objectives: maximise the largest batch that fits the budget, and maximise
throughput (samples/s) at that batch; the peak device memory is recorded. A
config that does not fit at any batch is a COMPLETE trial with values (0, 0)
and a positive constraint (``trial.set_constraint``, read by TPE and NSGA-II),
never a silent failure. Sampler: multivariate TPE (`tuner.study.study.make_sampler`).

`run_search` sets the study up and hands it to the backend
(`tuner.backends`): ``simulate`` predicts every trial in-process; ``emulated``
and ``gpu`` screen by simulation and measure in worker subprocesses. Where the
rest lives::

    study/settings.py    SearchSettings           policy/space.py     SearchSpace (from knobs.py)
    study/study.py       samplers, warm start     study/loop.py       the ask/tell loop (optimize)
    policy/records.py    trial records            study/recovery.py   stale trials (Optuna's private APIs)
    policy/pareto.py     dominance, screen picks  graphs.py           the traced graph, the derived budget
    worker/run.py        the worker's parent side worker/protocol.py  the worker's messages
    policy/selection.py  the recommendation rule  outputs.py          recommended.json, trials.csv
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import platform
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from lms.config import LMSConfig

from .backends import SearchRun, get_backend
from .backends.confirm import fresh_process_trials
from .policy.batch import Prediction, predict_max_batch, usable_bytes
from .budget import format_bytes
from .environment import host_memory_bytes, tensorflow_distribution
from .graphs import derive_budget, load_graph, load_profile
from .study.progress import Progress
from .policy.records import counted
from .study.recovery import recover_stale_trials
from .study.settings import SearchSettings, study_settings_conflict
from .policy.space import SearchSpace
from .study.storage import open_storage, storage_lock
from .study.study import TUNER_ATTR, claim_study, make_sampler, queue_warm_start, setup_finished, tuner_record

__all__ = ["run_search", "SearchOutcome", "environment_info"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchOutcome:
    """What a search run produced (for the CLI to print)."""

    study: str
    recommendation: dict[str, Any] | None
    recommended_path: Path | None
    trials_csv: Path | None
    ran: int
    screened: int
    completed: int
    stopped_early: bool
    wall_s: float
    notes: tuple[str, ...] = ()
    stop_reason: str = ""  # why it stopped early: see `optimize` (``time limit``, ``others``, ``space``, ...)
    statuses: Mapping[str, int] = field(default_factory=dict)  # evaluated trials of the main study by status
    running_elsewhere: int = 0  # trials of the study running in other processes when this one ended
    #: ``--batch N`` and no config fits at N: the smallest peak found, its config and source, and the
    #: largest batch that config fits (simulator, PREDICTED); see `FixedBatch`.
    no_fit: Mapping[str, Any] | None = None
    #: why the recommendation is not confirmed ("" when it is, or when nothing is confirmed: another backend,
    #: ``--batch``, ``--confirm 0``): recommended.json's ``unconfirmed`` (e.g. the time limit came first)
    unconfirmed: str = ""
    cut_short: str = ""  # the time limit or an interruption ended it before the confirmation did (resume it)


class _Stopper:
    """SIGTERM -> KeyboardInterrupt in the parent (so workers get killed and trials re-queued)."""

    def __enter__(self) -> "_Stopper":
        self._old = signal.getsignal(signal.SIGTERM)
        try:
            signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread
            self._old = None
        return self

    @staticmethod
    def _handle(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    def __exit__(self, *exc: Any) -> None:
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)


def run_search(settings: SearchSettings, *, progress: Progress | None = None) -> SearchOutcome:
    """Run (or resume) the study described by `settings`; write recommended.json and trials.csv.

    Raises:
        BadInput: a resume conflict (found before anything is logged), or the model could not be
            traced because of its spec/options.
        SearchError: tracing or trials failed for other reasons.
        KeyboardInterrupt: interrupted (completed trials are kept; rerun to resume).
    """
    from lms.plan import find_candidates

    from . import outputs

    progress = progress or Progress(disabled=True)
    start = time.monotonic()
    deadline = None if settings.timeout_s is None else start + settings.timeout_s
    notes = list(settings.notes)
    backend = get_backend(settings.backend)
    storage = open_storage(settings.storage, lock=True)

    def ask_lock() -> Any:
        return storage_lock(settings.storage)

    def setup_lock() -> Any:  # on a database server too (an advisory lock): claiming a study must be atomic
        return storage_lock(settings.storage, storage=storage)

    with setup_lock():  # the settings record, before any work: a search started with other settings is refused
        main = claim_study(settings.study, storage, make_sampler(settings.sampler, seed=settings.seed),
                           record=_settings_record(settings), screened=backend.measured,
                           conflict=lambda stored: study_settings_conflict(stored, settings),
                           display=settings.storage.display)
    settings.study_dir.mkdir(parents=True, exist_ok=True)
    for note in settings.notes:
        log.info("note: %s", note)
    log.info("study %s: model %s, backend %s, storage %s", settings.study, settings.model, backend.name,
             settings.storage.display)
    with _Stopper():
        progress.phase("tracing")
        graph = load_graph(settings)
        op_costs, plain_peaks = load_profile(settings) if backend.profiles_op_times else (None, {})
        if op_costs is not None:
            notes.append(f"simulator op times: measured on this CPU ({op_costs.source})")
        elif backend.profiles_op_times:
            notes.append("simulator op times: the cpu profile's roofline (the step was not profiled: the "
                         "graph came from another backend's trace, or profiling failed; see "
                         f"{settings.study_dir / 'trace'})")
        budget = settings.budget_bytes
        budget_source = settings.budget_source
        stored = tuner_record(main.user_attrs) or {}
        if budget is None:
            if stored.get("budget_bytes"):
                budget, budget_source = int(stored["budget_bytes"]), str(stored.get("budget_source", "stored"))
            else:  # the emulated default, or --budget-from-batch
                budget, budget_source = derive_budget(settings, graph)
        usable = usable_bytes(budget, settings.safety_margin)
        candidates, _ = find_candidates(graph, LMSConfig())
        if not candidates:
            notes.append("the graph has no swap candidates: only the no-LMS baseline is possible")
        space = SearchSpace(n_candidates=max(1, len(candidates)))
        attrs = {**_settings_record(settings), "budget_bytes": budget, "budget_source": budget_source,
                 "space": space.to_dict(), "role": "main"}
        with setup_lock():  # searches starting together: one sets the study up, the others see it done
            stored = tuner_record(main.user_attrs) or {}
            if not setup_finished(stored):
                main.set_user_attr(TUNER_ATTR, attrs)
                log.info("new study %s: %s backend, budget %s (usable %s after a %.0f%% margin)", settings.study,
                         backend.name, format_bytes(budget), format_bytes(usable), 100 * settings.safety_margin)
            else:
                if stored.get("selection") != attrs["selection"]:  # `best` from the storage picks as this run does
                    main.set_user_attr(TUNER_ATTR, {**stored, "selection": attrs["selection"]})
                log.info("resuming study %s", settings.study)
            if fresh_process_trials(settings, backend):
                # each measured trial is a bracket of fresh processes: the baseline, then the screen's picks
                # (the TFLMS defaults and the warm values are screened, and measured when the screen picks them)
                main.enqueue_trial(space.baseline_params(), user_attrs={"warm_start": True}, skip_if_exists=True)
            else:
                queue_warm_start(main, space)
        recover_stale_trials(main)

        goal = settings.goal
        predictions: dict[str, Prediction] = {}
        predict_lock = threading.Lock()  # worker threads share the simulator's caches

        def predict(config: Any) -> Prediction:
            key = space.table.canonical_key(config)
            with predict_lock:
                if key not in predictions:
                    predictions[key] = goal.predict(graph, config, usable, device=settings.device,
                                                    cap=settings.max_batch, allocator=backend.prediction_allocator,
                                                    op_costs=op_costs, host_budget=settings.host_budget_bytes)
                return predictions[key]

        run = SearchRun(main=main, storage=storage, space=space, settings=settings, usable=usable, predict=predict,
                        deadline=deadline, progress=progress, ask_lock=ask_lock, attrs=attrs, plain_peaks=plain_peaks)
        ran = screened = 0
        finished = False
        try:
            ran, screened = backend.search(run)
            finished = True
        finally:
            progress.finish()
            notes.extend(run.notes)
            trials = main.get_trials(deepcopy=False)
            completed = sum(1 for t in trials if counted(t))
            stopped = completed < settings.trials
            cut = _cut_short(run, finished=finished, stopped=stopped)
            doc, rec_path, csv_path = outputs.write_outputs(
                settings.study_dir, main=main, screen=run.screen, settings=settings, budget_bytes=budget,
                budget_source=budget_source, usable_bytes=usable, environment=_environment(settings), notes=notes,
                measure_advice=f"run the search again with --trials {completed + settings.trials} to measure "
                               "more configs", cut_short=cut)
    statuses: dict[str, int] = {}
    for t in trials:
        if counted(t):
            status = str(t.user_attrs.get("status") or "?")
            statuses[status] = statuses.get(status, 0) + 1
    running_elsewhere = sum(1 for t in trials if t.state.name == "RUNNING"
                            and (t.user_attrs.get("owner") or {}).get("pid") not in (None, os.getpid()))
    no_fit = None
    if doc is None and settings.batch is not None:
        no_fit = _smallest_need(trials, run.screen.get_trials(deepcopy=False) if run.screen is not None else [],
                                graph=graph, usable=usable, settings=settings, op_costs=op_costs)
    reason = run.stopped.get("reason", "") if stopped else ""
    if stopped and reason in ("", "trials", "others") and running_elsewhere:
        reason = "others"
    return SearchOutcome(settings.study, doc, rec_path, csv_path, ran, screened, completed, stopped,
                         time.monotonic() - start, tuple(notes), stop_reason=reason, statuses=statuses,
                         running_elsewhere=running_elsewhere, no_fit=no_fit,
                         unconfirmed=(str(doc.get("unconfirmed") or "") if doc is not None and settings.confirm > 0
                                      else ""),
                         cut_short=cut)


def _cut_short(run: SearchRun, *, finished: bool, stopped: bool) -> str:
    """Why the measured search ended before its recommendation was confirmed ("" when it was not cut short).

    The time limit (or an interruption) during the trials or the confirmation: the figures so far may point
    at another config than the finished search would (a time limit must never turn into another answer).
    """
    s = run.settings
    if not fresh_process_trials(s, get_backend(s.backend)):
        return ""
    if not finished:
        return "the search was interrupted before the confirmation ended"
    if any("time limit" in n for n in run.notes) or (stopped and run.stopped.get("reason") == "time limit"):
        limit = f"{s.timeout_s:g} s" if s.timeout_s else "the time limit"
        return (f"the time limit ({limit}) ended the search before the " + ("trials" if stopped else "confirmation")
                + " ended")
    return ""


def _settings_record(settings: SearchSettings) -> dict[str, Any]:
    """The study's settings record (`tuner.study.study.TUNER_ATTR`) as far as it is known before tracing."""
    return {**settings.identity(), "budget_bytes": settings.budget_bytes, "budget_source": settings.budget_source,
            "budget_from_batch": settings.budget_from_batch,
            "workload": dict(settings.workload), "storage": settings.storage.display, "schema_version": 1,
            "selection": settings.selection(), "host_budget_bytes": settings.host_budget_bytes,
            "host_budget_source": settings.host_budget_source}


def _smallest_need(trials: Any, screened: Any, *, graph: Any, usable: int, settings: SearchSettings,
                   op_costs: Any) -> dict[str, Any] | None:
    """Of the configs that did not fit at ``--batch``, the one that needs the fewest bytes, and the batch it fits.

    Measured peaks are preferred to the screening study's predicted ones; the batch
    that would fit is the simulator's (PREDICTED) for that config.
    """
    from lms.config import LMSConfig

    best = None
    for source in (trials, screened):
        for t in source:
            a = t.user_attrs
            peak = a.get("peak_device_bytes")
            if a.get("status") not in ("infeasible", "oom") or not peak or not isinstance(a.get("config"), dict):
                continue
            if best is None or peak < best[0]:
                best = (int(peak), a["config"], bool(a.get("measured")))
        if best is not None:
            break
    if best is None:
        return None
    peak, config, measured = best
    backend = get_backend(settings.backend)
    pred = predict_max_batch(graph, LMSConfig.from_dict(config), usable, device=settings.device,
                             cap=settings.max_batch, allocator=backend.prediction_allocator,
                             op_costs=op_costs, host_budget=settings.host_budget_bytes)
    return {"batch": settings.batch, "smallest_peak_bytes": peak, "config": config,
            "peak_source": backend.source_label(measured=measured, device=settings.device),
            "fits_batch": pred.batch, "fits_batch_source": backend.source_label(
                measured=False, device=settings.device)}


def _environment(settings: SearchSettings) -> dict[str, Any]:
    return environment_info(backend=settings.backend, gpu=settings.gpus[0] if settings.gpus else settings.gpu)


def environment_info(*, backend: Any, gpu: str | None = None) -> dict[str, Any]:
    """JSON-ready description of this machine for recommended.json.

    ``device_name`` / ``driver_version`` come from the backend (`tuner.backends.Backend.device_info`):
    the GPU's for gpu; this CPU with TensorFlow's BFC allocator for emulated; none for simulate.
    """
    tf = tensorflow_distribution()
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "host_memory_bytes": host_memory_bytes(),
        "tensorflow": tf[1] if tf else None,
        "tensorflow_distribution": tf[0] if tf else None,
        "keras": _version("keras"),
        "optuna": _version("optuna"),
        "tflms_tuner": _version("tflms-tuner"),
        "device_name": None,
        "driver_version": None,
    }
    info.update(get_backend(backend).device_info(info, gpu=gpu))
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
