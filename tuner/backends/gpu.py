"""``gpu``: real runs on the GPU (one worker per GPU of ``--gpus``); the peak is TF's allocator peak.

Which GPU: `tuner.worker.gpus.choose_gpu` reads ``--gpu`` against your
``CUDA_VISIBLE_DEVICES`` and NVML's listing (MIG instances included); each
worker gets that device's UUID in ``CUDA_VISIBLE_DEVICES``.

The budget is enforced, not only compared: the worker makes the GPU one logical
device whose ``memory_limit`` is the budget (memory growth off: TF's GPU
allocator may not take more, and cuDNN's autotuner picks algorithms for what
that allocator can give). Without ``--budget`` the budget is what TensorFlow
can reach on the chosen GPU in a plain training run
(`lms.machine.reachable.tf_reachable_bytes`, the model ``config="auto"`` uses too), not
NVML's total. NVML's figures are recorded beside TF's; with the pool fixed they
show the budget plus the CUDA context, whatever the step needs.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Mapping

from lms.machine.reachable import CUDA_CONTEXT_BYTES, min_system_memory, tf_reachable_bytes

from ..errors import BadInput
from .base import GpuChoice
from .measured import MeasuredBackend

__all__ = ["GpuBackend", "profile_of_gpu", "default_profile", "min_system_memory", "tf_reachable_bytes",
           "logical_device_configs", "CUDA_CONTEXT_BYTES"]

log = logging.getLogger(__name__)

def profile_of_gpu(gpu_info: Mapping[str, Any] | None) -> str | None:
    """The simulator's device profile of a GPU NVML found (`lms.machine.devices.profile_for_gpu`), or None."""
    from lms.machine.devices import profile_for_gpu

    if not gpu_info:
        return None
    mig = gpu_info.get("mig") == "instance"  # the instance has less memory than its GPU's profile
    return profile_for_gpu(str(gpu_info["name"]), memory_bytes=None if mig else int(gpu_info["total_bytes"]))


def default_profile(gpu_info: Mapping[str, Any] | None) -> str:
    """`profile_of_gpu`, else a V100's (NVLink on POWER, PCIe elsewhere; logged), else ``V100-16GB`` (no GPU)."""
    import platform

    found = profile_of_gpu(gpu_info)
    if found or not gpu_info:
        return found or "V100-16GB"
    fallback = "V100-16GB" if platform.machine().lower().startswith("ppc64") else "V100-PCIe-16GB"
    log.warning("no device profile matches GPU %s; the simulator screens with %s (give --device to choose)",
                gpu_info.get("name"), fallback)
    return fallback


