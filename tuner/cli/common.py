"""What every subcommand shares: exit codes, the program name, one-line errors, an existing study."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from ..errors import BadInput
from ..study.storage import EmptyStorage, StorageSpec, check_reachable, resolve_storage, writable_folder

__all__ = ["EXIT_OK", "EXIT_FAILURE", "EXIT_BAD_INPUT", "PROG", "shown", "shorten", "err", "check_output_folder",
           "open_existing"]


EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2
PROG = "lms-tuner"


def shown(text: str, limit: int = 40) -> str:
    """`text` for a message: whole when short, else its start and its length (never 5,000 digits)."""
    return text if len(text) <= limit else f"{text[:limit - 10]}... ({len(text)} characters)"


def shorten(message: str) -> str:
    """`message` with every long quoted word cut (argparse quotes the whole argument it refuses)."""
    return re.sub(r"'([^'\s]{100,})'", lambda m: repr(shown(m.group(1))), message)


def err(message: str) -> None:
    try:
        print(f"{PROG}: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # the terminal is gone (SIGHUP) or stderr closed: nobody to tell
        pass


def check_output_folder(folder: Path, *, what: str) -> None:
    """BadInput unless `folder` is a folder this process can write, or can be made under one (nothing is made)."""
    probe = next((p for p in (folder, *folder.absolute().parents) if p.exists()), None)
    if probe is not None and probe.is_dir() and writable_folder(probe):
        return
    if probe == folder or (probe is not None and not probe.is_dir()):
        raise BadInput(f"{what} {folder}: {probe} is not a folder")
    raise BadInput(f"{what} {folder}: {probe} is not a writable folder")


def open_existing(args: argparse.Namespace) -> tuple[StorageSpec, Any, Any]:
    """(spec, storage, study) of an existing study, or BadInput; creates and changes nothing (read-only)."""
    import optuna

    from ..study.storage import open_storage, study_names
    from ..study.study import foreign_study

    spec = resolve_storage(args.storage, args.study, studies_dir=args.studies_dir)
    check_reachable(spec, create=False)
    if not spec.exists():
        raise BadInput(f"study {args.study!r} does not exist (no {spec.path}); see '{PROG} list'")
    try:
        storage = open_storage(spec, read_only=True)
    except EmptyStorage:
        raise BadInput(f"study {args.study!r} does not exist in {spec.display} (it holds no studies); see "
                       f"'{PROG} list'") from None
    if args.study not in study_names(storage):
        raise BadInput(f"study {args.study!r} does not exist in {spec.display}; see '{PROG} list'")
    study = optuna.load_study(study_name=args.study, storage=storage)
    foreign = foreign_study(study, display=spec.display)
    if foreign:  # its trials' attributes may hold anything: they are not read as the tuner's records
        raise BadInput(f"{foreign}; {PROG} reads only the studies it made")
    return spec, storage, study
