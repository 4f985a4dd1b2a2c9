"""Emulated swap ops: move a tensor out of TensorFlow's allocator and back, on any machine.

On a CPU-only machine a "host" device does not exist: an identity placed on
``/CPU:0`` just forwards the buffer, so swapping saves nothing and costs nothing.
To measure what LMS does to memory and time without a GPU, an *emulated* swap
pair really takes the bytes out of TF's allocator (the one
``tf.config.experimental.get_memory_info`` reports, with
``TF_CPU_ALLOCATOR_USE_BFC=true``) and brings them back::

    (fwd) -> t --> [<out>: numpy_function]   copies t into an aligned numpy buffer;
                         |                   its output wraps that buffer (zero-copy,
                         v                   outside TF's allocator)
                   [<out>/shaped]            Reshape to Shape(Identity(t)): t's shape,
                         |                   as far as Grappler knows it
                         v
                   [<in>/transfer]           only with a bandwidth: numpy_function that
                         |                   sleeps nbytes/bandwidth and hands the buffer on
                         v
                   [<in>: Snapshot]          a fresh copy in TF's allocator -> (bwd)

Design:
- Swap-out is ``tf.numpy_function(..., stateful=False)``: it copies the data into
  a new numpy array allocated with 128-byte alignment. TF wraps an aligned
  returned array without copying it (an unaligned one would be copied into TF's
  allocator, which would defeat the purpose), so the host copy lives in
  ordinary host memory. Once ``t``'s other readers are done, TF frees ``t``:
  the allocator's bytes really drop. The host copy is freed by TF's reference
  counting after the last swap-in read it: no side table, no leaks, thread-safe.
- A numpy_function's output shape is unknown to Grappler, which would then
  optimize the readers differently from the graph without LMS (seen: a
  Conv2D+BiasAdd+Add fusion not made, results off in the last bit). So the
  swap-out's output goes through a ``Reshape`` to ``Shape(Identity(t))``
  (forwards the buffer, no copy, no allocation): Grappler knows of it exactly
  what it knows of ``t``, no less and no more. Not Python's static shape
  (``EnsureShape``): Grappler can know less, e.g. nothing of what an
  XLA-compiled function call returns (a grouped ``Conv2D``: Grappler fails to
  instantiate the function), and with a swap-in of known shape it removed the
  gradients' no-op ``Reshape``s below a ConvNeXt block's grouped convolution
  with LMS only. Not ``Shape(t)``: where the shape is known, constant folding
  makes it a constant with a control edge from ``t``'s op, and that edge stops
  the remapper's fusions of the op (``Conv2D`` + ``BiasAdd``); it goes from the
  identity instead.
- Swap-in is ``tf.raw_ops.Snapshot``, which allocates the device copy in TF's
  allocator, as a host-to-device transfer would (it could only forward a buffer
  TF owns; the host copy is numpy's). It is stateless, like the swap-out: a
  stateful copy (``DeepCopy``, used before) changed how Grappler optimized the
  ops around it and broke bitwise equality of a two-tape GAN, and automatic
  control dependencies would chain stateful ops in creation order (cycles).
- ``bandwidth`` (bytes/s) makes the swap-out, and each swap-in's extra
  ``transfer`` op, sleep ``nbytes / bandwidth`` seconds; ``time.sleep`` releases
  the GIL, so compute goes on meanwhile, as with a DMA engine.
- Copies are bit-exact (``np.copyto``): training with emulated swaps is bitwise
  identical to training without.
- `HOST_COPIES` counts the bytes of the swap-outs' host copies alive in this
  process (added when a copy is made, removed when TF releases it: a
  ``weakref.finalize`` on the array) and their peak since `HostCopies.reset_peak`:
  the emulated device's MEASURED host memory, to compare with the simulator's
  ``peak_host_bytes`` (`lms.sim.host`).
"""

from __future__ import annotations

import threading
import time
import weakref

import numpy as np
import tensorflow as tf

__all__ = ["emulated_swap_out", "emulated_swap_in", "default_emulate", "aligned_empty", "ALIGNMENT", "HostCopies",
           "HOST_COPIES"]

# TF wraps a returned numpy array without copying when its data pointer is
# aligned to EIGEN_MAX_ALIGN_BYTES (64 on AVX-512 builds); 128 covers every build.
ALIGNMENT = 128


