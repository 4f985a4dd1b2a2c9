"""``main``: parse, run the subcommand, turn every way out into one line on stderr and an exit code."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from typing import Callable, Sequence

from ..budget import BudgetError
from ..errors import BadInput
from .exits import MaskSecretsFilter, StopSignals
from ..study.storage import StorageError, StudyNameError, mask_secrets, mask_url, storage_failure
from .args import build_parser
from .common import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, err, shorten
from .common import shown as shown_text

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (also used as the console script).

    Every exit path is one line on stderr with its code: 0 done, 1 failure (interrupted by
    SIGINT/SIGTERM/SIGHUP included), 2 bad input.
    """
    final = argv is None
    argv = _join_negative_values(list(sys.argv[1:] if argv is None else argv))
    storage_url = _find_storage(argv)
    code = None
    with StopSignals(final=final) as signals:
        code = _run(argv, storage_url)
    if code is None or (signals.received and code == EXIT_OK):
        # an interrupt outside the command's own handling, or one swallowed on the way (a finalizer, a thread)
        err(f"interrupted ({signals.received or 'SIGINT'})")
        code = EXIT_FAILURE
    return code


def _run(argv: list[str], storage_url: str | None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        args.argv = list(argv)  # the command as typed (a search cut short names the command that finishes it)
        storage_url = getattr(args, "storage", None) or storage_url  # as argparse read it (--stor URL included)
        from ..study.progress import setup_logging

        setup_logging(quiet=args.quiet, verbose=args.verbose)
        if storage_url:
            for handler in logging.getLogger().handlers:
                handler.addFilter(MaskSecretsFilter(storage_url))
        func: Callable[[argparse.Namespace], int] = args.func
        return func(args)
    except (BadInput, StorageError, StudyNameError, BudgetError) as exc:
        err(mask_secrets(shorten(" ".join(str(exc).split())), storage_url))
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:
        err(f"interrupted ({exc.args[0]})" if exc.args and isinstance(exc.args[0], str) else "interrupted")
        return EXIT_FAILURE
    except BrokenPipeError:  # e.g. `lms-tuner best ... | head`: the reader left; not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except SystemExit as exc:  # --help / --version
        return int(exc.code or 0) if isinstance(exc.code, int) else EXIT_OK
    except Exception as exc:  # a bug or an environment problem: one line, exit 1 (traceback with -v)
        if "-v" in argv or "--verbose" in argv:
            raise
        cause = storage_failure(exc)
        if cause:
            shown = mask_url(storage_url) if storage_url else "the study's database"
            err(mask_secrets(f"storage {shown} failed ({cause})", storage_url))
            return EXIT_FAILURE
        if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:  # a path the user gave, made longer
            err(mask_secrets(f"a path is too long for this system ({shown_text(str(exc.filename or ''), 80)}); "
                             "use shorter folder or file names", storage_url))
            return EXIT_BAD_INPUT
        if isinstance(exc, RecursionError):
            err("error: an input nested too deeply (RecursionError)")
            return EXIT_FAILURE
        err(mask_secrets(f"error: {type(exc).__name__}: {shorten(' '.join(str(exc).split()))} "
                         "(run with -v for details)", storage_url))
        return EXIT_FAILURE


def _join_negative_values(argv: list[str]) -> list[str]:
    """``--budget -1GiB`` -> ``--budget=-1GiB``, so argparse reports the bad size, not a missing value."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in ("--budget", "--host-budget", "--timeout", "--trial-timeout", "--seed") and i + 1 < len(argv) \
                and argv[i + 1].startswith("-") and argv[i + 1][1:2].isdigit():
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def _find_storage(argv: list[str]) -> str | None:
    """The ``--storage`` value in `argv` before argparse reads it, abbreviated or not (``--stor URL``,
    ``--sto=URL``: argparse takes any unambiguous prefix; ``--st`` is also ``--study``)."""
    for i, a in enumerate(argv):
        name, eq, value = a.partition("=")
        if len(name) >= len("--sto") and "--storage".startswith(name):
            if eq:
                return value
            if i + 1 < len(argv):
                return argv[i + 1]
    return None
