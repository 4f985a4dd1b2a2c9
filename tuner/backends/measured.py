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
from typing import Any, Callable

from ..budget import format_bytes
from ..protocol import MeasureRequest
from .base import Backend, SearchRun

__all__ = ["MeasuredBackend", "SIM_SKIP_TOLERANCE", "calibration"]

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
        from ..loop import optimize
        from ..pareto import pareto_picks
        from ..recovery import recover_stale_trials
        from ..study import SCREEN_SUFFIX, create_study, make_sampler, queue_warm_start

        s, space = run.settings, run.space
        with run.ask_lock():
            screen = create_study(s.study + SCREEN_SUFFIX, run.storage, make_sampler(s.sampler, seed=s.seed))
            if not screen.user_attrs.get("tuner"):
                screen.set_user_attr("tuner", {**run.attrs, "backend": "simulate"})
                screen.set_user_attr("role", "screen")
                screen.set_user_attr("screen_of", s.study)
            queue_warm_start(screen, space)
        run.screen = screen
        recover_stale_trials(screen)
        screened = optimize(screen, space, run.evaluate_predicted, n_trials=s.screen_trials, deadline=run.deadline,
                            progress=run.progress, desc="screen (simulated)", seed=s.seed, ask_lock=run.ask_lock)
        with run.ask_lock():
            queued = {space.table.canonical_key(space.config_of(t.system_attrs.get("fixed_params", t.params)))
                      for t in run.main.get_trials(deepcopy=False)
                      if "n_tensors" in t.system_attrs.get("fixed_params", t.params)}
            k = max(0, s.trials - len(queued))
            for params in pareto_picks(screen.get_trials(deepcopy=False), k, exclude=queued, table=space.table):
                run.main.enqueue_trial(params, user_attrs={"from_screen": True}, skip_if_exists=True)
        return self._measure_all(run), screened

    def _measure_all(self, run: SearchRun) -> int:
        """Real trials: one thread per worker slot (one per GPU of ``--gpus``, or ``--workers`` on the CPU).

        Each thread runs `optimize` on the shared study and starts its trial
        workers with its own ``CUDA_VISIBLE_DEVICES``. Ctrl-C / SIGTERM in the
        main thread sets `stop`: every thread kills its worker and re-queues its trial.
        """
        from ..loop import optimize
        from ..records import counted

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
        from ..loop import Interrupted
        from ..records import machine_error_record, measured_record, predicted_record
        from ..worker import run_worker

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
        start = max(1, round(pred.batch * batch_factor)) if pred.feasible else 1
        request = MeasureRequest(
            workload=s.model, options=dict(s.model_options), config=config.to_dict(), backend=self.name,
            usable_bytes=usable, start_batch=max(1, start), cap=s.max_batch,
            slope_bytes_per_sample=pred.slope_bytes_per_sample, warmup=s.warmup, steps=s.steps, seed=s.seed or 0,
            trial=trial.number)

        def on_event(event: dict[str, Any]) -> None:
            if event.get("event") == "probe":
                verdict = "fits" if event.get("fits") else "does not fit"
                peak = event.get("peak_bytes")
                log.info("  trial %d: batch %d %s (peak %s, usable %s)", trial.number, event["batch"], verdict,
                         "OOM" if event.get("oom") else format_bytes(peak), format_bytes(usable))
            elif event.get("event") == "timed_run_too_big":
                log.info("  trial %d: batch %d does not fit on the timed run (%s); trying a smaller one",
                         trial.number, event["batch"], event.get("detail", ""))
            elif event.get("event") == "phase" and event.get("phase") == "timing":
                log.info("  trial %d: timing batch %d (%d warm-up + %d timed steps)", trial.number, event["batch"],
                         s.warmup, s.steps)

        log.info("trial %d: %s (simulator predicts batch %d; first probe %d)", trial.number,
                 run.space.table.short_label(config), pred.batch, start)

        def should_stop() -> bool:
            return (deadline is not None and time.monotonic() >= deadline) or (stop is not None and stop.is_set())

        try:
            outcome = run_worker(request, workdir=trial_dir, timeout_s=s.trial_timeout_s,
                                 env=self.worker_env(gpu=gpu), on_event=on_event, should_stop=should_stop)
        except OSError as exc:  # e.g. the study folder turned read-only, the disk is full, no process can start
            return machine_error_record(config, f"{type(exc).__name__}: {exc}", backend=self, pred=pred)
        if outcome.status == "stopped":
            raise Interrupted()
        return measured_record(config, outcome, pred, backend=self, usable=usable, trial_dir=trial_dir)


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
