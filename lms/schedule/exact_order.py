"""`exact_order(nodes, schedule_order) -> ExactOrder`: one order over the graph TF really runs, and the edges that pin it all. No TensorFlow.

`schedule="memory"` pins its order through the ops of the traced graph that no
Grappler or oneDNN rewrite touches (`lms.plan.anchor.pinnable_ops`); the fused
kernels and the BatchNorm arithmetic between them float, and TF's
single-threaded executor places them by a depth-first walk over edge sets kept
in pointer order: another order in every process, and another peak.

On one CPU device LMS can pin the *executed* graph instead (`lms.tf.exact`):
it takes the graph Grappler made of the step (TF records it when it
instantiates the function), chains every op of it in the order chosen, and runs
that graph with Grappler off. Nothing is left to rewrite but oneDNN's layout
pass, which maps each op to its kernel; with every op on one chain the order is
the graph's only topological order, whatever the executor and the process.

This module decides that chain from the optimized graph's nodes (name, type,
inputs) and the memory schedule's order over the traced graph
(`lms.schedule.Schedule.order`):

- A node whose name is in the schedule takes its position (Grappler's fused
  nodes carry the name of the op whose output they compute, e.g.
  ``_FusedConv2D`` that of the ``BiasAdd``); a node it made (an arithmetic
  rewrite, an emulated swap op's ``/shape`` part) runs just after its last
  input that has a position, or, reading only variables and constants, just
  before its first reader that has one.
  A topological sort that always takes the ready node with the earliest
  position gives the order.
- The chain joins consecutive ops that run a kernel (not constants, the
  step's arguments and results, or ``NoOp``), except where the later one
  already reads the earlier::

      (a) -> (b)    (c)          (a) -> (b) ..> (c) ..> (d)
       `----------------> (d)

- oneDNN merges a ``Conv2DBackpropFilter`` and the ``BiasAddGrad`` of the same
  gradient into one kernel, but only when both have the same control inputs;
  an op between them, or an edge from one to the other, would be a cycle once
  merged. The pair stays adjacent, and the chain enters both alike (the same
  edges, in the same order, even where one already reads the op before) and
  leaves both::

      (w) ..> (filter grad) ..> (z)
      (w) ..> (bias grad)   ..> (z)

  It also fuses a ``Pad`` into the convolution that is its only data reader, again
  only when both have the same control inputs: the convolution runs right after
  its pad (the pad waits for the convolution's other inputs), both are entered
  alike, and only the convolution leads on::

      (w) ..> (pad) -> (conv) ..> (z)
      (w) ..........>  (conv)

Graphs with control flow (``Switch``/``Merge``: a chained op downstream of an
untaken branch would never run) are refused.
"""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..rules import MERGED_SIBLING_TYPES

__all__ = ["Node", "ExactOrder", "ExactOrderError", "exact_order", "order_dependent_sums", "FREE_TYPES",
           "CONTROL_FLOW_TYPES"]

# Nodes that allocate nothing (arguments and results are forwarded) or only gather control edges: not
# chained, they run where their inputs allow. Constants are chained: each allocates its tensor when the
# executor creates its kernel, in the executor's node order, and a constant left off the chain is created
# wherever the executor's walk over pointer-ordered edge sets meets it -- in another place in each process,
# which moves every later buffer in TF's allocator.
FREE_TYPES = frozenset({"_Arg", "_Retval", "NoOp", "Placeholder"})
# Low-level control flow: a chained op behind an untaken branch would be dead, and so would the chain.
CONTROL_FLOW_TYPES = frozenset({"Switch", "RefSwitch", "_SwitchN", "Merge", "RefMerge", "Enter", "RefEnter",
                                "Exit", "RefExit", "NextIteration", "RefNextIteration", "LoopCond",
                                "ControlTrigger"})


class ExactOrderError(ValueError):
    """The graph cannot be pinned whole (control flow), or an order or chain is inconsistent with it."""


