"""Memory budgets: parse ``"16GiB"``-style sizes and print bytes for people.

Binary units (KiB, MiB, GiB, TiB: powers of 1024) and decimal units (kB, MB,
GB, TB: powers of 1000) are both accepted, case-insensitively; a bare number is
bytes. ``"16G"`` means GiB (what ``nvidia-smi`` and most people mean).
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["parse_budget", "format_bytes", "byte_unit", "BudgetError"]

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "kb": 1000,
    "m": 1 << 20, "mib": 1 << 20, "mb": 1000 ** 2,
    "g": 1 << 30, "gib": 1 << 30, "gb": 1000 ** 3,
    "t": 1 << 40, "tib": 1 << 40, "tb": 1000 ** 4,
}
_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")

# A budget below this cannot hold any real model; it is almost surely a typo (e.g. "16" for 16 GiB).
_MIN_BUDGET = 1 << 20
# No device (or host) has this much memory: a larger budget is a typo (e.g. "16000000TiB").
_MAX_BUDGET = 1 << 50


class BudgetError(ValueError):
    """A budget string that is not a positive size."""


def parse_budget(text: str) -> int:
    """Bytes in a size such as ``"16GiB"``, ``"1.5 GB"``, ``"512MiB"`` or ``"1073741824"``.

    Raises:
        BudgetError: empty, negative, zero, below 1 MiB, above 1 PiB, an unknown unit, or not a number.
    """
    if not isinstance(text, str) or not text.strip():
        raise BudgetError("budget is empty; give a size such as 16GiB or 512MiB")
    if text.strip().startswith("-"):
        raise BudgetError(f"budget {text!r} is negative; give a positive size such as 16GiB")
    match = _PATTERN.match(text)
    if not match:
        raise BudgetError(f"budget {text!r} is not a size; give a number and a unit, e.g. 16GiB or 512MiB")
    number, unit = match.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise BudgetError(f"budget {text!r}: unknown unit {unit!r}; use B, KiB, MiB, GiB, TiB (or kB, MB, GB, TB)")
    value = int(Fraction(number) * factor)  # exact: a float overflows on a 400-digit number
    if value <= 0:
        raise BudgetError(f"budget {text!r} is zero; give a positive size such as 16GiB")
    if value < _MIN_BUDGET:
        raise BudgetError(f"budget {text!r} is {value} bytes, below 1 MiB; did you forget the unit (e.g. 16GiB)?")
    if value > _MAX_BUDGET:
        shown = text.strip() if len(text.strip()) <= 40 else text.strip()[:20] + "..."
        raise BudgetError(f"budget {shown!r} is more than 1 PiB; no device has that much memory (e.g. 16GiB)")
    return value


def byte_unit(nbytes: float) -> tuple[float, str]:
    """(divisor, unit) that shows `nbytes` as a number below 1024: ``(2**30, "GiB")`` etc."""
    for power, unit in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")):
        if abs(nbytes) >= (1 << power):
            return float(1 << power), unit
    return 1.0, "B"


def format_bytes(nbytes: int | float | None, *, digits: int = 2) -> str:
    """``1536 * 2**20`` -> ``"1.50 GiB"``; ``None`` -> ``"-"``. The one byte formatter of the tuner."""
    if nbytes is None:
        return "-"
    divisor, unit = byte_unit(nbytes)
    return f"{nbytes:.0f} B" if unit == "B" else f"{nbytes / divisor:.{digits}f} {unit}"
