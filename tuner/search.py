"""The search: a plain Optuna study over the LMS knobs, two objectives, a memory constraint.

Search space (`SearchSpace`; every value a TFLMS knob, so optuna-dashboard shows them):

    n_tensors         0 .. all candidates, in 8 equal steps (0 = LMS off, the top = all)
    lb                1, 4, 7, 10, 13        (swap-in trigger distance, levels)
    fuse_swapins      False, True
    ctrld_strategy    chain_rule, direct_order
    swap_branches     False, True
    branch_threshold  10, 25, 40             (only when swap_branches)

``ub`` stays at its TFLMS default (10000): the planner takes the nearest
trigger at or beyond ``lb`` anyway, so a smaller ``ub`` only drops swaps, which
``n_tensors`` already controls.

Objectives: maximise the largest batch that fits the budget, and maximise
throughput (samples/s) at that batch; the peak device memory is recorded. A
config that does not fit at any batch is a COMPLETE trial with values (0, 0)
and a positive constraint (``trial.set_constraint``, read by TPE and NSGA-II),
never a silent failure.

Sampler: multivariate TPE. ``--trials`` counts configs evaluated: when the
sampler proposes a config the study already has, the stored result is told at
no cost, and a random config not evaluated yet is queued next (without this,
TPE sometimes settled on a known point and missed the far end of the front;
see ``benchmarks/tuner_efficiency.py``).

Backends:
- ``simulate``: every trial is predicted in-process by `lms.simulator` on the
  traced graph (figures are PREDICTED).
- ``emulated`` / ``gpu``: first a screening study ``<study>.simulated`` is
  simulated, its predicted Pareto front is queued (after the no-LMS baseline
  and the TFLMS defaults) into the main study, and every main-study trial is a
  real run in a subprocess (`tuner.trial`): the simulator skips configs it
  predicts cannot fit and seeds the batch search, the worker measures (figures
  are MEASURED).

The graph is traced once per study by a worker (TensorFlow stays out of this
process) and cached as ``studies/<study>/graph.json``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import datetime
import itertools
import json
import logging
import math
import os
import random
import signal
import socket
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from lms.config import LMSConfig

from .batch import Prediction, predict_max_batch, usable_bytes
from .budget import format_bytes
from .progress import Progress
from .storage import StorageSpec, open_storage, storage_lock
from .trial import WorkerOutcome, run_worker, worker_env

__all__ = [
    "SearchSpace", "SearchSettings", "SearchOutcome", "TrialRecord", "SearchError", "BadInput",
    "run_search", "load_graph", "canonical_key", "DIRECTIONS", "OBJECTIVES", "SCREEN_SUFFIX",
    "optimize", "make_sampler", "pareto_picks", "study_settings_conflict", "recover_stale_trials",
    "derive_emulated_budget", "describe_user_workload",
]

log = logging.getLogger(__name__)

OBJECTIVES = ("batch_size", "throughput")
DIRECTIONS = ("maximize", "maximize")
SCREEN_SUFFIX = ".simulated"
STRATEGIES = ("chain_rule", "direct_order")
# Skip a real run only when the simulator's batch-1 peak exceeds the usable budget by this much:
# the simulator is within about 10-15% of measured peaks, a near miss is worth measuring.
SIM_SKIP_TOLERANCE = 0.15
_MAX_CONSECUTIVE_ERRORS = 3
#: Trial statuses that say nothing about the config: the trial is failed and its params queued again.
#: ``interrupted``: the search stopped (Ctrl-C, time limit, its process died); ``machine_error``: the
#: machine failed the trial (a folder turned read-only, a full disk, a worker that could not write its
#: result). Only failures of the config itself (oom, infeasible, its model code raising, a timeout) are final.
REQUEUED_STATUSES = ("interrupted", "machine_error")
_INFEASIBLE = 1.0
_ASK_LOCK = threading.Lock()


class SearchError(RuntimeError):
    """The search could not go on (exit code 1)."""


class BadInput(ValueError):
    """Something the user gave is wrong (exit code 2, nothing written)."""


# ==================================================================== search space

@dataclass(frozen=True)
class SearchSpace:
    """The knobs searched and their discrete values (also the benchmark's exhaustive grid).

    Attributes:
        n_candidates: swap candidates in the graph (`lms.planner.find_candidates`).
        n_tensor_levels: steps from 0 to all candidates.
        lb_low / lb_high / lb_step: ``lb`` values.
        branch_low / branch_high / branch_step: ``branch_threshold`` values.
    """

    n_candidates: int
    n_tensor_levels: int = 8
    lb_low: int = 1
    lb_high: int = 13
    lb_step: int = 3
    branch_low: int = 10
    branch_high: int = 40
    branch_step: int = 15

    @property
    def n_tensor_step(self) -> int:
        levels = max(1, min(self.n_tensor_levels, self.n_candidates))
        return max(1, math.ceil(self.n_candidates / levels))

    @property
    def n_tensor_high(self) -> int:
        step = self.n_tensor_step
        return step * max(1, math.ceil(self.n_candidates / step))

    def suggest(self, trial: Any) -> LMSConfig:
        """Ask `trial` for every knob and return the config."""
        params = {
            "n_tensors": trial.suggest_int("n_tensors", 0, self.n_tensor_high, step=self.n_tensor_step),
            "lb": trial.suggest_int("lb", self.lb_low, self.lb_high, step=self.lb_step),
            "fuse_swapins": trial.suggest_categorical("fuse_swapins", [False, True]),
            "ctrld_strategy": trial.suggest_categorical("ctrld_strategy", list(STRATEGIES)),
            "swap_branches": trial.suggest_categorical("swap_branches", [False, True]),
        }
        if params["swap_branches"]:
            params["branch_threshold"] = trial.suggest_int(
                "branch_threshold", self.branch_low, self.branch_high, step=self.branch_step)
        return self.config_of(params)

    def config_of(self, params: Mapping[str, Any]) -> LMSConfig:
        """The canonical `LMSConfig` of a parameter set (off: all knobs at defaults; all: -1)."""
        n = int(params["n_tensors"])
        if n == 0:
            return LMSConfig(n_tensors=0)
        swap_branches = bool(params.get("swap_branches", False))
        return LMSConfig(
            n_tensors=-1 if n >= self.n_candidates else n, lb=int(params.get("lb", 1)),
            fuse_swapins=bool(params.get("fuse_swapins", False)),
            ctrld_strategy=str(params.get("ctrld_strategy", "chain_rule")), swap_branches=swap_branches,
            branch_threshold=int(params.get("branch_threshold", 0)) if swap_branches else 0)

    def baseline_params(self) -> dict[str, Any]:
        """No LMS: the reference every other trial is compared with."""
        return {"n_tensors": 0, "lb": self.lb_low, "fuse_swapins": False, "ctrld_strategy": "chain_rule",
                "swap_branches": False}

    def tflms_default_params(self) -> dict[str, Any]:
        """TFLMS's defaults: every candidate, lb=1, chain_rule, no fusing, no branches."""
        return {**self.baseline_params(), "n_tensors": self.n_tensor_high}

    def grid(self) -> list[dict[str, Any]]:
        """Every parameter combination (the exhaustive grid of this space)."""
        out = []
        for n, lb, fuse, strategy in itertools.product(
                range(0, self.n_tensor_high + 1, self.n_tensor_step),
                range(self.lb_low, self.lb_high + 1, self.lb_step), (False, True), STRATEGIES):
            out.append({"n_tensors": n, "lb": lb, "fuse_swapins": fuse, "ctrld_strategy": strategy,
                        "swap_branches": False})
            for bt in range(self.branch_low, self.branch_high + 1, self.branch_step):
                out.append({"n_tensors": n, "lb": lb, "fuse_swapins": fuse, "ctrld_strategy": strategy,
                            "swap_branches": True, "branch_threshold": bt})
        return out

    @property
    def n_distinct(self) -> int:
        """Distinct configs in the space (grid points that plan differently)."""
        return len({canonical_key(self.config_of(p)) for p in self.grid()})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def canonical_key(config: LMSConfig) -> str:
    """Identical for configs that plan identically (e.g. every ``n_tensors=0`` config)."""
    if not config.enabled:
        config = LMSConfig(n_tensors=0)
    elif not config.swap_branches:
        config = config.replace(branch_threshold=0)
    return json.dumps(config.to_dict(), sort_keys=True)


# ==================================================================== settings

@dataclass(frozen=True)
class SearchSettings:
    """Everything `run_search` needs, validated by the CLI.

    Attributes:
        study: study name (a plain folder name).
        model: workload spec (built-in name or ``module:function``).
        model_options: options for the workload factory.
        backend: ``gpu`` | ``emulated`` | ``simulate``.
        budget_bytes: device memory budget; ``None``: derive (emulated, see `derive_emulated_budget`).
        budget_source: how the budget was chosen, for people.
        device: simulator device profile name.
        trials: trials the main study should have (real runs on gpu/emulated).
        screen_trials: simulated screening trials before real runs (gpu/emulated).
        timeout_s: wall-clock limit of this invocation (None: none).
        trial_timeout_s: limit of one real trial.
        seed: sampler seed (None: random).
        steps / warmup: timed and warm-up steps of the final measurement.
        safety_margin: fraction of the budget kept free.
        max_batch: largest batch considered.
        sampler: ``tpe`` | ``nsga2`` | ``random``.
        prefer / min_throughput_ratio: how the recommendation is picked (see `tuner.outputs`).
        gpu: GPU index or UUID for workers (gpu backend).
        gpus: several GPUs: one trial worker on each, in parallel (gpu backend).
        workers: parallel trial workers on the CPU (emulated backend; they share the cores, so
            their timings interfere).
        storage: where the study lives.
        studies_dir: outputs folder root (``studies/``).
        notes: adjustments made to the user's input (printed and stored).
    """

    study: str
    model: str
    model_options: Mapping[str, Any]
    backend: str
    budget_bytes: int | None
    budget_source: str
    device: str
    trials: int
    screen_trials: int
    storage: StorageSpec
    studies_dir: Path
    timeout_s: float | None = None
    trial_timeout_s: float = 600.0
    seed: int | None = None
    steps: int = 5
    warmup: int = 2
    safety_margin: float = 0.05
    max_batch: int = 4096
    sampler: str = "tpe"
    prefer: str = "batch"
    min_throughput_ratio: float = 0.8
    gpu: str | None = None
    gpus: tuple[str, ...] = ()
    workers: int = 1
    workload: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def study_dir(self) -> Path:
        return self.studies_dir / self.study

    @property
    def measured(self) -> bool:
        return self.backend in ("gpu", "emulated")

    def identity(self) -> dict[str, Any]:
        """What must not change when a study is resumed."""
        return {"model": self.model, "model_options": dict(self.model_options), "backend": self.backend,
                "device": self.device, "safety_margin": self.safety_margin, "max_batch": self.max_batch}


def study_settings_conflict(stored: Mapping[str, Any] | None, settings: SearchSettings) -> str:
    """A one-line description of how `settings` differ from a study's stored settings ("" if they match)."""
    if not stored:
        return ""
    identity = settings.identity()
    for key, value in identity.items():
        if key in stored and stored[key] != value:
            return (f"study {settings.study!r} was created with {key}={stored[key]!r}, not {value!r}; "
                    "use another --study name, or the same settings to resume it")
    if settings.budget_bytes is not None and stored.get("budget_bytes") not in (None, settings.budget_bytes):
        return (f"study {settings.study!r} was created with budget {format_bytes(stored['budget_bytes'])}, "
                f"not {format_bytes(settings.budget_bytes)}; use another --study name")
    return ""


# ==================================================================== trial records

@dataclass(frozen=True)
class TrialRecord:
    """One evaluated config: the contract's trial record (Optuna user_attrs and trials.csv columns)."""

    config: LMSConfig
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


def _predicted_record(config: LMSConfig, pred: Prediction, *, usable: int, device: str) -> TrialRecord:
    if not pred.feasible:
        need = pred.min_bytes or pred.peak_bytes
        return TrialRecord(config, "simulate", False, "infeasible", 0, 0.0, pred.peak_bytes,
                           f"simulator ({device})", pred.peak_bytes, 0.0,
                           constraint=max(need / usable - 1.0, 1e-6), reason=pred.reason,
                           extra={"predicted_batch": 0, "n_swapped": pred.n_swapped})
    return TrialRecord(config, "simulate", False, "ok", pred.batch, pred.throughput, pred.peak_bytes,
                       f"simulator ({device})", pred.peak_bytes, pred.throughput,
                       constraint=pred.peak_bytes / usable - 1.0,
                       reason="capped at --max-batch" if pred.capped else "",
                       extra={"predicted_batch": pred.batch, "predicted_step_time_s": pred.step_time_s,
                              "n_swapped": pred.n_swapped})


def _measured_record(config: LMSConfig, outcome: WorkerOutcome, pred: Prediction, *, backend: str,
                     usable: int, trial_dir: Path) -> TrialRecord:
    res = outcome.result or {}
    probes = [e for e in outcome.events if e.get("event") == "probe"]
    extra: dict[str, Any] = {
        "predicted_batch": pred.batch, "worker_wall_s": round(outcome.wall_s, 2),
        "trial_dir": str(trial_dir), "probes": [{k: p.get(k) for k in ("batch", "fits", "peak_bytes", "oom")}
                                                for p in probes],
    }
    for key in ("step_time_median_s", "step_time_spread_s", "step_times_s", "nvml_process_peak_bytes",
                "nvml_device_peak_bytes", "host_peak_rss_bytes", "lms_summary", "tensorflow", "device"):
        if key in res:
            extra[key] = res[key]
    common = dict(config=config, backend=backend, measured=True, predicted_peak_bytes=pred.peak_bytes,
                  predicted_throughput=pred.throughput)
    source = res.get("peak_source") or ("tf-bfc-cpu" if backend == "emulated" else "tf-allocator-gpu")
    if outcome.status == "ok":
        peak = int(res["peak_device_bytes"])
        return TrialRecord(status="ok", batch_size=int(res["batch_size"]), throughput=float(res["throughput"]),
                           peak_device_bytes=peak, peak_source=source, constraint=peak / usable - 1.0,
                           extra=extra, **common)
    if outcome.status in ("infeasible", "oom"):
        peak = res.get("peak_device_bytes")
        violation = (peak / usable - 1.0) if peak else _INFEASIBLE
        return TrialRecord(status=outcome.status, batch_size=0, throughput=0.0, peak_device_bytes=peak,
                           peak_source=source, constraint=max(violation, 1e-6), reason=outcome.reason,
                           extra=extra, **common)
    fitted = [p["batch"] for p in probes if p.get("fits")]
    partial = f" (largest batch seen to fit: {max(fitted)})" if fitted else ""
    if outcome.status in ("timeout", "killed"):
        return TrialRecord(status=outcome.status, batch_size=0, throughput=0.0, peak_device_bytes=None,
                           peak_source=source, constraint=_INFEASIBLE, reason=outcome.reason + partial,
                           extra=extra, **common)
    if outcome.result is None:
        # the worker ended without writing its result (not killed by a signal: that is "killed" above):
        # it could not write to the study folder, or could not start; nothing is known about the config
        return _machine_error_record(config, f"{outcome.reason} (log: {outcome.log_path})", backend=backend,
                                     pred=pred, extra=extra)
    return TrialRecord(status="error", batch_size=0, throughput=0.0, peak_device_bytes=None, peak_source=source,
                       constraint=_INFEASIBLE, reason=f"{outcome.reason} (log: {outcome.log_path})", failed=True,
                       extra=extra, **common)


def _machine_error_record(config: LMSConfig, reason: str, *, backend: str, pred: Prediction,
                          extra: Mapping[str, Any] | None = None) -> TrialRecord:
    """A trial the machine failed (see `REQUEUED_STATUSES`): it is queued again, not counted."""
    return TrialRecord(config=config, backend=backend, measured=True, status="machine_error", batch_size=0,
                       throughput=0.0, peak_device_bytes=None, peak_source="", predicted_peak_bytes=pred.peak_bytes,
                       predicted_throughput=pred.throughput, constraint=_INFEASIBLE,
                       reason=f"failed by the machine, not the config: {reason}; queued again", failed=True,
                       requeue=True, extra=dict(extra or {}))


# ==================================================================== the graph

def _graph_key(settings: SearchSettings) -> dict[str, Any]:
    return {"model": settings.model, "model_options": dict(settings.model_options)}


def _profile_batches(settings: SearchSettings) -> list[int] | None:
    """Where to start profiling op times: the emulated backend only (its trials run on this CPU).

    The workload's default batch (small, quick on a CPU); the worker grows it
    from there (`tuner.trial._profile`).
    """
    if settings.backend != "emulated":
        return None
    return [int(settings.workload.get("default_batch") or 8)]


def load_op_costs(settings: SearchSettings) -> Any:
    """The per-op times the trace worker measured (`lms.sim.OpCosts`), or None (roofline)."""
    from lms.sim.opcosts import OpCosts

    try:
        doc = json.loads((settings.study_dir / "graph.json").read_text(encoding="utf-8"))
        return OpCosts.from_dict(doc["op_costs"]) if doc.get("op_costs") else None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("no measured op times (%s); the simulator uses its roofline", exc)
        return None


def load_graph(settings: SearchSettings, *, should_stop: Callable[[], bool] | None = None) -> Any:
    """The traced graph: from ``studies/<study>/graph.json`` if its key matches, else traced by a worker."""
    from lms.graph import Graph

    path = settings.study_dir / "graph.json"
    key = _graph_key(settings)
    if path.is_file():
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            if doc.get("key") == key:
                graph = Graph.from_dict(doc["graph"])
                log.info("graph: %d ops, cached in %s", len(graph.ops), path)
                return graph
            log.info("graph cache %s is for another model or options; tracing again", path)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("graph cache %s is unreadable (%s); tracing again", path, exc)
    log.info("tracing %s in a worker process (TensorFlow; once per study) ...", settings.model)
    request = {"mode": "trace", "workload": settings.model, "options": dict(settings.model_options),
               "key": key, "output": str(path), "profile_batches": _profile_batches(settings)}
    outcome = run_worker(request, workdir=settings.study_dir / "trace", timeout_s=settings.trial_timeout_s,
                         env=worker_env("emulated"), should_stop=should_stop)
    if outcome.status == "bad_input":
        raise BadInput(outcome.reason)
    if outcome.status != "ok" or not path.is_file():
        raise SearchError(f"tracing {settings.model} failed ({outcome.status}): {outcome.reason} "
                          f"(log: {outcome.log_path})")
    doc = json.loads(path.read_text(encoding="utf-8"))
    graph = Graph.from_dict(doc["graph"])
    log.info("graph: %d ops, traced in %.1f s", len(graph.ops), float(doc.get("trace_s", 0)))
    return graph


def derive_emulated_budget(graph: Any, *, reference_batch: int = 32, ceiling: int | None = None) -> int:
    """Default emulated budget: the simulator's no-LMS peak at `reference_batch`, rounded up to 64 MiB.

    Simulated on the emulated device's profile (``"cpu"``: the op order of TF's
    single-threaded executor, which the emulated trials run under) with TF's
    BFC allocator replayed (its rounding and unsplit chunks: ResNet-50 holds
    15% more than its live bytes), so the no-LMS baseline fits about
    `reference_batch` samples and the search shows how far LMS goes beyond it;
    capped at `ceiling` (a quarter of host memory by default) and at least
    64 MiB.
    """
    from lms.simulator import simulate

    peak = simulate(graph, None, batch=reference_batch, device="cpu", allocator="bfc",
                    timeline=False).peak_device_bytes
    quantum = 64 << 20
    budget = max(quantum, math.ceil(peak / quantum) * quantum)
    if ceiling is None:
        try:
            ceiling = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
        except (ValueError, OSError, AttributeError):
            ceiling = 4 << 30
    return int(min(budget, max(quantum, ceiling)))


# ==================================================================== samplers and the loop

def make_sampler(name: str, *, seed: int | None, n_startup_trials: int = 10) -> Any:
    """TPE (multivariate, default), NSGA-II, or random; all read the trials' constraints."""
    import warnings

    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "tpe":
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                              n_startup_trials=n_startup_trials)
        if name == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed, population_size=20)
        if name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown sampler {name!r}; choose tpe, nsga2 or random")


