"""Measure the recommendation again in fresh processes, and recommend what fitted in every one of them.

TensorFlow's executor runs the ops no edge orders in an order that follows where
the graph's edges happen to sit in memory, and that differs from process to
process (on CPU oneDNN's layout pass rebuilds nodes too). The same config's
peak, and so its largest batch, moved between processes: on the emulated device
``n_tensors=-1, lb=1, schedule="memory"`` measured 136 in one fresh process and
188 in another (issue 14), before such steps were pinned whole (`lms.tf.exact`:
one chain through every op of TF's optimized graph; since then that config
measured 148 in each of three processes). What still moves: the no-LMS
baseline and ``schedule="tf"`` configs run in TF's order, a step that cannot be
pinned whole keeps the partial pins, GPUs pin in part, and TF's allocator peak
depends on the process's history (a few % on ResNet-50): `AssignVariableOp`
hands each assigned variable (e.g. Keras's SGD momentum) the buffer its new
value was computed in, so the state that outlives a step moves, and a batch's
peak depends on the batches probed before it in the process (batch 170 of
ResNet-50 64x64: 557.3 vs 538.3 MiB after two probe paths). A batch seen to
fit in one process can fail in the user's.

So after the trials, the config the search would recommend and the no-LMS
baseline (the other side of the "x times larger batch" ratio) are measured
again in `SearchSettings.confirm` more fresh worker processes
(``--confirm N``), each searching down from the batch its trial found, never
above it; the recommendation reports the smallest largest batch (with that
process's throughput and peak) and lists every process's figures. Only the
largest-batch goal is confirmed (at ``--batch N`` a trial is one timed run).

The runs are stored on the study (user attr ``"confirmations"``: trial number
-> runs), so a resumed search does not measure them again and ``tuner best``
shows them. No TensorFlow here: the runs are `tuner.trial` workers.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from .budget import format_bytes
from .protocol import MeasureRequest
from .worker import run_worker

if TYPE_CHECKING:
    from .backends.base import Backend, SearchRun

__all__ = ["CONFIRMATIONS_ATTR", "confirm_recommendation", "confirmed_figures"]

log = logging.getLogger(__name__)

CONFIRMATIONS_ATTR = "confirmations"
#: What a confirmed figure is, in words (recommended.json's ``confirmation.rule``).
RULE = ("the smallest largest batch of {n} fresh processes (TensorFlow orders the ops no edge orders "
        "differently in each process, so one config's peak varies), with that process's throughput and peak")


def confirm_recommendation(run: "SearchRun", backend: "Backend", *, gpu: str | None,
                           measure: Callable[..., Any] = run_worker) -> list[str]:
    """Measure the would-be recommendation and the baseline again (see the module docstring); returns notes.

    Runs until each has ``run.settings.confirm`` re-measurements stored, the
    deadline passes (then a note says so), or the search is interrupted.
    """
    from .outputs import baseline_trial, select_recommendation

    s = run.settings
    if s.confirm <= 0 or s.batch is not None:
        return []
    trials = run.main.get_trials(deepcopy=False)
    chosen, _ = select_recommendation(trials, prefer=s.prefer, min_throughput_ratio=s.min_throughput_ratio)
    if chosen is None or not chosen.user_attrs.get("measured"):
        return []
    todo = [chosen]
    base = baseline_trial(trials)
    if (base is not None and base.number != chosen.number and base.user_attrs.get("measured")
            and base.user_attrs.get("status") == "ok"):
        todo.append(base)
    notes: list[str] = []
    for t in todo:
        runs = list(_stored(run.main).get(str(t.number), {}).get("runs") or [])
        for k in range(len(runs) + 1, s.confirm + 1):
            if run.deadline is not None and time.monotonic() >= run.deadline:
                notes.append(f"trial {t.number} was measured in {len(runs) + 1} of {s.confirm + 1} processes: "
                             "the time limit (--timeout) was reached; resume the search to measure the rest")
                return notes
            outcome = _measure_again(run, backend, t, k, gpu=gpu, measure=measure)
            if outcome is None:  # stopped at the deadline while it ran
                notes.append(f"trial {t.number} was measured in {len(runs) + 1} of {s.confirm + 1} processes: "
                             "the time limit (--timeout) was reached; resume the search to measure the rest")
                return notes
            runs.append(outcome)
            with run.ask_lock():
                stored = _stored(run.main)
                stored[str(t.number)] = {"config": dict(t.user_attrs["config"]),
                                         "trial_batch": int(t.user_attrs["batch_size"]), "runs": runs}
                run.main.set_user_attr(CONFIRMATIONS_ATTR, stored)
    return notes


def _stored(study: Any) -> dict[str, Any]:
    return {str(k): dict(v) for k, v in (study.user_attrs.get(CONFIRMATIONS_ATTR) or {}).items()}


def _measure_again(run: "SearchRun", backend: "Backend", t: Any, k: int, *, gpu: str | None,
                   measure: Callable[..., Any]) -> dict[str, Any] | None:
    """One fresh worker: the largest batch up to trial `t`'s, and the timed run there (None: stopped)."""
    from lms.config import LMSConfig

    s, a = run.settings, t.user_attrs
    config = LMSConfig.from_dict(a["config"])
    batch = int(a["batch_size"])
    pred = run.predict(config)
    request = MeasureRequest(
        workload=s.model, options=dict(s.model_options), config=config.to_dict(), backend=backend.name,
        usable_bytes=run.usable, start_batch=batch, cap=batch, slope_bytes_per_sample=pred.slope_bytes_per_sample,
        warmup=s.warmup, steps=s.steps, seed=s.seed or 0, trial=t.number, confirm=k)
    workdir = Path(s.study_dir) / "confirm" / f"{t.number:04d}-{k}"
    log.info("confirming trial %d (%s): process %d of %d, largest batch up to %d", t.number,
             run.space.table.short_label(config), k + 1, s.confirm + 1, batch)

    def should_stop() -> bool:
        return run.deadline is not None and time.monotonic() >= run.deadline

    outcome = measure(request, workdir=workdir, timeout_s=s.trial_timeout_s, env=backend.worker_env(gpu=gpu),
                      should_stop=should_stop)
    if outcome.status == "stopped":
        return None
    res = outcome.result
    out: dict[str, Any] = {"process": k, "status": outcome.status, "reason": outcome.reason or "",
                           "wall_s": round(outcome.wall_s, 2), "workdir": str(workdir)}
    if res is not None:
        out.update(batch_size=int(res.batch_size or 0), throughput=float(res.throughput or 0.0),
                   peak_device_bytes=res.peak_device_bytes, step_time_median_s=res.step_time_median_s)
    log.info("  trial %d, process %d: %s", t.number, k + 1,
             f"largest batch {out['batch_size']} (peak {format_bytes(out.get('peak_device_bytes'))})"
             if out.get("batch_size") else f"{outcome.status}: {out['reason']}")
    return out


