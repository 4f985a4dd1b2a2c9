"""Progress on stderr: a tqdm bar (trials done, best so far) and log lines that do not break it."""

from __future__ import annotations

import logging
import sys
from typing import Any

__all__ = ["Progress", "setup_logging"]


class _TqdmHandler(logging.Handler):
    """Writes log records above the bar (tqdm.write), to stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # logging must never raise
            self.handleError(record)


def setup_logging(*, quiet: bool = False, verbose: bool = False) -> None:
    """INFO for the tuner by default, WARNING with `quiet`, DEBUG with `verbose`; Optuna's own logs quieter."""
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    handler = _TqdmHandler()
    handler.setFormatter(logging.Formatter("%(message)s" if not verbose else "%(asctime)s %(name)s: %(message)s",
                                           datefmt="%H:%M:%S"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("tuner").setLevel(level)
    # The library's own INFO (planner, NVML probing) is detail for -v.
    logging.getLogger("lms").setLevel(logging.DEBUG if verbose else logging.WARNING)
    try:
        import optuna

        optuna.logging.disable_default_handler()
        optuna.logging.enable_propagation()
        optuna.logging.set_verbosity(logging.DEBUG if verbose else logging.WARNING)
    except ImportError:  # pragma: no cover - optuna is a dependency
        pass


class Progress:
    """A tqdm bar on stderr (trials done / total, best so far), or nothing when `disabled`.

    By default the bar is shown only when stderr is a terminal: in a log file the
    per-trial log lines ("trial 7 [predicted]: ... [8/80]") carry the same information.
    """

    def __init__(self, *, disabled: bool | None = None) -> None:
        self.disabled = (not sys.stderr.isatty()) if disabled is None else disabled
        self._bar: Any = None

    def start(self, *, total: int, initial: int, desc: str) -> None:
        self.close()
        if self.disabled:
            return
        from tqdm import tqdm

        self._bar = tqdm(total=total, initial=min(initial, total), desc=desc, unit="trial", file=sys.stderr,
                         dynamic_ncols=True, leave=True)

    def advance(self, n: int = 1, *, postfix: str = "") -> None:
        if self._bar is None:
            return
        if postfix:
            self._bar.set_postfix_str(postfix, refresh=False)
        self._bar.update(n)

    def note(self, postfix: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(postfix)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
