"""The zygote process of `tuner.worker.zygote`: import TensorFlow once, then fork a worker per request.

``python -m tuner.zygote_server FD``, started by `tuner.worker.zygote` with one end of a
socket pair. Each request (JSON, with the worker's log pipe and watch pipe as
file descriptors) is answered with the fork's process id; each fork's end with its
exit code (as `subprocess` gives it: negative for a signal), after its process
group has been ended. End of file on the socket (the search closed it, or died)
ends every worker and the zygote.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys

from tuner.worker.zygote import MAX_MESSAGE

__all__ = ["main"]

_POLL_S = 0.02


def _serve(sock: socket.socket) -> None:
    from tuner.trial import import_tensorflow
    from tuner.worker.run import PARENT_PID_ENV, PARENT_PIPE_ENV, die_with_parent

    die_with_parent()  # the zygote dies with the search process; its workers then get the same signal
    import_tensorflow()
    import lms.tf.measure  # noqa: F401  # and what every worker imports before its model
    import lms.tf.train  # noqa: F401

    sock.send(json.dumps({"ready": True}).encode())
    children: set[int] = set()
    try:
        while True:
            if select.select([sock], [], [], _POLL_S)[0]:
                msg, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 2)
                if not msg:
                    break  # the search process is gone, or closed us
                req = json.loads(msg)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _worker(sock, req, fds, PARENT_PIPE_ENV, PARENT_PID_ENV)  # never returns
                for fd in fds:
                    os.close(fd)
                children.add(pid)
                sock.send(json.dumps({"id": req["id"], "pid": pid}).encode())
            for pid in list(children):
                if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                    continue
                _kill_group(pid)  # what the worker's own children left, before its id can be taken again
                _, status = os.waitpid(pid, 0)
                children.discard(pid)
                sock.send(json.dumps({"exit": pid, "returncode": os.waitstatus_to_exitcode(status)}).encode())
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        for pid in children:
            _kill_group(pid)


def _worker(sock: socket.socket, req: dict, fds: list[int], pipe_env: str, pid_env: str) -> None:
    """In the fork: become what ``python -m tuner.trial request.json`` started from nothing would be."""
    code = 1
    try:
        sock.close()
        os.setsid()
        log_fd, watch_fd = fds
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(null)
        os.close(log_fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        os.environ[pipe_env], os.environ[pid_env] = str(watch_fd), str(os.getppid())
        import random

        random.seed()  # a process started from nothing seeds from the OS, not from its parent's state
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        sys.argv = [sys.argv[0], req["request"]]
        from tuner.trial import exit_now, main as trial_main

        code = trial_main([req["request"]])
        exit_now(code)
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1  # as Python exits on it
    except BaseException:  # noqa: BLE001  # whatever happens, the fork never returns into the zygote's loop
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    sock = socket.socket(fileno=int(args[0]))
    _serve(sock)
    return 0


if __name__ == "__main__":
    code = main()
    os._exit(code)  # nothing to finalise: skip the interpreter's teardown of what TensorFlow's import left
