"""Large Model Support for Keras 3 ``model.fit`` (TensorFlow backend).

Keras traces ``train_step`` inside its own ``tf.function``; LMS wraps that
``train_step`` so that, at the end of the trace, the step's graph is planned
and rewritten exactly as `lms.function` does. Two ways in::

    import keras, lms

    # 1. A model class: subclassed (define call) or functional (inputs/outputs).
    inputs = keras.Input((32, 32, 3))
    hidden = keras.layers.Conv2D(16, 3, activation="relu")(inputs)
    outputs = keras.layers.Dense(10)(keras.layers.Flatten()(hidden))
    model = lms.LMSModel(inputs, outputs, lms_config=lms.LMSConfig(lb=3))
    model.compile(optimizer="sgd", loss="mse")       # jit_compile="auto" becomes False
    model.fit(x, y, batch_size=8, epochs=1)
    model.lms.summary.n_swapped                       # 1: the conv's activation

    # 2. An existing model (e.g. keras.applications.ResNet50(weights=None)).
    model = lms.enable_lms(model, lms.LMSConfig(n_tensors=100, lb=5))
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=8)

XLA (``jit_compile=True``) compiles the step as one cluster and bypasses
graph-level swap ops, so it is refused; Keras' default ``"auto"`` (XLA on a
GPU) is turned into ``False``.
"""

from __future__ import annotations

import logging
from typing import Any

import keras

from ..auto import DEFAULT_MARGIN
from ..config import LMSConfig
from ..tuned import tuned_elsewhere
from ..sizes import format_size
from .fit_peaks import FitPeakCheck, with_callback
from .rewriter import LatestTrace, Rewriter

__all__ = ["LMSModel", "enable_lms", "KerasLMS"]

log = logging.getLogger(__name__)

_JIT_MESSAGE = ("LMS cannot rewrite an XLA-compiled step (jit_compile=True bypasses graph-level swap ops); "
                "compile the model with jit_compile=False")