@dataclass(frozen=True)
class Node:
    """One node of the optimized graph: its producers by node name (output indexes dropped)."""

    name: str
    type: str
    inputs: tuple[str, ...] = ()
    control_inputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExactOrder:
    """A total order over an optimized graph and the control edges that pin it.

    Attributes:
        order: every node, a topological order of the graph.
        edges: ``(before, after)`` control edges to add: with them the order
            is the only one in which the graph's kernels can run.
        merged: pairs oneDNN merges into one kernel, adjacent in `order`: siblings
            (filter and bias gradients of one convolution) and `fused` pairs.
        fused: the merged pairs whose first member (a ``Pad``) feeds the second
            (its convolution): the chain leaves them through the second only.
        n_placed: nodes whose position came from the schedule (by name).
        n_chained: nodes on the chain (the ones that run a kernel).
    """

    order: tuple[str, ...]
    edges: tuple[tuple[str, str], ...]
    merged: tuple[tuple[str, str], ...] = ()
    fused: tuple[tuple[str, str], ...] = ()
    n_placed: int = 0
    n_chained: int = 0

    def chained(self, nodes: Sequence[Node]) -> tuple[str, ...]:
        """The nodes of `order` on the chain (not `FREE_TYPES`)."""
        types = {n.name: n.type for n in nodes}
        return tuple(n for n in self.order if types[n] not in FREE_TYPES)

    def validate(self, nodes: Sequence[Node]) -> None:
        """Check against `nodes`: a permutation, topological with the edges, every chained pair ordered.

        Raises:
            ExactOrderError: naming the first problem.
        """
        by_name = {n.name: n for n in nodes}
        if len(self.order) != len(by_name) or set(self.order) != set(by_name):
            missing = sorted(set(by_name) - set(self.order))[:3]
            raise ExactOrderError(f"order has {len(self.order)} nodes, the graph {len(by_name)}; e.g. missing "
                                  f"{missing}")
        pos = {n: i for i, n in enumerate(self.order)}
        extra: dict[str, list[str]] = {}
        for a, b in self.edges:
            if a not in pos or b not in pos:
                raise ExactOrderError(f"edge {a!r} -> {b!r} names a node not in the graph")
            extra.setdefault(b, []).append(a)
        for name in self.order:
            node = by_name[name]
            for p in (*node.inputs, *node.control_inputs, *extra.get(name, ())):
                if p not in pos:
                    raise ExactOrderError(f"{name!r} reads {p!r}, which is not in the graph")
                if pos[p] >= pos[name]:
                    raise ExactOrderError(f"order runs {name!r} before its input {p!r}")
        pairs = {frozenset(p) for p in self.merged}
        chain = self.chained(nodes)
        chain_pos = {n: i for i, n in enumerate(chain)}
        for a, b in self.merged:
            if chain_pos.get(b, -2) - chain_pos.get(a, -4) != 1:
                raise ExactOrderError(f"oneDNN merges {a!r} and {b!r}: they must be adjacent on the chain")
            ca = [*by_name[a].control_inputs, *extra.get(a, ())]
            cb = [*by_name[b].control_inputs, *extra.get(b, ())]
            if ca != cb:
                raise ExactOrderError(f"oneDNN merges {a!r} and {b!r} only when their control inputs are the same "
                                      f"(got {ca} and {cb})")

        for x, y in zip(chain, chain[1:]):
            if frozenset((x, y)) in pairs:
                if x in extra.get(y, ()) or y in extra.get(x, ()):
                    raise ExactOrderError(f"an edge joins {x!r} and {y!r}, which oneDNN merges (a cycle)")
                continue
            node = by_name[y]
            if x not in node.inputs and x not in node.control_inputs and x not in extra.get(y, ()):
                raise ExactOrderError(f"nothing orders {x!r} before {y!r}: the chain is broken there")


