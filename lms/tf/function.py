"""`lms.function`: a drop-in for ``tf.function`` that applies LMS to a training step.

While TensorFlow traces the step, ``tf.GradientTape.gradient`` is recorded
(`lms.tf.train.record_gradients`: which tensor is the loss, which ops are the
backward pass; the patch is active only while an LMS step is being traced).
When the step's Python function returns, still inside the trace (so after
``apply_gradients`` too), the graph built so far is read into the graph model
(`lms.tf.extract.extract_graph`), planned (`lms.plan_swaps`), its triggers
anchored where Grappler would otherwise optimize differently
(`lms.plan.anchor.anchor_triggers`), checked (`SwapPlan.validate`) and applied
(`lms.tf.apply.apply_plan`). TensorFlow then adds its automatic control
dependencies and turns the edited graph into the function it runs::

    @lms.function(config=lms.LMSConfig(n_tensors=-1, lb=3))
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    train_step(x, y)
    train_step.summary.n_swapped   # tensors swapped in the traced graph

Every (re)trace is planned again for its own graph, unless its forward and
backward ops are those of an earlier trace (Keras traces ``train_step`` twice
under ``fit``): then that trace's plan is applied again, with the corrections
the equivalence check (`lms.tf.equivalence`) made to it. `plan`, `graph` and
`summary` describe the latest trace.
"""

from __future__ import annotations

import functools
import logging
import threading
import types
import weakref
from typing import Any, Callable, Mapping

import tensorflow as tf
from tensorflow.python.trackable.base import SaveType, Trackable

from ..auto import AUTO, DEFAULT_MARGIN
from ..tuned import tuned_elsewhere
from .apply import AppliedPlan
from .auto import PeakCheck
from .batch import call_batch
from .rewriter import LatestTrace, Rewriter
from .summary import LMSSummary, SwappedTensor, as_config

__all__ = ["function", "LMSFunction", "LMSSummary", "SwappedTensor", "as_config"]

log = logging.getLogger(__name__)

_NOT_WHOLE = object()  # `LMSFunction._call_pinned_whole`: run the plain tf.function instead


