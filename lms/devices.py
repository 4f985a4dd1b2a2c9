"""Accelerator profiles for the simulator: memory, peak rates, host link. No TensorFlow.

Figures are the vendors' datasheet numbers (fp32 dense, no tensor cores) and
the host link's per-direction theoretical rate. ``link_bandwidth`` is the
*effective* rate the simulator uses: 85% of the theoretical per-direction
rate, an assumption in line with typical ``bandwidthTest`` / pinned-memory
copy results (80-90%); override it with `DeviceProfile.replace` when you
have a measurement.

``memory_bytes`` is the nominal capacity in GiB (HBM capacities are binary;
"16 GB" P100 = 16 GiB). What a framework can use is somewhat less (CUDA
context, allocator reserve): pass an explicit budget to the tuner when that
matters.

``compute_efficiency`` / ``memory_efficiency`` are the fractions of peak an
op reaches in the roofline time model (assumptions, not measurements; per-op
measurements via ``op_costs`` replace them). ``op_overhead_s`` is a fixed
cost per executed op (kernel launch and executor bookkeeping).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

__all__ = ["DeviceProfile", "DEVICES", "get_device", "GiB"]

GiB = 1 << 30
_GB = 1e9  # vendors quote bandwidth in decimal GB/s
_TFLOPS = 1e12
_EFFECTIVE_LINK = 0.85


# lms.sim.order.ORDERS (not imported: this module stays free of the simulator)
_ORDERS = ("executor", "single_threaded", "fifo", "creation")


@dataclass(frozen=True)
class DeviceProfile:
    """One accelerator and its link to host memory.

    Attributes:
        name: short id, e.g. ``"V100-16GB"``.
        memory_bytes: device memory capacity.
        peak_flops: fp32 dense peak, FLOP/s.
        mem_bandwidth: device memory bandwidth, bytes/s.
        link_bandwidth: host<->device bandwidth used by the simulator, bytes/s
            per direction (effective; each direction has its own copy engine).
        link: the link's name, e.g. ``"NVLink 2.0 (3 bricks)"``.
        source: where the figures come from.
        link_peak_bandwidth: theoretical per-direction link rate, bytes/s.
        compute_efficiency: fraction of ``peak_flops`` a compute-bound op reaches.
        memory_efficiency: fraction of ``mem_bandwidth`` a memory-bound op reaches.
        op_overhead_s: fixed time per executed op.
        transfer_latency_s: fixed time per host<->device copy.
        expensive_op_bytes: TF's executor runs an op that touches more bytes
            than this as a task of its own (CPU kernels); ``None``: every op
            runs inline (GPU kernels are only enqueued). See
            `lms.sim.compiled.executed_order`.
        async_copies: host<->device copies run on their own copy engines,
            overlapping compute (GPUs); ``False``: a copy is an op of its own
            on the one stream (the CPU emulation's numpy copies).
        kernels: ``"gpu"`` or ``"cpu"``: whose scratch-memory model applies
            (`lms.sim.costs.TEMPORARIES`).
        order: the executed-order model `lms.simulate` uses on this device
            unless told otherwise (`lms.sim.order.executed_order`): GPUs
            ``"executor"`` (TF's default executor); the emulated device
            (``"cpu"``) ``"single_threaded"``, the executor its measurements
            run under (``measure_step(executor="single_threaded")``).
    """

    name: str
    memory_bytes: int
    peak_flops: float
    mem_bandwidth: float
    link_bandwidth: float
    link: str
    source: str
    link_peak_bandwidth: float = 0.0
    compute_efficiency: float = 0.6
    memory_efficiency: float = 0.8
    op_overhead_s: float = 5e-6
    transfer_latency_s: float = 10e-6
    expensive_op_bytes: int | None = None
    async_copies: bool = True
    kernels: str = "gpu"
    order: str = "executor"

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "peak_flops", "mem_bandwidth", "link_bandwidth"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"DeviceProfile.{name}={value!r}: must be > 0")
        for name in ("compute_efficiency", "memory_efficiency"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"DeviceProfile.{name}={value!r}: must be in (0, 1]")
        if self.kernels not in ("gpu", "cpu"):
            raise ValueError(f"DeviceProfile.kernels={self.kernels!r}: allowed 'gpu', 'cpu'")
        if self.order not in _ORDERS:
            raise ValueError(f"DeviceProfile.order={self.order!r}: allowed " + ", ".join(map(repr, _ORDERS)))
        for name in ("op_overhead_s", "transfer_latency_s", "link_peak_bandwidth"):
            if getattr(self, name) < 0:
                raise ValueError(f"DeviceProfile.{name}={getattr(self, name)!r}: must be >= 0")

    def replace(self, **changes: Any) -> "DeviceProfile":
        """A copy with some fields changed (e.g. a measured ``link_bandwidth``)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _gpu(name: str, mem_gib: int, tflops: float, mem_gbs: float, link: str, link_gbs: float,
         source: str) -> DeviceProfile:
    return DeviceProfile(
        name=name, memory_bytes=mem_gib * GiB, peak_flops=tflops * _TFLOPS,
        mem_bandwidth=mem_gbs * _GB, link_bandwidth=_EFFECTIVE_LINK * link_gbs * _GB, link=link,
        source=source, link_peak_bandwidth=link_gbs * _GB)


_NVLINK1_MINSKY = ("NVLink 1.0 CPU-GPU, 2 links x 20 GB/s per direction "
                   "(IBM Power System S822LC for HPC, 'Minsky')")
_NVLINK2_AC922 = ("NVLink 2.0 CPU-GPU, 3 bricks x 25 GB/s per direction "
                  "(IBM Power System AC922, 4-GPU configuration)")
_PCIE4 = "PCIe 4.0 x16 (31.5 GB/s per direction)"
_PCIE5 = "PCIe 5.0 x16 (63 GB/s per direction)"


def _cpu_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 16 * GiB


DEVICES: dict[str, DeviceProfile] = {p.name: p for p in (
    _gpu("P100-16GB", 16, 10.6, 732, _NVLINK1_MINSKY, 40,
         "NVIDIA Tesla P100 datasheet (SXM2: 10.6 TFLOPS fp32, 732 GB/s HBM2); IBM Redpaper "
         "REDP-5405 (S822LC for HPC, NVLink 1.0 to POWER8). The TFLMS paper's machine."),
    _gpu("V100-16GB", 16, 15.7, 900, _NVLINK2_AC922, 75,
         "NVIDIA Tesla V100 datasheet (SXM2: 15.7 TFLOPS fp32, 900 GB/s HBM2); IBM Redbook "
         "REDP-5472 (AC922, NVLink 2.0 to POWER9)."),
    _gpu("V100-32GB", 32, 15.7, 900, _NVLINK2_AC922, 75,
         "NVIDIA Tesla V100 datasheet (SXM2 32 GB); IBM Redbook REDP-5472 (AC922)."),
    _gpu("A100-40GB", 40, 19.5, 1555, _PCIE4, 31.5,
         "NVIDIA A100 Tensor Core GPU datasheet (PCIe 40 GB: 19.5 TFLOPS fp32, 1,555 GB/s)."),
    _gpu("A100-80GB", 80, 19.5, 1935, _PCIE4, 31.5,
         "NVIDIA A100 Tensor Core GPU datasheet (PCIe 80 GB: 19.5 TFLOPS fp32, 1,935 GB/s)."),
    _gpu("H100-80GB", 80, 67.0, 3350, _PCIE5, 63,
         "NVIDIA H100 Tensor Core GPU datasheet (SXM5: 67 TFLOPS fp32, 3.35 TB/s HBM3); "
         "host link PCIe 5.0 x16."),
    _gpu("H200-141GB", 141, 67.0, 4800, _PCIE5, 63,
         "NVIDIA H200 Tensor Core GPU datasheet (SXM: 67 TFLOPS fp32, 141 GB HBM3e, 4.8 TB/s); "
         "host link PCIe 5.0 x16."),
    DeviceProfile(
        name="cpu", memory_bytes=_cpu_memory_bytes(), peak_flops=100e9, mem_bandwidth=20 * _GB,
        link_bandwidth=5 * _GB, link="host memcpy (emulated swap: numpy copy out of and back "
        "into TensorFlow's allocator)", source="rough assumptions for a 2-core x86 VM; memory_bytes "
        "is this machine's RAM. Calibrate with measured op_costs before trusting its times.",
        link_peak_bandwidth=5 * _GB, compute_efficiency=0.5, memory_efficiency=0.5,
        op_overhead_s=20e-6, transfer_latency_s=20e-6, expensive_op_bytes=32 << 10,
        async_copies=False, kernels="cpu", order="single_threaded"),
)}


def get_device(name: str | DeviceProfile) -> DeviceProfile:
    """The profile called `name` (case-insensitive); a `DeviceProfile` is returned as is.

    Raises:
        ValueError: unknown name; the message lists the known ones.
    """
    if isinstance(name, DeviceProfile):
        return name
    if not isinstance(name, str):
        raise ValueError(f"device {name!r}: expected a name such as 'V100-16GB'")
    wanted = name.strip().lower()
    for key, profile in DEVICES.items():
        if key.lower() == wanted:
            return profile
    raise ValueError(f"unknown device {name!r}; known devices: " + ", ".join(DEVICES))
