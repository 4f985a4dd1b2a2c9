"""The study's settings record, typed: what a search writes under the study's ``"tuner"`` attribute, and what
``best``, ``list`` and the report read back.

One schema, read in one place: a reader asks `StudyRecord.from_attrs` and gets named, typed fields (the
budget, the simulator's device profile, how the recommendation is picked) instead of looking keys up in
nested dicts and guessing where a value might be. Keys this version does not know are kept in `extra` and
written back unchanged, so an older or newer tuner's record survives a resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

__all__ = ["StudyRecord", "RECORD_SCHEMA_VERSION"]

RECORD_SCHEMA_VERSION = 1


def _int_or_none(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r}: must be an integer or null")
    return value


def _str(name: str, value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{name}={value!r}: must be a string")
    return value


def _mapping(name: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{name}={value!r}: must be an object")
    return dict(value)


@dataclass(frozen=True)
class StudyRecord:
    """A search's settings as stored with its study (`tuner.study.study.TUNER_ATTR`).

    Attributes:
        model / model_options / backend / device / safety_margin / max_batch / batch: the study's identity
            (`tuner.study.settings.SearchSettings.identity`): a resume must give the same.
        budget_bytes / budget_source / budget_from_batch: the device budget, how it was chosen.
        workload: the workload's description (`tuner.models.Workload.describe`).
        storage: where the study lives, as shown (passwords masked).
        selection: how the recommendation is picked (``prefer``, ``min_throughput_ratio``).
        host_budget_bytes / host_budget_source: the host-memory bound on the swapped tensors.
        space: the search space (`tuner.policy.space.SearchSpace.to_dict`); None until the setup finished.
        role: ``"main"``, or ``"screen"`` for a measured search's simulated screening study.
        screen_of: the main study a screening study belongs to.
        schema_version: this record's version.
        extra: keys this version does not know (kept and written back).
    """

    model: str = "?"
    model_options: Mapping[str, Any] = field(default_factory=dict)
    backend: str = ""
    device: str = ""
    safety_margin: float = 0.05
    max_batch: int = 4096
    batch: int | None = None
    budget_bytes: int | None = None
    budget_source: str = ""
    budget_from_batch: int | None = None
    workload: Mapping[str, Any] = field(default_factory=dict)
    storage: str = ""
    selection: Mapping[str, Any] = field(default_factory=dict)
    host_budget_bytes: int | None = None
    host_budget_source: str = ""
    space: Mapping[str, Any] | None = None
    role: str = "main"
    screen_of: str | None = None
    schema_version: int = RECORD_SCHEMA_VERSION
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> "StudyRecord":
        """The record of a ``"tuner"`` attribute's value; ValueError naming the first field of the wrong type.

            >>> r = StudyRecord.from_dict({"model": "resnet50", "budget_bytes": 603979776, "device": "cpu",
            ...                            "selection": {"prefer": "batch", "min_throughput_ratio": 0.8}, "x": 1})
            >>> r.model, r.budget_bytes, r.device, r.prefer, r.min_throughput_ratio, dict(r.extra)
            ('resnet50', 603979776, 'cpu', 'batch', 0.8, {'x': 1})
            >>> StudyRecord.from_dict({"budget_bytes": "576MiB"})
            Traceback (most recent call last):
            ...
            ValueError: budget_bytes='576MiB': must be an integer or null
        """
        known = {f.name for f in fields(cls)} - {"extra"}
        margin = record.get("safety_margin", 0.05)
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin):
            raise ValueError(f"safety_margin={margin!r}: must be a number")
        space = record.get("space")
        return cls(
            model=_str("model", record.get("model", "?")) or "?",
            model_options=_mapping("model_options", record.get("model_options")),
            backend=_str("backend", record.get("backend")), device=_str("device", record.get("device")),
            safety_margin=float(margin), max_batch=_int_or_none("max_batch", record.get("max_batch")) or 4096,
            batch=_int_or_none("batch", record.get("batch")),
            budget_bytes=_int_or_none("budget_bytes", record.get("budget_bytes")),
            budget_source=_str("budget_source", record.get("budget_source")),
            budget_from_batch=_int_or_none("budget_from_batch", record.get("budget_from_batch")),
            workload=_mapping("workload", record.get("workload")), storage=_str("storage", record.get("storage")),
            selection=_mapping("selection", record.get("selection")),
            host_budget_bytes=_int_or_none("host_budget_bytes", record.get("host_budget_bytes")),
            host_budget_source=_str("host_budget_source", record.get("host_budget_source")),
            space=_mapping("space", space) if space is not None else None,
            role=_str("role", record.get("role")) or "main", screen_of=record.get("screen_of"),
            schema_version=_int_or_none("schema_version", record.get("schema_version")) or RECORD_SCHEMA_VERSION,
            extra={k: v for k, v in record.items() if k not in known})

    def to_dict(self) -> dict[str, Any]:
        """The ``"tuner"`` attribute's value (JSON types; `extra` written back as it came)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        for key in ("model_options", "workload", "selection"):
            out[key] = dict(out[key])
        if out["space"] is not None:
            out["space"] = dict(out["space"])
        return {**dict(self.extra), **out}

    @property
    def prefer(self) -> str:
        return str(self.selection.get("prefer", "batch"))

    @property
    def min_throughput_ratio(self) -> float:
        return float(self.selection.get("min_throughput_ratio", 0.8))
