"""Trial worker: runs TensorFlow in a subprocess, one per trial; and the parent's side of it.

TensorFlow does not reliably give memory back inside one process, and an
out-of-memory error or a kill must not take the study down, so every real
measurement runs in its own process::

    parent (no TF)                         worker: python -m tuner.trial request.json
      writes request.json   ─────────────▶  loads the workload, builds the model,
      tails events.jsonl    ◀── probe ────  lms.function(step, config=...), then per batch:
      kills it on timeout                     measure_step -> "batch N fits / does not fit"
      reads result.json     ◀── result ───  final timing at the largest fitting batch

Modes (``request["mode"]``):

- ``describe``: load the workload and report its description (validates a
  user's ``module:function`` without importing their code, or TF, in the parent);
- ``trace``: trace the training step and write the `lms.graph.Graph` JSON the
  simulator reads (cached by the search under ``studies/<study>/``);
- ``measure``: the max-batch search for one `LMSConfig` (`tuner.batch`) and a
  timed run at the batch found.

Backends: ``gpu`` measures on the GPU named by ``CUDA_VISIBLE_DEVICES`` (set
per worker) with memory growth on; the peak is TF's allocator peak (NVML's
figures are recorded beside it). ``emulated`` runs on the CPU with emulated
swap ops (`lms.tf.emulate`): the "device" is TensorFlow's CPU BFC allocator and
the budget is enforced by comparing its measured peak (``peak_source ==
"tf-bfc-cpu"``) with the budget; nothing stops the process from using more, so
a batch "does not fit" when that peak exceeds the budget minus the safety
margin. Swapped-out tensors live outside that allocator, in ordinary host
memory (recorded as ``host_peak_rss_bytes``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from lms.config import atomic_write_text

__all__ = ["WorkerOutcome", "run_worker", "worker_env", "main", "FAULT_ENV", "injected_fault"]

log = logging.getLogger(__name__)

BAD_INPUT_EXIT = 2
_POLL_S = 0.25
_TERM_GRACE_S = 5.0

# ------------------------------------------------------------ test-only fault injection
#: TEST-ONLY hook. ``LMS_TUNER_FAULT="kill@3,oom@4,hang@5,raise@6,die@7,ok@*"``: in the worker of
#: measured trial N, ``kill`` SIGKILLs itself, ``oom`` reports a (simulated) out-of-memory result,
#: ``hang`` sleeps until the parent's --trial-timeout, ``raise`` makes the model code raise,
#: ``ok`` returns a synthetic fitting result at once without TensorFlow (so a fault study takes
#: seconds), ``die`` SIGKILLs the *search process* (parent) while the worker runs (which then
#: hangs, so a worker that outlived its parent would be seen), ``rofs`` fails to write its result
#: as on a study folder turned read-only (a fault of the machine, not the config). ``*`` matches
#: every trial without its own entry. Never set it outside tests.
FAULT_ENV = "LMS_TUNER_FAULT"
FAULT_KINDS = ("kill", "oom", "hang", "raise", "ok", "die", "rofs")
#: The worker watches this inherited pipe end: end of file means its parent is gone, and it exits.
PARENT_PIPE_ENV = "LMS_TUNER_PARENT_FD"
PARENT_PID_ENV = "LMS_TUNER_PARENT_PID"


def injected_fault(trial: int | None, spec: str | None = None) -> str | None:
    """The fault kind `LMS_TUNER_FAULT` injects into measured trial number `trial` (None: none)."""
    spec = os.environ.get(FAULT_ENV, "") if spec is None else spec
    if not spec or trial is None:
        return None
    wildcard = None
    for item in spec.split(","):
        kind, _, target = item.strip().partition("@")
        if kind not in FAULT_KINDS:
            continue
        if target == "*":
            wildcard = kind
        elif target.isdigit() and int(target) == trial:
            return kind
    return wildcard


# ============================================================ parent side (no TensorFlow)

@dataclass(frozen=True)
class WorkerOutcome:
    """How a worker ended.

    Attributes:
        status: the worker's own status when it wrote a result (``"ok"``,
            ``"infeasible"``, ``"oom"``, ``"error"``, ``"bad_input"``), else
            ``"timeout"`` (killed by us at its deadline), ``"stopped"`` (killed
            because `should_stop` said so), ``"killed"`` (ended by a signal we
            did not send, e.g. the kernel's out-of-memory killer), or
            ``"error"`` (exited without a result).
        result: the worker's result document (None when it wrote none).
        events: the progress events it wrote (probes etc.).
        returncode: the process's exit code (negative: the signal).
        reason: one line for people.
        log_path: the worker's stdout+stderr.
        wall_s: seconds from start to end.
    """

    status: str
    result: dict[str, Any] | None
    events: tuple[dict[str, Any], ...] = field(default=())
    returncode: int | None = None
    reason: str = ""
    log_path: Path | None = None
    wall_s: float = 0.0


def worker_env(backend: str, *, gpu: str | None = None) -> dict[str, str]:
    """Environment for a worker: one GPU with memory growth, or none (emulated).

    The CPU allocator is always BFC (``TF_CPU_ALLOCATOR_USE_BFC=true``), so
    TF's own peak is exact on CPU.
    """
    env = dict(os.environ)
    env["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    if backend == "gpu":
        env["CUDA_VISIBLE_DEVICES"] = "0" if gpu is None else str(gpu)
        env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""  # trace / emulate on the CPU, never grab a GPU
    # The worker must import this checkout's packages even when started from elsewhere.
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_worker(request: dict[str, Any], *, workdir: Path, timeout_s: float | None = None,
               env: dict[str, str] | None = None,
               on_event: Callable[[dict[str, Any]], None] | None = None,
               should_stop: Callable[[], bool] | None = None) -> WorkerOutcome:
    """Run ``python -m tuner.trial`` on `request` in `workdir` and wait for it.

    Args:
        request: the job (``mode`` and its fields); ``events``/``result`` paths are added.
        workdir: folder for request.json, events.jsonl, result.json, worker.log.
        timeout_s: kill the worker (SIGTERM, then SIGKILL) after this long.
        env: its environment (see `worker_env`).
        on_event: called with each progress event as it arrives.
        should_stop: polled; True kills the worker (status ``"stopped"``).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    events_path = workdir / "events.jsonl"
    result_path = workdir / "result.json"
    log_path = workdir / "worker.log"
    for stale in (events_path, result_path):
        stale.unlink(missing_ok=True)
    request = {**request, "events": str(events_path), "result": str(result_path)}
    request_path = workdir / "request.json"
    atomic_write_text(request_path, json.dumps(request, indent=2) + "\n")
    cmd = [sys.executable, "-m", "tuner.trial", str(request_path)]
    start = time.monotonic()
    events: list[dict[str, Any]] = []
    offset = 0
    killed_by_us = ""
    stopped = False
    # The worker must not outlive this process (kill -9 included): on Linux the kernel kills it when its
    # parent dies (PR_SET_PDEATHSIG); everywhere it exits when this pipe's write end closes (`_watch_parent`).
    watch_r, watch_w = os.pipe()
    env = dict(os.environ if env is None else env)
    env[PARENT_PIPE_ENV], env[PARENT_PID_ENV] = str(watch_r), str(os.getpid())
    with open(log_path, "wb") as log_file:
        try:
            proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True, pass_fds=(watch_r,))
        except BaseException:
            os.close(watch_w)
            raise
        finally:
            os.close(watch_r)
        if request.get("mode") == "measure" and injected_fault(request.get("trial")) == "die":
            _wait_for_file(events_path, 30)  # test-only: the whole search process dies mid-trial
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            while True:
                try:
                    proc.wait(timeout=_POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                offset = _read_events(events_path, offset, events, on_event)
                elapsed = time.monotonic() - start
                if timeout_s is not None and elapsed > timeout_s:
                    killed_by_us = f"timed out after {timeout_s:.0f} s"
                elif should_stop is not None and should_stop():
                    killed_by_us, stopped = "stopped: the search's time limit was reached", True
                if killed_by_us:
                    _terminate(proc)
                    break
        except BaseException:
            _terminate(proc)  # Ctrl-C or an error here: never leave a worker behind
            raise
        finally:
            os.close(watch_w)
    _read_events(events_path, offset, events, on_event)
    wall = time.monotonic() - start
    rc = proc.returncode
    result = _read_json(result_path)
    if killed_by_us:
        return WorkerOutcome("stopped" if stopped else "timeout", result, tuple(events), rc, killed_by_us, log_path, wall)
    if result is not None:
        return WorkerOutcome(str(result.get("status", "error")), result, tuple(events), rc,
                             str(result.get("reason", "")), log_path, wall)
    if rc is not None and rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        reason = f"worker killed by {name}" + (" (host out of memory?)" if -rc == signal.SIGKILL else "")
        return WorkerOutcome("killed", None, tuple(events), rc, reason, log_path, wall)
    tail = _log_tail(log_path)
    return WorkerOutcome("error", None, tuple(events), rc,
                         f"worker exited with code {rc} without a result: {tail}", log_path, wall)


def _watch_parent() -> None:
    """Worker side: exit when the search process that started this worker is gone (`run_worker`).

    Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` makes the kernel kill the worker
    when its parent dies, ``kill -9`` included. (It is set here, at the
    worker's start, rather than in a ``preexec_fn``, which is unsafe with the
    parent's threads; a parent that died before the call is caught by the
    ``getppid`` check.) Everywhere, as a second line: a thread reads the pipe
    the parent holds open (`PARENT_PIPE_ENV`) and exits on end of file.
    """
    import threading

    parent = os.environ.pop(PARENT_PID_ENV, "")
    fd_text = os.environ.pop(PARENT_PIPE_ENV, "")
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if parent.isdigit() and os.getppid() != int(parent):
        os._exit(1)  # the parent died before the kernel was asked to tell us
    if not fd_text.isdigit():
        return
    fd = int(fd_text)

    def watch() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        os._exit(1)  # the search process is gone: nobody would read this trial's result

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _terminate(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    try:
        proc.wait(timeout=_TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()


def _wait_for_file(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not (path.is_file() and path.stat().st_size):
        time.sleep(0.05)


def _read_events(path: Path, offset: int, events: list[dict[str, Any]],
                 on_event: Callable[[dict[str, Any]], None] | None) -> int:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            chunk = fh.read()
    except FileNotFoundError:
        return offset
    end = chunk.rfind(b"\n") + 1  # only whole lines
    for line in chunk[:end].splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        events.append(event)
        if on_event is not None:
            on_event(event)
    return offset + end


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _log_tail(path: Path, *, lines: int = 3) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    tail = [ln.strip() for ln in text if ln.strip()][-lines:]
    return " | ".join(tail)[-400:] or "(empty log)"


# ============================================================ worker side (imports TensorFlow)

class _Events:
    def __init__(self, path: str | None) -> None:
        self._fh = open(path, "a", encoding="utf-8") if path else None

    def emit(self, event: str, **fields: Any) -> None:
        if self._fh is None:
            return
        self._fh.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")
        self._fh.flush()


class _BadInput(Exception):
    """The workload spec or its options are wrong (the user's input, not a failure)."""


def _load_workload(request: dict[str, Any]) -> Any:
    from tuner.models import load_workload

    try:
        return load_workload(request["workload"], **request.get("options", {}))
    except ValueError as exc:
        raise _BadInput(_first_line(exc)) from exc


def _describe(request: dict[str, Any]) -> dict[str, Any]:
    workload = _load_workload(request)
    return {"status": "ok", "workload": workload.describe()}


def _trace(request: dict[str, Any], events: _Events) -> dict[str, Any]:
    workload = _load_workload(request)
    events.emit("phase", phase="tracing", workload=workload.name)
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")  # before TF's import (worker_env sets it too)
    import tensorflow as tf
    from lms.tf.extract import trace_train_step

    if request.get("profile_batches"):
        # op times as the emulated trials see them: one op at a time (set before TF starts)
        tf.config.threading.set_inter_op_parallelism_threads(1)

    start = time.monotonic()
    model = workload.build_model()
    traced = trace_train_step(model, workload.loss_fn, workload.make_optimizer(), workload.x_spec(),
                              workload.y_spec(), batch_size=workload.default_batch, name=workload.name)
    graph = traced[0]
    graph.lint()
    doc = {"schema": "tuner.graph", "schema_version": 1, "key": request.get("key"),
           "workload": workload.describe(), "tensorflow": tf.__version__,
           "trace_s": round(time.monotonic() - start, 3), "graph": graph.to_dict()}
    if request.get("profile_batches"):
        doc["op_costs"] = _profile(traced[1], workload, [int(b) for b in request["profile_batches"]], events)
    atomic_write_text(request["output"], json.dumps(doc) + "\n")
    return {"status": "ok", "n_ops": len(graph.ops), "trace_s": doc["trace_s"], "tensorflow": tf.__version__,
            "op_costs": bool(doc.get("op_costs"))}


def _profile(step: Any, workload: Any, batches: list[int], events: _Events) -> dict[str, Any] | None:
    """Per-op times of the traced step on this CPU (`lms.tf.profile`), or None if profiling failed.

    Starts from ``batches[0]`` (the workload's default batch) and profiles at the
    batch whose step takes about a second and a quarter of it
    (`lms.tf.profile.profile_batches`). Run with one inter-op thread (set in
    `_trace`), as the emulated trials run; a failed profile only costs the
    simulator its measured times (it falls back to its roofline).
    """
    import tensorflow as tf

    from lms.tf.profile import profile_batches, profile_op_costs

    def make_args(batch: int) -> tuple[Any, Any]:
        x, y = workload.make_batch(batch, 0)
        return tf.convert_to_tensor(x), tf.convert_to_tensor(y)

    start = time.monotonic()
    try:
        batches = list(profile_batches(step, make_args, batches[0]))
        events.emit("phase", phase="profiling", batches=batches)
        costs = profile_op_costs(step, make_args, batches=batches)
    except Exception as exc:  # noqa: BLE001 - any failure: no measured op times, say why
        events.emit("warning", message=f"profiling the step failed ({_first_line(exc)}); "
                    "the simulator times ops with its roofline")
        return None
    doc = costs.to_dict()
    doc["profile_s"] = round(time.monotonic() - start, 3)
    return doc


def _measure(request: dict[str, Any], events: _Events) -> dict[str, Any]:
    from lms.config import LMSConfig
    from tuner.batch import Measurement, search_max_batch, usable_bytes

    workload = _load_workload(request)
    config = LMSConfig.from_dict(request["config"])
    backend = request["backend"]
    from lms.tf.measure import configure_cpu_allocator

    configure_cpu_allocator()
    import tensorflow as tf

    if backend == "emulated":
        # The emulated device runs under TF's single-threaded executor: one op order, fixed when
        # the function is built, the one the simulator's "cpu" profile models, so every step of a
        # trial peaks alike. (Under the default executor the order depends on timing: up to 50%
        # apart between processes with swaps; under this one, at most 12% on our benchmark.)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    if backend == "gpu":
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            return {"status": "error", "reason": "backend gpu: TensorFlow sees no GPU "
                    f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"}
        for g in gpus:
            tf.config.experimental.set_memory_growth(g, True)
    import lms
    from lms.tf.measure import measure_step
    from lms.tf.train import make_train_step

    device = "/GPU:0" if backend == "gpu" else "/CPU:0"
    model = workload.build_model()
    step = make_train_step(model, workload.loss_fn, workload.make_optimizer())
    # One trace serves every probed batch: the batch dim is left unknown (the plan does not depend on it).
    # autograph=False: make_train_step has no tensor-dependent Python control flow, so AutoGraph has
    # nothing to convert (and an AutoGraph-converted planner was once 10x slower on ResNet-50).
    fn = lms.function(step, config=config, emulate=(backend == "emulated"), bandwidth=request.get("bandwidth"),
                      input_signature=[workload.x_spec(), workload.y_spec()], autograph=False)
    seed = int(request.get("seed", 0))
    usable = usable_bytes(int(request["budget_bytes"]), float(request.get("safety_margin", 0.05)))
    timings: dict[int, Any] = {}

    def run(batch: int, *, warmup: int, steps: int) -> Any:
        x, y = workload.make_batch(batch, seed)
        with tf.device(device):
            data = (tf.convert_to_tensor(x), tf.convert_to_tensor(y))
        return measure_step(fn, [data], warmup=warmup, steps=steps, device=device,
                            executor="single_threaded" if backend == "emulated" else "default")

    def probe(batch: int) -> Measurement:
        events.emit("probe_start", batch=batch)
        try:
            m = run(batch, warmup=int(request.get("probe_warmup", 1)), steps=int(request.get("probe_steps", 1)))
        except tf.errors.ResourceExhaustedError as exc:
            return Measurement(None, oom=True, detail=_first_line(exc))
        timings[batch] = m
        return Measurement(int(m.peak_device_bytes), oom=False, step_time_s=float(m.median_step_s))

    def on_probe(p: Any) -> None:
        events.emit("probe", **p.to_dict(), usable_bytes=usable)

    search = search_max_batch(
        probe, usable=usable, start=int(request["start_batch"]), cap=int(request["cap"]),
        resolution=float(request.get("resolution", 0.05)), max_probes=int(request.get("max_probes", 6)),
        slope_bytes_per_sample=request.get("slope_bytes_per_sample"), on_probe=on_probe)
    out: dict[str, Any] = {"search": search.to_dict(), "tensorflow": tf.__version__,
                           "device": _device_name(tf, backend, timings), "lms_summary": _lms_summary(fn)}
    if search.batch == 0:
        oom = all(p.oom for p in search.probes)
        smallest = min(p.batch for p in search.probes)
        peak = next((p.peak_bytes for p in search.probes if p.batch == smallest), None)
        out.update(status="oom" if oom else "infeasible", batch_size=0, throughput=0.0,
                   reason=(f"batch {smallest} does not fit: "
                           + ("out of memory" if oom or peak is None
                              else f"peak {peak / 2**20:.1f} MiB > usable {usable / 2**20:.1f} MiB")),
                   peak_device_bytes=peak)
        return out
    # The timed run is longer than a probe and its peak can come out higher (the CPU executor's op
    # order varies): it must fit too, else the next smaller batch is tried (at most 3 times).
    batch, final = search.batch, None
    for _attempt in range(3):
        events.emit("phase", phase="timing", batch=batch)
        try:
            m = run(batch, warmup=int(request.get("warmup", 2)), steps=int(request.get("steps", 5)))
        except tf.errors.ResourceExhaustedError as exc:
            m, detail = None, f"out of memory ({_first_line(exc)})"
        else:
            detail = f"peak {m.peak_device_bytes / 2**20:.1f} MiB > usable {usable / 2**20:.1f} MiB"
        if m is not None and int(m.peak_device_bytes) <= usable:
            final = m
            break
        events.emit("timed_run_too_big", batch=batch, peak_bytes=None if m is None else int(m.peak_device_bytes),
                    detail=detail)
        # peaks are close to linear in the batch: 8% fewer samples, or the largest smaller probe that fitted
        lower = [p.batch for p in search.probes if p.fits and p.batch < batch]
        batch = max([*lower, int(batch * 0.92)])
        if batch < 1:
            break
    if final is None:
        out.update(status="infeasible", batch_size=0, throughput=0.0, peak_device_bytes=None,
                   reason="the batches found by the search did not fit on their timed runs")
        return out
    median = float(final.median_step_s)
    out.update(
        status="ok", reason="", batch_size=batch,
        throughput=batch / median if median > 0 else 0.0,
        step_time_median_s=median, step_time_spread_s=float(final.spread_s),
        step_times_s=[float(t) for t in final.step_times_s],
        peak_device_bytes=int(final.peak_device_bytes), peak_source=str(final.peak_source),
        nvml_process_peak_bytes=final.nvml_process_peak_bytes,
        nvml_device_peak_bytes=final.nvml_device_peak_bytes,
        host_peak_rss_bytes=final.host_peak_rss_bytes,
        fits_budget=int(final.peak_device_bytes) <= usable)
    return out


def _fake_fault(fault: str, request: dict[str, Any], events: _Events) -> dict[str, Any]:
    """Test-only (`FAULT_ENV`): act out `fault` instead of measuring; no TensorFlow."""
    events.emit("fault", kind=fault)
    if fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault in ("hang", "die"):  # "die": the parent kills itself; a worker that outlived it would finish
        time.sleep(3600)
    if fault == "raise":
        raise RuntimeError("injected fault: the model code raised")
    if fault == "oom":
        return {"status": "oom", "batch_size": 0, "throughput": 0.0, "peak_device_bytes": None,
                "reason": "batch 1 does not fit: out of memory (injected fault)"}
    batch = max(1, int(request.get("start_batch", 1)))  # "ok", "rofs": a synthetic result that fits
    usable = int(request["budget_bytes"])
    return {"status": "ok", "reason": "", "batch_size": batch, "throughput": 100.0 + batch,
            "step_time_median_s": batch / (100.0 + batch), "step_time_spread_s": 0.0,
            "peak_device_bytes": usable // 2, "peak_source": "tf-bfc-cpu", "fits_budget": True,
            "injected_fault": fault}


def _device_name(tf: Any, backend: str, timings: dict[int, Any]) -> str:
    measured = next((m.device_name for m in timings.values() if getattr(m, "device_name", "")), "")
    if backend == "gpu":
        return measured or "GPU:0"
    return f"emulated device on CPU ({measured or 'CPU:0'}), TF BFC allocator"


def _lms_summary(fn: Any) -> dict[str, Any]:
    summary = getattr(fn, "summary", None)
    if summary is None:
        return {"n_swapped": 0}
    data = summary.to_dict() if hasattr(summary, "to_dict") else dict(summary)
    return {k: data[k] for k in ("n_swapped", "n_swap_ins", "swapped_bytes", "n_candidates", "swap_ops")
            if k in data}


def _summary(exc: BaseException) -> str:
    """First and last line of an error: TensorFlow's "in user code:" errors put the cause on the last line."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    if len(lines) <= 1:
        return _first_line(exc)
    first, last = lines[0][:150], lines[-1][:300]
    return first if first == last else f"{first} ... {last}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def main(argv: list[str] | None = None) -> int:
    """Worker entry point: ``python -m tuner.trial request.json``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tuner.trial REQUEST.json (started by the tuner)", file=sys.stderr)
        return BAD_INPUT_EXIT
    _watch_parent()
    request = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    events = _Events(request.get("events"))
    start = time.monotonic()
    mode = request.get("mode")
    try:
        if mode == "describe":
            result = _describe(request)
        elif mode == "trace":
            result = _trace(request, events)
        elif mode == "measure":
            fault = injected_fault(request.get("trial"))
            result = _fake_fault(fault, request, events) if fault else _measure(request, events)
        else:
            result = {"status": "error", "reason": f"unknown worker mode {mode!r}"}
    except _BadInput as exc:
        result = {"status": "bad_input", "reason": str(exc)}
    except Exception as exc:
        result = {"status": "error", "reason": f"{type(exc).__name__}: {_summary(exc)}"}
        log.exception("worker failed")
    result["wall_s"] = round(time.monotonic() - start, 3)
    if mode == "measure" and injected_fault(request.get("trial")) == "rofs":
        import errno  # test-only: the study folder turned read-only under the worker

        raise OSError(errno.EROFS, os.strerror(errno.EROFS), request.get("result"))
    if request.get("result"):
        atomic_write_text(request["result"], json.dumps(result, indent=2, default=_json_default) + "\n")
    else:
        print(json.dumps(result, default=_json_default))
    return BAD_INPUT_EXIT if result["status"] == "bad_input" else 0


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
