"""Measure each op's compute time in real steps (TF's profiler), for the simulator's time model.

    from lms.tf.profile import profile_op_costs
    costs = profile_op_costs(step, lambda b: make_batch(b), batches=(8, 16))
    lms.simulate(graph, config, batch=64, op_costs=costs)

Each batch size is run ``warmup`` times untraced, then once under
``tf.profiler``; every op event of the executed graph (``name:Type`` on TF's
executor threads) adds its wall time to its op. Two batch sizes give each op
an affine cost (`lms.sim.OpCosts.fit`). Ops Grappler fused run under the
fused node's name (the time is kept, under one of the names); ops it removed
cost nothing.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..sim.opcosts import OpCosts
from .sync import synchronise

__all__ = ["profile_op_costs", "profile_batches", "op_seconds_from_xspace", "xplane_events"]

log = logging.getLogger(__name__)


def profile_op_costs(step: Callable[..., Any], make_args: Callable[[int], Sequence[Any]], *,
                     batches: Sequence[int] = (8, 16), warmup: int = 2,
                     peaks: dict[int, int] | None = None) -> OpCosts:
    """Per-op seconds of `step` at each of `batches`, fitted affine in the batch.

    Args:
        step: a tf.function training step, called as ``step(*make_args(batch))``.
        make_args: the step's arguments for a batch size (tensors or arrays).
        batches: one or two batch sizes (two give fixed + per-sample costs).
        warmup: untraced calls per batch size first (tracing, Grappler, the
            executor's first runs).
        peaks: when given, filled with each batch's allocator peak over its
            warm-up calls (bytes, ``tf.config.experimental.get_memory_info``
            on the CPU; reset before them; the profiled call is not counted).
            Missing where TF keeps no such statistic.

    Raises:
        ValueError: bad `batches`, or the profile held no op events (then the
            step ran no ops TF times, or TF's trace format changed).
    """
    import tensorflow as tf

    batches = sorted({int(b) for b in batches})
    if not batches or batches[0] < 1 or len(batches) > 2:
        raise ValueError(f"batches={list(batches)}: give one or two batch sizes >= 1")
    measured: dict[int, dict[str, float]] = {}
    for batch in batches:
        args = tuple(make_args(batch))
        if peaks is not None:
            _reset_peak()
        for _ in range(warmup):
            synchronise(step(*args), on_gpu=False)
        if peaks is not None and (peak := _peak()):
            peaks[batch] = peak
        logdir = tempfile.mkdtemp(prefix="lms-profile-")
        try:
            tf.profiler.experimental.start(logdir)
            try:
                synchronise(step(*args), on_gpu=False)
            finally:
                tf.profiler.experimental.stop()
            measured[batch] = op_seconds_from_xspace(logdir)
        finally:
            shutil.rmtree(logdir, ignore_errors=True)
        if not measured[batch]:
            raise ValueError(f"the profile of batch {batch} holds no op events (TF {tf.__version__})")
        log.debug("profiled batch %d: %d ops, %.3f s of op time", batch, len(measured[batch]),
                  sum(measured[batch].values()))
    return OpCosts.fit(measured, source=f"tf.profiler, one step at each batch {batches}, TF {tf.__version__}")


def _reset_peak() -> None:
    import tensorflow as tf

    try:
        tf.config.experimental.reset_memory_stats("CPU:0")
    except (ValueError, RuntimeError):  # an allocator without statistics
        pass


def _peak() -> int | None:
    import tensorflow as tf

    try:
        return int(tf.config.experimental.get_memory_info("CPU:0")["peak"]) or None
    except (ValueError, RuntimeError, KeyError):
        return None


def xplane_events(logdir: str) -> Iterator[tuple[Any, Any, Any, str]]:
    """``(plane, line, event, event name)`` for every event of the xplane files TF's profiler wrote under `logdir`."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    for path in glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True):
        space = xplane_pb2.XSpace()
        with open(path, "rb") as fh:
            space.ParseFromString(fh.read())
        for plane in space.planes:
            names = {k: m.name for k, m in plane.event_metadata.items()}
            for line in plane.lines:
                for ev in line.events:
                    yield plane, line, ev, names.get(ev.metadata_id, "")


def op_seconds_from_xspace(logdir: str) -> dict[str, float]:
    """Wall seconds per op name from the xplane files TF's profiler wrote under `logdir`."""
    seconds: dict[str, float] = defaultdict(float)
    for _plane, _line, ev, name in xplane_events(logdir):
        op, sep, kind = name.rpartition(":")
        # op events are "name:Type"; skip "Class::method" and "Phrase: detail" events
        if not sep or not op or not kind or " " in name or "::" in name:
            continue
        seconds[op] += ev.duration_ps * 1e-12
    return dict(seconds)


def profile_batches(step: Callable[..., Any], make_args: Callable[[int], Sequence[Any]], base: int, *,
                    target_step_s: float = 1.0, min_factor: int = 4, max_factor: int = 16) -> tuple[int, int]:
    """Two batch sizes to profile at: the one whose step takes about `target_step_s`, and a quarter of it.

    Times one step at `base` (after one untimed call) and scales it by
    `min_factor` to `max_factor`. Larger batches fit better: the per-sample part
    of each op's time needs two sizes well apart, and the profiler's own per-op
    cost weighs less (ResNet-50 at 64x64 profiled at 2 and 8 predicted step
    times at batch 26-100 18-30% high, at 8 and 32 11-16%; the roofline was 5x
    off).
    """
    base = max(1, int(base))
    args = tuple(make_args(base))
    synchronise(step(*args), on_gpu=False)  # first call: Grappler, first allocations
    t0 = time.monotonic()
    synchronise(step(*args), on_gpu=False)
    one = max(time.monotonic() - t0, 1e-4)
    hi = base * int(min(max_factor, max(min_factor, target_step_s / one)))
    return max(base, hi // 4), hi
