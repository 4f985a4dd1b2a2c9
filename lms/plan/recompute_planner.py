"""`plan_recompute(graph, config) -> RecomputePlan`: which saved tensors to rebuild in the backward pass. No TensorFlow.

Per saved forward tensor (a swap candidate, `lms.plan.find_candidates`:
the ``incl_*``/``excl_*`` filters apply) the planners choose one of three:

- **recompute** (this pass): when the tensor can be rebuilt by a chain of at
  most `MAX_CHAIN_OPS` cheap ops (``config.recompute_types``; never random or
  stateful ones) from *sources* that cost nothing extra to have in the backward
  pass: tensors the backward pass reads anyway and that are not themselves
  recomputed (kept or swapped by the swap planner), tiny tensors that do not
  grow with the batch (BatchNorm's per-channel scale and shift), and the step's
  inputs. So recomputing never adds a saved tensor: it removes one, and its
  bytes no longer cross the link twice. The price is the chain's compute, a
  pass over memory per op; on a GPU that is ~1 ms per GiB, the host link needs
  ~100 ms per GiB each way, so every tensor that qualifies is recomputed
  (tensors too small to matter, that do not grow with the batch, are not).
  Tensors are decided in forward order, so a chain may run through an earlier
  recomputed tensor (it is cloned again in the chain), never the other way.
- **swap** (`lms.plan.plan_swaps`, run afterwards on the graph with the
  clones): the sources of the chains become backward reads like any other, so
  they are swapped in before the clones that read them.
- **keep**: everything else (beyond ``n_tensors``, no trigger, ...), and a
  tensor whose clones would make Grappler rewrite the step differently: an
  op that keeps one reader after its backward readers move to the clone, or a
  clone read by one op where the original had several, when Grappler folds
  such an op into its reader (`lms.rules.recompute_changes_readers`).

Clones: one chain per recomputed tensor serves all its backward readers (a
ReLU output is read by the next convolution's filter gradient and, ~13 levels
later on ResNet-50, by its own ``ReluGrad``: a chain per reader would double
the recompute work for little memory). The chain's first clones read their
sources through gates (`lms.plan.recompute.Gate`) that get a control edge from a
trigger: the backward op nearest before the first reader, found
from the reader's other inputs (its incoming gradient: the clones run right
before it), else like a swap-in's trigger with ``lb=1`` (recomputing earlier
only holds the copy longer: it overlaps nothing), anchored like one
(`lms.plan.anchor`). The trigger depends on every forward reader of the tensor, so
the clones run after the originals. With ``schedule="memory"`` the gates keep their
triggers (the swap-ins lose theirs): the schedule places each chain after
its trigger and pins its gates. The swap planner gives a chain's source one swap-in for the chain
and the source's other backward readers close after it
(`lms.plan.swap_planner.RECOMPUTE_SHARE_LEVELS`), so its bytes cross the link once.

Randomness: random and stateful ops are never cloned, and a chain never reads
a tensor that comes from a random op through elementwise ops (a dropout's
mask or output): those tensors are kept or swapped, never recomputed.
"""

from __future__ import annotations

import dataclasses
import logging

from ..config import LMSConfig
from ..graph import Graph, Role
from ..optypes import RANDOM_TYPES, RECOMPUTABLE_TYPES, never_recomputed
from .anchor import anchored_trigger
from .candidates import find_candidates
from .recompute import Clone, Gate, Recompute, RecomputePlan, gate_op_name, recompute_op_name
from ..rules import LOOK_THROUGH, recompute_changes_readers
from .verdicts import Skip
from .triggers import eligible, find_trigger, shares_input

__all__ = ["plan_recompute", "MAX_CHAIN_OPS", "TINY_SOURCE_BYTES"]

log = logging.getLogger(__name__)

MAX_CHAIN_OPS = 8
# A source that does not grow with the batch and is at most this big is held for free (a
# causal attention band of 2048^2 booleans is 4 MiB; the mask rebuilt from it, 48 MiB per sample).
TINY_SOURCE_BYTES = 16 << 20
_INPUT_TYPES = frozenset({"Placeholder", "PlaceholderWithDefault", "_Arg"})
_RESIDENT_TYPES = frozenset({"Const", "HostConst"})


