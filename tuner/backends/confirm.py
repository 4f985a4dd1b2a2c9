"""Measure configs in fresh processes, one batch per process: the trials of a largest-batch search, and their repeats.

A batch's peak depends on the process it runs in. TensorFlow's executor runs
the ops no edge orders in an order that differs from process to process (the
no-LMS baseline and ``schedule="tf"`` configs; a memory-scheduled step is
pinned whole, `lms.tf.exact`, and repeats to the byte), and TF's allocator
peak depends on the process's history: `AssignVariableOp` hands each assigned
variable (e.g. Keras's SGD momentum) the buffer its new value was computed in,
so a batch's peak depends on the batches probed before it in one process
(ResNet-50 64x64, ``n_tensors=-1, lb=1, schedule="memory"``: batch 170 peaked at
557.3 MiB after a probe at 137 and at 538.3 MiB after one at 160).

The user's training run is a fresh process whose first step is at its batch.
So with ``--confirm N`` (the default, N=2) a measured trial *is* a bracket of
fresh worker processes (`measure_trial`): each runs one batch from its first
step (the warm-up and timed steps of ``--batch N``'s single run; one whose
timed step peaks over the budget stops there: no later step can undo it), from
the simulator's batch for the config (it does not depend on anything measured
before, so a pinned config gets the same runs, and the same batch, in every
search; fresh-process peaks are jagged in the batch, so the answer does depend
on where the bracket starts), up or down by the peak's distance to the budget,
then between the largest batch that fitted and the smallest that did not
(`tuner.policy.bracket.next_batch`) until the two are 1 apart. Then `confirm_recommendation`
runs the repeats: the config the recommendation rule picks and the no-LMS
baseline (the other side of the "x times larger batch" ratio), one process of
each in turn, until the largest batch fitted in N processes, so each config has
a process timed next to the other's, not only minutes apart on a machine whose
load moves (the rule takes the fastest process of each at its batch). With
``--confirm 0`` (or ``--batch``) a trial is one worker process that searches
in-process (`tuner.policy.batch.search_max_batch`), as before.

(Before, every trial searched in-process and the recommendation was then
bracketed again in fresh processes: ResNet-50 64x64 on 2 cores spent 380 s in
four in-process trials and 360 s re-measuring two of them; the trial's own batch
was never used, and the rule compared throughputs measured 5-15 min apart.)

The runs are stored on the study (user attr ``"confirmations"``: trial number
-> runs, `tuner.policy.bracket`), so a resumed search goes on from them (a trial
interrupted mid-bracket is queued again and its retry continues the same runs)
and ``tuner best`` shows them. No TensorFlow here: the runs are `tuner.trial` workers.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..policy.bracket import (CONFIRMATIONS_ATTR, METHOD, RULE, VERDICT, confirmed_figures, next_batch,
                      stored_confirmations, verdict_word)
from ..budget import format_bytes
from ..worker.protocol import MeasureRequest
from ..worker.run import WorkerOutcome, run_worker

if TYPE_CHECKING:
    from .base import Backend, SearchRun

__all__ = ["CONFIRMATIONS_ATTR", "METHOD", "RULE", "RECORDED_FIGURES", "FreshRuns", "confirm_recommendation",
           "confirmed_figures", "fresh_process_trials", "max_processes", "measure_trial", "next_batch",
           "retime_in_fresh_processes"]

log = logging.getLogger(__name__)

#: Fresh processes per bracket beyond the ``--confirm`` repeats (a bracket usually closes in 3-5).
EXTRA_PROCESSES = 8
#: More of them for a config in TensorFlow's own order (``schedule="tf"``: the no-LMS baseline), whose verdicts do
#: not repeat between processes (ResNet-50 64x64, no LMS: 30 and 29 each fitted once and failed once in one
#: default search, which spent its 10 processes with 28 fitted once). Those processes are the short ones (about
#: 10-15 s against 30-40 s for the pinned pick on a quiet 2-core machine).
UNPINNED_EXTRA_PROCESSES = 6
#: Fresh processes a trial's timed run may take when its in-process timed runs did not fit
#: (`retime_in_fresh_processes`, ``--confirm 0``).
RETIME_PROCESSES = 3
#: Rounds of (select with the confirmed figures, repeat what it points at).
MAX_ROUNDS = 3
#: What a run keeps of its worker's result besides the verdict, throughput and peak (a trial measured in fresh
#: processes records them from its fastest process at its batch, as an in-process trial from its timed run).
RECORDED_FIGURES = ("step_time_spread_s", "step_times_s", "host_peak_rss_bytes", "host_copies_peak_bytes",
                    "nvml_process_peak_bytes",
                    "nvml_device_peak_bytes", "tensorflow", "device", "lms_summary", "peak_source")


def fresh_process_trials(settings: Any, backend: "Backend") -> bool:
    """Whether a measured trial is a bracket of fresh processes (`measure_trial`): a measured backend, largest
    batch, ``--confirm`` > 0."""
    return bool(backend.measured and settings.batch is None and settings.confirm > 0)


@dataclass(frozen=True)
class FreshRuns:
    """A trial's fresh processes: ``runs`` (`tuner.policy.bracket`), the ``start`` batch, and the last worker's outcome
    when it gave no verdict (killed, timed out, failed: the bracket stops there; None otherwise)."""

    runs: tuple[dict[str, Any], ...]
    start: int
    no_verdict: WorkerOutcome | None = None


def max_processes(config: Any, repeats: int) -> int:
    """How many fresh processes a bracket of `config` may take in all, its `repeats` included (`next_batch`)."""
    return repeats + EXTRA_PROCESSES + (UNPINNED_EXTRA_PROCESSES if config.schedule == "tf" else 0)


def _entry_for(run: "SearchRun", config: Any, number: int) -> dict[str, Any]:
    """Trial `number`'s stored runs, or those of an earlier trial of the same config stopped mid-bracket
    (re-keyed to `number`: the retry goes on from them), or a new entry."""
    stored = stored_confirmations(run.main)
    entry = stored.get(str(number))
    if entry is not None:
        return entry
    key = run.space.table.canonical_key(config)
    for k, e in stored.items():
        if e.get("fresh_trial") and e.get("method") == METHOD and isinstance(e.get("config"), dict):
            try:
                same = run.space.table.canonical_key(run.space.table.from_dict(e["config"])) == key
            except ValueError:
                continue
            if same:
                del stored[k]
                stored[str(number)] = e
                run.main.set_user_attr(CONFIRMATIONS_ATTR, stored)
                return e
    return {}


def _store(run: "SearchRun", number: int, entry: dict[str, Any]) -> None:
    with run.ask_lock():
        stored = stored_confirmations(run.main)
        stored[str(number)] = entry
        run.main.set_user_attr(CONFIRMATIONS_ATTR, stored)


def measure_trial(run: "SearchRun", backend: "Backend", config: Any, number: int, *, gpu: str | None,
                  measure: Callable[..., Any] = run_worker, stop: Callable[[], bool] | None = None
                  ) -> FreshRuns | None:
    """Trial `number`: bracket `config`'s largest batch in fresh processes, each batch once (None: stopped).

    From the simulator's batch for the config (1 when it predicts none fits), or for the
    no-LMS baseline from the plain step's measured peaks (`SearchRun.plain_start`);
    the runs are stored after each process. A process that gives no verdict
    ends the bracket (`FreshRuns.no_verdict`: the trial's record says why).
    """
    s = run.settings
    with run.ask_lock():
        entry = _entry_for(run, config, number)
    pred = run.predict(config)
    runs = list(entry.get("runs") or []) if entry.get("method") == METHOD else []
    start, start_from = _start(run, entry, config, pred, fallback=(1, "simulator"))
    entry = {"config": config.to_dict(), "method": METHOD, "fresh_trial": True, "start": start,
             "start_from": start_from, "runs": runs, "closed": False, "repeats": 1}
    while True:
        batch = next_batch(runs, start=start, repeats=1, cap=s.max_batch, usable=run.usable,
                           slope=pred.slope_bytes_per_sample, max_processes=max_processes(config, 1))
        if batch is None:
            _store(run, number, {**entry, "runs": runs, "closed": True})
            return FreshRuns(tuple(runs), start)
        got = _run_once(run, backend, config, number, batch, len(runs) + 1, gpu=gpu, measure=measure, stop=stop,
                        workdir=Path(s.study_dir) / "trials" / f"{number:04d}" / f"process-{len(runs) + 1}")
        if got is None:
            return None
        out, outcome = got
        runs.append(out)
        _store(run, number, {**entry, "runs": runs})
        if VERDICT.get(out["status"]) is None:
            return FreshRuns(tuple(runs), start, no_verdict=outcome)


def confirm_recommendation(run: "SearchRun", backend: "Backend", *, gpu: str | None,
                           measure: Callable[..., Any] = run_worker) -> list[str]:
    """Repeat the would-be recommendation and the baseline in fresh processes, side by side; returns notes.

    In rounds: the recommendation rule (`tuner.policy.selection.select_recommendation`)
    applied to the fresh-process figures picks a config; it and the no-LMS
    baseline (and, first, the largest batch of the front, whose throughput the
    rule may have rejected on one process) get fresh processes in turn, one of
    each, until each bracket is closed and its batch fitted in ``--confirm``
    processes; repeated until the rule's pick is a repeated config (at most
    `MAX_ROUNDS`), the deadline passes (then a note says so), or the search is
    interrupted. A trial measured in-process (an older study) is bracketed here
    from the simulator's batch.
    """
    from ..policy.selection import baseline_trial, select_recommendation

    s = run.settings
    if s.confirm <= 0 or s.batch is not None:
        return []
    notes: list[str] = []
    done: set[int] = set()
    for _round in range(MAX_ROUNDS):
        trials = run.main.get_trials(deepcopy=False)
        chosen, front = select_recommendation(trials, prefer=s.prefer, min_throughput_ratio=s.min_throughput_ratio,
                                              confirmations=stored_confirmations(run.main))
        if chosen is None:
            return notes
        base = baseline_trial(trials)
        largest = max(front, key=lambda t: (t.values[0], t.values[1]))
        todo = [t for t in ((largest, base) if _round == 0 else (chosen, base, largest))
                if t is not None and t.user_attrs.get("measured") and t.user_attrs.get("status") == "ok"
                and t.number not in done]
        todo = list({t.number: t for t in todo}.values())
        if not todo:
            return notes
        if not _side_by_side(run, backend, todo, gpu=gpu, measure=measure, notes=notes):
            return notes
        done.update(t.number for t in todo)
    return notes


def _side_by_side(run: "SearchRun", backend: "Backend", trials: list[Any], *, gpu: str | None,
                  measure: Callable[..., Any], notes: list[str]) -> bool:
    """One fresh process of each of `trials` in turn until every bracket is closed (False: the deadline came)."""
    s = run.settings
    state = {}
    for t in trials:
        entry = stored_confirmations(run.main).get(str(t.number)) or {}
        runs = list(entry.get("runs") or []) if entry.get("method") == METHOD else []
        config = _config(t)
        pred = run.predict(config)
        # the simulator's batch, not the trial's: a trial's in-process batch depends on its probe path, and
        # fresh-process peaks are jagged in the batch (ResNet-50 64x64, n_tensors=170, lb=1, memory: 160
        # peaked 575.3 MB, over the 573.8 usable, 161 567.1, 175 573.3, each to the byte in every process)
        start, start_from = _start(run, entry, config, pred, fallback=(int(t.user_attrs["batch_size"]), "trial"))
        entry = {**entry, "start_from": start_from}
        state[t.number] = (t, config, entry, runs, start, pred)
    open_ = list(state)
    while open_:
        for number in list(open_):
            t, config, entry, runs, start, pred = state[number]
            batch = next_batch(runs, start=start, repeats=s.confirm, cap=s.max_batch, usable=run.usable,
                               slope=pred.slope_bytes_per_sample, max_processes=max_processes(config, s.confirm))
            base_entry = {**entry, "config": dict(t.user_attrs["config"]), "method": METHOD, "start": start,
                          "repeats": s.confirm}
            if not entry.get("fresh_trial"):
                base_entry["trial_batch"] = int(t.user_attrs["batch_size"])
            if batch is None:
                if runs:
                    _store(run, number, {**base_entry, "runs": runs, "closed": True})
                open_.remove(number)
                continue
            got = None
            if run.deadline is None or time.monotonic() < run.deadline:
                got = _run_once(run, backend, config, number, batch, len(runs) + 1, gpu=gpu, measure=measure)
            if got is None:  # the deadline passed before or while it ran
                notes.append(f"trial {number} was measured in {len(runs)} fresh processes, its bracket not yet "
                             "closed: the time limit (--timeout) was reached")
                return False
            runs.append({**got[0], "side_by_side": True})
            _store(run, number, {**base_entry, "runs": runs, "closed": False})
    return True


def _start(run: "SearchRun", entry: Mapping[str, Any], config: Any, pred: Any, *,
           fallback: tuple[int, str]) -> tuple[int, str]:
    """Where a config's bracket starts, and from what (``simulator``, ``measured peaks``, ``trial``): the stored
    start (a resumed bracket), else the plain step's measured peaks for the no-LMS baseline
    (`SearchRun.plain_start`), else the simulator's batch (`fallback` when it predicts none fits)."""
    if entry.get("start"):
        return int(entry["start"]), str(entry.get("start_from") or "simulator")
    plain = run.plain_start(config)
    if plain:
        return plain, "measured peaks"
    return (int(pred.batch), "simulator") if pred.batch > 0 else fallback


