"""Trial records: what one evaluated config left in the study (Optuna user_attrs, trials.csv columns).

A record is made from the simulator's `tuner.batch.Prediction` (`predicted_record`)
or from a worker's `tuner.worker.WorkerOutcome` (`measured_record`); `counted`
says which trials count toward ``--trials``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .backends import Backend
from .backends.simulate import SimulateBackend
from .batch import Prediction
from .worker import WorkerOutcome

__all__ = ["TrialRecord", "predicted_record", "measured_record", "machine_error_record", "counted",
           "REQUEUED_STATUSES", "INFEASIBLE"]

#: Trial statuses that say nothing about the config: the trial is failed and its params queued again.
#: ``interrupted``: the search stopped (Ctrl-C, time limit, its process died); ``machine_error``: the
#: machine failed the trial (a folder turned read-only, a full disk, a worker that could not write its
#: result). Only failures of the config itself (oom, infeasible, its model code raising, a timeout) are final.
REQUEUED_STATUSES = ("interrupted", "machine_error")
#: The constraint value of a config that does not fit at all and has no peak to say by how much.
INFEASIBLE = 1.0


@dataclass(frozen=True)
class TrialRecord:
    """One evaluated config: the contract's trial record (Optuna user_attrs and trials.csv columns)."""

    config: Any
    backend: str
    measured: bool
    status: str
    batch_size: int
    throughput: float
    peak_device_bytes: int | None
    peak_source: str
    predicted_peak_bytes: int | None
    predicted_throughput: float | None
    constraint: float
    reason: str = ""
    failed: bool = False  # Optuna FAIL (an error or an interruption), not a result
    requeue: bool = False  # failed by the machine, not the config: FAIL it and queue the params again
    extra: Mapping[str, Any] = field(default_factory=dict)

    def user_attrs(self) -> dict[str, Any]:
        attrs = {
            "batch_size": self.batch_size, "throughput": self.throughput,
            "peak_device_bytes": self.peak_device_bytes, "peak_source": self.peak_source,
            "backend": self.backend, "measured": self.measured,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "predicted_throughput": self.predicted_throughput, "status": self.status, "reason": self.reason,
            "config": self.config.to_dict(), "constraint": [self.constraint],
        }
        attrs.update(self.extra)
        return attrs


def predicted_record(config: Any, pred: Prediction, *, usable: int, device: str) -> TrialRecord:
    """The simulator's verdict on `config` as a record (figures PREDICTED)."""
    simulated = SimulateBackend.name
    if not pred.feasible:
        need = pred.min_bytes or pred.peak_bytes
        return TrialRecord(config, simulated, False, "infeasible", 0, 0.0, pred.peak_bytes,
                           f"simulator ({device})", pred.peak_bytes, 0.0,
                           constraint=max(need / usable - 1.0, 1e-6), reason=pred.reason,
                           extra={"predicted_batch": 0, "n_swapped": pred.n_swapped})
    return TrialRecord(config, simulated, False, "ok", pred.batch, pred.throughput, pred.peak_bytes,
                       f"simulator ({device})", pred.peak_bytes, pred.throughput,
                       constraint=pred.peak_bytes / usable - 1.0,
                       reason="capped at --max-batch" if pred.capped else "",
                       extra={"predicted_batch": pred.batch, "predicted_step_time_s": pred.step_time_s,
                              "n_swapped": pred.n_swapped})


def measured_record(config: Any, outcome: WorkerOutcome, pred: Prediction, *, backend: Backend,
                    usable: int, trial_dir: Path) -> TrialRecord:
    """A measure worker's outcome as a record (figures MEASURED; the prediction beside them)."""
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


def counted(t: Any) -> bool:
    """Trials that count toward --trials: configs evaluated (finished, not interrupted, not a repeat).

    A repeat of an evaluated config (`duplicate_of`) is answered from the study
    at no cost and does not count; an interrupted trial, or one failed by the
    machine (`REQUEUED_STATUSES`), is queued again; a config drawn while another
    worker runs it is ``skipped`` (not counted).
    """
    state = getattr(t.state, "name", "")
    if state == "COMPLETE":
        return "duplicate_of" not in t.user_attrs
    return state == "FAIL" and t.user_attrs.get("status") not in (*REQUEUED_STATUSES, "skipped", None)
