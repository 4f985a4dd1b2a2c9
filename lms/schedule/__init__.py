"""Scheduling: the order the step's ops run in, chosen on the graph model and pinned. No TensorFlow.

The flow: the planned graph -> candidate orders -> scored by the models -> the best one pinned
(-> ``lms.tf.pin`` applies the pins; with an exact order, ``lms.tf.exact`` rebuilds the step)::

    schedule_ops(graph, plan) -> Schedule (order, pins, edges)

- `scheduler`: `schedule_ops` and the frozen, validated `Schedule` (the pass a caller runs).
- `candidate_orders`: the orders ``schedule="memory"`` scores (list schedulers, a post-order DFS,
  the creation order, TF's own), and the swap-ins placed in them.
- `models`: what an order is scored with: liveness (`buffer_model`) and TF's executor (`ExecutorModel`).
- `edges`: the edges a schedule adds (ordering knobs, resource order, oneDNN merges) and
  `pin_graph`, which adds them to a graph model.
- `exact_order`: one chain through every op of TF's optimized graph (the exact order on a CPU device).

The ops a schedule may pin are chosen in planning (`lms.plan.anchor.pinnable_ops`).
"""

from __future__ import annotations

from .candidate_orders import PIN_MIN_BYTES
from .edges import (RESOURCE_READ_TYPES, anchor_edges, merge_edges, ordering_edges, pin_graph, resource_edges,
                    resource_order_edges)
from .models import EXECUTOR_KINDS, order_peak, scoring_batch
from .scheduler import CANDIDATES, KINDS, Schedule, ScheduleError, schedule_ops

__all__ = ["Schedule", "ScheduleError", "schedule_ops", "pin_graph", "order_peak", "ordering_edges",
           "anchor_edges", "merge_edges", "resource_edges", "resource_order_edges", "scoring_batch", "PIN_MIN_BYTES",
           "EXECUTOR_KINDS", "CANDIDATES", "KINDS", "RESOURCE_READ_TYPES"]
