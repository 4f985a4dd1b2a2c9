"""The calibrated memory/time simulator (no TensorFlow); the public names are in `lms.simulator`."""

from __future__ import annotations

from .compiled import CompiledGraph, compile_graph
from ..order import bypass_identities, executed_order
from .costs import CPU_TEMPORARIES, GPU_TEMPORARIES, NO_TEMPORARIES, TemporaryModel, TemporaryRule
from .interpreter import simulate
from .opcosts import OpCosts
from .result import SimResult, Timeline, TimelineEvent
from .search import ALL_SWAPPED, InfeasibleBudget, MaxBatchResult, bfc_adjusted_batch, max_batch

__all__ = [
    "simulate", "SimResult", "Timeline", "TimelineEvent", "max_batch", "bfc_adjusted_batch", "MaxBatchResult",
    "InfeasibleBudget", "ALL_SWAPPED", "TemporaryModel", "TemporaryRule", "CPU_TEMPORARIES",
    "NO_TEMPORARIES", "GPU_TEMPORARIES", "CompiledGraph", "compile_graph", "executed_order",
    "bypass_identities", "OpCosts",
]