class KerasLMS(LatestTrace):
    """LMS state of one Keras model: config, and what the latest traced train step swapped.

    Under a ``tf.distribute`` strategy each replica's train step is rewritten on
    its own; `summary` is the latest replica's.

    Attributes:
        config: the `LMSConfig`.
        swap_ops: ``"emulated"`` or ``"device"``.
    """

    def __init__(self, config: Any, *, emulate: bool | None = None, bandwidth: float | None = None,
                 device: str | None = None, owner: str = "model.fit", budget: Any = None,
                 margin: float = DEFAULT_MARGIN, batch_size: int | None = None, check: bool = True) -> None:
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size < 1):
            raise ValueError(f"batch_size={batch_size!r}: must be an integer >= 1 (the batch fit runs at)")
        self._rewriter = Rewriter(config, emulate=emulate, bandwidth=bandwidth, device=device, owner=owner,
                                   budget=budget, margin=margin, check=check)
        self.batch_size = batch_size
        self.fit_batch: int | None = None  # the batch of the latest ``fit`` call, when it says one
        self.peak_check: FitPeakCheck | None = None  # the latest ``fit``'s (`lms.tf.fit_peaks`)
        elsewhere = tuned_elsewhere(self._rewriter.config, "model.fit") if self._rewriter.auto is None else ""
        if elsewhere:
            log.warning("LMS: %s: %s", owner, elsewhere)

    def _budget(self) -> tuple[int, str] | None:
        """The budget fit's peak is held to: config='auto''s, or a loaded recommendation's; None: none known."""
        rw = self._rewriter
        if rw.auto is not None:
            choice = rw.last.summary.auto if rw.last is not None else None
            if choice is None:
                return None
            return choice.budget_bytes, f"the {format_size(choice.budget_bytes)} budget config='auto' chose for"
        tuned = rw.config.tuned
        if not tuned or not tuned.get("usable_bytes"):
            return None
        return (int(tuned["usable_bytes"]), f"the {format_size(int(tuned['usable_bytes']))} it was tuned to fit "
                f"({tuned.get('path', 'recommended.json')})")

    def check_fit(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """``fit``'s arguments, with a `FitPeakCheck` added when a budget is known (config='auto', or a
        loaded recommendation)."""
        self.peak_check = None
        if self._rewriter.auto is None and not (self._rewriter.config.tuned or {}).get("usable_bytes"):
            return args, kwargs

        def batch() -> int | None:
            summary = self.summary
            return (summary.batch_size if summary is not None else None) or self.fit_batch

        self.peak_check = FitPeakCheck(self._budget, batch, owner=self._rewriter.owner)
        return with_callback(args, kwargs, self.peak_check)

    def train_step(self, model: Any, train_step: Any, data: Any) -> Any:
        """Run Keras' `train_step` (during tracing) and rewrite what it built.

        Keras traces the step with an unknown batch dimension; with ``config="auto"``
        the batch planned for is `batch_size`, else the latest ``fit``'s.
        """
        if model.jit_compile:
            raise ValueError(_JIT_MESSAGE)
        with self._rewriter.session((data,), {}, batch_hint=self.batch_size or self.fit_batch) as session:
            logs = session.returns(train_step(data))
        return logs


    def raise_pending(self) -> None:
        """Re-raise an lms error raised while Keras traced the step (AutoGraph wraps it in a StagingError)."""
        pending, self._rewriter.pending_error = self._rewriter.pending_error, None
        if pending is not None:
            raise pending from None


def _fit_batch(args: tuple, kwargs: dict) -> int | None:
    """The batch ``Model.fit(x, y, batch_size, ...)`` will run at, where the call says it: ``batch_size``, or
    Keras' default 32 for arrays; None for a dataset or generator (they batch themselves)."""
    batch = kwargs.get("batch_size", args[2] if len(args) > 2 else None)
    if batch is not None:
        return int(batch)
    x = kwargs.get("x", args[0] if args else None)
    return 32 if hasattr(x, "shape") and hasattr(x, "dtype") else None


def _check_compile_kwargs(kwargs: dict[str, Any]) -> None:
    if kwargs.get("jit_compile") is True:
        raise ValueError(_JIT_MESSAGE)


def _turn_off_xla(model: Any) -> None:
    """After ``compile``: ``jit_compile`` off (Keras' ``"auto"`` means XLA on a GPU).

    Set on the model rather than passed to ``compile``: a model may define its
    own ``compile`` without that argument (keras-io's GAN examples).
    """
    if getattr(model, "jit_compile", False):
        log.debug("LMS: jit_compile -> False (XLA would bypass the swap ops)")
        model.jit_compile = False


def _functional_arguments(args: tuple, kwargs: dict) -> bool:
    """The call looks like ``Model(inputs, outputs)`` (Keras' own test)."""
    return (len(args) == 2 or (len(args) == 1 and "outputs" in kwargs)
            or ("inputs" in kwargs and "outputs" in kwargs))


class LMSModel(keras.Model):
    """A ``keras.Model`` whose ``fit`` swaps activations to host memory.

    Subclass it and define ``call`` (as with ``keras.Model``), or call it with
    ``inputs`` and ``outputs``: that returns a functional ``keras.Model`` with
    `enable_lms` applied (Keras would otherwise turn the class itself into a
    functional model for good, breaking later subclasses).

    Args:
        *args, **kwargs: as for ``keras.Model``.
        lms_config: the `LMSConfig` (or a dict of its fields); default: all
            candidates, just in time (``LMSConfig()``).
        lms_emulate: emulated swap ops; default: when no GPU is visible.
        lms_bandwidth: bytes/s of the emulated link, or None.
        lms_budget / lms_batch_size: with ``lms_config="auto"``, as `enable_lms`'s
            ``budget`` and ``batch_size``.

    The LMS state (summary, plan) is ``model.lms``.
    """

    def __new__(cls, *args: Any, lms_config: Any = None, lms_emulate: bool | None = None,
                lms_bandwidth: float | None = None, lms_budget: Any = None, lms_batch_size: int | None = None,
                **kwargs: Any) -> Any:
        if _functional_arguments(args, kwargs):
            return enable_lms(keras.Model(*args, **kwargs), LMSConfig() if lms_config is None else lms_config,
                              emulate=lms_emulate, bandwidth=lms_bandwidth, budget=lms_budget,
                              batch_size=lms_batch_size)
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, *args: Any, lms_config: Any = None, lms_emulate: bool | None = None,
                 lms_bandwidth: float | None = None, lms_budget: Any = None, lms_batch_size: int | None = None,
                 **kwargs: Any) -> None:
        state = KerasLMS(LMSConfig() if lms_config is None else lms_config, emulate=lms_emulate,
                         bandwidth=lms_bandwidth, owner=f"{type(self).__name__}.fit", budget=lms_budget,
                         batch_size=lms_batch_size)
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "_lms_state", state)

    @property
    def lms(self) -> KerasLMS:
        return self._lms_state

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """``keras.Model.compile`` with ``jit_compile`` forced off (True is refused)."""
        _check_compile_kwargs(kwargs)
        super().compile(*args, **kwargs)
        _turn_off_xla(self)

    def train_step(self, data: Any) -> Any:
        return self._lms_state.train_step(self, super().train_step, data)

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        """``keras.Model.fit``; the batch it runs at is noted for ``config="auto"``."""
        self._lms_state.fit_batch = _fit_batch(args, kwargs)
        args, kwargs = self._lms_state.check_fit(args, kwargs)
        try:
            return super().fit(*args, **kwargs)
        except Exception:
            self._lms_state.raise_pending()
            raise


