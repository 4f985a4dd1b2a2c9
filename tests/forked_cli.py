"""``python -m tuner ARGS`` and TensorFlow subprocesses for the tests, forked from a process that imported them.

The suite runs the real command line a few hundred times (`tests.tuner.conftest.run_cli`).
A process started from nothing spends about 1.3 s of one core importing what
every ``python -m tuner`` imports (Optuna, its RDB storage and Alembic,
SQLAlchemy's ORM, pandas) before it does anything the test checks. Here one
server per pytest worker (per ``PYTHON*`` environment) imports them once and
forks a command per request; the fork becomes what ``python -m tuner ARGS`` started
from nothing would be:

- its own session and process group (``setsid``), stdin from ``/dev/null``, stdout and stderr
  into the caller's pipes (passed over the socket, ``SCM_RIGHTS``);
- the caller's working directory (also ``sys.path[0]``, as ``-m`` sets it) and its whole environment;
  the random modules reseeded from the OS;
- ``tuner``'s ``__main__`` run by `runpy`, then Python's own exit: non-daemon threads joined, ``atexit``
  handlers run, streams flushed, the exit code as Python gives it (``SystemExit``, a traceback: 1).

Nothing of the tuner reads the environment when it is imported (`tests/tuner/test_forked_cli.py`
checks), so modules imported before the fork see the command's environment. TensorFlow
is never imported by the server: the CLI process does not import it either.

`run_python` does the same for the suite's TensorFlow subprocesses (``python -m tests.tf.auto_worker``,
``python tests/tf/test_emulated_memory.py``), from a server that imported TensorFlow and Keras and
started none of TensorFlow's runtime (no device, allocator or thread pool: TensorFlow makes them on
first use, in the fork), as the tuner's own workers are (`tuner.worker.zygote`, whose test compares the
allocator's peaks to the byte). TensorFlow reads some variables when it is imported, so such a server
is shared only by commands with the same whole environment (pytest's per-test variable aside). Tests
whose subject is what differs between fresh processes (`tests/tf/test_exact.py`'s same-peak-in-every-process)
still start theirs from nothing: forks share their server's memory layout.

``LMS_TEST_FORKED_CLI=0`` runs every command from nothing instead; so does a platform without
``socket.send_fds``, a server that cannot start, or two servers of a kind already running a command each.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

__all__ = ["ENV", "run", "run_python", "enabled", "PRELOADED", "PRELOADED_TF"]

ENV = "LMS_TEST_FORKED_CLI"
ROOT = Path(__file__).resolve().parents[1]
_MAX_MESSAGE = 1 << 20
_POLL_S = 0.01
#: What a ``python -m tuner search`` process imports before its first trial, in the order it does.
PRELOADED = ("tuner.cli", "tuner.cli.run", "tuner.search", "tuner.study.loop", "tuner.outputs", "tuner.study.storage",
             "optuna", "optuna.storages._rdb.storage", "optuna.storages._rdb.models", "alembic.command",
             "alembic.migration", "sqlalchemy.orm", "pandas")
#: What the suite's TensorFlow subprocesses import first (`run_python`).
PRELOADED_TF = ("tensorflow", "keras")


# ---------------------------------------------------------------- the caller's side


def enabled() -> bool:
    return (os.environ.get(ENV, "1") != "0" and sys.platform.startswith("linux")
            and hasattr(socket, "send_fds"))


class _Server:
    def __init__(self, env: dict[str, str], preload: Sequence[str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.forked_cli", str(theirs.fileno()), *preload],
                                         env=env,
                                         cwd=ROOT, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True)
        finally:
            theirs.close()
        self.sock = ours
        self.lock = threading.Lock()
        self.in_flight = 0  # commands asked for and not yet ended (under _SERVERS_LOCK)
        ours.settimeout(120)
        try:
            self.ready = json.loads(ours.recv(_MAX_MESSAGE) or b"{}").get("ready", False)
        except (OSError, ValueError):
            self.ready = False
        ours.settimeout(None)

    def alive(self) -> bool:
        return self.ready and self.proc.poll() is None

    def close(self) -> None:
        from tuner.worker.zygote import end_server

        end_server(self.sock, self.proc)


_SERVERS: dict[tuple, _Server] = {}  # oldest first
_MAX_SERVERS_PER_PRELOAD = 2
_SERVERS_LOCK = threading.Lock()


def _server(env: dict[str, str], preload: Sequence[str], whole_env: bool) -> _Server | None:
    """The server for `preload` and `env`: the same one for every environment with the same ``PYTHON*``
    variables (`whole_env`: the same variables, but for pytest's per-test one), started on first use."""
    key = (tuple(preload), tuple(sorted((k, v) for k, v in env.items()
                                        if (k != "PYTEST_CURRENT_TEST" if whole_env else k.startswith("PYTHON")))))
    with _SERVERS_LOCK:
        server = _SERVERS.get(key)
        if server is None or not server.alive():
            same_kind = [k for k in _SERVERS if k[0] == key[0]]
            idle = [k for k in same_kind if not _SERVERS[k].in_flight]
            while len(same_kind) >= _MAX_SERVERS_PER_PRELOAD and idle:  # each holds its imports' memory (TF: ~0.5 GB)
                oldest = idle.pop(0)
                same_kind.remove(oldest)
                _SERVERS.pop(oldest).close()
            if len(same_kind) >= _MAX_SERVERS_PER_PRELOAD:
                return None  # each runs a command: closing one would end it
            try:
                server = _Server(env, preload)
            except OSError:
                return None
            if not server.alive():
                return None
            _SERVERS[key] = server
        server.in_flight += 1
        return server


def run(args: Sequence[str], *, cwd: Path | str, env: dict[str, str], timeout: float | None
        ) -> subprocess.CompletedProcess:
    """``subprocess.run([python, -m, tuner, *args], cwd=, env=, capture_output=True, text=True, timeout=)``,
    forked (see the module's docstring) or, when that is off or cannot be, started from nothing."""
    return run_python(["-m", "tuner", *args], cwd=cwd, env=env, timeout=timeout, preload=PRELOADED)


def run_python(argv: Sequence[str], *, cwd: Path | str, env: dict[str, str], timeout: float | None,
               preload: Sequence[str] = PRELOADED_TF) -> subprocess.CompletedProcess:
    """``subprocess.run([python, *argv], ...)`` as `run`, for ``-m MODULE ARGS`` or ``SCRIPT ARGS``, forked from a
    server that imported `preload` (by default TensorFlow and Keras: see the module's docstring for why that is
    the same as a process started from nothing). A server that imported TensorFlow is only shared by commands
    with the same whole environment (TensorFlow reads some variables when it is imported)."""
    cmd = [sys.executable, *argv]
    server = _server(env, preload, whole_env=preload != PRELOADED) if enabled() else None
    if server is None:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    try:
        return _forked(server, cmd, argv, cwd=cwd, env=env, timeout=timeout)
    finally:
        with _SERVERS_LOCK:
            server.in_flight -= 1


def _forked(server: _Server, cmd: list[str], argv: Sequence[str], *, cwd: Path | str, env: dict[str, str],
            timeout: float | None) -> subprocess.CompletedProcess:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        msg = json.dumps({"argv": list(argv), "cwd": str(Path(cwd).absolute()), "env": env}).encode()
        with server.lock:
            socket.send_fds(server.sock, [msg], [out_w, err_w, theirs.fileno()])
    finally:
        for fd in (out_w, err_w):
            os.close(fd)
        theirs.close()
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    deadline = None if timeout is None else time.monotonic() + timeout
    pid = returncode = None
    open_fds = [out_r, err_r, mine.fileno()]
    try:
        while out_r in open_fds or err_r in open_fds or returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            ready = select.select(open_fds, [], [], left)[0]
            for fd in ready:
                if fd == mine.fileno():
                    data = mine.recv(_MAX_MESSAGE)
                    if not data:  # the server is gone, and the command's exit status with it: count it killed
                        open_fds.remove(fd)
                        returncode = -signal.SIGKILL if returncode is None else returncode
                        continue
                    reply = json.loads(data)
                    pid = reply.get("pid", pid)
                    if "returncode" in reply:
                        returncode = reply["returncode"]
                        open_fds.remove(fd)
                else:
                    data = os.read(fd, 1 << 16)
                    if data:
                        chunks[fd].append(data)
                    else:
                        open_fds.remove(fd)
        stdout, stderr = (b"".join(chunks[fd]).decode("utf-8", "replace") for fd in (out_r, err_r))
        if returncode is None:  # timed out: end it and its group, as a test's subprocess.run(timeout=) would
            if pid is not None:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            raise subprocess.TimeoutExpired(cmd, timeout or 0.0, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(cmd, returncode, stdout, stderr)
    finally:
        os.close(out_r)
        os.close(err_r)
        mine.close()


# ---------------------------------------------------------------- the server (python -m tests.forked_cli FD)


def _serve(sock: socket.socket, preload: Sequence[str]) -> None:
    import importlib

    from tuner.worker.run import die_with_parent

    die_with_parent()  # the server dies with its pytest worker (a running command goes on, as a subprocess would)
    for name in preload:
        importlib.import_module(name)
    sock.send(json.dumps({"ready": True}).encode())
    children: dict[int, socket.socket] = {}
    try:
        while True:
            if select.select([sock], [], [], _POLL_S)[0]:
                msg, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 3)
                if not msg:
                    break  # the pytest worker closed us, or is gone
                req = json.loads(msg)
                reply = socket.socket(fileno=fds[2])
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    sock.close()
                    reply.close()
                    _command(req, fds[0], fds[1])  # never returns
                os.close(fds[0])
                os.close(fds[1])
                children[pid] = reply
                _send(reply, {"pid": pid})
            for pid in list(children):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    reply = children.pop(pid)
                    _send(reply, {"returncode": os.waitstatus_to_exitcode(status)})
                    reply.close()
    finally:
        for pid in children:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _send(sock: socket.socket, doc: dict) -> None:
    try:
        sock.send(json.dumps(doc).encode())
    except OSError:  # the caller gave up on it (its timeout)
        pass


def _command(req: dict, out_fd: int, err_fd: int) -> None:
    """In the fork: become ``python ARGV`` started from nothing, run it, exit as Python would."""
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        for fd in (null, out_fd, err_fd):
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for name in [m for m in sys.modules if m == "tests" or m.startswith("tests.")]:
            del sys.modules[name]  # the server's own package: importable by the command only from its own path
        argv = req["argv"]
        # as Python sets it: the working directory for -m, the script's folder for a script
        sys.path[0] = req["cwd"] if argv[0] == "-m" else os.path.dirname(os.path.abspath(argv[0]))
        import random

        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        code = _run_main(argv)
        threading._shutdown()  # noqa: SLF001  # what the interpreter does at exit: join non-daemon threads
        import atexit

        atexit._run_exitfuncs()  # noqa: SLF001
    except BaseException:  # noqa: BLE001  # the fork never returns into the server's loop
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _run_main(argv: list[str]) -> int:
    import runpy

    try:
        if argv[0] == "-m":
            sys.argv = ["-m", *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # as Python ends on one: by the signal
        return 130
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    _serve(socket.socket(fileno=int(sys.argv[1])), sys.argv[2:])
    os._exit(0)
