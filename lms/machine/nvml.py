"""GPU memory as the driver sees it, through NVML (nvidia-ml-py); no TensorFlow.

`NvmlSampler` is a context manager that samples, on a daemon thread, the GPU
memory used by this process (``nvmlDeviceGetComputeRunningProcesses``) and by
the whole device (``nvmlDeviceGetMemoryInfo``) and keeps the peak of each::

    with NvmlSampler(interval_s=0.01) as sampler:
        run_steps()
    sampler.result.process_peak_bytes

What NVML shows is not what the model needs: it is TensorFlow's pool (which
never shrinks) plus the CUDA context. `lms.tf.measure` reports it beside the
allocator's own peak, each labelled with its source.

The device is the first one CUDA makes visible (or the n-th: TensorFlow's
``GPU:n``, as long as the script does not narrow TF's devices further with
``tf.config.set_visible_devices``). ``CUDA_VISIBLE_DEVICES`` may hold indices
or UUIDs (``GPU-...``/``MIG-...``, unique prefixes allowed). NVML numbers
devices in PCI bus order; CUDA does too only with
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (a warning is logged where that matters).

`gpu_inventory` lists every GPU with its PCI bus id, free memory and compute
capability, followed by its MIG instances when it is in MIG mode (each with its
own memory and ``MIG-`` UUID, which is what ``CUDA_VISIBLE_DEVICES`` takes).

In a container without the host's PID namespace NVML reports host PIDs, so
this process's entry is not found: the per-process figure is then ``None``
and only the device-wide one is available.

nvidia-ml-py (import name ``pynvml``) is optional and imported on first use.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

__all__ = [
    "NvmlError", "NvmlReading", "NvmlSampler", "gpu_inventory", "nvml_available",
    "resolve_visible_device",
]

log = logging.getLogger(__name__)

_INSTALL_HINT = "install nvidia-ml-py (pip install 'tflms-tuner[gpu]')"
# NVML_VALUE_NOT_AVAILABLE as an unsigned long long: what a raw process struct holds
# when the driver cannot attribute memory to a process (e.g. Windows WDDM).
_VALUE_NOT_AVAILABLE = 2**64 - 1
_MAX_ERRORS_KEPT = 20


class NvmlError(RuntimeError):
    """NVML cannot be used for the requested device (no driver, no such GPU, ...)."""


def _import_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as exc:
        raise ImportError(f"GPU memory sampling needs NVML: {_INSTALL_HINT}") from exc
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_available() -> bool:
    """True when nvidia-ml-py is installed, the driver loads and at least one GPU is present."""
    try:
        pynvml = _import_pynvml()
        pynvml.nvmlInit()
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded, ...
        log.debug("NVML not available: %s", exc)
        return False
    try:
        return int(pynvml.nvmlDeviceGetCount()) > 0
    except Exception as exc:
        log.debug("NVML device count failed: %s", exc)
        return False
    finally:
        _shutdown(pynvml)


def gpu_inventory() -> list[dict[str, Any]]:
    """Every GPU NVML sees, in NVML order, each followed by its MIG instances; ``[]`` where NVML is unusable.

    Returns:
        dicts with ``index`` (NVML's index; a MIG instance has its parent's),
        ``uuid`` (``GPU-...``, or ``MIG-...``: what ``CUDA_VISIBLE_DEVICES``
        takes), ``name``, ``total_bytes``, ``free_bytes`` (now), ``driver_version``,
        ``pci_bus_id`` (``"00000000:3B:00.0"``; CUDA's ``PCI_BUS_ID`` order sorts
        by it), ``compute_capability`` (``"8.0"``), ``mig``: ``"enabled"`` (a GPU
        in MIG mode: CUDA sees only its instances), ``"instance"`` (one of them,
        with ``mig_index`` and ``parent_uuid``) or ``None``. A figure NVML does
        not give (an old driver or binding) is ``None``.
    """
    try:
        pynvml = _import_pynvml()
        pynvml.nvmlInit()
    except Exception as exc:
        log.info("no GPU inventory: %s", exc)
        return []
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        inventory: list[dict[str, Any]] = []
        for index in range(int(pynvml.nvmlDeviceGetCount())):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpu = _describe(pynvml, handle, index=index, driver=driver)
            bus = _optional(lambda: pynvml.nvmlDeviceGetPciInfo(handle).busId)
            gpu["pci_bus_id"] = _text(bus).upper() if bus is not None else None
            instances = _mig_instances(pynvml, handle)
            gpu["mig"] = "enabled" if instances is not None else None
            inventory.append(gpu)
            for mig_index, mig in instances or ():
                entry = _describe(pynvml, mig, index=index, driver=driver)
                entry.update(pci_bus_id=gpu["pci_bus_id"], mig="instance", mig_index=mig_index,
                             parent_uuid=gpu["uuid"])
                if entry["compute_capability"] is None:
                    entry["compute_capability"] = gpu["compute_capability"]
                inventory.append(entry)
        return inventory
    finally:
        _shutdown(pynvml)


def _optional(read: Any) -> Any:
    """`read()`, or None when this driver or binding does not have it (AttributeError, NVML's NotSupported...)."""
    try:
        return read()
    except Exception as exc:  # noqa: BLE001 - NVMLError_* subclasses, AttributeError of an old binding
        log.debug("NVML: %s: %s", type(exc).__name__, exc)
        return None


def _describe(pynvml: ModuleType, handle: Any, *, index: int, driver: str) -> dict[str, Any]:
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    cc = _optional(lambda: pynvml.nvmlDeviceGetCudaComputeCapability(handle))
    return {
        "index": index,
        "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
        "name": _text(pynvml.nvmlDeviceGetName(handle)),
        "total_bytes": int(memory.total),
        "free_bytes": int(memory.free) if getattr(memory, "free", None) is not None else None,
        "driver_version": driver,
        "compute_capability": f"{int(cc[0])}.{int(cc[1])}" if cc else None,
    }


def _mig_instances(pynvml: ModuleType, handle: Any) -> list[tuple[int, Any]] | None:
    """[(slot, MIG device handle)] of a GPU in MIG mode; None when MIG is off or unsupported.

    Uses nvidia-ml-py's ``nvmlDeviceGetMigMode`` (current mode ==
    ``NVML_DEVICE_MIG_ENABLE``), ``nvmlDeviceGetMaxMigDeviceCount`` and
    ``nvmlDeviceGetMigDeviceHandleByIndex`` (an empty slot raises NotFound).
    """
    mode = _optional(lambda: pynvml.nvmlDeviceGetMigMode(handle))
    if not mode or int(mode[0]) != int(getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1)):
        return None
    slots = _optional(lambda: pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)) or 0
    found = []
    for slot in range(int(slots)):
        mig = _optional(lambda: pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot))
        if mig is not None:
            found.append((slot, mig))
    return found


