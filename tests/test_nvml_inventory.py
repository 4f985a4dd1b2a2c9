"""`lms.machine.nvml.gpu_inventory` with a fake nvidia-ml-py that has PCI, compute-capability and MIG calls."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import pytest

from lms.machine.nvml import gpu_inventory
from tests.test_nvml import FakeDevice, FakeNVMLError, FakePynvml

GiB = 1 << 30


class NVMLError_NotSupported(FakeNVMLError):  # noqa: N801 - pynvml's naming
    pass


class NVMLError_NotFound(FakeNVMLError):  # noqa: N801
    pass


@dataclass
class Pci:
    busId: bytes  # noqa: N815 - nvmlPciInfo_t's field


@dataclass
class MigCapable(FakeDevice):
    bus: str = "00000000:00:00.0"
    cc: tuple[int, int] = (8, 0)
    mig_mode: int | None = None  # None: the GPU does not support MIG
    slots: list = field(default_factory=list)  # MIG device handles by slot (None: empty slot)


class FakeMigPynvml(FakePynvml):
    """nvidia-ml-py's MIG calls as documented: nvmlDeviceGetMigMode -> [current, pending], ..."""

    NVML_DEVICE_MIG_ENABLE = 1

    def nvmlDeviceGetPciInfo(self, handle: MigCapable) -> Pci:  # noqa: N802
        return Pci(handle.bus.encode())

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeDevice) -> tuple[int, int]:  # noqa: N802
        if not isinstance(handle, MigCapable):
            raise NVMLError_NotSupported("Not Supported")  # e.g. asked of a MIG device handle
        return handle.cc

    def nvmlDeviceGetMigMode(self, handle: MigCapable) -> list[int]:  # noqa: N802
        if handle.mig_mode is None:
            raise NVMLError_NotSupported("Not Supported")
        return [handle.mig_mode, handle.mig_mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: MigCapable) -> int:  # noqa: N802
        return len(handle.slots)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: MigCapable, index: int) -> FakeDevice:  # noqa: N802
        if handle.slots[index] is None:
            raise NVMLError_NotFound("Not Found")
        return handle.slots[index]


def test_mig_instances_are_listed_with_their_own_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    slices = [FakeDevice("MIG-aaaa-0001", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 19968 << 20, used=1 << 30),
              None,  # an empty slot
              FakeDevice("MIG-aaaa-0002", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 4864 << 20)]
    a100 = MigCapable("GPU-aaaa", "NVIDIA A100-SXM4-40GB", 40 * GiB, bus="00000000:3b:00.0", mig_mode=1,
                      slots=slices)
    l4 = MigCapable("GPU-bbbb", "NVIDIA L4", 22 * GiB, bus="00000000:1a:00.0", cc=(8, 9))  # no MIG support
    h100 = MigCapable("GPU-cccc", "NVIDIA H100 80GB HBM3", 80 * GiB, bus="00000000:5e:00.0", cc=(9, 0),
                      mig_mode=0, slots=[None] * 7)  # MIG-capable, MIG off
    monkeypatch.setitem(sys.modules, "pynvml", FakeMigPynvml([a100, l4, h100]))
    found = gpu_inventory()
    assert [(g["uuid"], g["mig"]) for g in found] == [
        ("GPU-aaaa", "enabled"), ("MIG-aaaa-0001", "instance"), ("MIG-aaaa-0002", "instance"),
        ("GPU-bbbb", None), ("GPU-cccc", None)]
    first = found[1]
    assert first["total_bytes"] == 19968 << 20 and first["free_bytes"] == (19968 << 20) - GiB  # the instance's
    assert (first["index"], first["mig_index"], first["parent_uuid"]) == (0, 0, "GPU-aaaa")
    assert found[2]["mig_index"] == 2  # slot numbers kept across the empty one
    assert first["compute_capability"] == "8.0"  # the parent's, when NVML does not answer for the instance
    assert first["pci_bus_id"] == found[0]["pci_bus_id"] == "00000000:3B:00.0"  # upper case, as CUDA sorts
    assert [g["compute_capability"] for g in found[3:]] == ["8.9", "9.0"]


def test_an_instance_is_the_default_budgets_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """A MIG instance chosen by UUID sizes the budget with its own memory, not its GPU's."""
    from tuner.backends import get_backend
    from tuner.backends.gpu import tf_reachable_bytes

    slice_ = FakeDevice("MIG-aaaa-0001", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 19968 << 20)
    a100 = MigCapable("GPU-aaaa", "NVIDIA A100-SXM4-40GB", 40 * GiB, mig_mode=1, slots=[slice_])
    monkeypatch.setitem(sys.modules, "pynvml", FakeMigPynvml([a100]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    choice = get_backend("gpu").choose_gpus(gpu="MIG-aaaa", gpus=(), workers=1, inventory=gpu_inventory)
    assert choice.gpus == ("MIG-aaaa-0001",) and choice.info["total_bytes"] == 19968 << 20
    budget, _ = get_backend("gpu").default_budget(device="A100-40GB", gpu_info=choice.info)
    assert budget == tf_reachable_bytes(choice.info)[0] < 19968 << 20
    assert get_backend("gpu").default_device(choice.info) == "A100-40GB"  # its GPU's profile
