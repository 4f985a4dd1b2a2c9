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
``Reshape`` of a ``Tensordot``'s ``Transpose``: `lms.plan.candidates`), tensors outside
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
(``MatMul(Transpose(x), y)`` reads ``x`` with ``transpose_a``: `lms.rules.hides_rewrite`)
keeps reading the original: a swap-in in between would change its arithmetic.

``fuse_swapins``: consumers of one tensor whose levels are within ``lb`` of the
previous consumer share one swap-in (its own swap-in would be triggered before
the previous consumer runs, so the copies would coexist anyway).

Last, triggers that Grappler could fold into a fusion are moved to a safe
ancestor (`lms.plan.anchor.anchor_triggers`): the plan is exactly what is applied.
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
import logging
from typing import Iterator

from ..config import LMSConfig
from ..graph import Graph, Role
from .anchor import anchor_triggers
from .candidates import SKIPPED_PRODUCER_TYPES, find_candidates, rejection
from .recompute import is_recompute_op_name
from .recompute_planner import plan_recompute
from ..rules import hides_rewrite
from .swap_plan import Skip, Swap, SwapIn, SwapPlan, swap_op_name
from .triggers import find_trigger

__all__ = ["plan_swaps", "KERNELS", "RECOMPUTE_SHARE_LEVELS"]

log = logging.getLogger(__name__)

# With ``fuse_swapins``: a tensor that recompute clones read (a chain's source) is read again a
# few levels later by the gradient of its own consumer (BatchNorm's gradient reads the BiasAdd
# output the chain rebuilt the ReLU from; 11-17 levels later on ResNet-50): one swap-in serves
# readers up to this many levels apart, so its bytes cross the link once, not once per reader.
# It holds the source meanwhile: where a memory schedule runs another branch in between
# (ResNet-50's shortcut BatchNorm after the main branch) that costs batch size, so it is the
# tuner's choice through ``fuse_swapins``, not a rule.
RECOMPUTE_SHARE_LEVELS = 32

KERNELS = ("cpu", "gpu")


def plan_swaps(graph: Graph, config: LMSConfig, *, kernels: str = "cpu") -> SwapPlan:
    """Plan swap-outs and swap-ins for `graph` under `config`.

    Args:
        graph: the training graph model (linted).
        config: the LMS knobs.
        kernels: whose kernels run the step, ``"cpu"`` (TF's CPU build, oneDNN)
            or ``"gpu"``: a few rules hold on one only
            (`lms.rules.hides_rewrite`). `DeviceProfile.kernels` names them.

    Returns:
        A `SwapPlan`; empty when ``config.n_tensors == 0`` and ``config.recompute == "none"``.
        With recomputation, `SwapPlan.recompute` holds the clones
        (`lms.plan.plan_recompute`, planned first) and the swaps
        refer to the graph with the clones.
    """
    if kernels not in KERNELS:
        raise ValueError(f"kernels={kernels!r}: allowed values are 'cpu' and 'gpu'")
    if not config.enabled:
        return SwapPlan(config=config, graph_name=graph.name, batch_size=graph.batch_size)
    recompute = None
    if config.recompute != "none":
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
        hidden = {c: why for c in backward if (why := hides_rewrite(graph, t, c, kernels=kernels))}
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
            trigger, distance, how = find_trigger(graph, config, t, group[0], role=Role.BACKWARD, avoid=avoid)
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
            if rejection(graph, config, t, graph.live_readers(t)):
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
                trig, dist, how = find_trigger(graph, config, t, group[0], role=Role.FORWARD, floor=floor)
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