def confirmed_figures(trial: Any, confirmations: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Trial `trial`'s figures over all its processes (None: never re-measured).

    ``batch_size`` / ``throughput`` / ``peak_device_bytes`` / ``step_time_median_s`` are those of the
    process with the smallest largest batch (the slower one on a tie); ``runs`` lists every process
    (process 0 is the trial itself); ``unconfirmed`` the re-measurements that gave no verdict on memory
    (killed, timed out, failed) or found no batch that fits.
    """
    entry = (confirmations or {}).get(str(trial.number))
    if not entry or not entry.get("runs"):
        return None
    a = trial.user_attrs
    first = {"process": 0, "status": a.get("status"), "batch_size": int(a.get("batch_size") or 0),
             "throughput": float(a.get("throughput") or 0.0), "peak_device_bytes": a.get("peak_device_bytes"),
             "step_time_median_s": a.get("step_time_median_s")}
    runs = [first, *entry["runs"]]
    fitted = [r for r in runs if r.get("status") == "ok" and (r.get("batch_size") or 0) > 0]
    worst = min(fitted, key=lambda r: (r["batch_size"], r.get("throughput") or 0.0))
    unconfirmed = [r for r in runs[1:] if r not in fitted]
    return {"batch_size": worst["batch_size"], "throughput": worst.get("throughput") or 0.0,
            "peak_device_bytes": worst.get("peak_device_bytes"), "step_time_median_s": worst.get("step_time_median_s"),
            "process": worst["process"], "processes": len(runs),
            "batch_sizes": [r.get("batch_size") or 0 for r in runs], "runs": runs,
            "unconfirmed": [{"process": r["process"], "status": r.get("status"), "reason": r.get("reason", "")}
                            for r in unconfirmed],
            "rule": RULE.format(n=len(runs))}
