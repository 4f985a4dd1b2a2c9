"""The workloads the tuner trains: built-in model zoo and the user-model contract.

    >>> from tuner.models import load_workload
    >>> w = load_workload("unet3d", input_size=32, base_filters=4)
    >>> x, y = w.make_batch(2)            # numpy, shapes (2, 32, 32, 32, 4) / (2, 32, 32, 32)
    >>> model = w.build_model()           # imports TensorFlow here, not before

A user model is a function returning a `Workload` (see ``examples/user_model.py``),
given as ``"package.module:function"`` or ``"path/to/file.py:function"``.
Importing this package does not import TensorFlow.

    base.py         the workload contract (`Workload`), the zoo's names, how a spec string becomes a workload
    parts.py        parts of workloads: a batch's arrays, a sample's bytes, a loss and optimizers
    small.py        tiny workloads for tests and quick studies: ``mlp``, ``cnn_bn``, ``residual``
    resnet.py       ``resnet50``: keras.applications.ResNet50 on synthetic ImageNet-shaped data
    transformer.py  ``gpt2_small``: a GPT-2-small-like decoder language model
    unet3d.py       ``unet3d``: the 3D U-Net of Cicek et al. (2016) for volumetric segmentation
"""

from __future__ import annotations

from .base import (Workload, builtin_names, describe_builtins, load_workload, parse_options,
                   sparse_softmax_cross_entropy)

__all__ = ["Workload", "builtin_names", "describe_builtins", "load_workload", "parse_options",
           "sparse_softmax_cross_entropy"]
