"""The tuner's two kinds of failure, one class each (the CLI maps them to exit codes)."""

from __future__ import annotations

__all__ = ["BadInput", "SearchError"]


class BadInput(ValueError):
    """Something the user gave is wrong (exit code 2: one line on stderr, nothing written)."""


class SearchError(RuntimeError):
    """The search could not go on (exit code 1)."""
