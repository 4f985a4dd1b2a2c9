"""lms.machine.nvml against a fake `pynvml` (the third-party NVML binding), no GPU needed."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import types
from dataclasses import dataclass, field

import pytest

from lms.machine import nvml
from lms.machine.nvml import NvmlError, NvmlSampler, gpu_inventory, nvml_available, resolve_visible_device

NOT_AVAILABLE = 2**64 - 1
MIB = 2**20


class FakeNVMLError(Exception):
    """Stands in for pynvml.NVMLError."""


class NVMLError_FunctionNotFound(FakeNVMLError):  # noqa: N801 - pynvml's naming
    pass


@dataclass
class FakeProc:  # what nvmlStructToFriendlyObject returns: attributes pid, usedGpuMemory, ...
    pid: int
    usedGpuMemory: int | None  # noqa: N815
    gpuInstanceId: int = NOT_AVAILABLE  # noqa: N815
    computeInstanceId: int = NOT_AVAILABLE  # noqa: N815


@dataclass
class FakeMemory:
    total: int
    free: int
    used: int


@dataclass
class FakeDevice:
    uuid: str
    name: str
    total: int
    used: int = 0
    procs: list = field(default_factory=list)


class FakePynvml(types.ModuleType):
    """A scripted NVML: tests set `device.used` / `device.procs`; calls read them."""

    NVMLError = FakeNVMLError
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound

    def __init__(self, devices: list[FakeDevice], *, driver: str | bytes = "550.54.15",
                 v3: bool = True, init_error: Exception | None = None) -> None:
        super().__init__("pynvml")
        self.devices = devices
        self.driver = driver
        self.v3 = v3
        self.init_error = init_error
        self.inits = 0
        self.shutdowns = 0
        self.fail_memory: Exception | None = None  # raised by nvmlDeviceGetMemoryInfo
        self.memory_calls = 0
        self.lock = threading.Lock()

    def nvmlInit(self) -> None:  # noqa: N802
        if self.init_error is not None:
            raise self.init_error
        self.inits += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:  # noqa: N802
        return self.devices[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes) -> FakeDevice:  # noqa: N802
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for device in self.devices:
            if device.uuid == uuid:
                return device
        raise FakeNVMLError("Not Found")

    def nvmlDeviceGetUUID(self, handle: FakeDevice) -> str:  # noqa: N802
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeDevice) -> bytes:  # noqa: N802
        return handle.name.encode()  # old bindings return bytes

    def nvmlSystemGetDriverVersion(self) -> str | bytes:  # noqa: N802
        return self.driver

    def nvmlDeviceGetMemoryInfo(self, handle: FakeDevice) -> FakeMemory:  # noqa: N802
        with self.lock:
            self.memory_calls += 1
            if self.fail_memory is not None:
                raise self.fail_memory
            return FakeMemory(total=handle.total, free=handle.total - handle.used,
                              used=handle.used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeDevice) -> list:  # noqa: N802
        if not self.v3:  # a driver older than the binding: no _v3 symbol
            raise NVMLError_FunctionNotFound("Function Not Found")
        return list(handle.procs)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: FakeDevice) -> list:  # noqa: N802
        return list(handle.procs)


def h200(uuid: str = "GPU-aaaa1111-0000", used: int = 0) -> FakeDevice:
    return FakeDevice(uuid=uuid, name="NVIDIA H200", total=141 * 2**30, used=used)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakePynvml:
    module = FakePynvml([h200(), FakeDevice("GPU-bbbb2222-0000", "NVIDIA A100-SXM4-80GB", 80 * 2**30)])
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return module


def wait_for_samples(sampler: NvmlSampler, n: int, timeout_s: float = 5.0) -> None:
    """Block until the sampler's thread has taken `n` more samples."""
    target = sampler.result.n_samples + n
    deadline = time.monotonic() + timeout_s
    while sampler.result.n_samples < target:
        assert time.monotonic() < deadline, "sampler thread took no samples"
        time.sleep(0.002)


def set_state(device: FakeDevice, *, mine: int | None, others: int, pid: int) -> None:
    procs = [FakeProc(pid=pid + 1000, usedGpuMemory=others)]
    if mine is not None:
        procs.append(FakeProc(pid=pid, usedGpuMemory=mine))
    device.procs = procs
    device.used = (mine or 0) + others + 500 * MIB  # + memory no process owns


