"""``gpu``: real runs on the GPU (one worker per GPU of ``--gpus``); the peak is TF's allocator peak.

Each worker sees one GPU (``CUDA_VISIBLE_DEVICES``) with memory growth on;
NVML's figures are recorded beside TF's.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

from ..errors import BadInput
from .base import GpuChoice
from .measured import MeasuredBackend

__all__ = ["GpuBackend", "profile_of_gpu"]


def profile_of_gpu(gpu_info: Mapping[str, Any] | None) -> str | None:
    """The simulator's device profile closest to a GPU NVML found (by name, then memory), or None."""
    from lms.devices import DEVICES

    if not gpu_info:
        return None
    name = gpu_info["name"].upper()
    total_gib = gpu_info["total_bytes"] / 2**30
    matches = [k for k in DEVICES if k.split("-")[0] in name]
    if not matches:
        return None
    return min(matches, key=lambda k: abs(DEVICES[k].memory_bytes / 2**30 - total_gib))


class GpuBackend(MeasuredBackend):
    name = "gpu"
    default_trials = 10
    peak_source = "tf-allocator-gpu"
    help = "the same with real runs on the GPU (MEASURED on GPU)"
    tf_device = "/GPU:0"

    def choose_gpus(self, *, gpu: str | None, gpus: tuple[str, ...], workers: int,
                    inventory: Callable[[], list[dict[str, Any]]]) -> GpuChoice:
        found = inventory()
        if not found:
            raise BadInput("backend gpu: no GPU found (NVML); use --backend emulated or --backend simulate")

        def lookup(wanted: str) -> dict[str, Any] | None:
            return next((g for g in found if str(g["index"]) == wanted or g["uuid"].startswith(wanted)), None)

        gpu_list = gpus or (tuple(str(i) for i in range(workers)) if workers > 1 else ())
        for wanted in gpu_list or (gpu or "0",):
            if lookup(wanted) is None:
                raise BadInput(f"GPU {wanted!r} not found; NVML sees: "
                               + ", ".join(f"{g['index']} ({g['name']})" for g in found))
        # the budget must fit the smallest of the GPUs used
        info = min((lookup(w) for w in gpu_list or (gpu or "0",)), key=lambda g: g["total_bytes"])  # type: ignore
        return GpuChoice(info=info, gpus=gpu_list, workers=len(gpu_list) or 1)

    def default_device(self, gpu_info: Mapping[str, Any] | None) -> str:
        return profile_of_gpu(gpu_info) or "V100-16GB"

    def default_budget(self, *, device: str, gpu_info: Mapping[str, Any] | None) -> tuple[int | None, str]:
        assert gpu_info is not None
        return int(gpu_info["total_bytes"]), f"memory of GPU {gpu_info['name']} (NVML)"

    def slots(self, settings: Any) -> list[str | None]:
        return list(settings.gpus) if settings.gpus else [settings.gpu] * settings.workers

    def slots_label(self, slots: list[str | None]) -> str:
        return ", ".join(f"GPU {g}" for g in slots)

    def source_label(self, *, measured: bool, device: str = "", device_name: str = "") -> str:
        if not measured:
            return super().source_label(measured=False, device=device)
        return f"measured on GPU ({device_name})" if device_name else "measured on GPU"

    def device_info(self, info: Mapping[str, Any], *, gpu_index: int | None) -> dict[str, Any]:
        from ..environment import gpus

        found = gpus()
        chosen = next((g for g in found if g["index"] == (gpu_index or 0)), found[0] if found else None)
        if not chosen:
            return {"device_name": None}
        return {"device_name": chosen["name"], "driver_version": chosen["driver_version"],
                "device_memory_bytes": chosen["total_bytes"]}

    def worker_env(self, *, gpu: str | None = None) -> dict[str, str]:
        from ..worker import worker_env

        return worker_env(gpu="0" if gpu is None else str(gpu))

    def configure_tensorflow(self, tf: Any) -> str:
        found = tf.config.list_physical_devices("GPU")
        if not found:
            return ("backend gpu: TensorFlow sees no GPU "
                    f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        for g in found:
            tf.config.experimental.set_memory_growth(g, True)
        return ""

    def device_label(self, measured_name: str) -> str:
        return measured_name or "GPU:0"
