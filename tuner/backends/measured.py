"""What the measured backends (``emulated``, ``gpu``) share: screen by simulation, then measure in workers.

First a screening study ``<study>.simulated`` is simulated; its predicted
Pareto front is queued (after the no-LMS baseline and the TFLMS defaults) into
the main study, and every main-study trial is a real run in a worker
(`tuner.trial`): the simulator skips configs it predicts cannot fit and seeds
the batch search, the worker measures (figures are MEASURED). Several worker
slots (``--gpus``, ``--workers``) run `tuner.loop.optimize` in threads on one study.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from ..batch import Prediction
from ..confirm import confirm_recommendation, retime_in_fresh_processes
from ..budget import format_bytes
from ..loop import Interrupted, optimize
from ..oom import HOST_OOM
from ..pareto import pareto_picks
from ..protocol import MeasureRequest
from ..records import INFEASIBLE, TrialRecord, counted
from ..recovery import recover_stale_trials
from ..study import SCREEN_SUFFIX, claim_screen_study, make_sampler, queue_warm_start
from ..worker import WorkerOutcome, run_worker
from .base import Backend, SearchRun
from .simulate import predicted_record

__all__ = ["MeasuredBackend", "SIM_SKIP_TOLERANCE", "calibration", "measured_record", "machine_error_record"]

log = logging.getLogger(__name__)

# Skip a real run only when the simulator's batch-1 peak exceeds the usable budget by this much:
# the simulator is within about 10-15% of measured peaks, a near miss is worth measuring.
SIM_SKIP_TOLERANCE = 0.15


class MeasuredBackend(Backend):
    """A backend whose trials are real runs: the screening study, the worker slots, one measured trial."""

    measured = True
    prediction_allocator = "bfc"  # measured trials see TF's BFC allocator: screen with it replayed

    def slots(self, settings: Any) -> list[str | None]:
        """One entry per parallel trial worker: the GPU it uses (None: the CPU)."""
        return [settings.gpu] * settings.workers

    def slots_label(self, slots: list[str | None]) -> str:
        return "CPU"

    def search(self, run: SearchRun) -> tuple[int, int]:
        s, space = run.settings, run.space
        with run.ask_lock():
            screen = claim_screen_study(s.study + SCREEN_SUFFIX, run.storage, make_sampler(s.sampler, seed=s.seed),
                                        main=s.study, record={**run.attrs, "backend": "simulate"},
                                        display=s.storage.display)
            # the n_tensors ladder takes up to half the screen; the sampler has the rest
            queue_warm_start(screen, space, ladder=s.screen_trials // 2 - len(space.warm_start_params()))
        run.screen = screen
        recover_stale_trials(screen)
        screened = optimize(screen, space, run.evaluate_predicted, n_trials=s.screen_trials, deadline=run.deadline,
                            progress=run.progress, desc="screen (simulated)", seed=s.seed, ask_lock=run.ask_lock)
        with run.ask_lock():
            queued = {space.table.canonical_key(space.config_of(t.system_attrs.get("fixed_params", t.params)))
                      for t in run.main.get_trials(deepcopy=False)
                      if "n_tensors" in t.system_attrs.get("fixed_params", t.params)}
            k = max(0, s.trials - len(queued))
            for params in pareto_picks(screen.get_trials(deepcopy=False), k, exclude=queued, table=space.table,
                                       prefer=s.prefer, min_throughput_ratio=s.min_throughput_ratio):
                run.main.enqueue_trial(params, user_attrs={"from_screen": True}, skip_if_exists=True)
        ran = self._measure_all(run)
        run.notes.extend(confirm_recommendation(run, self, gpu=self.slots(s)[0]))
        return ran, screened

    def _measure_all(self, run: SearchRun) -> int:
        """Real trials: one thread per worker slot (one per GPU of ``--gpus``, or ``--workers`` on the CPU).

        Each thread runs `optimize` on the shared study and starts its trial
        workers with its own ``CUDA_VISIBLE_DEVICES``. Ctrl-C / SIGTERM in the
        main thread sets `stop`: every thread kills its worker and re-queues its trial.
        """
        s = run.settings
        slots = self.slots(s)
        stop = threading.Event()

        def evaluate_on(gpu: str | None) -> Callable[[Any, Any], Any]:
            def evaluate(config: Any, trial: Any) -> Any:
                factor, trust = calibration(run.main)
                return self.evaluate(run, config, trial, gpu=gpu, batch_factor=factor, trust_infeasible=trust,
                                     stop=stop)
            return evaluate

        desc = f"search ({self.name}, measured)"
        if len(slots) == 1:
            return optimize(run.main, run.space, evaluate_on(slots[0]), n_trials=s.trials, deadline=run.deadline,
                            progress=run.progress, desc=desc, seed=s.seed, stop=stop, ask_lock=run.ask_lock,
                            stopped=run.stopped)
        log.info("%d trial workers in parallel (%s)", len(slots), self.slots_label(slots))
        done = sum(1 for t in run.main.get_trials(deepcopy=False) if counted(t))
        run.progress.start(total=s.trials, initial=done, desc=desc)
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="trial") as pool:
                futures = [pool.submit(optimize, run.main, run.space, evaluate_on(gpu), n_trials=s.trials,
                                       deadline=run.deadline, progress=run.progress, desc=desc,
                                       seed=None if s.seed is None else (s.seed + i) % 2**32,
                                       stop=stop, own_progress=False, ask_lock=run.ask_lock, stopped=run.stopped)
                           for i, gpu in enumerate(slots)]
                try:
                    return sum(f.result() for f in futures)
                except BaseException:
                    stop.set()
                    concurrent.futures.wait(futures)
                    raise
        finally:
            run.progress.close()

    def evaluate(self, run: SearchRun, config: Any, trial: Any, *, gpu: str | None, batch_factor: float = 1.0,
                 trust_infeasible: bool = True, stop: threading.Event | None = None) -> Any:
        """Screen with the simulator, then measure in a worker (max-batch search + timed run).

        The warm-start trials (no LMS, TFLMS defaults) always run: they anchor the
        comparison and check the simulator's verdicts.
        """
        s, usable, deadline = run.settings, run.usable, run.deadline
        pred = run.predict(config)
        warm = bool(trial.user_attrs.get("warm_start"))
        if (not pred.feasible and trust_infeasible and not warm
                and (pred.min_bytes or pred.peak_bytes) > usable * (1 + SIM_SKIP_TOLERANCE)):
            record = predicted_record(config, pred, usable=usable, device=s.device)
            return dataclasses.replace(
                record, backend=self.name, measured=False,
                reason=f"not run: {pred.reason} (more than {SIM_SKIP_TOLERANCE:.0%} over the usable budget)",
                extra={**record.extra, "skipped_by_simulator": True})
        trial_dir = s.study_dir / "trials" / f"{trial.number:04d}"
        start, cap = s.goal.first_probe(pred, batch_factor)
        request = MeasureRequest(
            workload=s.model, options=dict(s.model_options), config=config.to_dict(), backend=self.name,
            usable_bytes=usable, start_batch=max(1, start), cap=cap, fixed_batch=s.batch is not None,
            slope_bytes_per_sample=pred.slope_bytes_per_sample, warmup=s.warmup, steps=s.steps, seed=s.seed or 0,
            trial=trial.number, **self.worker_limits(s))

        def on_event(event: dict[str, Any]) -> None:
            if event.get("event") == "probe":
                verdict = "fits" if event.get("fits") else "does not fit"
                peak = event.get("peak_bytes")
                oom = "OOM" + (" in pinned host memory" if str(event.get("detail", "")).startswith(HOST_OOM) else "")
                log.info("  trial %d: batch %d %s (peak %s, usable %s)", trial.number, event["batch"], verdict,
                         oom if event.get("oom") else format_bytes(peak), format_bytes(usable))
            elif event.get("event") == "timed_run_too_big":
                log.info("  trial %d: batch %d does not fit on the timed run (%s); trying a smaller one",
                         trial.number, event["batch"], event.get("detail", ""))
            elif event.get("event") == "phase" and event.get("phase") == "timing":
                log.info("  trial %d: timing batch %d (%d warm-up + %d timed steps)", trial.number, event["batch"],
                         s.warmup, s.steps)

        if s.batch is None:
            log.info("trial %d: %s (simulator predicts batch %d; first probe %d)", trial.number,
                     run.space.table.short_label(config), pred.batch, start)
        else:
            log.info("trial %d: %s at batch %d (simulator predicts peak %s: %s)", trial.number,
                     run.space.table.short_label(config), s.batch, format_bytes(pred.peak_bytes),
                     "fits" if pred.feasible else "does not fit")

        def should_stop() -> bool:
            return (deadline is not None and time.monotonic() >= deadline) or (stop is not None and stop.is_set())

        try:
            outcome = run_worker(request, workdir=trial_dir, timeout_s=s.trial_timeout_s,
                                 env=self.worker_env(gpu=gpu), on_event=on_event, should_stop=should_stop)
            if outcome.status == "killed" and not should_stop():
                # a signal the tuner did not send (someone's kill, the host's out-of-memory killer) says nothing
                # about the config yet: it runs once more in a fresh process; a second kill is the verdict
                log.warning("  trial %d: %s; running it again in a fresh process", trial.number, outcome.reason)
                trial.set_user_attr("killed_first", outcome.reason)
                outcome = run_worker(request, workdir=trial_dir, timeout_s=s.trial_timeout_s,
                                     env=self.worker_env(gpu=gpu), on_event=on_event, should_stop=should_stop)
                if outcome.status == "killed":
                    outcome = dataclasses.replace(outcome, reason=f"{outcome.reason}, in two processes in a row")
        except OSError as exc:  # e.g. the study folder turned read-only, the disk is full, no process can start
            return machine_error_record(config, f"{type(exc).__name__}: {exc}", backend=self, pred=pred)
        if outcome.status == "stopped":
            raise Interrupted()
        searched = _searched_batch(outcome)
        retimed = None
        if outcome.status == "infeasible" and s.batch is None and searched:
            # the probes fitted, the timed runs after them in that process did not: time it in a fresh one
            log.info("  trial %d: the probes fitted batch %d, the timed runs after them did not; timing it in a "
                     "fresh process", trial.number, searched)
            retimed = retime_in_fresh_processes(run, self, config, trial.number, start=searched, gpu=gpu,
                                                stop=should_stop)
            if retimed is None:
                raise Interrupted()
        return measured_record(config, outcome, pred, backend=self, usable=usable, trial_dir=trial_dir,
                               retimed=retimed)


def calibration(study: Any) -> tuple[float, bool]:
    """(measured / predicted max batch, median over measured trials; whether infeasibility predictions hold).

    The factor scales the simulator's seed for the next batch search. If a
    config the simulator called infeasible was measured to fit, its
    infeasibility verdicts are no longer used to skip real runs.
    """
    from optuna.trial import TrialState

    ratios: list[float] = []
    trust = True
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        a = t.user_attrs
        if not a.get("measured") or a.get("status") != "ok" or "duplicate_of" in a:
            continue
        predicted = a.get("predicted_batch") or 0
        if predicted > 0:
            ratios.append(a["batch_size"] / predicted)
        else:
            trust = False
    factor = sorted(ratios)[len(ratios) // 2] if ratios else 1.0
    return factor, trust


def _searched_batch(outcome: WorkerOutcome) -> int:
    """The largest batch the worker's probes saw fit (0: none, or no search)."""
    search = getattr(outcome.result, "search", None) or {}
    return int(search.get("batch") or 0)


