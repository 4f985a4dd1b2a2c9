"""The host budget: host memory the swapped tensors of a config may hold (``--host-budget``). No TensorFlow.

Every swapped byte sits in host memory while it is out (`lms.sim.host`). On a
GPU that is TF's pinned host allocator (``gpu_host_bfc``), page-locked memory the
OS cannot page out, capped per process by ``TF_GPU_HOST_MEM_LIMIT_IN_MB``: 128 GiB
by default in TF 2.21 (``1 << 17`` MB, read in ``GPUProcessState::GetGpuHostAllocator``;
64 GiB, ``1 << 16``, in TF releases before about 2.12; see docs/tf-notes.md).

- Default budget (`default_host_budget`): `HOST_FRACTION` (75%) of this machine's
  physical RAM, the rest left to the OS, the input pipeline and the process; on a
  GPU (the gpu backend) also at most TF's pinned default. A prediction for a GPU
  machine (the simulate backend on a GPU profile) is for the target, not this
  machine: its default is TF's pinned default alone (a laptop predicting for a
  server gets the server's answer).
- ``--host-budget SIZE`` (`parse_host_budget`): parsed like ``--budget``;
  ``none`` turns the bound off.
- A config whose host peak (PREDICTED by the simulator) exceeds the budget does
  not fit, like a device-budget miss (`host_miss_reason`).
- On a GPU, a recommendation that needs more than TF's pinned default says the
  ``TF_GPU_HOST_MEM_LIMIT_IN_MB`` it needs (`pinned_limit_mb`), and the tuner's
  GPU workers run with it (`worker_host_limit_bytes`).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from .budget import BudgetError, format_bytes, parse_budget
from .environment import host_memory_bytes

__all__ = ["HOST_FRACTION", "PINNED_DEFAULT_BYTES", "PINNED_ENV", "NO_HOST_BOUND", "parse_host_budget",
           "default_host_budget", "targets_gpu", "host_miss_reason", "pinned_limit_mb",
           "host_budget_conflict", "add_host_fields", "host_lines", "worker_host_limit_bytes", "host_verdict"]

#: Share of the physical RAM the default host budget allows.
HOST_FRACTION = 0.75
#: TF 2.21's default cap of its pinned host allocator (``TF_GPU_HOST_MEM_LIMIT_IN_MB`` unset): 1 << 17 MB.
PINNED_DEFAULT_BYTES = (1 << 17) << 20
PINNED_ENV = "TF_GPU_HOST_MEM_LIMIT_IN_MB"
#: What ``--host-budget`` takes to turn the bound off.
NO_HOST_BOUND = ("none", "off")


def parse_host_budget(text: str) -> int | None:
    """Bytes in ``--host-budget`` (`tuner.budget.parse_budget`'s rules), or None for ``none``/``off``.

    Raises:
        BudgetError: zero, negative, an unknown unit, below 1 MiB or above 1 PiB, not a size.
    """
    if isinstance(text, str) and text.strip().lower() in NO_HOST_BOUND:
        return None
    try:
        return parse_budget(text)
    except BudgetError as exc:
        raise BudgetError(str(exc).replace("budget", "host budget", 1)) from None


def targets_gpu(backend: Any, device: str) -> bool:
    """Whether the search's configs run on a GPU: the gpu backend, or a GPU device profile."""
    if getattr(backend, "name", backend) == "gpu":
        return True
    try:
        from lms.machine.devices import get_device

        return get_device(device).kernels == "gpu"
    except ValueError:
        return False


def default_host_budget(*, gpu: bool, ram_bytes: int | None = None, elsewhere: bool = False) -> tuple[int | None, str]:
    """(host budget, where it comes from) when ``--host-budget`` is not given.

    `HOST_FRACTION` of the physical RAM; with `gpu`, at most TF's pinned default
    (`PINNED_DEFAULT_BYTES`, or ``TF_GPU_HOST_MEM_LIMIT_IN_MB`` when this environment sets it).
    (None, why) when the OS does not say how much RAM it has.

    With `elsewhere` (a prediction for a GPU machine that is not this one: the simulate backend on a
    GPU profile) this machine's RAM says nothing about the target's, so the budget is the target
    process's own cap: TF's pinned host allocator limit.
    """
    if elsewhere:
        pinned, what = _pinned_limit()
        return pinned, (f"{what} on the GPU machine predicted for (this machine's RAM is not the target's; "
                        "--host-budget SIZE gives the target's own)")
    ram = host_memory_bytes() if ram_bytes is None else ram_bytes
    if not ram:
        return None, "no host bound: the OS did not say how much RAM this machine has"
    budget = int(ram * HOST_FRACTION)
    source = f"{HOST_FRACTION:.0%} of this machine's RAM ({format_bytes(ram)})"
    if gpu:
        pinned, what = _pinned_limit()
        if pinned < budget:
            return pinned, f"{what}, below {source}"
        source += f"; TF's pinned host limit is {format_bytes(pinned)}"
    return budget, source


def _pinned_limit() -> tuple[int, str]:
    value = os.environ.get(PINNED_ENV, "")
    if value.strip().isdigit() and int(value) > 0:
        return int(value) << 20, f"{PINNED_ENV}={value} (TF's pinned host allocator limit)"
    return PINNED_DEFAULT_BYTES, f"TF's pinned host allocator default ({format_bytes(PINNED_DEFAULT_BYTES)}, " \
                                 f"{PINNED_ENV} unset)"


def host_miss_reason(batch: int, peak_host: int, host_budget: int | None) -> str:
    """Why a batch does not fit the host budget (a trial's ``reason``)."""
    return (f"simulator: batch {batch} holds {format_bytes(peak_host)} of swapped tensors in host memory "
            f"> host budget {format_bytes(host_budget)}")


def pinned_limit_mb(peak_host_bytes: int | None) -> int | None:
    """``TF_GPU_HOST_MEM_LIMIT_IN_MB`` a GPU run of a config needs (None: TF's default suffices)."""
    if not peak_host_bytes or peak_host_bytes <= PINNED_DEFAULT_BYTES:
        return None
    return -(-int(peak_host_bytes) // (1 << 20))


def worker_host_limit_bytes(settings: Any, default: int | None) -> int | None:
    """The pinned host limit a GPU trial worker runs with: `default` (its share of the RAM), raised to
    the host budget when that is above TF's pinned default (so configs the budget allows can run)."""
    host_budget = getattr(settings, "host_budget_bytes", None)
    if host_budget is not None and host_budget > PINNED_DEFAULT_BYTES and (default is None or host_budget > default):
        return int(host_budget)
    return default


def host_budget_conflict(stored: Mapping[str, Any], settings: Any) -> str:
    """How the host budget differs from a study's stored one ("" if it matches, or the study predates it)."""
    if "host_budget_bytes" not in stored or stored.get("host_budget_bytes") == settings.host_budget_bytes:
        return ""
    old, new = stored.get("host_budget_bytes"), settings.host_budget_bytes
    return (f"study {settings.study!r} was created with host budget "
            f"{'none' if old is None else format_bytes(old)}, not {'none' if new is None else format_bytes(new)}; "
            "use another --study name, or the same --host-budget to resume it")


def add_host_fields(doc: dict[str, Any], attrs: Mapping[str, Any], settings: Any, *, label: str,
                    predicted_label: str) -> None:
    """recommended.json's host figures: ``peak_host_bytes`` with its source, ``host_budget`` and, on a
    GPU, the ``TF_GPU_HOST_MEM_LIMIT_IN_MB`` the recommendation needs."""
    measured = bool(attrs.get("measured"))
    predicted = attrs.get("predicted_peak_host_bytes") if measured else attrs.get("peak_host_bytes")
    if predicted is not None:
        doc.setdefault("predicted", {})["peak_host_bytes"] = int(predicted)
    if measured and attrs.get("host_copies_peak_bytes") is not None:
        doc["peak_host_bytes"] = int(attrs["host_copies_peak_bytes"])
        doc["sources"]["peak_host_bytes"] = f"{label.split(' (')[0]} (peak of the emulated swap copies' host bytes)"
    elif measured:
        # no host figure measured (a GPU run, or nothing swapped): the simulator's, scaled from its batch to
        # the measured one (the swapped tensors are activations: bytes proportional to the batch)
        pb, batch = attrs.get("predicted_batch"), attrs.get("batch_size")
        scaled = int(predicted * batch / pb) if predicted is not None and pb and batch else predicted
        doc["peak_host_bytes"] = scaled
        doc["sources"]["peak_host_bytes"] = f"{predicted_label}, scaled to the measured batch"
    else:
        doc["peak_host_bytes"] = int(predicted) if predicted is not None else None
        doc["sources"]["peak_host_bytes"] = predicted_label
    host_budget = getattr(settings, "host_budget_bytes", None)
    doc["host_budget"] = {"bytes": host_budget, "source": getattr(settings, "host_budget_source", "") or ""}
    if targets_gpu(settings.backend, settings.device):
        need = pinned_limit_mb(doc["peak_host_bytes"])
        if need is not None:
            doc[PINNED_ENV] = need
            doc.setdefault("notes", []).append(
                f"this config holds {format_bytes(doc['peak_host_bytes'])} of swapped tensors in pinned host memory, "
                f"more than TF's default limit ({format_bytes(PINNED_DEFAULT_BYTES)}): run training with "
                f"{PINNED_ENV}={need}")


def host_lines(doc: Mapping[str, Any]) -> list[str]:
    """The summary's host lines (`tuner.outputs.format_recommendation`)."""
    if "peak_host_bytes" not in doc and "host_budget" not in doc:
        return []
    hb = doc.get("host_budget") or {}
    peak = doc.get("peak_host_bytes")
    src = (doc.get("sources") or {}).get("peak_host_bytes", "")
    line = f"  host memory  {format_bytes(peak):<12} {src}".rstrip()
    line += (f"; host budget {format_bytes(hb['bytes'])} ({hb.get('source') or '--host-budget'})"
             if hb.get("bytes") else "; no host budget")
    lines = [line]
    if doc.get(PINNED_ENV):
        lines.append(f"  pinned host  needs {PINNED_ENV}={doc[PINNED_ENV]} (TF's default is "
                     f"{PINNED_DEFAULT_BYTES >> 20} MB)")
    return lines


def host_verdict(record: Any, host_budget: int | None) -> Any:
    """A measured trial record, made ``infeasible`` when its MEASURED host figure (the emulated swap copies'
    peak) exceeds `host_budget`, with the reason, as a device-budget miss is recorded."""
    import dataclasses

    host = (record.extra or {}).get("host_copies_peak_bytes")
    if host_budget is None or record.status != "ok" or host is None or host <= host_budget:
        return record
    return dataclasses.replace(
        record, status="infeasible", batch_size=0, throughput=0.0, constraint=max(host / host_budget - 1.0, 1e-6),
        reason=(f"measured: batch {record.batch_size} held {format_bytes(host)} of swapped tensors in host memory "
                f"> host budget {format_bytes(host_budget)}"),
        extra={**record.extra, "limited_by": "host", "host_limited_batch": record.batch_size})
