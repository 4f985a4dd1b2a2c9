"""Large Model Support for TensorFlow 2: swap activations to host memory by graph rewriting.

The core (config, graph model, planner, simulator) imports no TensorFlow. The
TensorFlow entry points (`function`, `LMSModel`, `measure_step`, ...) are loaded
on first use, so ``import lms`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

from .auto import AutoChoice, NoConfigFits, choose_config
from .config import LMSConfig
from .graph import Graph, GraphBuilder, GraphError, Op, Role, Tensor
from .plan import (Clone, PlanError, Recompute, RecomputePlan, Skip, Swap, SwapIn, SwapPlan, find_candidates,
                   plan_recompute, plan_swaps, rewrite_graph)

__version__ = "0.1.0"

# name -> module that defines it; imported lazily because they import TensorFlow.
_LAZY = {
    "simulate": "lms.simulator",
    "max_batch": "lms.simulator",
    "DEVICES": "lms.machine.devices",
    "get_device": "lms.machine.devices",
    "measure_step": "lms.tf.measure",
    "make_train_step": "lms.tf.train",
    "function": "lms.tf.function",
    "LMSFunction": "lms.tf.function",
    "LMSModel": "lms.tf.keras",
    "enable_lms": "lms.tf.keras",
    "inspect": "lms.tf.inspect",
    "Inspection": "lms.tf.inspect",
}

__all__ = [
    "LMSConfig", "Graph", "GraphBuilder", "GraphError", "Op", "Role", "Tensor",
    "PlanError", "Skip", "Swap", "SwapIn", "SwapPlan", "rewrite_graph",
    "find_candidates", "plan_swaps", "Clone", "Recompute", "RecomputePlan", "plan_recompute",
    "choose_config", "AutoChoice", "NoConfigFits",
    "__version__", *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lms' has no attribute {name!r}")
