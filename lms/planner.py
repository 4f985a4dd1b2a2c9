"""`plan_swaps(graph, config) -> SwapPlan`: decide what to swap and when. No TensorFlow.

Candidates (as in TFLMS): outputs of forward ops that backward ops read through
a data edge. Shape-only readers (``Shape``, ``ShapeN``, ...) do not count, nor
do readers TensorFlow prunes (`lms.graph.Op.live`: a frozen layer's filter
gradient, the gradient of a constant): a tensor only they read is not swapped,
and they keep reading the original.
Skipped: a While loop's TensorList accumulators (`LOOP_ACCUMULATOR_REASON`:
recurrent layers; tensors outside the loop are candidates like any other),
tensors of rank <= 1 or unknown rank, empty tensors, outputs of cheap
or stateful producers (`SKIPPED_PRODUCER_TYPES`; a view is swapped after all
when the backward pass reads its computed source only through it, e.g. the
``Reshape`` of a ``Tensordot``'s ``Transpose``: `_view_holds_its_source`), tensors outside
``incl_scopes``/``incl_types`` (when given) or inside ``excl_scopes``/
``excl_types``, and tensors also read by an op that is neither forward nor
backward (e.g. a moving-average update): that reader would keep the device copy
alive and swapping would only cost time.

Order and ``n_tensors``: candidates are taken in the forward topological order,
earliest first, and the first ``n_tensors`` that get a valid swap-in trigger are
swapped (TFLMS did the same). Early activations are the ones held longest
between forward and backward, so they are the best value per byte moved.

Triggers (``ctrld_strategy``), for a swap-in serving consumers whose first is
``c`` at level ``L``:
- ``direct_order``: an op at level ``L - k`` of the whole graph's topological
  levels, for the smallest ``k`` in ``[lb, ub]`` where a backward op exists
  there; an ancestor of ``c`` is preferred (it surely runs before ``c``).
- ``chain_rule``: follow backpropagation. Let ``f`` be the forward op whose
  gradient ``c`` computes (``c.grad_of``; the tensor's producer if unknown).
  Walk ``k`` levels forward in the forward graph to ops ``f'``; the gradient of
  ``f'`` is computed before the gradient of ``f``, so a backward op computing it
  (``Op.grad_of == f'``) triggers the swap-in. Smallest ``k`` in ``[lb, ub]``
  with a valid such op; the latest of them is chosen. Unrelated ops that happen
  to share a level cannot be picked. Falls back to ``direct_order`` (and says
  so in ``SwapIn.strategy``) when it finds none.
A backward trigger must lie deeper than `Graph.forward_end` and depend on every
forward reader of the tensor, so it surely runs after the tensor's forward use (gradient constants and ``Shape`` ops under
``gradient_tape/`` have low levels but may run during the forward pass). A trigger
always has a lower level than ``c``, so it can never depend on ``c``: no plan
creates a cycle.

A backward reader that Grappler rewrites together with the tensor's producer
(``MatMul(Transpose(x), y)`` reads ``x`` with ``transpose_a``: `lms.rewrites.hides_rewrite`)
keeps reading the original: a swap-in in between would change its arithmetic.

``fuse_swapins``: consumers of one tensor whose levels are within ``lb`` of the
previous consumer share one swap-in (its own swap-in would be triggered before
the previous consumer runs, so the copies would coexist anyway).

Last, triggers that Grappler could fold into a fusion are moved to a safe
ancestor (`lms.anchor.anchor_triggers`): the plan is exactly what is applied.
With ``schedule="memory"`` the swap-ins keep no trigger: the memory schedule
(`lms.schedule`) places each one and pins it there; floating-point tensors read
by backward ops that may run during the forward pass (no trigger exists for
them, `_early`) get one swap-in for those readers too.

``swap_branches``: a forward tensor whose forward readers lie more than
``branch_threshold`` levels after its producer (a long skip connection) is also
swapped out, and those far readers get a swap-in triggered by a forward op
``lb``..``ub`` levels before them. These are counted separately from
``n_tensors``.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
from typing import Iterable, Iterator

from .anchor import anchor_triggers
from .config import LMSConfig
from .graph import SHAPE_ONLY_TYPES, Graph, Role
from .plan import Skip, Swap, SwapIn, SwapPlan, swap_op_name
from .recompute import is_recompute_op_name
from .rewrites import hides_rewrite

__all__ = ["plan_swaps", "find_candidates", "SKIPPED_PRODUCER_TYPES", "LOOP_ACCUMULATOR_REASON"]

log = logging.getLogger(__name__)

# With ``fuse_swapins``: a tensor that recompute clones read (a chain's source) is read again a
# few levels later by the gradient of its own consumer (BatchNorm's gradient reads the BiasAdd
# output the chain rebuilt the ReLU from; 11-17 levels later on ResNet-50): one swap-in serves
# readers up to this many levels apart, so its bytes cross the link once, not once per reader.
# It holds the source meanwhile: where a memory schedule runs another branch in between
# (ResNet-50's shortcut BatchNorm after the main branch) that costs batch size, so it is the
# tuner's choice through ``fuse_swapins``, not a rule.
RECOMPUTE_SHARE_LEVELS = 32

# Producers whose outputs TFLMS never swapped: inputs, constants, variable reads,
# views and cheap fills. Swapping them moves bytes for nothing.
SKIPPED_PRODUCER_TYPES = frozenset({
    "Const", "Identity", "IdentityN", "Reshape", "Shape", "ShapeN", "Size", "Rank",
    "Placeholder", "PlaceholderWithDefault", "VarHandleOp", "ReadVariableOp",
    "VarIsInitializedOp", "VariableShape", "Variable", "VariableV2", "Read",
    "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "ResourceGather",
    "Fill", "Range", "RandomUniform", "ZerosLike", "OnesLike", "StopGradient",
    "Squeeze", "ExpandDims", "NoOp", "_Arg", "_Retval",
})


def find_candidates(graph: Graph, config: LMSConfig) -> tuple[list[str], list[Skip]]:
    """Forward tensors read by backward ops that the config allows, in forward order.

    Returns:
        (candidate tensor names, skipped tensors with reasons).
    """
    _warn_unmatched_filters(graph, config)
    candidates: list[str] = []
    skipped: list[Skip] = []
    for op_name in graph.topological_order:
        op = graph.ops[op_name]
        if op.role is not Role.FORWARD:
            continue
        for t in op.outputs:
            readers = graph.data_consumers(t)
            if not any(graph.ops[r].role is Role.BACKWARD for r in readers):
                continue
            if not any(graph.ops[r].role is Role.BACKWARD for r in graph.live_readers(t)):
                skipped.append(Skip(t, "read only by backward ops TensorFlow prunes (nothing uses their results, "
                                       "e.g. a frozen layer's gradient)"))
                continue
            reason = _rejection(graph, config, t, graph.live_readers(t))
            if reason:
                skipped.append(Skip(t, reason))
            else:
                candidates.append(t)
    return candidates, skipped


_WARNED: set[tuple[str, str, tuple[str, ...]]] = set()


def _warn_unmatched_filters(graph: Graph, config: LMSConfig) -> None:
    """Warn (once per graph and filter) about scopes and op types of the config that name no op of `graph`.

    A config tuned for another model names that model's scopes: with ``incl_scopes`` it would
    swap nothing here, silently (and an ``excl_scopes`` entry would protect nothing).
    """
    for field in ("incl_scopes", "excl_scopes", "incl_types", "excl_types"):
        wanted = tuple(getattr(config, field))
        if not wanted or (graph.name, field, wanted) in _WARNED:
            continue
        if field.endswith("scopes"):
            unmatched = [s for s in wanted if not any(_in_scopes(op.name, (s,)) for op in graph.ops.values())]
        else:
            types = {op.type for op in graph.ops.values()}
            unmatched = [t for t in wanted if t not in types]
        _WARNED.add((graph.name, field, wanted))
        if unmatched:
            effect = ("nothing is swapped" if len(unmatched) == len(wanted) and field.startswith("incl")
                      else "they have no effect")
            log.warning("LMS config %s %s name no op of graph %r: %s (a config made for another model?)", field,
                        ", ".join(repr(u) for u in unmatched), graph.name, effect)


# A recurrent layer (Keras' LSTM, GRU, SimpleRNN without cuDNN) runs a While loop that keeps the activations of
# every step for the backward loop in TensorLists: variant tensors, whose contents a graph rewrite outside the
# loop cannot move (an emulated swap op cannot copy a variant; a device identity copies the list, not its storage).
LOOP_ACCUMULATOR_REASON = ("a While loop's accumulator (a recurrent layer's activations of every step, one "
                           "TensorList): graph rewriting outside the loop cannot swap it")
_LOOP_TYPES = frozenset({"While", "StatelessWhile"})


def _rejection(graph: Graph, config: LMSConfig, tensor: str, readers: Iterable[str]) -> str:
    op = graph.producer(tensor)
    spec = graph.tensors[tensor]
    if op.type in _LOOP_TYPES and spec.dtype == "variant":
        return LOOP_ACCUMULATOR_REASON
    if op.type in SKIPPED_PRODUCER_TYPES and not _view_holds_its_source(graph, tensor):
        return f"producer type {op.type} is not worth swapping"
    if spec.rank is None or spec.rank <= 1:
        return "rank <= 1 or unknown rank"
    if graph.tensor_bytes(tensor) == 0:
        return "empty tensor"
    if config.incl_scopes and not _in_scopes(op.name, config.incl_scopes):
        return "not in incl_scopes"
    if config.incl_types and op.type not in config.incl_types:
        return "not in incl_types"
    if _in_scopes(op.name, config.excl_scopes):
        return "in excl_scopes"
    if op.type in config.excl_types:
        return "in excl_types"
    for r in readers:
        if graph.ops[r].role is Role.OTHER:
            return f"also read by non-gradient op {r!r}, which keeps it on the device"
    return ""


# Views: their output is their input's buffer (as `lms.schedule` and `lms.sim.compiled` model them).
_VIEW_TYPES = frozenset({"Reshape", "Identity", "Squeeze", "ExpandDims"})


def _view_holds_its_source(graph: Graph, tensor: str) -> bool:
    """True when `tensor` is a view of a computed forward tensor that the backward pass reads only through views.

    Keras's ``Dense`` on a 3-D input reshapes a ``Transpose`` (``Tensordot``) and
    its gradient reads the reshaped tensor: the view is the only thing that holds
    the transpose's buffer into the backward pass (GPT-2 small at seq 2048: 31 MiB
    per sample and layer). Swapping the view frees it. A view of a tensor the
    backward pass also reads directly is not: that tensor is a candidate itself.
    """
    t = tensor
    while True:
        op = graph.producer(t)
        if op.type not in _VIEW_TYPES or not op.inputs:
            break
        t = op.inputs[0]
        if any(graph.ops[r].role is Role.BACKWARD for r in graph.live_readers(t)):
            return False  # the source is read by the backward pass itself (a candidate of its own)
    src = graph.producer(t)
    return t != tensor and src.role is Role.FORWARD and src.type not in SKIPPED_PRODUCER_TYPES


def _in_scopes(name: str, scopes: Iterable[str]) -> bool:
    return any(name == s.rstrip("/") or name.startswith(s.rstrip("/") + "/") for s in scopes)


def plan_swaps(graph: Graph, config: LMSConfig, *, host_budget: int | None = None) -> SwapPlan:
    """Plan swap-outs and swap-ins for `graph` under `config`.

    Args:
        graph: the training graph model (linted).
        config: the LMS knobs.
        host_budget: host memory (bytes) the swapped tensors may hold at once, as the simulator
            predicts it at the graph's batch size; the latest swaps are dropped (``n_tensors``
            lowered, said by the plan's config) until it fits (`lms.sim.host.plan_within_host_budget`).
            None: no host bound.

    Returns:
        A `SwapPlan`; empty when ``config.n_tensors == 0`` and ``config.recompute == "none"``.
        With recomputation, `SwapPlan.recompute` holds the clones
        (`lms.recompute_planner.plan_recompute`, planned first) and the swaps
        refer to the graph with the clones.
    """
    if host_budget is not None:
        from .sim.host import plan_within_host_budget

        return plan_within_host_budget(graph, config, host_budget)
    if not config.enabled:
        return SwapPlan(config=config, graph_name=graph.name, batch_size=graph.batch_size)
    recompute = None
    if config.recompute != "none":
        from .recompute_planner import plan_recompute  # it uses this module's trigger search

        recompute = plan_recompute(graph, config)
        graph = recompute.rewrite(graph)
    # clone -> the readers of the tensor its chain rebuilds (a swap-in serving the clone serves them)
    clone_readers = {c.name: r.consumers for r in recompute.recomputes for c in (*r.clones, *r.gates)} \
        if recompute else {}
    candidates, skipped = find_candidates(graph, config)
    swaps: dict[str, Swap] = {}
    limit = len(candidates) if config.n_tensors < 0 else config.n_tensors
    losses: list[str] | None = None
    for t in candidates:
        if len(swaps) >= limit:
            skipped.append(Skip(t, f"beyond n_tensors={config.n_tensors}"))
            continue
        # Every backward reader, pruned ones too (find_candidates kept tensors a live one reads): they read
        # what their live siblings read, so the graph TF prunes is the one the plan was checked on.
        backward = [c for c in graph.data_consumers(t) if graph.ops[c].role is Role.BACKWARD]
        hidden = {c: why for c in backward if (why := hides_rewrite(graph, t, c))}
        if hidden and len(hidden) == len(backward):
            skipped.append(Skip(t, "a swap-in would change a Grappler rewrite: " + next(iter(hidden.values()))))
            continue
        backward = [c for c in backward if c not in hidden]  # these keep reading the original
        swap_ins: list[SwapIn] = []
        share = RECOMPUTE_SHARE_LEVELS if config.fuse_swapins and any(is_recompute_op_name(c) for c in backward) \
            else None
        early: list[str] = []
        for group in _group_consumers(graph, backward, config, gap=share):
            avoid = frozenset(r for c in group for r in clone_readers.get(c, ()))
            trigger, distance, how = _find_trigger(graph, config, t, group[0], role=Role.BACKWARD, avoid=avoid)
            if trigger is None:
                if config.schedule == "memory":
                    if losses is None:
                        losses = _losses(graph)
                    if _early(graph, t, group, losses) and _is_float(graph.tensors[t].dtype):
                        early += group
                continue  # else these readers keep reading the device copy
            name = swap_op_name("swap_in", t, len(swap_ins))
            swap_ins.append(SwapIn(name, tuple(group), trigger, distance, how))
        if early:  # one copy for them all: Grappler still sees them read one tensor (see `_early`)
            swap_ins.append(SwapIn(swap_op_name("swap_in", t, len(swap_ins)), tuple(early), None, None,
                                   "early reader"))
        if not swap_ins:
            skipped.append(Skip(t, f"no backward op {config.lb}..{config.ub} levels before its consumers"))
            continue
        swaps[t] = Swap(t, swap_op_name("swap_out", t), tuple(swap_ins), graph.tensor_bytes(t))
    if config.swap_branches:
        _add_branch_swaps(graph, config, swaps, skipped)
    plan = SwapPlan(config=config, swaps=tuple(swaps.values()), skipped=tuple(skipped),
                    n_candidates=len(candidates), graph_name=graph.name, batch_size=graph.batch_size,
                    recompute=recompute)
    plan = anchor_triggers(graph, plan)
    if config.schedule == "memory":
        plan = _untriggered(plan)
    log.debug("planned %d swaps (%d swap-ins) of %d candidates", plan.n_swapped, plan.n_swap_ins,
              len(candidates))
    return plan


def _is_float(dtype: str | None) -> bool:
    """Only floating-point tensors get early-reader swap-ins: with the boolean condition of a logistic loss's
    ``Select`` gradients swapped in, a GAN's variables came out different in a few values
    (tests/tf/test_realworld.py, ``gan_two_tapes``, memory schedule with recomputation, emulated)."""
    return bool(dtype) and ("float" in dtype or dtype in ("half", "bfloat16", "double"))


def _losses(graph: Graph) -> list[str]:
    """Forward ops no forward op reads (a loss, an output)."""
    return [n for n in graph.by_role(Role.FORWARD)
            if not any(graph.ops[c].role is Role.FORWARD for t in graph.ops[n].outputs for c in graph.consumers(t))]


# An early reader's tensor must come at least this many levels before the forward end: the loss's own
# first gradient ops (its `SparseSoftmaxCrossEntropyWithLogits:1`, 1-3 levels before the end in the
# tiny zoo) read tensors the backward pass needs at once anyway; GPT-2's GELU inputs lie 46+ levels before.
_EARLY_MIN_LEVELS = 8


def _early(graph: Graph, tensor: str, readers: list[str], losses: list[str]) -> bool:
    """True when backward `readers` of `tensor` may run while the forward pass runs: no deeper than
    `Graph.forward_end`, not downstream of a loss, reading no per-sample backward tensor (no gradient;
    constants and shapes only), and `tensor` made `_EARLY_MIN_LEVELS` before the end.

    Such readers (a tanh-GELU gradient's ``Pow(x, 2)`` reads only the forward
    ``x``) have no backward op ``lb`` levels before them to trigger a swap-in,
    and TF runs them in the forward pass and holds their outputs until the
    backward pass reads them. Under ``schedule="memory"`` they get a swap-in all
    the same: the schedule places it, and the readers wait for it. (TF seeds a
    scalar loss's gradient with a constant, so in traced graphs the backward pass
    does not depend on the loss op; the backward of a branch shallower than the
    deepest forward op, such as a GAN's discriminator on real data, passes this
    test too, and its swap-in is placed by the schedule like any other.)
    """
    end = graph.forward_end
    return (end is not None and all(graph.levels[r] <= graph.levels[end] for r in readers)
            and graph.levels[end] - graph.levels[graph.producer(tensor).name] >= _EARLY_MIN_LEVELS
            and not any(graph.ops[graph.producer(t).name].role is Role.BACKWARD and graph.tensors[t].per_sample_bytes
                        for r in readers for t in graph.ops[r].inputs)  # reads no gradient, only constants
            and not any(graph.is_ancestor(loss, r) for loss in losses for r in readers))


def _untriggered(plan: SwapPlan) -> SwapPlan:
    """Swap-ins without trigger edges: ``schedule="memory"`` places and pins each one (`lms.schedule`).

    Recompute gates keep theirs: without one, the schedule would run a chain
    whose sources are all there (a ``Pad`` of the step's input) early in the
    forward pass and hold its output (ResNet-50, P100, PREDICTED: batch 856
    instead of 966).

    The trigger found above still decided *whether* a tensor is swapped (a
    backward op ``lb``..``ub`` levels before its readers exists).
    """
    swaps = tuple(dataclasses.replace(s, swap_ins=tuple(
        dataclasses.replace(i, trigger=None, strategy=f"{i.strategy}, placed by the schedule") for i in s.swap_ins))
        for s in plan.swaps)
    return dataclasses.replace(plan, swaps=swaps)


def _group_consumers(graph: Graph, consumers: list[str], config: LMSConfig, *,
                     gap: int | None = None) -> Iterator[list[str]]:
    """Consumers sorted by level; fused: split where the gap to the previous exceeds lb.

    `gap`: fuse (whatever ``fuse_swapins`` says) and split where the gap exceeds ``max(lb, gap)``.
    """
    ordered = sorted(consumers, key=graph.levels.__getitem__)
    if not config.fuse_swapins and gap is None:
        for c in ordered:
            yield [c]
        return
    limit = config.lb if gap is None else max(config.lb, gap)
    group: list[str] = []
    for c in ordered:
        if group and graph.levels[c] - graph.levels[group[-1]] > limit:
            yield group
            group = []
        group.append(c)
    if group:
        yield group


def _find_trigger(graph: Graph, config: LMSConfig, tensor: str, consumer: str, *,
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
                    if _eligible(graph, o, role, tensor) and not _shares_input(graph, o, avoid)]
        if not at_level:
            continue
        for o in at_level:
            if graph.is_ancestor(o, consumer):
                return o, k
        return at_level[0], k
    return None, None


def _shares_input(graph: Graph, op: str, others: frozenset[str]) -> bool:
    """Does `op` read a tensor that one of `others` reads too?"""
    if not others:
        return False
    mine = set(graph.ops[op].inputs)
    return any(mine.intersection(graph.ops[o].inputs) for o in others if o in graph.ops)


def _eligible(graph: Graph, op: str, role: Role, tensor: str) -> bool:
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
                 if levels[g] < limit and g != consumer and _eligible(graph, g, Role.BACKWARD, tensor)
                 and not _shares_input(graph, g, avoid)]
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


def _add_branch_swaps(graph: Graph, config: LMSConfig, swaps: dict[str, Swap], skipped: list[Skip]) -> None:
    """Swap forward tensors across long forward gaps (see module docstring)."""
    levels = graph.levels
    for op_name in graph.topological_order:
        op = graph.ops[op_name]
        if op.role is not Role.FORWARD or op.type in SKIPPED_PRODUCER_TYPES:
            continue
        for t in op.outputs:
            spec = graph.tensors[t]
            if spec.rank is None or spec.rank <= 1 or graph.tensor_bytes(t) == 0:
                continue
            if _rejection(graph, config, t, graph.live_readers(t)):
                continue
            forward = sorted((c for c in graph.live_readers(t) if graph.ops[c].role is Role.FORWARD),
                             key=levels.__getitem__)
            far = [c for c in forward if levels[c] - levels[op_name] > config.branch_threshold]
            near = [c for c in forward if c not in far]
            if not far or not near:
                # all readers far: the tensor is simply produced early; nothing stays resident
                # between a near reader and the far ones, so there is no gap to exploit.
                continue
            floor = max(levels[c] for c in near)
            existing = swaps.get(t)
            offset = len(existing.swap_ins) if existing else 0
            new_ins: list[SwapIn] = []
            for group in _group_consumers(graph, far, config):
                trig, dist, how = _find_trigger(graph, config, t, group[0], role=Role.FORWARD, floor=floor)
                if trig is None:
                    continue
                name = swap_op_name("swap_in", t, offset + len(new_ins))
                new_ins.append(SwapIn(name, tuple(group), trig, dist, how))
            if not new_ins:
                skipped.append(Skip(t, f"branch: no forward op {config.lb}..{config.ub} levels before "
                                       f"its far readers after its near ones"))
                continue
            if existing:
                swaps[t] = Swap(t, existing.swap_out, existing.swap_ins + tuple(new_ins), existing.nbytes,
                                kind="backward+branch")
            else:
                swaps[t] = Swap(t, swap_op_name("swap_out", t), tuple(new_ins), graph.tensor_bytes(t),
                                kind="branch")
