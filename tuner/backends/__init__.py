"""Backends: how a config's figures are obtained, one class per way, behind one small protocol (`Backend`).

    simulate   every trial predicted by lms.simulator (PREDICTED)          simulate.py
    emulated   screened by simulation, measured on the CPU, emulated swaps  emulated.py
    gpu        screened by simulation, measured on the GPU                  gpu.py

A backend is chosen once, by name (`get_backend`); everything else asks it.
Adding one: a module with a `Backend` subclass and an entry in `_CLASSES`.

    base.py        what every backend answers: its device and budget, its figures' labels, running a search
    measured.py    what ``emulated`` and ``gpu`` share: screen by simulation, then measure in workers
    confirm.py     measure configs in fresh processes, one batch each: a largest-batch search's trials, repeats
"""

from __future__ import annotations

from .base import Backend, GpuChoice, SearchRun
from .emulated import EmulatedBackend
from .gpu import GpuBackend
from .simulate import SimulateBackend

__all__ = ["Backend", "GpuChoice", "SearchRun", "BACKENDS", "get_backend", "backend_named"]

_CLASSES: dict[str, type[Backend]] = {cls.name: cls for cls in (GpuBackend, EmulatedBackend, SimulateBackend)}
#: Backend names, in the order ``--help`` lists them.
BACKENDS = tuple(_CLASSES)
_INSTANCES: dict[str, Backend] = {}


def get_backend(backend: "str | Backend") -> Backend:
    """The backend named `backend` (a `Backend` is returned as is).

    Raises:
        ValueError: no backend of that name.
    """
    if isinstance(backend, Backend):
        return backend
    if backend not in _CLASSES:
        raise ValueError(f"unknown backend {backend!r}; choose " + ", ".join(BACKENDS))
    if backend not in _INSTANCES:
        _INSTANCES[backend] = _CLASSES[backend]()
    return _INSTANCES[backend]


def backend_named(name: object) -> Backend | None:
    """The backend a stored name refers to, or None (an old or foreign study's attribute)."""
    try:
        return get_backend(name) if isinstance(name, str) else None
    except ValueError:
        return None
