"""Bring your own model: a function that returns a `tuner.models.Workload`.

Use it with the tuner as either of::

    lms-tuner ... --model examples/user_model.py:make_workload
    lms-tuner ... --model examples.user_model:make_workload     # from the project root

or from Python: ``tuner.models.load_workload("examples/user_model.py:make_workload", width=64)``.
Options given to the loader arrive as keyword arguments.

The contract (see `tuner.models.Workload`):

* ``build_model()`` returns a fresh ``keras.Model`` whose output is what
  ``loss_fn`` expects (here: logits);
* ``loss_fn(y_true, y_pred)`` returns the batch's mean loss as a scalar tensor;
* ``make_optimizer()`` returns a fresh Keras optimizer;
* ``x_shape``/``y_shape`` describe ONE sample (no batch dim), with dtypes
  ``x_dtype``/``y_dtype``;
* ``make_batch(batch_size, seed=0)`` returns ``(x, y)`` numpy arrays of shape
  ``(batch_size, *x_shape)``/``(batch_size, *y_shape)`` with valid labels, the
  same for the same seed (the tuner uses synthetic data: memory and speed do not
  depend on the values);
* ``default_batch`` is a batch size that trains quickly, for smoke tests.

Import TensorFlow/Keras inside the functions, as below: the tuner's parent
process loads the workload to read its shapes, and then stays free of
TensorFlow (a top-level ``import tensorflow`` works too, it only makes the
parent slower). Module-level functions (or ``functools.partial`` of them)
rather than lambdas keep the workload picklable.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from tuner.models import Workload, sparse_softmax_cross_entropy


def make_workload(*, image_size: int = 32, width: int = 16, num_classes: int = 10,
                  learning_rate: float = 0.01) -> Workload:
    """A small two-stage CNN classifier on ``image_size`` x ``image_size`` RGB images."""
    for name, value in (("image_size", image_size), ("width", width), ("num_classes", num_classes)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"option {name}={value!r} must be a positive integer")
    if image_size % 4:
        raise ValueError(f"option image_size={image_size} must be a multiple of 4 (two 2x poolings)")
    return Workload(
        name="user_cnn",
        description=f"example user CNN, {image_size}x{image_size}x3, width {width}, {num_classes} classes",
        build_model=partial(build_model, image_size=image_size, width=width, num_classes=num_classes),
        loss_fn=sparse_softmax_cross_entropy,  # or any (y_true, y_pred) -> scalar function
        make_optimizer=partial(make_optimizer, learning_rate=learning_rate),
        x_shape=(image_size, image_size, 3), y_shape=(), x_dtype="float32", y_dtype="int32",
        make_batch=partial(make_batch, image_size=image_size, num_classes=num_classes),
        default_batch=4,
        options={"image_size": image_size, "width": width, "num_classes": num_classes,
                 "learning_rate": learning_rate},
    )


def build_model(*, image_size: int, width: int, num_classes: int):
    import keras  # imported here, not at module level

    inputs = keras.Input((image_size, image_size, 3), name="x")
    x = inputs
    for stage in range(2):
        x = keras.layers.Conv2D(width * 2 ** stage, 3, padding="same", activation="relu",
                                name=f"stage{stage}_conv")(x)
        x = keras.layers.MaxPooling2D(2, name=f"stage{stage}_pool")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    logits = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, logits, name="user_cnn")


def make_optimizer(*, learning_rate: float):
    import keras

    return keras.optimizers.Adam(learning_rate=learning_rate)


def make_batch(batch_size: int, seed: int = 0, *, image_size: int, num_classes: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch_size, image_size, image_size, 3), dtype=np.float32)
    y = rng.integers(0, num_classes, size=(batch_size,), dtype=np.int32)
    return x, y