def _shutdown(pynvml: ModuleType) -> None:
    try:
        pynvml.nvmlShutdown()
    except Exception as exc:  # never let cleanup hide the real result
        log.debug("nvmlShutdown failed: %s", exc)


def resolve_visible_device(pynvml: ModuleType, *, visible: str | None = None,
                           position: int = 0) -> tuple[int, Any]:
    """The NVML (index, handle) of a device CUDA makes visible (by default the first).

    Args:
        pynvml: the initialised NVML module.
        visible: a ``CUDA_VISIBLE_DEVICES`` value; default: the environment's.
            Unset means every device, in order. Entries are indices or
            (unique prefixes of) UUIDs.
        position: which visible device: TensorFlow's ``GPU:<position>``.

    Raises:
        NvmlError: no such visible device, or its entry matches no device.
    """
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = int(pynvml.nvmlDeviceGetCount())
    if visible is None:
        first = str(position)
    else:
        entries = [entry.strip() for entry in visible.split(",")]
        # CUDA stops reading at the first invalid entry ("-1" is the usual "none").
        valid = []
        for entry in entries:
            if not entry or entry.startswith("-"):
                break
            valid.append(entry)
        if position >= len(valid):
            raise NvmlError(
                f"CUDA_VISIBLE_DEVICES={visible!r} makes no GPU visible"
                if not valid else
                f"CUDA_VISIBLE_DEVICES={visible!r} makes {len(valid)} GPU(s) visible, "
                f"not GPU:{position}")
        first = valid[position]
    if first.isdigit():
        index = int(first)
        if index >= count:
            raise NvmlError(
                f"CUDA_VISIBLE_DEVICES={visible!r}: device {index} does not exist "
                f"(NVML sees {count})")
        if count > 1 and os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
            names = {_text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
                     for i in range(count)}
            if len(names) > 1:
                log.warning(
                    "GPUs of different models and CUDA_DEVICE_ORDER is not PCI_BUS_ID: "
                    "CUDA's device %d may not be NVML's device %d; set "
                    "CUDA_DEVICE_ORDER=PCI_BUS_ID or use a UUID", index, index)
        return index, pynvml.nvmlDeviceGetHandleByIndex(index)
    # A UUID or a unique prefix of one, as CUDA accepts.
    matches = []
    for index in range(count):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        if _text(pynvml.nvmlDeviceGetUUID(handle)).startswith(first):
            matches.append((index, handle))
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise NvmlError(f"CUDA_VISIBLE_DEVICES entry {first!r} matches {len(matches)} GPUs")
    if first.startswith("MIG-"):
        # MIG instances are not enumerated by index; NVML finds them by full UUID.
        try:
            return -1, pynvml.nvmlDeviceGetHandleByUUID(first.encode())
        except Exception as exc:
            raise NvmlError(f"no MIG device with UUID {first!r}: {exc}") from exc
    raise NvmlError(f"CUDA_VISIBLE_DEVICES entry {first!r} matches no GPU (NVML sees {count})")