def _owner() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale_by_heartbeat(study: Any) -> set[int]:
    """Trial ids whose heartbeat (database storages, `tuner.storage.HEARTBEAT_INTERVAL_S`) is older than the grace period."""
    from optuna.storages._heartbeat import BaseHeartbeat, is_heartbeat_enabled

    storage = study._storage
    if not isinstance(storage, BaseHeartbeat) or not is_heartbeat_enabled(storage):
        return set()
    try:
        return set(storage._get_stale_trial_ids(study._study_id))
    except Exception as exc:  # recovery is best effort; the next check tries again
        log.debug("heartbeat check failed: %s", exc)
        return set()


def recover_stale_trials(study: Any) -> int:
    """Fail RUNNING trials whose search process is gone, and queue their params again.

    A trial is stale when its owner ran on this host and that process is gone,
    or (database storages, any host) its heartbeat is older than the grace
    period. Several processes may check at once: only the one whose FAIL is
    stored re-queues the params, so a trial is retried once.
    """
    import optuna
    from optuna.trial import TrialState

    recovered = 0
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if not running:
        return 0
    stale_ids = _stale_by_heartbeat(study)
    now = datetime.datetime.now()
    for t in running:
        owner = t.user_attrs.get("owner") or {}
        local_dead = owner.get("host") == socket.gethostname() and not _pid_alive(int(owner.get("pid", -1)))
        orphan = (not owner and t.datetime_start is not None
                  and (now - t.datetime_start).total_seconds() > _ORPHAN_AFTER_S)
        if not (local_dead or orphan or t._trial_id in stale_ids):
            continue
        why = ("its search process ended" if local_dead else
               "its search process ended before claiming it" if orphan else
               "its search process stopped sending heartbeats")
        try:
            trial = optuna.trial.Trial(study, t._trial_id)
            trial.set_user_attr("status", "interrupted")
            trial.set_user_attr("reason", f"{why} during this trial; it was queued again")
            if not study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                continue
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError, ValueError):
            continue  # another process recovered (or finished) it first
        if t.params:
            study.enqueue_trial(dict(t.params), user_attrs={"retry_of": t.number})
        recovered += 1
    if recovered:
        log.info("%d trial(s) left running by a process that is gone were queued again", recovered)
    return recovered


