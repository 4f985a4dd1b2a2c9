"""What ``model.fit`` peaks at, step by step, and the check of that peak against a budget. TensorFlow, Keras.

`StepPeaks` is a Keras callback: TF's allocator peak statistic is reset before
each training step and read after it, with the step's wall time. The tuner
measures a ``fit`` program with it (`tuner.trial`), so a recommendation's peak
is the peak of the user's own ``fit``: Keras' own train function, the batch
arriving through a ``tf.data`` iterator inside the step, TF's default executor.

`FitPeakCheck` is what `lms.enable_lms` adds to ``fit`` when it knows a budget:
``config="auto"`` (the budget it chose for) or a tuner recommendation loaded
from ``recommended.json`` (the budget it was tuned for). After the second step
(the first one traces and plans) the measured peak is compared with the budget;
above it, a WARNING names about the batch that would fit (the step's bytes
above those in use before it, scaled with the batch) and how to tune the program. The same check `lms.function` runs for
``config="auto"`` (`lms.tf.auto.PeakCheck`), for ``fit``.

A callback that reads each step's end makes Keras call the callbacks
synchronously (Keras runs batch-end callbacks in a thread only when no
callback needs them); the steps themselves run as before.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import keras
import tensorflow as tf

from ..sizes import format_size
from .sync import synchronise

__all__ = ["StepPeaks", "FitPeakCheck", "batch_that_fits", "measure_fit", "with_callback"]

log = logging.getLogger(__name__)

#: The step whose peak `FitPeakCheck` reads: the first one traces, plans, and allocates for the first time.
CHECKED_STEP = 2


class StepPeaks(keras.callbacks.Callback):
    """Every training step's allocator peak (bytes) and wall time (s), in `peaks` and `times`.

    Args:
        device: the TF device whose allocator is read (``"CPU:0"``, ``"GPU:0"``); default: GPU:0 when a
            GPU is visible, else CPU:0.
        on_step: called as ``on_step(step_number, peak_bytes)`` after each step (numbered from 1);
            may set ``self.model.stop_training``.

    `available` is False when the allocator keeps no statistic (TF's CPU allocator is not BFC:
    ``lms.tf.allocator.configure_cpu_allocator()``); then nothing is recorded.
    """

    def __init__(self, device: str | None = None, *, on_step: Callable[[int, int], None] | None = None) -> None:
        super().__init__()
        self.device = device or ("GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0")
        self.on_gpu = self.device.upper().startswith("GPU")
        self.on_step = on_step
        self.peaks: list[int] = []
        self.in_use: list[int] = []  # bytes in use as each step began (variables, optimizer state, other tensors)
        self.times: list[float] = []
        self.available = True
        self._start: float | None = None
        self._in_use = 0

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if not self.available:
            return
        if self.on_gpu:
            synchronise(None, on_gpu=True)
        try:
            tf.config.experimental.reset_memory_stats(self.device)
        except (ValueError, RuntimeError) as exc:  # CPU without TF_CPU_ALLOCATOR_USE_BFC: no statistic
            log.debug("no allocator statistic on %s (%s): fit's peaks are not read", self.device, exc)
            self.available = False
            return
        self._in_use = int(tf.config.experimental.get_memory_info(self.device)["current"])
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if not self.available or self._start is None:
            return
        synchronise(logs, on_gpu=self.on_gpu)
        self.times.append(time.perf_counter() - self._start)
        self.peaks.append(int(tf.config.experimental.get_memory_info(self.device)["peak"]))
        self.in_use.append(self._in_use)
        self._start = None
        if self.on_step is not None:
            self.on_step(len(self.peaks), self.peaks[-1])


def batch_that_fits(batch: int, peak_bytes: int, budget_bytes: int, in_use_bytes: int = 0) -> int:
    """The largest batch whose peak stays within the budget, the step's own bytes (`peak_bytes` less the
    `in_use_bytes` held as the step began: variables, optimizer state, other tensors) scaled with the batch.

    An estimate: a step's bytes are not all proportional to the batch (workspaces, the allocator's
    rounding), so the batch returned can be a little over; 0 when not even batch 1 would fit.
    """
    step = peak_bytes - in_use_bytes
    if step <= 0:
        return batch
    return max(0, batch * (budget_bytes - in_use_bytes) // step)


class FitPeakCheck(StepPeaks):
    """Warn when step `CHECKED_STEP` of ``fit`` peaks above a budget.

    Args:
        budget: ``() -> (budget_bytes, what)``: the budget and where it comes from (e.g. "the budget
            config='auto' chose for"), or None when there is nothing to check (read at the step).
        batch: ``() -> int | None``: the batch the step ran at.
        owner: names the model in the message.
    """

    def __init__(self, budget: Callable[[], tuple[int, str] | None], batch: Callable[[], int | None], *,
                 owner: str, device: str | None = None) -> None:
        super().__init__(device, on_step=self._check)
        self._budget = budget
        self._batch = batch
        self.owner = owner
        self.measured_peak_bytes: int | None = None
        self.over_budget: bool | None = None

    def _check(self, step: int, peak: int) -> None:
        if step != CHECKED_STEP:
            return
        found = self._budget()
        if found is None:
            return
        budget, what = found
        self.measured_peak_bytes = peak
        self.over_budget = peak > budget
        batch = self._batch()
        if not self.over_budget:
            log.info("LMS: %s peaked at %s of %s (TF's allocator, step %d of fit)", self.owner, format_size(peak),
                     what, step)
            return
        hint = ""
        if batch:
            in_use = self.in_use[-1] if self.in_use else 0
            fits = batch_that_fits(batch, peak, budget, in_use)
            hint = (f"; about batch {fits} would fit (the step's bytes above the {format_size(in_use)} in use "
                    f"before it, scaled with the batch)" if fits else
                    f"; not even batch 1 would fit ({format_size(in_use)} were in use before the step)")
        log.warning("LMS: %s peaked at %s on %s (TF's allocator, step %d of fit) at batch %s, above %s%s. Tune the "
                    "program itself: python -m tuner search --model your_module:make_workload with "
                    "Workload(fit_model=...) (docs/tuner.md)", self.owner, format_size(peak), self.device, step,
                    batch if batch else "?", what, hint)


def with_callback(args: tuple, kwargs: dict, callback: Any) -> tuple[tuple, dict]:
    """``fit``'s arguments with `callback` added to its callbacks (given by keyword or in position 6)."""
    if len(args) > 5:
        given = args[5]
        args = (*args[:5], [*(given or []), callback], *args[6:])
        return args, kwargs
    kwargs = dict(kwargs)
    kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), callback]
    return args, kwargs


