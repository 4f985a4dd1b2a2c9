"""Fresh worker processes without a fresh TensorFlow import: forked from a process that imported it once.

Every real measurement runs in its own process (`tuner.worker.run`), and each used to
import TensorFlow first: about 5.5 s of one core, paid by each of the 10-15
processes of a default search. A *zygote* is one process per search (per
worker environment) that imports TensorFlow and waits; each worker is a fork of
it, which starts with TensorFlow imported and nothing of TensorFlow's runtime
made: no device, no allocator, no thread pool, no op has run (TensorFlow makes
them on first use, in the worker). What a worker measures is the same as in a
process started from nothing (`tests/tuner/test_zygote.py` compares the
allocator's peaks to the byte).

::

    search (no TF)                    zygote: python -m tuner.zygote_server FD       worker (a fork of the zygote)
      spawn(request.json, log, watch) ─▶ fork ──────────────────────────────▶  setsid, stdout/err -> log,
      ◀── pid                                                                  tuner.trial.main(request.json)
      killpg(pid) on timeout / stop
      ◀── exit: pid, returncode ─────── reaps it (after ending its group)

The worker keeps every guarantee of `tuner.worker.run.run_worker`: it leads its own
session and process group, its output goes through a pipe into ``worker.log``, it
exits when the search process is gone (the watch pipe, and the kernel's parent-death
signal through the zygote, which dies with the search), and its exit code or signal
is reported as ``returncode``, the way `subprocess` does.

Used only for workers on the CPU (``CUDA_VISIBLE_DEVICES=""``, `tuner.worker.run.worker_env`) that import
TensorFlow (trace and measure requests without an injected fault), on Linux;
``LMS_TUNER_ZYGOTE=0`` turns it off. Anything else, or a zygote that cannot start,
runs ``python -m tuner.trial`` from nothing as before.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

__all__ = ["ZYGOTE_ENV", "PER_WORKER_ENV", "MAX_MESSAGE", "ZygoteProcess", "enabled", "spawn", "pids", "close_all",
           "end_server"]

log = logging.getLogger(__name__)

#: ``0`` turns the zygote off (every worker is started from nothing).
ZYGOTE_ENV = "LMS_TUNER_ZYGOTE"
#: Variables that differ between workers whose zygote may be shared: set by `tuner.worker.run.run_worker` per worker,
#: or by pytest per test. Each fork gets the whole environment its worker was given.
PER_WORKER_ENV = ("LMS_TUNER_PARENT_FD", "LMS_TUNER_PARENT_PID", "PYTEST_CURRENT_TEST")
#: At most this many zygotes live at once (one per worker environment; the oldest is closed).
_MAX_ZYGOTES = 2
_READY_TIMEOUT_S = 300.0
_SPAWN_TIMEOUT_S = 60.0
#: The largest message on the socket (a request carries the worker's environment).
MAX_MESSAGE = 1 << 20


def enabled(env: dict[str, str]) -> bool:
    """Whether workers with environment `env` are forked from a zygote (see the module's docstring)."""
    return (sys.platform.startswith("linux") and hasattr(socket, "send_fds")
            and env.get(ZYGOTE_ENV, os.environ.get(ZYGOTE_ENV, "1")) != "0"
            and env.get("CUDA_VISIBLE_DEVICES") == "")


class ZygoteProcess:
    """The part of `subprocess.Popen` that `tuner.worker.run` uses, for a worker forked by a zygote."""

    def __init__(self, pid: int, stdout: Any) -> None:
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self._done = threading.Event()

    def _ended(self, returncode: int) -> None:
        self.returncode = returncode
        self._done.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode


class _Zygote:
    """The search's side of one zygote process."""

    def __init__(self, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "tuner.zygote_server", str(theirs.fileno())], env=env,
                                         pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self._lock = threading.Lock()
        self._children: dict[int, ZygoteProcess] = {}
        self._exits: dict[int, int] = {}
        self._replies: dict[int, int] = {}
        self._changed = threading.Condition(self._lock)
        self._next_id = 0
        self._in_flight = 0
        self.ready = False
        self.dead = False
        threading.Thread(target=self._read, name="zygote-reader", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            msg = json.loads(data)
            with self._changed:
                if msg.get("ready"):
                    self.ready = True
                elif "exit" in msg:
                    pid, rc = int(msg["exit"]), int(msg["returncode"])
                    child = self._children.pop(pid, None)
                    if child is None:
                        self._exits[pid] = rc
                    else:
                        child._ended(rc)  # noqa: SLF001
                elif "pid" in msg:
                    self._replies[int(msg["id"])] = int(msg["pid"])
                self._changed.notify_all()
        with self._changed:  # the zygote is gone, and its workers with it (their parent-death signal)
            self.dead = True
            for child in self._children.values():
                child._ended(-signal.SIGKILL)  # noqa: SLF001
            self._children.clear()
            self._changed.notify_all()

    def busy(self) -> bool:
        """Whether a worker of this zygote runs or is being started (closing it would end that worker)."""
        with self._lock:
            return bool(self._children or self._in_flight)

    def wait_ready(self, timeout_s: float) -> bool:
        with self._changed:
            self._changed.wait_for(lambda: self.ready or self.dead, timeout_s)
            return self.ready and not self.dead

    def spawn(self, request_path: str, env: dict[str, str], watch_fd: int) -> ZygoteProcess:
        """Fork a worker on `request_path`; its output comes out of the returned process's ``stdout``."""
        with self._changed:
            ident = self._next_id
            self._next_id += 1
            self._in_flight += 1
        try:
            return self._spawn(ident, request_path, env, watch_fd)
        finally:
            with self._changed:
                self._in_flight -= 1

    def _spawn(self, ident: int, request_path: str, env: dict[str, str], watch_fd: int) -> ZygoteProcess:
        read_end, write_end = os.pipe()
        try:
            msg = json.dumps({"id": ident, "request": request_path, "cwd": os.getcwd(), "env": env}).encode()
            socket.send_fds(self.sock, [msg], [write_end, watch_fd])
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        stdout = os.fdopen(read_end, "rb")
        with self._changed:
            if not self._changed.wait_for(lambda: ident in self._replies or self.dead, _SPAWN_TIMEOUT_S) \
                    or ident not in self._replies:
                stdout.close()
                raise OSError("the zygote did not start the worker")
            pid = self._replies.pop(ident)
            child = ZygoteProcess(pid, stdout)
            if pid in self._exits:
                child._ended(self._exits.pop(pid))  # noqa: SLF001
            else:
                self._children[pid] = child
        return child

    def close(self) -> None:
        end_server(self.sock, self.proc)  # the zygote ends its workers and exits


def end_server(sock: socket.socket, proc: subprocess.Popen) -> None:
    """Close our end of a fork server's socket, which is its end of file, and wait for it to exit (10 s, then
    kill it). Shutdown first, not only close: a thread of ours blocked in ``recv`` holds the socket open."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


_ZYGOTES: dict[tuple, _Zygote] = {}
_REGISTRY_LOCK = threading.Lock()


def spawn(request_path: str, env: dict[str, str], watch_fd: int) -> ZygoteProcess | None:
    """A worker on `request_path` forked from the zygote for `env` (started on first use); None: none could be
    started (the caller starts ``python -m tuner.trial`` itself). `env`'s per-worker variables are set in the fork."""
    key = tuple(sorted((k, v) for k, v in env.items() if k not in PER_WORKER_ENV))
    with _REGISTRY_LOCK:
        zygote = _ZYGOTES.get(key)
        if zygote is not None and zygote.dead:
            del _ZYGOTES[key]
            zygote = None
        if zygote is None:
            idle = [k for k, z in _ZYGOTES.items() if not z.busy()]
            while len(_ZYGOTES) >= _MAX_ZYGOTES and idle:
                _ZYGOTES.pop(idle.pop(0)).close()
            if len(_ZYGOTES) >= _MAX_ZYGOTES:  # each has a worker running: closing one would end it
                log.debug("every zygote is busy: the worker starts from nothing")
                return None
            try:
                zygote = _Zygote({k: v for k, v in env.items() if k not in PER_WORKER_ENV})
            except OSError as exc:
                log.debug("no zygote (%s): the worker starts from nothing", exc)
                return None
            _ZYGOTES[key] = zygote
    if not zygote.wait_ready(_READY_TIMEOUT_S):
        log.debug("the zygote did not get ready: the worker starts from nothing")
        return None
    try:
        return zygote.spawn(request_path, env, watch_fd)
    except OSError as exc:
        log.debug("the zygote could not fork a worker (%s): it starts from nothing", exc)
        return None


def pids() -> list[int]:
    """The process ids of the live zygotes of this process."""
    with _REGISTRY_LOCK:
        return [z.proc.pid for z in _ZYGOTES.values() if not z.dead and z.proc.poll() is None]


def close_all() -> None:
    """End every zygote (their workers too): at the search process's exit."""
    with _REGISTRY_LOCK:
        zygotes = list(_ZYGOTES.values())
        _ZYGOTES.clear()
    for zygote in zygotes:
        zygote.close()


atexit.register(close_all)
