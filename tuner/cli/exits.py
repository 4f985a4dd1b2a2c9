"""How a command ends: signals that stop it the way Ctrl-C does, and log records that never show a secret.

Used by `tuner.cli.main` around every subcommand.
"""

from __future__ import annotations

import logging
import signal
import sys
from typing import Any

from ..study.masking import mask_secrets

__all__ = ["StopSignals", "MaskSecretsFilter", "STOP_SIGNALS"]

#: Signals that stop any subcommand the way Ctrl-C does: one line, exit 1, outputs kept valid.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class StopSignals:
    """SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt anywhere in a subcommand, and are remembered.

    Remembered because Python drops an exception raised inside a finalizer or a thread
    ("Exception ignored in ..."): a command whose interrupt was swallowed so still exits 1, with
    no traceback (`sys.unraisablehook`). When `final` (the real CLI), signals that come once the
    command is over are ignored, so the interpreter's teardown is not interrupted either.
    """

    def __init__(self, *, final: bool) -> None:
        self.received: str = ""
        self._final = final
        self._closing = False
        self._old: dict[int, Any] = {}
        self._old_hook = sys.unraisablehook

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = signal.Signals(signum).name
        if not self._closing:
            raise KeyboardInterrupt(self.received)

    def _unraisable(self, unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            return  # remembered by _handle; said once, by the CLI
        self._old_hook(unraisable)

    def __enter__(self) -> "StopSignals":
        try:
            for sig in STOP_SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: leave signals alone
            pass
        sys.unraisablehook = self._unraisable
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> bool:
        """Restore (or, when `final`, ignore) the signals; an interrupt that came after the command's own
        handling is swallowed here: `received` says it came (the caller says so in one line)."""
        self._closing = True
        for sig, old in self._old.items():
            signal.signal(sig, signal.SIG_IGN if self._final else old)
        if not self._final:
            sys.unraisablehook = self._old_hook
        if self.received:
            _forget_the_caught_interrupt()
        return exc_type is not None and issubclass(exc_type, KeyboardInterrupt)


def _forget_the_caught_interrupt() -> None:
    """Keep exit code 1 after a handled interrupt under ``python -m tuner``.

    CPython (3.11-3.13, ``run_eval_code_obj`` in pythonrun.c) sets a process-wide flag when a
    KeyboardInterrupt leaves code run from source text (``exec``/``eval`` of a string: dataclasses
    and namedtuple build their methods that way, at import), even if the caller then catches it;
    after a ``-m`` module returns, that flag ends the process with SIGINT (exit -2, not 1). Running
    source text again clears it. (A console script exits before that check: it was never hit.)
    """
    exec("pass")  # noqa: S102 -- constant text; see above


class MaskSecretsFilter(logging.Filter):
    """Every log record goes out with the storage URL's secrets masked (`mask_secrets`), whoever logs it."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self._url = url

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to the handler
            return True
        masked = mask_secrets(message, self._url)
        if masked != message:
            record.msg, record.args = masked, None
        return True
