"""What a simulation returns: `SimResult` and its per-op `Timeline` (plain data). No TensorFlow."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

import numpy as np

from .compiled import CompiledGraph

__all__ = ["SimResult", "Timeline", "TimelineEvent"]

_ROLE_NAMES = ("forward", "backward", "other")


@dataclass(frozen=True)
class TimelineEvent:
    """One point of interest in the executed order.

    Attributes:
        kind: ``"swap_out"``, ``"swap_in"``, ``"stall"``, ``"forward_end"``
            (after the last forward op) or ``"backward_start"``.
        index: position in the executed order.
        op: the op at that position.
        tensor: the swapped tensor (swap events), else ``""``.
        bytes: bytes copied (swap events), else 0.
        start_s: when the copy (or stall) began.
        end_s: when it ended.
    """

    kind: str
    index: int
    op: str
    tensor: str = ""
    bytes: int = 0
    start_s: float = 0.0
    end_s: float = 0.0


@dataclass(frozen=True)
class Timeline:
    """Per executed op: name, role, start time and device bytes in use (plain data)."""

    op_names: tuple[str, ...]
    roles: tuple[str, ...]
    start_s: tuple[float, ...]
    device_bytes: tuple[int, ...]
    host_bytes: tuple[int, ...]
    events: tuple[TimelineEvent, ...]
    forward_end_index: int
    backward_start_index: int

    def __len__(self) -> int:
        return len(self.op_names)

    def to_dict(self) -> dict[str, Any]:
        return {
            "op_names": list(self.op_names), "roles": list(self.roles), "start_s": list(self.start_s),
            "device_bytes": list(self.device_bytes), "host_bytes": list(self.host_bytes),
            "forward_end_index": self.forward_end_index,
            "backward_start_index": self.backward_start_index,
            "events": [e.__dict__.copy() for e in self.events],
        }


@dataclass(frozen=True)
class SimResult:
    """Predicted memory and time of one training step at one batch size (all PREDICTED).

    ``timeline`` is built on first access (a per-op `Timeline`); it is ``None``
    when the simulation ran with ``timeline=False``.

    ``peak_host_bytes`` is the host memory swapping holds at its peak: the
    swapped tensors whose host copies are live at position ``peak_host_index``
    (op ``peak_host_op``) of the executed order, each from its swap-out until
    its last swap-in read it (`lms.sim.host`).
    """

    batch: int
    peak_device_bytes: int
    peak_host_bytes: int
    step_time_s: float
    compute_time_s: float
    stall_time_s: float
    transfer_bytes: int
    peak_op: str
    peak_index: int
    resident_bytes: int
    peak_temporary_bytes: int
    n_swap_outs: int
    n_swap_ins: int
    peak_host_index: int = 0
    peak_host_op: str = ""
    _trace: "Trace | None" = field(default=None, repr=False, compare=False)

    def feasible(self, budget_bytes: int) -> bool:
        """True if the peak fits in `budget_bytes`."""
        return self.peak_device_bytes <= budget_bytes

    @property
    def throughput(self) -> float:
        """Samples per second (0 when no time model was given)."""
        return self.batch / self.step_time_s if self.step_time_s > 0 else 0.0

    @property
    def compiled(self) -> "CompiledGraph | None":
        """The compiled graph this run simulated (`lms.sim.compiled`: its buffers, sizes and op order), when the
        run kept its trace (``simulate(..., timeline=True)``); None otherwise."""
        return self._trace.cg if self._trace is not None else None

    @cached_property
    def timeline(self) -> Timeline | None:
        return self._trace.build() if self._trace is not None else None

    def to_dict(self, *, timeline: bool = False) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
        out["throughput"] = self.throughput
        if timeline and self.timeline is not None:
            out["timeline"] = self.timeline.to_dict()
        return out


@dataclass(frozen=True)
class Trace:
    """The raw arrays of one run, turned into a `Timeline` on demand."""

    cg: CompiledGraph
    start: np.ndarray
    device_bytes: np.ndarray
    host: np.ndarray
    out_start: np.ndarray
    out_done: np.ndarray
    in_start: np.ndarray
    in_done: np.ndarray
    out_bytes: np.ndarray
    in_bytes: np.ndarray
    stall_pos: list[int]
    stall_len: list[float]

    def build(self) -> Timeline:
        return _timeline(**{f.name: getattr(self, f.name) for f in fields(self)})


def _timeline(cg: CompiledGraph, start: np.ndarray, device_bytes: np.ndarray, host: np.ndarray,
              out_start: np.ndarray, out_done: np.ndarray, in_start: np.ndarray, in_done: np.ndarray,
              out_bytes: np.ndarray, in_bytes: np.ndarray, stall_pos: list[int],
              stall_len: list[float]) -> Timeline:
    names = cg.op_names
    events: list[TimelineEvent] = []
    for i, pos in enumerate(cg.swap_out_pos.tolist()):
        events.append(TimelineEvent("swap_out", pos, names[pos], cg.swap_out_tensor[i], int(out_bytes[i]),
                                    float(out_start[i]), float(out_done[i])))
    for i, pos in enumerate(cg.swap_in_pos.tolist()):
        out_i = int(cg.swap_in_out_index[i])
        tensor = cg.swap_out_tensor[out_i] if out_i >= 0 else cg.swap_in_tensor[i]
        events.append(TimelineEvent("swap_in", pos, names[pos], tensor, int(in_bytes[i]),
                                    float(in_start[i]), float(in_done[i])))
    for pos, length in zip(stall_pos, stall_len):
        s = float(start[pos])
        events.append(TimelineEvent("stall", pos, names[pos], start_s=s - length, end_s=s))
    if cg.forward_end >= 0:
        p = cg.forward_end
        events.append(TimelineEvent("forward_end", p, names[p], start_s=float(start[p]), end_s=float(start[p])))
    if cg.backward_start >= 0:
        p = cg.backward_start
        events.append(TimelineEvent("backward_start", p, names[p], start_s=float(start[p]),
                                    end_s=float(start[p])))
    events.sort(key=lambda e: (e.index, e.kind))
    return Timeline(
        op_names=names, roles=tuple(_ROLE_NAMES[r] for r in cg.roles.tolist()), start_s=tuple(start.tolist()),
        device_bytes=tuple(device_bytes.tolist()), host_bytes=tuple(host.tolist()), events=tuple(events),
        forward_end_index=cg.forward_end, backward_start_index=cg.backward_start)
