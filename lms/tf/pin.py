"""Apply a finished `lms.schedule.Schedule` to a TensorFlow graph: one control edge per ordering edge.

The order was decided elsewhere (`lms.schedule.schedule_ops`, no TensorFlow);
this adds exactly the edges the schedule lists, after `lms.tf.apply.apply_plan`
inserted the swap ops they may name::

    (a) -> ... (b)          (a) ..> (b)   control edge, both ends marked _grappler_do_not_remove

Each end is marked ``_grappler_do_not_remove`` so that Grappler's dependency
optimizer neither drops an edge nor removes or merges an op it hangs on (check
with `pinned_edges_survived` on `lms.tf.apply.executed_graph_defs`). An edge to
an emulated swap-in goes to every op of that swap-in without an input inside it
(the op that takes the trigger).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable

import tensorflow as tf

from .apply import _protect

__all__ = ["PinnedSchedule", "apply_schedule", "pinned_edges_survived"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PinnedSchedule:
    """What `apply_schedule` added: the edges ``(before, after)`` by op name."""

    edges: tuple[tuple[str, str], ...]


def _entry_ops(graph: tf.Graph, name: str) -> list[tf.Operation]:
    """The ops an edge *to* `name` must reach: `name`, or for an emulated swap-in its first ops."""
    op = graph.get_operation_by_name(name)
    group = [o for o in graph.get_operations() if o.name.startswith(name + "/")] if name.startswith("lms/swap_in/") \
        else []
    if not group:
        return [op]
    members = {o.name for o in group} | {name}
    return [o for o in [*group, op] if not any(t.op.name in members for t in o.inputs)]


def apply_schedule(graph: tf.Graph, edges: Iterable[tuple[str, str]]) -> PinnedSchedule:
    """Add ``(a) ..> (b)`` for every ``(a, b)`` in `edges` (the graph is edited in place).

    Raises:
        ValueError: an edge names an op that is not in the graph.
    """
    added: list[tuple[str, str]] = []
    with graph.as_default():
        for a, b in edges:
            try:
                src = graph.get_operation_by_name(a)
                dsts = _entry_ops(graph, b)
            except (KeyError, ValueError):
                raise ValueError(f"the schedule pins {a!r} -> {b!r}, which is not in the graph") from None
            _protect(src)
            for dst in dsts:
                if src not in dst.control_inputs:
                    dst._add_control_input(src)  # noqa: SLF001
                _protect(dst)
            added.append((a, b))
    log.debug("pinned %d ordering edges", len(added))
    return PinnedSchedule(tuple(added))


def pinned_edges_survived(graph_defs: Iterable[Any], edges: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The edges whose order is *not* kept in the optimized graphs (empty: every pin survived).

    An edge is kept when both ops are still there and ``b`` still depends on ``a``
    (through data or control inputs).
    """
    preds: dict[str, set[str]] = {}
    for gd in graph_defs:
        nodes = list(gd.node) + [n for f in gd.library.function for n in f.node_def]
        for n in nodes:
            preds.setdefault(n.name, set()).update(i.lstrip("^").split(":")[0] for i in n.input)
    lost = []
    for a, b in edges:
        if a not in preds or b not in preds:
            lost.append((a, b))
            continue
        seen, stack, found = set(), [b], False
        while stack and not found:
            x = stack.pop()
            for p in preds.get(x, ()):
                if p == a:
                    found = True
                    break
                if p not in seen:
                    seen.add(p)
                    stack.append(p)
        if not found:
            lost.append((a, b))
    return lost
