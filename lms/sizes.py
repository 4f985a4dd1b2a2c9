"""Byte sizes people write: ``"14GiB"``, ``"512 MB"``, ``1073741824``. No TensorFlow.

Binary units (KiB, MiB, GiB, TiB: powers of 1024) and decimal units (kB, MB,
GB, TB: powers of 1000), case-insensitive; a bare number is bytes. ``"16G"``
means GiB, as ``nvidia-smi`` and most people mean it.
"""

from __future__ import annotations

import math
import numbers
import re
from fractions import Fraction

__all__ = ["parse_size", "format_size", "size_unit", "SizeError", "MIN_SIZE", "MAX_SIZE"]

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "kb": 1000,
    "m": 1 << 20, "mib": 1 << 20, "mb": 1000 ** 2,
    "g": 1 << 30, "gib": 1 << 30, "gb": 1000 ** 3,
    "t": 1 << 40, "tib": 1 << 40, "tb": 1000 ** 4,
}
_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")
#: Below this no real model fits: almost surely a typo (``"16"`` for 16 GiB).
MIN_SIZE = 1 << 20
#: No device or host has this much memory: a typo.
MAX_SIZE = 1 << 50


class SizeError(ValueError):
    """A size that is not a positive number of bytes between 1 MiB and 1 PiB."""


def _shown(text: str) -> str:
    text = text.strip()
    return repr(text if len(text) <= 40 else text[:20] + "...")


def parse_size(value: str | int | float, *, what: str = "size", minimum: int = MIN_SIZE) -> int:
    """Bytes in `value`: an int (numpy's too), a float (``16e9``, ``0.9 * 16 * 2**30``: whole bytes, rounded
    down), or a string such as ``"16GiB"``, ``"1.5 GB"``, ``"1073741824"``.

    Args:
        value: the size.
        what: what the size is, for the error message (``"budget"``).
        minimum: smallest size accepted (default 1 MiB: a smaller one is almost
            surely a forgotten unit).

    Raises:
        SizeError: empty, negative, zero, below `minimum`, above 1 PiB, an unknown
            unit, not a finite number, or another type (named).
    """
    if isinstance(value, bool):
        raise SizeError(f"{what} {value!r} is not a size; give bytes or a string such as '16GiB'")
    if isinstance(value, numbers.Integral):  # int, numpy.int64, ...
        nbytes = int(value)
        shown = repr(nbytes)
    elif isinstance(value, numbers.Real):  # float, numpy.float64, ...
        if not math.isfinite(value):
            raise SizeError(f"{what} {float(value)!r} is not a finite number of bytes; give a size such as 16GiB")
        nbytes = math.floor(value)
        shown = repr(float(value))
    elif not isinstance(value, str):
        raise SizeError(f"{what} {value!r} ({type(value).__name__}) is not a size; give bytes (a number) or a "
                        "string such as '16GiB'")
    else:
        if not value.strip():
            raise SizeError(f"{what} is empty; give a size such as 16GiB or 512MiB")
        shown = _shown(value)
        if value.strip().startswith("-"):
            raise SizeError(f"{what} {shown} is negative; give a positive size such as 16GiB")
        match = _PATTERN.match(value)
        if not match:
            raise SizeError(f"{what} {shown} is not a size; give a number and a unit, e.g. 16GiB or 512MiB")
        number, unit = match.groups()
        factor = _UNITS.get(unit.lower())
        if factor is None:
            raise SizeError(f"{what} {shown}: unknown unit {unit!r}; use B, KiB, MiB, GiB, TiB (or kB, MB, GB, TB)")
        nbytes = int(Fraction(number) * factor)  # exact: a float overflows on a 400-digit number
    if nbytes <= 0:
        raise SizeError(f"{what} {shown} is {'zero' if nbytes == 0 else 'negative'}; give a positive size "
                        "such as 16GiB")
    if nbytes < minimum:
        floor = "1 MiB" if minimum == MIN_SIZE else format_size(minimum)
        raise SizeError(f"{what} {shown} is {nbytes} bytes, below {floor}; did you forget the unit (e.g. 16GiB)?")
    if nbytes > MAX_SIZE:
        raise SizeError(f"{what} {shown} is more than 1 PiB; no device has that much memory (e.g. 16GiB)")
    return nbytes


def size_unit(nbytes: float) -> tuple[float, str]:
    """(divisor, unit) that shows `nbytes` as a number below 1024: ``(2**30, "GiB")`` etc."""
    for power, unit in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")):
        if abs(nbytes) >= (1 << power):
            return float(1 << power), unit
    return 1.0, "B"


def format_size(nbytes: int | float | None, *, digits: int = 2) -> str:
    """``1536 * 2**20`` -> ``"1.50 GiB"``; ``None`` -> ``"-"``."""
    if nbytes is None:
        return "-"
    divisor, unit = size_unit(nbytes)
    return f"{nbytes:.0f} B" if unit == "B" else f"{nbytes / divisor:.{digits}f} {unit}"
