"""``config="auto"`` in `lms.function` and `lms.enable_lms`: the budget, the device to simulate, one INFO line.

The choice itself is `lms.auto.choose_config` (no TensorFlow), made at each
trace for the traced graph and batch. This module resolves what it needs from
the machine once, when the step is wrapped:

- the budget: given (bytes or ``"14GiB"``), or on a GPU what TensorFlow's
  allocator reaches there, as the tuner's gpu backend computes it: a logical
  device's ``memory_limit``, else NVML's memory less other processes', the CUDA
  context and TF's ``MinSystemMemory`` (`default_gpu_budget`); without a GPU
  (the emulated device) there is no memory size to default to, so it is required;
- the device profile the simulator models: ``"cpu"`` for emulated or CPU swap
  ops, else the profile of the GPU TF uses (`lms.machine.devices.profile_for_gpu`).

The choice is a prediction, so `PeakCheck` measures it once: the step's second
call (the first one traces, and may run dry runs) runs with TF's allocator peak
statistic reset, and a peak above the budget is logged as a WARNING with both
figures. It is not re-planned: the user decides (a smaller budget, or the tuner).
"""

from __future__ import annotations

import logging
import numbers
import os
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from ..auto import DEFAULT_MARGIN, AutoChoice, choose_config
from ..graph import Graph
from ..sizes import MIN_SIZE, format_size, parse_size

__all__ = ["AutoSettings", "PeakCheck", "default_gpu_budget"]

log = logging.getLogger(__name__)

_NO_BUDGET = ("config='auto' needs budget= on a machine without a GPU: the emulated device has no memory size of "
              "its own (e.g. lms.function(step, config='auto', budget='2GiB'))")


def default_gpu_budget() -> tuple[int, str]:
    """Bytes the step may use on the GPU TF uses as ``GPU:0``, and where the figure comes from.

    What TensorFlow's allocator reaches there (`lms.machine.reachable.tf_reachable_bytes`, the tuner's
    model too): the ``memory_limit`` of the logical device when the program set one, else NVML's total
    memory of the visible device (a MIG instance's own) less what other processes hold on it, the CUDA
    context and TF's ``MinSystemMemory`` for the device's compute capability.

    Raises:
        ValueError: NVML is not available or does not find the device (give ``budget=``).
    """
    from ..machine.nvml import NvmlError, resolve_visible_device
    from ..machine.reachable import tf_reachable_bytes

    limit = _memory_limit()
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 -- no driver, no nvidia-ml-py: the user gives a budget
        if limit is not None:
            return tf_reachable_bytes({"name": "GPU:0"}, memory_limit=limit)
        raise ValueError(f"config='auto' could not read the GPU's memory through NVML ({exc}); give budget=") from None
    try:
        try:
            _, handle = resolve_visible_device(pynvml)
        except NvmlError as exc:
            raise ValueError(f"config='auto': {exc}; give budget=") from None
        total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        others = 0
        try:
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if int(proc.pid) != os.getpid() and proc.usedGpuMemory:
                    others += int(proc.usedGpuMemory)
        except Exception as exc:  # noqa: BLE001 -- not permitted in some containers: count none
            log.debug("NVML could not list the GPU's processes: %s", exc)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
        try:
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            capability = f"{int(major)}.{int(minor)}"
        except Exception:  # noqa: BLE001 -- a MIG handle or an old driver: the largest reserve
            capability = None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    info = {"name": name, "total_bytes": total, "free_bytes": total - others, "compute_capability": capability}
    budget, source = tf_reachable_bytes(info, memory_limit=limit)
    if budget <= 0:
        raise ValueError(f"config='auto': GPU {name} has {format_size(total)}, of which other processes hold "
                         f"{format_size(others)}: nothing left for the step")
    if limit is None and others:
        source += f"; free = total less {format_size(others)} held by other processes"
    return budget, source


def _memory_limit() -> int | None:
    """The ``memory_limit`` (bytes) of GPU:0's logical device configuration, when the program set one."""
    try:
        gpus = tf.config.list_physical_devices("GPU")
        configs = tf.config.get_logical_device_configuration(gpus[0]) if gpus else None
    except (RuntimeError, ValueError):  # pragma: no cover - depends on the runtime's state
        return None
    limit = getattr(configs[0], "memory_limit", None) if configs else None
    return int(limit) << 20 if limit else None  # TF takes it in MiB


