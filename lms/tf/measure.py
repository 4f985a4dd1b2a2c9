"""Measure a training step's real memory peak and time.

On CPU the figure is TensorFlow's BFC allocator peak (byte-exact, includes the
variables) over the timed steps; on GPU the GPU allocator's peak, with NVML's
per-process and device-wide peaks beside it (they include TF's pool, which
never shrinks, and the CUDA context). Each figure says where it came from.

Both allocator settings are read when TensorFlow's runtime starts (its first
op or device query), not at ``import tensorflow``; call the ``configure_*``
helpers (`lms.tf.allocator`) before that, best before importing TensorFlow::

    from lms.tf.allocator import configure_cpu_allocator
    from lms.tf.measure import measure_step
    configure_cpu_allocator()          # TF_CPU_ALLOCATOR_USE_BFC=true
    ...
    m = measure_step(train_step, (x, y), warmup=2, steps=5)
    m.peak_device_bytes, m.median_step_s, m.throughput()
"""

from __future__ import annotations

import gc
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lms.machine import hostmem
from lms.machine.nvml import NvmlReading, NvmlSampler, nvml_available

from .allocator import BFC_ENV, GROWTH_ENV, cpu_allocator_is_bfc, env_true
from .sync import synchronise

__all__ = ["StepMeasurement", "default_device", "device_batch", "measure_step"]

log = logging.getLogger(__name__)

SOURCE_CPU = "tf-bfc-cpu"
SOURCE_GPU = "tf-allocator-gpu"
# measure_step(executor=...) -> TF's executor type (None: TF's default)
EXECUTORS = {"default": None, "single_threaded": "SINGLE_THREADED_EXECUTOR"}


# --- the measurement --------------------------------------------------------------------

