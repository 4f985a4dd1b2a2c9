"""What a study maximises: the largest batch (the default), or the throughput at a fixed batch (``--batch N``).

    MaxBatch            objectives (largest batch that fits, throughput at it)
    FixedBatch(N)       objectives (N if the config fits at N else 0, throughput at N)

Both keep the study's two objectives (`tuner.study.study.OBJECTIVES`), so the loop,
the records, the Pareto front and the report serve both: at a fixed batch every
feasible config has batch N, the front is the fastest config, and a config that
does not fit at N is infeasible with the bytes it needs there (its constraint is
``needed / usable - 1``). A goal is chosen once (`goal_of`) and asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .batch import Prediction, predict_at_batch, predict_max_batch
from .selection import PLAIN_HEADROOM, PLAIN_TOLERANCE

__all__ = ["Goal", "MaxBatch", "FixedBatch", "goal_of"]


class Goal:
    """The base of `MaxBatch` and `FixedBatch`."""

    name: ClassVar[str] = ""
    #: the batch every config is evaluated at (None: each config's own largest batch)
    batch: int | None = None

    def predict(self, graph: Any, config: Any, usable: int, *, device: Any, cap: int, allocator: str,
                op_costs: Any, host_budget: int | None = None) -> Prediction:
        """The simulator's verdict on `config` under this goal (PREDICTED); `host_budget`: host bytes swapping may hold."""
        raise NotImplementedError

    def first_probe(self, pred: Prediction, batch_factor: float) -> tuple[int, int]:
        """(first batch a measured trial probes, largest batch it may probe)."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """The goal as recommended.json records it."""
        return {"kind": self.name, "batch": self.batch}

    def rule(self, *, prefer: str, min_throughput_ratio: float) -> str:
        """How the recommendation is chosen, in words."""
        raise NotImplementedError


@dataclass(frozen=True)
class MaxBatch(Goal):
    """The largest batch that fits, then the throughput at it (the default)."""

    name: ClassVar[str] = "max_batch"
    cap: int = 4096

    def predict(self, graph: Any, config: Any, usable: int, *, device: Any, cap: int, allocator: str,
                op_costs: Any, host_budget: int | None = None) -> Prediction:
        return predict_max_batch(graph, config, usable, device=device, cap=cap, allocator=allocator,
                                 op_costs=op_costs, host_budget=host_budget)

    def first_probe(self, pred: Prediction, batch_factor: float) -> tuple[int, int]:
        return (max(1, round(pred.batch * batch_factor)) if pred.feasible else 1), self.cap

    def rule(self, *, prefer: str, min_throughput_ratio: float) -> str:
        if prefer == "batch":
            return f"largest batch on the Pareto front with throughput >= {min_throughput_ratio:g} x the front's best"
        return "highest throughput on the Pareto front"


@dataclass(frozen=True)
class FixedBatch(Goal):
    """The highest throughput among configs whose peak fits the budget at `batch`."""

    name: ClassVar[str] = "fixed_batch"
    batch: int = 1  # type: ignore[assignment]

    def predict(self, graph: Any, config: Any, usable: int, *, device: Any, cap: int, allocator: str,
                op_costs: Any, host_budget: int | None = None) -> Prediction:
        return predict_at_batch(graph, config, usable, batch=self.batch, device=device, allocator=allocator,
                                op_costs=op_costs, host_budget=host_budget)

    def first_probe(self, pred: Prediction, batch_factor: float) -> tuple[int, int]:
        return self.batch, self.batch

    def rule(self, *, prefer: str, min_throughput_ratio: float) -> str:
        return (f"highest throughput among the configs that fit the budget at batch {self.batch}; no LMS when it "
                f"runs within {PLAIN_TOLERANCE:.0%} of that with {PLAIN_HEADROOM:.0%} of the usable budget free")


def goal_of(batch: int | None, *, cap: int = 4096) -> Goal:
    """`FixedBatch(batch)`, or `MaxBatch` when `batch` is None."""
    return MaxBatch(cap=cap) if batch is None else FixedBatch(batch=int(batch))
