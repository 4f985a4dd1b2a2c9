"""The result of recompute planning: which saved forward tensors the backward pass rebuilds. No TensorFlow.

A recomputed tensor ``t`` is not kept or swapped for its backward readers: a
chain of *clones* of the cheap forward ops that made it runs again in the
backward pass, from *sources* that are there anyway (tensors the backward pass
keeps or swaps in, tiny per-channel tensors, the step's inputs). The first
clones wait for a *trigger* (a backward op that runs shortly before the
readers), so the chain runs late, not as soon as its sources exist::

    forward:   (conv) -> b -> (mul_1) -> (add_1) -> (relu) -> t -> (next conv)
    backward:     b -> [b-lms_gate_t_0_0] -> [mul_1-lms_recompute_t_0_0] -> [add_1-lms_...] -> [relu-lms_...] -> (ReluGrad)
         (trigger) ......^ control edge

Clones and gates are named after the op whose output they stand in for
(`recompute_op_name`, `gate_op_name`), so that Grappler, which sorts the inputs
of commutative ops by name, sees every reader's inputs in the order it sees
the originals' (as swap-ins, `lms.plan.swap_op_name`).

The clones are ops of the rewritten graph model (`RecomputePlan.rewrite`), with
backward role: the swap planner then plans swaps of their sources (``b`` above)
like those of any backward reader, and the simulator and the scheduler see and
time them like any other op. Built by `lms.plan.plan_recompute`;
applied to TensorFlow by `lms.tf.apply.apply_plan`.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from typing import Any

from ..graph import Graph, GraphError, Op, Role, Tensor
from ..optypes import never_recomputed
from .verdicts import PlanError, Skip

__all__ = ["Clone", "Gate", "Recompute", "RecomputePlan", "recompute_op_name", "gate_op_name", "is_recompute_op_name",
           "is_gate_op_name", "RECOMPUTE_MARKER", "GATE_MARKER", "GATE_TYPE"]

RECOMPUTE_MARKER = "-lms_recompute_"
GATE_MARKER = "lms_gate_"  # after "-" (a gate of output 0) or ">" (of output k > 0)
GATE_TYPE = "Identity"


def _op_part(op: str) -> str:
    return re.sub(r"[^A-Za-z0-9_./>-]", "_", op)


def _suffix(tensor: str, group: int) -> str:
    """``<recomputed tensor>_<group>`` with ``:``, ``/`` and ``>`` -> ``_``: no scope separator after the op's name."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', tensor.replace(':', '_'))}_{group}"


def recompute_op_name(tensor: str, group: int, op: str) -> str:
    """A clone's name: ``<forward op>-lms_recompute_<recomputed tensor>_<group>``.

    The clone stands in for ``<forward op>`` among its readers' inputs (the
    recomputed tensor's readers and the chain's next clones), and its name has
    to sort among a commutative reader's other inputs where the original's did:
    Grappler sorts them by name and later rewrites take operands by position
    (see `lms.plan.swap_op_name`). So it starts with the op's name and ``-``, the
    smallest character TF allows in a name: ``A-lms_recompute_...`` sorts right
    after ``A`` and before any other input with ``A`` as a prefix (``A/x``,
    ``A.x``, ``A_1``, ``A:1``). That is exact for output 0 (input key ``A``);
    for an output ``k > 0`` (key ``A:k``) a clone cannot do better, since one
    name serves all its outputs (``A-lms_recompute_...:k`` sorts before
    ``A/x``, ``A0`` where ``A:k`` sorted after): `lms.tf.apply` warns then.
    The rest never contains ``/``: Grappler names the nodes it rewrites
    ``<scope>/ArithmeticOptimizer/..._<name>``, ``<scope>`` being everything
    before the last ``/``, and a clone's rewritten node must get the scope of
    the original's. ``<recomputed tensor>`` (``:``, ``/`` -> ``_``) and
    ``<group>`` (its groups of readers) keep the clones of one op in several
    chains apart (`lms.plan.recompute_planner` bumps ``<group>`` in the rare case
    that a name is taken).
    """
    return f"{_op_part(op)}{RECOMPUTE_MARKER}{_suffix(tensor, group)}"