@dataclass(frozen=True)
class StepMeasurement:
    """One measured training step configuration.

    Attributes:
        device: the TF device measured, e.g. ``"CPU:0"``.
        device_name: its model (NVML / TF device details / /proc/cpuinfo).
        peak_device_bytes: the allocator's peak over the timed steps (includes
            variables, optimizer slots and everything else resident): the
            largest of `step_peaks_bytes`.
        step_peaks_bytes: the allocator's peak in each timed step (its
            statistic is reset before each). They differ where the executor
            orders ops differently from step to step (inter-op threads).
        peak_source: ``"tf-bfc-cpu"`` or ``"tf-allocator-gpu"``.
        baseline_device_bytes: allocator bytes in use when the timed steps began.
        step_times_s: wall time of each timed step (synchronised), seconds.
        median_step_s: their median.
        spread_s: their interquartile range (``spread_kind == "iqr"``).
        warmup_steps: untimed steps run first (tracing, Grappler, first-run peaks).
        batch_size: leading dimension of the first input, if it has one.
        nvml_process_peak_bytes / nvml_device_peak_bytes: NVML's peaks of this
            process and of the whole device over the timed steps; ``None`` off
            GPU or without NVML.
        nvml: the full NVML reading, or ``None``.
        host_peak_rss_bytes: this process's peak RSS (see ``host_peak_source``).
        host_peak_source: ``"proc-vmhwm-window"`` (timed steps only) or
            ``"getrusage-maxrss-process"`` (whole process life).
        host_rss_bytes: RSS after the timed steps (``VmRSS``), or ``None``.
        tf_version: TensorFlow's version.
        live_peak_bytes: with ``measure_step(live=True)``: the requested bytes
            the step's tensors held at most in one more step, profiled
            (`lms.tf.live`: the step's arguments and variables plus its own
            allocations; no allocator rounding or history); else ``None``.
        live_step_bytes: the part of `live_peak_bytes` the step allocated.
    """

    device: str
    device_name: str
    peak_device_bytes: int
    peak_source: str
    baseline_device_bytes: int
    step_peaks_bytes: tuple[int, ...]
    step_times_s: tuple[float, ...]
    median_step_s: float
    spread_s: float
    warmup_steps: int
    batch_size: int | None
    host_peak_rss_bytes: int
    host_peak_source: str
    host_rss_bytes: int | None
    nvml_process_peak_bytes: int | None = None
    nvml_device_peak_bytes: int | None = None
    nvml: NvmlReading | None = field(default=None, repr=False)
    spread_kind: str = "iqr"
    tf_version: str = ""
    live_peak_bytes: int | None = None
    live_step_bytes: int | None = None
    host_copies_peak_bytes: int | None = None

    @property
    def steps(self) -> int:
        return len(self.step_times_s)

    @property
    def median_step_peak_bytes(self) -> int:
        """Median of the per-step peaks: the typical step (``peak_device_bytes`` is the worst)."""
        return int(np.median(self.step_peaks_bytes))

    def throughput(self, batch_size: int | None = None) -> float:
        """Samples per second at the median step time."""
        batch = self.batch_size if batch_size is None else batch_size
        if batch is None:
            raise ValueError("batch size unknown: pass throughput(batch_size=...)")
        return batch / self.median_step_s

    @property
    def sources(self) -> dict[str, str | None]:
        """Where each figure comes from (``None``: figure absent)."""
        return {
            "peak_device_bytes": self.peak_source,
            "baseline_device_bytes": self.peak_source,
            "step_peaks_bytes": self.peak_source,
            "median_step_peak_bytes": self.peak_source,
            "step_times_s": "time.perf_counter, output synchronised",
            "nvml_process_peak_bytes":
                None if self.nvml_process_peak_bytes is None else "nvml-process",
            "nvml_device_peak_bytes":
                None if self.nvml_device_peak_bytes is None else "nvml-device",
            "host_peak_rss_bytes": self.host_peak_source,
            "host_rss_bytes": None if self.host_rss_bytes is None else "proc-vmrss",
            "live_peak_bytes": None if self.live_peak_bytes is None else "tf-profiler-requested",
            "host_copies_peak_bytes": None if self.host_copies_peak_bytes is None else "emulated-swap-copies",
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able figures with a ``sources`` entry labelling each."""
        return {
            "device": self.device, "device_name": self.device_name,
            "batch_size": self.batch_size,
            "peak_device_bytes": self.peak_device_bytes, "peak_source": self.peak_source,
            "baseline_device_bytes": self.baseline_device_bytes,
            "step_peaks_bytes": list(self.step_peaks_bytes),
            "median_step_peak_bytes": self.median_step_peak_bytes,
            "step_times_s": list(self.step_times_s), "median_step_s": self.median_step_s,
            "spread_s": self.spread_s, "spread_kind": self.spread_kind,
            "warmup_steps": self.warmup_steps, "steps": self.steps,
            "throughput": None if self.batch_size is None else self.throughput(),
            "nvml_process_peak_bytes": self.nvml_process_peak_bytes,
            "nvml_device_peak_bytes": self.nvml_device_peak_bytes,
            "nvml": None if self.nvml is None else self.nvml.to_dict(),
            "host_peak_rss_bytes": self.host_peak_rss_bytes,
            "host_peak_source": self.host_peak_source,
            "host_rss_bytes": self.host_rss_bytes,
            "tf_version": self.tf_version,
            "live_peak_bytes": self.live_peak_bytes, "live_step_bytes": self.live_step_bytes,
            "host_copies_peak_bytes": self.host_copies_peak_bytes,
            "sources": self.sources,
        }


def host_copies() -> Any:
    """The emulated swap copies' counter (`lms.tf.emulate.HOST_COPIES`) once that module is loaded, else None."""
    import sys

    emulate = sys.modules.get("lms.tf.emulate")
    return getattr(emulate, "HOST_COPIES", None)


def default_device() -> str:
    """``"GPU:0"`` when TF sees a GPU, else ``"CPU:0"``."""
    import tensorflow as tf

    return "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"


def measure_step(step: Callable[..., Any], batches: Any, *, warmup: int = 2, steps: int = 5,
                 device: str | None = None, nvml: bool | NvmlSampler | None = None,
                 reset_host_peak: bool = True, executor: str = "default", live: bool = False,
                 stop_after: Callable[[int], bool] | None = None) -> StepMeasurement:
    """Run ``step`` untimed ``warmup`` times, then ``steps`` timed times, and measure.

    The allocator's peak statistic is reset before each timed step, so tracing,
    Grappler and first-run allocations are excluded; each timed step waits for
    its outputs (converted to numpy; on GPU also ``sync_devices``).

    Args:
        step: called as ``step(*batch)`` (a tuple batch) or ``step(batch)``;
            e.g. a tf.function / `lms.function` training step returning the loss.
        batches: one batch used for every step (a tuple of arguments, a dict,
            or a single tensor/array), or a list (any sequence) of batches used
            in turn, cycling, or an iterator, consumed (``warmup + steps``
            batches). Fetching a batch is not timed. Numpy arrays are put
            in the device's memory first (`device_batch`: on CPU one copy in
            TF's allocator, the same in every process); tensors are used as
            they are.
        warmup: untimed steps first (>= 1 advised: the first includes tracing).
        steps: timed steps (>= 1).
        device: TF device whose allocator to read; default `default_device()`.
            The step's own placement is not changed.
        nvml: ``None``: sample NVML on GPU when available; ``True``: required
            (raises if unusable); ``False``: off; or an `NvmlSampler` to use.
        reset_host_peak: reset this process's RSS high-water mark (and so, on
            Linux, ``ru_maxrss``) before the timed steps, so the host peak
            covers them only.
        executor: ``"default"``: TF's executor; ``"single_threaded"``: TF's
            ``SINGLE_THREADED_EXECUTOR`` for every tf.function the step calls,
            warm-up included (a function is instantiated for an executor on its
            first call under it). It runs the ops in one order, fixed when
            the function is instantiated, so every step makes the same
            allocations (the default executor's order depends on timing:
            peaks of one emulated-swap step spread by up to ~50% across
            processes). Across processes that order can still differ (TF
            keeps edges in pointer-ordered sets), unless the step is pinned
            whole (`lms.function` with ``schedule="memory"`` on one CPU
            device): then every process makes the same allocations in the
            same order, and TF's allocator reports the same peak for the
            same step (measured: to the byte in every process, for every
            zoo model). `lms.simulate` models it with
            ``order="single_threaded"``.
            Functions with control flow (``tf.cond`` / ``tf.while_loop``
            kernels) cannot run under it.
        live: also run one more step under TF's profiler and report the
            requested bytes its tensors held at most (`live_peak_bytes`,
            `lms.tf.live`): what the step's order makes live, without the
            allocator's rounding and history.
        stop_after: called with each timed step's allocator peak; True ends
            the timed steps there (e.g. a peak over a memory budget: no later
            step can bring the worst one back under it). The steps that ran are
            reported, ``steps`` of them at most.

    Raises:
        RuntimeError: on CPU, when TF's CPU allocator is not BFC (see
            `configure_cpu_allocator`).
    """
    import tensorflow as tf

    if executor not in EXECUTORS:
        raise ValueError(f"executor={executor!r}: allowed values are " + ", ".join(map(repr, EXECUTORS)))
    if EXECUTORS[executor] is not None:
        with tf.experimental.function_executor_type(EXECUTORS[executor]):
            return measure_step(step, batches, warmup=warmup, steps=steps, device=device, nvml=nvml,
                                reset_host_peak=reset_host_peak, live=live, stop_after=stop_after)
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    device = _normalise_device(device or default_device())
    on_gpu = device.startswith("GPU:")
    if not on_gpu and not cpu_allocator_is_bfc():
        raise RuntimeError(
            f"TensorFlow's CPU allocator is not the BFC allocator, so get_memory_info('CPU:0') "
            f"misses allocations. Set {BFC_ENV}=true before TensorFlow starts "
            "(lms.tf.allocator.configure_cpu_allocator(), or in the environment).")
    kind, index = device.split(":")
    if int(index) >= len(tf.config.list_logical_devices(kind)):
        raise ValueError(f"device {device!r}: TensorFlow sees "
                         f"{len(tf.config.list_logical_devices(kind))} {kind} device(s)")
    sampler = _make_sampler(nvml, on_gpu=on_gpu, device=device)
    if on_gpu and sampler is not None and not _gpu_growth_enabled(tf, int(index)):
        if _gpu_memory_limited(tf, int(index)):  # a fixed pool on purpose (the tuner's enforced budget)
            log.info("GPU memory is a fixed pool (memory_limit): NVML's figures show the pool, not the model")
        else:
            log.warning("GPU memory growth is off: NVML's figures show TF's whole pool, not the "
                        "model (lms.tf.allocator.configure_gpu_memory_growth())")
    if _single_batch(batches) and _has_arrays(batches):
        batches = device_batch(batches, device)  # counted once, in every process alike
    source = _batch_source(batches, needed=warmup + steps)

    def next_batch() -> Any:
        batch = source()
        return device_batch(batch, device) if _has_arrays(batch) else batch

    if warmup == 0:
        log.warning("warmup=0: the first timed step includes tracing and graph optimisation")
    first_batch = None
    for _ in range(warmup):
        batch = next_batch()
        first_batch = batch if first_batch is None else first_batch
        synchronise(_call(step, batch), on_gpu=on_gpu)

    gc.collect()
    baseline = int(tf.config.experimental.get_memory_info(device)["current"])
    host_window = hostmem.reset_peak_rss() if reset_host_peak else False
    copies = host_copies()
    copies_before = copies.copies if copies is not None else 0
    if copies is not None:
        copies.reset_peak()
    times: list[float] = []
    step_peaks: list[int] = []
    with sampler if sampler is not None else nullcontext():
        for _ in range(steps):
            batch = next_batch()
            first_batch = batch if first_batch is None else first_batch
            tf.config.experimental.reset_memory_stats(device)
            start = time.perf_counter()
            outputs = _call(step, batch)
            synchronise(outputs, on_gpu=on_gpu)
            times.append(time.perf_counter() - start)
            step_peaks.append(int(tf.config.experimental.get_memory_info(device)["peak"]))
            del outputs
            if stop_after is not None and stop_after(step_peaks[-1]):
                break
    peak = max(step_peaks)

    window_peak = hostmem.window_peak_rss_bytes() if host_window else None
    live_figures = None
    if live:
        from .live import live_bytes

        live_args = first_batch if isinstance(first_batch, tuple) else (first_batch,)
        live_figures = live_bytes(step, live_args, call=lambda: _call(step, first_batch),
                                  synchronise=lambda out: synchronise(out, on_gpu=on_gpu))
    if window_peak is not None:
        host_peak, host_source = window_peak, "proc-vmhwm-window"
    else:
        host_peak, host_source = hostmem.peak_rss_bytes(), "getrusage-maxrss-process"
    reading = sampler.result if sampler is not None else None
    quartiles = np.percentile(times, [25, 50, 75])
    measurement = StepMeasurement(
        device=device, device_name=device_name(tf, device, reading),
        peak_device_bytes=peak, peak_source=SOURCE_GPU if on_gpu else SOURCE_CPU,
        baseline_device_bytes=baseline, step_peaks_bytes=tuple(step_peaks),
        step_times_s=tuple(times),
        median_step_s=float(quartiles[1]), spread_s=float(quartiles[2] - quartiles[0]),
        warmup_steps=warmup, batch_size=_batch_size(first_batch),
        host_peak_rss_bytes=int(host_peak), host_peak_source=host_source,
        host_rss_bytes=hostmem.current_rss_bytes(),
        nvml_process_peak_bytes=None if reading is None else reading.process_peak_bytes,
        nvml_device_peak_bytes=None if reading is None else reading.device_peak_bytes,
        nvml=reading, tf_version=tf.__version__,
        live_peak_bytes=None if live_figures is None else live_figures.peak_bytes,
        live_step_bytes=None if live_figures is None else live_figures.step_bytes,
        host_copies_peak_bytes=copies.peak_bytes if copies is not None and copies.copies > copies_before else None)
    log.info("measured %s: peak %d bytes (%s), median step %.4f s over %d steps (%s bytes, %s s)", device, peak,
             measurement.peak_source, measurement.median_step_s, len(times), step_peaks, [round(t, 3) for t in times])
    return measurement


def device_batch(batch: Any, device: str | None = None) -> Any:
    """`batch` (a tensor or array, or a tuple/list/dict of them) as tensors in `device`'s memory, each held once.

    On a GPU each array is copied into the GPU's memory, where the step reads it.
    On CPU, `tf.convert_to_tensor` of a numpy array first copies the array into
    fresh host memory and then wraps that copy when its data pointer happens to
    be aligned and copies it once more, into TF's allocator, when not: the same
    batch counts in one process's peak and not in the next one's, and where the
    allocator puts it moves every later buffer. (Aligning the array beforehand
    does not help: it is the hidden copy whose alignment decides.) Here each
    array's bytes go in as one string tensor, held outside TF's allocator, and
    `DecodeRaw` writes the values into one buffer of TF's allocator, which owns
    it from then on, as a GPU owns its input batch. Tensors already on the
    device are kept as they are; other leaves (Python numbers, strings) pass
    through.

    `measure_step` applies this to the numpy arrays of the batches it is given;
    build a batch of tensors with it to hold one yourself.
    """
    import tensorflow as tf

    device = _normalise_device(device or default_device())
    on_cpu = device.startswith("CPU:")

    def one(leaf: Any) -> Any:
        if isinstance(leaf, tf.Tensor):
            if not on_cpu and not leaf.device.upper().endswith(device):
                with tf.device(device):
                    return tf.identity(leaf)
            return leaf
        if not isinstance(leaf, np.ndarray) or leaf.dtype.kind not in "biuf":
            return leaf
        if not on_cpu:
            with tf.device(device):
                return tf.identity(tf.convert_to_tensor(leaf))
        native = np.ascontiguousarray(leaf, dtype=leaf.dtype.newbyteorder("="))
        with tf.device(device):
            flat = tf.io.decode_raw(native.tobytes(), tf.as_dtype(native.dtype))
            return tf.reshape(flat, native.shape)  # a view of DecodeRaw's buffer: no copy

    return tf.nest.map_structure(one, batch)


# --- helpers ----------------------------------------------------------------------------

def _normalise_device(device: str) -> str:
    """"/device:GPU:0", "/gpu:0", "gpu" -> "GPU:0"."""
    name = device.strip().split("device:")[-1].lstrip("/")
    kind, _, index = name.partition(":")
    kind = kind.upper()
    if kind not in ("CPU", "GPU") or not (index or "0").isdigit():
        raise ValueError(f"device must look like 'CPU:0' or 'GPU:0', got {device!r}")
    return f"{kind}:{int(index or 0)}"


def _gpu_growth_enabled(tf: Any, index: int) -> bool:
    if env_true(GROWTH_ENV):
        return True
    try:
        return bool(tf.config.experimental.get_memory_growth(
            tf.config.list_physical_devices("GPU")[index]))
    except Exception:  # virtual devices, or the index is a logical one
        return False


def _gpu_memory_limited(tf: Any, index: int) -> bool:
    """The GPU was given logical devices (``memory_limit``), where memory growth cannot be on."""
    try:
        return bool(tf.config.get_logical_device_configuration(tf.config.list_physical_devices("GPU")[index]))
    except Exception:  # noqa: BLE001 - an index past the physical GPUs (a logical one)
        return False


def _make_sampler(nvml: bool | NvmlSampler | None, *, on_gpu: bool,
                  device: str) -> NvmlSampler | None:
    if isinstance(nvml, NvmlSampler):
        return nvml
    if nvml is False or (nvml is None and not on_gpu):
        return None
    position = int(device.split(":")[1]) if on_gpu else 0
    if nvml is None and not nvml_available():
        log.info("NVML unavailable: measuring %s without NVML figures", device)
        return None
    return NvmlSampler(position=position)


def _single_batch(batches: Any) -> bool:
    return isinstance(batches, (tuple, Mapping)) or hasattr(batches, "shape")


def _has_arrays(batch: Any) -> bool:
    import tensorflow as tf

    return any(isinstance(leaf, np.ndarray) for leaf in tf.nest.flatten(batch))


def _batch_source(batches: Any, *, needed: int) -> Callable[[], Any]:
    if _single_batch(batches):
        return lambda: batches  # one batch: a tuple of args, a dict, or one tensor/array
    if isinstance(batches, Sequence) and not isinstance(batches, (str, bytes)):
        if not batches:
            raise ValueError("batches is empty")
        cycle = itertools.cycle(range(len(batches)))
        return lambda: batches[next(cycle)]
    if isinstance(batches, Iterable):
        iterator = iter(batches)

        def pull() -> Any:
            try:
                return next(iterator)
            except StopIteration:
                raise ValueError(f"batches ran out: warmup + steps needs {needed}") from None
        return pull
    raise TypeError("batches must be a tuple (one batch), a sequence or an iterator of batches, "
                    f"got {type(batches).__name__}")


def _call(step: Callable[..., Any], batch: Any) -> Any:
    return step(*batch) if isinstance(batch, tuple) else step(batch)


def _batch_size(batch: Any) -> int | None:
    import tensorflow as tf

    if batch is None:
        return None
    for leaf in tf.nest.flatten(batch):
        shape = getattr(leaf, "shape", None)
        if shape is not None and len(shape) >= 1 and shape[0] is not None:
            return int(shape[0])
    return None


def device_name(tf: Any, device: str, reading: NvmlReading | None) -> str:
    if device.startswith("GPU:"):
        if reading is not None:
            return reading.device_name
        try:
            gpus = tf.config.list_physical_devices("GPU")
            details = tf.config.experimental.get_device_details(gpus[int(device[4:])])
            return str(details.get("device_name", device))
        except Exception:
            return device
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "CPU"
