"""Which GPU a worker runs on and its environment (`tuner.worker.gpus`), as pure functions of fake NVML listings."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tuner.backends import get_backend
from tuner.errors import BadInput
from tuner.worker.gpus import (NO_GPU_REASON, GpuChoiceError, choose_gpu, explain_no_gpu, gpu_setup_lines,
                               gpu_worker_env, host_memory_limit_bytes, visible_gpus)

GiB = 1 << 30


def gpu(index: int, bus: str, name: str = "NVIDIA A100-SXM4-80GB", *, total: int = 80 * GiB,
        mig: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"index": index, "uuid": f"GPU-{index}{index}{index}{index}-{bus}", "name": name, "total_bytes": total,
            "free_bytes": total, "driver_version": "550.54.15", "pci_bus_id": bus, "compute_capability": "8.0",
            "mig": mig, **extra}


def four_a100() -> list[dict[str, Any]]:
    # NVML's index order is not guaranteed to be PCI order: here GPUs 0 and 1 sit on buses 0x3B and 0x1A
    return [gpu(0, "00000000:3B:00.0"), gpu(1, "00000000:1A:00.0"), gpu(2, "00000000:5E:00.0"),
            gpu(3, "00000000:86:00.0")]


def uuid_of(found: list[dict[str, Any]], index: int) -> str:
    return next(g["uuid"] for g in found if g["index"] == index)


# ------------------------------------------------------------------ which device

def test_indices_count_gpus_in_pci_bus_order_as_cuda_does() -> None:
    found = four_a100()
    order = [g["index"] for g in visible_gpus({}, found)]
    assert order == [1, 0, 2, 3]  # by PCI bus id: CUDA's PCI_BUS_ID order (and fastest-first on one model)
    assert choose_gpu("0", env={}, inventory=found)[0]["index"] == 1
    assert choose_gpu(None, env={}, inventory=found) == (found[1], "")


def test_a_users_cuda_visible_devices_is_respected_not_overwritten() -> None:
    """`CUDA_VISIBLE_DEVICES=3 python -m tuner search` must measure on that GPU, not on GPU 0."""
    found = four_a100()
    env = {"CUDA_VISIBLE_DEVICES": "3"}
    chosen, _ = choose_gpu(None, env=env, inventory=found)
    assert chosen["uuid"] == uuid_of(found, 3)  # bus 0x86: CUDA's device 3
    worker, notes = gpu_worker_env(env, visible=chosen["uuid"])
    assert worker["CUDA_VISIBLE_DEVICES"] == uuid_of(found, 3) and worker["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert notes == []
    # --gpu counts the visible ones, as TensorFlow's GPU:0, GPU:1 do
    env = {"CUDA_VISIBLE_DEVICES": "2,0"}
    assert choose_gpu("0", env=env, inventory=found)[0]["uuid"] == uuid_of(found, 2)
    assert choose_gpu("1", env=env, inventory=found)[0]["uuid"] == uuid_of(found, 1)  # CUDA's 0 = bus 0x1A
    with pytest.raises(GpuChoiceError, match=r"--gpu 2: CUDA_VISIBLE_DEVICES='2,0' makes 2 GPU\(s\) visible"):
        choose_gpu("2", env=env, inventory=found)


@pytest.mark.parametrize("visible, expected", [
    ("", []), ("-1", []), ("0,-1,2", [1]), ("0,9,2", [1]), ("GPU-3333", [3]), ("GPU-2222-00000000:5E:00.0,1", [2, 0]),
])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(visible: str, expected: list[int]) -> None:
    found = four_a100()
    assert [g["index"] for g in visible_gpus({"CUDA_VISIBLE_DEVICES": visible}, found)] == expected


def test_a_uuid_chooses_one_visible_device() -> None:
    found = four_a100()
    assert choose_gpu("GPU-2222", env={}, inventory=found)[0]["index"] == 2
    with pytest.raises(GpuChoiceError, match="is not among the devices CUDA_VISIBLE_DEVICES='0' makes visible"):
        choose_gpu("GPU-2222", env={"CUDA_VISIBLE_DEVICES": "0"}, inventory=found)
    with pytest.raises(GpuChoiceError, match="matches 4 devices"):
        choose_gpu("GPU-", env={}, inventory=found)
    with pytest.raises(GpuChoiceError, match="matches no device NVML lists"):
        choose_gpu("GPU-9", env={}, inventory=found)


def test_mixed_models_need_pci_bus_order_or_a_uuid() -> None:
    found = [gpu(0, "00000000:1A:00.0", "NVIDIA A100-SXM4-80GB"),
             gpu(1, "00000000:3B:00.0", "NVIDIA L4", total=24 * GiB)]
    with pytest.raises(GpuChoiceError, match="CUDA numbers them fastest first.*CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        choose_gpu("1", env={}, inventory=found)
    with pytest.raises(GpuChoiceError, match="CUDA_VISIBLE_DEVICES='1'.*give a UUID"):
        choose_gpu(None, env={"CUDA_VISIBLE_DEVICES": "1"}, inventory=found)
    chosen, note = choose_gpu(None, env={}, inventory=found)  # the default still works, and says what it did
    assert chosen["index"] == 0 and "first by PCI bus id" in note
    assert choose_gpu("1", env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, inventory=found)[0]["name"] == "NVIDIA L4"
    assert choose_gpu(found[1]["uuid"], env={}, inventory=found)[0]["name"] == "NVIDIA L4"


def test_mig_instances_are_chosen_by_uuid_and_their_gpu_is_refused() -> None:
    parent = gpu(0, "00000000:1A:00.0", "NVIDIA A100-SXM4-40GB", total=40 * GiB, mig="enabled")
    slices = [dict(gpu(0, "00000000:1A:00.0", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", total=20 * GiB,
                       mig="instance", mig_index=i, parent_uuid=parent["uuid"]), uuid=f"MIG-{i}aaa-bbbb")
              for i in range(2)]
    found = [parent, *slices]
    with pytest.raises(GpuChoiceError, match="is in MIG mode.*--gpu MIG-.*MIG-0aaa-bbbb, MIG-1aaa-bbbb"):
        choose_gpu(None, env={}, inventory=found)
    assert choose_gpu("MIG-1aaa", env={}, inventory=found)[0] is slices[1]
    assert choose_gpu(None, env={"CUDA_VISIBLE_DEVICES": "MIG-0aaa-bbbb"}, inventory=found)[0] is slices[0]


# ------------------------------------------------------------------ the backend's choice and budget

@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TF_XLA_FLAGS", "TF_GPU_ALLOCATOR"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_gpu_backend_gives_each_worker_a_uuid(clean_env: pytest.MonkeyPatch) -> None:
    found = four_a100()
    backend = get_backend("gpu")
    choice = backend.choose_gpus(gpu=None, gpus=(), workers=2, inventory=lambda: found)
    assert choice.gpus == (uuid_of(found, 1), uuid_of(found, 0)) and choice.workers == 2
    assert backend.slots(SimpleNamespace(gpus=choice.gpus, gpu=None, workers=2)) == list(choice.gpus)
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert backend.choose_gpus(gpu=None, gpus=(), workers=1, inventory=lambda: found).gpus == (uuid_of(found, 3),)
    clean_env.delenv("CUDA_VISIBLE_DEVICES")
    with pytest.raises(BadInput, match="names one device twice"):
        backend.choose_gpus(gpu=None, gpus=("0", "GPU-1111"), workers=1, inventory=lambda: four_a100())


def test_gpu_backend_says_which_variables_it_keeps_from_workers(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TF_XLA_FLAGS", "--tf_xla_auto_jit=2")
    clean_env.setenv("TF_GPU_ALLOCATOR", "cuda_malloc_async")
    notes = get_backend("gpu").choose_gpus(gpu=None, gpus=(), workers=1, inventory=four_a100).notes
    assert any(n.startswith("TF_XLA_FLAGS='--tf_xla_auto_jit=2' is not passed to the trial workers") for n in notes)
    assert any(n.startswith("TF_GPU_ALLOCATOR='cuda_malloc_async' is not passed") for n in notes)


def test_worker_env_strips_what_changes_the_measurement() -> None:
    user = {"TF_XLA_FLAGS": "--tf_xla_auto_jit=2", "TF_GPU_ALLOCATOR": "cuda_malloc_async",
            "TF_FORCE_GPU_ALLOW_GROWTH": "true", "TF_GPU_HOST_MEM_LIMIT_IN_MB": "4096", "CUDA_VISIBLE_DEVICES": "3",
            "HOME": "/home/u"}
    env, notes = gpu_worker_env(user, visible="GPU-3333")
    assert "TF_XLA_FLAGS" not in env and "TF_GPU_ALLOCATOR" not in env and "TF_FORCE_GPU_ALLOW_GROWTH" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-3333" and env["HOME"] == "/home/u"
    assert env["TF_GPU_HOST_MEM_LIMIT_IN_MB"] == "4096"  # the user's cap is kept
    assert "TF_CPP_MIN_LOG_LEVEL" not in env  # TensorFlow's warnings about its CUDA libraries stay visible
    assert [n.split("=")[0] for n in notes] == ["TF_XLA_FLAGS", "TF_GPU_ALLOCATOR"]
    assert user["CUDA_VISIBLE_DEVICES"] == "3"  # the caller's mapping is not changed


def test_default_budget_is_what_tensorflow_can_reach_not_nvmls_total() -> None:
    from tuner.backends.gpu import CUDA_CONTEXT_BYTES, min_system_memory, tf_reachable_bytes

    MiB = 1 << 20
    h100 = gpu(0, "0:1", "NVIDIA H100 80GB HBM3", total=80 * GiB, compute_capability="9.0", free_bytes=79 * GiB)
    budget, why = get_backend("gpu").default_budget(device="H100-80GB", gpu_info=h100)
    assert budget == 79 * GiB - CUDA_CONTEXT_BYTES - 1800 * MiB  # free (another process holds 1 GiB)
    assert "79.00 GiB free (NVML)" in why and "MinSystemMemory (compute capability 9.0)" in why
    assert [min_system_memory(16 * GiB, cc) for cc in (6, 7, 8, 9, 10, None)] == [
        500 * MiB, 1050 * MiB, 1536 * MiB, 1800 * MiB, 1800 * MiB, 1800 * MiB]
    assert min_system_memory(GiB, 9) == 225 * MiB
    v100 = gpu(0, "0:1", "Tesla V100-SXM2-16GB", total=16 * GiB, compute_capability="7.0", free_bytes=None)
    assert tf_reachable_bytes(v100)[0] == 16 * GiB - CUDA_CONTEXT_BYTES - 1050 * MiB
    mig = gpu(0, "0:1", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", total=5 * GiB - 512 * MiB, mig="instance")
    assert tf_reachable_bytes(mig)[0] == mig["total_bytes"] - CUDA_CONTEXT_BYTES - 1536 * MiB


def test_worker_limits_carry_the_budget_and_a_share_of_pinned_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tuner.environment.host_memory_bytes", lambda: 128 * GiB)
    settings = SimpleNamespace(budget_bytes=16 * GiB, gpus=("GPU-a", "GPU-b", "GPU-c", "GPU-d"), gpu=None, workers=4)
    assert get_backend("gpu").worker_limits(settings) == {
        "device_memory_limit_bytes": 16 * GiB, "host_memory_limit_bytes": 24 * GiB}  # 0.75 x 128 GiB / 4
    assert get_backend("emulated").worker_limits(settings) == {}
    assert host_memory_limit_bytes(host_bytes=64 * GiB, workers=1) == 48 * GiB
    with pytest.raises(ValueError, match="workers=0"):
        host_memory_limit_bytes(host_bytes=64 * GiB, workers=0)


# ------------------------------------------------------------------ enforcing the budget in the worker

class FakeConfig:
    """Records what `GpuBackend.configure_tensorflow` asks of `tf.config`."""

    def __init__(self, gpus: list[str]) -> None:
        self.gpus = gpus
        self.calls: list[tuple[Any, ...]] = []
        self.experimental = SimpleNamespace(set_memory_growth=lambda d, on: self.calls.append(("growth", d, on)))

    def list_physical_devices(self, kind: str) -> list[str]:
        return list(self.gpus) if kind == "GPU" else []

    def set_logical_device_configuration(self, device: str, configs: list[Any]) -> None:
        self.calls.append(("logical", device, [c.memory_limit for c in configs]))

    LogicalDeviceConfiguration = staticmethod(lambda memory_limit=None: SimpleNamespace(memory_limit=memory_limit))


def test_the_budget_becomes_a_memory_limit_without_memory_growth() -> None:
    config = FakeConfig(["/physical_device:GPU:0"])
    assert get_backend("gpu").configure_tensorflow(SimpleNamespace(config=config),
                                                   memory_limit_bytes=16 * GiB + 123) == ""
    assert config.calls == [("logical", "/physical_device:GPU:0", [16 * 1024])]  # MiB, rounded down
    config = FakeConfig(["/physical_device:GPU:0"])
    get_backend("gpu").configure_tensorflow(SimpleNamespace(config=config))  # no budget: growth, as before
    assert config.calls == [("growth", "/physical_device:GPU:0", True)]
    reason = get_backend("gpu").configure_tensorflow(SimpleNamespace(config=FakeConfig([])), memory_limit_bytes=GiB)
    assert reason.startswith(NO_GPU_REASON)


@pytest.mark.tf
def test_logical_device_configs_use_tensorflows_own_class() -> None:
    import tensorflow as tf

    from tuner.backends.gpu import logical_device_configs

    [(device, [config])] = logical_device_configs(["gpu0"], memory_limit_bytes=5 * GiB,
                                                  make=tf.config.LogicalDeviceConfiguration)
    assert device == "gpu0" and config.memory_limit == 5 * 1024
    assert logical_device_configs(["gpu0"], memory_limit_bytes=None, make=tf.config.LogicalDeviceConfiguration) == []
    with pytest.raises(ValueError, match="at least 1 MiB"):
        logical_device_configs(["gpu0"], memory_limit_bytes=1000, make=tf.config.LogicalDeviceConfiguration)


# ------------------------------------------------------------------ when TensorFlow sees no GPU

TF_LOG = """\
2025-01-09 10:12:01.001 I external/local_xla/xla/tsl/cuda/cudart_stub.cc:32] Could not find cuda drivers on your machine, GPU will not be used.
2025-01-09 10:12:03.120 W tensorflow/core/common_runtime/gpu/gpu_device.cc:2344] Cannot dlopen some GPU libraries. Please make sure the missing libraries mentioned above are installed properly if you would like to use GPU. Follow the guide at https://www.tensorflow.org/install/gpu for how to download and setup the required libraries for your platform.
Skipping registering GPU devices...
2025-01-09 10:12:03.120 W tensorflow/core/common_runtime/gpu/gpu_device.cc:2344] Cannot dlopen some GPU libraries. Please make sure the missing libraries mentioned above are installed properly if you would like to use GPU. Follow the guide at https://www.tensorflow.org/install/gpu for how to download and setup the required libraries for your platform.
INFO tuner.trial probing batch 8
"""


def test_the_reason_tensorflow_found_no_gpu_is_surfaced() -> None:
    lines = gpu_setup_lines(TF_LOG)
    assert lines[0] == "Could not find cuda drivers on your machine, GPU will not be used."
    assert lines[1].startswith("Cannot dlopen some GPU libraries. Please make sure")
    assert lines[2] == "Skipping registering GPU devices..." and len(lines) == 3  # repeated line once
    reason = f"{NO_GPU_REASON} (CUDA_VISIBLE_DEVICES='GPU-1111')"
    explained = explain_no_gpu(reason, TF_LOG)
    assert explained.startswith(reason + "; TensorFlow logged: Could not find cuda drivers")
    assert "Cannot dlopen some GPU libraries" in explained
    assert explain_no_gpu("ValueError: model raised", TF_LOG) == "ValueError: model raised"
    assert explain_no_gpu(reason, "nothing about GPUs") == reason
