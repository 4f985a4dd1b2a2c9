"""Hand-built Optuna studies for the report tests, following the trial-record contract.

`known_study` has answers worked out by hand (see `KNOWN`): which trials are on
each Pareto front, which is the no-LMS baseline, which one is recommended.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution

from lms.config import LMSConfig

GiB = 1 << 30
MiB = 1 << 20
BUDGET = 1 * GiB

DISTRIBUTIONS = {
    "n_tensors": IntDistribution(-1, 64),
    "lb": IntDistribution(1, 10),
    "fuse_swapins": CategoricalDistribution([False, True]),
}


USABLE = int(BUDGET * 0.95)  # the search keeps a 5% safety margin


def record(*, n_tensors: int, lb: int = 1, batch: int, throughput: float | None, peak: int | None,
           status: str = "ok", reason: str = "", backend: str = "simulate", measured: bool = False,
           predicted_peak: int | None = None, fuse_swapins: bool = False,
           predicted_batch: int | None = None, predicted_throughput: float | None = None,
           **knobs: Any) -> dict[str, Any]:
    """One trial's user_attrs as the tuner writes them (`tuner.policy.records.TrialRecord.user_attrs`).

    The constraint is ``peak / usable - 1`` (<= 0 when it fits), positive for a failure.
    `knobs`: more `LMSConfig` fields (``schedule="memory"``, ``recompute="cheap"``, ...).
    """
    config = LMSConfig(n_tensors=n_tensors, lb=lb, fuse_swapins=fuse_swapins, **knobs).to_dict()
    if status == "ok":
        constraint = (peak or 0) / USABLE - 1.0
    else:
        constraint = max((peak or predicted_peak or 0) / USABLE - 1.0, 1.0 if peak is None else 1e-6)
    return {
        "batch_size": batch, "throughput": throughput, "peak_device_bytes": peak,
        "peak_source": "simulator (V100-16GB)" if backend == "simulate" else "tf-bfc-cpu", "backend": backend,
        "measured": measured, "predicted_peak_bytes": predicted_peak if predicted_peak is not None else peak,
        "predicted_throughput": throughput if predicted_throughput is None else predicted_throughput,
        "status": status, "reason": reason, "config": config, "constraint": [constraint],
        "predicted_batch": batch if predicted_batch is None else predicted_batch,
    }


def add_trials(study: optuna.Study, records: Sequence[dict[str, Any]]) -> None:
    """Add finished trials the way the search leaves them: values, params, record, constraint."""
    for attrs in records:
        cfg = attrs["config"]
        params = {"n_tensors": cfg["n_tensors"], "lb": cfg["lb"], "fuse_swapins": cfg["fuse_swapins"]}
        values = [float(attrs["batch_size"]), float(attrs["throughput"] or 0.0)]
        trial = optuna.trial.create_trial(
            state=optuna.trial.TrialState.COMPLETE, values=values, params=params,
            distributions=DISTRIBUTIONS, user_attrs=attrs, constraints={"memory": attrs["constraint"][0]})
        study.add_trial(trial)


# Trial number -> record. Worked out by hand:
# throughput vs batch (maximize both), feasible trials only:
#   #0 (8, 100) #1 (32, 70) #2 (24, 90) #3 (16, 85) #6 (24, 90)
#   #3 is dominated by #2; #2 and #6 tie (both stay); front = {0, 1, 2, 6}.
# throughput vs peak (minimize peak, maximize throughput):
#   #0 (0.50 GiB, 100) dominates everything slower and bigger: #1 (0.95, 70), #2 (0.93, 90),
#   #3 (0.94, 85), #6 (0.80, 90) -> front = {0}.
KNOWN_RECORDS = [
    record(n_tensors=0, batch=8, throughput=100.0, peak=GiB // 2),                            # 0 baseline
    record(n_tensors=-1, lb=1, batch=32, throughput=70.0, peak=int(0.95 * GiB)),              # 1
    record(n_tensors=10, lb=3, batch=24, throughput=90.0, peak=int(0.93 * GiB)),              # 2 recommended
    record(n_tensors=5, lb=1, batch=16, throughput=85.0, peak=int(0.94 * GiB)),               # 3
    record(n_tensors=20, lb=5, batch=0, throughput=0.0, peak=None, status="oom",
           reason="batch 40 does not fit: out of memory", predicted_peak=int(1.2 * GiB)),     # 4
    record(n_tensors=-1, lb=8, batch=0, throughput=0.0, peak=int(1.1 * GiB), status="infeasible",
           reason="batch 1 does not fit: peak 1181116006 bytes > usable 1020054732 bytes"),   # 5
    record(n_tensors=10, lb=5, batch=24, throughput=90.0, peak=int(0.80 * GiB)),              # 6
]
KNOWN = {
    "front_batch": [0, 2, 6, 1],     # sorted by batch, then throughput, then trial number
    "front_memory": [0],
    "baseline": 0,
    "recommended": 2,
    "failed": [4, 5],
}


ENVIRONMENT = {"hostname": "build-7", "python": "3.11.9", "platform": "Linux-6.1-x86_64", "cpu": "Xeon",
               "cpu_count": 2, "host_memory_bytes": 8 << 30, "tensorflow": "2.21.0",
               "tensorflow_distribution": "tensorflow-cpu", "keras": "3.15.0", "optuna": "5.0.0",
               "tflms_tuner": "0.1.0", "device_name": "none (simulated)", "driver_version": None}


def recommendation_doc(records: Sequence[dict[str, Any]], number: int, *, budget: int = BUDGET,
                       with_trial_number: bool = True, environment: dict | None = None) -> dict[str, Any]:
    """recommended.json as `tuner.outputs.build_recommendation` writes it."""
    r = records[number]
    label = "predicted (simulator, device profile V100-16GB)"
    doc = {"schema": "tuner.recommendation", "schema_version": 1, "created": "2026-01-02T03:04:05+00:00",
           "study": "known", "model": "mlp", "model_options": {}, "config": r["config"],
           "batch_size": r["batch_size"], "throughput": r["throughput"],
           "peak_device_bytes": r["peak_device_bytes"], "peak_source": r["peak_source"], "budget_bytes": budget,
           "usable_bytes": USABLE, "safety_margin": 0.05, "budget_source": "--budget 1GiB",
           "backend": r["backend"], "measured": r["measured"],
           "sources": {"batch_size": label, "throughput": label, "peak_device_bytes": label, "predicted": label},
           "predicted": {"batch_size": r["batch_size"], "throughput": r["throughput"],
                         "peak_device_bytes": r["predicted_peak_bytes"], "device_profile": "V100-16GB"},
           "selection": {"prefer": "batch", "min_throughput_ratio": 0.5,
                         "rule": "largest batch on the Pareto front with throughput >= 0.5 x the front's best"},
           "environment": environment or dict(ENVIRONMENT), "notes": []}
    if with_trial_number:
        doc["trial"] = number
    return doc


def make_study(root: Path, name: str, records: Sequence[dict[str, Any]], *, recommended: int | None = None,
               study_attrs: dict[str, Any] | None = None, storage: str | None = None,
               folder: str | None = None) -> tuple[str, Path]:
    """A study in ``root/studies/<name>/study.db`` (or `storage`) plus its recommended.json.

    Returns (storage URL, studies dir).
    """
    studies = root / "studies"
    study_dir = studies / (folder or name)
    study_dir.mkdir(parents=True, exist_ok=True)
    url = storage or f"sqlite:///{study_dir / 'study.db'}"
    study = optuna.create_study(study_name=name, storage=url, directions=["maximize", "maximize"])
    tuner = {"model": "mlp", "model_options": {}, "backend": "simulate", "device": "V100-16GB",
             "safety_margin": 0.05, "max_batch": 4096, "budget_bytes": BUDGET, "budget_source": "--budget 1GiB",
             "schema_version": 1, "seed": 0, "sampler": "tpe",
             "command_line": ["python", "-m", "tuner", "search", "--study", name, "--model", "mlp",
                              "--backend", "simulate", "--budget", "1GiB"]}
    tuner.update((study_attrs or {}).get("tuner", {}))
    attrs = {"tuner": tuner, "role": "main"}
    attrs.update({k: v for k, v in (study_attrs or {}).items() if k != "tuner"})
    for k, v in attrs.items():
        study.set_user_attr(k, v)
    add_trials(study, records)
    if recommended is not None:
        (study_dir / "recommended.json").write_text(json.dumps(recommendation_doc(records, recommended)))
    return url, studies
