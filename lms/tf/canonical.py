"""An optimized graph as the values it computes, and where two of them differ (`lms.tf.equivalence`).

Grappler renames what it rewrites and keeps one of several equal nodes under
either name, so two optimized graphs are compared by value: each compute node
is named by a hash of its op, attributes and inputs' hashes (`Canonical`).
Ops LMS inserted (swap ops, gates) are looked through to the tensor they stand
for, and a recompute clone hashes like the original when it computes the same.

On a GPU the comparison is modulo the layout pass. Grappler's layout optimizer
converts fp32 convolutions to NCHW; every op it must not convert (a host swap
op, a gate: both preserved) is a layout boundary, so with LMS a ``Transpose``
sits at each swap, and a clone chain read through gates may run its elementwise
ops in NHWC where the step without LMS runs them in NCHW. The layout
optimizer's own ``Transpose`` and ``Reshape`` nodes (named ``...-LayoutOptimizer``)
only move elements, so they are looked through like identities: ``Relu(T(x))``
and ``T(Relu(x))`` are the same values. What a layout can change stays in the
hash: an op's ``data_format`` (a convolution, ``BiasAdd``, pooling, batch norm in
the other layout runs other kernels) and the permuted axes, sizes and paddings
the optimizer gives reductions, ``Pad``, ``Concat`` and the like
(``DataFormatDimMap``/``DataFormatVecPermute``, folded to constants).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from ..plan import SwapPlan
from ..plan.recompute import RECOMPUTE_MARKER, is_gate_op_name

__all__ = ["Naming", "Canonical", "Difference", "canonical", "differences", "optimized_differences", "CHECK_PREFIX"]

CHECK_PREFIX = "lms_check/"
# Ops whose output is their input, bit for bit (IdentityN: output k is input k).
_IDENTITIES = frozenset({"Identity", "IdentityN", "Snapshot"})
_NO_VALUE = frozenset({"NoOp"})  # ops without outputs
# Nodes Grappler's layout optimizer adds that only move elements (module docstring): input 0 is the value.
_LAYOUT_MOVES = frozenset({"Transpose", "Reshape"})
_LAYOUT_SUFFIX = "-LayoutOptimizer"
_BACK_EDGE = frozenset({"NextIteration", "RefNextIteration"})
# Binary ops whose two operands commute exactly (IEEE a + b == b + a): their order does not count. An AddN's
# order of summation does (from three terms on; a two-term AddN is a + b), as does the order of a chain of
# these, which the nodes downstream show.
_SYMMETRIC = frozenset({"Add", "AddV2", "Mul", "Maximum", "Minimum", "SquaredDifference", "Equal", "NotEqual",
                        "LogicalAnd", "LogicalOr", "BitwiseAnd", "BitwiseOr", "BitwiseXor"})  # the stand-ins and fetches the check adds to its copies of the graph


@dataclass(frozen=True)
class Difference:
    """One compute node that Grappler makes differently with LMS.

    Attributes:
        node: its name (a clone's: the original's name with `` (clone)``).
        without_lms: ``Op(inputs)`` as optimized without LMS ('' when absent).
        with_lms: the same with LMS ('' when absent).
    """

    node: str
    without_lms: str
    with_lms: str

    def __str__(self) -> str:
        return f"{self.node}: {self.without_lms or '(none)'} without LMS, {self.with_lms or '(none)'} with"


class Naming:
    """Which nodes LMS inserted and which original a clone (or a node Grappler made of one) stands for."""

    def __init__(self, plan: SwapPlan) -> None:
        markers = {c.name[len(c.op):] for r in (plan.recompute.recomputes if plan.recompute is not None else ()) for c in r.clones if c.name.startswith(c.op)}
        self._clone_marks = sorted(markers, key=len, reverse=True)

    @staticmethod
    def inserted(name: str) -> bool:
        """A swap op, gate, observer or a stand-in of the check (not a clone)."""
        return (name.startswith("lms/") or "/lms/swap_out/" in name or "-lms_swap_in_" in name or is_gate_op_name(name)
                or name.startswith(CHECK_PREFIX) or name.startswith("GroupCrossDeviceControlEdges"))

    def original(self, name: str) -> str | None:
        """The original's name for a clone-derived node, else None."""
        if RECOMPUTE_MARKER not in name:
            return None
        for mark in self._clone_marks:
            name = name.replace(mark, "")
        return name


@dataclass(frozen=True)
class Canonical:
    """An optimized graph as the values it computes.

    Each compute node is named by a hash of its op, attributes and the hashes
    of its inputs (a Merkle hash over the data edges; stateful nodes also by
    name): two nodes that compute the same value have the same hash, whatever
    Grappler named them or whether it merged them (common-subexpression
    elimination keeps one of several equal nodes). Inserted swap ops and gates
    are looked through; a clone hashes like the node it copies when it
    computes the same; control edges, which order but do not change values, do
    not count.
    """

    hashes: dict[str, str]  # node name -> hash
    inputs: dict[str, tuple[str, ...]]  # hash -> input hashes
    names: dict[str, list[str]]  # hash -> node names
    describe: dict[str, str]  # hash -> "Op(input names)"

    def to_json(self) -> dict[str, Any]:
        return {"inputs": {h: list(v) for h, v in self.inputs.items()}, "names": self.names,
                "describe": self.describe}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Canonical":
        names = {h: list(v) for h, v in data["names"].items()}
        return cls({n: h for h, ns in names.items() for n in ns}, {h: tuple(v) for h, v in data["inputs"].items()},
                   names, dict(data["describe"]))