@dataclass(frozen=True)
class NvmlReading:
    """What an `NvmlSampler` saw between enter and exit.

    Attributes:
        device_index: NVML index (``-1`` for a MIG instance found by UUID).
        device_uuid / device_name / driver_version / total_bytes: the device.
        pid: the process whose memory ``process_*`` figures are.
        process_peak_bytes: peak of this process's used GPU memory (CUDA
            context + TF pool); ``None`` if NVML never reported this PID (in a
            container without the host PID namespace NVML reports host PIDs)
            or could not attribute memory.
        device_peak_bytes: peak of the device's used memory (every process).
        device_start_bytes: the device's used memory at the first sample.
        n_samples: samples taken (one at enter, one at exit, the thread's between).
        interval_s: the sampling interval.
        errors: NVML errors met while sampling (first few), "ErrorType: message".
        n_errors: how many samples had an error.
    """

    device_index: int
    device_uuid: str
    device_name: str
    driver_version: str
    total_bytes: int
    pid: int
    process_peak_bytes: int | None
    device_peak_bytes: int | None
    device_start_bytes: int | None
    n_samples: int
    interval_s: float
    errors: tuple[str, ...] = field(default=())
    n_errors: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "device_index": self.device_index, "device_uuid": self.device_uuid,
            "device_name": self.device_name, "driver_version": self.driver_version,
            "total_bytes": self.total_bytes, "pid": self.pid,
            "process_peak_bytes": self.process_peak_bytes,
            "device_peak_bytes": self.device_peak_bytes,
            "device_start_bytes": self.device_start_bytes, "n_samples": self.n_samples,
            "interval_s": self.interval_s, "errors": list(self.errors), "n_errors": self.n_errors,
        }


