"""Read a traced TensorFlow training step into the framework-free graph model (`lms.graph.Graph`).

Roles (the TensorFlow facts behind them: docs/tf-notes.md):
- ``FORWARD``: ops the loss depends on through data edges.
- ``BACKWARD``: ops made by ``tape.gradient`` (given explicitly, e.g. recorded
  while tracing) and every op whose name starts with ``gradient_tape/``.
- ``OTHER``: the rest (optimizer updates, moving averages, metrics, returns).

Liveness (`lms.graph.Op.live`): an op is live when the step's outputs or an
op TensorFlow must run (a stateful op: variable updates, metric updates,
`must_run`) depend on it through data or control edges. TensorFlow prunes the
rest before running the step: a frozen layer's filter gradient, the gradient
of a constant divisor, shape computations nobody reads.

``Op.grad_of`` links a backward op ``gradient_tape/<scope>/...`` to the forward
op whose gradient it computes: the longest forward op name that prefixes the
rest of the name, else the forward op in the longest matching scope whose name
(or type) the next name component starts with (``.../dense/ReluGrad`` ->
``dense/Relu``), else the last forward op of that scope.

Sizes are affine in the batch: a ``None`` dim (traced with an unknown batch) is
the batch dim and makes the tensor per-sample (any further ``None`` dims count
as 1); with static shapes a tensor is per-sample when its dim 0 equals the
traced ``batch_size`` and it is computed from the step's non-resource inputs.
Resource, variant and string tensors count 0 bytes.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import tensorflow as tf

from ..graph import Graph, Op, Role, Tensor, dtype_size

__all__ = ["extract_graph", "trace_train_step", "trace_step", "TracedStep", "BACKWARD_PREFIX", "must_run"]

log = logging.getLogger(__name__)

BACKWARD_PREFIX = "gradient_tape/"


def extract_graph(func_graph: tf.Graph, *,
                  loss_tensor: tf.Tensor | str | Sequence[tf.Tensor | str] | None = None,
                  batch_size: int, symbolic_batch: bool = False, backward_ops: Iterable[str] = (),
                  name: str = "", outputs: Any = None) -> Graph:
    """Build a `Graph` model of a traced training step.

    Args:
        func_graph: the step's graph (``concrete_function.graph``, or the
            ``FuncGraph`` being traced).
        loss_tensor: the differentiated loss (or several); ``None``: the
            graph's outputs (a step that returns its loss).
        batch_size: the batch the sizes refer to (`Graph.batch_size`).
        symbolic_batch: the step was traced with an unknown batch dim (sizes
            come from ``None`` dims only; static dim 0 is never per-sample).
        backward_ops: names of ops created by ``tape.gradient`` (recorded while
            tracing); ops named ``gradient_tape/...`` are backward anyway.
        name: label of the graph model.
        outputs: what the step returns (any nest of tensors; ops it holds count
            too), for `lms.graph.Op.live`; None: the graph's own ``outputs`` and
            ``control_outputs`` when the function is finished, else every op is live.

    Returns:
        The linted graph model.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: must be >= 1")
    tf_ops = func_graph.get_operations()
    forward = _forward_ops(func_graph, loss_tensor)
    backward = set(backward_ops)
    batch_derived = set() if symbolic_batch else _batch_derived_ops(func_graph, tf_ops)
    roles: dict[str, Role] = {}
    for op in tf_ops:
        if op.name in backward or op.name.startswith(BACKWARD_PREFIX):
            roles[op.name] = Role.BACKWARD
        elif op.name in forward:
            roles[op.name] = Role.FORWARD
        else:
            roles[op.name] = Role.OTHER
    live = _live_ops(func_graph, tf_ops, outputs)
    matcher = _GradMatcher([op for op in tf_ops if roles[op.name] is Role.FORWARD])
    ops: list[Op] = []
    tensors: list[Tensor] = []
    for op in tf_ops:
        role = roles[op.name]
        ops.append(Op(
            name=op.name, type=op.type, role=role,
            inputs=tuple(t.name for t in op.inputs),
            control_inputs=tuple(c.name for c in op.control_inputs),
            outputs=tuple(t.name for t in op.outputs),
            grad_of=matcher.match(op.name) if role is Role.BACKWARD else None,
            device=op.device, live=live is None or op.name in live,
        ))
        for t in op.outputs:
            tensors.append(_tensor_model(t, batch_size=batch_size, symbolic_batch=symbolic_batch,
                                         batch_derived=op.name in batch_derived))
    graph = Graph(ops, tensors, batch_size=batch_size, name=name)
    graph.lint()
    return graph


