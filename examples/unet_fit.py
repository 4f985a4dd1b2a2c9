"""A segmentation U-Net trained with ``model.fit``: tune the program itself, then run it.

Adapted from keras.io's "Image segmentation with a U-Net-like architecture" (an
Xception-style U-Net on the Oxford-IIIT pets), scaled to a CPU: ``image_size``
x ``image_size`` RGB images, per-pixel labels of ``num_classes`` classes,
synthetic data (no download). The model is the user's, compiled as their
script compiles it (``rmsprop``, sparse categorical cross-entropy).

Tune it (the tuner runs this model's own ``fit``; `tuner.models.Workload`'s form ``"fit"``)::

    python -m tuner search --model examples/unet_fit.py:make_workload --budget-from-batch 8 --study unet

Run it with the recommendation, as a training script would (the peak of each step printed)::

    python examples/unet_fit.py studies/unet/recommended.json
"""

from __future__ import annotations

import sys
from functools import partial

import numpy as np

from tuner.models import Workload


def build_model(image_size: int, num_classes: int, width: int) -> object:
    """keras.io's U-Net: an Xception-like encoder (separable convolutions, residuals) and an upsampling decoder."""
    import keras
    from keras import layers

    inputs = keras.Input(shape=(image_size, image_size, 3))
    x = layers.Conv2D(width, 3, strides=2, padding="same")(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    previous = x
    for filters in (2 * width, 4 * width, 8 * width):
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(filters, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(filters, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
        residual = layers.Conv2D(filters, 1, strides=2, padding="same")(previous)
        x = layers.add([x, residual])
        previous = x
    for filters in (8 * width, 4 * width, 2 * width, width):
        x = layers.Activation("relu")(x)
        x = layers.Conv2DTranspose(filters, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)
        x = layers.Conv2DTranspose(filters, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.UpSampling2D(2)(x)
        residual = layers.UpSampling2D(2)(previous)
        residual = layers.Conv2D(filters, 1, padding="same")(residual)
        x = layers.add([x, residual])
        previous = x
    outputs = layers.Conv2D(num_classes, 3, activation="softmax", padding="same")(x)
    return keras.Model(inputs, outputs, name="unet")


def fit_model(image_size: int = 64, num_classes: int = 3, width: int = 32) -> object:
    """The compiled model, as the script trains it."""
    import keras

    keras.utils.set_random_seed(0)
    model = build_model(image_size, num_classes, width)
    model.compile(optimizer=keras.optimizers.RMSprop(1e-3), loss="sparse_categorical_crossentropy")
    return model


def make_batch(batch_size: int, seed: int = 0, *, image_size: int = 64, num_classes: int = 3) -> tuple:
    """One batch as ``fit`` receives it: ``(images, per-pixel class ids)``."""
    rng = np.random.default_rng(seed)
    images = rng.random((batch_size, image_size, image_size, 3), dtype=np.float32)
    masks = rng.integers(0, num_classes, size=(batch_size, image_size, image_size, 1), dtype=np.int32)
    return images, masks


def make_workload(*, image_size: int = 64, num_classes: int = 3, width: int = 32) -> Workload:
    if not isinstance(image_size, int) or image_size < 16 or image_size % 16:
        raise ValueError(f"option image_size={image_size!r} must be a multiple of 16 (four 2x downsamplings)")
    return Workload(
        name="unet_fit", description=f"keras.io U-Net segmentation under model.fit, {image_size}x{image_size}",
        fit_model=partial(fit_model, image_size, num_classes, width),
        make_batch=partial(make_batch, image_size=image_size, num_classes=num_classes),
        default_batch=4, options={"image_size": image_size, "num_classes": num_classes, "width": width})


def main(argv: list[str]) -> int:
    """``python examples/unet_fit.py CONFIG [BATCH] [STEPS]``: train with the config, print each step's peak."""
    from run_fit import run_fit  # beside this file

    return run_fit(make_workload(), argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
