"""Per-op compute times measured from real steps, affine in the batch size. No TensorFlow.

`lms.tf.profile.profile_op_costs` times each op of a real step (TF's
profiler) at two batch sizes and fits ``seconds = fixed + per_sample * batch``
per op; the simulator then uses those times instead of its roofline
(``simulate(..., op_costs=OpCosts)``). Ops the profile never saw (removed or
fused by Grappler, or inserted later, such as swap ops whose copies the
simulator times over the link) cost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["OpCosts"]


@dataclass(frozen=True)
class OpCosts:
    """Measured seconds per op: ``fixed[name] + per_sample[name] * batch``.

    Attributes:
        fixed / per_sample: seconds, per op name (both >= 0).
        batches: the batch sizes the fit came from.
        source: how they were measured (said in outputs).
    """

    fixed: Mapping[str, float]
    per_sample: Mapping[str, float]
    batches: tuple[int, ...] = ()
    source: str = ""
    _cache: dict = field(default_factory=dict, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        for label, table in (("fixed", self.fixed), ("per_sample", self.per_sample)):
            bad = next(((k, v) for k, v in table.items() if not (v >= 0)), None)
            if bad is not None:
                raise ValueError(f"OpCosts.{label}[{bad[0]!r}]={bad[1]!r}: must be >= 0")

    @classmethod
    def fit(cls, measured: Mapping[int, Mapping[str, float]], *, source: str = "") -> "OpCosts":
        """Per-op affine fit through the measured seconds at two batch sizes (or a line through 0 at one).

        An op seen at one batch only keeps that time as fixed; negative slopes or
        intercepts (timer noise) are clipped to 0.
        """
        if not measured or any(b < 1 for b in measured):
            raise ValueError(f"OpCosts.fit: batches must be >= 1, got {sorted(measured)}")
        batches = sorted(measured)
        lo, hi = batches[0], batches[-1]
        fixed: dict[str, float] = {}
        per_sample: dict[str, float] = {}
        for name in set().union(*(measured[b] for b in batches)):
            t_lo, t_hi = measured[lo].get(name), measured[hi].get(name)
            if hi == lo:
                fixed[name], per_sample[name] = 0.0, max(0.0, t_lo / lo)
            elif t_lo is None or t_hi is None:
                fixed[name], per_sample[name] = max(0.0, t_lo if t_hi is None else t_hi), 0.0
            else:
                slope = max(0.0, (t_hi - t_lo) / (hi - lo))
                fixed[name], per_sample[name] = max(0.0, t_lo - slope * lo), slope
        return cls(fixed, per_sample, tuple(batches), source)

    def seconds(self, names: Sequence[str], batch: int) -> np.ndarray:
        """Each op's time at `batch` (0 for ops not measured), in the order of `names`."""
        key = id(names), len(names)
        hit = self._cache.get(key)
        if hit is None or hit[0] is not names:
            f = np.fromiter((self.fixed.get(n, 0.0) for n in names), dtype=float, count=len(names))
            p = np.fromiter((self.per_sample.get(n, 0.0) for n in names), dtype=float, count=len(names))
            if len(self._cache) > 16:
                self._cache.clear()
            hit = (names, f, p)
            self._cache[key] = hit
        return hit[1] + hit[2] * batch

    def step_seconds(self, batch: int) -> float:
        """Sum over every measured op at `batch` (a serial step's compute time)."""
        return sum(self.fixed.values()) + batch * sum(self.per_sample.values())

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "lms.op_costs", "schema_version": 1, "batches": list(self.batches),
                "source": self.source, "fixed": dict(self.fixed), "per_sample": dict(self.per_sample)}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "OpCosts":
        if doc.get("schema") != "lms.op_costs":
            raise ValueError(f"not an op-cost document (schema {doc.get('schema')!r}, expected 'lms.op_costs')")
        return cls({str(k): float(v) for k, v in doc["fixed"].items()},
                   {str(k): float(v) for k, v in doc["per_sample"].items()},
                   tuple(int(b) for b in doc.get("batches", ())), str(doc.get("source", "")))
