"""Trial records: what one evaluated config left in the study (Optuna user_attrs, trials.csv columns).

Backends make them (`predicted_record`, here, from the simulator's
prediction, `tuner.backends.measured.measured_record` from a
worker's outcome); `counted` says which trials count toward ``--trials``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections import Counter
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from .batch import Prediction

__all__ = ["TrialRecord", "predicted_record", "counted", "REQUEUED_STATUSES", "INFEASIBLE", "CORRECTIONS_KEPT",
           "corrections_summary", "corrections_warning"]

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
    simulated = "simulate"  # SimulateBackend.name (tuner.backends.simulate)
    host = {"peak_host_bytes": pred.peak_host_bytes} if pred.peak_host_bytes is not None else {}
    if not pred.feasible:
        need = pred.min_bytes or pred.peak_bytes
        return TrialRecord(config, simulated, False, "infeasible", 0, 0.0, pred.peak_bytes,
                           f"simulator ({device})", pred.peak_bytes, 0.0,
                           constraint=max(need / usable - 1.0, 1e-6), reason=pred.reason,
                           extra={"predicted_batch": 0, "n_swapped": pred.n_swapped, **host,
                                  **({"limited_by": "host"} if pred.limited_by == "host" else {})})
    return TrialRecord(config, simulated, False, "ok", pred.batch, pred.throughput, pred.peak_bytes,
                       f"simulator ({device})", pred.peak_bytes, pred.throughput,
                       constraint=pred.peak_bytes / usable - 1.0,
                       reason="capped at --max-batch" if pred.capped else "",
                       extra={"predicted_batch": pred.batch, "predicted_step_time_s": pred.step_time_s,
                              "n_swapped": pred.n_swapped, **host, "limited_by": pred.limited_by})


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


# ---------------------------------------------------------------- what the equivalence check changed

#: Corrections a trial record keeps by name (all are counted by kind).
CORRECTIONS_KEPT = 5


def corrections_summary(corrections: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A trial record's account of the equivalence check's corrections (`lms.tf.corrections.Correction` dicts):
    ``n_corrections``, ``corrections_by_kind`` and the first `CORRECTIONS_KEPT` ``corrections``; {} for none."""
    if not corrections:
        return {}
    kinds = Counter(str(c.get("kind", "?")) for c in corrections)
    return {"n_corrections": len(corrections), "corrections_by_kind": dict(sorted(kinds.items())),
            "corrections": [{"kind": str(c.get("kind", "")), "tensor": str(c.get("tensor", "")),
                             "reason": str(c.get("reason", ""))[:200]} for c in corrections[:CORRECTIONS_KEPT]]}


def corrections_warning(lms_summary: Mapping[str, Any] | None) -> str:
    """Why a measured config's figures are not its plan's, or "".

    The equivalence check (`lms.tf.equivalence`) moves a trigger, or drops a swap-in or a recompute, when
    TensorFlow would optimize the step differently with it. The figures are still honest (they are what
    `lms` runs with this config, on this TensorFlow and device), but the config's name says more than ran:
    with every swap and recompute dropped, it ran as a step without LMS.
    """
    s = lms_summary or {}
    n = int(s.get("n_corrections") or 0)
    if n <= 0:
        return ""
    kinds = ", ".join(f"{k} {v}" for k, v in (s.get("corrections_by_kind") or {}).items())
    what = f"{n} correction{'s' if n != 1 else ''}" + (f" ({kinds})" if kinds else "")
    if not s.get("n_swapped") and not s.get("n_recomputed"):
        return (f"the equivalence check dropped this config's whole plan, {what}: TensorFlow optimizes the step "
                "differently with it, so it ran without LMS, and its figures are a step without LMS")
    return (f"the equivalence check changed this config's plan, {what}, leaving {s.get('n_swapped', 0)} "
            f"swapped and {s.get('n_recomputed', 0)} recomputed tensors, so that TensorFlow optimizes the step as "
            "without LMS; the figures are the corrected plan's, which is what lms runs with this config")
