"""Measure the recommendation again in fresh processes, one batch per process, and recommend what fits there.

A batch's peak depends on the process it runs in. TensorFlow's executor runs
the ops no edge orders in an order that differs from process to process (the
no-LMS baseline and ``schedule="tf"`` configs; a memory-scheduled step is
pinned whole, `lms.tf.exact`, and repeats to the byte), and TF's allocator
peak depends on the process's history: `AssignVariableOp` hands each assigned
variable (e.g. Keras's SGD momentum) the buffer its new value was computed in,
so the state that outlives a step moves, and a batch's peak depends on the
batches probed before it (ResNet-50 64x64, ``n_tensors=-1, lb=1,
schedule="memory"``: batch 170 peaked at 557.3 MiB after a probe at 137 and at
538.3 MiB after one at 160). A trial's batch search probes several batches in
one process, so its largest batch depends on where it started (the same config
measured 157, 160 and 166 in three searches whose first probes differed).

The user's training run is a fresh process whose first step is at its batch.
So after the trials the config the search would recommend and the no-LMS
baseline (the other side of the "x times larger batch" ratio) are measured
that way: each fresh worker process runs one batch, from its first step (the
warm-up and timed steps of ``--batch N``'s single run), and the batches are
bracketed from the simulator's batch for the config (`next_batch`: up or down
by the peak's distance to the budget, then between the largest batch that
fitted and the smallest that did not) until the two are 1 apart and the
largest batch that fitted has fitted in ``--confirm N`` processes. That batch
is recommended, with the throughput of its fastest process there and the
highest peak; a process that did not fit a batch seen to fit before makes the
bracket go on below it. Fresh-process peaks are jagged in the batch (one
pinned config: 160 did not fit, 161-175 did), so the bracket's answer depends
on where it starts: it starts where the trials' probe paths cannot move it,
and a config whose peak repeats across processes (memory-scheduled, pinned
whole, to the byte) gets the same runs, and the same batch, in every search.
Only the largest-batch goal is confirmed (at ``--batch N`` a trial is one such run).

The runs are stored on the study (user attr ``"confirmations"``: trial number
-> runs), so a resumed search goes on from them and ``tuner best`` shows them.
No TensorFlow here: the runs are `tuner.trial` workers.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from .budget import format_bytes
from .protocol import MeasureRequest
from .worker import run_worker

if TYPE_CHECKING:
    from .backends.base import Backend, SearchRun

__all__ = ["CONFIRMATIONS_ATTR", "METHOD", "confirm_recommendation", "confirmed_figures", "next_batch",
           "retime_in_fresh_processes"]

log = logging.getLogger(__name__)

CONFIRMATIONS_ATTR = "confirmations"
#: How the stored runs were made: one batch per fresh process (older studies stored down-searches; those are
#: measured again this way).
METHOD = "fresh-process-per-batch"
#: Fresh processes per confirmed trial beyond the ``--confirm`` repeats (the bracket usually closes in 3-5).
EXTRA_PROCESSES = 8
#: Fresh processes a trial's timed run may take when its in-process timed runs did not fit
#: (`retime_in_fresh_processes`).
RETIME_PROCESSES = 3
#: Rounds of (select with the confirmed figures, confirm what it points at); each confirms up to 3 configs.
MAX_ROUNDS = 3
#: What a confirmed figure is, in words (recommended.json's ``confirmation.rule``).
RULE = ("the largest batch that fitted the budget as the first batch of a fresh process, in each of the {n} fresh "
        "processes that ran it, with the next batch up seen not to fit (one batch per process: a batch's peak "
        "depends on the batches run before it in a process); throughput: its fastest process there (noise only "
        "slows a run down); peak: the highest there")

_VERDICT = {"ok": True, "infeasible": False, "oom": False}


def next_batch(runs: Sequence[Mapping[str, Any]], *, start: int, repeats: int, cap: int, usable: int,
               slope: float | None, max_processes: int) -> int | None:
    """The batch the next fresh process should run, or None: the bracket is closed (or the processes spent).

    `runs`: the processes so far (``batch``, ``status``, ``peak_device_bytes``); a status of ``ok`` fits,
    ``infeasible`` / ``oom`` does not, any other (killed, timed out) gives no verdict. A batch fits when
    every process that ran it fitted. The bracket: ``hi``, the smallest batch that did not fit, and ``lo``,
    the largest below it that did. Growing (nothing failed yet) steps by the headroom's worth of samples at
    `slope` (measured between two batches that fitted, when they are 5% apart), plus one (at most +25%);
    shrinking by the excess's worth (the same way; at most -50%); inside the bracket, the batch at
    which the two peaks' line meets `usable`, kept an eighth of the bracket from its ends (so it shrinks each
    time; peaks are close to linear in the batch, so the line is usually right within a sample).
    Closed: ``hi == lo + 1`` (or ``lo == cap``, or ``hi == 1``), then ``lo`` until it fitted `repeats` times.

        >>> r = [{"batch": 100, "status": "ok", "peak_device_bytes": 90}]
        >>> next_batch(r, start=100, repeats=1, cap=500, usable=100, slope=1.0, max_processes=9)
        111
    """
    if len(runs) >= max_processes:
        return None
    verdicts, peaks = _verdicts(runs)
    if not verdicts:
        return min(max(1, int(start)), cap)
    lo, hi, fitted, failed = _ends(verdicts)
    if lo is None:  # shrink: nothing fitted yet
        assert hi is not None
        if hi <= 1:
            return None
        above = [b for b in failed if b in peaks and b >= 1.05 * hi]
        if hi in peaks and above and peaks[min(above)] > peaks[hi]:  # the measured slope, as when growing
            slope = (peaks[min(above)] - peaks[hi]) / (min(above) - hi)
        step = (math.ceil((peaks[hi] - usable) / slope) if slope and hi in peaks and peaks[hi] > usable
                else math.ceil(hi / 8))
        return max(1, hi - max(1, min(step, hi // 2)))
    if hi is None and lo < cap:  # grow: nothing failed yet; aim just past where the peak meets `usable`
        below = [b for b in fitted if b in peaks and b <= 0.95 * lo]
        if lo in peaks and below and peaks[lo] > peaks[min(below)]:  # the measured slope, when far enough apart
            slope = (peaks[lo] - peaks[min(below)]) / (lo - min(below))
        step = (round((usable - peaks[lo]) / slope) + 1 if slope and lo in peaks and peaks[lo] <= usable
                else math.ceil(lo / 8))
        return min(cap, lo + max(1, min(step, math.ceil(lo / 4))))
    if hi is not None and hi - lo > 1:  # inside the bracket
        if lo in peaks and hi in peaks and peaks[hi] > peaks[lo]:
            guess = lo + math.floor((usable - peaks[lo]) * (hi - lo) / (peaks[hi] - peaks[lo]))
        else:
            guess = (lo + hi) // 2
        margin = max(1, (hi - lo) // 8)
        return min(hi - margin, max(lo + margin, guess))
    return lo if len(verdicts[lo]) < repeats else None


def _verdicts(runs: Sequence[Mapping[str, Any]]) -> tuple[dict[int, list[bool]], dict[int, int]]:
    """Per batch: the verdicts of the processes that gave one (`_VERDICT`), and the highest peak seen."""
    verdicts: dict[int, list[bool]] = {}
    peaks: dict[int, int] = {}
    for r in runs:
        ok = _VERDICT.get(str(r.get("status")))
        if ok is None:
            continue
        b = int(r["batch"])
        verdicts.setdefault(b, []).append(ok)
        if r.get("peak_device_bytes"):
            peaks[b] = max(peaks.get(b, 0), int(r["peak_device_bytes"]))
    return verdicts, peaks


def _ends(verdicts: Mapping[int, list[bool]]) -> tuple[int | None, int | None, list[int], list[int]]:
    """(lo, hi, the batches that fitted below hi, the batches that failed) of the bracket (see `next_batch`)."""
    failed = [b for b, v in verdicts.items() if not all(v)]
    hi = min(failed) if failed else None
    fitted = [b for b, v in verdicts.items() if all(v) and (hi is None or b < hi)]
    return (max(fitted) if fitted else None), hi, fitted, failed


def confirm_recommendation(run: "SearchRun", backend: "Backend", *, gpu: str | None,
                           measure: Callable[..., Any] = run_worker) -> list[str]:
    """Measure the would-be recommendation, the baseline and the largest batch again; returns notes.

    In rounds: first the front's largest batch and the no-LMS baseline are
    confirmed (see the module docstring); then the recommendation rule
    (`tuner.outputs.select_recommendation`) applied to the figures confirmed so
    far picks a config, which is confirmed if it was not; until the rule's pick
    is a confirmed config (at most `MAX_ROUNDS`), the deadline passes (then a note says so), or the search is
    interrupted. The largest batch takes part because the throughput rule
    compares throughputs measured minutes apart, on a machine whose speed moves
    (one search measured its no-LMS trial at 87.9 samples/s and its LMS trials
    at 63-66: 0.72x, and recommended no LMS, where other searches measured
    0.9-1.2x): its fresh processes and the baseline's, best of each, decide.
    """
    from .outputs import baseline_trial, select_recommendation

    s = run.settings
    if s.confirm <= 0 or s.batch is not None:
        return []
    notes: list[str] = []
    done: set[int] = set()
    for _round in range(MAX_ROUNDS):
        trials = run.main.get_trials(deepcopy=False)
        stored = _stored(run.main)
        chosen, front = select_recommendation(trials, prefer=s.prefer, min_throughput_ratio=s.min_throughput_ratio,
                                              confirmations=stored)
        if chosen is None:
            return notes
        base = baseline_trial(trials)
        largest = max(front, key=lambda t: (t.values[0], t.values[1]))
        # the largest batch and the baseline first: when the largest passes the throughput rule with
        # confirmed figures it is the pick, and the rule's first pick need not be measured again
        todo = [t for t in ((largest, base) if _round == 0 else (chosen, base, largest))
                if t is not None and t.user_attrs.get("measured") and t.user_attrs.get("status") == "ok"
                and t.number not in done]
        todo = list({t.number: t for t in todo}.values())
        if not todo:
            return notes
        for t in todo:
            if not _bracket(run, backend, t, gpu=gpu, measure=measure, notes=notes):
                return notes
            done.add(t.number)
    return notes


def _bracket(run: "SearchRun", backend: "Backend", t: Any, *, gpu: str | None, measure: Callable[..., Any],
             notes: list[str]) -> bool:
    """Run trial `t`'s fresh processes until `next_batch` says done (False: the deadline came first)."""
    s = run.settings
    entry = _stored(run.main).get(str(t.number)) or {}
    runs = list(entry.get("runs") or []) if entry.get("method") == METHOD else []
    pred = run.predict(_config(t))
    # The first process runs the simulator's batch for the config, not the trial's: the trial's depends on its
    # probe path, and fresh-process peaks are jagged in the batch (ResNet-50 64x64, n_tensors=170, lb=1,
    # memory: 160 peaked 575.3 MB, over the 573.8 usable, 161 567.1, 175 573.3, each to the byte in every
    # process), so a bracket started at the trial's 160 closed at 159 and one started at its 161 at 175.
    # From a start that does not depend on the trials a pinned config gets the same runs in every search.
    start = int(entry.get("start") or (pred.batch if pred.batch > 0 else t.user_attrs["batch_size"]))
    while True:
        batch = next_batch(runs, start=start, repeats=s.confirm, cap=s.max_batch,
                           usable=run.usable, slope=pred.slope_bytes_per_sample,
                           max_processes=s.confirm + EXTRA_PROCESSES)
        if batch is None:
            if runs and not (entry.get("closed") and len(entry.get("runs") or []) == len(runs)):
                with run.ask_lock():
                    stored = _stored(run.main)
                    stored[str(t.number)] = {**stored.get(str(t.number), {}), "closed": True}
                    run.main.set_user_attr(CONFIRMATIONS_ATTR, stored)
            return True
        outcome = None
        if run.deadline is None or time.monotonic() < run.deadline:
            outcome = _run_once(run, backend, _config(t), t.number, batch, len(runs) + 1, gpu=gpu, measure=measure)
        if outcome is None:  # the deadline passed before or while it ran
            notes.append(f"trial {t.number} was measured in {len(runs)} fresh processes, its bracket not yet "
                         "closed: the time limit (--timeout) was reached; resume the search to measure the rest")
            return False
        runs.append(outcome)
        with run.ask_lock():
            stored = _stored(run.main)
            stored[str(t.number)] = {"config": dict(t.user_attrs["config"]), "method": METHOD,
                                     "trial_batch": int(t.user_attrs["batch_size"]), "start": start, "runs": runs,
                                     "closed": False}
            run.main.set_user_attr(CONFIRMATIONS_ATTR, stored)


