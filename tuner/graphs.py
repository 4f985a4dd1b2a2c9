"""The model as the simulator sees it: traced once per study by a worker, cached as ``studies/<study>/graph.json``.

TensorFlow stays out of the search process: a worker (`tuner.trial`) loads
the workload and traces its training step (`TraceRequest`), or only describes
it (`DescribeRequest`, to check a user's ``module:function``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

from .backends import get_backend
from .errors import BadInput, SearchError
from .worker.protocol import DescribeRequest, MeasureRequest, TraceRequest
from .study.settings import SearchSettings
from .worker.run import run_worker, worker_env

__all__ = ["load_graph", "load_profile", "derive_budget", "derive_emulated_budget", "plain_peak_at",
           "describe_user_workload"]

log = logging.getLogger(__name__)


def _graph_key(settings: SearchSettings) -> dict[str, Any]:
    return {"model": settings.model, "model_options": dict(settings.model_options)}


def _profile_batches(settings: SearchSettings) -> tuple[int, ...]:
    """The two batches op times are profiled at: only for a backend whose trials run on this CPU.

    Two and eight times the workload's default batch (small, quick on a CPU):
    fixed, so the simulator's op times, its screening and the configs the search
    measures do not depend on how busy the machine was. (The worker used to grow
    the batch until a step took about a second: on one 2-core machine it chose
    [2, 10] lightly loaded and [2, 8] busy, and the two searches measured and
    recommended different configs.)
    """
    if not get_backend(settings.backend).profiles_op_times:
        return ()
    base = int(settings.workload.get("default_batch") or 8)
    return (2 * base, 8 * base)


def load_profile(settings: SearchSettings) -> tuple[Any, dict[int, int]]:
    """What the trace worker measured besides the graph, from one read of ``graph.json``: the per-op times
    (`lms.sim.OpCosts`; None: the simulator's roofline) and batch -> allocator peak of the plain step (empty:
    not measured; the no-LMS baseline then starts at the simulator's batch)."""
    from lms.sim.opcosts import OpCosts

    try:
        doc = json.loads((settings.study_dir / "graph.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("no measured op times or peaks (%s); the simulator uses its roofline", exc)
        return None, {}
    try:
        op_costs = OpCosts.from_dict(doc["op_costs"]) if doc.get("op_costs") else None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("no measured op times (%s); the simulator uses its roofline", exc)
        op_costs = None
    try:
        got = doc.get("plain_peaks") or {}
        peaks = {int(b): int(p) for b, p in zip(got.get("batches", ()), got.get("peak_bytes", ()), strict=True)}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("no measured peaks of the plain step (%s); the baseline starts at the simulator's batch", exc)
        peaks = {}
    return op_costs, peaks


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
    request = TraceRequest(workload=settings.model, options=dict(settings.model_options), key=key, output=str(path),
                           profile_batches=_profile_batches(settings))
    outcome = run_worker(request, workdir=settings.study_dir / "trace", timeout_s=settings.trial_timeout_s,
                         env=worker_env(), should_stop=should_stop)
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


#: The emulated default budget's reference batch (`derive_emulated_budget`).
EMULATED_REFERENCE_BATCH = 32


def derive_budget(settings: SearchSettings, graph: Any, *, label: str = "",
                  should_stop: Callable[[], bool] | None = None) -> tuple[int, str]:
    """(budget bytes, where it comes from) for a search given no ``--budget``, once per study.

    ``--budget-from-batch N`` (`SearchSettings.budget_from_batch`): the no-LMS step's peak at batch N,
    `plain_peak_at`. Otherwise the emulated backend's default, `derive_emulated_budget` at batch
    `EMULATED_REFERENCE_BATCH` (other backends have a default budget before tracing). `label` names
    what the budget was derived for (``--grow``'s starting value).
    """
    batch = settings.budget_from_batch
    at = f" at {label}" if label else ""
    if batch is None:
        return derive_emulated_budget(graph, reference_batch=EMULATED_REFERENCE_BATCH), (
            f"default for the emulated backend{at}: the simulator's no-LMS peak at batch {EMULATED_REFERENCE_BATCH} "
            "(BFC allocator replayed), rounded up to 64 MiB, so the no-LMS baseline fits about that batch")
    peak, how = plain_peak_at(settings, graph, batch, should_stop=should_stop)
    return peak, f"--budget-from-batch {batch}: the no-LMS step's peak at batch {batch}{at}, {how}"


def plain_peak_at(settings: SearchSettings, graph: Any, batch: int, *,
                  should_stop: Callable[[], bool] | None = None) -> tuple[int, str]:
    """(the no-LMS step's peak bytes at `batch`, how it was found, in words).

    A measured backend measures it: one fresh worker runs the plain step (``n_tensors=0``) at `batch`, as
    a trial's fresh process does, with no budget (a GPU's pool grows on demand); its allocator peak over
    the timed steps. The simulate backend predicts it on the device profile, as it predicts its trials.

    Raises:
        BadInput: the plain step does not run at `batch` (out of memory; the worker's reason).
        SearchError: the worker failed otherwise.
    """
    from lms.config import LMSConfig

    backend = get_backend(settings.backend)
    if not backend.measured:
        from lms.simulator import simulate

        peak = simulate(graph, None, batch=batch, device=settings.device, allocator=backend.prediction_allocator,
                        timeline=False).peak_device_bytes
        return int(peak), f"predicted by the simulator (device profile {settings.device})"
    request = MeasureRequest(workload=settings.model, options=dict(settings.model_options),
                             config=LMSConfig(n_tensors=0).to_dict(), backend=backend.name, usable_bytes=1 << 60,
                             start_batch=batch, cap=batch, fixed_batch=True, warmup=settings.warmup,
                             steps=settings.steps, seed=settings.seed or 0)
    workdir = settings.study_dir / "budget"
    log.info("measuring the no-LMS step at batch %d for the budget (--budget-from-batch; a fresh process) ...", batch)
    gpu = settings.gpus[0] if settings.gpus else settings.gpu
    outcome = run_worker(request, workdir=workdir, timeout_s=settings.trial_timeout_s, env=backend.worker_env(gpu=gpu),
                         should_stop=should_stop)
    res = outcome.result
    if outcome.status in ("oom", "infeasible", "bad_input"):
        raise BadInput(f"--budget-from-batch {batch}: the no-LMS step does not run at batch {batch}: "
                       f"{outcome.reason} (log: {outcome.log_path})")
    if outcome.status != "ok" or res is None or not res.peak_device_bytes:
        raise SearchError(f"--budget-from-batch {batch}: measuring the no-LMS step failed ({outcome.status}): "
                          f"{outcome.reason} (log: {outcome.log_path})")
    return int(res.peak_device_bytes), (f"measured in a fresh process "
                                        f"({backend.source_label(measured=True, device_name=res.device or '')})")


def describe_user_workload(spec: str, options: Mapping[str, Any], *, timeout_s: float = 120.0) -> dict[str, Any]:
    """Load a user's ``module:function`` workload in a worker (their code may import TF); nothing is kept.

    Raises:
        BadInput: it does not load, whatever the way: it raises, does not return a Workload (the
            worker's one-line reason), exits (``sys.exit``, ``os._exit``), is killed, or does not
            load within `timeout_s` (the worker does nothing else than load it).
    """
    with tempfile.TemporaryDirectory(prefix="tuner-describe-") as tmp:
        outcome = run_worker(DescribeRequest(workload=spec, options=dict(options)), workdir=Path(tmp),
                             timeout_s=timeout_s, env=worker_env())
    if outcome.status == "bad_input":
        raise BadInput(outcome.reason)
    if outcome.status != "ok" or outcome.result is None:
        why = (f"it did not load within {timeout_s:g} s (--trial-timeout)" if outcome.status == "timeout"
               else outcome.reason)
        raise BadInput(f"cannot load model {spec!r}: {why}")
    return dict(outcome.result.workload)
