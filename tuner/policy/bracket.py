"""The bracket of fresh processes, as arithmetic: which batch the next process runs, and what the runs say.

No processes, no TensorFlow: `tuner.backends.confirm` starts the workers and stores
their runs on the study (user attr `CONFIRMATIONS_ATTR`: trial number ->
entry); this module reads runs. A run is one fresh worker process at one
batch from its first step: ``{"process", "batch", "status", "peak_device_bytes",
"throughput", "step_time_median_s", ...}``; status ``ok`` fits, ``infeasible`` /
``oom`` does not (`VERDICT`), any other (killed, timed out) gives no verdict.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

__all__ = ["CONFIRMATIONS_ATTR", "METHOD", "RULE", "VERDICT", "next_batch", "start_from_peaks", "start_origin",
           "verdicts", "ends", "confirmed_figures", "stored_confirmations", "verdict_word"]

CONFIRMATIONS_ATTR = "confirmations"
#: How the stored runs were made: one batch per fresh process (older studies stored down-searches; those are
#: measured again this way).
METHOD = "fresh-process-per-batch"
#: What a confirmed figure is, in words (recommended.json's ``confirmation.rule``).
RULE = ("the largest batch that fitted the budget as the first batch of a fresh process, in each of the {n} fresh "
        "processes that ran it, with the next batch up seen not to fit (one batch per process: a batch's peak "
        "depends on the batches run before it in a process); throughput: its fastest process there (noise only "
        "slows a run down); peak: the highest there")

VERDICT = {"ok": True, "infeasible": False, "oom": False}


def verdict_word(status: Any) -> str:
    """``fits`` / ``no`` / ``?`` (no verdict: killed, timed out, failed) for a run's status."""
    return {True: "fits", False: "no"}.get(VERDICT.get(str(status)), "?")


