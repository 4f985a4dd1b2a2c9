"""``python -m tuner ARGS`` for the tests, forked from a process that imported the tuner's CLI once.

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

Nothing of the tuner reads the environment when it is imported (`tests/test_forked_cli.py`
checks), so modules imported before the fork see the command's environment. TensorFlow
is never imported by the server: the CLI process does not import it either.

``LMS_TEST_FORKED_CLI=0`` runs every command from nothing instead; so does a platform without
``socket.send_fds``, or a server that cannot start.
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

__all__ = ["ENV", "run", "enabled", "PRELOADED"]

ENV = "LMS_TEST_FORKED_CLI"
ROOT = Path(__file__).resolve().parents[1]
_MAX_MESSAGE = 1 << 20
_POLL_S = 0.01
#: What a ``python -m tuner search`` process imports before its first trial, in the order it does.
PRELOADED = ("tuner.cli", "tuner.cli.run", "tuner.search", "tuner.loop", "tuner.outputs", "tuner.storage",
             "optuna", "optuna.storages._rdb.storage", "optuna.storages._rdb.models", "alembic.command",
             "alembic.migration", "sqlalchemy.orm", "pandas")


# ---------------------------------------------------------------- the caller's side


def enabled() -> bool:
    return (os.environ.get(ENV, "1") != "0" and sys.platform.startswith("linux")
            and hasattr(socket, "send_fds"))


class _Server:
    def __init__(self, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.forked_cli", str(theirs.fileno())], env=env,
                                         cwd=ROOT, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True)
        finally:
            theirs.close()
        self.sock = ours
        self.lock = threading.Lock()
        ours.settimeout(120)
        try:
            self.ready = json.loads(ours.recv(_MAX_MESSAGE) or b"{}").get("ready", False)
        except (OSError, ValueError):
            self.ready = False
        ours.settimeout(None)

    def alive(self) -> bool:
        return self.ready and self.proc.poll() is None


_SERVERS: dict[tuple, _Server] = {}
_SERVERS_LOCK = threading.Lock()


def _server(env: dict[str, str]) -> _Server | None:
    key = tuple(sorted((k, v) for k, v in env.items() if k.startswith("PYTHON")))
    with _SERVERS_LOCK:
        server = _SERVERS.get(key)
        if server is None or not server.alive():
            try:
                server = _Server(env)
            except OSError:
                return None
            if not server.alive():
                return None
            _SERVERS[key] = server
        return server


def run(args: Sequence[str], *, cwd: Path | str, env: dict[str, str], timeout: float | None
        ) -> subprocess.CompletedProcess:
    """``subprocess.run([python, -m, tuner, *args], cwd=, env=, capture_output=True, text=True, timeout=)``,
    forked (see the module's docstring) or, when that is off or cannot be, started from nothing."""
    cmd = [sys.executable, "-m", "tuner", *args]
    server = _server(env) if enabled() else None
    if server is None:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        msg = json.dumps({"args": list(args), "cwd": str(Path(cwd).absolute()), "env": env}).encode()
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
                    if not data:  # the server is gone: so is the command (its parent-death signal)
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


def _serve(sock: socket.socket) -> None:
    import importlib

    from tuner.worker import die_with_parent

    die_with_parent()  # the server dies with its pytest worker (a running command goes on, as a subprocess would)
    for name in PRELOADED:
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
    """In the fork: become ``python -m tuner ARGS`` started from nothing, run it, exit as Python would."""
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
        sys.path[0] = req["cwd"]  # as `python -m` sets it
        import random

        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        sys.argv = ["-m", *req["args"]]
        code = _run_main()
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


def _run_main() -> int:
    import runpy

    try:
        runpy.run_module("tuner", run_name="__main__", alter_sys=True)
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
    _serve(socket.socket(fileno=int(sys.argv[1])))
    os._exit(0)
