"""Which device profile a GPU gets (`lms.machine.devices.profile_for_gpu`) from the names ``nvidia-smi`` prints."""

from __future__ import annotations

import pytest

from lms.machine.devices import DEVICES, GiB, get_device, profile_for_gpu

MiB = 1 << 20

# (name as nvidia-smi -L / NVML print it, NVML's total memory in MiB, profile on x86, profile on POWER)
REAL_NAMES = [
    ("Tesla P100-PCIE-16GB", 16280, "P100-PCIe-16GB", "P100-PCIe-16GB"),  # NVLink needs the SXM2 board
    ("Tesla P100-SXM2-16GB", 16280, "P100-SXM2-16GB", "P100-16GB"),
    ("Tesla P100-PCIE-12GB", 12198, None, None),  # no 12 GB profile: its 549 GB/s is not the 16 GB card's
    ("Tesla V100-SXM2-16GB", 16160, "V100-SXM2-16GB", "V100-16GB"),
    ("Tesla V100-SXM2-32GB", 32510, "V100-SXM2-32GB", "V100-32GB"),
    ("Tesla V100-PCIE-16GB", 16160, "V100-PCIe-16GB", "V100-PCIe-16GB"),
    ("Tesla V100-PCIE-32GB", 32510, "V100-PCIe-32GB", "V100-PCIe-32GB"),
    ("Tesla V100-DGXS-32GB", 32510, "V100-SXM2-32GB", "V100-32GB"),
    ("Tesla V100S-PCIE-32GB", 32510, None, None),  # V100S is another chip (16.4 TFLOPS, 1,134 GB/s)
    ("Tesla T4", 15360, "T4-16GB", "T4-16GB"),
    ("NVIDIA A10", 23028, "A10-24GB", "A10-24GB"),
    ("NVIDIA A10G", 23028, None, None),  # AWS's part, not the A10
    ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB", "A100-40GB"),
    ("NVIDIA A100-PCIE-40GB", 40960, "A100-40GB", "A100-40GB"),
    ("NVIDIA A100-SXM4-80GB", 81920, "A100-SXM4-80GB", "A100-SXM4-80GB"),
    ("NVIDIA A100 80GB PCIe", 81920, "A100-80GB", "A100-80GB"),
    ("NVIDIA L4", 23034, "L4-24GB", "L4-24GB"),
    ("NVIDIA L40S", 46068, "L40S-48GB", "L40S-48GB"),
    ("NVIDIA L40", 46068, None, None),
    ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB", "H100-80GB"),
    ("NVIDIA H100 PCIe", 81559, "H100-PCIe-80GB", "H100-PCIe-80GB"),
    ("NVIDIA H100 NVL", 95830, "H100-NVL-94GB", "H100-NVL-94GB"),
    ("NVIDIA H200", 143771, "H200-141GB", "H200-141GB"),
    ("NVIDIA H200 NVL", 143771, "H200-NVL-141GB", "H200-NVL-141GB"),
    ("NVIDIA GH200 480GB", 97871, "GH200-96GB", "GH200-96GB"),
    ("NVIDIA GH200 144G HBM3e", 146944, "GH200-144GB", "GH200-144GB"),
    ("NVIDIA GeForce RTX 4090", 24564, None, None),
]


@pytest.mark.parametrize("name, mib, x86, power", REAL_NAMES)
def test_real_names_get_their_own_profile(name: str, mib: int, x86: str | None, power: str | None) -> None:
    assert profile_for_gpu(name, memory_bytes=mib * MiB, machine="x86_64") == x86
    assert profile_for_gpu(name, memory_bytes=mib * MiB, machine="ppc64le") == power


def test_nvlink_to_the_cpu_only_on_power_and_grace() -> None:
    nvlink = {name for name, d in DEVICES.items() if d.link.startswith("NVLink")}
    assert nvlink == {"P100-16GB", "V100-16GB", "V100-32GB", "GH200-96GB", "GH200-144GB"}
    for name, mib, x86, _ in REAL_NAMES:
        if x86 is not None:
            assert not DEVICES[x86].link.startswith("NVLink") or x86.startswith("GH200"), name
    # an x86 V100 moves swaps at PCIe 3.0's rate, not NVLink 2.0's (4.8x less)
    assert DEVICES["V100-16GB"].link_bandwidth / DEVICES["V100-SXM2-16GB"].link_bandwidth == pytest.approx(75 / 15.75)


def test_mig_instances_get_their_gpus_profile() -> None:
    assert profile_for_gpu("NVIDIA A100-SXM4-40GB MIG 1g.5gb", memory_bytes=None, machine="x86_64") == "A100-40GB"
    assert profile_for_gpu("NVIDIA H100 80GB HBM3 MIG 3g.40gb", memory_bytes=None, machine="x86_64") == "H100-80GB"


def test_tf32_is_the_rate_of_matmuls_and_convolutions_from_ampere_on() -> None:
    pre_ampere = ("P100-16GB", "P100-PCIe-16GB", "V100-16GB", "V100-PCIe-16GB", "T4-16GB")
    for name in pre_ampere:
        assert DEVICES[name].tf32_flops == 0 and DEVICES[name].matmul_flops == DEVICES[name].peak_flops
    # datasheet TF32 figures without sparsity, against fp32
    expected = {"A10-24GB": (62.5, 31.2), "A100-40GB": (156, 19.5), "L4-24GB": (60, 30.3), "L40S-48GB": (183, 91.6),
                "H100-80GB": (494.5, 67), "H100-PCIe-80GB": (378, 51), "H200-141GB": (494.5, 67)}
    for name, (tf32, fp32) in expected.items():
        d = DEVICES[name]
        assert (d.matmul_flops, d.peak_flops) == (tf32 * 1e12, fp32 * 1e12), name


def test_the_simulator_times_matmuls_at_the_tf32_rate() -> None:
    """A compute-bound op takes fp32/TF32 times longer on a profile without TF32 than with it."""
    from lms.graph import GraphBuilder
    from lms.simulator import simulate

    n = 4096
    b = GraphBuilder(batch_size=1, name="matmul")
    for name in ("a", "b"):
        b.op(name, "Placeholder", shape=(n, n), fixed_bytes=n * n * 4)
    b.op("mm", "MatMul", "a:0", "b:0", shape=(n, n), fixed_bytes=n * n * 4)
    g = b.build()
    a100 = get_device("A100-40GB").replace(op_overhead_s=0.0, memory_efficiency=1.0)
    fp32_only = a100.replace(tf32_flops=0.0)
    t_tf32 = simulate(g, None, batch=1, device=a100).step_time_s
    t_fp32 = simulate(g, None, batch=1, device=fp32_only).step_time_s
    flops = 2 * n ** 3
    assert t_fp32 == pytest.approx(flops / (19.5e12 * a100.compute_efficiency), rel=1e-6)
    assert t_tf32 == pytest.approx(max(flops / (156e12 * a100.compute_efficiency), 3 * n * n * 4 / 1555e9), rel=1e-6)


def test_every_profile_cites_a_datasheet_and_is_valid() -> None:
    for name, d in DEVICES.items():
        if name == "cpu":
            continue
        assert "datasheet" in d.source, name
        assert d.memory_bytes >= 16 * GiB and d.link_bandwidth < d.link_peak_bandwidth