# --- sampling -----------------------------------------------------------------------------

def test_peak_tracked_across_thread_samples(fake: FakePynvml) -> None:
    device, pid = fake.devices[0], os.getpid()
    set_state(device, mine=100 * MIB, others=1000 * MIB, pid=pid)
    with NvmlSampler(interval_s=0.001) as sampler:
        set_state(device, mine=3000 * MIB, others=1000 * MIB, pid=pid)  # the peak
        wait_for_samples(sampler, 2)
        set_state(device, mine=800 * MIB, others=4000 * MIB, pid=pid)   # device peak
        wait_for_samples(sampler, 2)
        set_state(device, mine=200 * MIB, others=100 * MIB, pid=pid)
    reading = sampler.result
    assert reading.process_peak_bytes == 3000 * MIB              # this PID only
    assert reading.device_peak_bytes == 800 * MIB + 4000 * MIB + 500 * MIB  # whole device
    assert reading.device_start_bytes == 100 * MIB + 1000 * MIB + 500 * MIB
    assert reading.n_samples >= 6  # enter + >= 4 thread + exit
    assert reading.errors == () and reading.n_errors == 0
    assert (reading.device_index, reading.device_name) == (0, "NVIDIA H200")
    assert reading.device_uuid == "GPU-aaaa1111-0000"
    assert reading.driver_version == "550.54.15"
    assert reading.total_bytes == 141 * 2**30
    assert reading.pid == pid
    assert fake.inits == fake.shutdowns == 1


def test_short_block_still_sampled_on_enter_and_exit(fake: FakePynvml) -> None:
    device, pid = fake.devices[0], os.getpid()
    set_state(device, mine=10 * MIB, others=0, pid=pid)
    with NvmlSampler(interval_s=60.0) as sampler:  # the thread never wakes
        set_state(device, mine=70 * MIB, others=0, pid=pid)
    assert sampler.result.n_samples == 2
    assert sampler.result.process_peak_bytes == 70 * MIB


def test_process_figure_none_when_pid_missing_or_unattributed(
        fake: FakePynvml, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="lms.machine.nvml")
    device, pid = fake.devices[0], os.getpid()
    # Our PID listed without a figure (None: friendly object; sentinel: raw struct),
    # as NVML does under WDDM; another process holds memory.
    device.procs = [FakeProc(pid=pid, usedGpuMemory=None),
                    FakeProc(pid=pid, usedGpuMemory=NOT_AVAILABLE),
                    FakeProc(pid=pid + 1, usedGpuMemory=5 * MIB)]
    device.used = 900 * MIB
    with NvmlSampler(interval_s=0.001) as sampler:
        wait_for_samples(sampler, 1)
    assert sampler.result.process_peak_bytes is None
    assert sampler.result.device_peak_bytes == 900 * MIB
    assert any(f"no GPU memory to PID {pid}" in r.getMessage() for r in caplog.records)
    # Not listed at all (e.g. a container's PID namespace).
    device.procs = [FakeProc(pid=pid + 1, usedGpuMemory=5 * MIB)]
    with NvmlSampler(interval_s=60.0) as sampler:
        pass
    assert sampler.result.process_peak_bytes is None


def test_mig_entries_of_one_pid_are_summed(fake: FakePynvml) -> None:
    device, pid = fake.devices[0], os.getpid()
    device.procs = [FakeProc(pid=pid, usedGpuMemory=30 * MIB, gpuInstanceId=1),
                    FakeProc(pid=pid, usedGpuMemory=12 * MIB, gpuInstanceId=2)]
    with NvmlSampler(interval_s=60.0, pid=pid) as sampler:
        pass
    assert sampler.result.process_peak_bytes == 42 * MIB


def test_v2_fallback_when_driver_lacks_v3(fake: FakePynvml) -> None:
    fake.v3 = False
    device, pid = fake.devices[0], os.getpid()
    set_state(device, mine=64 * MIB, others=0, pid=pid)
    with NvmlSampler(interval_s=60.0) as sampler:
        pass
    assert sampler.result.process_peak_bytes == 64 * MIB
    assert sampler.result.n_errors == 0


def test_explicit_pid(fake: FakePynvml) -> None:
    device = fake.devices[0]
    device.procs = [FakeProc(pid=4242, usedGpuMemory=7 * MIB), FakeProc(pid=1, usedGpuMemory=99)]
    with NvmlSampler(interval_s=60.0, pid=4242) as sampler:
        pass
    assert sampler.result.process_peak_bytes == 7 * MIB and sampler.result.pid == 4242


