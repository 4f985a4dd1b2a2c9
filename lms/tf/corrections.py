"""What the equivalence check changes in a traced graph and its plan (`lms.tf.equivalence`).

A difference between the optimized step with and without LMS is attributed
to the inserted elements nearest to it in the graph model (within `RADIUS`
edges of a node the difference names or reads): a swap-in (its readers and
the swapped tensor's producer), a trigger, a recompute (its clones' originals,
readers and sources) or a recompute's trigger. Each is then corrected in the
graph being traced and in the plan::

    trigger        (t) ..> [swap-in]          becomes  (t') ..> [swap-in]      (`lms.plan.anchor.alternative_trigger`)
    swap-in        [swap-in] -> (c)           becomes  t -> (c)                (swap ops unprotected: pruned)
    recompute      [clone] -> (c)             becomes  t -> (c)                (gates unprotected: pruned)

Inserted ops left without readers lose ``_grappler_do_not_remove``, so
Grappler prunes them as it prunes any unused op.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass
from typing import Any, Iterable

import tensorflow as tf

from ..plan.anchor import alternative_trigger
from ..graph import Graph
from ..plan import Swap, SwapIn, SwapPlan
from ..plan.recompute import Recompute, RecomputePlan
from .apply import DO_NOT_REMOVE_ATTR
from .canonical import Difference

__all__ = ["Correction", "correct", "drop_all", "RADIUS"]

log = logging.getLogger(__name__)

RADIUS = 3  # a difference further than this (edges of the graph model) from every inserted element is not attributed
_GRAPPLER_SCOPES = ("ArithmeticOptimizer", "ConstantFolding", "Remapper", "DependencyOptimizer", "LayoutOptimizer")


@dataclass(frozen=True)
class Correction:
    """A change the equivalence check made to the plan, and why.

    Attributes:
        kind: ``"trigger moved"``, ``"swap-in dropped"``, ``"recompute trigger moved"``,
            ``"recompute dropped"`` or ``"order dropped"`` (the memory schedule's pins, `lms.tf.rewriter`).
        name: the swap-in op, or the recomputed tensor.
        tensor: the swapped or recomputed tensor.
        detail: e.g. ``"trigger a -> b"``.
        reason: the difference it was nearest to.
    """

    kind: str
    name: str
    tensor: str
    detail: str
    reason: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.name} ({self.detail}): {self.reason}"



def _recomputes(plan: SwapPlan) -> tuple[Recompute, ...]:
    return plan.recompute.recomputes if plan.recompute is not None else ()


_STAGE = re.compile(r"^[A-Z][A-Za-z0-9]*_")


def _originals(name: str, model: Graph) -> set[str]:
    """Ops of the graph model a node of an optimized graph comes from (Grappler prefixes and suffixes stripped)."""
    if name.startswith("const:"):
        return set()
    name = name.rsplit(":", 1)[0] if ":" in name and name.rsplit(":", 1)[1].isdigit() else name
    name = name.replace(" (clone)", "")
    parts = [p for p in name.split("/") if p not in _GRAPPLER_SCOPES]
    if len(parts) < len(name.split("/")) and parts:
        parts[-1] = _STAGE.sub("", parts[-1], count=1)
    candidate = "/".join(parts)
    found = set()
    while candidate:
        if candidate in model.ops:
            found.add(candidate)
            break
        cut = max(candidate.rfind("/"), candidate.rfind("_"), candidate.rfind("-"))
        if cut <= 0:
            break
        candidate = candidate[:cut]
    return found


def _distances(model: Graph, sources: Iterable[str]) -> dict[str, int]:
    dist = {s: 0 for s in sources if s in model.ops}
    layer = list(dist)
    for d in range(1, RADIUS + 1):
        nxt = []
        for name in layer:
            op = model.ops[name]
            neighbours = [*op.input_ops, *op.control_inputs,
                          *(c for t in op.outputs for c in model.consumers(t))]
            for n in neighbours:
                if n in model.ops and n not in dist and model.ops[n].type != "Const":
                    dist[n] = d
                    nxt.append(n)
        layer = nxt
    return dist


def correct(graph: tf.Graph, model: Graph, plan: SwapPlan, diffs: list[Difference], avoid: set[str],
             corrections: list[Correction]) -> SwapPlan:
    """Undo or move the inserted elements nearest to `diffs` (in the graph and in the plan)."""
    touched: set[str] = set()
    for d in diffs:
        touched |= _originals(d.node, model)
        for desc in (d.without_lms, d.with_lms):
            for inp in re.findall(r"[\w./>-]+:\d+", desc):
                touched |= _originals(inp, model)
    dist = _distances(model, touched)
    inf = RADIUS + 1
    stands_for = {g.name: g.tensor.rsplit(":", 1)[0] for r in _recomputes(plan) for g in r.gates}
    stands_for.update({c.name: c.op for r in _recomputes(plan) for c in r.clones})

    def near(names: Iterable[str]) -> int:
        return min((dist.get(stands_for.get(n, n), inf) for n in names), default=inf)

    elements: list[tuple[int, str, Any, Any]] = []  # (distance, kind, owner, item)
    for s in plan.swaps:
        for si in s.swap_ins:
            elements.append((near([*si.consumers, model.producer(s.tensor).name]), "swap-in", s, si))
            if si.trigger is not None:
                elements.append((near([si.trigger]), "trigger", s, si))
    for r in _recomputes(plan):
        anchors = [*(c.op for c in r.clones), *r.consumers, *(model.producer(t).name for t in r.sources)]
        elements.append((near(anchors), "recompute", r, None))
        if r.trigger is not None:
            elements.append((near([r.trigger]), "recompute trigger", r, None))
    best = min((e[0] for e in elements), default=inf)
    if best >= inf:
        return plan
    reason = str(diffs[0])
    chosen = [e for e in elements if e[0] == best]
    rewritten = plan.recompute.rewrite(model) if plan.recompute is not None else model
    for _, kind, owner, item in chosen:  # drops first: a moved trigger of a dropped swap-in is moot
        if kind == "recompute":
            plan = _drop_recompute(graph, plan, owner, corrections, reason)
    for _, kind, owner, item in chosen:
        if kind == "swap-in":
            plan = _drop_swap_in(graph, plan, owner.tensor, item.name, corrections, reason)
    for _, kind, owner, item in chosen:
        if kind == "trigger":
            plan = _move_trigger(graph, rewritten, plan, owner.tensor, item.name, avoid, corrections, reason)
        elif kind == "recompute trigger":
            plan = _move_recompute_trigger(graph, model, plan, owner.tensor, avoid, corrections, reason)
    return plan


def _find_swap_in(plan: SwapPlan, tensor: str, name: str) -> tuple[Swap, SwapIn] | None:
    for s in plan.swaps:
        if s.tensor == tensor:
            for si in s.swap_ins:
                if si.name == name:
                    return s, si
    return None


def _replace_swap_in(plan: SwapPlan, tensor: str, name: str, new: SwapIn | None) -> SwapPlan:
    swaps = []
    for s in plan.swaps:
        if s.tensor == tensor:
            ins = tuple(new if si.name == name else si for si in s.swap_ins)
            ins = tuple(si for si in ins if si is not None)
            if not ins:
                continue
            s = dataclasses.replace(s, swap_ins=ins)
        swaps.append(s)
    return dataclasses.replace(plan, swaps=tuple(swaps))


def _swap_in_ops(graph: tf.Graph, name: str, swap_out: str) -> list[tf.Operation]:
    """The ops of one swap-in: from the op consumers read back to (not including) the swap-out."""
    first = graph.get_operation_by_name(name)
    found = {first.name: first}
    stack = [first]
    while stack:
        op = stack.pop()
        for t in op.inputs:
            p = t.op
            if p.name not in found and not p.name.startswith(swap_out):
                found[p.name] = p
                stack.append(p)
    return list(found.values())


def _unprotect(ops: Iterable[tf.Operation]) -> None:
    """Let Grappler prune inserted ops left without readers (it never removes protected ones)."""
    for op in ops:
        try:
            op.get_attr(DO_NOT_REMOVE_ATTR)
        except ValueError:
            continue
        op._clear_attr(DO_NOT_REMOVE_ATTR)  # noqa: SLF001


def _swap_out_ops(graph: tf.Graph, swap_out: str) -> list[tf.Operation]:
    return [op for op in graph.get_operations() if op.name == swap_out or op.name.startswith(f"{swap_out}/")]


def _set_trigger(ops: Iterable[tf.Operation], old: str | None, new: tf.Operation | None) -> None:
    """Replace the control input `old` (None: every control input) of `ops` by `new` (None: by nothing)."""
    for op in ops:
        names = [c.name for c in op.control_inputs]
        if old is not None and old not in names:
            continue
        keep = [c for c in op.control_inputs if old is not None and c.name != old]
        op._remove_all_control_inputs()  # noqa: SLF001
        op._add_control_inputs(keep + ([new] if new is not None else []))  # noqa: SLF001


def _reroute_back(graph: tf.Graph, consumers: Iterable[str], stand_in: str, original: str) -> None:
    """``stand_in -> (c)`` becomes ``original -> (c)`` again."""
    new = graph.get_tensor_by_name(original)
    for c in consumers:
        op = graph.get_operation_by_name(c)
        for i, t in enumerate(list(op.inputs)):
            if t.name == stand_in:
                op._update_input(i, new)  # noqa: SLF001


def _drop_swap_in(graph: tf.Graph, plan: SwapPlan, tensor: str, name: str, corrections: list[Correction],
                  reason: str) -> SwapPlan:
    found = _find_swap_in(plan, tensor, name)
    if found is None:
        return plan
    swap, si = found
    _reroute_back(graph, si.consumers, f"{si.name}:0", tensor)
    ops = _swap_in_ops(graph, si.name, swap.swap_out)
    _set_trigger(ops, None, None)
    _unprotect(ops)
    if len(swap.swap_ins) == 1:  # the swap-out has no reader left
        _unprotect(_swap_out_ops(graph, swap.swap_out))
    corrections.append(Correction("swap-in dropped", si.name, tensor,
                                  f"{len(si.consumers)} reader(s) read the original again", reason))
    log.info("LMS: %s", corrections[-1])
    return _replace_swap_in(plan, tensor, name, None)


def _move_trigger(graph: tf.Graph, model: Graph, plan: SwapPlan, tensor: str, name: str, avoid: set[str],
                  corrections: list[Correction], reason: str) -> SwapPlan:
    found = _find_swap_in(plan, tensor, name)
    if found is None or found[1].trigger is None:
        return plan
    swap, si = found
    avoid.add(si.trigger)
    new = alternative_trigger(model, si.trigger, tensor, si.consumers, avoid=frozenset(avoid))
    if new is None:
        return _drop_swap_in(graph, plan, tensor, name, corrections,
                             f"no other trigger for it than {si.trigger!r}, which changes a rewrite: {reason}")
    _set_trigger(_swap_in_ops(graph, si.name, swap.swap_out), si.trigger, graph.get_operation_by_name(new))
    corrections.append(Correction("trigger moved", si.name, tensor, f"trigger {si.trigger} -> {new}", reason))
    log.info("LMS: %s", corrections[-1])
    moved = dataclasses.replace(si, trigger=new, strategy=f"{si.strategy}+moved by the equivalence check",
                                distance=None if si.distance is None else
                                model.levels[min(si.consumers, key=model.levels.__getitem__)] - model.levels[new])
    return _replace_swap_in(plan, tensor, name, moved)


def _replace_recompute(plan: SwapPlan, tensor: str, new: Recompute | None) -> SwapPlan:
    rp = plan.recompute
    assert rp is not None
    kept = tuple(x for x in (new if r.tensor == tensor else r for r in rp.recomputes) if x is not None)
    return dataclasses.replace(plan, recompute=RecomputePlan(recomputes=kept, skipped=rp.skipped,
                                                             n_considered=rp.n_considered))


def _drop_recompute(graph: tf.Graph, plan: SwapPlan, r: Recompute, corrections: list[Correction],
                    reason: str) -> SwapPlan:
    if r not in _recomputes(plan):
        return plan
    _reroute_back(graph, r.consumers, r.output, r.tensor)
    gates = [graph.get_operation_by_name(g.name) for g in r.gates]
    _set_trigger(gates, None, None)
    _unprotect(gates)
    corrections.append(Correction("recompute dropped", r.tensor, r.tensor,
                                  f"{len(r.clones)} clone(s) left unread; the tensor is kept", reason))
    log.info("LMS: %s", corrections[-1])
    plan = _replace_recompute(plan, r.tensor, None)
    gone = {g.name for g in r.gates} | {c.name for c in r.clones}
    swaps = []
    # a swap-in triggered by a dropped clone or gate (they run no more) waits for the recompute's own trigger,
    # which ran before them; without one it waits for nothing
    earlier = r.trigger if r.trigger is not None and r.trigger not in gone else None
    for s in plan.swaps:  # swap-ins that served the dropped gates and clones have no reader left
        ins = []
        for si in s.swap_ins:
            consumers = tuple(c for c in si.consumers if c not in gone)
            if consumers and si.trigger in gone:
                _set_trigger(_swap_in_ops(graph, si.name, s.swap_out), si.trigger,
                             graph.get_operation_by_name(earlier) if earlier is not None else None)
                si = dataclasses.replace(si, trigger=earlier,
                                         strategy=f"{si.strategy}+its trigger's recompute dropped by the check")
            if consumers:
                ins.append(dataclasses.replace(si, consumers=consumers))
            else:
                ops = _swap_in_ops(graph, si.name, s.swap_out)
                _set_trigger(ops, None, None)
                _unprotect(ops)
        if ins:
            swaps.append(dataclasses.replace(s, swap_ins=tuple(ins)))
        else:
            _unprotect(_swap_out_ops(graph, s.swap_out))
    return dataclasses.replace(plan, swaps=tuple(swaps))


def _move_recompute_trigger(graph: tf.Graph, model: Graph, plan: SwapPlan, tensor: str, avoid: set[str],
                            corrections: list[Correction], reason: str) -> SwapPlan:
    r = next((x for x in _recomputes(plan) if x.tensor == tensor), None)
    if r is None or r.trigger is None:
        return plan
    avoid.add(r.trigger)
    new = alternative_trigger(model, r.trigger, tensor, r.consumers, avoid=frozenset(avoid))
    if new is None:
        return _drop_recompute(graph, plan, r, corrections,
                               f"no other trigger for its clones than {r.trigger!r}, which changes a rewrite: "
                               f"{reason}")
    _set_trigger([graph.get_operation_by_name(g.name) for g in r.gates], r.trigger, graph.get_operation_by_name(new))
    corrections.append(Correction("recompute trigger moved", r.tensor, r.tensor, f"trigger {r.trigger} -> {new}",
                                  reason))
    log.info("LMS: %s", corrections[-1])
    gates = tuple(dataclasses.replace(g, control_inputs=(new,)) if g.control_inputs else g for g in r.gates)
    moved = dataclasses.replace(r, trigger=new, gates=gates, strategy=f"{r.strategy}+moved by the equivalence check")
    return _replace_recompute(plan, tensor, moved)


def drop_all(graph: tf.Graph, plan: SwapPlan, corrections: list[Correction], reason: str) -> SwapPlan:
    """Undo every swap-in and recompute still in `plan` (the check could not make the graphs equal otherwise)."""
    why = f"the optimized graphs still differ and the difference could not be attributed: {reason}"
    for r in _recomputes(plan):
        plan = _drop_recompute(graph, plan, r, corrections, why)
    for s in plan.swaps:
        for si in s.swap_ins:
            plan = _drop_swap_in(graph, plan, s.tensor, si.name, corrections, why)
    return plan