def enable_lms(model: Any, config: Any, *, emulate: bool | None = None, bandwidth: float | None = None,
               device: str | None = None, budget: Any = None, margin: float = DEFAULT_MARGIN,
               batch_size: int | None = None, check: bool = True) -> Any:
    """Turn on LMS for an existing Keras model's ``fit`` (in place); returns the model.

    Works before or after ``compile``: a later ``compile`` gets ``jit_compile``
    forced off (True is refused); an earlier one that resolved to XLA is
    switched off with a warning. Calling it again replaces the config.
    The LMS state (summary, plan) is ``model.lms``.

    Args:
        model: a ``keras.Model`` (TensorFlow backend).
        config: an `LMSConfig`, a dict of its fields, or a config file's path (a tuner
            ``studies/<study>/recommended.json`` too; the batch it was tuned for is logged);
            or ``"auto"`` (see `lms.function`): the config is chosen when ``fit`` traces
            its step, for the batch ``fit`` runs at (its ``batch_size``, Keras' default 32
            for arrays, or `batch_size` here for a dataset that batches itself).
        emulate / bandwidth / device / budget / margin / check: as for `lms.function`.
        batch_size: with ``config="auto"``: the batch to plan for when ``fit`` does not
            say it (a ``tf.data`` dataset).
    """
    if not isinstance(model, keras.Model):
        raise ValueError(f"enable_lms needs a keras.Model, got {type(model).__name__}")
    state = KerasLMS(config, emulate=emulate, bandwidth=bandwidth, device=device,
                     owner=f"{model.name}.fit", budget=budget, margin=margin, batch_size=batch_size, check=check)
    original_step = model.__dict__.get("_lms_original_train_step") or model.train_step
    original_compile = model.__dict__.get("_lms_original_compile") or model.compile
    original_fit = model.__dict__.get("_lms_original_fit") or model.fit

    def fit(*args: Any, **kwargs: Any) -> Any:
        state.fit_batch = _fit_batch(args, kwargs)
        args, kwargs = state.check_fit(args, kwargs)
        try:
            return original_fit(*args, **kwargs)
        except Exception:
            state.raise_pending()
            raise

    def train_step(data: Any) -> Any:
        return state.train_step(model, original_step, data)

    def compile(*args: Any, **kwargs: Any) -> None:  # noqa: A001 - mirrors the model's compile
        _check_compile_kwargs(kwargs)
        original_compile(*args, **kwargs)
        _turn_off_xla(model)

    for name, value in (("_lms_original_train_step", original_step), ("_lms_original_compile", original_compile),
                        ("_lms_original_fit", original_fit), ("_lms_state", state), ("lms", state),
                        ("train_step", train_step), ("compile", compile), ("fit", fit)):
        object.__setattr__(model, name, value)
    if getattr(model, "compiled", False) and model.jit_compile:
        log.warning("LMS: turning off XLA (jit_compile) for %s: it would bypass the swap ops", model.name)
        model.jit_compile = False
    model.train_function = None  # rebuilt by the next fit with the wrapped train_step
    return model
