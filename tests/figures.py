"""The fault-injection tests' figures: how they are written and added up (tests/tuner, tests/conftest.py)."""

from __future__ import annotations

#: The ``user_properties`` key under which a test's report carries its figures.
FIGURES_PROPERTY = "fault_figures"
KEYS = ("attempted", "recorded", "lost", "duplicates", "orphans")


def format_figures(f: dict) -> str:
    kinds = ", ".join(f"{k}={v}" for k, v in sorted(f.get("faults", {}).items())) or "none"
    return (f"trials attempted {f['attempted']}, faults injected ({kinds}), trials recorded {f['recorded']}, "
            f"trials lost {f['lost']}, duplicates {f['duplicates']}, orphans left {f.get('orphans', 0)}")


def total(figures: list[dict]) -> dict:
    """The sum of several tests' figures, fault kinds counted apart."""
    out: dict = {key: 0 for key in KEYS} | {"faults": {}}
    for f in figures:
        for key in KEYS:
            out[key] += f.get(key, 0)
        for kind, n in f.get("faults", {}).items():
            out["faults"][kind] = out["faults"].get(kind, 0) + n
    return out
