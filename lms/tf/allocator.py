"""TensorFlow's allocator settings that make a memory measurement mean something.

Both are read when TensorFlow's runtime starts (its first op or device query),
not at ``import tensorflow``; call the ``configure_*`` helpers before that, best
before importing TensorFlow (this module imports it only inside functions)::

    from lms.tf.allocator import configure_cpu_allocator
    configure_cpu_allocator()          # TF_CPU_ALLOCATOR_USE_BFC=true

- `configure_cpu_allocator`: the BFC allocator on CPU, so the CPU peak is byte-exact
  (`cpu_allocator_is_bfc` checks it).
- `configure_gpu_memory_growth`: TF's GPU pool grows on demand, so NVML's figures say
  something about the model.
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["BFC_ENV", "GROWTH_ENV", "configure_cpu_allocator", "configure_gpu_memory_growth",
           "cpu_allocator_is_bfc", "env_true"]

log = logging.getLogger(__name__)

BFC_ENV = "TF_CPU_ALLOCATOR_USE_BFC"
GROWTH_ENV = "TF_FORCE_GPU_ALLOW_GROWTH"
_PROBE_ELEMENTS = 64  # a 256-byte float32 tensor: BFC counts it, oneDNN's small-size path does not


# --- configuration ----------------------------------------------------------------------

def env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true")


def _runtime_started() -> bool | None:
    """Whether TensorFlow's eager context (its devices and allocators) exists; None if unknown."""
    if sys.modules.get("tensorflow") is None:
        return False
    try:
        from tensorflow.python.eager import context
        return bool(context.context()._initialized)  # private; guarded
    except Exception:
        return None


def cpu_allocator_is_bfc() -> bool:
    """True when TF's CPU allocator counts every allocation (the BFC allocator).

    Probes with a 256-byte tensor: with oneDNN's default allocator, small
    allocations bypass the statistics (the peak would be too low); with oneDNN
    off and no BFC, ``get_memory_info`` has no statistics at all. Starts TF's
    runtime if it has not started.
    """
    import tensorflow as tf

    try:
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        with tf.device("/CPU:0"):
            probe = tf.fill([_PROBE_ELEMENTS], 1.0)
        after = tf.config.experimental.get_memory_info("CPU:0")["current"]
    except ValueError:
        return False
    del probe
    return after - before >= _PROBE_ELEMENTS * 4


def configure_cpu_allocator() -> None:
    """Make TF's CPU allocator the BFC allocator, so the CPU peak is byte-exact.

    Sets ``TF_CPU_ALLOCATOR_USE_BFC=true``. TF reads it when its runtime starts;
    if that has already happened without it, raises RuntimeError (the setting
    can no longer take effect in this process).
    """
    was_set = env_true(BFC_ENV)
    os.environ[BFC_ENV] = "true"
    started = _runtime_started()
    if started is False or was_set:
        return
    if started is None:
        log.warning("cannot tell whether TensorFlow's runtime has started; %s=true takes "
                    "effect only if it has not (measure_step checks)", BFC_ENV)
        return
    if not cpu_allocator_is_bfc():
        raise RuntimeError(
            f"TensorFlow's runtime started before {BFC_ENV}=true was set, so its CPU allocator "
            "is not the BFC allocator and CPU memory peaks would be wrong. Call "
            "lms.tf.allocator.configure_cpu_allocator() (or set the variable) before TensorFlow "
            "runs its first op, e.g. at the top of the script or in a fresh process.")


def configure_gpu_memory_growth() -> None:
    """Let TF's GPU pool grow on demand (``TF_FORCE_GPU_ALLOW_GROWTH=true``).

    Without it TF takes almost the whole card at start and NVML's figures say
    nothing about the model. Must run before TF initialises the GPU; raises
    RuntimeError if a GPU was already initialised without growth.
    """
    was_set = env_true(GROWTH_ENV)
    os.environ[GROWTH_ENV] = "true"
    if was_set or _runtime_started() is False:
        return
    import tensorflow as tf

    for gpu in tf.config.list_physical_devices("GPU"):
        if not tf.config.experimental.get_memory_growth(gpu):
            raise RuntimeError(
                f"TensorFlow initialised {gpu.name} before {GROWTH_ENV}=true was set, so its "
                "memory pool does not grow on demand. Call "
                "lms.tf.allocator.configure_gpu_memory_growth() before TensorFlow runs its "
                "first op (one measurement per fresh process).")
