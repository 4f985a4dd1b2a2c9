"""The peers on a study's plots: what remat, per-stage recompute and Grappler reach on the same workload.

``python -m tuner report <study> --peers benchmarks/results/peers.json`` draws each peer's point (its
largest batch, its throughput and peak there) on the two Pareto plots and lists them under them, so a
user sees where the recommendation stands against what a TensorFlow user would pick instead. The points
come from `benchmarks/peers.py` (MEASURED there, in its own processes and minutes, not by this study), and
are drawn only on a study they were measured for: the same workload, model options, budget and safety
margin (`load_peers`, which says what differs otherwise). LMS's own rows of that file are left out: the
study's trials are LMS's points.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

__all__ = ["PeerPoint", "Peers", "PeersMismatch", "load_peers", "match_model"]

PEERS_SCHEMA = "benchmarks.peers"
_MiB = 1 << 20


class PeersMismatch(ValueError):
    """The peers file cannot be drawn on this study (one line: what is wrong, what it has)."""


@dataclass(frozen=True)
class PeerPoint:
    """One peer's point: its largest batch under the budget, the throughput and peak there."""

    key: str
    label: str
    batch_size: int
    throughput: float
    peak_bytes: int | None
    closed: bool  # the bracket closed: the batch fitted and the next one up did not


@dataclass(frozen=True)
class Peers:
    """The peers measured on this study's workload and budget."""

    points: tuple[PeerPoint, ...]
    source: str  # the file, as given
    command: str  # how it was measured
    created: str
    label: str  # MEASURED, and where
    title: str  # the workload, in words
    not_run: tuple[tuple[str, str], ...] = ()  # (label, why) of peers that did not run


def match_model(doc: Mapping[str, Any], *, workload: str, options: Mapping[str, Any], budget_bytes: int | None,
                safety_margin: float | None) -> Mapping[str, Any]:
    """The measured model of a peers document made for this study, or PeersMismatch saying why none is.

        >>> doc = {"schema": "benchmarks.peers", "measured": {"resnet50": {"workload": "resnet50",
        ...        "options": {"image_size": 64}, "budget_bytes": 576 << 20, "safety_margin": 0.05}}}
        >>> match_model(doc, workload="resnet50", options={"image_size": 64}, budget_bytes=576 << 20,
        ...             safety_margin=0.05)["workload"]
        'resnet50'
        >>> match_model(doc, workload="resnet50", options={"image_size": 64}, budget_bytes=512 << 20,
        ...             safety_margin=0.05)
        Traceback (most recent call last):
        ...
        tuner.report.peers.PeersMismatch: measured for another study: resnet50 (image_size=64) at budget 576 MiB, margin 0.05; this study: resnet50 (image_size=64) at budget 512 MiB, margin 0.05
    """
    if not isinstance(doc, Mapping) or doc.get("schema") != PEERS_SCHEMA:
        raise PeersMismatch(f"not a {PEERS_SCHEMA} document (key 'schema'; benchmarks/peers.py writes one)")
    measured = doc.get("measured")
    if not isinstance(measured, Mapping) or not measured:
        raise PeersMismatch("no measured model in it (was it written with --predicted-only?)")
    mine = _describe(workload, options, budget_bytes, safety_margin)
    theirs = []
    for model in measured.values():
        if not isinstance(model, Mapping):
            continue
        given = model.get("options") if isinstance(model.get("options"), Mapping) else {}
        # the study's options may hold more (the workload's defaults): the peers' own options must agree
        same_options = all(options.get(k) == v for k, v in given.items())
        if (model.get("workload") == workload and same_options and model.get("budget_bytes") == budget_bytes
                and _same_margin(model.get("safety_margin"), safety_margin)):
            return model
        theirs.append(_describe(model.get("workload"), given, model.get("budget_bytes"), model.get("safety_margin")))
    raise PeersMismatch(f"measured for another study: {'; '.join(theirs) or 'none'}; this study: {mine}")


def load_peers(path: str | Path, *, workload: str, options: Mapping[str, Any], budget_bytes: int | None,
               safety_margin: float | None) -> Peers:
    """Read a `benchmarks/peers.py` JSON file and keep the peers measured for this study.

    Raises:
        PeersMismatch: the file is unreadable, not a peers document, or measured for another workload, options,
            budget or margin (the message says which).
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PeersMismatch(f"cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise PeersMismatch(f"not JSON: {exc}") from None
    model = match_model(doc, workload=workload, options=options, budget_bytes=budget_bytes,
                        safety_margin=safety_margin)
    methods = doc.get("methods") if isinstance(doc.get("methods"), Mapping) else {}
    points, not_run = [], []
    for key, m in (model.get("methods") or {}).items():
        if not isinstance(m, Mapping) or key.startswith("lms"):
            continue  # LMS's own rows: the study's trials are LMS's points
        label = str((methods.get(key) or {}).get("label") or key)
        big = m.get("largest") if isinstance(m.get("largest"), Mapping) else None
        if m.get("status") != "measured" or big is None or not _positive_int(big.get("batch")):
            not_run.append((label, str(m.get("reason") or m.get("status") or "no largest batch")[:200]))
            continue
        throughput = big.get("throughput")
        peak = big.get("peak_bytes")
        points.append(PeerPoint(key=key, label=label, batch_size=int(big["batch"]),
                                throughput=float(throughput) if _finite(throughput) else 0.0,
                                peak_bytes=int(peak) if _positive_int(peak) else None,
                                closed=bool(big.get("closed"))))
    labels = doc.get("labels") if isinstance(doc.get("labels"), Mapping) else {}
    return Peers(points=tuple(points), source=str(path), command=str(doc.get("command") or ""),
                 created=str(doc.get("created") or ""), label=str(model.get("label") or labels.get("measured") or
                                                                  "MEASURED"),
                 title=str(model.get("title") or workload), not_run=tuple(not_run))


def _describe(workload: Any, options: Mapping[str, Any], budget: Any, margin: Any) -> str:
    opts = ", ".join(f"{k}={v}" for k, v in sorted(options.items()))
    size = f"{budget / _MiB:.0f} MiB" if isinstance(budget, (int, float)) and budget else "no budget"
    return f"{workload} ({opts or 'no options'}) at budget {size}, margin {margin}"


def _same_margin(a: Any, b: Any) -> bool:
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, abs_tol=1e-9)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
