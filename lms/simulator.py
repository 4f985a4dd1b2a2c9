"""Simulate the device memory and time of a training step under a swap plan. No TensorFlow.

An interpreter over the executed order of `lms.plan.rewrite_graph(graph, plan)`
(see `lms.sim`): allocate each op's outputs, free each tensor after its last
reader, add the op's temporaries, count swap-out copies as host bytes, and time
ops and copies on a compute stream plus one copy engine per direction.

    >>> from lms.simulator import simulate, max_batch
    >>> r = simulate(graph, LMSConfig(lb=3), batch=64, device="V100-16GB")  # doctest: +SKIP
    >>> r.peak_device_bytes, r.step_time_s, r.stall_time_s                   # doctest: +SKIP
    >>> max_batch(graph, LMSConfig(), 16 << 30, device="P100-16GB").batch   # doctest: +SKIP

Every figure it returns is a prediction.
"""

from __future__ import annotations

from .machine.devices import DEVICES, DeviceProfile, get_device
from .sim import (ALL_SWAPPED, CPU_TEMPORARIES, GPU_TEMPORARIES, NO_TEMPORARIES, CompiledGraph,
                  InfeasibleBudget, MaxBatchResult, OpCosts, SimResult, TemporaryModel, TemporaryRule, Timeline,
                  TimelineEvent, bfc_adjusted_batch, compile_graph, executed_order, max_batch, simulate)

__all__ = [
    "simulate", "SimResult", "Timeline", "TimelineEvent", "max_batch", "MaxBatchResult", "bfc_adjusted_batch",
    "InfeasibleBudget", "ALL_SWAPPED", "TemporaryModel", "TemporaryRule", "CPU_TEMPORARIES",
    "NO_TEMPORARIES", "GPU_TEMPORARIES", "CompiledGraph", "compile_graph", "executed_order",
    "DeviceProfile", "DEVICES", "get_device", "OpCosts",
]