def _config(t: Any) -> Any:
    from lms.config import LMSConfig

    return LMSConfig.from_dict(t.user_attrs["config"])


def _stored(study: Any) -> dict[str, Any]:
    return {str(k): dict(v) for k, v in (study.user_attrs.get(CONFIRMATIONS_ATTR) or {}).items()}


def _run_once(run: "SearchRun", backend: "Backend", config: Any, number: int, batch: int, k: int, *,
              gpu: str | None, measure: Callable[..., Any], stop: Callable[[], bool] | None = None,
              workdir: Path | None = None) -> dict[str, Any] | None:
    """Fresh worker `k` runs trial `number`'s `config` at `batch` from its first step (None: stopped).

    Its folder: `workdir`, else ``studies/<study>/confirm/<trial>-<k>``."""
    s = run.settings
    request = MeasureRequest(
        workload=s.model, options=dict(s.model_options), config=config.to_dict(), backend=backend.name,
        usable_bytes=run.usable, start_batch=batch, cap=batch, fixed_batch=True, warmup=s.warmup, steps=s.steps,
        seed=s.seed or 0, trial=number, confirm=k, **backend.worker_limits(s))
    workdir = workdir or Path(s.study_dir) / "confirm" / f"{number:04d}-{k}"
    log.info("trial %d (%s): fresh process %d at batch %d", number, run.space.table.short_label(config), k, batch)

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
                   step_time_median_s=res.step_time_median_s)
    verdict = _VERDICT.get(outcome.status)
    log.info("  trial %d, fresh process %d: batch %d %s (peak %s)", number, k, batch,
             {True: "fits", False: "does not fit"}.get(verdict, f"gave no verdict ({outcome.status}: "
                                                                f"{out['reason']})"),
             format_bytes(out.get("peak_device_bytes")))
    return out


