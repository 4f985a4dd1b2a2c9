"""What a planning pass says besides its plan: `Skip`, a candidate it left (and why), and
`PlanError`, a plan its graph rejects. No TensorFlow.

The floor below the plans: a `SwapPlan` holds a `RecomputePlan`, both are checked against their
graph and both planners record skips, so these two names sit below `lms.plan.swap_plan` and
`lms.plan.recompute` (importing nothing of either) rather than in one of them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Skip", "PlanError"]


class PlanError(ValueError):
    """A plan is inconsistent with its graph (bad reroute, late trigger, cycle)."""


@dataclass(frozen=True)
class Skip:
    """A candidate the planner did not swap, and why."""

    tensor: str
    reason: str
