"""Planning: which tensors to keep, swap to host memory or recompute, and when each comes back. No TensorFlow.

The flow, a pass a module (each takes the graph model and an `LMSConfig`)::

    candidates -> recompute_planner -> swap_planner (-> triggers, anchor) -> SwapPlan.validate

- `verdicts`: what every pass says besides its plan (`Skip`, `PlanError`); the floor below the plans.
- `swap_plan`: the plan objects (`SwapPlan`, `Swap`, `SwapIn`) and `rewrite_graph`, the plan applied
  to the graph model (what `validate` lints).
- `recompute`: the recompute plan (`RecomputePlan`, `Recompute`, `Clone`, `Gate`) and its rewrite.
- `candidates`: `find_candidates`, the tensors either planner may take, and why others are skipped.
- `triggers`: the swap-in trigger search (``chain_rule``, ``direct_order``) both planners use.
- `recompute_planner`: `plan_recompute`, the cheap chains rebuilt instead of kept or swapped.
- `swap_planner`: `plan_swaps(graph, config) -> SwapPlan`, the pass a caller runs (it plans
  recomputation first when the config asks for it).
- `anchor`: triggers moved off ops Grappler folds; the ops a schedule may pin.

What Grappler and oneDNN do to a step (the rewrites a swap-in, a pin or a recompute gate would change)
is below this package, in `lms.rules`: the schedule reads the same rules.
"""

from __future__ import annotations

from .candidates import find_candidates
from .recompute import Clone, Recompute, RecomputePlan
from .recompute_planner import plan_recompute
from .swap_plan import HOST_DEVICE, SWAP_IN_TYPE, SWAP_OUT_TYPE, Swap, SwapIn, SwapPlan, rewrite_graph, swap_op_name
from .swap_planner import plan_swaps
from .verdicts import PlanError, Skip

__all__ = [
    "SwapPlan", "Swap", "SwapIn", "Skip", "PlanError", "rewrite_graph", "swap_op_name", "SWAP_OUT_TYPE",
    "SWAP_IN_TYPE", "HOST_DEVICE", "plan_swaps", "find_candidates", "plan_recompute", "RecomputePlan",
    "Recompute", "Clone",
]
