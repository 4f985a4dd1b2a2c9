"""What machine a search ran on, found without importing TensorFlow.

The parent process asks NVML for GPUs (`lms.machine.nvml.gpu_inventory`) and package
metadata for versions; trial workers add what TensorFlow itself reports
(its version and the device it ran on) to each trial record.
`tuner.search.environment_info` puts these together with the backend's device
fields for recommended.json (it asks the backend, so it lives above them).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from typing import Any

__all__ = ["gpus", "tensorflow_distribution", "default_backend", "host_memory_bytes"]

log = logging.getLogger(__name__)

_TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly", "tf-nightly-cpu",
                     "tensorflow-macos", "intel-tensorflow")


def gpus() -> list[dict[str, Any]]:
    """GPUs NVML sees (index, uuid, name, total_bytes, driver_version); ``[]`` without a driver."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return []
    try:
        from lms.machine.nvml import gpu_inventory
    except ImportError:  # pragma: no cover - lms always ships it
        return []
    return gpu_inventory()


def tensorflow_distribution() -> tuple[str, str] | None:
    """(distribution name, version) of the installed TensorFlow, or None; does not import it."""
    for dist in _TF_DISTRIBUTIONS:
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def default_backend() -> tuple[str, str]:
    """(backend name, why): ``gpu`` with a visible GPU and a CUDA TensorFlow, else ``emulated``."""
    found = gpus()
    tf = tensorflow_distribution()
    if found and tf is not None and not tf[0].endswith("-cpu"):
        return "gpu", f"GPU found: {found[0]['name']}"
    if found:
        return "emulated", (f"GPU {found[0]['name']} found but TensorFlow is {tf[0] if tf else 'missing'}; "
                            "install the CUDA build (pip install 'tflms-tuner[gpu]') to measure on it")
    return "emulated", "no GPU found (NVML)"


def host_memory_bytes() -> int | None:
    """This machine's physical memory in bytes (``os.sysconf``; ``/proc/meminfo`` as a fallback), or
    None where the OS does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
