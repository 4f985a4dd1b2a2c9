"""Tiny workloads for tests and quick studies: ``mlp``, ``cnn_bn``, ``residual``.

Each trains a step in well under a second on a CPU. Keras is imported inside
the builders only.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from .base import (Workload, check_batch_size, float_option, image_classification_batch, int_option, sgd,
                   sparse_softmax_cross_entropy)

__all__ = ["mlp", "cnn_bn", "residual"]

_TEACHER_SEED = 12345  # fixed weights that define the mlp's learnable labels


def mlp(*, input_dim: int = 32, hidden: int = 64, n_layers: int = 2, num_classes: int = 10,
        learning_rate: float = 0.05) -> Workload:
    """Tiny MLP classifier (Dense+ReLU layers) on vectors; labels from a fixed linear teacher."""
    input_dim = int_option("mlp", "input_dim", input_dim)
    hidden = int_option("mlp", "hidden", hidden)
    n_layers = int_option("mlp", "n_layers", n_layers)
    num_classes = int_option("mlp", "num_classes", num_classes, minimum=2)
    learning_rate = float_option("mlp", "learning_rate", learning_rate)
    return Workload(
        name="mlp",
        description=f"MLP {input_dim}->{n_layers}x{hidden}->{num_classes} classes, SGD momentum 0.9",
        build_model=partial(_build_mlp, input_dim=input_dim, hidden=hidden, n_layers=n_layers,
                            num_classes=num_classes),
        loss_fn=sparse_softmax_cross_entropy,
        make_optimizer=partial(sgd, learning_rate=learning_rate),
        x_shape=(input_dim,), y_shape=(), x_dtype="float32", y_dtype="int32",
        make_batch=partial(_mlp_batch, input_dim=input_dim, num_classes=num_classes),
        default_batch=8,
        options={"input_dim": input_dim, "hidden": hidden, "n_layers": n_layers,
                 "num_classes": num_classes, "learning_rate": learning_rate},
        growable={"input_dim": 16},
    )


def cnn_bn(*, image_size: int = 16, channels: int = 3, filters: int = 8, num_classes: int = 10,
           learning_rate: float = 0.05) -> Workload:
    """Tiny CNN: three Conv2D+BatchNorm+ReLU layers, a max pool, global pooling, dense logits."""
    image_size = int_option("cnn_bn", "image_size", image_size, minimum=4)
    channels = int_option("cnn_bn", "channels", channels)
    filters = int_option("cnn_bn", "filters", filters)
    num_classes = int_option("cnn_bn", "num_classes", num_classes, minimum=2)
    learning_rate = float_option("cnn_bn", "learning_rate", learning_rate)
    x_shape = (image_size, image_size, channels)
    return Workload(
        name="cnn_bn",
        description=f"CNN with BatchNorm, {image_size}x{image_size}x{channels}, {filters} filters, "
                    f"{num_classes} classes, SGD momentum 0.9",
        build_model=partial(_build_cnn_bn, x_shape=x_shape, filters=filters, num_classes=num_classes),
        loss_fn=sparse_softmax_cross_entropy,
        make_optimizer=partial(sgd, learning_rate=learning_rate),
        x_shape=x_shape, y_shape=(), x_dtype="float32", y_dtype="int32",
        make_batch=partial(image_classification_batch, name="cnn_bn", x_shape=x_shape, num_classes=num_classes),
        default_batch=8,
        options={"image_size": image_size, "channels": channels, "filters": filters,
                 "num_classes": num_classes, "learning_rate": learning_rate},
        growable={"image_size": 8},
    )


def residual(*, image_size: int = 16, channels: int = 3, filters: int = 8, n_blocks: int = 3,
             num_classes: int = 10, learning_rate: float = 0.05) -> Workload:
    """Tiny residual CNN: a stem and basic blocks (conv-BN-ReLU-conv-BN + identity skip)."""
    image_size = int_option("residual", "image_size", image_size, minimum=2)
    channels = int_option("residual", "channels", channels)
    filters = int_option("residual", "filters", filters)
    n_blocks = int_option("residual", "n_blocks", n_blocks)
    num_classes = int_option("residual", "num_classes", num_classes, minimum=2)
    learning_rate = float_option("residual", "learning_rate", learning_rate)
    x_shape = (image_size, image_size, channels)
    return Workload(
        name="residual",
        description=f"residual CNN, {n_blocks} blocks of {filters} filters, "
                    f"{image_size}x{image_size}x{channels}, {num_classes} classes, SGD momentum 0.9",
        build_model=partial(_build_residual, x_shape=x_shape, filters=filters, n_blocks=n_blocks,
                            num_classes=num_classes),
        loss_fn=sparse_softmax_cross_entropy,
        make_optimizer=partial(sgd, learning_rate=learning_rate),
        x_shape=x_shape, y_shape=(), x_dtype="float32", y_dtype="int32",
        make_batch=partial(image_classification_batch, name="residual", x_shape=x_shape, num_classes=num_classes),
        default_batch=8,
        options={"image_size": image_size, "channels": channels, "filters": filters,
                 "n_blocks": n_blocks, "num_classes": num_classes, "learning_rate": learning_rate},
        growable={"image_size": 8},
    )


# ----------------------------------------------------------------- builders

def _build_mlp(*, input_dim: int, hidden: int, n_layers: int, num_classes: int) -> Any:
    import keras

    x = inputs = keras.Input((input_dim,), name="x")
    for i in range(n_layers):
        x = keras.layers.Dense(hidden, activation="relu", name=f"dense_{i}")(x)
    logits = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, logits, name="mlp")


def _conv_bn_relu(x: Any, filters: int, name: str, *, relu: bool = True) -> Any:
    import keras

    x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv")(x)
    x = keras.layers.BatchNormalization(name=f"{name}_bn")(x)
    return keras.layers.ReLU(name=f"{name}_relu")(x) if relu else x


def _build_cnn_bn(*, x_shape: tuple[int, int, int], filters: int, num_classes: int) -> Any:
    import keras

    x = inputs = keras.Input(x_shape, name="x")
    x = _conv_bn_relu(x, filters, "block1")
    x = _conv_bn_relu(x, 2 * filters, "block2")
    x = keras.layers.MaxPooling2D(2, name="pool")(x)
    x = _conv_bn_relu(x, 2 * filters, "block3")
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    logits = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, logits, name="cnn_bn")


def _build_residual(*, x_shape: tuple[int, int, int], filters: int, n_blocks: int, num_classes: int) -> Any:
    import keras

    x = inputs = keras.Input(x_shape, name="x")
    x = _conv_bn_relu(x, filters, "stem")
    for i in range(n_blocks):
        y = _conv_bn_relu(x, filters, f"res{i}_a")
        y = _conv_bn_relu(y, filters, f"res{i}_b", relu=False)
        x = keras.layers.Add(name=f"res{i}_add")([x, y])
        x = keras.layers.ReLU(name=f"res{i}_out")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    logits = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, logits, name="residual")


# ------------------------------------------------------------------ batches

def _mlp_batch(batch_size: int, seed: int = 0, *, input_dim: int, num_classes: int
               ) -> tuple[np.ndarray, np.ndarray]:
    batch_size = check_batch_size("mlp", batch_size)
    teacher = np.random.default_rng(_TEACHER_SEED).standard_normal((input_dim, num_classes))
    x = np.random.default_rng(seed).standard_normal((batch_size, input_dim)).astype(np.float32)
    y = np.argmax(x @ teacher, axis=1).astype(np.int32)
    return x, y

