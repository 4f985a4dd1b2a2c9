"""GPU memory a TensorFlow process can reach: the one model the tuner and ``config="auto"`` share. No TensorFlow.

TF 2.21 sizes its GPU allocator when the process first touches the GPU
(``SingleVirtualDeviceMemoryLimit`` in ``gpu_device.cc``): the memory free on
the device at that moment, after the process's own CUDA context, less
``MinSystemMemory`` (`min_system_memory`), unless a logical device
configuration gives a ``memory_limit`` (then exactly that). So:

    reachable = free - CUDA context - MinSystemMemory        (no memory_limit)
    reachable = memory_limit                                  (memory_limit set)

where *free* is the device's free memory without this process (NVML's free
memory in a process that has not touched the GPU; NVML's total less what other
processes hold, in one that has). A MIG instance is a device of its own (its
own total and free memory). `tf_reachable_bytes` returns the bytes and a
sentence saying how they were worked out.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..sizes import format_size

__all__ = ["CUDA_CONTEXT_BYTES", "min_system_memory", "tf_reachable_bytes"]

_MiB = 1 << 20
#: The CUDA context (and what cuDNN/cuBLAS load with it) of a TensorFlow process: an estimate, not a
#: measurement; ``benchmarks/gpu_check.py`` measures it on your GPU and says when this is too small.
CUDA_CONTEXT_BYTES = 512 * _MiB


def min_system_memory(available_bytes: int, cc_major: int | None) -> int:
    """What TensorFlow leaves free on a GPU (``MinSystemMemory`` in TF 2.21's ``gpu_device.cc``).

    225 MiB when less than 2 GiB is available; else by compute capability:
    500 MiB (<= 6.x), 1050 MiB (7.x), 1536 MiB (8.x), 1800 MiB (9.x and newer). An unknown
    capability gets the largest (1800 MiB).
    """
    if available_bytes < (1 << 31):
        return 225 * _MiB
    if cc_major is None:
        return 1800 * _MiB
    if cc_major <= 6:
        return 500 * _MiB
    if cc_major <= 7:
        return 1050 * _MiB
    if cc_major <= 8:
        return 1536 * _MiB
    return 1800 * _MiB


def tf_reachable_bytes(gpu_info: Mapping[str, Any], *, context_bytes: int = CUDA_CONTEXT_BYTES,
                       memory_limit: int | None = None) -> tuple[int, str]:
    """(bytes TensorFlow's GPU allocator gets on a GPU, how that was worked out).

    Args:
        gpu_info: NVML's facts of the device (`lms.machine.nvml.gpu_inventory`'s entries): ``name``,
            ``total_bytes``, ``free_bytes`` (without this process; None: total), ``compute_capability``.
        context_bytes: the CUDA context's bytes (`CUDA_CONTEXT_BYTES`, an estimate).
        memory_limit: a logical device's ``memory_limit`` in bytes, when the program sets one: TF's
            allocator gets exactly that.
    """
    name = gpu_info.get("name", "GPU")
    if memory_limit is not None:
        return int(memory_limit), f"the memory_limit of TensorFlow's logical GPU device ({format_size(memory_limit)})"
    free = gpu_info.get("free_bytes")
    free_label = "free"
    if free is None:
        free, free_label = gpu_info["total_bytes"], "total"
    cc = gpu_info.get("compute_capability")
    cc_major = int(str(cc).split(".")[0]) if cc else None
    available = max(0, int(free) - context_bytes)
    reserve = min_system_memory(available, cc_major)
    reachable = max(0, available - reserve)
    why = (f"what TensorFlow can reach on GPU {name}: {format_size(free)} {free_label} (NVML) - "
           f"{format_size(context_bytes)} CUDA context (estimate) - {format_size(reserve)} TF MinSystemMemory "
           f"(compute capability {cc or 'unknown'})")
    return reachable, why
