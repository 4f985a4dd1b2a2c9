"""Swap-in triggers: the op after which a copy comes back, ``lb``..``ub`` levels before its readers.

No TensorFlow. `find_trigger` follows ``ctrld_strategy`` (``chain_rule``, falling
back to ``direct_order``; see `lms.plan.swap_planner`'s docstring); `eligible` and
`shares_input` are the tests every trigger passes, used by the recompute planner
for its gates too.
"""

from __future__ import annotations

import heapq
from typing import Iterator

from ..config import LMSConfig
from ..graph import SHAPE_ONLY_TYPES, Graph, Role
from .recompute import is_recompute_op_name

__all__ = ["find_trigger", "eligible", "shares_input"]


def find_trigger(graph: Graph, config: LMSConfig, tensor: str, consumer: str, *,
                  role: Role, floor: int = -1, avoid: frozenset[str] = frozenset()) -> tuple[str | None, int | None, str]:
    """(trigger op, distance in levels, strategy used) for a swap-in before `consumer`.

    Only ops of `role` with a level above `floor` are eligible, and none that
    reads a tensor an op of `avoid` reads: `avoid` are ops downstream of the
    swap-in through recompute clones, and oneDNN merges siblings that read one
    tensor (``BiasAddGrad`` into ``Conv2DBackpropFilter``): merged with a
    downstream op, the trigger would close a cycle (seen on TF 2.21 CPU).
    """
    if config.ctrld_strategy == "chain_rule" and role is Role.BACKWARD:
        found = _chain_rule_trigger(graph, config, tensor, consumer, avoid=avoid)
        if found is not None:
            return found[0], found[1], "chain_rule"
        trig, dist = _direct_order_trigger(graph, config, tensor, consumer, role=role, floor=floor, avoid=avoid)
        return trig, dist, "direct_order (fallback)" if trig else ""
    trig, dist = _direct_order_trigger(graph, config, tensor, consumer, role=role, floor=floor, avoid=avoid)
    return trig, dist, "direct_order" if trig else ""


def _direct_order_trigger(graph: Graph, config: LMSConfig, tensor: str, consumer: str, *, role: Role,
                          floor: int, avoid: frozenset[str] = frozenset()) -> tuple[str | None, int | None]:
    """An op `k` levels before `consumer`, smallest k in [lb, ub]; ancestors preferred."""
    level = graph.levels[consumer]
    for k in range(config.lb, config.ub + 1):
        target = level - k
        if target <= floor or target < 0:
            break
        at_level = [o for o in graph.ops_by_level.get(target, ())
                    if eligible(graph, o, role, tensor) and not shares_input(graph, o, avoid)]
        if not at_level:
            continue
        for o in at_level:
            if graph.is_ancestor(o, consumer):
                return o, k
        return at_level[0], k
    return None, None


def shares_input(graph: Graph, op: str, others: frozenset[str]) -> bool:
    """Does `op` read a tensor that one of `others` reads too?"""
    if not others:
        return False
    mine = set(graph.ops[op].inputs)
    return any(mine.intersection(graph.ops[o].inputs) for o in others if o in graph.ops)


def eligible(graph: Graph, op: str, role: Role, tensor: str) -> bool:
    """Can `op` trigger a swap-in of `tensor` for a reader of `role`?

    A backward trigger must surely run after the forward pass is done with the
    tensor: it must depend on every forward reader of the tensor, and lie
    deeper than `Graph.forward_end` (the deepest forward op whose data the
    backward pass reads). Gradient constants and ``Shape`` ops under
    ``gradient_tape/`` have backward role but only forward inputs, so they may
    run during the forward pass and would bring the tensor back while its
    original is still alive (seen on TF graphs). Depending on `forward_end`
    itself is too strict: the loss's ``Sum`` feeds only a side branch of the
    gradient (the ``div_no_nan`` by the sample count).
    """
    if graph.ops[op].role is not role or graph.ops[op].type in SHAPE_ONLY_TYPES:
        return False  # shape ops are cheap metadata that Grappler may fold away
    if not graph.ops[op].live:
        return False  # TensorFlow prunes it: a control edge from it would keep it (and what it reads) alive
    if is_recompute_op_name(op):
        # a clone runs right before its readers anyway, and a control edge out of one keeps
        # Grappler from rewriting its chain as it rewrote the original (the last bits differ)
        return False
    if role is not Role.BACKWARD:
        return True
    end = graph.forward_end
    if end is None or graph.levels[op] <= graph.levels[end]:
        return False
    return all(graph.is_ancestor(r, op) for r in graph.live_readers(tensor)
               if graph.ops[r].role is Role.FORWARD)


def _chain_rule_trigger(graph: Graph, config: LMSConfig, tensor: str, consumer: str, *,
                        avoid: frozenset[str] = frozenset()) -> tuple[str, int] | None:
    """A gradient op of a forward op `k` forward levels after the producer, k in [lb, ub]."""
    levels = graph.levels
    limit = levels[consumer]
    # Distances count from the forward op whose gradient the consumer computes (the
    # producer if unknown): gradients of ops k forward levels after it run about k
    # backward levels before the consumer.
    start = graph.ops[consumer].grad_of
    if start is None or start not in graph.forward_levels:
        start = graph.producer(tensor).name
    for k, fwd_ops in _forward_descendants_by_distance(graph, start, config.ub):
        if k < config.lb:
            continue
        valid = [g for f in fwd_ops for g in graph.gradient_ops.get(f, ())
                 if levels[g] < limit and g != consumer and eligible(graph, g, Role.BACKWARD, tensor)
                 and not shares_input(graph, g, avoid)]
        if not valid:
            continue
        ancestors = [g for g in valid if graph.is_ancestor(g, consumer)]
        pick = max(ancestors or valid, key=lambda g: (levels[g], g))
        return pick, limit - levels[pick]
    return None


def _forward_descendants_by_distance(graph: Graph, op: str, max_k: int) -> Iterator[tuple[int, list[str]]]:
    """Yield (k, forward ops whose forward level is level(op) + k), k ascending, k >= 1."""
    flevels = graph.forward_levels
    base = flevels.get(op)
    if base is None:
        return
    heap: list[tuple[int, str]] = []
    seen = {op}
    for s in graph.successors[op]:
        if s in flevels and s not in seen:
            seen.add(s)
            heapq.heappush(heap, (flevels[s], s))
    while heap:
        k = heap[0][0] - base
        if k > max_k:
            return
        bucket: list[str] = []
        while heap and heap[0][0] - base == k:
            _, cur = heapq.heappop(heap)
            bucket.append(cur)
            for s in graph.successors[cur]:
                if s in flevels and s not in seen:
                    seen.add(s)
                    heapq.heappush(heap, (flevels[s], s))
        yield k, bucket
