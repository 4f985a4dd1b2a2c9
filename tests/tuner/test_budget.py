"""Budget strings: what parses to how many bytes, and what is refused."""

from __future__ import annotations

import pytest

from tuner.budget import BudgetError, format_bytes, parse_budget

GiB = 1 << 30
MiB = 1 << 20


@pytest.mark.parametrize("text, expected", [
    ("16GiB", 16 * GiB), ("16gib", 16 * GiB), ("16G", 16 * GiB), ("16 GiB", 16 * GiB),
    ("1.5GiB", 3 * GiB // 2), ("512MiB", 512 * MiB), ("512M", 512 * MiB), ("16GB", 16 * 10**9),
    ("2TiB", 2 << 40), ("1073741824", GiB), ("4096KiB", 4 * MiB), (".5GiB", GiB // 2),
])
def test_parse_budget_values(text: str, expected: int) -> None:
    assert parse_budget(text) == expected


@pytest.mark.parametrize("text, fragment", [
    ("0", "zero"), ("0GiB", "zero"), ("-1GiB", "negative"), ("16XB", "unknown unit 'XB'"),
    ("abc", "not a size"), ("", "empty"), ("   ", "empty"), ("16", "below 1 MiB"), ("1.2.3GiB", "not a size"),
    ("GiB", "not a size"),
])
def test_parse_budget_rejects(text: str, fragment: str) -> None:
    with pytest.raises(BudgetError, match=fragment.replace("(", r"\(")) as info:
        parse_budget(text)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("nbytes, text", [
    (None, "-"), (512, "512 B"), (1536 * MiB, "1.50 GiB"), (3 * MiB, "3.00 MiB"), (5 << 40, "5.00 TiB"),
])
def test_format_bytes(nbytes: int | None, text: str) -> None:
    assert format_bytes(nbytes) == text


def test_default_emulated_budget_fits_the_reference_batch_on_the_emulated_devices_order() -> None:
    # the budget comes from the emulated device's own order (TF's single-threaded executor, the
    # "cpu" profile): there the no-LMS step fits the reference batch and not twice it
    from lms.simulator import max_batch
    from tests.synthetic import residual
    from tuner.graphs import derive_emulated_budget

    g = residual(6, per_sample_bytes=MiB)
    budget = derive_emulated_budget(g, reference_batch=32)
    assert budget % (64 * MiB) == 0
    assert 32 <= max_batch(g, None, budget, device="cpu").batch < 64