@dataclass(frozen=True)
class AutoSettings:
    """What ``config="auto"`` needs besides the graph: the budget, the margin and the device to simulate."""

    budget_bytes: int
    budget_source: str
    margin: float
    device: str

    @classmethod
    def create(cls, *, budget: Any, margin: float, emulate: bool) -> "AutoSettings":
        """Resolve the budget and the device profile (see the module docstring).

        Raises:
            ValueError: a bad budget or margin; no budget and no GPU (one line).
        """
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin <= 0.5:
            raise ValueError(f"margin={margin!r}: must be a fraction between 0 and 0.5 (default {DEFAULT_MARGIN})")
        on_gpu = bool(tf.config.list_logical_devices("GPU")) and not emulate
        if budget is None:
            if not on_gpu:
                raise ValueError(_NO_BUDGET)
            budget_bytes, source = default_gpu_budget()
        else:
            budget_bytes = parse_size(budget, what="budget", minimum=1 if isinstance(budget, numbers.Integral) else MIN_SIZE)
            source = "given"
        return cls(budget_bytes=budget_bytes, budget_source=source, margin=float(margin),
                   device=_gpu_profile() if on_gpu else "cpu")

    def choose(self, model: Graph, *, batch: int, exact: bool, owner: str) -> AutoChoice:
        """`lms.auto.choose_config` for one trace, logged in one INFO line (raises `lms.auto.NoConfigFits`)."""
        choice = choose_config(model, batch=batch, budget=self.budget_bytes, device=self.device,
                               margin=self.margin, exact=exact)
        log.info("LMS auto: %s for %s at batch %d: predicted peak %s of %s usable (budget %s, %s), step %s than "
                 "without LMS (PREDICTED, %s profile); %s; chosen in %.2f s", choice.label, owner, batch,
                 format_size(choice.peak_bytes), format_size(choice.usable_bytes), format_size(self.budget_bytes),
                 self.budget_source, _cost_words(choice), self.device, choice.reason, choice.elapsed_s)
        return choice


def _cost_words(choice: AutoChoice) -> str:
    cost = choice.throughput_cost
    return "no slower" if abs(cost) < 0.0005 else f"{abs(cost):.1%} {'slower' if cost > 0 else 'faster'}"


def _gpu_profile() -> str:
    """The simulator's profile of the GPU TF uses as ``GPU:0`` (`lms.machine.devices.profile_for_gpu`), else a V100's."""
    from ..machine.devices import profile_for_gpu

    name = ""
    try:
        name = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0]).get(
            "device_name", "")
    except (IndexError, ValueError, RuntimeError) as exc:
        log.debug("no device details for GPU:0: %s", exc)
    profile = profile_for_gpu(name) if name else None
    if profile is None:
        log.info("LMS auto: no device profile for GPU %r; simulating a V100-16GB", name)
        return "V100-16GB"
    return profile


class PeakCheck:
    """Measure TF's allocator peak of one call of an auto step and compare it with its budget (see module docstring)."""

    def __init__(self, settings: AutoSettings) -> None:
        self.settings = settings
        self.calls = 0
        self.measured_peak_bytes: int | None = None

    @property
    def device(self) -> str:
        return "CPU:0" if self.settings.device == "cpu" else "GPU:0"

    def call(self, run: Any, *, choice: Any, owner: str) -> Any:
        """``run()``; on the second call, with the peak reset before and read after."""
        self.calls += 1
        if self.calls != 2 or choice is None:
            return run()
        try:
            tf.config.experimental.reset_memory_stats(self.device)
        except (ValueError, RuntimeError) as exc:  # CPU without TF_CPU_ALLOCATOR_USE_BFC: no statistic
            log.debug("LMS auto: no allocator statistic on %s (%s); the peak is not checked", self.device, exc)
            return run()
        out = run()
        tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)  # the step has finished
        peak = int(tf.config.experimental.get_memory_info(self.device)["peak"])
        self.measured_peak_bytes = peak
        if peak > choice.budget_bytes:
            log.warning("LMS auto: %s peaked at %s on %s (TF's allocator), above its budget %s; the simulator "
                        "predicted %s for %s. Give a smaller budget, or tune it: python -m tuner search",
                        owner, format_size(peak), self.device, format_size(choice.budget_bytes),
                        format_size(choice.peak_bytes), choice.label)
        else:
            log.info("LMS auto: %s peaked at %s of its %s budget (TF's allocator; predicted %s)", owner,
                     format_size(peak), format_size(choice.budget_bytes), format_size(choice.peak_bytes))
        return out
