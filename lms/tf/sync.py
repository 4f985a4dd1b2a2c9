"""Waiting for a step TensorFlow ran asynchronously, before a clock or a profiler stops.

Used by `lms.tf.measure` (timed steps) and `lms.tf.profile` (profiled steps).
"""

from __future__ import annotations

from typing import Any

__all__ = ["synchronise"]


def synchronise(outputs: Any, *, on_gpu: bool) -> None:
    """Wait for the step: pull every output tensor to host (the loss), and on GPU drain the streams."""
    import tensorflow as tf

    for leaf in tf.nest.flatten(outputs):
        if hasattr(leaf, "numpy"):
            leaf.numpy()
    if on_gpu:
        tf.test.experimental.sync_devices()