def _forward_ops(graph: tf.Graph, loss_tensor: Any) -> set[str]:
    """Ops the loss (or, without one, the graph's outputs) depends on through data edges."""
    if loss_tensor is None:
        roots = [t.op for out in getattr(graph, "outputs", ()) for t in out.op.inputs]
        if not roots:
            raise ValueError("extract_graph: pass loss_tensor (the graph has no outputs to start from)")
    else:
        losses = list(loss_tensor) if isinstance(loss_tensor, (list, tuple)) else [loss_tensor]
        roots = [(graph.get_tensor_by_name(t) if isinstance(t, str) else t).op for t in losses]
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        stack.extend(t.op for t in op.inputs)
    return seen


def must_run(op: tf.Operation) -> bool:
    """An op TensorFlow runs whatever reads it: as automatic control dependencies decide (a stateful op,
    a function call, a resource read whose value is used)."""
    from tensorflow.python.framework import auto_control_deps, auto_control_deps_utils, op_def_registry

    if op_def_registry.get(op.type) is None:
        return True
    if not auto_control_deps.op_is_stateful(op):
        return False
    return op.type not in auto_control_deps_utils.RESOURCE_READ_OPS or any(t.consumers() for t in op.outputs)


def _live_ops(graph: tf.Graph, tf_ops: list[tf.Operation], outputs: Any) -> set[str] | None:
    """Names of the ops the outputs or a must-run op depend on (data and control edges); None: unknown."""
    if outputs is None:
        if not getattr(graph, "outputs", None):
            return None
        outputs = [*graph.outputs, *getattr(graph, "control_outputs", ())]
    roots: list[tf.Operation] = []
    for item in tf.nest.flatten(outputs, expand_composites=True):
        op = item if isinstance(item, tf.Operation) else getattr(item, "op", None)
        if op is not None and getattr(op, "graph", None) is graph:
            roots.append(op)
    roots.extend(op for op in tf_ops if must_run(op))
    live: set[str] = set()
    stack = roots
    while stack:
        op = stack.pop()
        if op.name in live:
            continue
        live.add(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return live


def _batch_derived_ops(graph: tf.Graph, tf_ops: list[tf.Operation]) -> set[str]:
    """Ops computed (through data edges) from the step's non-resource inputs."""
    inputs = [t for t in getattr(graph, "inputs", ()) if t.dtype != tf.resource]
    internal = {id(t) for t in getattr(graph, "internal_captures", ())}
    derived = {t.op.name for t in inputs if id(t) not in internal}
    if not derived:
        derived = {op.name for op in tf_ops if op.type == "Placeholder" and op.outputs
                   and op.outputs[0].dtype != tf.resource}
    for op in tf_ops:  # creation order is a topological order of data edges
        if op.name not in derived and any(t.op.name in derived for t in op.inputs):
            derived.add(op.name)
    return derived


def _tensor_model(t: tf.Tensor, *, batch_size: int, symbolic_batch: bool, batch_derived: bool) -> Tensor:
    dtype = t.dtype.base_dtype.name
    size = dtype_size(dtype)
    shape = t.shape
    if shape.rank is None:
        return Tensor(t.name, dtype=dtype, shape=None)
    dims = tuple(shape.as_list())
    if size == 0:
        return Tensor(t.name, dtype=dtype, shape=dims)
    if None in dims:
        known = math.prod(d for d in dims if d is not None)
        return Tensor(t.name, dtype=dtype, shape=dims, per_sample_bytes=known * size)
    nbytes = math.prod(dims) * size
    if not symbolic_batch and batch_derived and dims and dims[0] == batch_size:
        return Tensor(t.name, dtype=dtype, shape=dims, per_sample_bytes=nbytes // batch_size)
    return Tensor(t.name, dtype=dtype, shape=dims, fixed_bytes=nbytes)


class _GradMatcher:
    """Backward op name -> the forward op it differentiates (see module docstring)."""

    def __init__(self, forward: list[tf.Operation]) -> None:
        self._names = {op.name for op in forward}
        self._children: dict[str, list[tf.Operation]] = {}
        for op in forward:
            scope = op.name.rsplit("/", 1)[0] if "/" in op.name else ""
            self._children.setdefault(scope, []).append(op)

    def match(self, name: str) -> str | None:
        rest = name.split(BACKWARD_PREFIX, 1)[1] if BACKWARD_PREFIX in name else name
        parts = rest.split("/")
        for n in range(len(parts), 0, -1):
            prefix = "/".join(parts[:n])
            if prefix in self._names:
                return prefix
        for n in range(len(parts) - 1, 0, -1):
            scope = "/".join(parts[:n])
            children = self._children.get(scope)
            if not children:
                continue
            nxt = parts[n]
            by_name = [op for op in children if nxt.startswith(op.name.rsplit("/", 1)[-1])]
            if by_name:
                return max(by_name, key=lambda op: len(op.name)).name
            by_type = [op for op in children if nxt.startswith(op.type)]
            if by_type:
                return by_type[-1].name
            return children[-1].name
        return None


class TracedStep(NamedTuple):
    """`trace_train_step` result: the graph model and the traced function."""

    graph: Graph
    concrete_function: Any


def trace_train_step(model: Any, loss_fn: Callable, optimizer: Any, x_spec: tf.TensorSpec,
                     y_spec: tf.TensorSpec, *, batch_size: int | None = None, name: str = "") -> TracedStep:
    """Trace a standard training step (forward, ``tf.GradientTape``, optimizer update).

    The batch dim is left unknown (sizes become per-sample) unless the model
    cannot be traced that way; then it is traced at ``batch_size``.

    Args:
        model: a Keras model.
        loss_fn: ``loss_fn(y_true, y_pred) -> scalar``.
        optimizer: a Keras optimizer.
        x_spec / y_spec: specs of one batch; dim 0 is the batch (``None`` or a size).
        batch_size: batch the model's sizes refer to; default: the specs' dim 0, else 1.
        name: label of the graph model (default: the model's name).

    Returns:
        ``TracedStep(graph, concrete_function)``; unpack as ``graph, fn = ...``.
    """
    from .train import make_train_step, record_gradients

    dim0 = x_spec.shape[0] if x_spec.shape.rank else None
    if batch_size is None:
        batch_size = dim0 or 1
    label = name or getattr(model, "name", "")
    step = make_train_step(model, loss_fn, optimizer)
    records: list[Any] = []

    def traced(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with record_gradients() as rec:
            loss = step(x, y)
        records.append(rec)
        return loss

    def spec(s: tf.TensorSpec, dim: int | None) -> tf.TensorSpec:
        return tf.TensorSpec([dim, *s.shape[1:]], s.dtype)

    try:
        concrete = tf.function(traced).get_concrete_function(spec(x_spec, None), spec(y_spec, None))
        symbolic = True
    except (ValueError, TypeError) as exc:
        log.info("tracing with an unknown batch dim failed (%s); tracing at batch %d", exc, batch_size)
        records.clear()
        concrete = tf.function(traced).get_concrete_function(spec(x_spec, batch_size), spec(y_spec, batch_size))
        symbolic = False
    rec = next((r for r in reversed(records) if r.graph is concrete.graph), None)
    graph = extract_graph(concrete.graph, loss_tensor=rec.targets if rec and rec.targets else None,
                          batch_size=batch_size, symbolic_batch=symbolic,
                          backward_ops=rec.backward_ops if rec else (), name=label)
    return TracedStep(graph, concrete)


def trace_step(step: Callable, batch: Any, *, batch_size: int, name: str = "") -> TracedStep:
    """Trace any training step on one batch: ``step(*batch)`` for a tuple, else ``step(batch)``.

    A custom loop's step (two tapes and two optimizers too) or a Keras model's own
    ``train_step`` (``lambda data: model.train_step(data)``). The batch dimension of
    every tensor is left unknown (sizes become per-sample) unless the step cannot be
    traced that way; then it is traced at `batch_size`, the batch's first dimension.
    Every ``tape.gradient`` the step calls is recorded (`record_gradients`).
    """
    from .train import record_gradients

    records: list[Any] = []

    def traced(*args: Any) -> Any:
        with record_gradients() as rec:
            out = step(*args)
        records.append(rec)
        return out

    args = batch if isinstance(batch, tuple) else (batch,)
    args = tf.nest.map_structure(tf.convert_to_tensor, args)

    def specs(dim: int | None) -> Any:
        return tf.nest.map_structure(lambda t: tf.TensorSpec([dim, *t.shape[1:]], t.dtype), args)

    try:
        concrete = tf.function(traced).get_concrete_function(*specs(None))
        symbolic = True
    except (ValueError, TypeError) as exc:
        log.info("tracing with an unknown batch dim failed (%s); tracing at batch %d", exc, batch_size)
        records.clear()
        concrete = tf.function(traced).get_concrete_function(*specs(batch_size))
        symbolic = False
    rec = next((r for r in reversed(records) if r.graph is concrete.graph), None)
    if rec is None or not rec.calls:
        raise ValueError(f"{name or 'the step'} computed no gradients with tf.GradientTape in its own graph: "
                         "nothing to swap")
    graph = extract_graph(concrete.graph, loss_tensor=rec.targets or None, batch_size=batch_size,
                          symbolic_batch=symbolic, backward_ops=rec.backward_ops, name=name or "step")
    return TracedStep(graph, concrete)
