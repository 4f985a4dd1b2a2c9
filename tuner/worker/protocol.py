"""The trial worker's protocol: typed, versioned requests and results, serialised as JSON.

The parent (no TensorFlow) writes a request; the worker (``python -m
tuner.trial``) reads it, works, and writes a result of the matching kind::

    {"protocol": 1, "mode": "measure", "events": ".../events.jsonl", "result": ".../result.json",
     "request": {...MeasureRequest fields...}}        ──▶  worker
    {...MeasureResult fields...}                        ◀──  result.json

Every default lives here, once, on the dataclasses; both sides read and write
through `to_json` / `from_dict`, so a field is never read back with a default
of its own. A request of another protocol version, or with unknown fields, is
refused (`ProtocolError`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

__all__ = [
    "PROTOCOL_VERSION", "ProtocolError", "DescribeRequest", "TraceRequest", "MeasureRequest",
    "DescribeResult", "TraceResult", "MeasureResult", "Envelope", "result_type",
]

PROTOCOL_VERSION = 1


class ProtocolError(ValueError):
    """A request or result that does not follow this version of the protocol."""


def _from_dict(cls: type, data: Mapping[str, Any]) -> Any:
    if not isinstance(data, Mapping):
        raise ProtocolError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ProtocolError(f"{cls.__name__}: unknown field {unknown[0]!r}")
    kwargs = {k: tuple(v) if isinstance(v, list) and str(known[k].type).startswith("tuple") else v
              for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ProtocolError(f"{cls.__name__}: {exc}") from None


class _Message:
    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self), default=_json_default,  # type: ignore[call-overload]
                                     allow_nan=False))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        return _from_dict(cls, data)


# ------------------------------------------------------------------ requests

@dataclass(frozen=True)
class DescribeRequest(_Message):
    """Load a workload and describe it (checks a user's ``module:function`` away from the parent)."""

    mode: ClassVar[str] = "describe"
    workload: str
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TraceRequest(_Message):
    """Trace the training step; write the `lms.graph.Graph` JSON (``tuner.graph``) to `output`.

    Attributes:
        key: stored with the graph: the cache is reused only for the same key.
        profile_batches: also profile per-op times (emulated backend): at exactly these two batches, or, given
            one, from it up to where a step takes about a second (a choice that moves with the machine's load).
    """

    mode: ClassVar[str] = "trace"
    workload: str
    output: str
    options: Mapping[str, Any] = field(default_factory=dict)
    key: Mapping[str, Any] = field(default_factory=dict)
    profile_batches: tuple[int, ...] = ()


@dataclass(frozen=True)
class MeasureRequest(_Message):
    """The max-batch search for one config (`tuner.policy.batch.search_max_batch`), then a timed run.

    Attributes:
        config: the `LMSConfig` as a dict.
        backend: the backend's name (`tuner.backends.get_backend` in the worker).
        usable_bytes: the budget a batch must fit, safety margin already taken off.
        start_batch / cap: first probe and largest batch.
        fixed_batch: measure at `start_batch` only (``--batch``): one timed run, no batch search;
            a peak over `usable_bytes` makes the config infeasible there.
        stop_over_budget: with `fixed_batch`, end the timed steps at the first whose peak is over
            `usable_bytes` (the batch does not fit whatever the later steps do).
        slope_bytes_per_sample: the simulator's, to aim the next probe.
        resolution / max_probes: when the batch search stops.
        probe_warmup / probe_steps: steps per probe; warmup / steps: of the timed run.
        trial: the trial number (names the trial in events; test-only fault injection).
        confirm: 0 for the trial's own measurement; k for its k-th re-measurement in a fresh process
            (`tuner.backends.confirm`).
        bandwidth: host link bandwidth for emulated swaps (bytes/s; None: the emulator's default).
        device_memory_limit_bytes: the GPU's ``memory_limit`` (gpu backend: the budget, enforced by a
            logical device; None: no limit).
        host_memory_limit_bytes: ``TF_GPU_HOST_MEM_LIMIT_IN_MB`` for the worker's pinned host memory
            (gpu backend; None: TF's default; a value in the worker's environment wins).
    """

    mode: ClassVar[str] = "measure"
    workload: str
    config: Mapping[str, Any]
    backend: str
    usable_bytes: int
    options: Mapping[str, Any] = field(default_factory=dict)
    start_batch: int = 1
    cap: int = 4096
    fixed_batch: bool = False
    slope_bytes_per_sample: float | None = None
    warmup: int = 2
    steps: int = 5
    seed: int = 0
    resolution: float = 0.05
    max_probes: int = 6
    probe_warmup: int = 2
    probe_steps: int = 2
    trial: int | None = None
    confirm: int = 0
    bandwidth: float | None = None
    device_memory_limit_bytes: int | None = None
    host_memory_limit_bytes: int | None = None
    stop_over_budget: bool = False


_REQUESTS = {cls.mode: cls for cls in (DescribeRequest, TraceRequest, MeasureRequest)}


# ------------------------------------------------------------------ results

@dataclass(frozen=True)
class DescribeResult(_Message):
    status: str
    reason: str = ""
    workload: Mapping[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0


@dataclass(frozen=True)
class TraceResult(_Message):
    status: str
    reason: str = ""
    n_ops: int = 0
    trace_s: float = 0.0
    tensorflow: str = ""
    op_costs: bool = False
    wall_s: float = 0.0


@dataclass(frozen=True)
class MeasureResult(_Message):
    """Status ``ok`` (a batch fits: figures at it), ``infeasible`` / ``oom`` (none fits), ``error``, ``bad_input``."""

    status: str
    reason: str = ""
    batch_size: int = 0
    throughput: float = 0.0
    peak_device_bytes: int | None = None
    peak_source: str = ""
    fits_budget: bool | None = None
    step_time_median_s: float | None = None
    step_time_spread_s: float | None = None
    step_times_s: tuple[float, ...] | None = None
    nvml_process_peak_bytes: int | None = None
    nvml_device_peak_bytes: int | None = None
    host_peak_rss_bytes: int | None = None
    host_copies_peak_bytes: int | None = None
    search: Mapping[str, Any] | None = None
    tensorflow: str | None = None
    device: str | None = None
    lms_summary: Mapping[str, Any] | None = None
    injected_fault: str | None = None
    wall_s: float = 0.0

    #: Figures copied into the trial record when the worker reported them.
    RECORDED: ClassVar[tuple[str, ...]] = (
        "step_time_median_s", "step_time_spread_s", "step_times_s", "nvml_process_peak_bytes",
        "nvml_device_peak_bytes", "host_peak_rss_bytes", "host_copies_peak_bytes", "lms_summary", "tensorflow",
        "device")


_RESULTS = {"describe": DescribeResult, "trace": TraceResult, "measure": MeasureResult}


def result_type(mode: str) -> type:
    """The result class of a request mode."""
    return _RESULTS[mode]


@dataclass(frozen=True)
class Envelope:
    """What travels in ``request.json``: the request and where the worker writes events and its result."""

    request: DescribeRequest | TraceRequest | MeasureRequest
    events: str = ""
    result: str = ""

    def to_json(self) -> str:
        return json.dumps({"protocol": PROTOCOL_VERSION, "mode": self.request.mode, "events": self.events,
                           "result": self.result, "request": self.request.to_dict()}, indent=2,
                          allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Envelope":
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("protocol") != PROTOCOL_VERSION:
            got = doc.get("protocol") if isinstance(doc, dict) else None
            raise ProtocolError(f"worker protocol {got!r}; this worker speaks {PROTOCOL_VERSION}")
        mode = doc.get("mode")
        if mode not in _REQUESTS:
            raise ProtocolError(f"unknown worker mode {mode!r}")
        return cls(_REQUESTS[mode].from_dict(doc.get("request") or {}), str(doc.get("events") or ""),
                   str(doc.get("result") or ""))


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)