class LMSFunction(LatestTrace, Trackable):
    """A ``tf.function`` whose traced graph swaps activations to host memory (see module docstring).

    Saving: ``tf.saved_model.save`` exports the step *without* LMS (`export_function`: the plain
    ``tf.function`` of the same Python function, traced for every input signature this step was traced
    with). LMS changes where tensors live, not the values the step computes, and the emulated swap
    ops (``tf.numpy_function``) cannot be loaded in another process. A ``tf.Module`` whose ``train``
    is an `LMSFunction` (an attribute, or a decorated method) loads with a callable ``train``; wrap it
    in `lms.function` again after loading to train with LMS.

    Attributes:
        config: the `LMSConfig`.
        swap_ops: ``"emulated"`` or ``"device"``.
    """

    def __init__(self, fn: Callable, *, config: Any, emulate: bool | None = None,
                 bandwidth: float | None = None, device: str | None = None, pin_whole: bool | None = None,
                 budget: Any = None, margin: float = DEFAULT_MARGIN, check: bool = True,
                 **tf_function_kwargs: Any) -> None:
        if not callable(fn):
            raise ValueError(f"lms.function needs a callable, got {type(fn).__name__}")
        if tf_function_kwargs.get("jit_compile"):
            raise ValueError("lms.function: jit_compile=True is not supported: XLA compiles the step as one "
                             "cluster and bypasses graph-level swap ops; use jit_compile=False or None")
        if pin_whole not in (None, True, False):
            raise ValueError(f"pin_whole={pin_whole!r}: allowed values are None (when possible), True, False")
        name = getattr(fn, "__name__", "step")
        self._rewriter = Rewriter(config, emulate=emulate, bandwidth=bandwidth, device=device,
                                   owner=f"lms.function({name})", pin_whole=pin_whole is not False,
                                   budget=budget, margin=margin, check=check)
        elsewhere = tuned_elsewhere(self._rewriter.config, "lms.function") if self._rewriter.auto is None else ""
        if elsewhere:
            log.warning("LMS: %s: %s", self._rewriter.owner, elsewhere)
        self._fn = fn
        self._options = {"emulate": emulate, "bandwidth": bandwidth, "device": device, "pin_whole": pin_whole,
                         "budget": budget, "margin": margin, "check": check, **tf_function_kwargs}
        self._bound: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._hint = threading.local()
        self._pin_whole = pin_whole
        # concrete function -> its step pinned whole (`lms.tf.exact.ExactStep`), or why it is not
        self._whole: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
        self._whole_lock = threading.Lock()
        self._peak_check = PeakCheck(self._rewriter.auto) if self._rewriter.auto is not None else None

        rewriter = self._rewriter
        hint = self._hint

        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            with rewriter.session(args, kwargs, batch_hint=getattr(hint, "batch", None)) as session:
                out = session.returns(fn(*args, **kwargs))
            return out

        self._tf_function = tf.function(traced, **tf_function_kwargs)
        self._tf_function_kwargs = dict(tf_function_kwargs)
        self._export: Any = None  # `export_function`, made when first asked for
        self._attribute: str | None = None  # the class attribute this decorates (`__set_name__`)
        functools.update_wrapper(self, fn)

    @tf.autograph.experimental.do_not_convert  # plain Python; the step itself is converted by its tf.function
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._hint.batch = call_batch(args, kwargs)
        try:
            if self._peak_check is not None:
                last = self._rewriter.last
                return self._peak_check.call(lambda: self._call(args, kwargs), owner=self._rewriter.owner,
                                             choice=last.summary.auto if last is not None else None)
            return self._call(args, kwargs)
        except Exception:
            pending, self._rewriter.pending_error = self._rewriter.pending_error, None
            if pending is not None:  # AutoGraph wrapped it while tracing: the user gets the error itself
                raise pending from None
            raise

    @property
    def auto_measured_peak_bytes(self) -> int | None:
        """With ``config="auto"``: TF's allocator peak of the step's second call (checked against the budget)."""
        return self._peak_check.measured_peak_bytes if self._peak_check is not None else None

    def _call(self, args: tuple, kwargs: dict) -> Any:
        if self._pin_whole is not False and (self._rewriter.auto is not None
                                             or self._rewriter.config.schedule == "memory"):
            out = self._call_pinned_whole(args, kwargs)
            if out is not _NOT_WHOLE:
                return out
        return self._tf_function(*args, **kwargs)

    def _call_pinned_whole(self, args: tuple, kwargs: dict) -> Any:
        """Run the step pinned whole (`lms.tf.exact`) when it can be; `_NOT_WHOLE` otherwise.

        Only for a call made eagerly, with no gradient tape recording it, outside
        a distribution strategy, on a machine without GPUs. The first call of
        each trace builds the pinned step (two dry runs on stand-in variables).
        """
        from tensorflow.python.eager import record

        if (not tf.executing_eagerly() or tf.config.functions_run_eagerly() or record.could_possibly_record()
                or tf.distribute.has_strategy()):
            return self._not_whole("the call is not eager (or functions run eagerly), is under a gradient tape "
                                   "or a distribution strategy")
        if tf.config.list_logical_devices("GPU"):
            return self._not_whole("a GPU is visible (the memory schedule is pinned through the pinnable ops there)")
        concrete = self._tf_function.get_concrete_function(*args, **kwargs)
        with self._whole_lock:
            entry = self._whole.get(concrete)
        try:
            from tensorflow.python.eager.polymorphic_function import function_type_utils

            bound = function_type_utils.canonicalize_function_inputs(args, kwargs, concrete.function_type)
            flat = concrete.function_type.unpack_inputs(bound)
        except Exception as exc:  # noqa: BLE001 -- TF internals: the plain call is always right
            return self._not_whole(f"its arguments could not be flattened ({type(exc).__name__})")
        if entry is None:
            entry = self._build_whole(concrete, flat)
            with self._whole_lock:
                self._whole[concrete] = entry
        if isinstance(entry, str):
            return self._not_whole(entry)
        return concrete.function_type.pack_output(entry(flat))

    def _build_whole(self, concrete: Any, flat: list) -> Any:
        """The `ExactStep` of `concrete`, or the reason it has none (logged once)."""
        from .exact import ExactUnavailable, build_exact_step

        trace = self._rewriter.traces.get(concrete.graph)
        if trace is not None and trace.plan.config.schedule != "memory":  # config="auto" chose TF's order
            return "its trace is not memory-scheduled"
        schedule = trace.schedule if trace is not None else None
        if schedule is None or not schedule.exact:
            reason = "its trace was not scheduled to be pinned whole (see lms.tf.exact.unpinnable_reason)"
            if trace is not None and trace.graph is not None:
                from .exact import unpinnable_reason

                reason = unpinnable_reason(concrete.graph) or reason
        else:
            try:
                return build_exact_step(concrete, flat, schedule.order, name=self._rewriter.owner)
            except ExactUnavailable as exc:
                reason = str(exc)
        if self._pin_whole:
            from .exact import ExactUnavailable

            raise ExactUnavailable(f"{self._rewriter.owner} cannot be pinned whole: {reason}")
        log.info("LMS: %s runs its memory schedule through the pinnable ops only: %s", self._rewriter.owner, reason)
        return reason

    def _not_whole(self, reason: str) -> Any:
        if self._pin_whole:
            from .exact import ExactUnavailable

            raise ExactUnavailable(f"{self._rewriter.owner} cannot be pinned whole: {reason}")
        return _NOT_WHOLE

    @property
    def pinned_whole(self) -> Any:
        """The latest-built `lms.tf.exact.ExactStep` (the step pinned whole), or None."""
        with self._whole_lock:
            steps = [v for v in self._whole.values() if not isinstance(v, str)]
        return steps[-1] if steps else None

    @property
    def whole_reason(self) -> str:
        """Why the latest trace runs without being pinned whole ('' if it is, or nothing was tried)."""
        with self._whole_lock:
            reasons = [v for v in self._whole.values() if isinstance(v, str)]
        return reasons[-1] if reasons else ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._attribute = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        """Used as a method decorator: one `LMSFunction` per instance, bound to it (and, on a ``tf.Module``,
        tracked under the method's name, so that ``tf.saved_model.save`` exports it)."""
        if instance is None:
            return self
        bound = self._bound.get(instance)
        if bound is None:
            config = AUTO if self._rewriter.auto is not None else self._rewriter.config
            bound = LMSFunction(types.MethodType(self._fn, instance), config=config, **self._options)
            self._bound[instance] = bound
            if self._attribute and isinstance(instance, Trackable):
                instance._track_trackable(bound, name=self._attribute, overwrite=True)
        return bound

    @property
    def export_function(self) -> Any:
        """The step without LMS: a plain ``tf.function`` of the same Python function and options, traced for
        every input signature this step was traced with. What ``tf.saved_model.save`` exports (see the class
        docstring); give it as ``signatures=`` or assign it to a module's attribute to export it yourself."""
        if self._export is None:
            self._export = tf.function(self._fn, **self._tf_function_kwargs)
        if self._tf_function_kwargs.get("input_signature") is None:  # with one, the export traces it itself
            for concrete in self._tf_function._list_all_concrete_functions():
                args, kwargs = concrete.structured_input_signature
                self._export.get_concrete_function(*args, **kwargs)
        return self._export

    def _trackable_children(self, save_type: Any = SaveType.CHECKPOINT, **kwargs: Any) -> dict[str, Any]:
        """In a SavedModel: ``__call__``, the step without LMS (`export_function`), so that the loaded object
        is callable. In a checkpoint: nothing (the step holds no variables of its own)."""
        if save_type != SaveType.SAVEDMODEL:
            return {}
        return {"__call__": self.export_function}

    def get_concrete_function(self, *args: Any, **kwargs: Any) -> Any:
        """Trace (with LMS applied) and return the concrete function, like ``tf.function``'s."""
        self._hint.batch = call_batch(args, kwargs)
        try:
            return self._tf_function.get_concrete_function(*args, **kwargs)
        except Exception:
            pending, self._rewriter.pending_error = self._rewriter.pending_error, None
            if pending is not None:
                raise pending from None
            raise

    @property
    def python_function(self) -> Callable:
        return self._fn

    @property
    def tf_function(self) -> Any:
        """The underlying ``tf.function``."""
        return self._tf_function

    @property
    def applied(self) -> AppliedPlan | None:
        last = self._rewriter.last
        return last.applied if last else None

    @property
    def timings(self) -> Mapping[str, float] | None:
        """Seconds the latest trace spent in ``extract_s``, ``plan_s`` (plan, anchor, validate), ``apply_s``,
        ``check_s`` (`lms.tf.equivalence`) and ``schedule_s``."""
        last = self._rewriter.last
        return dict(last.timings) if last else None


