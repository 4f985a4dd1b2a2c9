"""The knob table: what the tuner searches, records and shows, read from `LMSConfig`'s fields.

Each `LMSConfig` field carries its knob metadata (`lms.config.knob`): the values
to search, a condition (``requires``), whether it matters without swaps
(``swaps_only``), how a short label shows it and whether it has a column of its
own. Everything below is derived from that one table, so a new field is
searched (`tuner.policy.space.SearchSpace`), deduplicated (`KnobTable.canonical_key`),
logged (`KnobTable.short_label`), written to ``trials.csv`` and reported
(`KnobTable.columns`) without a tuner edit::

    LMSConfig fields --knobs_of--> KnobTable --> SearchSpace, canonical_key, short_label, columns
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Mapping

from lms.config import LMSConfig

__all__ = ["Knob", "KnobTable", "KNOB_TABLE", "canonical_key", "short_label", "swap_note"]


@dataclass(frozen=True)
class Knob:
    """One field of the config as the tuner sees it (see `lms.config.knob` for the meaning of each)."""

    name: str
    default: Any
    search: Any = None
    requires: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    swaps_only: bool = False
    label: str | None = None
    show: str = "changed"
    column: bool = True
    warm: Any = None

    @property
    def searched(self) -> bool:
        return self.search is not None

    def values(self, *, n_candidates_range: range | None = None) -> tuple[Any, ...]:
        """The values searched (``"candidates"``: `n_candidates_range`)."""
        if self.search == "candidates":
            return tuple(n_candidates_range or ())
        return tuple(self.search)

    def applies(self, values: Mapping[str, Any]) -> bool:
        """Whether the knob matters given the (earlier) fields in `values`."""
        return all(values.get(k) == v for k, v in self.requires.items())

    def cast(self, value: Any) -> Any:
        """A stored Optuna parameter as the field's type (Optuna may hand back 4.0 for 4)."""
        if isinstance(self.default, bool):
            return bool(value)
        if isinstance(self.default, int):
            return int(value)
        if isinstance(self.default, str):
            return str(value)
        return value


def knobs_of(config_cls: type) -> tuple[Knob, ...]:
    """The knobs of a config dataclass, in field order (a field without metadata: held, not searched)."""
    out = []
    for f in dataclasses.fields(config_cls):
        meta = dict(f.metadata.get("knob") or {})
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        out.append(Knob(name=f.name, default=default, **meta))
    return tuple(out)


class KnobTable:
    """The knobs of one config class and everything derived from them.

    Args:
        config_cls: `LMSConfig`, or a subclass with more fields (tests add a dummy knob so).
    """

    def __init__(self, config_cls: type = LMSConfig) -> None:
        self.config_cls = config_cls
        self.knobs = knobs_of(config_cls)
        self.by_name = {k.name: k for k in self.knobs}

    @property
    def columns(self) -> tuple[str, ...]:
        """Trial-table columns (``trials.csv``, the report), in field order."""
        return tuple(k.name for k in self.knobs if k.column)

    @property
    def searched(self) -> tuple[Knob, ...]:
        return tuple(k for k in self.knobs if k.searched)

    @property
    def always_shown(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.knobs if k.show == "always")

    def from_dict(self, data: Mapping[str, Any]) -> Any:
        return self.config_cls.from_dict(data)

    def canonical(self, config: Any) -> Any:
        """The same plan, one representative: knobs that do not matter (LMS off, an unmet
        ``requires``) are set to their defaults."""
        values = config.to_dict()
        changes: dict[str, Any] = {}
        for k in self.knobs:
            default = list(k.default) if isinstance(k.default, tuple) else k.default
            if ((k.swaps_only and not config.enabled) or not k.applies(values)) and values[k.name] != default:
                values[k.name] = default
                changes[k.name] = k.default
        return config.replace(**changes) if changes else config

    def canonical_key(self, config: Any) -> str:
        """Identical for configs that plan identically (e.g. every ``n_tensors=0`` config)."""
        return json.dumps(self.canonical(config).to_dict(), sort_keys=True)

    def short_label(self, config: Any) -> str:
        """``n_tensors=40 lb=4 fuse branches>25``, ``no LMS``, or ``no swaps schedule=memory``: the knobs
        that say what the config does."""
        config = self.canonical(config)
        fields = config.to_dict()
        parts: list[str] = []
        for k in self.knobs:
            value = getattr(config, k.name)
            if k.label == "" or (not config.enabled and (k.swaps_only or k.search == "candidates")):
                continue  # LMS off: "no LMS" says it for n_tensors and every swap knob
            if k.show == "always" or value != k.default:
                parts.append((k.label or f"{k.name}={{value}}").format(value=value, **fields))
        if not config.enabled:  # nothing swapped or recomputed; other knobs (an order) may still act
            parts.insert(0, "no swaps" if parts else "no LMS")
        return " ".join(parts)

    def swap_note(self, config: Any) -> str:
        """``"LMS off"`` for a config that does nothing (no swaps, no recompute, no order pinned), ``"no swaps"``
        for one that swaps nothing but recomputes or pins an order (``n_tensors=0, recompute="cheap"``),
        ``""`` for one that swaps. `config`: a config or its dict (missing fields: defaults; unknown: ignored)."""
        if isinstance(config, Mapping):
            known = {k.name for k in self.knobs}
            config = self.from_dict({k: v for k, v in config.items() if k in known})
        if config.n_tensors != 0:
            return ""
        return "no swaps" if config.enabled or config.pins_order else "LMS off"


KNOB_TABLE = KnobTable(LMSConfig)


def canonical_key(config: LMSConfig) -> str:
    """`KnobTable.canonical_key` of the `LMSConfig` table."""
    return KNOB_TABLE.canonical_key(config)


def short_label(config: LMSConfig) -> str:
    """`KnobTable.short_label` of the `LMSConfig` table."""
    return KNOB_TABLE.short_label(config)


def swap_note(config: LMSConfig | Mapping[str, Any]) -> str:
    """`KnobTable.swap_note` of the `LMSConfig` table."""
    return KNOB_TABLE.swap_note(config)
