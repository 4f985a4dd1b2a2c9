"""The user's own program in a trial: ``model.fit`` (form ``"fit"``) or their step (form ``"train_step"``).

Worker side (TensorFlow is imported by the caller first). A trial of a program
workload measures what the user's run will run:

- ``fit``: ``lms.enable_lms(model, config)`` and ``model.fit`` on
  ``tf.data.Dataset.from_tensor_slices(make_batch(batch)).repeat().batch(batch,
  drop_remainder=True)``: Keras' own train function, a fixed batch dimension,
  the batch made by the pipeline inside each step; every step's allocator peak
  and time are read by a callback (`lms.tf.fit_peaks.StepPeaks`). Each probed
  batch gets a fresh train function, traced (and planned) at that batch, as a
  script's one ``fit`` is.
- ``train_step``: ``lms.function(step, config=...)`` called on the batch, traced
  at its fixed batch (no input signature), pinned whole where `lms.function`
  would pin it in the user's script.

Both run under TensorFlow's default executor and threads (the emulated
backend's single-threaded executor is for the tuner's own step only): the
peaks are the user's, step to step and process to process, and the
confirmation's fresh processes (`tuner.backends.confirm`) see their spread.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["conditions", "trace_program", "fit_runner", "step_runner", "fit_dataset"]


def conditions(workload: Any, backend: Any, lms_summary: dict[str, Any] | None = None) -> dict[str, str]:
    """What a trial's peak was measured under (a recommendation's ``measured_under``).

    `workload`: the `Workload`'s ``describe()`` (the parent's view, no TensorFlow).
    """
    summary = lms_summary or {}
    form = workload.get("form", "step")
    if form == "step":
        out = {"program": "the tuner's step", "batch_dim": "unknown", "executor": backend.executor}
    else:
        out = {"program": workload.get("program", form), "batch_dim": "fixed", "executor": "default"}
    if "pinned_whole" in summary:
        out["pinned"] = "whole" if summary["pinned_whole"] else "partly"
    return out


def fit_dataset(batch: Any, batch_size: int) -> Any:
    """The ``tf.data`` pipeline a fit trial trains on: one batch's samples, repeated, batched at a fixed size."""
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(batch).repeat().batch(batch_size, drop_remainder=True)


def _compiled_model(workload: Any) -> Any:
    import keras

    model = workload.fit_model()
    if not isinstance(model, keras.Model):
        raise ValueError(f"workload {workload.name!r}: fit_model() returned {type(model).__name__}; "
                         "expected a compiled keras.Model")
    if not getattr(model, "compiled", False):
        raise ValueError(f"workload {workload.name!r}: fit_model() returned a model that is not compiled; "
                         "call model.compile(...) in fit_model as your script does")
    return model


def trace_program(workload: Any, batch_size: int) -> tuple[Any, Any, Callable[[int], tuple]]:
    """Trace a program's step for the simulator: ``(graph, concrete function, make_args)``.

    ``fit``: the model's own ``train_step`` after one step of ``fit`` (which builds the
    optimizer and metrics as the user's ``fit`` does). `make_args(batch)` gives the
    concrete function's arguments at `batch` (for `lms.tf.profile`).
    """
    import tensorflow as tf

    from lms.tf.extract import trace_step

    from ..models.parts import check_program_batch

    batch = workload.make_batch(batch_size, 0)
    check_program_batch(workload.name, batch, batch_size)
    if workload.form == "fit":
        model = _compiled_model(workload)
        model.fit(fit_dataset(batch, batch_size), steps_per_epoch=1, epochs=1, verbose=0, shuffle=False)

        def step(data: Any) -> Any:
            return model.train_step(data)

        traced = trace_step(step, (batch,), batch_size=batch_size, name=workload.name)

        def make_args(b: int) -> tuple:
            return (tf.nest.map_structure(tf.convert_to_tensor, workload.make_batch(b, 0)),)
    else:
        traced = trace_step(workload.train_step(), batch, batch_size=batch_size, name=workload.name)

        def make_args(b: int) -> tuple:
            data = tf.nest.map_structure(tf.convert_to_tensor, workload.make_batch(b, 0))
            return data if isinstance(data, tuple) else (data,)
    return traced.graph, traced.concrete_function, make_args


class fit_runner:  # noqa: N801 - used like a function returning `run`
    """``run(batch, warmup=, steps=, stop_after=)`` -> `StepMeasurement` of the user's ``fit`` at `batch`."""

    def __init__(self, workload: Any, config: Any, *, emulate: bool, bandwidth: float | None, device: str,
                 seed: int) -> None:
        import lms

        self.workload = workload
        self.model = lms.enable_lms(_compiled_model(workload), config, emulate=emulate, bandwidth=bandwidth)
        self.device = device
        self.seed = seed

    @property
    def lms_state(self) -> Any:
        return self.model.lms

    def __call__(self, batch: int, *, warmup: int, steps: int, stop_after: Any = None) -> Any:
        from lms.tf.fit_peaks import measure_fit

        from ..models.parts import check_program_batch

        data = self.workload.make_batch(batch, self.seed)
        check_program_batch(self.workload.name, data, batch)
        return measure_fit(self.model, fit_dataset(data, batch), warmup=warmup, steps=steps, device=self.device,
                           stop_after=stop_after)


def step_runner(workload: Any, config: Any, *, emulate: bool, bandwidth: float | None, device: str,
                seed: int) -> tuple[Any, Callable[..., Any]]:
    """``(lms.function of the user's step, run)``; `run` as `fit_runner`'s, with `lms.tf.measure.measure_step`
    under TF's default executor."""
    import lms
    from lms.tf.measure import device_batch, measure_step

    from ..models.parts import check_program_batch

    fn = lms.function(workload.train_step(), config=config, emulate=emulate, bandwidth=bandwidth)

    def run(batch: int, *, warmup: int, steps: int, stop_after: Any = None) -> Any:
        data = workload.make_batch(batch, seed)
        check_program_batch(workload.name, data, batch)
        return measure_step(fn, [device_batch(data, device)], warmup=warmup, steps=steps, device=device,
                            executor="default", stop_after=stop_after)

    return fn, run