def plan_recompute(graph: Graph, config: LMSConfig) -> RecomputePlan:
    """Choose the tensors to recompute and their clone chains and triggers (see module docstring).

    Args:
        graph: the training graph model (linted).
        config: the LMS knobs; ``config.recompute == "none"`` gives an empty plan.

    Returns:
        A `RecomputePlan` (validate it with `RecomputePlan.validate`).
    """
    types = config.recompute_types
    if not types:
        return RecomputePlan()
    candidates, _ = find_candidates(graph, config)
    saved = set(candidates)
    recomputed: set[str] = set()
    drawn: dict[str, bool] = {}
    recomputes: list[Recompute] = []
    skipped: list[Skip] = []
    trigger_config = config.replace(lb=1)
    used: set[str] = set(graph.ops)
    for t in candidates:
        spec = graph.tensors[t]
        producer = graph.producer(t)
        if _drawn(graph, t, drawn):
            skipped.append(Skip(t, "recompute: comes from a random draw (kept or swapped, never drawn again)"))
            continue
        if producer.type not in types:
            continue
        if spec.per_sample_bytes == 0 and graph.tensor_bytes(t) <= TINY_SOURCE_BYTES:
            skipped.append(Skip(t, "recompute: too small to matter (does not grow with the batch)"))
            continue
        chain = _chain(graph, t, types, saved - recomputed, saved, drawn)
        if isinstance(chain, str):
            skipped.append(Skip(t, f"recompute: {chain}"))
            continue
        readers = tuple(sorted((c for c in graph.data_consumers(t) if graph.ops[c].role is Role.BACKWARD),
                               key=graph.levels.__getitem__))  # a live one among them: find_candidates
        why = recompute_changes_readers(graph, t, chain, readers) or _gate_hides_rewrite(graph, chain)
        if why:
            skipped.append(Skip(t, f"recompute: {why}"))
            continue
        trigger, distance, how = _just_in_time_trigger(graph, t, readers[0])
        if trigger is None:
            trigger, distance, how = find_trigger(graph, trigger_config, t, readers[0], role=Role.BACKWARD,
                                                   avoid=frozenset(readers))
        if trigger is None:
            skipped.append(Skip(t, "recompute: no backward op before its readers to trigger the clones"))
            continue
        anchor = anchored_trigger(graph, trigger, t, backward=True)
        if anchor != trigger:
            trigger, distance, how = anchor, graph.levels[readers[0]] - graph.levels[anchor], f"{how}+anchored"
        recomputed.add(t)
        group = 0
        r = _recompute(graph, t, readers, chain, group, trigger, distance, how)
        while any(n in used for n in _names(r)):  # tensors ``a/b:0`` and ``a_b:0`` cloning one op
            group += 1
            r = _recompute(graph, t, readers, chain, group, trigger, distance, how)
        used.update(_names(r))
        recomputes.append(r)
    plan = RecomputePlan(recomputes=tuple(recomputes), skipped=tuple(skipped), n_considered=len(candidates))
    log.debug("recompute: %d tensors (%d clones) of %d candidates", plan.n_recomputed, plan.n_clones,
              len(candidates))
    return plan


def _gate_hides_rewrite(graph: Graph, chain: list[str]) -> str:
    """Why a gate between a chain's source and the clone reading it would hide a Grappler rewrite ('' if not)."""
    in_chain = set(chain)
    for name in chain:
        op = graph.ops[name]
        for p in op.input_ops:
            if p not in in_chain and (graph.ops[p].type, op.type) in LOOK_THROUGH:
                return f"Grappler reads {op.type} {name!r} through its {graph.ops[p].type} input"
    return ""


def _names(r: Recompute) -> list[str]:
    return [g.name for g in r.gates] + [c.name for c in r.clones]


def _just_in_time_trigger(graph: Graph, tensor: str, reader: str) -> tuple[str | None, int | None, str]:
    """The deepest backward op that produces another input of `reader` (its incoming gradient).

    The clones then run right before the reader, after everything else it waits
    for. Eligible as a swap-in trigger is (`lms.plan.triggers.eligible`): deeper than
    the forward pass's end and after every forward reader of `tensor`.
    """
    levels = graph.levels
    inputs = [p for p in graph.ops[reader].input_ops if p != graph.producer(tensor).name]
    valid = [p for p in dict.fromkeys(inputs)
             if eligible(graph, p, Role.BACKWARD, tensor) and not shares_input(graph, p, frozenset((reader,)))]
    if not valid:
        return None, None, ""
    pick = max(valid, key=lambda p: (levels[p], p))
    return pick, levels[reader] - levels[pick], "reader's input"