class NvmlSampler:
    """Sample this process's and the device's GPU memory on a daemon thread.

    Args:
        interval_s: time between samples (default 10 ms).
        visible_devices: a ``CUDA_VISIBLE_DEVICES`` value to resolve instead of
            the environment's.
        position: which visible device to sample (TensorFlow's ``GPU:<position>``).
        pid: the process to attribute memory to (default: this one).

    An NVML error in one sample is recorded in ``result.errors`` and logged
    once; sampling goes on. A sample is also taken on enter and on exit, so a
    block shorter than the interval still has figures.
    """

    def __init__(self, *, interval_s: float = 0.010, visible_devices: str | None = None,
                 position: int = 0, pid: int | None = None) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        if position < 0:
            raise ValueError(f"position must be >= 0, got {position!r}")
        self.position = int(position)
        self.interval_s = float(interval_s)
        self._visible = visible_devices
        self.pid = os.getpid() if pid is None else int(pid)
        self._pynvml: ModuleType | None = None
        self._handle: Any = None
        self._info: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._process_fn: Any = None
        self._reset_counters()
        self._result: NvmlReading | None = None

    def _reset_counters(self) -> None:
        self._process_peak: int | None = None
        self._device_peak: int | None = None
        self._device_start: int | None = None
        self._n_samples = 0
        self._errors: list[str] = []
        self._n_errors = 0

    # -- context manager -------------------------------------------------------------
    def __enter__(self) -> NvmlSampler:
        pynvml = _import_pynvml()
        try:
            pynvml.nvmlInit()
        except Exception as exc:
            raise NvmlError(f"NVML did not start ({type(exc).__name__}: {exc}); "
                            "is the NVIDIA driver installed and a GPU present?") from exc
        try:
            index, handle = resolve_visible_device(pynvml, visible=self._visible,
                                                   position=self.position)
            self._info = {
                "device_index": index,
                "device_uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                "device_name": _text(pynvml.nvmlDeviceGetName(handle)),
                "driver_version": _text(pynvml.nvmlSystemGetDriverVersion()),
                "total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
            }
        except BaseException:
            _shutdown(pynvml)
            raise
        self._pynvml, self._handle = pynvml, handle
        self._reset_counters()
        self._result = None
        self._stop.clear()
        self.sample()
        self._thread = threading.Thread(target=self._run, name="lms-nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, 10 * self.interval_s))
            if self._thread.is_alive():
                log.warning("NVML sampler thread did not stop within %.1f s",
                            max(1.0, 10 * self.interval_s))
        self.sample()
        self._result = self._snapshot()
        if self._result.process_peak_bytes is None and self._result.device_peak_bytes is not None:
            log.warning("NVML attributed no GPU memory to PID %d (a container without the host "
                        "PID namespace, or a WDDM driver): only the device-wide figure is "
                        "available", self.pid)
        if self._pynvml is not None:
            _shutdown(self._pynvml)
        self._pynvml = self._handle = None
        self._thread = None

    # -- sampling --------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception as exc:  # keep sampling; the error is in the result
                self._record_error("sampler", exc)

    def sample(self) -> None:
        """Take one sample now (the thread calls this; callable between enter and exit)."""
        pynvml, handle = self._pynvml, self._handle
        if pynvml is None:
            raise RuntimeError("NvmlSampler.sample() outside its `with` block")
        device_used = process_used = None
        try:
            device_used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        except Exception as exc:
            self._record_error("nvmlDeviceGetMemoryInfo", exc)
        try:
            process_used = self._process_used(pynvml, handle)
        except Exception as exc:
            self._record_error("nvmlDeviceGetComputeRunningProcesses", exc)
        with self._lock:
            self._n_samples += 1
            if device_used is not None:
                if self._device_start is None:
                    self._device_start = device_used
                self._device_peak = max(self._device_peak or 0, device_used)
            if process_used is not None:
                self._process_peak = max(self._process_peak or 0, process_used)

    def _process_used(self, pynvml: ModuleType, handle: Any) -> int | None:
        """This PID's used bytes, or None when NVML lists it without a figure or not at all."""
        if self._process_fn is None:
            procs, self._process_fn = _running_processes(pynvml, handle)
        else:
            procs = self._process_fn(handle)
        total = None
        for proc in procs:
            if int(getattr(proc, "pid", -1)) != self.pid:
                continue
            used = getattr(proc, "usedGpuMemory", None)
            if used is None or int(used) >= _VALUE_NOT_AVAILABLE:
                continue
            total = (total or 0) + int(used)  # MIG: one entry per instance
        return total

    def _record_error(self, where: str, exc: BaseException) -> None:
        message = f"{where}: {type(exc).__name__}: {exc}"
        with self._lock:
            self._n_errors += 1
            first = self._n_errors == 1
            if len(self._errors) < _MAX_ERRORS_KEPT and message not in self._errors:
                self._errors.append(message)
        if first:
            log.warning("NVML sampling error (sampling continues; see NvmlReading.errors): %s",
                        message)

    def _snapshot(self) -> NvmlReading:
        with self._lock:
            return NvmlReading(
                **self._info, pid=self.pid, process_peak_bytes=self._process_peak,
                device_peak_bytes=self._device_peak, device_start_bytes=self._device_start,
                n_samples=self._n_samples, interval_s=self.interval_s,
                errors=tuple(self._errors), n_errors=self._n_errors)

    @property
    def result(self) -> NvmlReading:
        """The figures so far (during the block) or final (after it)."""
        if self._result is not None:
            return self._result
        if not self._info:
            raise RuntimeError("NvmlSampler has not been entered")
        return self._snapshot()


def _running_processes(pynvml: ModuleType, handle: Any) -> tuple[list[Any], Any]:
    """Call the newest process query the driver supports; returns (processes, that function).

    ``nvmlDeviceGetComputeRunningProcesses`` is the v3 struct in current
    nvidia-ml-py and fails on drivers without the v3 symbol; fall back to v2.
    """
    names = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2")
    first_error: Exception | None = None
    for name in names:
        fn = getattr(pynvml, name, None)
        if fn is None:
            continue
        try:
            return list(fn(handle)), fn
        except Exception as exc:
            if first_error is None:
                first_error = exc
            if not _is_version_error(exc):
                raise
    if first_error is not None:
        raise first_error
    raise NvmlError("nvidia-ml-py has no nvmlDeviceGetComputeRunningProcesses")


def _is_version_error(exc: Exception) -> bool:
    name = type(exc).__name__
    return "FunctionNotFound" in name or "Mismatch" in name
