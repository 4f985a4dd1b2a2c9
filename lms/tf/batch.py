"""The batch a traced step runs at: from the step's data argument, at trace time or when the step runs.

Sizes in the graph model are affine in the batch (`lms.graph.Tensor`), and a
summary reports bytes at a batch. The batch is the leading dimension of the
step's *data* argument (`batch_argument`): the first argument of rank 2 or
more (images, sequences, feature rows), else a rank-1 argument whose leading
dimension another rank-1 argument shares (``(x, y)`` of scalars). Never the
first dimension of any tensor the step computes: a masked autoencoder's
patches (batch x patches rows), a conditional GAN's fake and real images
concatenated (twice the batch), or an actor-critic's state vector (its length)
are not the batch.

When the leading dimension is unknown at trace time (``fit`` on a ``tf.data``
pipeline), `observe_batch` reads it from the argument each time the step runs::

    x -> [lms/batch/shape] -> [lms/batch/observe] ..> (a swap-in or a recompute gate)
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import record

__all__ = ["batch_argument", "static_batch", "call_batch", "observe_batch", "OBSERVER_SCOPE"]

log = logging.getLogger(__name__)

OBSERVER_SCOPE = "lms/batch"


def _leading(items: list[Any]) -> Any:
    """The item whose leading dimension is the batch (see module docstring), or None."""
    def rank(x: Any) -> int | None:
        shape = getattr(x, "shape", None)
        return None if shape is None or getattr(shape, "rank", len(shape)) is None else len(shape)

    def dim0(x: Any) -> Any:
        d = x.shape[0]
        return getattr(d, "value", d)

    ranked = [x for x in items if (rank(x) or 0) >= 1]
    for x in ranked:
        if rank(x) >= 2:
            return x
    vectors = [x for x in ranked if rank(x) == 1]
    for i, x in enumerate(vectors):
        if dim0(x) is not None and any(dim0(y) == dim0(x) for y in vectors[i + 1:]):
            return x
    return None


def batch_argument(args: tuple, kwargs: dict) -> tf.Tensor | None:
    """The step's data argument (a symbolic tensor of the trace), or None.

    Composite arguments are looked into (a ``MirroredStrategy``'s per-replica
    values: one replica's data).
    """
    return _leading([t for t in tf.nest.flatten((args, kwargs), expand_composites=True) if tf.is_tensor(t)])


def static_batch(args: tuple, kwargs: dict) -> int | None:
    """The batch known at trace time: the data argument's static leading dimension (None if unknown)."""
    t = batch_argument(args, kwargs)
    return None if t is None else t.shape[0]


def call_batch(args: tuple, kwargs: dict) -> int | None:
    """The batch of a call's (eager) arguments: arrays, tensors, anything with a ``shape``."""
    items = [x for x in tf.nest.flatten((args, kwargs), expand_composites=True) if getattr(x, "shape", None) is not None]
    x = _leading(items)
    if x is None:
        return None
    d = x.shape[0]
    return None if d is None else int(d)


def observe_batch(graph: tf.Graph, data: tf.Tensor, anchor: str, callback: Callable[[int], None]) -> None:
    """Call ``callback(batch)`` with `data`'s leading dimension each time the step runs.

    The observer reads only the shape of the step's data argument and gives a
    control edge to `anchor` (an inserted op: a swap-in or a recompute gate),
    which keeps it in the step; no compute op gains a reader::

        x -> [lms/batch/shape] -> [lms/batch/observe] ..> [anchor]
    """
    from .apply import DO_NOT_REMOVE_ATTR
    from tensorflow.core.framework import attr_value_pb2

    def observe(shape: Any) -> Any:
        callback(int(np.asarray(shape)[0]))
        return shape

    with graph.as_default(), record.stop_recording(), graph.name_scope(None), graph.control_dependencies(None), \
            graph.colocate_with(None, ignore_existing=True), graph.device("/device:CPU:0"):
        shape = tf.shape(data, out_type=tf.int64, name=f"{OBSERVER_SCOPE}/shape")
        seen = tf.numpy_function(observe, [shape], tf.int64, stateful=False, name=f"{OBSERVER_SCOPE}/observe")
    for op in (shape.op, seen.op):
        op._set_attr(DO_NOT_REMOVE_ATTR, attr_value_pb2.AttrValue(b=True))  # noqa: SLF001
    graph.get_operation_by_name(anchor)._add_control_input(seen.op)  # noqa: SLF001
