"""``resnet50``: keras.applications.ResNet50 (random init) on synthetic ImageNet-shaped data.

The TFLMS paper's headline workload. Trained with SGD + momentum 0.9 (the
ResNet recipe of He et al., 2016: learning rate 0.1, momentum 0.9). The
classifier emits logits (``classifier_activation=None``) and the loss is
softmax cross-entropy from logits. At 224x224x3 with 1000 classes the model
has 25,636,712 parameters (25,583,592 trainable).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from .base import Workload, float_option, image_classification_batch, int_option, sgd, \
    sparse_softmax_cross_entropy

__all__ = ["resnet50", "RESNET50_PARAMS"]

RESNET50_PARAMS = 25_636_712  # keras.applications.ResNet50, 224x224x3, 1000 classes, all weights
_MIN_IMAGE_SIZE = 32  # keras.applications refuses smaller inputs


def resnet50(*, image_size: int = 224, num_classes: int = 1000, learning_rate: float = 0.1,
             momentum: float = 0.9) -> Workload:
    """ResNet-50 (keras.applications, weights=None), ImageNet-shaped synthetic data, SGD momentum."""
    image_size = int_option("resnet50", "image_size", image_size, minimum=_MIN_IMAGE_SIZE)
    num_classes = int_option("resnet50", "num_classes", num_classes, minimum=2)
    learning_rate = float_option("resnet50", "learning_rate", learning_rate)
    momentum = float_option("resnet50", "momentum", momentum, inclusive=True)
    if momentum >= 1.0:
        raise ValueError(f"resnet50: option momentum={momentum!r} out of range; allowed: 0 <= momentum < 1")
    x_shape = (image_size, image_size, 3)
    return Workload(
        name="resnet50",
        description=f"ResNet-50 (keras.applications, random init), {image_size}x{image_size}x3, "
                    f"{num_classes} classes, SGD lr {learning_rate} momentum {momentum}",
        build_model=partial(_build_resnet50, image_size=image_size, num_classes=num_classes),
        loss_fn=sparse_softmax_cross_entropy,
        make_optimizer=partial(sgd, learning_rate=learning_rate, momentum=momentum),
        x_shape=x_shape, y_shape=(), x_dtype="float32", y_dtype="int32",
        make_batch=partial(image_classification_batch, name="resnet50", x_shape=x_shape,
                           num_classes=num_classes),
        default_batch=2,
        options={"image_size": image_size, "num_classes": num_classes, "learning_rate": learning_rate,
                 "momentum": momentum},
        growable={"image_size": 32},  # ResNet-50 downsamples 32x: multiples of 32 keep every stage whole
    )


def _build_resnet50(*, image_size: int, num_classes: int) -> Any:
    import keras

    return keras.applications.ResNet50(
        weights=None, include_top=True, input_shape=(image_size, image_size, 3), classes=num_classes,
        classifier_activation=None, name="resnet50")
