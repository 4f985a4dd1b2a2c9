"""What the measured backends (``emulated``, ``gpu``) share: screen by simulation, then measure in workers.

First a screening study ``<study>.simulated`` is simulated (its sampler seeded
with `SCREEN_SEED` unless ``--seed`` is given, and its op times profiled at
fixed batches: the same configs screened whatever the machine's load); its
predicted Pareto front is queued, the recommendation rule's pick first, after
the no-LMS baseline, into the main study, and every main-study trial is a real
run (figures MEASURED): by default (largest batch, ``--confirm`` > 0) a bracket
of fresh worker processes, one batch each (`tuner.backends.confirm.measure_trial`), then
the repeats of the rule's pick and the baseline side by side
(`tuner.backends.confirm.confirm_recommendation`); with ``--confirm 0`` or ``--batch``
one worker that searches in-process (`tuner.trial`). The simulator skips configs
it predicts cannot fit and aims the first batch. Several worker slots
(``--gpus``, ``--workers``) run `tuner.study.loop.optimize` in threads on one study.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from ..policy.batch import Prediction
from ..policy.bracket import ends, verdicts, verdict_word
from .confirm import (RECORDED_FIGURES, FreshRuns, confirm_recommendation, fresh_process_trials, measure_trial,
                       retime_in_fresh_processes)
from ..budget import format_bytes
from ..study.loop import Interrupted, optimize
from ..host import host_verdict
from ..worker.oom import HOST_OOM
from ..policy.pareto import pareto_picks
from ..study.progress import Progress
from ..worker.protocol import MeasureRequest
from ..policy.records import INFEASIBLE, TrialRecord, counted, predicted_record
from ..study.recovery import recover_stale_trials
from ..study.study import SCREEN_SUFFIX, claim_screen_study, make_sampler, queue_warm_start
from ..worker.run import WorkerOutcome, run_worker
from .base import Backend, SearchRun

__all__ = ["MeasuredBackend", "SIM_SKIP_TOLERANCE", "SCREEN_SEED", "EXTRA_TRIALS", "calibration", "measured_record",
           "fresh_record", "machine_error_record"]

log = logging.getLogger(__name__)

# Skip a real run only when the simulator's batch-1 peak exceeds the usable budget by this much:
# the simulator is within about 10-15% of measured peaks, a near miss is worth measuring.
SIM_SKIP_TOLERANCE = 0.15
#: The screening study's sampler seed when ``--seed`` is not given: the same screen, and so the same configs
#: measured, in every search of one model and budget (a random seed made each search measure other configs).
SCREEN_SEED = 0
#: Measured trials a largest-batch search adds, one at a time, while the recommendation rule rejects every
#: LMS config measured (their throughput under ``--min-throughput-ratio`` of the best): the screen's next pick.
EXTRA_TRIALS = 2


class MeasuredBackend(Backend):
    """A backend whose trials are real runs: the screening study, the worker slots, one measured trial."""

    measured = True
    prediction_allocator = "bfc"  # measured trials see TF's BFC allocator: screen with it replayed
    #: Two trials' processes may run at once (each process's peak is its own allocator's: the emulated device,
    #: one per process in host memory). Not on one GPU: two processes there share its memory.
    concurrent_trials: bool = False

    def slots(self, settings: Any) -> list[str | None]:
        """One entry per parallel trial worker: the GPU it uses (None: the CPU)."""
        return [settings.gpu] * settings.workers

    def slots_label(self, slots: list[str | None]) -> str:
        return "CPU"

    def search(self, run: SearchRun) -> tuple[int, int]:
        s, space = run.settings, run.space
        seed = SCREEN_SEED if s.seed is None else s.seed
        with run.ask_lock():
            screen = claim_screen_study(s.study + SCREEN_SUFFIX, run.storage, make_sampler(s.sampler, seed=seed),
                                        main=s.study, record={**run.attrs, "backend": "simulate"},
                                        display=s.storage.display)
            # the n_tensors ladder takes up to half the screen; the sampler has the rest
            queue_warm_start(screen, space, ladder=s.screen_trials // 2 - len(space.warm_start_params()))
        run.screen = screen
        recover_stale_trials(screen)
        done_screen = sum(1 for t in screen.get_trials(deepcopy=False) if counted(t))
        done_main = sum(1 for t in run.main.get_trials(deepcopy=False) if counted(t))
        fresh = fresh_process_trials(s, self)
        run.progress.plan(screen=s.screen_trials - done_screen, trials=s.trials - done_main,
                          repeats=2 * max(0, s.confirm - 1) if fresh else 0, fresh=fresh)
        # the baseline needs no screen: its fresh processes run while the screen simulates (memory verdicts do
        # not depend on the load, and its throughput is taken again, alone, in the confirmation)
        beside = self._baseline_beside(run) if fresh and done_main == 0 else None
        ran = 0
        try:
            screened = optimize(screen, space, run.evaluate_predicted, n_trials=s.screen_trials,
                                deadline=run.deadline, progress=run.progress, desc="screen (simulated)", seed=seed,
                                ask_lock=run.ask_lock)
            self._queue_picks(run, screen, s.trials)
            if beside is not None and not self.concurrent_trials:
                ran, beside = beside.join(), None
            ran += self._measure_all(run)  # on the emulated device beside the baseline's last processes
        finally:
            ran += beside.join(stop=sys.exc_info()[0] is not None) if beside is not None else 0
        extra = 0
        while True:
            run.progress.phase("confirming")
            cut = confirm_recommendation(run, self, gpu=self.slots(s)[0])
            run.notes.extend(cut)
            if (not fresh or cut or extra >= EXTRA_TRIALS or run.stopped.get("reason") == "time limit"
                    or not self._rule_rejects_lms(run)):
                break
            extra += 1  # every LMS config measured fell under the throughput rule: measure the screen's next pick
            done = sum(1 for t in run.main.get_trials(deepcopy=False) if counted(t))
            if not self._queue_picks(run, screen, done + 1):
                break
            log.info("the recommendation rule keeps no LMS config measured so far: measuring the screen's next pick")
            run.progress.plan(trials=1, repeats=2 * max(0, s.confirm - 1), fresh=True)
            ran += self._measure_all(run, trials=done + 1)
        return ran, screened

    def _baseline_beside(self, run: SearchRun) -> "_Beside":
        """Measure the queued no-LMS baseline (the main study's first trial) in a thread, beside the screen."""
        stop = threading.Event()
        gpu = self.slots(run.settings)[0]

        def evaluate(config: Any, trial: Any) -> Any:
            return self.evaluate(run, config, trial, gpu=gpu, stop=stop)

        def work() -> int:
            return optimize(run.main, run.space, evaluate, n_trials=1, deadline=run.deadline,
                            progress=Progress(disabled=True), desc="baseline", seed=run.settings.seed, stop=stop,
                            own_progress=False, ask_lock=run.ask_lock)
        return _Beside(work, stop)

    def _queue_picks(self, run: SearchRun, screen: Any, trials: int) -> int:
        """Queue the screen's picks (the rule's first) so the main study has `trials` configs; returns how many."""
        s, space = run.settings, run.space
        with run.ask_lock():
            queued = {space.table.canonical_key(space.config_of(t.system_attrs.get("fixed_params", t.params)))
                      for t in run.main.get_trials(deepcopy=False)
                      if "n_tensors" in t.system_attrs.get("fixed_params", t.params)}
            k = max(0, trials - len(queued))
            picks = pareto_picks(screen.get_trials(deepcopy=False), k, exclude=queued, table=space.table,
                                 prefer=s.prefer, min_throughput_ratio=s.min_throughput_ratio)
            for params in picks:
                run.main.enqueue_trial(params, user_attrs={"from_screen": True}, skip_if_exists=True)
        return len(picks)

    @staticmethod
    def _rule_rejects_lms(run: SearchRun) -> bool:
        """The rule, on the fresh-process figures, picks no LMS while an LMS config fitted a larger batch."""
        from ..policy.bracket import stored_confirmations
        from ..policy.selection import select_recommendation

        s = run.settings
        chosen, front = select_recommendation(run.main.get_trials(deepcopy=False), prefer=s.prefer,
                                              min_throughput_ratio=s.min_throughput_ratio,
                                              confirmations=stored_confirmations(run.main))
        return (chosen is not None and (chosen.user_attrs.get("config") or {}).get("n_tensors") == 0
                and any(t.values[0] > chosen.values[0] for t in front))

    def _measure_all(self, run: SearchRun, *, trials: int | None = None) -> int:
        """Real trials: one thread per worker slot (one per GPU of ``--gpus``, or ``--workers`` on the CPU).

        Each thread runs `optimize` on the shared study and starts its trial
        workers with its own ``CUDA_VISIBLE_DEVICES``. Ctrl-C / SIGTERM in the
        main thread sets `stop`: every thread kills its worker and re-queues its trial.
        """
        s = run.settings
        n_trials = s.trials if trials is None else trials
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
            return optimize(run.main, run.space, evaluate_on(slots[0]), n_trials=n_trials, deadline=run.deadline,
                            progress=run.progress, desc=desc, seed=s.seed, stop=stop, ask_lock=run.ask_lock,
                            stopped=run.stopped)
        log.info("%d trial workers in parallel (%s)", len(slots), self.slots_label(slots))
        done = sum(1 for t in run.main.get_trials(deepcopy=False) if counted(t))
        run.progress.start(total=n_trials, initial=done, desc=desc)
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="trial") as pool:
                futures = [pool.submit(optimize, run.main, run.space, evaluate_on(gpu), n_trials=n_trials,
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

        def should_stop() -> bool:
            return (deadline is not None and time.monotonic() >= deadline) or (stop is not None and stop.is_set())

        if fresh_process_trials(s, self):
            log.info("trial %d: %s (simulator predicts batch %d; one batch per fresh process from there)",
                     trial.number, run.space.table.short_label(config), pred.batch)
            try:
                fresh = measure_trial(run, self, config, trial.number, gpu=gpu, stop=should_stop)
            except OSError as exc:  # e.g. the study folder turned read-only, the disk is full
                return machine_error_record(config, f"{type(exc).__name__}: {exc}", backend=self, pred=pred)
            if fresh is None:
                raise Interrupted()
            return host_verdict(fresh_record(config, fresh, pred, backend=self, usable=usable, trial_dir=trial_dir),
                                s.host_budget_bytes)
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
        return host_verdict(measured_record(config, outcome, pred, backend=self, usable=usable, trial_dir=trial_dir,
                                            retimed=retimed), s.host_budget_bytes)


class _Beside:
    """`work` in a thread; `join` returns its result or raises its exception (`stop` first: it is stopped)."""

    def __init__(self, work: Callable[[], int], stop: threading.Event) -> None:
        self._stop = stop
        self._result: dict[str, Any] = {}

        def run() -> None:
            try:
                self._result["ran"] = work()
            except BaseException as exc:  # handed to the caller's thread in join
                self._result["error"] = exc
        self._thread = threading.Thread(target=run, name="baseline", daemon=True)
        self._thread.start()

    def join(self, *, stop: bool = False) -> int:
        if stop:
            self._stop.set()
        self._thread.join()
        if "error" in self._result and not stop:
            raise self._result["error"]
        return int(self._result.get("ran", 0))


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
    (`tuner.backends.confirm.retime_in_fresh_processes`); the last one fitted: the record has its figures.
    """
    res = outcome.result
    probes = [e for e in outcome.events if e.get("event") == "probe"]
    extra: dict[str, Any] = {
        "predicted_batch": pred.batch, "worker_wall_s": round(outcome.wall_s, 2),
        "predicted_peak_host_bytes": pred.peak_host_bytes,
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


def fresh_record(config: Any, fresh: FreshRuns, pred: Prediction, *, backend: Backend, usable: int,
                 trial_dir: Path) -> TrialRecord:
    """A trial measured as a bracket of fresh processes (`tuner.backends.confirm.measure_trial`) as a record.

    ``ok``: the bracket's largest batch that fitted (figures of its fastest process there, the highest peak);
    ``infeasible`` / ``oom``: no batch fitted (the peak of the smallest batch tried); a last process that gave
    no verdict (killed, timed out, failed) and nothing fitted: that process's outcome, as an in-process trial's.
    """
    runs = list(fresh.runs)
    by_batch, peaks = verdicts(runs)
    lo, hi, _, failed = ends(by_batch)
    extra: dict[str, Any] = {
        "predicted_batch": pred.batch, "trial_dir": str(trial_dir), "fresh_processes": len(runs),
        "predicted_peak_host_bytes": pred.peak_host_bytes,
        "worker_wall_s": round(sum(float(r.get("wall_s") or 0.0) for r in runs), 2),
        "tried": [[int(r["batch"]), verdict_word(r.get("status"))] for r in runs], "bracket_start": fresh.start}
    common = dict(config=config, backend=backend.name, measured=True, predicted_peak_bytes=pred.peak_bytes,
                  predicted_throughput=pred.throughput)
    last = fresh.no_verdict
    res = last.result if last is not None else None
    for key in (res.RECORDED if res is not None else ()):
        if getattr(res, key) is not None:
            value = getattr(res, key)
            extra[key] = list(value) if isinstance(value, tuple) else value
    source = backend.peak_source
    if lo is not None:
        at = [r for r in runs if r.get("status") == "ok" and int(r["batch"]) == lo]
        fastest = max(at, key=lambda r: (r.get("throughput") or 0.0, -r["process"]))
        peak = max(int(r["peak_device_bytes"]) for r in at if r.get("peak_device_bytes") is not None)
        extra.update({k: fastest[k] for k in RECORDED_FIGURES if fastest.get(k) is not None and k != "peak_source"})
        extra.update(step_time_median_s=fastest.get("step_time_median_s"), smallest_failing=hi)
        source = fastest.get("peak_source") or source
        reason = "" if last is None else (f"bracket not closed: fresh process {runs[-1]['process']} at batch "
                                          f"{runs[-1]['batch']} gave no verdict ({last.status}: {last.reason})")
        return TrialRecord(status="ok", batch_size=lo, throughput=float(fastest.get("throughput") or 0.0),
                           peak_device_bytes=peak, peak_source=source, constraint=peak / usable - 1.0,
                           reason=reason, extra=extra, **common)
    if last is None or failed:
        smallest = min(failed) if failed else 0
        peak = peaks.get(smallest)
        oom = all(r.get("status") == "oom" for r in runs if r.get("status") in ("infeasible", "oom"))
        tried = ", ".join(f"{b} {w}" for b, w in extra["tried"])
        return TrialRecord(status="oom" if oom else "infeasible", batch_size=0, throughput=0.0,
                           peak_device_bytes=peak, peak_source=source,
                           constraint=max((peak / usable - 1.0) if peak else INFEASIBLE, 1e-6),
                           reason=(f"batch {smallest} does not fit in a fresh process: "
                                   + (f"peak {format_bytes(peak, digits=1)} > usable {format_bytes(usable, digits=1)}"
                                      if peak else "out of memory") + f" (one batch per process: {tried})"),
                           extra=extra, **common)
    record = measured_record(config, last, pred, backend=backend, usable=usable, trial_dir=trial_dir)
    return dataclasses.replace(record, extra={**record.extra, **extra})


def machine_error_record(config: Any, reason: str, *, backend: Backend, pred: Prediction,
                         extra: Mapping[str, Any] | None = None) -> TrialRecord:
    """A trial the machine failed (see `REQUEUED_STATUSES`): it is queued again, not counted."""
    return TrialRecord(config=config, backend=backend.name, measured=True, status="machine_error", batch_size=0,
                       throughput=0.0, peak_device_bytes=None, peak_source="", predicted_peak_bytes=pred.peak_bytes,
                       predicted_throughput=pred.throughput, constraint=INFEASIBLE,
                       reason=f"failed by the machine, not the config: {reason}; queued again", failed=True,
                       requeue=True, extra=dict(extra or {}))