def _config(t: Any) -> Any:
    from lms.config import LMSConfig

    return LMSConfig.from_dict(t.user_attrs["config"])


def _run_once(run: "SearchRun", backend: "Backend", config: Any, number: int, batch: int, k: int, *,
              gpu: str | None, measure: Callable[..., Any], stop: Callable[[], bool] | None = None,
              workdir: Path | None = None) -> tuple[dict[str, Any], WorkerOutcome] | None:
    """Fresh worker `k` runs trial `number`'s `config` at `batch` from its first step (None: stopped).

    Its folder: `workdir`, else ``studies/<study>/confirm/<trial>-<k>``. Its timed steps stop at the first
    whose peak is over the budget (`MeasureRequest.stop_over_budget`)."""
    s = run.settings
    request = MeasureRequest(
        workload=s.model, options=dict(s.model_options), config=config.to_dict(), backend=backend.name,
        usable_bytes=run.usable, start_batch=batch, cap=batch, fixed_batch=True, warmup=s.warmup, steps=s.steps,
        seed=s.seed or 0, trial=number, confirm=k, stop_over_budget=True, **backend.worker_limits(s))
    workdir = workdir or Path(s.study_dir) / "confirm" / f"{number:04d}-{k}"
    log.info("trial %d (%s): fresh process %d at batch %d", number, run.space.table.short_label(config), k, batch)
    run.progress.activity(f"trial {number}: fresh process {k}, batch {batch}")

    def should_stop() -> bool:
        return (run.deadline is not None and time.monotonic() >= run.deadline) or (stop is not None and stop())

    outcome = measure(request, workdir=workdir, timeout_s=s.trial_timeout_s, env=backend.worker_env(gpu=gpu),
                      should_stop=should_stop)
    if outcome.status == "stopped":
        return None
    res = outcome.result
    out: dict[str, Any] = {"process": k, "batch": batch, "status": outcome.status, "reason": outcome.reason or "",
                           "wall_s": round(outcome.wall_s, 2), "workdir": str(workdir)}
    if res is not None:
        out.update(throughput=float(res.throughput or 0.0), peak_device_bytes=res.peak_device_bytes,
                   step_time_median_s=res.step_time_median_s,
                   timed_steps=len(res.step_times_s) if res.step_times_s else None)
        out.update({k: (list(v) if isinstance(v, tuple) else v) for k in RECORDED_FIGURES
                    if (v := getattr(res, k, None)) is not None})
    run.progress.process_done(outcome.wall_s)
    word = verdict_word(outcome.status)
    log.info("  trial %d, fresh process %d: batch %d %s (peak %s, %.0f s)", number, k, batch,
             {"fits": "fits", "no": "does not fit"}.get(word, f"gave no verdict ({outcome.status}: {out['reason']})"),
             format_bytes(out.get("peak_device_bytes")), outcome.wall_s)
    return out, outcome


