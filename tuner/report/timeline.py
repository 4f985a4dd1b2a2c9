"""The memory timeline of one training step, as plain data (no matplotlib, no TensorFlow).

A series is device bytes over the step plus the swap events, taken from a
simulator timeline (`lms.simulator.simulate(...).timeline`) or from a measured
trace in the same format (``Timeline.to_dict()``: ``op_names``, ``start_s``,
``device_bytes``, ``events``, ``backward_start_index``, ...). Each series says
which it is (``source``: ``"simulated"`` or ``"measured"``).

When the timeline has no times (a simulation without a device profile or
measured op costs: every ``start_s`` is 0), positions in the executed order
stand in for time and `TimelineSeries.x_is_time` is False.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["Transfer", "TimelineSeries", "Timeline", "series_from_timeline", "simulated_timeline",
           "load_measured_series"]

log = logging.getLogger(__name__)

SOURCES = ("simulated", "measured")


@dataclass(frozen=True)
class Transfer:
    """One swap-out (device -> host) or swap-in (host -> device) copy."""

    tensor: str
    nbytes: int
    start_s: float
    end_s: float
    index: int


@dataclass(frozen=True, eq=False)
class TimelineSeries:
    """Device memory over one step for one config.

    Attributes:
        label: e.g. ``"no LMS"``, ``"recommended"``.
        source: ``"simulated"`` or ``"measured"``.
        batch_size: the batch the step ran (or was simulated) at.
        time_s: x of each point (seconds, or positions when not `x_is_time`),
            one more than the ops: the last point is the step's end.
        device_bytes: device bytes from each x to the next (same length as
            `time_s`; the last value repeats the one before).
        x_is_time: whether `time_s` is seconds.
        forward_end_s: the end of the last forward op: the forward/backward
            boundary drawn in the plot (None if unknown).
        backward_start_s: where the first backward-role op runs (None if
            unknown). In TF's executor order this can be early: gradient
            constants and shape ops have no inputs and run at the start.
        swap_outs / swap_ins: the copies.
        peak_bytes / peak_time_s: the maximum and where it is.
        step_time_s: the step's duration (None without times).
    """

    label: str
    source: str
    batch_size: int
    time_s: np.ndarray
    device_bytes: np.ndarray
    x_is_time: bool
    backward_start_s: float | None
    forward_end_s: float | None
    swap_outs: tuple[Transfer, ...]
    swap_ins: tuple[Transfer, ...]
    peak_bytes: int
    peak_time_s: float
    step_time_s: float | None

    @property
    def swapped_bytes(self) -> int:
        """Bytes copied device -> host in the step."""
        return sum(t.nbytes for t in self.swap_outs)


@dataclass(frozen=True, eq=False)
class Timeline:
    """The series drawn together (one axis), e.g. no LMS vs recommended at one batch size."""

    series: tuple[TimelineSeries, ...]

    @property
    def x_is_time(self) -> bool:
        return all(s.x_is_time for s in self.series)


def _get(timeline: Any, name: str, default: Any = None) -> Any:
    if isinstance(timeline, Mapping):
        return timeline.get(name, default)
    return getattr(timeline, name, default)


def _event_fields(event: Any) -> dict[str, Any]:
    if isinstance(event, Mapping):
        return dict(event)
    return {k: getattr(event, k) for k in ("kind", "index", "op", "tensor", "bytes", "start_s", "end_s")}


def series_from_timeline(timeline: Any, *, label: str, source: str, batch_size: int,
                         step_time_s: float | None = None) -> TimelineSeries:
    """A `TimelineSeries` from a simulator `Timeline` (or its ``to_dict()``).

    Args:
        timeline: ``start_s`` and ``device_bytes`` per executed op, ``events``
            (``swap_out``/``swap_in`` with ``index``, ``tensor``, ``bytes``,
            ``start_s``, ``end_s``), ``backward_start_index``, ``forward_end_index``.
        label: the series' name in the legend.
        source: ``"simulated"`` or ``"measured"``.
        batch_size: the batch it describes.
        step_time_s: the step's end (default: the last transfer's or op's start).
    """
    if source not in SOURCES:
        raise ValueError(f"source={source!r}: expected one of {SOURCES}")
    start = np.asarray(_get(timeline, "start_s", ()), dtype=float)
    device = np.asarray(_get(timeline, "device_bytes", ()), dtype=np.int64)
    if start.shape != device.shape:
        raise ValueError(f"timeline has {start.size} start times but {device.size} memory samples")
    n = int(device.size)
    events = [_event_fields(e) for e in _get(timeline, "events", ()) or ()]
    ends = [float(e.get("end_s") or 0.0) for e in events]
    x_is_time = n > 0 and (float(start.max()) > 0 or (step_time_s or 0) > 0)
    if x_is_time:
        end = max([float(start[-1]), *ends, step_time_s or 0.0])
        xs = np.append(start, end)
    else:
        xs = np.arange(n + 1, dtype=float)

    def at(index: Any) -> float | None:
        if index is None or not isinstance(index, (int, np.integer)) or not 0 <= int(index) < n:
            return None
        return float(xs[int(index)])

    def transfer(e: Mapping[str, Any]) -> Transfer:
        index = int(e.get("index", 0))
        if x_is_time:
            s, t = float(e.get("start_s") or 0.0), float(e.get("end_s") or 0.0)
        else:
            s, t = float(index), float(index) + 1.0
        return Transfer(tensor=str(e.get("tensor", "")), nbytes=int(e.get("bytes", 0) or 0),
                        start_s=s, end_s=max(s, t), index=index)

    swap_outs = tuple(transfer(e) for e in events if e.get("kind") == "swap_out")
    swap_ins = tuple(transfer(e) for e in events if e.get("kind") == "swap_in")
    ys = np.append(device, device[-1] if n else 0)
    peak_i = int(np.argmax(device)) if n else 0
    return TimelineSeries(
        label=label, source=source, batch_size=int(batch_size), time_s=xs, device_bytes=ys,
        x_is_time=bool(x_is_time), backward_start_s=at(_get(timeline, "backward_start_index")),
        forward_end_s=_after(xs, _get(timeline, "forward_end_index"), n), swap_outs=swap_outs, swap_ins=swap_ins,
        peak_bytes=int(device[peak_i]) if n else 0, peak_time_s=float(xs[peak_i]) if n else 0.0,
        step_time_s=float(xs[-1]) if x_is_time else None)


def _after(xs: np.ndarray, index: Any, n: int) -> float | None:
    """x where op `index` ends (the next op's start, or the step's end)."""
    if index is None or not isinstance(index, (int, np.integer)) or not 0 <= int(index) < n:
        return None
    return float(xs[int(index) + 1])


def simulated_timeline(graph: Any, configs: Sequence[tuple[str, Any]], *, batch: int,
                       device: Any = None, **simulate_kwargs: Any) -> Timeline:
    """Simulate `graph` once per (label, LMSConfig) at `batch`; one series each.

    Args:
        graph: an `lms.graph.Graph`.
        configs: (label, config) pairs, e.g. ``[("no LMS", LMSConfig(n_tensors=0)), ...]``.
        batch: the batch size for every series (compare configs at one batch).
        device: `DeviceProfile`, its name or None (passed to `lms.simulator.simulate`).
        simulate_kwargs: more `simulate` options (``op_costs``, ``resident_bytes``, ...).
    """
    simulate = _simulate_function()
    series = []
    for label, config in configs:
        result = simulate(graph, config, batch=batch, device=device, **simulate_kwargs)
        series.append(series_from_timeline(result.timeline, label=label, source="simulated", batch_size=batch,
                                           step_time_s=result.step_time_s or None))
    return Timeline(series=tuple(series))


def _simulate_function() -> Any:
    try:
        from lms.simulator import simulate
    except ImportError:
        from lms.sim.interpreter import simulate
    return simulate


def load_measured_series(path: str | Path, *, label: str) -> TimelineSeries:
    """A measured step from a JSON trace in the ``Timeline.to_dict()`` format.

    The file also carries ``"batch_size"`` and, optionally, ``"step_time_s"``.

    Raises:
        ValueError: the file is not such a trace.
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON trace ({exc})") from None
    if not isinstance(doc, Mapping) or "device_bytes" not in doc or "start_s" not in doc:
        raise ValueError(f"{path}: a measured trace needs 'start_s' and 'device_bytes' lists")
    batch = doc.get("batch_size")
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"{path}: key 'batch_size'={batch!r} must be a positive integer")
    return series_from_timeline(doc, label=label, source="measured", batch_size=batch,
                                step_time_s=doc.get("step_time_s"))