def next_batch(runs: Sequence[Mapping[str, Any]], *, start: int, repeats: int, cap: int, usable: int,
               slope: float | None, max_processes: int) -> int | None:
    """The batch the next fresh process should run, or None: the bracket is closed (or the processes spent).

    `runs`: the processes so far (``batch``, ``status``, ``peak_device_bytes``). A batch fits when
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
    by_batch, peaks = verdicts(runs)
    if not by_batch:
        return min(max(1, int(start)), cap)
    lo, hi, fitted, failed = ends(by_batch)
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
    return lo if len(by_batch[lo]) < repeats else None


def start_from_peaks(peaks: Mapping[int, int], *, usable: int, cap: int) -> int | None:
    """The batch at which the line through two measured peaks meets `usable` (None: no such line).

    `peaks`: batch -> allocator peak in bytes of the plain step in TensorFlow's own order,
    measured by the trace worker while it profiled op times (``graph.json``'s
    ``plain_peaks``). The no-LMS baseline's bracket starts there rather than at the
    simulator's batch, which cannot know TF's order: ResNet-50 64x64 on the 547.2 MiB
    of the default emulated search, the simulator said 34-35 where fresh processes
    fitted 26-29, and each process the bracket spent stepping down from 34 cost about
    27 s (shrink steps are small: a process that does not fit stops at its first step
    over the budget, so its peak says little about how far over the batch is). Only a
    start: the fresh processes decide. The two batches furthest apart are used.

        >>> start_from_peaks({4: 400, 16: 1000}, usable=1500, cap=4096)
        26
    """
    pts = sorted((int(b), int(p)) for b, p in peaks.items() if int(b) >= 1 and int(p) > 0)
    if len(pts) < 2:
        return None
    (b0, p0), (b1, p1) = pts[0], pts[-1]
    if b1 == b0 or p1 <= p0:
        return None
    per_sample = (p1 - p0) / (b1 - b0)
    return max(1, min(int(cap), b0 + math.floor((usable - p0) / per_sample)))


def start_origin(conf: Mapping[str, Any]) -> str:
    """Whose batch a bracket's first process ran, in words: ``the simulator's`` (the default), ``the measured
    peaks'`` (the no-LMS baseline, `start_from_peaks`) or ``the trial's`` (`confirmed_figures`'s ``start_from``)."""
    return {"measured peaks": "the measured peaks'", "trial": "the trial's"}.get(str(conf.get("start_from") or ""),
                                                                                  "the simulator's")


def verdicts(runs: Sequence[Mapping[str, Any]]) -> tuple[dict[int, list[bool]], dict[int, int]]:
    """Per batch: the verdicts of the processes that gave one (`VERDICT`), and the highest peak seen."""
    by_batch: dict[int, list[bool]] = {}
    peaks: dict[int, int] = {}
    for r in runs:
        ok = VERDICT.get(str(r.get("status")))
        if ok is None:
            continue
        b = int(r["batch"])
        by_batch.setdefault(b, []).append(ok)
        if r.get("peak_device_bytes"):
            peaks[b] = max(peaks.get(b, 0), int(r["peak_device_bytes"]))
    return by_batch, peaks


def ends(by_batch: Mapping[int, list[bool]]) -> tuple[int | None, int | None, list[int], list[int]]:
    """(lo, hi, the batches that fitted below hi, the batches that failed) of the bracket (see `next_batch`)."""
    failed = [b for b, v in by_batch.items() if not all(v)]
    hi = min(failed) if failed else None
    fitted = [b for b, v in by_batch.items() if all(v) and (hi is None or b < hi)]
    return (max(fitted) if fitted else None), hi, fitted, failed


def stored_confirmations(study: Any) -> dict[str, Any]:
    """The study's stored runs: trial number (a string) -> entry (a copy)."""
    return {str(k): dict(v) for k, v in (study.user_attrs.get(CONFIRMATIONS_ATTR) or {}).items()}


def confirmed_figures(trial: Any, confirmations: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Trial `trial`'s figures from its fresh processes (None: never measured this way, or nothing fitted).

    ``batch_size`` is the bracket's ``lo`` (`next_batch`); ``throughput`` and ``step_time_median_s`` those
    of its fastest process there (``process``: the machine's noise only slows a run down, as `timeit` says:
    one ResNet-50 64x64 baseline ran batch 25 at 32.1 and 67.7 samples/s in two processes; on a shared 2-core
    machine fresh processes of one LMS config ran at about 29 or about 45 samples/s, one or the other, so a
    single process per config, even side by side, is not enough: every process at the batch counts);
    ``peak_device_bytes`` the highest peak there; ``closed`` whether the bracket was finished with every
    repeat asked (False: the time limit came first; ``batch_size`` did fit a fresh process); ``tried`` every
    process's batch and verdict in order; ``fits`` how many processes fitted ``batch_size``;
    ``smallest_failing`` the bracket's ``hi`` (None: nothing failed); ``start`` the first process's batch
    (the simulator's for the config, or for the no-LMS baseline the one its measured peaks point at:
    ``start_from`` says which; None in older studies, which started at the trial's); ``trial_batch``
    the batch the trial's own in-process search found (None: the trial was these processes, the default);
    ``unconfirmed`` the processes that gave no verdict (killed, timed out, failed).
    """
    entry = (confirmations or {}).get(str(trial.number))
    if not entry or entry.get("method") != METHOD or not entry.get("runs"):
        return None
    runs = list(entry["runs"])
    lo, hi, _, _ = ends(verdicts(runs)[0])
    if lo is None:
        return None
    at = [r for r in runs if r.get("status") == "ok" and int(r["batch"]) == lo]
    fastest = max(at, key=lambda r: (r.get("throughput") or 0.0, -r["process"]))
    peaks = [int(r["peak_device_bytes"]) for r in at if r.get("peak_device_bytes")]
    trial_batch = None if entry.get("fresh_trial") else int(entry.get("trial_batch")
                                                              or trial.user_attrs.get("batch_size") or 0)
    return {"batch_size": lo, "throughput": fastest.get("throughput") or 0.0,
            "peak_device_bytes": max(peaks) if peaks else None,
            "step_time_median_s": fastest.get("step_time_median_s"), "process": fastest["process"],
            "processes": len(runs), "fits": len(at), "smallest_failing": hi, "closed": bool(entry.get("closed")),
            "trial_batch": trial_batch, "start": entry.get("start"),
            "start_from": entry.get("start_from") or ("simulator" if entry.get("start") else None),
            "tried": [[int(r["batch"]), verdict_word(r.get("status"))] for r in runs],
            "runs": runs,
            "unconfirmed": [{"process": r["process"], "batch": r["batch"], "status": r.get("status"),
                             "reason": r.get("reason", "")}
                            for r in runs if VERDICT.get(str(r.get("status"))) is None],
            "rule": RULE.format(n=len(at))}