def retime_in_fresh_processes(run: "SearchRun", backend: "Backend", config: Any, number: int, *, start: int,
                              gpu: str | None, measure: Callable[..., Any] = run_worker,
                              stop: Callable[[], bool] | None = None) -> list[dict[str, Any]] | None:
    """A trial's timed run in fresh processes, when its probes fitted `start` but its in-process timed runs did not.

    The timed runs follow the probes in the trial's process, whose history can
    push their peak over the budget at every batch the search saw fit
    (ResNet-50 64x64, ``n_tensors=170, lb=1, schedule="memory"``: the probes
    fitted 183 at 573.5 MB of 573.8, the timed runs at 183 and three smaller
    batches peaked 575.5-588.7 MB; the same config fitted 175 as the first batch
    of a fresh process in every search). So the timed run goes to a fresh process
    (``studies/<study>/trials/<trial>/fresh-<k>``) at `start`, and, while it does
    not fit, lower (`next_batch`'s shrink step), at most `RETIME_PROCESSES`
    processes; it stops at the first that fits. Returns the runs (None: stopped).
    They give the trial its figures; a confirmation of the trial does not start
    from them (its start must not depend on the trial's probe path: `_bracket`).
    """
    pred = run.predict(config)
    runs: list[dict[str, Any]] = []
    batch: int | None = max(1, int(start))
    trial_dir = Path(run.settings.study_dir) / "trials" / f"{number:04d}"
    while batch is not None:
        k = len(runs) + 1
        out = _run_once(run, backend, config, number, batch, k, gpu=gpu, measure=measure, stop=stop,
                        workdir=trial_dir / f"fresh-{k}")
        if out is None:
            return None
        runs.append(out)
        if _VERDICT.get(out["status"]) is True:
            break
        batch = next_batch(runs, start=start, repeats=1, cap=batch, usable=run.usable,
                           slope=pred.slope_bytes_per_sample, max_processes=RETIME_PROCESSES)
    return runs


