"""The workload contract: what the tuner trains, and how a spec string becomes one.

A `Workload` bundles a model builder, a loss, an optimizer factory, the input
and label shapes, and a synthetic batch generator. The tuner loads one with
`load_workload(spec, **options)`, where ``spec`` is a built-in name
(`builtin_names()`) or a user factory::

    "resnet50"                                  built-in, options as keywords
    "examples.user_model:make_workload"         module:function
    "path/to/file.py:make_workload"             file:function

This module imports no TensorFlow: workload modules import it inside the
functions they hand over (`build_model`, `loss_fn`, `make_optimizer`), so the
tuner's parent process can load and describe workloads without paying for TF.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import json
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

__all__ = [
    "Workload", "load_workload", "builtin_names", "describe_builtins", "parse_options",
    "sparse_softmax_cross_entropy", "int_option", "float_option",
]

from .parts import (adam, batch_leaves, batch_structure, nbytes, sgd,  # noqa: F401 - factories import them here
                    sparse_softmax_cross_entropy)

logger = logging.getLogger(__name__)

# Dtype names a workload may declare for its inputs and labels.
DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")

# Built-in name -> "module:function" of its factory (modules import TF lazily).
_BUILTINS: dict[str, str] = {
    "mlp": "tuner.models.small:mlp",
    "cnn_bn": "tuner.models.small:cnn_bn",
    "residual": "tuner.models.small:residual",
    "resnet50": "tuner.models.resnet:resnet50",
    "unet3d": "tuner.models.unet3d:unet3d",
    "gpt2_small": "tuner.models.transformer:gpt2_small",
}


@dataclass(frozen=True, kw_only=True)
class Workload:
    """A trainable model with synthetic data: what one tuner trial runs.

    Three forms, by what the tuner trains (`form`):

    - ``"step"`` (`build_model`, `loss_fn`, `make_optimizer`, the shapes): the tuner's own step,
      forward, ``tf.GradientTape`` and ``apply_gradients``, traced with an unknown batch
      dimension and measured under the single-threaded executor on the emulated device;
    - ``"fit"`` (`fit_model`, `make_batch`): the user's ``model.fit``, as their script runs it:
      ``fit_model()`` returns the compiled ``keras.Model`` (its own ``train_step``, its
      ``compile`` settings, several optimizers); each trial runs ``lms.enable_lms`` and
      ``model.fit`` on a ``tf.data`` pipeline of ``make_batch(batch)`` (a fixed batch dimension)
      under TensorFlow's default executor, and measures every step's peak;
    - ``"train_step"`` (`train_step`, `make_batch`): a custom loop's step: ``train_step()``
      returns an undecorated callable that owns its models and optimizers; trials wrap it with
      ``lms.function`` and call it on ``make_batch(batch)`` (``step(*batch)`` for a tuple,
      else ``step(batch)``) at a fixed batch, under the default executor.

    In the program forms, ``make_batch(batch_size, seed=0)`` returns one batch as the program
    receives it: an array, a tuple (``(x, y)``), or a dict of arrays, each with the batch as its
    first dimension; shapes and dtypes come from it (`x_shape` and the rest are not given).

    Attributes:
        name: short identifier, e.g. ``"resnet50"``.
        description: one line for reports.
        build_model: ``() -> keras.Model``, a fresh model each call (import
            TensorFlow/Keras inside it).
        loss_fn: ``(y_true, y_pred) -> scalar tensor``, the mean loss of a
            batch; called while tracing the train step, so it may import Keras
            inside. It is the loss itself, not a factory of losses.
        make_optimizer: ``() -> keras optimizer``, a fresh optimizer each call.
        x_shape, y_shape: one sample's input and label shape (no batch dim).
        x_dtype, y_dtype: their dtype names (see `DTYPES`).
        make_batch: ``(batch_size, seed=0) -> (x, y)`` numpy arrays of shape
            ``(batch_size, *x_shape)`` / ``(batch_size, *y_shape)`` with valid
            labels; deterministic for a given seed.
        default_batch: a small batch size that trains quickly on a CPU.
        options: the knobs this workload was built with (JSON-ready values).
        growable: integer options that scale the input (an image's side, a volume's, a
            sequence's length) and the step their values take, e.g. ``{"image_size": 32}``:
            what ``tuner search --batch N --grow OPTION`` may grow (values are multiples of
            the step).
        spec: the string `load_workload` resolved (filled in by the loader).
        fit_model: ``() -> keras.Model``, compiled (form ``"fit"``).
        train_step: ``() -> step callable`` (form ``"train_step"``).
    """

    name: str
    description: str
    make_batch: Callable[..., Any]
    build_model: Callable[[], Any] | None = None
    loss_fn: Callable[[Any, Any], Any] | None = None
    make_optimizer: Callable[[], Any] | None = None
    x_shape: tuple[int, ...] = ()
    y_shape: tuple[int, ...] = ()
    x_dtype: str = "float32"
    y_dtype: str = "int32"
    fit_model: Callable[[], Any] | None = None
    train_step: Callable[[], Any] | None = None
    default_batch: int = 8
    options: Mapping[str, Any] = field(default_factory=dict)
    growable: Mapping[str, int] = field(default_factory=dict)
    spec: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Workload.name={self.name!r}: must be a non-empty string")
        if not isinstance(self.description, str):
            raise ValueError(f"Workload.description={self.description!r}: must be a string")
        if not callable(self.make_batch):
            raise ValueError(f"Workload.make_batch={self.make_batch!r}: must be callable")
        self._check_form()
        for fname in ("x_shape", "y_shape"):
            value = getattr(self, fname)
            if self.form != "step" and value in ((), []):
                continue
            if not isinstance(value, (tuple, list)) or not all(
                    isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in value):
                raise ValueError(
                    f"Workload.{fname}={value!r}: must be a tuple of positive ints (one sample, no batch dim)")
            object.__setattr__(self, fname, tuple(value))
        for fname in ("x_dtype", "y_dtype"):
            value = getattr(self, fname)
            if value not in DTYPES:
                raise ValueError(f"Workload.{fname}={value!r}: allowed dtypes are " + ", ".join(DTYPES))
        if isinstance(self.default_batch, bool) or not isinstance(self.default_batch, int) \
                or self.default_batch < 1:
            raise ValueError(f"Workload.default_batch={self.default_batch!r}: must be an integer >= 1")
        if not isinstance(self.options, Mapping):
            raise ValueError(f"Workload.options={self.options!r}: must be a mapping of option name to value")
        object.__setattr__(self, "options", dict(self.options))
        if not isinstance(self.growable, Mapping):
            raise ValueError(f"Workload.growable={self.growable!r}: must map option names to steps")
        for name, step in self.growable.items():
            if name not in self.options or isinstance(self.options[name], bool) \
                    or not isinstance(self.options[name], int):
                raise ValueError(f"Workload.growable: {name!r} is not an integer option of this workload")
            if isinstance(step, bool) or not isinstance(step, int) or step < 1:
                raise ValueError(f"Workload.growable[{name!r}]={step!r}: the step must be an integer >= 1")
        object.__setattr__(self, "growable", dict(self.growable))

    @property
    def form(self) -> str:
        """``"step"`` (the tuner's own step), ``"fit"`` (the user's ``model.fit``) or ``"train_step"`` (their step)."""
        if self.fit_model is not None:
            return "fit"
        if self.train_step is not None:
            return "train_step"
        return "step"

    def _check_form(self) -> None:
        step_parts = {f: getattr(self, f) for f in ("build_model", "loss_fn", "make_optimizer")}
        given = [f for f in ("fit_model", "train_step") if getattr(self, f) is not None]
        if len(given) > 1:
            raise ValueError("Workload: give fit_model= or train_step=, not both")
        if given:
            if not callable(getattr(self, given[0])):
                raise ValueError(f"Workload.{given[0]}={getattr(self, given[0])!r}: must be callable")
            extra = [f for f, v in step_parts.items() if v is not None]
            if extra:
                raise ValueError(f"Workload: {given[0]}= is the whole program; {', '.join(extra)} belong to the "
                                 "tuner's own step (give one form: build_model/loss_fn/make_optimizer, "
                                 "fit_model or train_step)")
            return
        for fname, value in step_parts.items():
            if not callable(value):
                raise ValueError(f"Workload.{fname}={value!r}: must be callable (or give fit_model= or "
                                 "train_step= with make_batch= for your own program)")

    @property
    def program(self) -> str:
        """What a trial runs, in words: ``"model.fit"``, ``"lms.function"`` or ``"the tuner's step"``."""
        return {"fit": "model.fit", "train_step": "lms.function"}.get(self.form, "the tuner's step")

    def x_spec(self, *, batch_size: int | None = None) -> Any:
        """``tf.TensorSpec`` of an input batch (batch dim ``None`` unless given)."""
        import tensorflow as tf

        return tf.TensorSpec((batch_size, *self.x_shape), self.x_dtype, name="x")

    def y_spec(self, *, batch_size: int | None = None) -> Any:
        """``tf.TensorSpec`` of a label batch (batch dim ``None`` unless given)."""
        import tensorflow as tf

        return tf.TensorSpec((batch_size, *self.y_shape), self.y_dtype, name="y")

    def sample_bytes(self) -> int:
        """Bytes of one sample's input plus label (bfloat16 counted as 2 bytes); a program's from one batch."""
        if self.form != "step":
            return sum(int(a.nbytes) for a in batch_leaves(self.make_batch(1, 0)))
        return nbytes(self.x_shape, self.x_dtype) + nbytes(self.y_shape, self.y_dtype)

    def batch_structure(self, batch_size: int = 1) -> Any:
        """A program's batch as ``fit`` or the step receives it, each array as ``[shape, dtype]``."""
        return batch_structure(self.make_batch(batch_size, 0))

    def check_batch(self, x: Any, y: Any, batch_size: int) -> None:
        """Raise ValueError unless ``(x, y)`` has this workload's shapes and dtypes."""
        for label, arr, shape, dtype in (("x", x, self.x_shape, self.x_dtype),
                                         ("y", y, self.y_shape, self.y_dtype)):
            got_shape = tuple(int(d) for d in arr.shape)
            got_dtype = getattr(arr.dtype, "name", str(arr.dtype))
            if got_shape != (batch_size, *shape) or got_dtype != dtype:
                raise ValueError(
                    f"workload {self.name!r}: make_batch({batch_size}) gave {label} of shape {got_shape} "
                    f"dtype {got_dtype}; expected shape {(batch_size, *shape)} dtype {dtype}")

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary for trial records and reports."""
        out = {"name": self.name, "spec": self.spec or self.name, "description": self.description,
               "form": self.form, "program": self.program,
               "default_batch": self.default_batch, "options": dict(self.options),
               "growable": dict(self.growable)}
        if self.form == "step":
            out.update({"x_shape": list(self.x_shape), "x_dtype": self.x_dtype,
                        "y_shape": list(self.y_shape), "y_dtype": self.y_dtype})
        else:
            out["batch"] = self.batch_structure(1)
        return out


# ---------------------------------------------------------------- the registry

def builtin_names() -> tuple[str, ...]:
    """Names of the built-in workloads, smallest first."""
    return tuple(_BUILTINS)


def describe_builtins() -> dict[str, str]:
    """Built-in name -> one-line description (the factory docstring's first line)."""
    out = {}
    for name in _BUILTINS:
        doc = inspect.getdoc(_builtin_factory(name)) or ""
        out[name] = doc.splitlines()[0] if doc else ""
    return out


def _builtin_factory(name: str) -> Callable[..., Workload]:
    module_name, func_name = _BUILTINS[name].split(":")
    return getattr(importlib.import_module(module_name), func_name)


# ------------------------------------------------------------------ the loader

def load_workload(spec: str, **options: Any) -> Workload:
    """Resolve a built-in name, ``module:function`` or ``file.py:function``.

    Options are passed to the factory as keyword arguments. For a module spec
    the current directory is also searched (as ``python -m`` does), so
    ``examples.user_model:make_workload`` works from the project root.

    Raises:
        ValueError: one line naming what is wrong: an unknown name (with the
            built-ins), a module or file that cannot be imported (with the
            error), a missing attribute, an unknown or invalid option, or a
            factory that did not return a `Workload`.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"model spec {spec!r} is empty; use a built-in name ({_builtin_list()}) "
                         "or 'package.module:function' / 'path/to/file.py:function'")
    spec = spec.strip()
    if spec in _BUILTINS:
        factory, where = _builtin_factory(spec), f"workload {spec!r}"
    elif ":" in spec:
        factory, where = _resolve_user_factory(spec), spec
    elif spec.endswith(".py"):
        raise ValueError(f"model spec {spec!r} names a file but no function; use '{spec}:function_name'")
    else:
        raise ValueError(f"unknown model {spec!r}; built-ins: {_builtin_list()}; "
                         "or give a user factory as 'package.module:function' or 'path/to/file.py:function'")
    _check_options(factory, options, where)
    try:
        workload = factory(**options)
    except ValueError as exc:
        # Built-in factories already name themselves ("unet3d: option ...").
        message = _one_line(exc)
        raise ValueError(message if spec in _BUILTINS else f"{where}: {message}") from exc
    except Exception as exc:  # user code: report it in one line, keep the traceback chained
        raise ValueError(f"{where} raised {type(exc).__name__}: {_one_line(exc)}") from exc
    if not isinstance(workload, Workload):
        raise ValueError(f"{where} returned {type(workload).__module__}.{type(workload).__qualname__}; "
                         "expected tuner.models.Workload")
    changes: dict[str, Any] = {}
    if not workload.spec:
        changes["spec"] = spec
    if not workload.options and options:
        changes["options"] = dict(options)
    return dataclasses.replace(workload, **changes) if changes else workload


def _resolve_user_factory(spec: str) -> Callable[..., Any]:
    target, _, func_name = spec.rpartition(":")
    if not target or not func_name:
        raise ValueError(f"model spec {spec!r}: expected 'package.module:function' or 'path/to/file.py:function'")
    if not func_name.isidentifier():
        raise ValueError(f"model spec {spec!r}: {func_name!r} is not a Python function name")
    is_path = target.endswith(".py") or "/" in target or os.sep in target
    module = _import_file(target) if is_path else _import_module(target)
    if not hasattr(module, func_name):
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                        and getattr(v, "__module__", None) == module.__name__)
        raise ValueError(f"{target!r} has no attribute {func_name!r}"
                         + (f"; it defines: {', '.join(public)}" if public else ""))
    factory = getattr(module, func_name)
    if not callable(factory):
        raise ValueError(f"{target}:{func_name} is a {type(factory).__name__}, not a function returning "
                         "tuner.models.Workload")
    return factory


def _import_module(name: str) -> Any:
    if not all(part.isidentifier() for part in name.split(".")):
        raise ValueError(f"cannot import module {name!r}: not a dotted module name "
                         "(for a file, give a path ending in .py)")
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        cwd = os.getcwd()
        missing_self = exc.name is not None and (name == exc.name or name.startswith(exc.name + "."))
        if missing_self and cwd not in sys.path and "" not in sys.path:
            # As `python -m` would: let the project's own folders be found.
            sys.path.append(cwd)
            logger.debug("added %s to sys.path to import %s", cwd, name)
            try:
                return importlib.import_module(name)
            except Exception as retry_exc:
                exc = retry_exc  # type: ignore[assignment]
        raise ValueError(f"cannot import module {name!r}: {type(exc).__name__}: {_one_line(exc)}") from exc
    except Exception as exc:
        raise ValueError(f"cannot import module {name!r}: {type(exc).__name__}: {_one_line(exc)}") from exc


def _import_file(target: str) -> Any:
    path = Path(target).expanduser().resolve()
    if not path.is_file():
        raise ValueError(f"cannot import {target!r}: no such file (resolved to {path})")
    if path.suffix != ".py":
        raise ValueError(f"cannot import {target!r}: a model file must end in .py")
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    module_name = f"_tuner_user_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"cannot import {target!r}: not a loadable Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up
    # As `python file.py` would: modules beside the file can be imported while it loads.
    folder = str(path.parent)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise ValueError(f"cannot import {target!r}: {type(exc).__name__}: {_one_line(exc)}") from exc
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)
    return module


def _check_options(factory: Callable[..., Any], options: Mapping[str, Any], where: str) -> None:
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(**options)
    except TypeError as exc:
        accepted = [p.name for p in signature.parameters.values()
                    if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
        unknown = [k for k in options if k not in accepted]
        if unknown and not any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values()):
            raise ValueError(f"{where} has no option {unknown[0]!r}; options: "
                             + (", ".join(accepted) or "none")) from None
        raise ValueError(f"{where}: bad options: {_one_line(exc)}") from None


def _builtin_list() -> str:
    return ", ".join(_BUILTINS)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


# ------------------------------------------------------- helpers for factories

def parse_options(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Parse ``["image_size=64", "name=x"]`` into ``{"image_size": 64, "name": "x"}``.

    Values are read as JSON where possible (ints, floats, true/false, lists),
    else kept as strings. For CLI flags like ``--model-option KEY=VALUE``.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ValueError(f"model option {item!r}: expected KEY=VALUE, e.g. image_size=64")
        shown = raw if len(raw) <= 40 else raw[:30] + f"... ({len(raw)} characters)"
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
        except RecursionError:
            raise ValueError(f"model option {key}={shown}: nested too deeply; give a number, a string or "
                             "a short JSON list") from None
        if not _finite(out[key]):  # 1e400 reads as inf, Infinity and NaN as themselves: none is JSON data
            raise ValueError(f"model option {key}={shown} is not a finite number (it reads as "
                             f"{_shown_value(out[key])}); give a finite number")
    return out


def _finite(value: Any) -> bool:
    """False when `value` is, or holds (in lists and objects), an infinite or NaN float."""
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


def _shown_value(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:30] + "..."


def int_option(workload: str, name: str, value: Any, *, minimum: int = 1) -> int:
    """Check that an option is an integer >= `minimum` (ValueError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{workload}: option {name}={value!r} must be an integer >= {minimum}")
    if value < minimum:
        raise ValueError(f"{workload}: option {name}={value!r} is too small; allowed: an integer >= {minimum}")
    return int(value)


def float_option(workload: str, name: str, value: Any, *, minimum: float = 0.0,
                 inclusive: bool = False) -> float:
    """Check that an option is a number > `minimum` (>= when `inclusive`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{workload}: option {name}={value!r} must be a number")
    ok = value >= minimum if inclusive else value > minimum
    if not ok:
        bound = ">=" if inclusive else ">"
        raise ValueError(f"{workload}: option {name}={value!r} out of range; allowed: a number {bound} {minimum}")
    return float(value)


def random_labels(rng: np.random.Generator, shape: tuple[int, ...], num_classes: int) -> np.ndarray:
    """Uniform class ids in ``[0, num_classes)`` as int32."""
    return rng.integers(0, num_classes, size=shape, dtype=np.int32)


def image_classification_batch(batch_size: int, seed: int = 0, *, name: str, x_shape: tuple[int, ...],
                               num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Standard-normal float32 images and uniform int32 class ids (a `make_batch`)."""
    batch_size = check_batch_size(name, batch_size)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch_size, *x_shape), dtype=np.float32)
    return x, random_labels(rng, (batch_size,), num_classes)


def check_batch_size(workload: str, batch_size: Any) -> int:
    """`make_batch` argument check."""
    return int_option(workload, "batch_size", batch_size, minimum=1)


