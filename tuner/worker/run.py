"""The parent's side of a trial worker: start ``python -m tuner.trial``, follow it, stop it, read its result.

TensorFlow does not reliably give memory back inside one process, and an
out-of-memory error or a kill must not take the study down, so every real
measurement runs in its own process::

    parent (no TF)                         worker: python -m tuner.trial request.json
      writes request.json   ─────────────▶  loads the workload, builds the model,
      tails events.jsonl    ◀── probe ────  lms.function(step, config=...), then per batch:
      kills it on timeout                     measure_step -> "batch N fits / does not fit"
      reads result.json     ◀── result ───  final timing at the largest fitting batch

Requests and results are the typed messages of `tuner.worker.protocol`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from lms.config import atomic_write_text

from .faults import FAULT_ENV, injected_fault
from .protocol import DescribeRequest, Envelope, MeasureRequest, ProtocolError, TraceRequest, result_type

__all__ = ["WorkerOutcome", "run_worker", "worker_env", "die_with_parent", "PARENT_PIPE_ENV", "PARENT_PID_ENV"]

log = logging.getLogger(__name__)

_POLL_S = 0.25
_TERM_GRACE_S = 5.0
#: The worker watches this inherited pipe end: end of file means its parent is gone, and it exits.
PARENT_PIPE_ENV = "LMS_TUNER_PARENT_FD"
PARENT_PID_ENV = "LMS_TUNER_PARENT_PID"


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
        result: the worker's result (`tuner.worker.protocol`; None when it wrote none).
        events: the progress events it wrote (probes etc.).
        returncode: the process's exit code (negative: the signal).
        reason: one line for people.
        log_path: the worker's stdout+stderr.
        wall_s: seconds from start to end.
    """

    status: str
    result: Any
    events: tuple[dict[str, Any], ...] = field(default=())
    returncode: int | None = None
    reason: str = ""
    log_path: Path | None = None
    wall_s: float = 0.0


def worker_env(*, gpu: str | None = None) -> dict[str, str]:
    """Environment for a worker: on the GPU `gpu` (a ``CUDA_VISIBLE_DEVICES`` value), or none (CPU).

    The CPU allocator is always BFC (``TF_CPU_ALLOCATOR_USE_BFC=true``), so
    TF's own peak is exact on CPU. On the CPU (trace, describe, emulate) oneDNN
    is on unless the caller set ``TF_ENABLE_ONEDNN_OPTS``: TensorFlow enables it by
    default only on CPUs with AVX-512 VNNI/BF16 or AMX, and the emulated device
    must not measure other kernels (and other memory: Eigen's
    ``Conv2DBackpropFilter`` takes a 32 MiB buffer at any batch) on another CPU;
    TensorFlow's INFO and WARNING lines are hidden (``TF_CPP_MIN_LOG_LEVEL=2``)
    unless the caller set the level. On a GPU, `gpu` is the device's UUID as the
    parent resolved it (`tuner.worker.gpus.choose_gpu`) and the rest is
    `tuner.worker.gpus.gpu_worker_env` (TensorFlow's warnings stay in the log).
    The worker imports this checkout's packages even when started from elsewhere.
    """
    if gpu is not None:
        from .gpus import gpu_worker_env

        env, notes = gpu_worker_env(os.environ, visible=str(gpu))
        for note in notes:
            log.debug("worker environment: %s", note)
    else:
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["CUDA_VISIBLE_DEVICES"] = ""  # trace / emulate on the CPU, never grab a GPU
        env.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    env["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    env["PYTHONUNBUFFERED"] = "1"
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


Request = DescribeRequest | TraceRequest | MeasureRequest


def die_with_parent() -> None:
    """Linux: ask the kernel to SIGKILL this process when its parent dies (``prctl(PR_SET_PDEATHSIG)``);
    elsewhere nothing. Called by a worker, and by the zygote its workers are forked from (`tuner.worker.zygote`)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def run_worker(request: Request, *, workdir: Path, timeout_s: float | None = None,
               env: dict[str, str] | None = None,
               on_event: Callable[[dict[str, Any]], None] | None = None,
               should_stop: Callable[[], bool] | None = None) -> WorkerOutcome:
    """Run ``python -m tuner.trial`` on `request` in `workdir` and wait for it.

    Args:
        request: the job (`tuner.worker.protocol`); it travels with the events and result paths.
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
    request_path = workdir / "request.json"
    atomic_write_text(request_path, Envelope(request, str(events_path), str(result_path)).to_json())
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
    # The worker leads its own session and process group (start_new_session): whatever it or the user's model
    # code starts stays in that group, and the whole group is ended when the worker ends (`_end_group`).
    # Its output goes through a pipe into worker.log, capped (`_copy_log`): a model printing without end
    # must not fill the disk.
    # A worker that imports TensorFlow on the CPU is forked from a process that imported it once
    # (`tuner.worker.zygote`).
    try:
        proc: Any = _forked(request, env, request_path, watch_r)
        if proc is None:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True, pass_fds=(watch_r,))
    except BaseException:
        os.close(watch_w)
        raise
    finally:
        os.close(watch_r)
    copier = threading.Thread(target=_copy_log, args=(proc.stdout, log_path), name="worker-log", daemon=True)
    copier.start()
    try:
        if isinstance(request, MeasureRequest) and injected_fault(request.trial, confirm=request.confirm) == "die":
            _wait_for_file(events_path, 30)  # test-only: the whole search process dies mid-trial
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            while True:
                if _exited(proc, _POLL_S):
                    _end_group(proc)
                    break
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
    finally:
        copier.join(timeout=_TERM_GRACE_S)  # the group is gone: the pipe is at its end (a process that left it
        # with setsid may hold it longer; its output is then not waited for)
    _read_events(events_path, offset, events, on_event)
    wall = time.monotonic() - start
    rc = proc.returncode
    result, malformed = _read_result(result_path, request.mode)
    if malformed:
        return WorkerOutcome("error", None, tuple(events), rc, f"worker wrote a malformed result: {malformed}",
                             log_path, wall)
    if killed_by_us:
        return WorkerOutcome("stopped" if stopped else "timeout", result, tuple(events), rc, killed_by_us, log_path, wall)
    if result is not None:
        return WorkerOutcome(result.status, result, tuple(events), rc, _explained(result.reason, log_path),
                             log_path, wall)
    if rc is not None and rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        reason = f"worker killed by {name}" + (" (host out of memory?)" if -rc == signal.SIGKILL else "")
        return WorkerOutcome("killed", None, tuple(events), rc, reason, log_path, wall)
    tail = _log_tail(log_path)
    return WorkerOutcome("error", None, tuple(events), rc,
                         f"worker exited with code {rc} without a result: {tail}", log_path, wall)