def _chain(graph: Graph, tensor: str, types: frozenset[str], saved: set[str],
           candidates: set[str], drawn: dict[str, bool]) -> list[str] | str:
    """Forward ops to clone (execution order) to rebuild `tensor`, or why it cannot be done."""
    chain: list[str] = []
    seen: set[str] = set()

    def visit(t: str, depth: int) -> str:
        op = graph.producer(t)
        if op.name in seen:
            return ""
        if never_recomputed(op.type):
            return f"{op.type} op {op.name!r} is random or stateful"
        if op.type not in types:
            return f"{op.type} op {op.name!r} is not among the recomputed types"
        if depth > MAX_CHAIN_OPS or len(chain) >= MAX_CHAIN_OPS:
            return f"needs more than {MAX_CHAIN_OPS} ops"
        seen.add(op.name)
        for u in dict.fromkeys(op.inputs):
            if _drawn(graph, u, drawn):  # e.g. a dropout's mask: its tensors are never rebuilt
                return f"reads {u!r}, which comes from a random draw"
        for u in dict.fromkeys(op.inputs):
            if _free_source(graph, u, saved):
                continue
            if u in candidates:  # saved, but recomputed itself: its chain would reach back further
                return f"reads {u!r}, which is recomputed"
            why = visit(u, depth + 1)
            if why:
                return why
        chain.append(op.name)
        return ""

    why = visit(tensor, 1)
    return why or chain


def _is_random(op_type: str) -> bool:
    return op_type in RANDOM_TYPES or "Random" in op_type or op_type.startswith(("Stateful", "Stateless", "Rng"))


# Ops through which a random draw stays "the draw" (a dropout's mask: draw >= rate, cast, scaled).
_DRAW_CARRIERS = RECOMPUTABLE_TYPES | {"GreaterEqual", "Greater", "Less", "LessEqual", "Equal", "NotEqual",
                                       "Select", "SelectV2", "LogicalAnd", "LogicalOr", "LogicalNot", "Floor"}


def _drawn(graph: Graph, tensor: str, memo: dict[str, bool]) -> bool:
    """Does `tensor` come from a random op through elementwise ops only (a dropout's mask or output)?"""
    stack: list[tuple[str, bool]] = [(tensor, False)]
    while stack:  # iterative post-order: long elementwise chains must not hit the recursion limit
        t, done = stack.pop()
        if t in memo:
            continue
        op = graph.producer(t)
        carries = op.type in _DRAW_CARRIERS and not _is_random(op.type)
        if done or not carries:
            memo[t] = _is_random(op.type) or (carries and any(memo.get(u, False) for u in op.inputs))
            continue
        stack.append((t, True))
        stack.extend((u, False) for u in op.inputs if u not in memo)
    return memo[tensor]


def _free_source(graph: Graph, tensor: str, saved: set[str]) -> bool:
    """Is `tensor` in the backward pass anyway (or tiny), without recomputing it?"""
    op = graph.producer(tensor)
    if tensor in saved or op.type in _INPUT_TYPES or op.type in _RESIDENT_TYPES:
        return True
    spec = graph.tensors[tensor]
    return spec.per_sample_bytes == 0 and graph.tensor_bytes(tensor) <= TINY_SOURCE_BYTES


def _recompute(graph: Graph, tensor: str, consumers: tuple[str, ...], chain: list[str], group: int,
               trigger: str | None, distance: int | None, strategy: str) -> Recompute:
    made: dict[str, str] = {}
    clones: list[Clone] = []
    sources: list[str] = []
    gates: dict[str, Gate] = {}
    for name in chain:
        op = graph.ops[name]
        clone_name = recompute_op_name(tensor, group, name)
        root = not any(u in made for u in op.inputs)
        inputs = []
        for u in op.inputs:
            if u in made:
                inputs.append(made[u])
                continue
            sources.append(u)
            if root and graph.producer(u).type not in _RESIDENT_TYPES:  # a root waits for the trigger
                if u not in gates:
                    gate_name = gate_op_name(tensor, group, u)
                    gates[u] = Gate(gate_name, u, (trigger,) if trigger else ())
                inputs.append(gates[u].output)
            else:
                inputs.append(u)
        clone = Clone(clone_name, name, tuple(inputs))
        clones.append(clone)
        for t in op.outputs:
            made[t] = clone.output(t)
    if not gates:  # every root reads constants only: gate the first one so the chain still waits
        u = next(u for c in clones for u in c.inputs if u in sources)
        gate = Gate(gate_op_name(tensor, group, u), u, (trigger,) if trigger else ())
        gates[u] = gate
        clones = [dataclasses.replace(c, inputs=tuple(gate.output if x == u and c is clones[0] else x
                                                      for x in c.inputs)) for c in clones]
    return Recompute(tensor=tensor, consumers=consumers, clones=tuple(clones),
                     sources=tuple(dict.fromkeys(sources)), trigger=trigger, nbytes=graph.tensor_bytes(tensor),
                     distance=distance, strategy=strategy, gates=tuple(gates.values()))