def gate_op_name(tensor: str, group: int, source: str) -> str:
    """The name of the gate of `source` (``P:k``) in the chain of `tensor`: sorts where ``P:k`` did.

    Output 0 (input key ``P``): ``P-lms_gate_<recomputed tensor>_<group>``,
    right after ``P`` as for a clone (`recompute_op_name`). Output ``k > 0``
    (key ``P:k``): ``P>lms_gate_<k>-<recomputed tensor>_<group>``: ``:`` cannot
    appear in an op name, and ``>`` is the smallest allowed character above
    it, so the gate sorts after ``P:k`` and the names that precede it (``P``,
    ``P-..``, ``P.x``, ``P/x``, ``P0..``, ``P:j`` for a smaller ``j``) and before
    ``P_1``, ``PA..`` that follow it; the ``-`` after ``<k>`` (below any digit)
    orders gates of ``P:1``, ``P:10``, ``P:2`` as their keys sort.
    """
    op, _, output = source.rpartition(":")
    if not op or not output.isdigit():
        op, output = source, "0"
    if output == "0":
        return f"{_op_part(op)}-{GATE_MARKER}{_suffix(tensor, group)}"
    return f"{_op_part(op)}>{GATE_MARKER}{output}-{_suffix(tensor, group)}"


def is_gate_op_name(name: str) -> bool:
    """True for a gate's name (`gate_op_name`)."""
    return f"-{GATE_MARKER}" in name or f">{GATE_MARKER}" in name


def is_recompute_op_name(name: str) -> bool:
    """True for the name of an inserted recompute op: a clone (`recompute_op_name`) or a gate (`gate_op_name`)."""
    return RECOMPUTE_MARKER in name or is_gate_op_name(name)


@dataclass(frozen=True)
class Gate:
    """An identity of a chain's source that waits for the trigger; the chain's first clones read it.

    The trigger's control edge sits on the gate, not on a clone: a clone with a
    control input is one Grappler's arithmetic optimizer rewrites differently
    from its original (seen: ``Pow(x, 3)`` of a tanh-GELU), so the clones must
    look exactly like the originals but for where their inputs come from.

    Attributes:
        name: the gate's op name.
        tensor: the source it passes through (no copy: a view).
        control_inputs: the trigger (none when a pinned schedule places the chain).
    """

    name: str
    tensor: str
    control_inputs: tuple[str, ...] = ()

    @property
    def output(self) -> str:
        return f"{self.name}:0"


@dataclass(frozen=True)
class Clone:
    """One forward op run again in the backward pass.

    Attributes:
        name: the clone's op name.
        op: the forward op it copies (same type, attributes and device).
        inputs: what it reads, one per input of `op`: the original input, its
            gate, or the output of an earlier clone of that input's producer.
        control_inputs: none in plans made here (the trigger waits on the gates).
    """

    name: str
    op: str
    inputs: tuple[str, ...]
    control_inputs: tuple[str, ...] = ()

    def output(self, tensor: str) -> str:
        """The clone's copy of `tensor` (an output of `op`)."""
        return f"{self.name}:{tensor.rsplit(':', 1)[1]}"


@dataclass(frozen=True)
class Recompute:
    """One recomputed tensor for one group of its backward readers.

    Attributes:
        tensor: the forward tensor rebuilt.
        consumers: backward ops rerouted to read the rebuilt copy.
        clones: the chain, in execution order; the last copies `tensor`'s producer.
        sources: tensors outside the chain that it reads (kept, swapped in or tiny).
        gates: identities of the sources the chain's first clones read, waiting for the trigger.
        trigger: the backward op the chain waits for.
        nbytes: `tensor`'s size at the graph's traced batch.
        distance: levels between the trigger and the first consumer.
        strategy: how the trigger was found (as `lms.plan.SwapIn.strategy`).
    """

    tensor: str
    consumers: tuple[str, ...]
    clones: tuple[Clone, ...]
    sources: tuple[str, ...]
    trigger: str | None
    nbytes: int
    distance: int | None = None
    strategy: str = ""
    gates: tuple[Gate, ...] = ()

    @property
    def output(self) -> str:
        """The tensor the consumers read instead of `tensor`."""
        return self.clones[-1].output(self.tensor)