def exact_order(nodes: Sequence[Node], schedule_order: Sequence[str] = (), *, onednn: bool = True) -> ExactOrder:
    """The order `schedule_order` asks for, over the optimized graph `nodes`, and the chain that pins it.

    Args:
        nodes: the optimized graph (every node once, inputs by node name).
        schedule_order: op names of the traced graph in the order chosen
            (`lms.schedule.Schedule.order`); ``()``: the nodes' own order.
        onednn: oneDNN's layout pass will run on the graph (TF's CPU build with
            oneDNN on): its merged pairs are kept adjacent; off, they are
            chained like any other op.

    Returns:
        A validated `ExactOrder`.

    Raises:
        ExactOrderError: the graph has control flow, a dangling input or a cycle.
    """
    by_name = {n.name: n for n in nodes}
    flow = sorted({n.type for n in nodes if n.type in CONTROL_FLOW_TYPES})
    if flow:
        raise ExactOrderError("the step's optimized graph has control flow (" + ", ".join(flow) + "): a chain "
                              "through an untaken branch would never run; only graphs without it are pinned whole")
    index = {n.name: i for i, n in enumerate(nodes)}
    preds: dict[str, tuple[str, ...]] = {}
    for n in nodes:
        ps = tuple(dict.fromkeys((*n.inputs, *n.control_inputs)))
        for p in ps:
            if p not in by_name:
                raise ExactOrderError(f"{n.name!r} reads {p!r}, which is not in the graph")
        preds[n.name] = ps
    siblings = _merged_pairs(nodes) if onednn else ()
    fused = _fused_pads(nodes, preds) if onednn else ()
    merged = siblings + fused
    after_mate = {b: a for a, b in merged}  # ordering only: the second member right after the first
    succs: dict[str, list[str]] = {n.name: [] for n in nodes}
    for name, ps in preds.items():
        for p in ps:
            succs[p].append(name)
    waits: dict[str, int] = {}  # ordering-only inputs: the sibling's mate, the pad's convolution's other inputs
    for a, b in siblings:
        succs[a].append(b)
        waits[b] = waits.get(b, 0) + 1
    for pad, conv in fused:
        for q in preds[conv]:
            if q != pad and q not in preds[pad]:
                succs[q].append(pad)
                waits[pad] = waits.get(pad, 0) + 1
    key = _positions(nodes, preds, succs, schedule_order, index)
    pending = {name: len(preds[name]) + waits.get(name, 0) for name in by_name}
    heap = [(key[name], name) for name in by_name if not pending[name]]
    heapq.heapify(heap)
    order: list[str] = []
    urgent: list[str] = []
    while heap or urgent:
        name = urgent.pop() if urgent else heapq.heappop(heap)[1]
        order.append(name)
        for s in succs[name]:
            pending[s] -= 1
            if not pending[s]:
                if after_mate.get(s) == name:
                    urgent.append(s)  # the merged mate comes next
                else:
                    heapq.heappush(heap, (key[s], s))
    if len(order) != len(nodes):
        stuck = sorted(n for n, k in pending.items() if k)[:3]
        raise ExactOrderError(f"the graph has a cycle (e.g. through {stuck})")
    types = {n.name: n.type for n in nodes}
    chain = [n for n in order if types[n] not in FREE_TYPES]
    mate = {a: b for a, b in merged} | {b: a for a, b in merged}
    fused_set = set(fused)
    edges: list[tuple[str, str]] = []
    k = 0
    while k < len(chain) - 1:
        here = _unit(chain, k, mate)
        there = _unit(chain, k + len(here), mate)
        if not there:
            break
        leaving = here[1:] if here in fused_set else here  # a pad leads on through its convolution only
        if len(there) > 1:  # a merged pair: the same control inputs on both, or oneDNN does not merge them
            edges.extend((x, y) for y in there for x in leaving)
        else:
            direct = set(preds[there[0]])
            edges.extend((x, there[0]) for x in leaving if x not in direct)
        k += len(here)
    scheduled = set(schedule_order)  # once: a set per node made this quadratic (4 s on ResNet-50's 5,885 nodes)
    placed = sum(1 for n in nodes if n.name in scheduled)
    out = ExactOrder(order=tuple(order), edges=tuple(edges), merged=merged, fused=fused, n_placed=placed,
                     n_chained=len(chain))
    out.validate(nodes)
    return out


_ACCUMULATE = re.compile(r"^(.*)/tmp_var_accum_(\d+)$")


def order_dependent_sums(nodes: Sequence[Node]) -> tuple[str, ...]:
    """The accumulations Grappler's memory optimizer made in an optimized graph, by ``AddN`` name.

    Its scheduling pass turns a large ``AddN`` into a ``TemporaryVariable`` that each
    input is added to as it arrives (``<AddN>/tmp_var_accum_<k>``: one ``AssignAdd`` per
    term, unordered). The sum's bits then depend on the order the terms run in,
    which TF's executor decides as the inputs arrive; no order chosen ahead of the
    run reproduces it (seen: neither Grappler's term order nor the graph's node
    order was the one TF ran), so a graph with one is not pinned whole.
    """
    found = {m.group(1) for n in nodes if n.type == "AssignAdd" and (m := _ACCUMULATE.match(n.name))}
    return tuple(sorted(found))


def _unit(chain: list[str], k: int, mate: dict[str, str]) -> tuple[str, ...]:
    """The chain member at `k`, with its merged mate when that comes right after it."""
    if k >= len(chain):
        return ()
    if k + 1 < len(chain) and mate.get(chain[k]) == chain[k + 1]:
        return (chain[k], chain[k + 1])
    return (chain[k],)


def _merged_pairs(nodes: Sequence[Node]) -> tuple[tuple[str, str], ...]:
    """``(a, b)`` pairs oneDNN merges (`lms.rules.MERGED_SIBLING_TYPES`): ``b`` has one input, which ``a`` reads."""
    readers: dict[str, list[Node]] = {}
    for n in nodes:
        for p in dict.fromkeys(n.inputs):
            readers.setdefault(p, []).append(n)
    pairs: list[tuple[str, str]] = []
    taken: set[str] = set()
    for a_type, b_type in MERGED_SIBLING_TYPES:
        for n in nodes:
            if n.type != b_type or len(n.inputs) != 1:
                continue
            mates = [r for r in readers.get(n.inputs[0], ()) if r.type == a_type and r.name not in taken]
            if mates:
                pairs.append((mates[0].name, n.name))
                taken.update((mates[0].name, n.name))
    return tuple(pairs)