# A trial is claimed (user attr "owner") right after study.ask(); one still unclaimed after this
# long belongs to a process that died in between (on SQLite or a journal there is no heartbeat).
_ORPHAN_AFTER_S = 30.0


def _counted(t: Any) -> bool:
    """Trials that count toward --trials: configs evaluated (finished, not interrupted, not a repeat).

    A repeat of an evaluated config (`duplicate_of`) is answered from the study
    at no cost and does not count; an interrupted trial, or one failed by the
    machine (`REQUEUED_STATUSES`), is queued again; a config drawn while another
    worker runs it is ``skipped`` (not counted).
    """
    from optuna.trial import TrialState

    if t.state == TrialState.COMPLETE:
        return "duplicate_of" not in t.user_attrs
    return t.state == TrialState.FAIL and t.user_attrs.get("status") not in (*REQUEUED_STATUSES, "skipped", None)


def _known_records(study: Any) -> dict[str, tuple[int, dict[str, Any], list[float]]]:
    from optuna.trial import TrialState

    known = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        cfg = t.user_attrs.get("config")
        if isinstance(cfg, dict):
            try:
                known.setdefault(canonical_key(LMSConfig.from_dict(cfg)), (t.number, dict(t.user_attrs), list(t.values)))
            except ValueError:
                continue
    return known


