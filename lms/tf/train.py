"""The standard training step, and a recorder of what ``tape.gradient`` builds while tracing.

`make_train_step` is the step that tests, the tuner's trial worker and the
model zoo trace. `record_gradients` tells the rewriter which tensor was
differentiated (the loss) and which ops are the backward pass, exactly,
without relying on op names. It records and changes nothing else: the gradient
graph is the one ``tape.gradient`` builds (in TF2 its seed is a constant, so
no gradient op depends on the loss op itself).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import tensorflow as tf
from tensorflow.python.eager import backprop
from tensorflow.python.framework import ops as tf_ops

__all__ = ["make_train_step", "record_gradients", "GradientRecord"]


def make_train_step(model: Any, loss_fn: Callable, optimizer: Any) -> Callable:
    """Return an undecorated ``step(x, y) -> loss``: forward, ``tf.GradientTape``, ``apply_gradients``.

    The model's own losses (``model.losses``, e.g. weight regularisers) are
    added to ``loss_fn(y, model(x, training=True))``. If the model is built and
    the optimizer is not, the optimizer is built here, so that tracing the step
    does not create variables (which would make ``tf.function`` trace twice).

    Args:
        model: a Keras model.
        loss_fn: ``loss_fn(y_true, y_pred) -> scalar``.
        optimizer: a Keras optimizer.
    """
    if getattr(model, "built", False) and not getattr(optimizer, "built", True):
        optimizer.build(model.trainable_variables)

    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = loss_fn(y, y_pred)
            if model.losses:
                loss = loss + tf.add_n(model.losses)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return train_step


@dataclass(eq=False)
class GradientRecord:
    """What ``tf.GradientTape.gradient`` built in one graph while a `record_gradients` was active.

    Attributes:
        graph: the graph recorded (the one being traced).
        targets: the differentiated tensors (losses), one entry per target tensor.
        backward_ops: names of the ops the gradient calls created, in order.
        calls: number of ``gradient`` calls recorded.
        nested_calls: ``gradient`` calls that built a graph nested in `graph` (a loop's body, a ``tf.cond``
            branch, a ``tf.function`` or `lms.function` called by the step): not recorded, not rewritten.
    """

    graph: tf.Graph
    targets: list[tf.Tensor] = field(default_factory=list)
    backward_ops: list[str] = field(default_factory=list)
    calls: int = 0
    nested_calls: int = 0
    lock: Any = field(default_factory=threading.RLock, repr=False)
    thread: threading.Thread = field(default_factory=threading.current_thread, repr=False)


# Active records of all threads: a `tf.distribute.MirroredStrategy` traces each replica's
# step (and its ``tape.gradient``) in a thread of its own, into the graph being recorded.
_records: list[GradientRecord] = []
_patch_lock = threading.Lock()
_patch_depth = 0
_original_gradient = backprop.GradientTape.gradient


def _recording_gradient(tape: backprop.GradientTape, target: Any, *args: Any, **kwargs: Any) -> Any:
    if not _records or tf.executing_eagerly():
        return _original_gradient(tape, target, *args, **kwargs)
    graph = tf_ops.get_default_graph()
    with _patch_lock:
        for r in _records:
            if r.graph is not graph and _encloses(r.graph, graph):
                r.nested_calls += 1
        mine = [r for r in _records if r.graph is graph]
        # Records of the calling thread first: under ``fit`` with a MirroredStrategy each
        # replica's train step records its own replica; a step that calls ``strategy.run``
        # records the calls of every replica thread.
        mine = [r for r in mine if r.thread is threading.current_thread()] or mine
    if not mine:
        return _original_gradient(tape, target, *args, **kwargs)
    with mine[0].lock:  # replica threads build into one graph: keep each call's new ops apart
        before = len(graph.get_operations())
        result = _original_gradient(tape, target, *args, **kwargs)
        new_ops = [op.name for op in graph.get_operations()[before:]]
    targets = [t for t in tf.nest.flatten(target) if tf.is_tensor(t) and getattr(t, "graph", None) is graph]
    with _patch_lock:
        for r in mine:
            r.targets.extend(targets)
            r.backward_ops.extend(new_ops)
            r.calls += 1
    return result


def _encloses(outer: tf.Graph, graph: tf.Graph) -> bool:
    """Whether `graph` is built inside `outer` (its ``outer_graph`` chain reaches it)."""
    g = getattr(graph, "outer_graph", None)
    while g is not None:
        if g is outer:
            return True
        g = getattr(g, "outer_graph", None)
    return False


class record_gradients:  # noqa: N801 - used like a function: ``with record_gradients(g) as rec``
    """Context manager: record ``tf.GradientTape.gradient`` calls that build ops in `graph`.

    ``GradientTape.gradient`` is patched only while at least one recorder is
    active (in any thread) and restored afterwards. Calls building `graph` are
    recorded from any thread (``MirroredStrategy`` traces each replica in its
    own), by the recorders of the calling thread if it has some, else by the
    others; calls in eager mode or building another graph pass straight through.

    Args:
        graph: the graph to record; default: the current default graph.
    """

    def __init__(self, graph: tf.Graph | None = None) -> None:
        self.record = GradientRecord(graph if graph is not None else tf_ops.get_default_graph())

    def __enter__(self) -> GradientRecord:
        global _patch_depth
        with _patch_lock:
            if _patch_depth == 0:
                backprop.GradientTape.gradient = _recording_gradient
            _patch_depth += 1
            _records.append(self.record)
        return self.record

    def __exit__(self, *exc: object) -> None:
        global _patch_depth
        with _patch_lock:
            del _records[next(i for i, r in enumerate(_records) if r is self.record)]
            _patch_depth -= 1
            if _patch_depth == 0:
                backprop.GradientTape.gradient = _original_gradient