def test_nvml_error_during_sampling_is_recorded_and_sampling_goes_on(
        fake: FakePynvml, caplog: pytest.LogCaptureFixture) -> None:
    device, pid = fake.devices[0], os.getpid()
    set_state(device, mine=100 * MIB, others=0, pid=pid)
    caplog.set_level(logging.WARNING, logger="lms.machine.nvml")
    with NvmlSampler(interval_s=0.001) as sampler:
        fake.fail_memory = FakeNVMLError("GPU is lost")
        calls = fake.memory_calls
        wait_for_samples(sampler, 3)                      # samples fail ...
        assert fake.memory_calls >= calls + 3
        fake.fail_memory = None
        set_state(device, mine=100 * MIB, others=4000 * MIB, pid=pid)
        wait_for_samples(sampler, 2)                      # ... and the thread is alive after
        assert sampler._thread is not None and sampler._thread.is_alive()
    reading = sampler.result
    assert reading.n_errors >= 3
    assert reading.errors == ("nvmlDeviceGetMemoryInfo: FakeNVMLError: GPU is lost",)  # deduped
    assert reading.device_peak_bytes == 4100 * MIB + 500 * MIB  # sampled after the errors
    assert reading.process_peak_bytes == 100 * MIB  # the process query kept working
    warnings = [r for r in caplog.records if "NVML sampling error" in r.getMessage()]
    assert len(warnings) == 1  # logged once, not per sample
    assert "GPU is lost" in warnings[0].getMessage()


def test_result_during_block_and_errors_outside(fake: FakePynvml) -> None:
    sampler = NvmlSampler(interval_s=60.0)
    with pytest.raises(RuntimeError, match="not been entered"):
        sampler.result
    with pytest.raises(RuntimeError, match="outside its `with` block"):
        sampler.sample()
    fake.devices[0].used = 3 * MIB
    with sampler:
        assert sampler.result.device_peak_bytes == 3 * MIB  # live snapshot
        sampler.sample()
        assert sampler.result.n_samples == 2
    assert sampler.result.to_dict()["device_peak_bytes"] == 3 * MIB
    with pytest.raises(ValueError, match="interval_s"):
        NvmlSampler(interval_s=0)


# --- which device ------------------------------------------------------------------------

@pytest.mark.parametrize("visible, expected", [
    (None, 0),                          # unset: device 0
    ("1", 1),
    ("1,0", 1),                         # the first visible one
    ("GPU-bbbb2222-0000,0", 1),         # full UUID
    ("GPU-bbbb", 1),                    # unique prefix, as CUDA accepts
    ("GPU-aaaa1111-0000", 0),
])
def test_visible_device_mapping(fake: FakePynvml, visible: str | None, expected: int) -> None:
    index, handle = resolve_visible_device(fake, visible=visible)
    assert index == expected and handle is fake.devices[expected]


@pytest.mark.parametrize("visible, position, expected", [
    (None, 1, 1),
    ("1,0", 1, 0),                      # TF's GPU:1 is the second visible device
    ("GPU-bbbb,GPU-aaaa", 1, 0),
])
def test_visible_device_position(fake: FakePynvml, visible: str | None, position: int,
                                 expected: int) -> None:
    assert resolve_visible_device(fake, visible=visible, position=position)[0] == expected
    with NvmlSampler(visible_devices=visible, position=position, interval_s=60.0) as sampler:
        pass
    assert sampler.result.device_index == expected