def measured_record(config: Any, outcome: WorkerOutcome, pred: Prediction, *, backend: Backend,
                    usable: int, trial_dir: Path, retimed: list[dict[str, Any]] | None = None) -> TrialRecord:
    """A measure worker's outcome as a record (figures MEASURED; the prediction beside them).

    `retimed`: the fresh processes that timed the trial after its in-process timed runs did not fit
    (`tuner.confirm.retime_in_fresh_processes`); the last one fitted: the record has its figures.
    """
    res = outcome.result
    probes = [e for e in outcome.events if e.get("event") == "probe"]
    extra: dict[str, Any] = {
        "predicted_batch": pred.batch, "worker_wall_s": round(outcome.wall_s, 2),
        "trial_dir": str(trial_dir), "probes": [{k: p.get(k) for k in ("batch", "fits", "peak_bytes", "oom")}
                                                for p in probes],
    }
    if res is not None:
        for key in res.RECORDED:
            value = getattr(res, key)
            if value is not None:
                extra[key] = list(value) if isinstance(value, tuple) else value
    common = dict(config=config, backend=backend.name, measured=True, predicted_peak_bytes=pred.peak_bytes,
                  predicted_throughput=pred.throughput)
    source = (res.peak_source if res is not None else "") or backend.peak_source
    if retimed:
        extra["timed_in_fresh_process"] = {
            "searched_batch": _searched_batch(outcome), "in_process_reason": outcome.reason,
            "tried": [[r["batch"], r["status"]] for r in retimed], "runs": retimed}
        last = retimed[-1]
        if last["status"] == "ok":
            peak = int(last["peak_device_bytes"])
            extra["step_time_median_s"] = last.get("step_time_median_s")
            return TrialRecord(status="ok", batch_size=int(last["batch"]), throughput=float(last["throughput"]),
                               peak_device_bytes=peak, peak_source=source, constraint=peak / usable - 1.0,
                               extra=extra, **common)
        outcome = dataclasses.replace(outcome, reason=(
            f"{outcome.reason}; in fresh processes: "
            + ", ".join(f"batch {r['batch']} {'did not fit' if r['status'] in ('infeasible', 'oom') else r['status']}"
                        for r in retimed)))
    if outcome.status == "ok":
        peak = int(res.peak_device_bytes)
        return TrialRecord(status="ok", batch_size=int(res.batch_size), throughput=float(res.throughput),
                           peak_device_bytes=peak, peak_source=source, constraint=peak / usable - 1.0,
                           extra=extra, **common)
    if outcome.status in ("infeasible", "oom"):
        peak = res.peak_device_bytes if res is not None else None
        violation = (peak / usable - 1.0) if peak else INFEASIBLE
        return TrialRecord(status=outcome.status, batch_size=0, throughput=0.0, peak_device_bytes=peak,
                           peak_source=source, constraint=max(violation, 1e-6), reason=outcome.reason,
                           extra=extra, **common)
    fitted = [p["batch"] for p in probes if p.get("fits")]
    partial = f" (largest batch seen to fit: {max(fitted)})" if fitted else ""
    if outcome.status in ("timeout", "killed"):
        return TrialRecord(status=outcome.status, batch_size=0, throughput=0.0, peak_device_bytes=None,
                           peak_source=source, constraint=INFEASIBLE, reason=outcome.reason + partial,
                           extra=extra, **common)
    if res is None:
        # the worker ended without writing its result (not killed by a signal: that is "killed" above):
        # it could not write to the study folder, or could not start; nothing is known about the config
        return machine_error_record(config, f"{outcome.reason} (log: {outcome.log_path})", backend=backend,
                                    pred=pred, extra=extra)
    return TrialRecord(status="error", batch_size=0, throughput=0.0, peak_device_bytes=None, peak_source=source,
                       constraint=INFEASIBLE, reason=f"{outcome.reason} (log: {outcome.log_path})", failed=True,
                       extra=extra, **common)


def machine_error_record(config: Any, reason: str, *, backend: Backend, pred: Prediction,
                         extra: Mapping[str, Any] | None = None) -> TrialRecord:
    """A trial the machine failed (see `REQUEUED_STATUSES`): it is queued again, not counted."""
    return TrialRecord(config=config, backend=backend.name, measured=True, status="machine_error", batch_size=0,
                       throughput=0.0, peak_device_bytes=None, peak_source="", predicted_peak_bytes=pred.peak_bytes,
                       predicted_throughput=pred.throughput, constraint=INFEASIBLE,
                       reason=f"failed by the machine, not the config: {reason}; queued again", failed=True,
                       requeue=True, extra=dict(extra or {}))