def confirmed_figures(trial: Any, confirmations: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Trial `trial`'s figures from its fresh processes (None: never re-measured this way, or nothing fitted).

    ``batch_size`` is the bracket's ``lo`` (`next_batch`); ``throughput`` and ``step_time_median_s`` those
    of its fastest process there (``process``: the machine's noise only slows a run down, as `timeit` says:
    one ResNet-50 64x64 baseline ran batch 25 at 32.1 and 67.7 samples/s in two processes);
    ``peak_device_bytes`` the highest peak there; ``closed`` whether the bracket was finished (False: the
    time limit came first; ``batch_size`` did fit a fresh process); ``tried`` every process's batch and
    verdict in order; ``fits`` how many processes fitted ``batch_size``; ``smallest_failing`` the bracket's
    ``hi`` (None: nothing failed); ``start`` the first process's batch (the simulator's for the config; None
    in older studies, which started at the trial's); ``unconfirmed`` the processes that gave no verdict
    (killed, timed out, failed).
    """
    entry = (confirmations or {}).get(str(trial.number))
    if not entry or entry.get("method") != METHOD or not entry.get("runs"):
        return None
    runs = list(entry["runs"])
    lo, hi, _, _ = _ends(_verdicts(runs)[0])
    if lo is None:
        return None
    at = [r for r in runs if r.get("status") == "ok" and int(r["batch"]) == lo]
    fastest = max(at, key=lambda r: (r.get("throughput") or 0.0, -r["process"]))
    peaks = [int(r["peak_device_bytes"]) for r in at if r.get("peak_device_bytes")]
    return {"batch_size": lo, "throughput": fastest.get("throughput") or 0.0,
            "peak_device_bytes": max(peaks) if peaks else None,
            "step_time_median_s": fastest.get("step_time_median_s"), "process": fastest["process"],
            "processes": len(runs), "fits": len(at), "smallest_failing": hi, "closed": bool(entry.get("closed")),
            "trial_batch": int(entry.get("trial_batch") or trial.user_attrs.get("batch_size") or 0),
            "start": entry.get("start"),
            "tried": [[int(r["batch"]), {True: "fits", False: "no"}.get(_VERDICT.get(str(r.get("status"))), "?")]
                      for r in runs],
            "runs": runs,
            "unconfirmed": [{"process": r["process"], "batch": r["batch"], "status": r.get("status"),
                             "reason": r.get("reason", "")}
                            for r in runs if _VERDICT.get(str(r.get("status"))) is None],
            "rule": RULE.format(n=len(at))}
