"""``unet3d``: the 3D U-Net of Cicek et al. (2016) for volumetric segmentation.

The TFLMS paper's 3D U-Net experiment (brain tumour volumes of 192^3 voxels),
where the long skip connections make ``swap_branches`` matter. Architecture
(``levels=4`` resolution steps, ``base_filters=32``)::

    analysis:  [conv3 f, conv3 2f] -> maxpool2 -> ... (f = 32, 64, 128, 256)
    synthesis: upconv2 (keeps channels) -> concat skip -> [conv3 g, conv3 g] (g = 256, 128, 64)
    head:      conv1 -> n_classes logits per voxel

Every 3x3x3 convolution is followed by BatchNorm and ReLU. Unlike the paper
the convolutions are "same"-padded, so the output has the input's size and the
input size must be a multiple of ``2**(levels-1)``. With 3 input channels and
3 classes the convolution weights (conv biases, no up-conv biases) number
19,069,955, the figure Cicek et al. give; Keras adds 4 BatchNorm weights per
channel (2,336 channels: 9,344 weights).

Defaults follow BraTS (the paper's data): 4 MRI modalities in, 4 labels out
(background + 3 tumour regions). Labels are per-voxel class ids; loss is voxel
-mean softmax cross-entropy; optimizer Adam.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from .base import Workload, adam, check_batch_size, float_option, int_option, sparse_softmax_cross_entropy

__all__ = ["unet3d", "CICEK_CONV_PARAMS"]

CICEK_CONV_PARAMS = 19_069_955  # Cicek et al. 2016, network architecture: "19069955 parameters in total"


def unet3d(*, input_size: int = 192, in_channels: int = 4, n_classes: int = 4, base_filters: int = 32,
           levels: int = 4, learning_rate: float = 1e-4) -> Workload:
    """3D U-Net (Cicek et al. 2016): Conv3D+BN+ReLU, 4 levels, skip connections, per-voxel labels."""
    levels = int_option("unet3d", "levels", levels, minimum=2)
    input_size = int_option("unet3d", "input_size", input_size)
    multiple = 2 ** (levels - 1)
    if input_size % multiple:
        lower = input_size // multiple * multiple
        nearby = ", ".join(str(s) for s in (lower, lower + multiple) if s >= multiple)
        raise ValueError(
            f"unet3d: option input_size={input_size} does not fit the model; allowed: a multiple of "
            f"{multiple} (2**(levels-1), levels={levels} has {levels - 1} 2x poolings), e.g. {nearby}")
    in_channels = int_option("unet3d", "in_channels", in_channels)
    n_classes = int_option("unet3d", "n_classes", n_classes, minimum=2)
    base_filters = int_option("unet3d", "base_filters", base_filters)
    learning_rate = float_option("unet3d", "learning_rate", learning_rate)
    x_shape = (input_size, input_size, input_size, in_channels)
    return Workload(
        name="unet3d",
        description=f"3D U-Net (Cicek et al.), {input_size}^3x{in_channels}, {levels} levels, "
                    f"{base_filters} base filters, {n_classes} classes, Adam",
        build_model=partial(_build_unet3d, x_shape=x_shape, n_classes=n_classes, base_filters=base_filters,
                            levels=levels),
        loss_fn=sparse_softmax_cross_entropy,
        make_optimizer=partial(adam, learning_rate=learning_rate),
        x_shape=x_shape, y_shape=x_shape[:3], x_dtype="float32", y_dtype="int32",
        make_batch=partial(_segmentation_batch, x_shape=x_shape, n_classes=n_classes),
        default_batch=1,
        options={"input_size": input_size, "in_channels": in_channels, "n_classes": n_classes,
                 "base_filters": base_filters, "levels": levels, "learning_rate": learning_rate},
        growable={"input_size": multiple * max(1, 16 // multiple)},  # a multiple of 2**(levels-1); 16 by default
    )


def _conv_bn_relu(x: Any, filters: int, name: str) -> Any:
    import keras

    x = keras.layers.Conv3D(filters, 3, padding="same", name=f"{name}_conv")(x)
    x = keras.layers.BatchNormalization(name=f"{name}_bn")(x)
    return keras.layers.ReLU(name=f"{name}_relu")(x)


def _build_unet3d(*, x_shape: tuple[int, ...], n_classes: int, base_filters: int, levels: int) -> Any:
    import keras

    x = inputs = keras.Input(x_shape, name="x")
    skips = []
    for level in range(levels):
        filters = base_filters * 2 ** level
        x = _conv_bn_relu(x, filters, f"down{level}_a")
        x = _conv_bn_relu(x, 2 * filters, f"down{level}_b")
        if level < levels - 1:
            skips.append(x)
            x = keras.layers.MaxPooling3D(2, name=f"down{level}_pool")(x)
    for level in reversed(range(levels - 1)):
        x = keras.layers.Conv3DTranspose(x.shape[-1], 2, strides=2, use_bias=False, name=f"up{level}_upconv")(x)
        x = keras.layers.Concatenate(name=f"up{level}_concat")([skips[level], x])
        filters = base_filters * 2 ** (level + 1)
        x = _conv_bn_relu(x, filters, f"up{level}_a")
        x = _conv_bn_relu(x, filters, f"up{level}_b")
    logits = keras.layers.Conv3D(n_classes, 1, name="logits")(x)
    return keras.Model(inputs, logits, name="unet3d")


def _segmentation_batch(batch_size: int, seed: int = 0, *, x_shape: tuple[int, ...], n_classes: int
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Volumes with one nested-shell "lesion" each: class k inside shell k, 0 outside.

    The image is noise plus a per-channel intensity per class, so labels are
    learnable from the input.
    """
    batch_size = check_batch_size("unet3d", batch_size)
    rng = np.random.default_rng(seed)
    size, channels = x_shape[0], x_shape[3]
    axis = np.arange(size, dtype=np.float32)
    y = np.zeros((batch_size, size, size, size), dtype=np.int32)
    for i in range(batch_size):
        center = rng.uniform(0.3, 0.7, size=3) * size
        radius = rng.uniform(0.15, 0.3) * size
        dist2 = ((axis[:, None, None] - center[0]) ** 2 + (axis[None, :, None] - center[1]) ** 2
                 + (axis[None, None, :] - center[2]) ** 2) / radius ** 2
        for k in range(1, n_classes):  # shells shrink with k: class k-1 surrounds class k
            y[i][dist2 < ((n_classes - k) / (n_classes - 1)) ** 2] = k
    intensity = rng.uniform(-1.0, 1.0, size=(n_classes, channels)).astype(np.float32)
    intensity[0] = 0.0
    x = rng.standard_normal((batch_size, *x_shape), dtype=np.float32) * np.float32(0.5)
    x += intensity[y]
    return x, y