@dataclass(frozen=True)
class RecomputePlan:
    """What the recompute planner decided for one graph and config (frozen; `validate` it)."""

    recomputes: tuple[Recompute, ...] = ()
    skipped: tuple[Skip, ...] = ()
    n_considered: int = 0

    @property
    def tensors(self) -> tuple[str, ...]:
        """Recomputed tensors (each once)."""
        return tuple(dict.fromkeys(r.tensor for r in self.recomputes))

    @property
    def n_recomputed(self) -> int:
        return len(self.tensors)

    @property
    def n_clones(self) -> int:
        return sum(len(r.clones) for r in self.recomputes)

    @property
    def n_gates(self) -> int:
        return sum(len(r.gates) for r in self.recomputes)

    @property
    def recomputed_bytes(self) -> int:
        """Bytes of the recomputed tensors at the traced batch (each tensor once)."""
        sizes = {r.tensor: r.nbytes for r in self.recomputes}
        return sum(sizes.values())

    def summary(self) -> dict[str, Any]:
        """JSON-ready description: counts, bytes, each recomputed tensor with its chain and trigger."""
        return {
            "n_recomputed": self.n_recomputed, "n_clones": self.n_clones,
            "recomputed_bytes": self.recomputed_bytes,
            "recomputed": [{"tensor": r.tensor, "bytes": r.nbytes, "consumers": list(r.consumers),
                            "clones": [c.name for c in r.clones], "ops": [c.op for c in r.clones],
                            "gates": [g.name for g in r.gates],
                            "sources": list(r.sources), "trigger": r.trigger, "distance": r.distance,
                            "strategy": r.strategy} for r in self.recomputes],
            "skipped": [{"tensor": k.tensor, "reason": k.reason} for k in self.skipped],
        }

    def validate(self, graph: Graph, *, lint: bool = True) -> Graph:
        """Check the plan against `graph`; return the rewritten graph model (clones in it).

        ``lint=False``: skip linting the rewritten graph (`lms.plan.SwapPlan.validate`
        lints the graph with the swaps too, which covers it).

        Checks: every recomputed tensor exists; its consumers read it, are backward
        ops and are rerouted once; every clone copies a known op that is neither
        random nor stateful, with one input per input of that op, each the
        original input or an earlier clone's copy of it; the last clone copies the
        tensor's producer; the trigger exists and does not depend on a consumer;
        names are unique; the rewritten graph lints (acyclic).

        Raises:
            PlanError: naming the recomputed tensor and the problem.
        """
        names: set[str] = set(graph.ops)
        rerouted: set[tuple[str, str]] = set()
        for r in self.recomputes:
            where = f"recompute of {r.tensor!r}"
            if r.tensor not in graph.tensors:
                raise PlanError(f"{where}: unknown tensor")
            if not r.clones:
                raise PlanError(f"{where}: no clones")
            if r.clones[-1].op != graph.producer(r.tensor).name:
                raise PlanError(f"{where}: the last clone copies {r.clones[-1].op!r}, not the tensor's producer")
            if not r.consumers:
                raise PlanError(f"{where}: serves no consumer")
            readers = set(graph.consumers(r.tensor))
            for c in r.consumers:
                if c not in readers:
                    raise PlanError(f"{where}: {c!r} does not read it")
                if graph.ops[c].role is not Role.BACKWARD:
                    raise PlanError(f"{where}: consumer {c!r} is not a backward op")
                if (c, r.tensor) in rerouted:
                    raise PlanError(f"{where}: {c!r} is rerouted twice")
                rerouted.add((c, r.tensor))
            made: dict[str, str] = {}  # original tensor -> clone copy, within this chain
            gated: dict[str, str] = {}  # source -> its gate's output
            for gate in r.gates:
                if gate.name in names:
                    raise PlanError(f"{where}: op name {gate.name!r} already in use")
                names.add(gate.name)
                if gate.tensor not in graph.tensors:
                    raise PlanError(f"{where}: gate {gate.name} passes unknown tensor {gate.tensor!r}")
                for c in gate.control_inputs:
                    if c not in graph.ops:
                        raise PlanError(f"{where}: {gate.name} waits for unknown op {c!r}")
                gated[gate.tensor] = gate.output
            for clone in r.clones:
                if clone.name in names:
                    raise PlanError(f"{where}: op name {clone.name!r} already in use")
                names.add(clone.name)
                op = graph.ops.get(clone.op)
                if op is None:
                    raise PlanError(f"{where}: {clone.name} copies unknown op {clone.op!r}")
                if never_recomputed(op.type):
                    raise PlanError(f"{where}: {clone.name} copies {op.type} op {op.name!r}, which is random "
                                    "or stateful")
                if len(clone.inputs) != len(op.inputs):
                    raise PlanError(f"{where}: {clone.name} has {len(clone.inputs)} inputs, {op.name!r} has "
                                    f"{len(op.inputs)}")
                for original, got in zip(op.inputs, clone.inputs):
                    if got != original and made.get(original) != got and gated.get(original) != got:
                        raise PlanError(f"{where}: {clone.name} reads {got!r} for {original!r}")
                for c in clone.control_inputs:
                    if c not in graph.ops:
                        raise PlanError(f"{where}: {clone.name} waits for unknown op {c!r}")
                for t in op.outputs:
                    made[t] = clone.output(t)
            if r.trigger is not None:
                if r.trigger not in graph.ops:
                    raise PlanError(f"{where}: unknown trigger op {r.trigger!r}")
                for c in r.consumers:
                    if r.trigger == c or graph.is_ancestor(c, r.trigger):
                        raise PlanError(f"{where}: trigger {r.trigger!r} runs after consumer {c!r} (cycle)")
        rewritten = self.rewrite(graph)
        if not lint:
            return rewritten
        try:
            rewritten.lint()
        except GraphError as exc:
            raise PlanError(f"graph rewritten by the recompute plan is invalid: {exc}") from None
        return rewritten

    def rewrite(self, graph: Graph) -> Graph:
        """Apply the plan to the graph model (the framework-free twin of `lms.tf.apply`'s cloning).

        ``t -> (c)`` becomes ``sources -> [clones ...] -> t' -> (c)``; the clones
        are backward ops (``grad_of``: that of the first consumer) placed just
        before the first consumer in creation order, and their outputs have the
        sizes of the originals.
        """
        if not self.recomputes:
            return graph
        cached = _REWRITTEN.get(graph)
        if cached is not None and cached[0] is self:
            return cached[1]  # the planner's: its indexes (levels, ancestry) are already computed
        reroute: dict[str, dict[str, str]] = {}
        before: dict[str, list[Op]] = {}
        tensors: list[Tensor] = []
        levels = graph.levels
        for r in self.recomputes:
            first = min(r.consumers, key=levels.__getitem__)
            grad_of = graph.ops[first].grad_of
            for gate in r.gates:
                spec = graph.tensors[gate.tensor]
                before.setdefault(first, []).append(
                    Op(name=gate.name, type=GATE_TYPE, role=Role.BACKWARD, inputs=(gate.tensor,),
                       control_inputs=gate.control_inputs, outputs=(gate.output,), grad_of=grad_of,
                       device=graph.producer(gate.tensor).device))
                tensors.append(Tensor(gate.output, dtype=spec.dtype, shape=spec.shape, fixed_bytes=spec.fixed_bytes,
                                      per_sample_bytes=spec.per_sample_bytes))
            for clone in r.clones:
                op = graph.ops[clone.op]
                outputs = tuple(clone.output(t) for t in op.outputs)
                before.setdefault(first, []).append(
                    Op(name=clone.name, type=op.type, role=Role.BACKWARD, inputs=clone.inputs,
                       control_inputs=clone.control_inputs, outputs=outputs, grad_of=grad_of, device=op.device))
                for t, copy in zip(op.outputs, outputs):
                    spec = graph.tensors[t]
                    tensors.append(Tensor(copy, dtype=spec.dtype, shape=spec.shape, fixed_bytes=spec.fixed_bytes,
                                          per_sample_bytes=spec.per_sample_bytes))
            for c in r.consumers:
                reroute.setdefault(c, {})[r.tensor] = r.output
        ops: list[Op] = []
        for op in graph.ops.values():
            ops.extend(before.get(op.name, ()))
            mapping = reroute.get(op.name)
            if mapping:
                op = Op(name=op.name, type=op.type, role=op.role, inputs=tuple(mapping.get(t, t) for t in op.inputs),
                        control_inputs=op.control_inputs, outputs=op.outputs, grad_of=op.grad_of, device=op.device,
                        live=op.live)
            ops.append(op)
        rewritten = Graph(ops, [*graph.tensors.values(), *tensors], batch_size=graph.batch_size, name=graph.name)
        _REWRITTEN[graph] = (self, rewritten)
        return rewritten


# graph -> (the plan last rewritten for it, the result): planning, validating and simulating one
# plan rewrite the graph once (a rewrite of ResNet-50 and its indexes take ~0.2 s)
_REWRITTEN: "weakref.WeakKeyDictionary[Graph, tuple[RecomputePlan, Graph]]" = weakref.WeakKeyDictionary()