# oneDNN's layout pass fuses a Pad into the convolution that alone reads it (_MklNativePadWith[Fused]Conv2D)
_PAD_TYPES = frozenset({"Pad"})
_PADDED_CONV_TYPES = frozenset({"Conv2D", "_FusedConv2D"})


def _fused_pads(nodes: Sequence[Node], preds: dict[str, tuple[str, ...]]) -> tuple[tuple[str, str], ...]:
    """``(pad, conv)``: a ``Pad`` whose only data reader is a convolution reading it as its input 0 (oneDNN
    fuses them; control readers do not stop it: Grappler's folded ``ShapeN`` of the pad is one).

    Skipped when one of the convolution's other inputs depends on the pad (waiting for it would be a cycle).
    """
    readers: dict[str, list[Node]] = {}
    for n in nodes:
        for p in dict.fromkeys(n.inputs):
            readers.setdefault(p, []).append(n)
    by_name = {n.name: n for n in nodes}
    pairs: list[tuple[str, str]] = []
    for n in nodes:
        if n.type not in _PAD_TYPES:
            continue
        rs = readers.get(n.name, [])
        if len(rs) != 1 or rs[0].type not in _PADDED_CONV_TYPES or not rs[0].inputs or rs[0].inputs[0] != n.name:
            continue
        conv = rs[0]
        others = [q for q in preds[conv.name] if q != n.name]
        if any(_depends_on(by_name, preds, q, n.name) for q in others):
            continue
        pairs.append((n.name, conv.name))
    return tuple(pairs)


def _depends_on(by_name: dict[str, Node], preds: dict[str, tuple[str, ...]], name: str, ancestor: str) -> bool:
    stack, seen = [name], set()
    while stack:
        x = stack.pop()
        if x == ancestor:
            return True
        if x in seen:
            continue
        seen.add(x)
        stack.extend(preds[x])
    return False


def _positions(nodes: Sequence[Node], preds: dict[str, tuple[str, ...]], succs: dict[str, list[str]],
               schedule_order: Iterable[str], index: dict[str, int]) -> dict[str, tuple[float, int, int]]:
    """Sort key per node: its schedule position; else just after its latest placed input (through unplaced
    inputs); else, when it reads only arguments and constants, just before its earliest placed reader; else
    last, in graph order.

    After the input, not before the reader: an unplaced node that reads a computed tensor is mostly a part
    of an op the schedule placed (an emulated swap-out's ``Shape`` of the tensor it copies) or a rewrite of
    one (Grappler's ``AddN`` of gradients); run late, it would keep that tensor alive (seen: every swapped
    ResNet-50 activation held until its swap-in by the ``Shape`` read of the swap-out, 30% more memory).
    One that reads only variables (a rewritten ``momentum * m``) would hold its own output from the start.
    """
    position = {name: float(i) for i, name in enumerate(schedule_order)}
    topo = _topological(nodes, preds)
    after: dict[str, float] = {}
    for name in topo:  # the latest placed input, through unplaced inputs
        after[name] = max((position.get(p, after.get(p, float("-inf"))) for p in preds[name]),
                          default=float("-inf"))
    before: dict[str, float] = {}
    for name in reversed(topo):  # the earliest placed reader, through unplaced readers
        before[name] = min((position.get(s, before.get(s, float("inf"))) for s in succs[name]),
                           default=float("inf"))
    key: dict[str, tuple[float, int, int]] = {}
    end = float(len(position))
    for name in topo:
        if name in position:
            key[name] = (position[name], 0, index[name])
        elif after[name] != float("-inf"):
            key[name] = (after[name], 1, index[name])
        elif before[name] != float("inf"):
            key[name] = (before[name], -1, index[name])
        else:
            key[name] = (end, 0, index[name])
    return key


def _topological(nodes: Sequence[Node], preds: dict[str, tuple[str, ...]]) -> list[str]:
    """Kahn's algorithm in node order (inputs before readers); raises on a cycle."""
    pending = {n.name: len(preds[n.name]) for n in nodes}
    readers: dict[str, list[str]] = {n.name: [] for n in nodes}
    for name, ps in preds.items():
        for p in ps:
            readers[p].append(name)
    ready = [n.name for n in nodes if not pending[n.name]]
    out: list[str] = []
    while ready:
        name = ready.pop()
        out.append(name)
        for r in readers[name]:
            pending[r] -= 1
            if not pending[r]:
                ready.append(r)
    if len(out) != len(nodes):
        stuck = sorted(n for n, k in pending.items() if k)[:3]
        raise ExactOrderError(f"the graph has a cycle (e.g. through {stuck})")
    return out