class HostCopies:
    """Bytes of the emulated swap-outs' host copies alive now, and their peak since `reset_peak` (MEASURED)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.live_bytes = 0
        self.peak_bytes = 0
        self.copies = 0

    def add(self, array: np.ndarray) -> None:
        """Count `array` until it is released."""
        n = int(array.nbytes)
        with self._lock:
            self.live_bytes += n
            self.copies += 1
            if self.live_bytes > self.peak_bytes:
                self.peak_bytes = self.live_bytes
        weakref.finalize(array, self._remove, n)

    def _remove(self, n: int) -> None:
        with self._lock:
            self.live_bytes -= n

    def reset_peak(self) -> None:
        """Start a new window: the peak becomes the bytes alive now."""
        with self._lock:
            self.peak_bytes = self.live_bytes


#: This process's emulated host copies (`HostCopies`).
HOST_COPIES = HostCopies()


def default_emulate() -> bool:
    """True when no GPU is visible (then a real host device does not exist)."""
    return not tf.config.list_physical_devices("GPU")


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype, *, alignment: int = ALIGNMENT) -> np.ndarray:
    """An uninitialised C-contiguous array whose data pointer is `alignment`-aligned."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    offset = (-raw.ctypes.data) % alignment
    return raw[offset:offset + nbytes].view(dtype).reshape(shape)


def _sleep_for(nbytes: int, bandwidth: float | None) -> None:
    if bandwidth:
        time.sleep(nbytes / bandwidth)


def _check_bandwidth(bandwidth: float | None) -> None:
    if bandwidth is not None and not bandwidth > 0:
        raise ValueError(f"bandwidth={bandwidth!r}: must be a positive number of bytes/s or None")


def _shape_of(t: tf.Tensor, *, name: str) -> tf.Tensor:
    """``Shape(Identity(t))``: the shape of `t` exactly as far as Grappler knows it (module docstring).

    A ``Shape`` op even where Python knows the shape (``tf.shape`` would make it a constant here).
    """
    like = tf.raw_ops.Identity(input=t, name=f"{name}/like")
    return tf.raw_ops.Shape(input=like, name=f"{name}/shape")


def emulated_swap_out(t: tf.Tensor, *, name: str, bandwidth: float | None = None) -> tf.Tensor:
    """Copy `t` into host memory outside TF's allocator; return a tensor wrapping the copy.

    ``(producer) -> t -> [<name>: numpy_function copy] -> [<name>/shaped] -> h (host memory)``

    Args:
        t: the tensor to swap out.
        name: op name of the swap-out (the numpy_function).
        bandwidth: bytes/s of the emulated link (sleep ``nbytes/bandwidth``), or None.
    """
    _check_bandwidth(bandwidth)

    def _to_host(array: np.ndarray) -> np.ndarray:
        array = np.asarray(array)
        host = aligned_empty(array.shape, array.dtype)
        np.copyto(host, array, casting="no")
        HOST_COPIES.add(host)
        _sleep_for(host.nbytes, bandwidth)
        return host

    copied = tf.numpy_function(_to_host, [t], t.dtype, stateful=False, name=name)
    h = tf.reshape(copied, _shape_of(t, name=name), name=f"{name}/shaped")
    h.set_shape(t.shape)
    return h


def emulated_swap_in(h: tf.Tensor, *, like: tf.Tensor, name: str,
                     bandwidth: float | None = None) -> tf.Tensor:
    """Bring a swapped-out tensor back into TF's allocator.

    ``h -> [<name>: Snapshot] -> (consumers)``; with a bandwidth
    ``h -> [<name>/transfer: numpy_function, sleeps] -> [<name>/shaped] -> [<name>: Snapshot]``.
    The trigger control edge goes on the first of these ops.

    Args:
        h: output of `emulated_swap_out`.
        like: the original tensor (gives the static shape).
        name: op name of the swap-in (the Snapshot).
        bandwidth: bytes/s of the emulated link, or None.
    """
    _check_bandwidth(bandwidth)
    if bandwidth:
        def _from_host(array: np.ndarray) -> np.ndarray:
            array = np.asarray(array)
            _sleep_for(array.nbytes, bandwidth)
            if array.ctypes.data % ALIGNMENT:  # keep the hand-back zero-copy
                aligned = aligned_empty(array.shape, array.dtype)
                np.copyto(aligned, array, casting="no")
                array = aligned
            return array

        moved = tf.numpy_function(_from_host, [h], h.dtype, stateful=False, name=f"{name}/transfer")
        h = tf.reshape(moved, tf.raw_ops.Shape(input=h, name=f"{name}/shape"), name=f"{name}/shaped")
    out = tf.raw_ops.Snapshot(input=h, name=name)
    out.set_shape(like.shape)
    return out