def test_sampler_follows_cuda_visible_devices(fake: FakePynvml,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb2222-0000")
    fake.devices[1].used = 11 * MIB
    fake.devices[0].used = 99 * MIB
    with NvmlSampler(interval_s=60.0) as sampler:
        pass
    assert sampler.result.device_name == "NVIDIA A100-SXM4-80GB"
    assert sampler.result.device_peak_bytes == 11 * MIB


def test_mig_uuid_resolved_by_nvml(fake: FakePynvml) -> None:
    # A MIG instance is not among the devices enumerated by index; NVML finds it by UUID.
    mig = FakeDevice("MIG-cccc3333", "NVIDIA H200 MIG 1g.18gb", 18 * 2**30)
    fake.nvmlDeviceGetHandleByUUID = lambda uuid: {b"MIG-cccc3333": mig}[uuid]
    assert resolve_visible_device(fake, visible="MIG-cccc3333") == (-1, mig)
    with pytest.raises(NvmlError, match="no MIG device"):
        resolve_visible_device(fake, visible="MIG-dddd")


@pytest.mark.parametrize("visible, message", [
    ("", "makes no GPU visible"),
    ("-1", "makes no GPU visible"),
    ("7", "device 7 does not exist"),
    ("-1,0", "makes no GPU visible"),   # CUDA stops at the first invalid entry
    ("GPU-ffff", "matches no GPU"),
    ("GPU-", "matches 2 GPUs"),
])
def test_bad_visible_devices(fake: FakePynvml, visible: str, message: str) -> None:
    with pytest.raises(NvmlError, match=message):
        resolve_visible_device(fake, visible=visible)
    with pytest.raises(NvmlError, match=message):
        with NvmlSampler(visible_devices=visible):
            pass
    assert fake.inits == fake.shutdowns  # NVML released on the error path


def test_position_beyond_visible(fake: FakePynvml) -> None:
    with pytest.raises(NvmlError, match="makes 1 GPU\\(s\\) visible, not GPU:1"):
        resolve_visible_device(fake, visible="0,-1,1", position=1)


def test_index_order_warning_for_mixed_gpus(fake: FakePynvml, monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("CUDA_DEVICE_ORDER")
    caplog.set_level(logging.WARNING, logger="lms.machine.nvml")
    resolve_visible_device(fake, visible="1")
    assert any("CUDA_DEVICE_ORDER" in r.getMessage() for r in caplog.records)
    caplog.clear()
    resolve_visible_device(fake, visible="GPU-bbbb")  # a UUID is unambiguous
    assert not caplog.records


# --- inventory and availability ----------------------------------------------------------

def test_gpu_inventory(fake: FakePynvml) -> None:
    fake.driver = b"535.104.05"
    # this fake binding has no PCI, compute-capability or MIG calls (an old one): those figures are None
    unknown = {"compute_capability": None, "pci_bus_id": None, "mig": None}
    assert gpu_inventory() == [
        {"index": 0, "uuid": "GPU-aaaa1111-0000", "name": "NVIDIA H200", "total_bytes": 141 * 2**30,
         "free_bytes": 141 * 2**30, "driver_version": "535.104.05", **unknown},
        {"index": 1, "uuid": "GPU-bbbb2222-0000", "name": "NVIDIA A100-SXM4-80GB", "total_bytes": 80 * 2**30,
         "free_bytes": 80 * 2**30, "driver_version": "535.104.05", **unknown},
    ]
    assert nvml_available() is True
    assert fake.inits == fake.shutdowns == 2


def test_no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    module = FakePynvml([h200()], init_error=FakeNVMLError("NVML Shared Library Not Found"))
    monkeypatch.setitem(sys.modules, "pynvml", module)
    assert nvml_available() is False
    assert gpu_inventory() == []
    with pytest.raises(NvmlError, match="NVML did not start .*Library Not Found.*NVIDIA driver"):
        NvmlSampler().__enter__()


def test_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakePynvml([]))
    assert nvml_available() is False
    assert gpu_inventory() == []


def test_missing_library_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    with pytest.raises(ImportError, match=r"install nvidia-ml-py \(pip install 'tflms-tuner\[gpu\]'\)"):
        with NvmlSampler():
            pass
    assert nvml_available() is False
    assert gpu_inventory() == []


def test_imports_without_tensorflow_or_pynvml() -> None:
    code = ("import sys; sys.modules['tensorflow'] = None; sys.modules['pynvml'] = None; "
            "import lms.machine.nvml, lms.machine.hostmem; print(lms.machine.nvml.nvml_available())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "False"


def test_module_has_no_tf_import() -> None:
    assert "tensorflow" not in nvml.__dict__


def test_fake_matches_the_real_binding() -> None:
    """Every NVML call the fake stands in for exists in nvidia-ml-py, with that name."""
    real = pytest.importorskip("pynvml")  # nvidia-ml-py is in the test extras
    assert not isinstance(real, FakePynvml)
    names = [n for n in vars(FakePynvml) if n.startswith("nvml")]
    assert len(names) == 11
    missing = [n for n in names if not callable(getattr(real, n, None))]
    assert missing == []
    assert issubclass(real.NVMLError_FunctionNotFound, real.NVMLError)
