"""Accelerator profiles for the simulator: memory, peak rates, host link. No TensorFlow.

Figures are the vendors' datasheet numbers (fp32 dense on CUDA cores, and
the TF32 tensor-core dense rate where the GPU has one: half the datasheet's
"with sparsity" figure) and the host link's per-direction theoretical rate;
each profile's comment names the datasheet. ``link_bandwidth`` is the
*effective* rate the simulator uses: 85% of the theoretical per-direction
rate, an assumption in line with typical ``bandwidthTest`` / pinned-memory
copy results (80-90%); override it with `DeviceProfile.replace` when you
have a measurement.

``memory_bytes`` is the nominal capacity in GiB (HBM capacities are binary;
"16 GB" P100 = 16 GiB). What a framework can use is somewhat less (CUDA
context, allocator reserve): pass an explicit budget to the tuner when that
matters.

**TF32.** TensorFlow runs float32 matrix multiplications and convolutions in
TF32 on tensor cores on Ampere and newer GPUs by default
(``tf.config.experimental.enable_tensor_float_32_execution``, on since TF
2.4): cuBLAS for ``MatMul``/``BatchMatMulV2`` (and ``Einsum``, Keras ``Dense``),
cuDNN for ``Conv2D``/``Conv3D`` and their ``BackpropInput``/``BackpropFilter``.
Those are the ops the simulator gives FLOPs (`lms.sim.costs.op_flops`), so its
roofline divides them by `DeviceProfile.matmul_flops`: the TF32 rate where the
profile has one, the fp32 rate otherwise (Pascal, Volta, Turing). Depthwise
convolutions are counted at that rate too, a simplification (TF runs them in
its own kernels; they are memory-bound on these GPUs, so the roofline's memory
term decides their time anyway).

**Host links.** A CPU-GPU NVLink exists only on IBM POWER8/POWER9 servers
(``P100-16GB``, ``V100-16GB``, ``V100-32GB``: the TFLMS paper's machines) and
NVIDIA's Grace (``GH200-*``, NVLink-C2C); every x86 server reaches its GPUs over
PCIe, SXM boards included (e.g. DGX-1), so the same chips on x86 have profiles
of their own. `profile_for_gpu` picks a profile from NVML's device name.

``compute_efficiency`` / ``memory_efficiency`` are the fractions of peak an
op reaches in the roofline time model (assumptions, not measurements; per-op
measurements via ``op_costs`` replace them). ``op_overhead_s`` is a fixed
cost per executed op (kernel launch and executor bookkeeping).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["DeviceProfile", "DEVICES", "get_device", "GiB", "profile_for_gpu"]

GiB = 1 << 30
_GB = 1e9  # vendors quote bandwidth in decimal GB/s
_TFLOPS = 1e12
_EFFECTIVE_LINK = 0.85


# lms.order.ORDERS (not imported: this module stays free of the simulator)
_ORDERS = ("executor", "single_threaded", "fifo", "creation")


@dataclass(frozen=True)
class DeviceProfile:
    """One accelerator and its link to host memory.

    Attributes:
        name: short id, e.g. ``"V100-16GB"``.
        memory_bytes: device memory capacity.
        peak_flops: fp32 dense peak on CUDA cores, FLOP/s.
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
            unless told otherwise (`lms.order.executed_order`): GPUs
            ``"executor"`` (TF's default executor); the emulated device
            (``"cpu"``) ``"single_threaded"``, the executor its measurements
            run under (``measure_step(executor="single_threaded")``).
        tf32_flops: TF32 tensor-core dense peak, FLOP/s (0: none, before Ampere):
            what TensorFlow's float32 matmuls and convolutions run at (module docstring).
        compute_capability: CUDA compute capability, e.g. ``"7.0"`` ('' for the CPU): what
            Grappler's GPU passes read (`lms.tf.grappler`: the layout optimizer keeps NHWC
            for fp16 from 7.0 and bf16 from 8.0).
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
    tf32_flops: float = 0.0
    compute_capability: str = ""

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
        for name in ("op_overhead_s", "transfer_latency_s", "link_peak_bandwidth", "tf32_flops"):
            if getattr(self, name) < 0:
                raise ValueError(f"DeviceProfile.{name}={getattr(self, name)!r}: must be >= 0")

    @property
    def matmul_flops(self) -> float:
        """The rate of TF's float32 matmuls and convolutions: `tf32_flops` where there is one, else `peak_flops`."""
        return self.tf32_flops or self.peak_flops

    def replace(self, **changes: Any) -> "DeviceProfile":
        """A copy with some fields changed (e.g. a measured ``link_bandwidth``)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# NVIDIA's CUDA GPUs list (developer.nvidia.com/cuda-gpus): compute capability by chip.
_COMPUTE_CAPABILITY = {"P100": "6.0", "V100": "7.0", "T4": "7.5", "A100": "8.0", "A10": "8.6", "L4": "8.9",
                       "L40S": "8.9", "H100": "9.0", "H200": "9.0", "GH200": "9.0"}


def _gpu(name: str, mem_gib: int, tflops: float, mem_gbs: float, link: str, link_gbs: float,
         source: str, *, tf32_tflops: float = 0.0) -> DeviceProfile:
    return DeviceProfile(
        name=name, memory_bytes=mem_gib * GiB, peak_flops=tflops * _TFLOPS,
        mem_bandwidth=mem_gbs * _GB, link_bandwidth=_EFFECTIVE_LINK * link_gbs * _GB, link=link,
        source=source, link_peak_bandwidth=link_gbs * _GB, tf32_flops=tf32_tflops * _TFLOPS,
        compute_capability=_COMPUTE_CAPABILITY[name.split("-", 1)[0]])


_NVLINK1_MINSKY = ("NVLink 1.0 CPU-GPU, 2 links x 20 GB/s per direction "
                   "(IBM Power System S822LC for HPC, 'Minsky')")
_NVLINK2_AC922 = ("NVLink 2.0 CPU-GPU, 3 bricks x 25 GB/s per direction "
                  "(IBM Power System AC922, 4-GPU configuration)")
# PCI-SIG base specifications: 8 / 16 / 32 GT/s per lane, 128b/130b encoding, x16.
_PCIE3 = "PCIe 3.0 x16 (15.75 GB/s per direction)"
_PCIE4 = "PCIe 4.0 x16 (31.5 GB/s per direction)"
_PCIE5 = "PCIe 5.0 x16 (63 GB/s per direction)"
# NVIDIA GH200 Grace Hopper Superchip datasheet: NVLink-C2C, 900 GB/s bidirectional.
_NVLINK_C2C = "NVLink-C2C CPU-GPU (Grace, 450 GB/s per direction)"


def _cpu_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 16 * GiB


# Every figure below is the named vendor datasheet's; "TF32" is its tensor-core figure without
# sparsity (half the one marked "with sparsity"); link rates as in the constants above.
DEVICES: dict[str, DeviceProfile] = {p.name: p for p in (
    # -- IBM POWER hosts: CPU-GPU NVLink (the TFLMS paper's class of machine)
    # NVIDIA Tesla P100 datasheet (SXM2): 10.6 TFLOPS fp32, 732 GB/s HBM2.
    _gpu("P100-16GB", 16, 10.6, 732, _NVLINK1_MINSKY, 40,
         "NVIDIA Tesla P100 datasheet (SXM2: 10.6 TFLOPS fp32, 732 GB/s HBM2); IBM Redpaper "
         "REDP-5405 (S822LC for HPC, NVLink 1.0 to POWER8). The TFLMS paper's machine."),
    # NVIDIA Tesla V100 datasheet (SXM2): 15.7 TFLOPS fp32, 900 GB/s HBM2.
    _gpu("V100-16GB", 16, 15.7, 900, _NVLINK2_AC922, 75,
         "NVIDIA Tesla V100 datasheet (SXM2: 15.7 TFLOPS fp32, 900 GB/s HBM2); IBM Redbook "
         "REDP-5472 (AC922, NVLink 2.0 to POWER9)."),
    _gpu("V100-32GB", 32, 15.7, 900, _NVLINK2_AC922, 75,
         "NVIDIA Tesla V100 datasheet (SXM2 32 GB); IBM Redbook REDP-5472 (AC922)."),
    # -- the same chips on x86 hosts: PCIe 3.0 to the CPU (SXM2 boards too, e.g. DGX-1)
    # NVIDIA Tesla P100 datasheet (PCIe 16 GB): 9.3 TFLOPS fp32, 732 GB/s.
    _gpu("P100-PCIe-16GB", 16, 9.3, 732, _PCIE3, 15.75,
         "NVIDIA Tesla P100 datasheet (PCIe 16 GB: 9.3 TFLOPS fp32, 732 GB/s); x86 host, PCIe 3.0."),
    # NVIDIA Tesla P100 datasheet (SXM2): 10.6 TFLOPS fp32, 732 GB/s.
    _gpu("P100-SXM2-16GB", 16, 10.6, 732, _PCIE3, 15.75,
         "NVIDIA Tesla P100 datasheet (SXM2: 10.6 TFLOPS fp32, 732 GB/s); x86 host (DGX-1), PCIe 3.0."),
    # NVIDIA Tesla V100 datasheet (PCIe): 14 TFLOPS fp32, 900 GB/s.
    _gpu("V100-PCIe-16GB", 16, 14.0, 900, _PCIE3, 15.75,
         "NVIDIA Tesla V100 datasheet (PCIe: 14 TFLOPS fp32, 900 GB/s); x86 host, PCIe 3.0."),
    _gpu("V100-PCIe-32GB", 32, 14.0, 900, _PCIE3, 15.75,
         "NVIDIA Tesla V100 datasheet (PCIe 32 GB: 14 TFLOPS fp32, 900 GB/s); x86 host, PCIe 3.0."),
    # NVIDIA Tesla V100 datasheet (SXM2): 15.7 TFLOPS fp32, 900 GB/s.
    _gpu("V100-SXM2-16GB", 16, 15.7, 900, _PCIE3, 15.75,
         "NVIDIA Tesla V100 datasheet (SXM2: 15.7 TFLOPS fp32, 900 GB/s); x86 host (DGX-1), PCIe 3.0."),
    _gpu("V100-SXM2-32GB", 32, 15.7, 900, _PCIE3, 15.75,
         "NVIDIA Tesla V100 datasheet (SXM2 32 GB: 15.7 TFLOPS fp32, 900 GB/s); x86 host, PCIe 3.0."),
    # NVIDIA T4 Tensor Core GPU datasheet: 8.1 TFLOPS fp32, 16 GB GDDR6, 320 GB/s, PCIe Gen3 x16;
    # Turing tensor cores do fp16/int8, not TF32.
    _gpu("T4-16GB", 16, 8.1, 320, _PCIE3, 15.75,
         "NVIDIA T4 Tensor Core GPU datasheet (8.1 TFLOPS fp32, 16 GB GDDR6, 320 GB/s, PCIe Gen3 x16)."),
    # -- Ampere and newer: TF's float32 matmuls and convolutions run in TF32
    # NVIDIA A10 Tensor Core GPU datasheet: 31.2 TFLOPS fp32, TF32 62.5 (125 with sparsity),
    # 24 GB GDDR6, 600 GB/s, PCIe Gen4 x16.
    _gpu("A10-24GB", 24, 31.2, 600, _PCIE4, 31.5,
         "NVIDIA A10 Tensor Core GPU datasheet (31.2 TFLOPS fp32, TF32 62.5, 24 GB GDDR6, 600 GB/s, "
         "PCIe Gen4 x16).", tf32_tflops=62.5),
    # NVIDIA A100 Tensor Core GPU datasheet: 19.5 TFLOPS fp32, TF32 156 (312 with sparsity);
    # 40 GB: 1,555 GB/s (PCIe and SXM4); 80 GB PCIe: 1,935 GB/s; 80 GB SXM4: 2,039 GB/s.
    _gpu("A100-40GB", 40, 19.5, 1555, _PCIE4, 31.5,
         "NVIDIA A100 Tensor Core GPU datasheet (PCIe 40 GB: 19.5 TFLOPS fp32, TF32 156, 1,555 GB/s).",
         tf32_tflops=156),
    _gpu("A100-80GB", 80, 19.5, 1935, _PCIE4, 31.5,
         "NVIDIA A100 Tensor Core GPU datasheet (PCIe 80 GB: 19.5 TFLOPS fp32, TF32 156, 1,935 GB/s).",
         tf32_tflops=156),
    _gpu("A100-SXM4-80GB", 80, 19.5, 2039, _PCIE4, 31.5,
         "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80 GB: 19.5 TFLOPS fp32, TF32 156, 2,039 GB/s); "
         "host link PCIe 4.0 x16.", tf32_tflops=156),
    # NVIDIA L4 Tensor Core GPU datasheet: 30.3 TFLOPS fp32, TF32 60 (120 with sparsity),
    # 24 GB GDDR6, 300 GB/s, PCIe Gen4 x16.
    _gpu("L4-24GB", 24, 30.3, 300, _PCIE4, 31.5,
         "NVIDIA L4 Tensor Core GPU datasheet (30.3 TFLOPS fp32, TF32 60, 24 GB GDDR6, 300 GB/s, "
         "PCIe Gen4 x16).", tf32_tflops=60),
    # NVIDIA L40S GPU datasheet: 91.6 TFLOPS fp32, TF32 183 (366 with sparsity), 48 GB GDDR6,
    # 864 GB/s, PCIe Gen4 x16.
    _gpu("L40S-48GB", 48, 91.6, 864, _PCIE4, 31.5,
         "NVIDIA L40S GPU datasheet (91.6 TFLOPS fp32, TF32 183, 48 GB GDDR6, 864 GB/s, PCIe Gen4 x16).",
         tf32_tflops=183),
    # NVIDIA H100 Tensor Core GPU datasheet: SXM 67 TFLOPS fp32, TF32 494.5 (989 with sparsity),
    # 3.35 TB/s; PCIe 51 / 378 (756), 2 TB/s; NVL 60 / 417.5 (835), 94 GB, 3.9 TB/s.
    _gpu("H100-80GB", 80, 67.0, 3350, _PCIE5, 63,
         "NVIDIA H100 Tensor Core GPU datasheet (SXM5: 67 TFLOPS fp32, TF32 494.5, 3.35 TB/s HBM3); "
         "host link PCIe 5.0 x16.", tf32_tflops=494.5),
    _gpu("H100-PCIe-80GB", 80, 51.0, 2000, _PCIE5, 63,
         "NVIDIA H100 Tensor Core GPU datasheet (PCIe: 51 TFLOPS fp32, TF32 378, 80 GB HBM2e, 2 TB/s, "
         "PCIe Gen5 x16).", tf32_tflops=378),
    _gpu("H100-NVL-94GB", 94, 60.0, 3900, _PCIE5, 63,
         "NVIDIA H100 Tensor Core GPU datasheet (H100 NVL: 60 TFLOPS fp32, TF32 417.5, 94 GB HBM3, "
         "3.9 TB/s, PCIe Gen5 x16).", tf32_tflops=417.5),
    # NVIDIA H200 Tensor Core GPU datasheet: SXM 67 TFLOPS fp32, TF32 494.5 (989 with sparsity);
    # NVL 60 / 417.5 (835); both 141 GB HBM3e at 4.8 TB/s.
    _gpu("H200-141GB", 141, 67.0, 4800, _PCIE5, 63,
         "NVIDIA H200 Tensor Core GPU datasheet (SXM: 67 TFLOPS fp32, TF32 494.5, 141 GB HBM3e, "
         "4.8 TB/s); host link PCIe 5.0 x16.", tf32_tflops=494.5),
    _gpu("H200-NVL-141GB", 141, 60.0, 4800, _PCIE5, 63,
         "NVIDIA H200 Tensor Core GPU datasheet (H200 NVL: 60 TFLOPS fp32, TF32 417.5, 141 GB HBM3e, "
         "4.8 TB/s, PCIe Gen5 x16).", tf32_tflops=417.5),
    # NVIDIA GH200 Grace Hopper Superchip datasheet: 67 TFLOPS fp32, TF32 494.5 (989 with sparsity);
    # 96 GB HBM3 at 4 TB/s or 144 GB HBM3e at 4.9 TB/s; NVLink-C2C to the Grace CPU.
    _gpu("GH200-96GB", 96, 67.0, 4000, _NVLINK_C2C, 450,
         "NVIDIA GH200 Grace Hopper Superchip datasheet (67 TFLOPS fp32, TF32 494.5, 96 GB HBM3, "
         "4 TB/s, NVLink-C2C 900 GB/s bidirectional).", tf32_tflops=494.5),
    _gpu("GH200-144GB", 144, 67.0, 4900, _NVLINK_C2C, 450,
         "NVIDIA GH200 Grace Hopper Superchip datasheet (67 TFLOPS fp32, TF32 494.5, 144 GB HBM3e, "
         "4.9 TB/s, NVLink-C2C 900 GB/s bidirectional).", tf32_tflops=494.5),
    DeviceProfile(
        name="cpu", memory_bytes=_cpu_memory_bytes(), peak_flops=100e9, mem_bandwidth=20 * _GB,
        link_bandwidth=5 * _GB, link="host memcpy (emulated swap: numpy copy out of and back "
        "into TensorFlow's allocator)", source="rough assumptions for a 2-core x86 VM; memory_bytes "
        "is this machine's RAM. Calibrate with measured op_costs before trusting its times.",
        link_peak_bandwidth=5 * _GB, compute_efficiency=0.5, memory_efficiency=0.5,
        op_overhead_s=20e-6, transfer_latency_s=20e-6, expensive_op_bytes=32 << 10,
        async_copies=False, kernels="cpu", order="single_threaded"),
)}

# A profile must be within this fraction of the memory NVML reports, else the GPU is another variant.
_MEMORY_TOLERANCE = 0.15
# The chip in an NVML name: a whole token, so "A10" is not "A100"/"A10G", "L4" not "L40S", "H200" not "GH200".
_CHIP = re.compile(r"^(GH200|H200|H100|A100|A10|L40S|L4|T4|V100|P100)(?![0-9A-Z])")


def _nearest(candidates: tuple[str, ...], memory_bytes: int | None) -> str:
    if memory_bytes is None:
        return candidates[0]
    return min(candidates, key=lambda k: abs(DEVICES[k].memory_bytes - memory_bytes))


def profile_for_gpu(name: str, *, memory_bytes: int | None = None, machine: str | None = None) -> str | None:
    """The device profile of a GPU as NVML names it (``"Tesla V100-SXM2-16GB"``, ``"NVIDIA H100 PCIe"``), or None.

    The chip is matched as a whole word (``"GH200 480GB"`` is not an H200, ``"A10G"``
    not an A10, ``"L40"`` not an L40S); the variant by the name's form factor
    (``PCIe``, ``SXM``, ``NVL``) and memory; the host link by the CPU: NVLink
    profiles only for SXM2 boards on IBM POWER (``ppc64le``). A MIG instance's name (``"... MIG
    1g.10gb"``) gets its GPU's profile (pass ``memory_bytes=None``: the
    instance has less). None when no profile is within 15% of `memory_bytes`
    or the chip has none (e.g. ``"Tesla V100S-PCIE-32GB"``, ``"NVIDIA A10G"``).

    Args:
        name: NVML's device name.
        memory_bytes: its memory (NVML's total), to tell 16/32/40/80 GB variants apart.
        machine: ``platform.machine()`` of the host (default: this one's).
    """
    text = re.sub(r"\s+", " ", name.upper()).strip()
    text = re.sub(r"^(NVIDIA )?(TESLA )?", "", text)
    text = re.sub(r" MIG .*$", "", text)
    match = _CHIP.match(text)
    if match is None:
        return None
    chip = match.group(1)
    power = (machine if machine is not None else platform.machine()).lower().startswith("ppc64")
    nvl = re.search(r"\bNVL\b", text) is not None
    pcie = "PCIE" in text
    sxm = "SXM" in text or "DGXS" in text
    families: dict[str, tuple[str, ...]] = {
        "GH200": ("GH200-96GB", "GH200-144GB"),
        "H200": ("H200-NVL-141GB",) if nvl else ("H200-141GB",),
        "H100": ("H100-NVL-94GB",) if nvl else ("H100-PCIe-80GB",) if pcie else ("H100-80GB",),
        "A100": ("A100-40GB", "A100-SXM4-80GB") if sxm else ("A100-40GB", "A100-80GB"),
        "A10": ("A10-24GB",), "L40S": ("L40S-48GB",), "L4": ("L4-24GB",), "T4": ("T4-16GB",),
        # the CPU-GPU NVLink of POWER servers needs the SXM2 board; a PCIe card talks PCIe everywhere
        "V100": ((("V100-16GB", "V100-32GB") if power else ("V100-SXM2-16GB", "V100-SXM2-32GB")) if sxm
                 else ("V100-PCIe-16GB", "V100-PCIe-32GB")),
        "P100": (("P100-16GB",) if power else ("P100-SXM2-16GB",)) if sxm else ("P100-PCIe-16GB",),
    }
    chosen = _nearest(families[chip], memory_bytes)
    nominal = DEVICES[chosen].memory_bytes
    if memory_bytes is not None and abs(nominal - memory_bytes) > _MEMORY_TOLERANCE * nominal:
        return None
    return chosen


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