def retime_in_fresh_processes(run: "SearchRun", backend: "Backend", config: Any, number: int, *, start: int,
                              gpu: str | None, measure: Callable[..., Any] = run_worker,
                              stop: Callable[[], bool] | None = None) -> list[dict[str, Any]] | None:
    """``--confirm 0``: a trial's timed run in fresh processes, when its probes fitted `start` but its in-process
    timed runs did not.

    The timed runs follow the probes in the trial's process, whose history can
    push their peak over the budget at every batch the search saw fit
    (ResNet-50 64x64, ``n_tensors=170, lb=1, schedule="memory"``: the probes
    fitted 183 at 573.5 MB of 573.8, the timed runs at 183 and three smaller
    batches peaked 575.5-588.7 MB). So the timed run goes to a fresh process
    (``studies/<study>/trials/<trial>/fresh-<k>``) at `start`, and, while it does
    not fit, lower (`next_batch`'s shrink step), at most `RETIME_PROCESSES`
    processes; it stops at the first that fits. Returns the runs (None: stopped).
    """
    pred = run.predict(config)
    runs: list[dict[str, Any]] = []
    batch: int | None = max(1, int(start))
    trial_dir = Path(run.settings.study_dir) / "trials" / f"{number:04d}"
    while batch is not None:
        k = len(runs) + 1
        got = _run_once(run, backend, config, number, batch, k, gpu=gpu, measure=measure, stop=stop,
                        workdir=trial_dir / f"fresh-{k}")
        if got is None:
            return None
        runs.append(got[0])
        if VERDICT.get(got[0]["status"]) is True:
            break
        batch = next_batch(runs, start=start, repeats=1, cap=batch, usable=run.usable,
                           slope=pred.slope_bytes_per_sample, max_processes=RETIME_PROCESSES)
    return runs