def canonical(graph_def: Any, naming: Naming) -> Canonical:
    from tensorflow.python.framework import op_def_registry

    by_name = {n.name: n for n in graph_def.node}
    hashes: dict[str, str] = {}
    inputs: dict[str, tuple[str, ...]] = {}
    names: dict[str, list[str]] = {}
    describe: dict[str, str] = {}

    def through(node: Any) -> bool:
        """A node looked through: one LMS inserted, or an identity (the same bits, kept or bypassed by Grappler
        depending on fan-out and control edges: whether it is there is no difference in what is computed)."""
        return (naming.inserted(node.name) or node.op in _IDENTITIES
                or (node.op in _LAYOUT_MOVES and node.name.endswith(_LAYOUT_SUFFIX)))

    def source(name: str) -> tuple[str, str]:
        """(node, output index) a data input stands for, inserted ops and identities looked through."""
        op, _, index = name.partition(":")
        for _ in range(64):
            node = by_name.get(op)
            if node is None or not through(node):
                break
            data = [i for i in node.input if not i.startswith("^")]
            if not data:
                break
            k = int(index or 0) if node.op == "IdentityN" else 0
            if k >= len(data):
                break
            op, _, index = data[k].partition(":")
        return op, index or "0"

    def visit(root: str) -> str:
        stack = [(root, False)]
        open_: set[str] = set()  # on the stack, inputs not hashed yet
        while stack:
            name, ready = stack.pop()
            if name in hashes:
                continue
            node = by_name[name]
            # a loop's back edge (Merge <- NextIteration, once Grappler lowers a While) is not followed
            data = [] if node.op in _BACK_EDGE else [source(i) for i in node.input if not i.startswith("^")]
            if not ready:
                open_.add(name)
                stack.append((name, True))
                stack.extend((op, False) for op, _ in data if op in by_name and op not in hashes and op not in open_)
                continue
            open_.discard(name)
            ins = tuple(f"{hashes.get(op, 'loop')}:{k}" for op, k in data)
            if len(ins) == 2 and (node.op in _SYMMETRIC or node.op == "AddN"):
                ins = tuple(sorted(ins))  # a + b and b + a are the same bits (Grappler sorts by names, which vary)
            h = hashlib.sha1(node.op.encode())
            for k, v in sorted(node.attr.items()):
                if not k.startswith("_"):
                    h.update(k.encode())
                    h.update(v.SerializeToString(deterministic=True))
            for i in ins:
                h.update(i.encode())
            op_def = op_def_registry.get(node.op)
            if node.op in ("_Arg", "Placeholder", "ReadVariableOp", "VarHandleOp") or (op_def is not None and
                                                                                      op_def.is_stateful):
                h.update((naming.original(name) or name).encode())  # not merged by value
            digest = h.hexdigest()[:20]
            hashes[name] = digest
            inputs.setdefault(digest, tuple(i.rsplit(":", 1)[0] for i in ins))
            names.setdefault(digest, []).append(name)
            if digest not in describe:
                text = f"{node.op}({', '.join(f'{op}:{k}' for op, k in data)})"
                describe[digest] = text if len(text) < 300 else text[:297] + "..."
        return hashes[root]

    for n in graph_def.node:
        # a NoOp computes nothing, only orders (Grappler folds a BroadcastGradientArgs into one, or drops it);
        # a looked-through node is hashed as what it stands for, by its readers
        if n.op not in _NO_VALUE and not through(n) and not (n.op == "Const" and n.name.endswith(_LAYOUT_SUFFIX)):
            visit(n.name)
    return Canonical(hashes, inputs, names, describe)


def differences(plain: Canonical, lms: Canonical) -> list[Difference]:
    """The first nodes (in data order) whose values only one of the graphs computes.

    A node computed differently makes everything downstream differ too; only
    the frontier is reported: a node of one side whose inputs the other side
    computes as well.
    """
    only_plain = set(plain.names) - set(lms.names)
    only_lms = set(lms.names) - set(plain.names)
    out: list[Difference] = []
    for side, only, other in ((plain, only_plain, lms), (lms, only_lms, plain)):
        for h in sorted(only, key=lambda x: side.names[x][0]):
            if any(i in only for i in side.inputs[h]):
                continue  # downstream of another difference
            name = side.names[h][0]
            label = f"{name.split(RECOMPUTE_MARKER, 1)[0]} (clone)" if RECOMPUTE_MARKER in name else name
            text = side.describe[h]
            out.append(Difference(label, text if side is plain else "", text if side is lms else ""))
    return out


def optimized_differences(plain_def: Any, lms_def: Any, plan: SwapPlan) -> list[Difference]:
    """Differences between two optimized GraphDefs (e.g. `lms.tf.graphdefs.executed_graph_defs` of a step run
    without and with LMS), compared as `ensure_equivalent` compares them."""
    naming = Naming(plan)
    return differences(canonical(plain_def, naming), canonical(lms_def, naming))