def function(fn: Callable | None = None, *, config: Any, emulate: bool | None = None,
             bandwidth: float | None = None, device: str | None = None, pin_whole: bool | None = None,
             budget: Any = None, margin: float = DEFAULT_MARGIN, check: bool = True,
             **tf_function_kwargs: Any) -> Any:
    """``tf.function`` for a training step, with Large Model Support.

    Use as ``lms.function(step, config=...)`` or ``@lms.function(config=...)``.

    Args:
        fn: the step: forward pass, ``tf.GradientTape``, optimizer update.
        config: an `LMSConfig` (or a dict of its fields, or a config file's path), or
            ``"auto"``: at each trace, the config the simulator predicts fastest among
            those that fit `budget` at the traced batch (`lms.auto.choose_config`);
            ``summary.config`` and ``summary.auto`` say what was chosen and why.
        emulate: emulated swap ops (`lms.tf.emulate`) instead of real host copies;
            default: emulate when no GPU is visible.
        bandwidth: bytes/s of the emulated link (emulated swap ops sleep
            nbytes/bandwidth); None: no sleep.
        device: device for emulated swap-ins whose readers have no device set
            (default: GPU:0 if present, else CPU:0). Real swap-ins sit on the
            host, so that their copy back waits for their trigger (`lms.tf.apply`).
        pin_whole: with ``schedule="memory"``, run the step's executed graph
            pinned whole (`lms.tf.exact`: every op of TF's optimized graph on
            one chain, Grappler off; one CPU device): ``None`` (default) when
            the step allows it, ``True`` always (ExactUnavailable otherwise),
            ``False`` never (pins through the pinnable ops only).
        budget: with ``config="auto"``: device memory the step may use, bytes or a
            size such as ``"14GiB"``; default on a GPU: its memory less what others
            hold and a reserve (`lms.tf.auto.default_gpu_budget`); required without one.
        margin: with ``config="auto"``: fraction of `budget` kept free (default 5%).
        check: compare what Grappler makes of the traced step with and without
            LMS and correct the plan where they differ (`lms.tf.equivalence`;
            `LMSSummary.corrections` says what changed). ``False`` skips the check
            (it costs two offline Grappler runs per trace).
        **tf_function_kwargs: passed to ``tf.function`` (``jit_compile=True`` is refused).

    Returns:
        An `LMSFunction` (or a decorator making one).

    Raises:
        ValueError: invalid config, bandwidth or budget, ``jit_compile=True``; on the
            first call, a step that computes no gradients.
        lms.auto.NoConfigFits: with ``config="auto"``, at a trace, when no config
            fits (the message names a batch that would).
    """
    if fn is None:
        return lambda f: LMSFunction(f, config=config, emulate=emulate, bandwidth=bandwidth, device=device,
                                     pin_whole=pin_whole, budget=budget, margin=margin, check=check,
                                     **tf_function_kwargs)
    return LMSFunction(fn, config=config, emulate=emulate, bandwidth=bandwidth, device=device,
                       pin_whole=pin_whole, budget=budget, margin=margin, check=check, **tf_function_kwargs)
