"""The TensorFlow adapter of `lms`: the only code that imports TensorFlow.

- `extract`: traced step -> `lms.graph.Graph` (`extract_graph`, `trace_train_step`).
- `apply`: `SwapPlan` -> recompute clones and swap ops inserted in the graph being traced (`apply_plan`).
- `emulate`: swap ops that leave TF's allocator on any machine (CPU emulation).
- `pin`: a `lms.schedule.Schedule`'s ordering edges added to the graph; `exact`: the step
  rebuilt so TF runs its exact order (one CPU device).
- `function`: `lms.function`, a ``tf.function`` for training steps with LMS; `rewriter`: the
  rewrite at the end of each trace it shares with `keras` (`summary`: what it did; `batch`:
  the batch a step runs at; `auto`: ``config="auto"``).
- `equivalence`: checks that Grappler optimizes the step with LMS as without it (`canonical`
  compares, `corrections` undoes what differs).
- `keras`: `LMSModel` / `enable_lms` for Keras 3 ``model.fit``.
- `train`: `make_train_step`, the standard step.
- `graphdefs`: the optimized and executed GraphDefs of a step, and the LMS ops left in them.
- measuring: `allocator` (the allocator settings to make first), `measure` (`measure_step`: peak
  and time), `live` (bytes live at each allocation), `profile` (op costs from TF's profiler),
  `placement` (where the swap copies ran, each after its trigger), `sync` (waiting for a step).

Submodules are imported on first use, so importing ``lms.tf`` alone does not
import TensorFlow (``lms.tf.allocator`` must set allocator flags before that).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "extract_graph": "lms.tf.extract",
    "trace_train_step": "lms.tf.extract",
    "apply_plan": "lms.tf.apply",
    "emulated_swap_out": "lms.tf.emulate",
    "emulated_swap_in": "lms.tf.emulate",
    "default_emulate": "lms.tf.emulate",
    "function": "lms.tf.function",
    "LMSFunction": "lms.tf.function",
    "LMSSummary": "lms.tf.function",
    "anchor_triggers": "lms.plan.anchor",
    "optimized_graph_def": "lms.tf.graphdefs",
    "executed_graph_defs": "lms.tf.graphdefs",
    "swap_op_names": "lms.tf.graphdefs",
    "clone_op_names": "lms.tf.graphdefs",
    "LMSModel": "lms.tf.keras",
    "enable_lms": "lms.tf.keras",
    "make_train_step": "lms.tf.train",
    "record_gradients": "lms.tf.train",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lms.tf' has no attribute {name!r}")
