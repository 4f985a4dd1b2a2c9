"""Reading a config file: a small regular file of JSON whose objects name each key once. No TensorFlow.

`LMSConfig.load` reads through these, so a FIFO, a device or a huge file is
refused before parsing, and a key given twice is an error, not the last value.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class DuplicateKey(Exception):
    """A JSON object names a key twice (`unique_keys`)."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


class NotJSONNumber(ValueError):
    """``NaN``, ``Infinity`` or a number too large for a float (``1e400``): Python reads them, JSON has none."""


def no_constant(name: str) -> Any:
    """`json.loads`'s ``parse_constant``: refuse ``NaN``, ``Infinity``, ``-Infinity``."""
    raise NotJSONNumber(f"{name} is not a JSON number")


def finite_float(text: str) -> float:
    """`json.loads`'s ``parse_float``: refuse a number that overflows to infinity."""
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise NotJSONNumber(f"number {text[:20]} is too large")
    return value


#: A config file, or a recommended.json with its Pareto front, is a few kilobytes; `LMSConfig.load` reads no more.
MAX_CONFIG_BYTES = 4 << 20


def read_config_text(path: Path) -> str:
    """The text of a regular file of at most `MAX_CONFIG_BYTES` (a FIFO would block, /dev/zero never ends)."""
    import stat

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO must not block the open
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device or special file"
        raise ValueError(f"{path}: not a regular file ({kind})")
    with os.fdopen(fd, "rb") as fh:
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        data = fh.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ValueError(f"{path}: larger than {MAX_CONFIG_BYTES >> 20} MiB; not an LMS config file")
    return data.decode("utf-8")
