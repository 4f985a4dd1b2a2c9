"""The bytes a step's tensors really hold: TF's allocation events, requested sizes, one profiled step.

TF's allocator peak (``get_memory_info(...)["peak"]``) counts whole chunks:
the BFC allocator rounds each request to 256 bytes and hands out a free chunk
up to twice the request unsplit, so the same sequence of requests peaks
differently with the allocator's history (seen on the emulated device: one
pinned ResNet-50 step, identical requests in two processes, 339 and 368 MiB).
The sum of the *requested* sizes of the live tensors depends on the executed
order only. This module reads it from one step under TF's profiler, whose
allocation events carry each request's size::

    live bytes(t) = start_bytes + sum(requested, allocated by t) - sum(requested, freed by t)
    peak_bytes    = max over the step of live bytes(t)

``start_bytes`` is what the step's tensors hold when it starts: its arguments
and the variables it captures (exact, from their shapes), as the simulator
counts them (`lms.simulate`'s resident and input bytes).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["LiveBytes", "live_bytes", "start_bytes", "allocation_events", "SOURCE"]

SOURCE = "tf-profiler-requested"


@dataclass(frozen=True)
class LiveBytes:
    """Requested bytes of the live tensors over one step (`live_bytes`).

    Attributes:
        peak_bytes: ``start_bytes + step_bytes``.
        start_bytes: the step's arguments and captured variables.
        step_bytes: the most the step's own allocations held at once, above the start.
        n_allocations: allocation events in the step.
        source: ``"tf-profiler-requested"``.
    """

    peak_bytes: int
    start_bytes: int
    step_bytes: int
    n_allocations: int
    source: str = SOURCE

    def to_dict(self) -> dict[str, Any]:
        return {"peak_bytes": self.peak_bytes, "start_bytes": self.start_bytes, "step_bytes": self.step_bytes,
                "n_allocations": self.n_allocations, "source": self.source}


def live_bytes(step: Callable[..., Any], args: tuple, *, call: Callable[[], Any] | None = None,
               synchronise: Callable[[Any], None] | None = None) -> LiveBytes:
    """Run ``step(*args)`` once under TF's profiler and return the requested bytes its tensors held at most.

    Args:
        step: a tf.function or `lms.function` step that has already run with
            these arguments (tracing and first-run allocations are not measured).
        args: its arguments.
        call: runs the step instead of ``step(*args)`` (e.g. with a dict batch).
        synchronise: waits for the outputs (default: converts them to numpy).

    Raises:
        ValueError: the profile held no allocation events (TF's BFC allocator is
            off, or TF's trace format changed).
    """
    import tensorflow as tf

    logdir = tempfile.mkdtemp(prefix="lms-live-")
    try:
        tf.profiler.experimental.start(logdir)
        try:
            out = call() if call is not None else step(*args)
            if synchronise is not None:
                synchronise(out)
            else:
                tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)
        finally:
            tf.profiler.experimental.stop()
        events = allocation_events(logdir)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    if not events:
        raise ValueError("the profiled step holds no allocation events (is TF_CPU_ALLOCATOR_USE_BFC=true set?)")
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    start = start_bytes(step, args)
    return LiveBytes(peak_bytes=start + peak, start_bytes=start, step_bytes=peak,
                     n_allocations=sum(1 for _, d in events if d > 0))


def allocation_events(logdir: str) -> list[tuple[int, int]]:
    """``(time in ps, +requested / -requested)`` of every allocation and deallocation TF's profiler wrote under
    `logdir`, in time order."""
    from .profile import xplane_events

    events: list[tuple[int, int]] = []
    stat_names: dict[int, dict[int, str]] = {}
    for plane, line, ev, kind in xplane_events(logdir):
        if kind not in ("MemoryAllocation", "MemoryDeallocation"):
            continue
        stats = stat_names.setdefault(id(plane), {k: m.name for k, m in plane.stat_metadata.items()})
        size = next((s.int64_value or s.uint64_value for s in ev.stats
                     if stats.get(s.metadata_id) == "requested_bytes"), 0)
        events.append((line.timestamp_ns * 1000 + ev.offset_ps, size if kind == "MemoryAllocation" else -size))
    events.sort(key=lambda e: e[0])
    return events


def start_bytes(step: Any, args: tuple) -> int:
    """Bytes of the step's arguments and of the variables its concrete function captures."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.ops import resource_variable_ops

    total = 0
    for a in tf.nest.flatten(args):
        if hasattr(a, "shape") and hasattr(a, "dtype") and getattr(a, "dtype", None) != tf.resource:
            total += int(np.prod(a.shape, dtype=np.int64)) * tf.dtypes.as_dtype(a.dtype).size
    get = getattr(step, "get_concrete_function", None)
    if get is None:
        return total
    try:
        concrete = get(*args)
    except (TypeError, ValueError):
        return total
    for c in concrete.captured_inputs:
        if c.dtype != tf.resource:
            total += int(np.prod(c.shape, dtype=np.int64)) * c.dtype.size
            continue
        data = resource_variable_ops.get_eager_safe_handle_data(c)
        if data.is_set and len(data.shape_and_type) == 1:
            st = data.shape_and_type[0]
            dims = [d.size for d in st.shape.dim]
            if all(d >= 0 for d in dims):
                total += int(np.prod(dims, dtype=np.int64)) * tf.dtypes.as_dtype(st.dtype).size
    return total
