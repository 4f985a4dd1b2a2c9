"""``validate-config``: read an LMS config file as `lms.LMSConfig.load` does and print it; nothing written."""

from __future__ import annotations

import argparse
import errno
import json
import stat
from pathlib import Path

from ..errors import BadInput
from .common import EXIT_OK

__all__ = ["cmd_validate_config"]


def cmd_validate_config(args: argparse.Namespace) -> int:
    from lms.config import LMSConfig

    path: Path = args.path
    try:
        is_file = path.stat().st_mode  # follows links: a loop or a dangling link says so here
    except OSError as exc:
        if exc.errno == errno.ENOENT and not path.is_symlink():
            raise BadInput(f"config file {path} does not exist") from None
        what = ("is a symbolic link to a missing file" if exc.errno == errno.ENOENT
                else "is a symbolic link loop" if exc.errno == errno.ELOOP else f"cannot be read ({exc.strerror})")
        raise BadInput(f"config file {path} {what}") from None
    if not stat.S_ISREG(is_file):
        raise BadInput(f"{path} is not a file")
    try:
        config = LMSConfig.load(path)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadInput(f"invalid LMS config: {exc}") from None
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}") from None
    if args.json:
        print(json.dumps(config.to_dict(), indent=2))
    else:
        print(f"{path}: valid LMS config: " + ", ".join(f"{k}={v!r}" for k, v in config.to_dict().items()))
    return EXIT_OK