class GpuBackend(MeasuredBackend):
    name = "gpu"
    # the baseline and 3 of the screen's picks, each a bracket of fresh processes (`tuner.backends.confirm`: 3-6
    # processes of one batch each, every one paying TensorFlow's start and the trace); with --confirm 0 a
    # trial is one process and more of them are cheap
    default_trials = 4
    peak_source = "tf-allocator-gpu"
    help = "the same with real runs on the GPU (MEASURED on GPU)"
    tf_device = "/GPU:0"

    def choose_gpus(self, *, gpu: str | None, gpus: tuple[str, ...], workers: int,
                    inventory: Callable[[], list[dict[str, Any]]]) -> GpuChoice:
        from ..worker.gpus import STRIPPED_ENV, GpuChoiceError, choose_gpu

        found = inventory()
        if not found:
            raise BadInput("backend gpu: no GPU found (NVML); use --backend emulated or --backend simulate")
        wanted: tuple[str | None, ...] = gpus or (tuple(str(i) for i in range(workers)) if workers > 1 else (gpu,))
        try:
            picks = [choose_gpu(w, env=os.environ, inventory=found) for w in wanted]
        except GpuChoiceError as exc:
            raise BadInput(str(exc)) from None
        uuids = [g["uuid"] for g, _ in picks]
        if len(set(uuids)) != len(uuids):
            raise BadInput(f"--gpus {','.join(str(w) for w in wanted)}: names one device twice ({', '.join(uuids)})")
        notes = [note for _, note in picks if note]
        notes += [f"{name}={os.environ[name]!r} is not passed to the trial workers: {why}"
                  for name, why in STRIPPED_ENV.items() if os.environ.get(name)]
        info = min((g for g, _ in picks), key=lambda g: g["total_bytes"])  # the budget must fit the smallest
        return GpuChoice(info=info, gpus=tuple(uuids), workers=len(uuids), notes=tuple(notes))

    def default_device(self, gpu_info: Mapping[str, Any] | None) -> str:
        return default_profile(gpu_info)

    def default_budget(self, *, device: str, gpu_info: Mapping[str, Any] | None) -> tuple[int | None, str]:
        assert gpu_info is not None
        return tf_reachable_bytes(gpu_info)

    def slots(self, settings: Any) -> list[str | None]:
        return list(settings.gpus) if settings.gpus else [settings.gpu] * settings.workers

    def slots_label(self, slots: list[str | None]) -> str:
        return ", ".join(f"GPU {g}" for g in slots)

    def source_label(self, *, measured: bool, device: str = "", device_name: str = "") -> str:
        if not measured:
            return super().source_label(measured=False, device=device)
        return f"measured on GPU ({device_name})" if device_name else "measured on GPU"

    def device_info(self, info: Mapping[str, Any], *, gpu: str | None) -> dict[str, Any]:
        from ..environment import gpus
        from ..worker.gpus import GpuChoiceError, choose_gpu

        found = gpus()
        try:
            chosen = choose_gpu(gpu, env=os.environ, inventory=found)[0] if found else None
        except GpuChoiceError:
            chosen = None
        if not chosen:
            return {"device_name": None}
        return {"device_name": chosen["name"], "driver_version": chosen["driver_version"],
                "device_memory_bytes": chosen["total_bytes"], "device_uuid": chosen["uuid"]}

    def worker_env(self, *, gpu: str | None = None) -> dict[str, str]:
        from ..worker.run import worker_env

        return worker_env(gpu=self._visible(gpu))

    @staticmethod
    def _visible(gpu: str | None) -> str:
        """The UUID for a slot: the CLI resolved it already; settings built in code may hold an index."""
        if gpu is not None and str(gpu).startswith(("GPU-", "MIG-")):
            return str(gpu)
        from ..environment import gpus
        from ..worker.gpus import GpuChoiceError, choose_gpu

        try:
            return str(choose_gpu(gpu, env=os.environ, inventory=gpus())[0]["uuid"])
        except GpuChoiceError as exc:
            raise BadInput(str(exc)) from None

    def worker_limits(self, settings: Any) -> dict[str, Any]:
        from ..environment import host_memory_bytes
        from ..worker.gpus import host_memory_limit_bytes

        from ..host import worker_host_limit_bytes

        host = host_memory_bytes()
        share = host_memory_limit_bytes(host_bytes=host, workers=len(self.slots(settings))) if host else None
        # a --host-budget above TF's pinned default: the workers' TF_GPU_HOST_MEM_LIMIT_IN_MB lets configs use it
        return {"device_memory_limit_bytes": settings.budget_bytes,
                "host_memory_limit_bytes": worker_host_limit_bytes(settings, share)}

    def configure_tensorflow(self, tf: Any, *, memory_limit_bytes: int | None = None,
                             user_program: bool = False) -> str:
        from ..worker.gpus import NO_GPU_REASON

        found = tf.config.list_physical_devices("GPU")
        if not found:
            return f"{NO_GPU_REASON} (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
        if memory_limit_bytes is None:  # no budget to enforce: do not grab the whole GPU either
            for device in found:
                tf.config.experimental.set_memory_growth(device, True)
            return ""
        for device, config in logical_device_configs(found, memory_limit_bytes=memory_limit_bytes,
                                                     make=tf.config.LogicalDeviceConfiguration):
            tf.config.set_logical_device_configuration(device, config)
        return ""

    def device_label(self, measured_name: str) -> str:
        return measured_name or "GPU:0"


def logical_device_configs(devices: list[Any], *, memory_limit_bytes: int | None,
                           make: Callable[..., Any]) -> list[tuple[Any, list[Any]]]:
    """(physical GPU, [one logical device config]) pairs that enforce `memory_limit_bytes` on each GPU.

    ``memory_limit`` is in MiB (TF's ``LogicalDeviceConfiguration``), rounded
    down so the limit never exceeds the budget. Memory growth is not set beside
    it (TF refuses both on one device; the worker's ``TF_FORCE_GPU_ALLOW_GROWTH``
    is unset). Without a limit, no configuration.

    Raises:
        ValueError: a limit below 1 MiB.
    """
    if memory_limit_bytes is None:
        return []
    limit_mib = int(memory_limit_bytes) >> 20
    if limit_mib < 1:
        raise ValueError(f"memory_limit_bytes={memory_limit_bytes!r}: must be at least 1 MiB")
    return [(device, [make(memory_limit=limit_mib)]) for device in devices]