def _forked(request: Request, env: dict[str, str], request_path: Path, watch_r: int) -> Any:
    """The worker forked from the zygote for `env` (`tuner.worker.zygote`), or None: it is started from nothing."""
    from . import zygote

    if not zygote.enabled(env):
        return None
    if isinstance(request, MeasureRequest):
        if injected_fault(request.trial, env.get(FAULT_ENV, ""), confirm=request.confirm):
            return None  # test-only faults: most never import TensorFlow
    elif not isinstance(request, TraceRequest):
        return None
    return zygote.spawn(str(request_path), env, watch_r)


def _terminate(proc: subprocess.Popen) -> None:
    """SIGTERM to the worker's group, SIGKILL after a grace period; the whole group is ended either way."""
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        _exited(proc, _TERM_GRACE_S)
    _end_group(proc)


def _exited(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for the worker to exit, without reaping it (`_end_group` does).

    While the exited worker is not reaped its process id stays taken, so its process group
    id cannot name another group when `_end_group` signals it.
    """
    if proc.returncode is not None:
        return True
    if not hasattr(os, "waitid") or not isinstance(proc, subprocess.Popen):  # a zygote's fork: it reports the exit
        try:
            proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:  # reaped already
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(0.02, left))


def _end_group(proc: subprocess.Popen) -> None:
    """SIGKILL whatever is left in the worker's process group (children of the model code), then reap the worker.

    Called once the worker has exited (or to stop it): a child it forked would otherwise live
    on, reparented to PID 1.
    """
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


#: worker.log keeps the first and the last this many bytes of a worker's output (the middle is cut, and said so).
LOG_HEAD_BYTES = 1 << 20
LOG_TAIL_BYTES = 1 << 20


def _copy_log(stream: Any, path: Path) -> None:
    """Copy the worker's output into `path`: the first `LOG_HEAD_BYTES` as they come, the last `LOG_TAIL_BYTES`
    at the end.

    The pipe is drained to its end whatever happens to the file (a full disk, a folder turned
    read-only): a worker must never block on its own output.
    """
    tail = bytearray()
    cut = written = 0
    try:
        out: Any = open(path, "wb")
    except OSError as exc:
        log.warning("cannot write %s (%s); the worker's output is not kept", path, exc)
        out = None
    with stream:
        for chunk in iter(lambda: stream.read1(1 << 16), b""):
            if written < LOG_HEAD_BYTES:
                head = chunk[:LOG_HEAD_BYTES - written]
                out = _write(out, head)
                written += len(head)
                chunk = chunk[len(head):]
            if chunk:
                tail += chunk
                if len(tail) > LOG_TAIL_BYTES:
                    cut += len(tail) - LOG_TAIL_BYTES
                    del tail[:len(tail) - LOG_TAIL_BYTES]
    if cut:
        out = _write(out, f"\n[... {cut} bytes of output cut (worker.log keeps the first {LOG_HEAD_BYTES >> 20} MiB "
                          f"and the last {LOG_TAIL_BYTES >> 20} MiB) ...]\n".encode())
    out = _write(out, bytes(tail))
    if out is not None:
        with contextlib.suppress(OSError):
            out.close()


def _write(out: Any, data: bytes) -> Any:
    """Write and flush `data` to `out`; None (and nothing more is written) once writing failed."""
    if out is None or not data:
        return out
    try:
        out.write(data)
        out.flush()
        return out
    except OSError:
        with contextlib.suppress(OSError):
            out.close()
        return None


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


def _read_result(path: Path, mode: str) -> tuple[Any, str]:
    """(the typed result, "") ; (None, "") when there is none; (None, why) when it does not parse."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None, ""
    try:
        return result_type(mode).from_dict(data), ""
    except ProtocolError as exc:
        return None, str(exc)


def _explained(reason: str, log_path: Path) -> str:
    """`reason`, plus what TensorFlow logged about the GPU's libraries when it found no GPU (`tuner.worker.gpus`)."""
    from .gpus import NO_GPU_REASON, explain_no_gpu

    if not reason.startswith(NO_GPU_REASON):
        return reason
    try:
        return explain_no_gpu(reason, log_path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return reason


def _log_tail(path: Path, *, lines: int = 3) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    tail = [ln.strip() for ln in text if ln.strip()][-lines:]
    return " | ".join(tail)[-400:] or "(empty log)"


