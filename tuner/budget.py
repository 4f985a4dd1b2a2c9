"""Memory budgets: parse ``"16GiB"``-style sizes and print bytes for people.

The rules live in `lms.sizes` (binary and decimal units, a bare number is bytes,
``"16G"`` means GiB, 1 MiB to 1 PiB); this module names them for the tuner.
"""

from __future__ import annotations

from lms.sizes import SizeError as BudgetError
from lms.sizes import format_size as format_bytes
from lms.sizes import parse_size
from lms.sizes import size_unit as byte_unit

__all__ = ["parse_budget", "format_bytes", "byte_unit", "BudgetError"]


def parse_budget(text: str) -> int:
    """Bytes in a size such as ``"16GiB"``, ``"1.5 GB"``, ``"512MiB"`` or ``"1073741824"``.

    Raises:
        BudgetError: empty, negative, zero, below 1 MiB, above 1 PiB, an unknown unit, or not a number.
    """
    if not isinstance(text, str):
        raise BudgetError(f"budget {text!r} is not a size; give a number and a unit, e.g. 16GiB or 512MiB")
    return parse_size(text, what="budget")
