"""Parts of workloads: a batch's arrays and structure, the byte count of a sample, a loss and optimizers.

No TensorFlow at import: the Keras parts import it when called.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

__all__ = ["batch_leaves", "batch_structure", "check_program_batch", "nbytes", "sparse_softmax_cross_entropy",
           "sgd", "adam"]


def batch_leaves(batch: Any) -> list[Any]:
    """The arrays of a batch (an array, a tuple or list, or a dict of them, nested; a dict's in key order)."""
    if isinstance(batch, Mapping):
        return [leaf for key in sorted(batch) for leaf in batch_leaves(batch[key])]
    if isinstance(batch, (tuple, list)):
        return [leaf for item in batch for leaf in batch_leaves(item)]
    return [batch]


def batch_structure(batch: Any) -> Any:
    """The batch with each array as ``[shape, dtype name]`` (JSON-ready)."""
    if isinstance(batch, Mapping):
        return {str(k): batch_structure(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return [batch_structure(v) for v in batch]
    shape = getattr(batch, "shape", None)
    dtype = getattr(batch, "dtype", None)
    if shape is None or dtype is None:
        raise ValueError(f"make_batch gave a {type(batch).__name__}; a batch is an array, a tuple or a dict of arrays")
    return [[int(d) for d in shape], getattr(dtype, "name", str(dtype))]


def check_program_batch(workload: str, batch: Any, batch_size: int) -> None:
    """Raise ValueError unless every array of a program's batch has `batch_size` as its first dimension."""
    for leaf in batch_leaves(batch):
        shape = tuple(int(d) for d in getattr(leaf, "shape", ()))
        if not shape or shape[0] != batch_size:
            raise ValueError(f"workload {workload!r}: make_batch({batch_size}) gave an array of shape {shape}; "
                             f"every array of a batch has the batch ({batch_size}) as its first dimension")


def sparse_softmax_cross_entropy(y_true: Any, y_pred: Any) -> Any:
    """Mean cross-entropy of integer labels against logits (any rank: per sample,
    per voxel, per token). Imports Keras when called."""
    from keras import losses, ops

    return ops.mean(losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True))


def sgd(*, learning_rate: float, momentum: float = 0.9) -> Any:
    """``keras.optimizers.SGD`` with momentum (imports Keras when called)."""
    import keras

    return keras.optimizers.SGD(learning_rate=learning_rate, momentum=momentum)


def adam(*, learning_rate: float) -> Any:
    """``keras.optimizers.Adam`` (imports Keras when called)."""
    import keras

    return keras.optimizers.Adam(learning_rate=learning_rate)


def nbytes(shape: tuple[int, ...], dtype: str) -> int:
    size = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
    return int(np.prod(shape, dtype=np.int64)) * size
