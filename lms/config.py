"""`LMSConfig`: the TFLMS knobs, validated once, saved and loaded as JSON.

The field names and defaults are those of TFLMS v1 (Le, Imai et al., 2018), so a
TFLMS user's settings carry over unchanged.

The file format is plain JSON (never pickle or eval)::

    {"schema": "lms.config", "schema_version": 3,
     "config": {"n_tensors": 100, "lb": 5, ...}}

Version 2 added the scheduling knobs (``schedule``, ``serialization``,
``serialization_by_size``, ``sync_mode``) and ``recompute``; version-1 files
are still read (their configs get the defaults: TF's executor decides the
order and nothing is recomputed, as before). Version 3 added ``prefetch``;
version-2 files get its default (swap-ins placed by ``lb``, as before).

`LMSConfig.load` also reads any document that embeds a config under
``"config"`` and whose schema its writer registered (`register_document_schema`),
such as the tuner's ``recommended.json``, so a training script can load a tuning
result directly. A package registers its schema when imported, or ahead of time
with an entry point in the group ``lms.document_schemas`` named after the schema
(the tuner's ``pyproject.toml`` does); only the entry point named exactly like a
file's schema is loaded, so a file cannot make ``lms`` import anything else.
``lms`` itself knows no other package.

Every field is a *knob* (`knob`): its metadata says what a tuner needs to
search it, record it and show it, so a new field is tuned without editing the
tuner (see `knob` for the keys).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import numbers
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .tuned import describe_conditions

from .atomic import atomic_write_bytes, atomic_write_text
from .jsonfile import DuplicateKey, NotJSONNumber, finite_float, no_constant, read_config_text, unique_keys
from .optypes import RECOMPUTABLE_TYPES, never_recomputed

__all__ = ["LMSConfig", "CONFIG_SCHEMA", "SCHEMA_VERSION", "READABLE_VERSIONS", "STRATEGIES", "SCHEDULES",
           "SYNC_MODES", "RECOMPUTE_MODES", "PREFETCH_MODES", "MAX_INT", "knob", "register_document_schema", "atomic_write_text",
           "atomic_write_bytes"]

CONFIG_SCHEMA = "lms.config"
SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
STRATEGIES = ("chain_rule", "direct_order")
SCHEDULES = ("tf", "memory")
SYNC_MODES = (0, 1, 2, 3)
RECOMPUTE_MODES = ("none", "cheap")
PREFETCH_MODES = ("lb", "headroom")
#: Integer fields stay below this (a 400-digit count is a typo, and TF's attributes are 32-bit).
MAX_INT = 2**31
log = logging.getLogger(__name__)

#: Schemas of documents that embed an LMS config under "config": schema -> the version read.
_DOCUMENT_SCHEMAS: dict[str, int] = {}
_ENTRY_POINTS_TRIED: set[str] = set()
#: Entry-point group through which an installed package registers a document schema (name = schema).
DOCUMENT_SCHEMAS_GROUP = "lms.document_schemas"


def register_document_schema(schema: str, version: int) -> None:
    """Let `LMSConfig.load` read the ``"config"`` member of documents of `schema` (version `version`).

    Called by a package that writes such documents when it is imported (the
    tuner registers ``"tuner.recommendation"``).
    """
    if not isinstance(schema, str) or not schema or schema == CONFIG_SCHEMA:
        raise ValueError(f"schema {schema!r}: give a non-empty name other than {CONFIG_SCHEMA!r}")
    _DOCUMENT_SCHEMAS[schema] = int(version)


def _registered(schema: Any) -> bool:
    """Whether `schema` is registered, loading the ``lms.document_schemas`` entry point of that name once."""
    if not isinstance(schema, str) or schema in _DOCUMENT_SCHEMAS:
        return schema in _DOCUMENT_SCHEMAS
    if schema not in _ENTRY_POINTS_TRIED:
        _ENTRY_POINTS_TRIED.add(schema)
        from importlib.metadata import entry_points

        for entry in entry_points(group=DOCUMENT_SCHEMAS_GROUP, name=schema):
            try:
                entry.load()  # importing the writer's package registers the schema
            except Exception:  # noqa: BLE001 - a broken plugin must not break loading an lms.config file
                continue
    return schema in _DOCUMENT_SCHEMAS


def knob(default: Any, *, search: Any = None, requires: Mapping[str, Any] | None = None, swaps_only: bool = False,
         label: str | None = None, show: str = "changed", column: bool = True, warm: Any = None) -> Any:
    """A `LMSConfig` field, with what a tuner needs to search, record and show it (field metadata ``"knob"``).

    Args:
        default: the field's default.
        search: the values a tuner tries: a tuple (categories), a ``range`` (integers),
            ``"candidates"`` (0 .. every swap candidate of the graph, `n_tensors` only), or
            None: not searched (held at `default`).
        requires: ``{field: value}``: the knob only matters when those (earlier) fields
            have those values, e.g. ``branch_threshold`` needs ``swap_branches=True``;
            otherwise it is held at `default` (and not searched).
        swaps_only: the knob means nothing when the config swaps nothing (``n_tensors=0``).
        label: how a short label shows it, a `str.format` string over ``value`` and the
            config's fields (``"fuse"``, ``"branches>{branch_threshold}"``); ``""``: never
            shown on its own; None: ``name=value``.
        show: ``"always"``, or ``"changed"`` (only when it differs from `default`).
        column: a column of its own in trial tables (``trials.csv``, the report).
        warm: a value worth trying first: a tuner also starts from TFLMS's defaults with
            this knob at `warm` (None: no such start).
    """
    if show not in ("always", "changed"):
        raise ValueError(f"knob show={show!r}: allowed values are 'always', 'changed'")
    meta = {"search": search, "requires": dict(requires or {}), "swaps_only": swaps_only, "label": label,
            "show": show, "column": column, "warm": warm}
    return field(default=default, metadata={"knob": meta})


@dataclass(frozen=True)
class LMSConfig:
    """Which tensors to swap to host memory and when to bring them back.

    Attributes:
        n_tensors: how many candidate tensors to swap, in forward topological
            order (earliest first). ``-1``: every candidate; ``0``: LMS off.
        lb: lower bound, in topological levels, of how far before its first
            backward consumer a tensor's swap-in is triggered (``1`` = just in
            time; larger = earlier prefetch, more overlap, more memory held).
        ub: upper bound of that distance; the trigger is the nearest valid op
            in ``[lb, ub]``.
        fuse_swapins: one swap-in serves all backward consumers of a tensor
            whose levels lie within ``lb`` of each other (fewer transfers,
            the tensor is held longer); ``False``: one swap-in per consumer.
        ctrld_strategy: how the trigger op is found: ``"chain_rule"`` (walk
            forward from the producer and use the gradient ops of what is found)
            or ``"direct_order"`` (ops ``k`` levels earlier in the whole graph's
            topological order).
        swap_branches: also swap tensors whose *forward* consumers are more
            than ``branch_threshold`` levels apart (long skip connections).
        branch_threshold: see ``swap_branches``.
        incl_scopes / excl_scopes: only / never swap tensors produced by ops
            whose name starts with one of these scopes.
        incl_types / excl_types: only / never swap tensors produced by ops of
            these types.
        schedule: who orders the step's ops: ``"tf"`` (TensorFlow's executor,
            as without LMS) or ``"memory"`` (`lms.schedule.schedule_ops`: a
            topological order chosen for the lowest simulated peak, pinned with
            control edges so that it is the order that runs: on one CPU device
            through every op of TF's optimized graph, `lms.schedule.exact_order`; on a GPU
            through the ops no Grappler rewrite touches).
        serialization: TFLMS v2's option: topological levels whose ops are
            chained one after another by control edges, each entry a level
            (``3``) or an inclusive range (``"3:5"``: levels 3, 4 and 5; ``"3:"``
            to the last level). Empty: off.
        serialization_by_size: TFLMS v2's option: also serialize every level
            whose ops' outputs together exceed this many GiB (at the traced
            batch). ``0``: off.
        sync_mode: TFLMS v2's option: ``0`` copies overlap compute; ``1``
            swap-outs are synchronous (the forward op after a swap-out waits
            until the copy is done); ``2`` swap-ins are synchronous (each is
            triggered right before its first reader, no prefetch); ``3`` both.
        recompute: which saved forward tensors the backward pass may rebuild
            from kept or swapped-in tensors instead of keeping or swapping them
            (`lms.plan.recompute_planner`): ``"none"`` (default: keep or swap only),
            ``"cheap"`` (the planner's choice among `lms.optypes.RECOMPUTABLE_TYPES`:
            elementwise ops, BatchNorm's normalisation, ``BiasAdd``, ``Relu``,
            ``Cast``, ``Pad``, views), or a list of those op types (only they are
            cloned). Random and stateful ops are never recomputed. The
            ``incl_*``/``excl_*`` filters apply to recomputed tensors too.
        prefetch: where a memory schedule puts each swap-in: ``"lb"`` (default:
            ``lb - 1`` ops before its first reader, TFLMS's placement) or
            ``"headroom"`` (as early as the order's memory headroom allows,
            no earlier than its trigger, so the copy overlaps more compute;
            `lms.schedule`). Needs ``schedule="memory"`` and asynchronous
            swap-ins (``sync_mode`` 0 or 1).
    """

    n_tensors: int = knob(-1, search="candidates", label="n_tensors={value}", show="always")
    lb: int = knob(1, search=range(1, 14, 3), swaps_only=True, label="lb={value}", show="always")
    ub: int = knob(10000, swaps_only=True)  # the planner takes the nearest trigger at or beyond lb anyway
    fuse_swapins: bool = knob(False, search=(False, True), swaps_only=True, label="fuse")
    ctrld_strategy: str = knob("chain_rule", search=STRATEGIES, swaps_only=True, label="{value}")
    swap_branches: bool = knob(False, search=(False, True), swaps_only=True, label="branches>{branch_threshold}")
    branch_threshold: int = knob(0, search=range(10, 41, 15), requires={"swap_branches": True}, swaps_only=True,
                                 label="")
    incl_scopes: tuple[str, ...] = knob((), swaps_only=True, column=False)
    excl_scopes: tuple[str, ...] = knob((), swaps_only=True, column=False)
    incl_types: tuple[str, ...] = knob((), swaps_only=True, column=False)
    excl_types: tuple[str, ...] = knob((), swaps_only=True, column=False)
    # The memory schedule is this project's lever for the batch; a search starts from it too.
    schedule: str = knob("tf", search=SCHEDULES, label="schedule={value}", warm="memory")
    serialization: tuple[int | str, ...] = knob((), column=False)
    serialization_by_size: float = knob(0.0, label="serialize>{value}GiB")
    # Synchronous swap-ins (2, 3) only remove prefetch, so the tuner tries 0 and 1 (paced swap-outs).
    sync_mode: int = knob(0, search=(0, 1), swaps_only=True, label="sync={value}")
    recompute: str | tuple[str, ...] = knob("none", search=RECOMPUTE_MODES, label="recompute={value}")
    prefetch: str = knob("lb", search=PREFETCH_MODES, requires={"schedule": "memory"}, swaps_only=True,
                         label="prefetch={value}")

    def __post_init__(self) -> None:
        for name in ("n_tensors", "lb", "ub", "branch_threshold"):
            object.__setattr__(self, name, _check_int(name, getattr(self, name)))
        for name in ("fuse_swapins", "swap_branches"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"LMSConfig.{name}={value!r}: must be true or false")
        for name in ("incl_scopes", "excl_scopes", "incl_types", "excl_types"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
                raise ValueError(
                    f"LMSConfig.{name}={value!r}: must be a list of strings, e.g. [\"resnet50/conv1\"]")
            for item in value:
                if not isinstance(item, str) or not item:
                    raise ValueError(
                        f"LMSConfig.{name} contains {item!r}: every entry must be a non-empty string")
            object.__setattr__(self, name, tuple(value))
        if self.n_tensors < -1:
            raise ValueError(
                f"LMSConfig.n_tensors={self.n_tensors}: must be -1 (all candidates), 0 (off) or a positive count")
        if self.lb < 1:
            raise ValueError(f"LMSConfig.lb={self.lb}: must be >= 1 (1 = just in time)")
        if self.ub < 1:
            raise ValueError(f"LMSConfig.ub={self.ub}: must be >= 1")
        if self.lb > self.ub:
            raise ValueError(f"LMSConfig.lb={self.lb} > ub={self.ub}: lb must not exceed ub")
        if self.ctrld_strategy not in STRATEGIES:
            raise ValueError(
                f"LMSConfig.ctrld_strategy={self.ctrld_strategy!r}: allowed values are "
                + ", ".join(repr(s) for s in STRATEGIES))
        if self.branch_threshold < 0:
            raise ValueError(f"LMSConfig.branch_threshold={self.branch_threshold}: must be >= 0")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"LMSConfig.schedule={self.schedule!r}: allowed values are "
                             + ", ".join(repr(s) for s in SCHEDULES))
        if (isinstance(self.sync_mode, bool) or not isinstance(self.sync_mode, numbers.Integral)
                or self.sync_mode not in SYNC_MODES):
            raise ValueError(f"LMSConfig.sync_mode={self.sync_mode!r}: allowed values are 0 (off), "
                             "1 (swap-outs synchronous), 2 (swap-ins synchronous), 3 (both)")
        object.__setattr__(self, "sync_mode", int(self.sync_mode))
        size = self.serialization_by_size
        if isinstance(size, bool) or not isinstance(size, (int, float)) or not size >= 0 or size == float("inf"):
            raise ValueError(f"LMSConfig.serialization_by_size={size!r}: must be a finite number of GiB >= 0 "
                             "(0 = off)")
        object.__setattr__(self, "serialization_by_size", float(size))
        object.__setattr__(self, "serialization", _serialization(self.serialization))
        object.__setattr__(self, "recompute", _check_recompute(self.recompute))
        if self.prefetch not in PREFETCH_MODES:
            raise ValueError(f"LMSConfig.prefetch={self.prefetch!r}: allowed values are "
                             + ", ".join(repr(s) for s in PREFETCH_MODES))
        if self.prefetch != "lb" and self.schedule != "memory":
            raise ValueError(f"LMSConfig.prefetch={self.prefetch!r} needs schedule='memory' (got "
                             f"{self.schedule!r}): only a pinned order places swap-ins by headroom")
        if self.prefetch != "lb" and self.sync_mode in (2, 3):
            raise ValueError(f"LMSConfig.prefetch={self.prefetch!r} needs asynchronous swap-ins: sync_mode="
                             f"{self.sync_mode} runs each right before its reader (allowed with it: 0, 1)")

    @property
    def enabled(self) -> bool:
        """False when the config swaps nothing (``n_tensors == 0``) and recomputes nothing."""
        return self.n_tensors != 0 or self.recompute != "none"

    @property
    def recompute_types(self) -> frozenset[str]:
        """Op types the recompute planner may clone (empty for ``recompute="none"``)."""
        if self.recompute == "none":
            return frozenset()
        if self.recompute == "cheap":
            return RECOMPUTABLE_TYPES
        return frozenset(self.recompute)

    @property
    def pins_order(self) -> bool:
        """True when the config adds ordering edges (a memory schedule, serialization, sync_mode)."""
        return (self.schedule != "tf" or bool(self.serialization) or self.serialization_by_size > 0
                or self.sync_mode != 0)

    @property
    def off(self) -> bool:
        """True when the config changes nothing in the step: no swap, no recompute, no ordering edge."""
        return not self.enabled and not self.pins_order

    def replace(self, **changes: Any) -> "LMSConfig":
        """A copy with some fields changed (validated like a new config)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields (tuples become lists)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LMSConfig":
        """Build from a mapping of fields; unknown keys and wrong types are errors.

        Raises:
            ValueError: naming the offending key, its value and what is allowed.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"LMS config must be a JSON object, got {type(data).__name__}")
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(
                f"unknown LMS config key {unknown[0]!r}; allowed keys: " + ", ".join(known))
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            default = known[key].default if known[key].default is not dataclasses.MISSING else ()
            if key == "recompute":
                if isinstance(value, list):
                    value = tuple(value)
                kwargs[key] = value  # checked by _check_recompute
                continue
            if isinstance(default, bool):
                if not isinstance(value, bool):
                    raise ValueError(f"LMS config key {key!r}={value!r}: must be true or false")
            elif key == "serialization":
                if not isinstance(value, list):
                    raise ValueError(f"LMS config key {key!r}={value!r}: must be a list of levels and "
                                     "'a:b' ranges, e.g. [1, \"3:5\"]")
                value = tuple(value)
            elif isinstance(default, float):
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError(f"LMS config key {key!r}={value!r}: must be a number")
            elif isinstance(default, int):
                _check_int(key, value)
            elif isinstance(default, str):
                if not isinstance(value, str):
                    raise ValueError(f"LMS config key {key!r}={value!r}: must be a string")
            elif isinstance(default, tuple):
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ValueError(f"LMS config key {key!r}={value!r}: must be a list of strings")
                value = tuple(value)
            kwargs[key] = value
        return cls(**kwargs)

    def to_json(self) -> str:
        doc = {"schema": CONFIG_SCHEMA, "schema_version": SCHEMA_VERSION, "config": self.to_dict()}
        return json.dumps(doc, indent=2, sort_keys=False, allow_nan=False) + "\n"

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the config as JSON, atomically (temp file + rename)."""
        return atomic_write_text(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "LMSConfig":
        """Read a config file, or the ``config`` of a registered document (a tuner ``recommended.json``).

        A document's optional ``"tuned_for"`` object (the tuner writes the batch size, and
        the model option it grew) is logged at INFO: the config was chosen for that setting.

        Raises:
            FileNotFoundError: the file does not exist.
            ValueError: not a regular file (a FIFO, a device, a folder), larger
                than `lms.jsonfile.MAX_CONFIG_BYTES`, not valid JSON, the wrong schema or
                version, or its config has unknown keys or wrong types.
        """
        path = Path(path)
        text = read_config_text(path)
        try:
            doc = json.loads(text, object_pairs_hook=unique_keys, parse_constant=no_constant, parse_float=finite_float)
        except NotJSONNumber as exc:  # Python's json reads NaN and Infinity; no other reader does
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        except RecursionError:
            raise ValueError(f"{path}: not valid JSON (nested too deeply)") from None
        except DuplicateKey as exc:  # JSON would keep the last one silently: which one did the writer mean?
            raise ValueError(f"{path}: key {exc.args[0]!r} is given twice") from None
        try:
            config = cls.from_document(doc)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        tuned_for = doc.get("tuned_for")
        if isinstance(tuned_for, dict) and tuned_for:
            said = ", ".join(f"{'batch' if k == 'batch_size' else k} {v}" for k, v in tuned_for.items())
            under = doc.get("measured_under")
            if isinstance(under, dict) and under.get("program"):
                said += f", measured under {describe_conditions(under)}"
            log.info("LMS config from %s was tuned for %s", path, said)
            tuned = {"path": str(path), **tuned_for}
            for key in ("usable_bytes", "budget_bytes", "measured_under"):
                if doc.get(key) is not None:
                    tuned[key] = doc[key]
            object.__setattr__(config, "_tuned", tuned)  # not a field: equality and hashing ignore it
        return config

    @property
    def tuned(self) -> dict[str, Any] | None:
        """What a config loaded from a tuner ``recommended.json`` was tuned for, else None.

        Keys: ``path``, ``batch_size`` (and a grown model option), ``usable_bytes`` (the budget
        its peak was held to), ``budget_bytes``, and ``measured_under``: the conditions its peak
        was measured under (`describe_conditions`). `lms.enable_lms` checks ``fit``'s peak against
        ``usable_bytes`` and warns when the program differs (`lms.tf.fit_peaks`).
        """
        tuned = getattr(self, "_tuned", None)
        return dict(tuned) if tuned else None

    @classmethod
    def from_document(cls, doc: Any) -> "LMSConfig":
        """Parse a loaded JSON document (a config file, or a registered document that embeds one)."""
        if not isinstance(doc, dict):
            raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
        schema = doc.get("schema")
        if schema != CONFIG_SCHEMA and not _registered(schema):
            known = (CONFIG_SCHEMA, *_DOCUMENT_SCHEMAS)
            raise ValueError(f"key 'schema'={schema!r}: expected one of " + ", ".join(repr(s) for s in known))
        version = doc.get("schema_version")
        readable = READABLE_VERSIONS if schema == CONFIG_SCHEMA else (_DOCUMENT_SCHEMAS[schema],)
        if isinstance(version, bool) or version not in readable:
            raise ValueError(f"key 'schema_version'={version!r}: this version reads "
                             + " and ".join(str(v) for v in readable))
        if schema == CONFIG_SCHEMA:
            extra = sorted(set(doc) - {"schema", "schema_version", "config"})
            if extra:
                raise ValueError(f"unknown key {extra[0]!r}; allowed: schema, schema_version, config")
        if "config" not in doc:
            raise ValueError("missing key 'config'")
        return cls.from_dict(doc["config"])


def _serialization(value: Any) -> tuple[int | str, ...]:
    """Check TFLMS v2 ``serialization`` entries: levels (ints >= 0) and ``"a:b"`` / ``"a:"`` ranges."""
    allowed = "a level (integer >= 0) or a range 'a:b' / 'a:' of levels with 0 <= a <= b"
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        raise ValueError(f"LMSConfig.serialization={value!r}: must be a list whose entries are each {allowed}, "
                         "e.g. [1, \"3:5\", 7]")
    out: list[int | str] = []
    for item in value:
        if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
            out.append(item)
            continue
        if isinstance(item, str):
            m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d*)\s*", item)
            if m and (not m.group(2) or int(m.group(1)) <= int(m.group(2))):
                out.append(f"{int(m.group(1))}:{m.group(2) and int(m.group(2))}")
                continue
            if re.fullmatch(r"\s*\d+\s*", item):
                out.append(int(item))
                continue
        raise ValueError(f"LMSConfig.serialization contains {item!r}: each entry must be {allowed}")
    return tuple(out)


def serialization_levels(entries: tuple[int | str, ...], n_levels: int) -> tuple[int, ...]:
    """The levels a ``serialization`` list names, below `n_levels`, ascending."""
    levels: set[int] = set()
    for item in entries:
        if isinstance(item, int):
            lo = hi = item
        else:
            a, b = item.split(":")
            lo, hi = int(a), (int(b) if b else n_levels - 1)
        levels.update(range(lo, min(hi, n_levels - 1) + 1))
    return tuple(sorted(levels))
def _check_recompute(value: Any) -> str | tuple[str, ...]:
    """``"none"``, ``"cheap"`` or a tuple of recomputable op types; ValueError naming the field otherwise."""
    allowed = "'none', 'cheap' or a list of op types, e.g. [\"Relu\", \"BiasAdd\"]"
    if isinstance(value, str):
        if value not in RECOMPUTE_MODES:
            raise ValueError(f"LMSConfig.recompute={value!r}: allowed values are {allowed}")
        return value
    if not isinstance(value, (tuple, list)) or not value:
        raise ValueError(f"LMSConfig.recompute={value!r}: allowed values are {allowed}")
    for item in value:
        if not isinstance(item, str) or not item:
            raise ValueError(f"LMSConfig.recompute contains {item!r}: every entry must be an op type name")
        if never_recomputed(item):
            raise ValueError(f"LMSConfig.recompute contains {item!r}: random and stateful ops are never "
                             "recomputed (the backward pass would draw or read different values)")
        if item not in RECOMPUTABLE_TYPES:
            raise ValueError(f"LMSConfig.recompute contains {item!r}: not a cheap op type; allowed: "
                             + ", ".join(sorted(RECOMPUTABLE_TYPES)))
    return tuple(dict.fromkeys(value))


def _check_int(name: str, value: Any) -> int:
    """`value` as a plain int: an int or a numpy integer (not a bool); ValueError naming the type otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"LMSConfig.{name}={value!r}: must be an integer (got {type(value).__name__})")
    value = int(value)
    if not -MAX_INT < value < MAX_INT:
        shown = str(value) if abs(value) < 10**24 else f"<a {value.bit_length()}-bit integer>"
        raise ValueError(f"LMSConfig.{name}={shown}: must be between {-MAX_INT + 1} and {MAX_INT - 1}")
    return value