def measure_fit(model: Any, dataset: Any, *, warmup: int = 2, steps: int = 5, device: str | None = None,
                stop_after: Callable[[int], bool] | None = None) -> Any:
    """Run ``model.fit(dataset)`` for ``warmup + steps`` steps and measure the timed ones, as the script's own
    ``fit`` runs them (Keras' train function, the batch from the pipeline): a `lms.tf.measure.StepMeasurement`.

    `stop_after` is called with each timed step's peak; True ends ``fit`` after that step. The model's
    train function is made anew, so the step is traced (and LMS plans) for this dataset's batch.
    """
    import gc

    import numpy as np

    from ..machine import hostmem
    from .measure import SOURCE_CPU, SOURCE_GPU, StepMeasurement, default_device, device_name, host_copies

    warmup = max(1, int(warmup))
    device = (device or default_device()).split("device:")[-1].lstrip("/").upper()  # "/CPU:0" -> "CPU:0"

    def on_step(number: int, peak: int) -> None:
        if number > warmup and stop_after is not None and stop_after(peak):
            peaks.model.stop_training = True

    peaks = StepPeaks(device, on_step=on_step)
    model.train_function = None
    gc.collect()
    baseline = int(tf.config.experimental.get_memory_info(device)["current"])
    window = hostmem.reset_peak_rss()
    copies = host_copies()
    before = copies.copies if copies is not None else 0
    if copies is not None:
        copies.reset_peak()
    model.fit(dataset, steps_per_epoch=warmup + steps, epochs=1, verbose=0, callbacks=[peaks], shuffle=False)
    if not peaks.available:
        raise RuntimeError("TF's allocator keeps no peak statistic here (lms.tf.allocator.configure_cpu_allocator())")
    timed, times = peaks.peaks[warmup:], peaks.times[warmup:]
    if not timed:
        raise RuntimeError(f"fit ran {len(peaks.peaks)} steps, none after its {warmup} warm-up steps")
    q = np.percentile(times, [25, 50, 75])
    host = hostmem.window_peak_rss_bytes() if window else None
    batch = next((int(s.shape[0]) for s in tf.nest.flatten(dataset.element_spec)
                  if s.shape.rank and s.shape[0] is not None), None)
    return StepMeasurement(
        device=device, device_name=device_name(tf, device, None), peak_device_bytes=max(timed),
        peak_source=SOURCE_GPU if device.upper().startswith("GPU") else SOURCE_CPU, baseline_device_bytes=baseline,
        step_peaks_bytes=tuple(timed), step_times_s=tuple(times), median_step_s=float(q[1]),
        spread_s=float(q[2] - q[0]), warmup_steps=warmup, batch_size=batch,
        host_peak_rss_bytes=int(host if host is not None else hostmem.peak_rss_bytes()),
        host_peak_source="proc-vmhwm-window" if host is not None else "getrusage-maxrss-process",
        host_rss_bytes=hostmem.current_rss_bytes(), tf_version=tf.__version__,
        host_copies_peak_bytes=copies.peak_bytes if copies is not None and copies.copies > before else None)