def _best_postfix(study: Any) -> str:
    from optuna.trial import TrialState

    best_batch = best_thr = None
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get("status") != "ok":
            continue
        b, thr = t.values
        best_batch = b if best_batch is None else max(best_batch, b)
        best_thr = thr if best_thr is None else max(best_thr, thr)
    if best_batch is None:
        return "no feasible config yet"
    return f"best batch {best_batch:.0f}, best {best_thr:.1f} samples/s"


class _Interrupted(Exception):
    pass


def optimize(study: Any, space: SearchSpace, evaluate: Callable[[LMSConfig, Any], TrialRecord], *,
             n_trials: int, deadline: float | None, progress: Progress, desc: str,
             explore_on_repeat: bool = True, seed: int | None = None,
             stop: threading.Event | None = None, own_progress: bool = True,
             ask_lock: Callable[[], Any] | None = None, stopped: dict[str, str] | None = None) -> int:
    """Ask/tell until `n_trials` configs are evaluated, the space is exhausted, or the deadline passes.

    A config the study has already evaluated (same `canonical_key`) is told
    the stored result at once (``duplicate_of``) and is not counted: the trial
    budget pays for evaluations. With `explore_on_repeat`, each repeat also
    queues one config not evaluated yet, drawn at random from the space: a
    sampler that keeps returning to a known point gets a fresh one instead
    (on the ResNet-50 benchmark this is what finds the far end of the front).

    Several threads may run it on one study (one per GPU); `stop` ends them all
    (each re-queues the trial it was running). With ``own_progress=False`` the
    caller starts and closes `progress`. Several processes may share the study
    too: `ask_lock` (e.g. `tuner.storage.storage_lock`) makes their ``ask`` one
    at a time, so two never pop the same queued trial. Why the loop ended is
    written to ``stopped["reason"]``: ``trials`` (done), ``others`` (the last
    trials are running in other workers or processes), ``time limit``,
    ``space`` (every config evaluated), ``repeats``, ``stop``.

    Returns:
        configs evaluated by this call.
    """
    from optuna.trial import TrialState

    def why(reason: str) -> None:
        if stopped is not None:
            stopped["reason"] = reason

    done = sum(1 for t in study.get_trials(deepcopy=False) if _counted(t))
    known = _known_records(study)
    space_size = space.n_distinct
    repeats = 0
    rng = random.Random(seed)
    if own_progress:
        progress.start(total=n_trials, initial=done, desc=desc)
    progress.note(_best_postfix(study))
    ran = errors = 0
    durations: list[float] = []
    try:
        while True:
            # Other processes may share the study (journal / database storage): count what is there now.
            if recover_stale_trials(study):  # a worker process on this host (or, by heartbeat, anywhere) died
                known.update({k: v for k, v in _known_records(study).items() if k not in known})
            trials = study.get_trials(deepcopy=False)
            done = sum(1 for t in trials if _counted(t))
            # other threads / processes; a trial with no owner yet was only just asked for, or its
            # process died between ask() and claiming it: it must not hold a slot (see _ORPHAN_AFTER_S)
            running = sum(1 for t in trials if t.state == TrialState.RUNNING and t.user_attrs.get("owner"))
            known.update({k: v for k, v in _known_records(study).items() if k not in known})
            if done + running >= n_trials or (stop is not None and stop.is_set()):
                why("stop" if stop is not None and stop.is_set() else "trials" if done >= n_trials else "others")
                break
            if len(known) >= space_size or repeats > max(50, 2 * n_trials):
                log.info("every config of the search space has been evaluated (%d)" if len(known) >= space_size
                         else "the sampler keeps proposing evaluated configs; stopping at %d", len(known))
                why("space" if len(known) >= space_size else "repeats")
                break
            if deadline is not None:
                left = deadline - time.monotonic()
                typical = sorted(durations)[len(durations) // 2] if durations else 0.0
                if left <= 0 or left < typical:
                    log.warning("time limit: %d trial(s) run now, %d of %d done; run the same command again "
                                "to continue", ran, done, n_trials)
                    why("time limit")
                    break
            t0 = time.monotonic()
            # threads of one process, and processes sharing a file storage, must not pop the same queued trial
            with _ASK_LOCK, (ask_lock() if ask_lock is not None else contextlib.nullcontext()), \
                    warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Heartbeat of storage")  # ours runs in _heartbeat
                trial = study.ask()
                trial.set_user_attr("owner", _owner())
            config = space.suggest(trial)
            key = canonical_key(config)
            heartbeat = _heartbeat(study, trial)
            try:
                earlier = None
                if key not in known:  # another worker may be running it, or have finished it since the loop began
                    earlier = _running_same_config(study, space, trial, key)  # RUNNING first, then COMPLETE:
                    if earlier is None:  # a trial finishing in between is seen by one of the two reads
                        known.update({k: v for k, v in _known_records(study).items() if k not in known})
                if key in known:
                    number, attrs, values = known[key]
                    for name, value in attrs.items():
                        if name not in ("owner", "retry_of"):
                            trial.set_user_attr(name, value)
                    trial.set_user_attr("duplicate_of", number)
                    trial.set_constraint("memory", float(attrs.get("constraint", [0.0])[0]))
                    study.tell(trial, values)
                    log.debug("trial %d: same effective config as trial %d", trial.number, number)
                    repeats += 1
                    if explore_on_repeat:
                        _queue_unexplored(study, space, known, rng)
                    continue
                if earlier is not None:
                    # another thread or process is evaluating this config now: the earlier trial keeps it
                    trial.set_user_attr("status", "skipped")
                    trial.set_user_attr("reason", f"same config as trial {earlier}, running in another worker")
                    trial.set_user_attr("concurrent_duplicate_of", earlier)
                    study.tell(trial, state=TrialState.FAIL)
                    repeats += 1
                    if explore_on_repeat:
                        _queue_unexplored(study, space, known, rng)
                    continue
                else:
                    trial.set_user_attr("evaluating", True)
                    record = evaluate(config, trial)
                    for name, value in record.user_attrs().items():
                        trial.set_user_attr(name, value)
                    trial.set_constraint("memory", float(record.constraint))
                    if record.requeue:
                        _requeue(study, trial, record.reason, status=record.status)
                        errors += 1
                        log.warning("trial %d: %s", trial.number, record.reason)
                        if errors >= _MAX_CONSECUTIVE_ERRORS:
                            raise SearchError(f"{errors} trials in a row failed; last: {record.reason}")
                    elif record.failed:
                        study.tell(trial, state=TrialState.FAIL)
                        errors += 1
                        log.warning("trial %d failed: %s", trial.number, record.reason)
                        if errors >= _MAX_CONSECUTIVE_ERRORS:
                            raise SearchError(f"{errors} trials in a row failed; last: {record.reason}")
                    else:
                        errors = 0
                        study.tell(trial, [float(record.batch_size), float(record.throughput)])
                        known[key] = (trial.number, record.user_attrs(),
                                      [float(record.batch_size), float(record.throughput)])
                        _log_record(trial.number, record, f"[{done + 1}/{n_trials}]")
            except _Interrupted:
                _requeue(study, trial, "stopped at the search's time limit during this trial; queued again")
                break
            except (KeyboardInterrupt, SystemExit):
                _requeue(study, trial, "interrupted; queued again")
                raise
            except SearchError:
                raise
            except Exception as exc:
                trial.set_user_attr("status", "error")
                trial.set_user_attr("reason", f"{type(exc).__name__}: {exc}")
                study.tell(trial, state=TrialState.FAIL)
                raise
            finally:
                heartbeat.join()
            durations.append(time.monotonic() - t0)
            ran += 1
            progress.advance(postfix=_best_postfix(study))
    finally:
        if own_progress:
            progress.close()
    return ran


def _running_same_config(study: Any, space: SearchSpace, trial: Any, key: str) -> int | None:
    """The number of an earlier RUNNING trial drawing the same config (another worker), else None.

    Each worker writes its params before it checks and marks its trial
    ``evaluating`` right after; a trial marked so, or with a lower number,
    keeps the config. Of two workers that draw one config at once one
    evaluates it, except in the few milliseconds between another worker's
    check and its mark (then both run it: the second result is kept as a repeat).
    """
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        p = t.params
        complete = "swap_branches" in p and (not p["swap_branches"] or "branch_threshold" in p)
        if t.number == trial.number or not complete:
            continue
        if t.number > trial.number and not t.user_attrs.get("evaluating"):
            continue
        try:
            if canonical_key(space.config_of(t.params)) == key:
                return t.number
        except (ValueError, KeyError):
            continue
    return None


def _heartbeat(study: Any, trial: Any) -> Any:
    """Start Optuna's heartbeat thread for `trial` when the storage has heartbeats (a no-op thread otherwise)."""
    from optuna.storages._heartbeat import get_heartbeat_thread

    thread = get_heartbeat_thread(trial._trial_id, study._storage)
    thread.start()
    return thread


def _queue_unexplored(study: Any, space: SearchSpace, known: Mapping[str, Any], rng: random.Random) -> None:
    """Queue one random config of the space that is neither evaluated nor already queued."""
    from optuna.trial import TrialState

    waiting = {canonical_key(space.config_of(t.system_attrs["fixed_params"]))
               for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
               if "n_tensors" in t.system_attrs.get("fixed_params", {})}
    fresh = [p for p in space.grid() if canonical_key(space.config_of(p)) not in known
             and canonical_key(space.config_of(p)) not in waiting]
    if fresh:
        study.enqueue_trial(rng.choice(fresh), user_attrs={"explore": True})


def _requeue(study: Any, trial: Any, reason: str, *, status: str = "interrupted") -> None:
    from optuna.trial import TrialState

    try:
        trial.set_user_attr("status", status)
        trial.set_user_attr("reason", reason)
        params = dict(trial.params)
        kept = {k: v for k, v in trial.user_attrs.items() if k in ("warm_start", "from_screen", "explore")}
        study.tell(trial, state=TrialState.FAIL)
        study.enqueue_trial(params, user_attrs={**kept, "retry_of": trial.number})
    except Exception as exc:  # the next run recovers it as a stale trial
        log.debug("could not re-queue trial %d: %s", trial.number, exc)


def _log_record(number: int, r: TrialRecord, count: str) -> None:
    kind = "measured" if r.measured else "predicted"
    cfg = _short_config(r.config)
    if r.status == "ok":
        log.info("trial %d %s: %s -> batch %d, %.1f samples/s, peak %s (%s, %s)", number, count, cfg, r.batch_size,
                 r.throughput, format_bytes(r.peak_device_bytes), kind, r.peak_source)
    else:
        log.info("trial %d %s: %s -> %s (%s): %s", number, count, cfg, r.status, kind, r.reason)


def _short_config(c: LMSConfig) -> str:
    if not c.enabled:
        return "no LMS"
    parts = [f"n_tensors={c.n_tensors}", f"lb={c.lb}"]
    if c.fuse_swapins:
        parts.append("fuse")
    if c.ctrld_strategy != "chain_rule":
        parts.append(c.ctrld_strategy)
    if c.swap_branches:
        parts.append(f"branches>{c.branch_threshold}")
    return " ".join(parts)


def pareto_picks(trials: Sequence[Any], k: int, *, exclude: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Up to `k` param sets from the feasible Pareto front, spread along it.

    First the point with the best sum of normalised batch and throughput (a
    balanced one, likely close to the recommendation), then each time the
    point farthest from those already picked. Configs whose `canonical_key`
    is in `exclude` (already queued or run) are not picked.
    """
    front = [t for t in trials if t.user_attrs.get("status") == "ok" and t.values is not None]
    front = [t for t in front if not any(_dominates(o.values, t.values) for o in front)]
    if not front or k <= 0:
        return []
    excluded = set(exclude)
    uniq: dict[str, Any] = {}
    for t in sorted(front, key=lambda t: (-t.values[0], -t.values[1], t.number)):
        key = canonical_key(LMSConfig.from_dict(t.user_attrs["config"]))
        if key not in excluded:
            uniq.setdefault(key, t)
    front = list(uniq.values())
    if not front:
        return []
    b_max = max(t.values[0] for t in front) or 1.0
    r_max = max(t.values[1] for t in front) or 1.0
    points = {t.number: (t.values[0] / b_max, t.values[1] / r_max) for t in front}
    picked = [max(front, key=lambda t: (points[t.number][0] + points[t.number][1], t.values[0]))]
    while len(picked) < min(k, len(front)):
        rest = [t for t in front if t not in picked]
        far = max(rest, key=lambda t: min(math.dist(points[t.number], points[p.number]) for p in picked))
        picked.append(far)
    return [dict(t.params) for t in picked]


def _dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    return all(x >= y for x, y in zip(a, b)) and any(x > y for x, y in zip(a, b))


# ==================================================================== the whole search

@dataclass(frozen=True)
class SearchOutcome:
    """What a search run produced (for the CLI to print)."""

    study: str
    recommendation: dict[str, Any] | None
    recommended_path: Path | None
    trials_csv: Path | None
    ran: int
    screened: int
    completed: int
    stopped_early: bool
    wall_s: float
    notes: tuple[str, ...] = ()
    stop_reason: str = ""  # why it stopped early: see `optimize` (``time limit``, ``others``, ``space``, ...)
    statuses: Mapping[str, int] = field(default_factory=dict)  # evaluated trials of the main study by status
    running_elsewhere: int = 0  # trials of the study running in other processes when this one ended


class _Stopper:
    """SIGTERM -> KeyboardInterrupt in the parent (so workers get killed and trials re-queued)."""

    def __enter__(self) -> "_Stopper":
        self._old = signal.getsignal(signal.SIGTERM)
        try:
            signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread
            self._old = None
        return self

    @staticmethod
    def _handle(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    def __exit__(self, *exc: Any) -> None:
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)


def _create_study(name: str, storage: Any, sampler: Any) -> Any:
    import optuna

    return optuna.create_study(study_name=name, storage=storage, directions=list(DIRECTIONS), sampler=sampler,
                               load_if_exists=True)


def run_search(settings: SearchSettings, *, progress: Progress | None = None) -> SearchOutcome:
    """Run (or resume) the study described by `settings`; write recommended.json and trials.csv.

    Raises:
        BadInput: the model could not be traced because of its spec/options, or a resume conflict.
        SearchError: tracing or trials failed for other reasons.
        KeyboardInterrupt: interrupted (completed trials are kept; rerun to resume).
    """
    from lms.planner import find_candidates

    from . import outputs

    progress = progress or Progress(disabled=True)
    start = time.monotonic()
    deadline = None if settings.timeout_s is None else start + settings.timeout_s
    notes = list(settings.notes)
    settings.study_dir.mkdir(parents=True, exist_ok=True)
    storage = open_storage(settings.storage, lock=True)

    def ask_lock() -> Any:
        return storage_lock(settings.storage)

    with ask_lock():
        main = _create_study(settings.study, storage, make_sampler(settings.sampler, seed=settings.seed))
    conflict = study_settings_conflict(main.user_attrs.get("tuner"), settings)
    if conflict:
        raise BadInput(conflict)
    with _Stopper():
        graph = load_graph(settings)
        op_costs = load_op_costs(settings) if settings.backend == "emulated" else None
        if op_costs is not None:
            notes.append(f"simulator op times: measured on this CPU ({op_costs.source})")
        elif settings.backend == "emulated":
            notes.append("simulator op times: the cpu profile's roofline (the step was not profiled: the "
                         "graph came from another backend's trace, or profiling failed; see "
                         f"{settings.study_dir / 'trace'})")
        budget = settings.budget_bytes
        budget_source = settings.budget_source
        stored = main.user_attrs.get("tuner") or {}
        if budget is None:
            if stored.get("budget_bytes"):
                budget, budget_source = int(stored["budget_bytes"]), str(stored.get("budget_source", "stored"))
            else:
                budget = derive_emulated_budget(graph)
                budget_source = ("default for the emulated backend: the simulator's no-LMS peak at batch 32 "
                                 "(BFC allocator replayed), rounded up to 64 MiB, so the no-LMS baseline fits "
                                 "about that batch")
        usable = usable_bytes(budget, settings.safety_margin)
        candidates, _ = find_candidates(graph, LMSConfig())
        if not candidates:
            notes.append("the graph has no swap candidates: only the no-LMS baseline is possible")
        space = SearchSpace(n_candidates=max(1, len(candidates)))
        attrs = {**settings.identity(), "budget_bytes": budget, "budget_source": budget_source,
                 "space": space.to_dict(), "workload": dict(settings.workload), "storage": settings.storage.display,
                 "schema_version": 1}
        with ask_lock():  # searches starting together: one sets the study up, the others see it done
            stored = main.user_attrs.get("tuner") or {}
            if not stored:
                main.set_user_attr("tuner", attrs)
                main.set_user_attr("role", "main")
                log.info("new study %s: %s backend, budget %s (usable %s after a %.0f%% margin)", settings.study,
                         settings.backend, format_bytes(budget), format_bytes(usable), 100 * settings.safety_margin)
            else:
                log.info("resuming study %s", settings.study)
            _queue_warm_start(main, space)
        recover_stale_trials(main)

        predictions: dict[str, Prediction] = {}

        predict_lock = threading.Lock()  # worker threads share the simulator's caches

        def predict(config: LMSConfig) -> Prediction:
            key = canonical_key(config)
            with predict_lock:
                if key not in predictions:
                    # measured trials see TF's BFC allocator: screen with it replayed
                    predictions[key] = predict_max_batch(graph, config, usable, device=settings.device,
                                                         cap=settings.max_batch,
                                                         allocator="bfc" if settings.measured else "exact",
                                                         op_costs=op_costs)
                return predictions[key]

        def evaluate_predicted(config: LMSConfig, trial: Any) -> TrialRecord:
            return _predicted_record(config, predict(config), usable=usable, device=settings.device)

        screened = 0
        screen = None
        ran = 0
        stopped = False
        stop_info: dict[str, str] = {}
        try:
            if settings.measured:
                with ask_lock():
                    screen = _create_study(settings.study + SCREEN_SUFFIX, storage,
                                           make_sampler(settings.sampler, seed=settings.seed))
                    if not screen.user_attrs.get("tuner"):
                        screen.set_user_attr("tuner", {**attrs, "backend": "simulate"})
                        screen.set_user_attr("role", "screen")
                        screen.set_user_attr("screen_of", settings.study)
                    _queue_warm_start(screen, space)
                recover_stale_trials(screen)
                screened = optimize(screen, space, evaluate_predicted, n_trials=settings.screen_trials,
                                    deadline=deadline, progress=progress, desc="screen (simulated)",
                                    seed=settings.seed, ask_lock=ask_lock)
                with ask_lock():
                    queued = {canonical_key(space.config_of(t.system_attrs.get("fixed_params", t.params)))
                              for t in main.get_trials(deepcopy=False)
                              if "n_tensors" in t.system_attrs.get("fixed_params", t.params)}
                    k = max(0, settings.trials - len(queued))
                    for params in pareto_picks(screen.get_trials(deepcopy=False), k, exclude=queued):
                        main.enqueue_trial(params, user_attrs={"from_screen": True}, skip_if_exists=True)

                ran = _optimize_measured(main, space, settings, predict, usable=usable, deadline=deadline,
                                         progress=progress, ask_lock=ask_lock, stopped=stop_info)
            else:
                ran = optimize(main, space, evaluate_predicted, n_trials=settings.trials, deadline=deadline,
                               progress=progress, desc="search (simulated)", seed=settings.seed,
                               ask_lock=ask_lock, stopped=stop_info)
        finally:
            trials = main.get_trials(deepcopy=False)
            completed = sum(1 for t in trials if _counted(t))
            stopped = completed < settings.trials
            env = _environment(settings)
            doc, rec_path, csv_path = outputs.write_outputs(
                settings.study_dir, main=main, screen=screen, settings=settings, budget_bytes=budget,
                budget_source=budget_source, usable_bytes=usable, environment=env, notes=notes,
                measure_advice=f"run the search again with --trials {completed + settings.trials} to measure "
                               "more configs")
    statuses: dict[str, int] = {}
    for t in trials:
        if _counted(t):
            status = str(t.user_attrs.get("status") or "?")
            statuses[status] = statuses.get(status, 0) + 1
    running_elsewhere = sum(1 for t in trials if t.state.name == "RUNNING"
                            and (t.user_attrs.get("owner") or {}).get("pid") not in (None, os.getpid()))
    reason = stop_info.get("reason", "") if stopped else ""
    if stopped and reason in ("", "trials", "others") and running_elsewhere:
        reason = "others"
    return SearchOutcome(settings.study, doc, rec_path, csv_path, ran, screened, completed, stopped,
                         time.monotonic() - start, tuple(notes), stop_reason=reason, statuses=statuses,
                         running_elsewhere=running_elsewhere)


def _queue_warm_start(study: Any, space: SearchSpace) -> None:
    """Queue the no-LMS baseline and TFLMS's defaults unless the study has them (queued, run or running).

    Called on every start (under `tuner.storage.storage_lock`), so a search
    stopped between creating the study and queueing them still gets them.
    """
    for params in (space.baseline_params(), space.tflms_default_params()):
        study.enqueue_trial(params, user_attrs={"warm_start": True}, skip_if_exists=True)


def _optimize_measured(main: Any, space: SearchSpace, settings: SearchSettings,
                       predict: Callable[[LMSConfig], Prediction], *, usable: int, deadline: float | None,
                       progress: Progress, ask_lock: Callable[[], Any] | None = None,
                       stopped: dict[str, str] | None = None) -> int:
    """Real trials: one thread per worker slot (one per GPU of ``--gpus``, or ``--workers`` on the CPU).

    Each thread runs `optimize` on the shared study and starts its trial
    workers with its own ``CUDA_VISIBLE_DEVICES``. Ctrl-C / SIGTERM in the
    main thread sets `stop`: every thread kills its worker and re-queues its trial.
    """
    slots = list(settings.gpus) if settings.backend == "gpu" and settings.gpus else [settings.gpu] * settings.workers
    stop = threading.Event()

    def evaluate_on(gpu: str | None) -> Callable[[LMSConfig, Any], TrialRecord]:
        def evaluate(config: LMSConfig, trial: Any) -> TrialRecord:
            factor, trust = _calibration(main)
            return _evaluate_measured(dataclasses.replace(settings, gpu=gpu), config, trial, predict(config),
                                      usable=usable, deadline=deadline, batch_factor=factor,
                                      trust_infeasible=trust, stop=stop)
        return evaluate

    desc = f"search ({settings.backend}, measured)"
    if len(slots) == 1:
        return optimize(main, space, evaluate_on(slots[0]), n_trials=settings.trials, deadline=deadline,
                        progress=progress, desc=desc, seed=settings.seed, stop=stop, ask_lock=ask_lock,
                        stopped=stopped)
    log.info("%d trial workers in parallel (%s)", len(slots),
             ", ".join(f"GPU {g}" for g in slots) if settings.backend == "gpu" else "CPU")
    done = sum(1 for t in main.get_trials(deepcopy=False) if _counted(t))
    progress.start(total=settings.trials, initial=done, desc=desc)
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="trial") as pool:
            futures = [pool.submit(optimize, main, space, evaluate_on(gpu), n_trials=settings.trials,
                                   deadline=deadline, progress=progress, desc=desc,
                                   seed=None if settings.seed is None else (settings.seed + i) % 2**32,
                                   stop=stop, own_progress=False, ask_lock=ask_lock, stopped=stopped)
                       for i, gpu in enumerate(slots)]
            try:
                return sum(f.result() for f in futures)
            except BaseException:
                stop.set()
                concurrent.futures.wait(futures)
                raise
    finally:
        progress.close()


def _environment(settings: SearchSettings) -> dict[str, Any]:
    from .environment import environment_info

    gpu_index = int(settings.gpu) if settings.gpu and str(settings.gpu).isdigit() else None
    return environment_info(backend=settings.backend, gpu_index=gpu_index)


def _calibration(study: Any) -> tuple[float, bool]:
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


def _evaluate_measured(settings: SearchSettings, config: LMSConfig, trial: Any, pred: Prediction, *,
                       usable: int, deadline: float | None, batch_factor: float = 1.0,
                       trust_infeasible: bool = True, stop: threading.Event | None = None) -> TrialRecord:
    """Screen with the simulator, then measure in a worker (max-batch search + timed run).

    The warm-start trials (no LMS, TFLMS defaults) always run: they anchor the
    comparison and check the simulator's verdicts.
    """
    warm = bool(trial.user_attrs.get("warm_start"))
    if (not pred.feasible and trust_infeasible and not warm
            and (pred.min_bytes or pred.peak_bytes) > usable * (1 + SIM_SKIP_TOLERANCE)):
        record = _predicted_record(config, pred, usable=usable, device=settings.device)
        return dataclasses.replace(
            record, backend=settings.backend, measured=False,
            reason=f"not run: {pred.reason} (more than {SIM_SKIP_TOLERANCE:.0%} over the usable budget)",
            extra={**record.extra, "skipped_by_simulator": True})
    trial_dir = settings.study_dir / "trials" / f"{trial.number:04d}"
    start = max(1, round(pred.batch * batch_factor)) if pred.feasible else 1
    request = {
        "mode": "measure", "workload": settings.model, "options": dict(settings.model_options),
        "config": config.to_dict(), "backend": settings.backend, "budget_bytes": usable,
        "safety_margin": 0.0, "start_batch": max(1, start), "cap": settings.max_batch,
        "slope_bytes_per_sample": pred.slope_bytes_per_sample, "warmup": settings.warmup, "steps": settings.steps,
        "seed": settings.seed or 0, "resolution": 0.05, "max_probes": 6, "probe_warmup": 2, "probe_steps": 2,
        "trial": trial.number,
    }

    def on_event(event: dict[str, Any]) -> None:
        if event.get("event") == "probe":
            verdict = "fits" if event.get("fits") else "does not fit"
            peak = event.get("peak_bytes")
            log.info("  trial %d: batch %d %s (peak %s, usable %s)", trial.number, event["batch"], verdict,
                     "OOM" if event.get("oom") else format_bytes(peak), format_bytes(usable))
        elif event.get("event") == "timed_run_too_big":
            log.info("  trial %d: batch %d does not fit on the timed run (%s); trying a smaller one", trial.number,
                     event["batch"], event.get("detail", ""))
        elif event.get("event") == "phase" and event.get("phase") == "timing":
            log.info("  trial %d: timing batch %d (%d warm-up + %d timed steps)", trial.number, event["batch"],
                     settings.warmup, settings.steps)

    log.info("trial %d: %s (simulator predicts batch %d; first probe %d)", trial.number, _short_config(config),
             pred.batch, start)
    def should_stop() -> bool:
        return (deadline is not None and time.monotonic() >= deadline) or (stop is not None and stop.is_set())

    try:
        outcome = run_worker(request, workdir=trial_dir, timeout_s=settings.trial_timeout_s,
                             env=worker_env(settings.backend, gpu=settings.gpu), on_event=on_event,
                             should_stop=should_stop)
    except OSError as exc:  # e.g. the study folder turned read-only, the disk is full, no process can start
        return _machine_error_record(config, f"{type(exc).__name__}: {exc}", backend=settings.backend, pred=pred)
    if outcome.status == "stopped":
        raise _Interrupted()
    return _measured_record(config, outcome, pred, backend=settings.backend, usable=usable, trial_dir=trial_dir)


def describe_user_workload(spec: str, options: Mapping[str, Any], *, timeout_s: float = 120.0) -> dict[str, Any]:
    """Load a user's ``module:function`` workload in a worker (their code may import TF); nothing is kept.

    Raises:
        BadInput: it does not import, or does not return a Workload (the worker's one-line reason).
        SearchError: the worker failed otherwise.
    """
    with tempfile.TemporaryDirectory(prefix="tuner-describe-") as tmp:
        outcome = run_worker({"mode": "describe", "workload": spec, "options": dict(options)},
                             workdir=Path(tmp), timeout_s=timeout_s, env=worker_env("emulated"))
    if outcome.status == "bad_input":
        raise BadInput(outcome.reason)
    if outcome.status != "ok" or not outcome.result:
        raise SearchError(f"could not load model {spec!r}: {outcome.status}: {outcome.reason}")
    return dict(outcome.result["workload"])
