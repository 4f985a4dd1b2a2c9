"""The result of planning: which tensors to swap, who reads the swapped copy, and
which op triggers each swap-in. Frozen data; no TensorFlow.

A plan is applied to a TensorFlow graph by `lms.tf.apply`, and to the graph
model by `rewrite_graph` (used by `SwapPlan.validate` and by the simulator)::

    (fwd_op) -> t -> [lms/swap_out/t] -> [fwd_op-lms_swap_in_0] -> (bwd_op)
                                                  ^
                                  (trigger) ------+  control edge

Here a swap-in stands for the copy back to the device, which starts after its
trigger; in TensorFlow both swap ops sit on the host and TF's transfer follows
the swap-in (`lms.tf.apply` says why).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import LMSConfig
from ..graph import Graph, GraphError, Op, Role, Tensor
from .verdicts import PlanError, Skip

if TYPE_CHECKING:
    from .recompute import RecomputePlan

# Skip and PlanError live in lms.plan.verdicts (recompute.py needs them too, and this module needs
# RecomputePlan); they stay importable from here.
__all__ = ["SwapIn", "Swap", "Skip", "SwapPlan", "PlanError", "rewrite_graph",
           "SWAP_OUT_TYPE", "SWAP_IN_TYPE", "HOST_DEVICE", "swap_op_name"]

SWAP_OUT_TYPE = "LMSSwapOut"
SWAP_IN_TYPE = "LMSSwapIn"
HOST_DEVICE = "host"


def swap_op_name(kind: str, tensor: str, index: int | None = None) -> str:
    """Predictable op names: ``lms/swap_out/<tensor>`` and ``<producer>-lms_swap_in_<output>_<i>``.

    A swap-out is named ``lms/swap_out/<tensor>``, ``<tensor>`` being the tensor
    name with ``:`` -> ``_`` and characters TF does not allow in op names replaced
    by ``_``.

    A swap-in is the op its consumers read, and its name has to sort among the
    consumer's other inputs where the swapped tensor's name did: Grappler sorts the
    inputs of commutative ops (``Mul``, ``AddV2``, ``AddN``, ...) by name before
    it optimizes (``CanonicalizeNode``), and later rewrites take operands by
    position (constant push-down ``C * (X * Y) -> X * (C * Y)`` picks X as the
    first input; the broadcast minimizer pairs leaves in that order). A swap-in
    named ``lms/...`` moved to another position and changed the arithmetic
    (``a*b*c`` summed in another order: last-bit differences). So the name starts
    with the producer's op name followed by ``-``, the smallest character TF
    allows in a name: it sorts right after the producer and before any other
    input that has the producer's name as a prefix (``<op>:1``, ``<op>/x``,
    ``<op>_1``). `lms.tf.apply` checks the order of every commutative consumer.
    """
    if kind == "swap_in":
        op, _, output = tensor.rpartition(":")
        if not op or not output.isdigit():
            op, output = tensor, "0"
        base = re.sub(r"[^A-Za-z0-9_./>-]", "_", op)
        name = f"{base}-lms_swap_in_{output}"
        return name if index is None else f"{name}_{index}"
    base = re.sub(r"[^A-Za-z0-9_./-]", "_", tensor.replace(":", "_"))
    name = f"lms/{kind}/{base}"
    return name if index is None else f"{name}_{index}"


@dataclass(frozen=True)
class SwapIn:
    """One swap-in of a swapped tensor.

    Attributes:
        name: op name of the swap-in.
        consumers: ops rerouted to read the swapped-in copy.
        trigger: op whose completion starts the swap-in (a control input), or
            ``None`` for none (the swap-in may then run as soon as the
            swap-out is done).
        distance: levels between the trigger and the first consumer.
        strategy: how the trigger was found (``"chain_rule"``,
            ``"direct_order"``, or ``"direct_order (fallback)"`` when
            ``chain_rule`` found no valid op in ``[lb, ub]``).
    """

    name: str
    consumers: tuple[str, ...]
    trigger: str | None
    distance: int | None = None
    strategy: str = ""


@dataclass(frozen=True)
class Swap:
    """One swapped tensor.

    Attributes:
        tensor: tensor name.
        swap_out: op name of the swap-out.
        swap_ins: the swap-ins serving its rerouted consumers.
        nbytes: size at the graph's traced batch size.
        kind: ``"backward"`` (consumed by backward ops) or ``"branch"``
            (a forward tensor with far-apart forward consumers).
    """

    tensor: str
    swap_out: str
    swap_ins: tuple[SwapIn, ...]
    nbytes: int
    kind: str = "backward"

    @property
    def consumers(self) -> tuple[str, ...]:
        return tuple(c for s in self.swap_ins for c in s.consumers)


@dataclass(frozen=True)
class SwapPlan:
    """What the planner decided for one graph and config.

    With recomputation (``config.recompute``), `recompute` says which tensors
    the backward pass rebuilds; the swaps then refer to the graph *with* its
    clones (``recompute.rewrite(graph)``): a clone may read a swap-in.
    """

    config: LMSConfig
    swaps: tuple[Swap, ...] = ()
    skipped: tuple[Skip, ...] = ()
    n_candidates: int = 0
    graph_name: str = ""
    batch_size: int = 1
    recompute: "RecomputePlan | None" = None

    @property
    def rewrites(self) -> bool:
        """True when applying the plan changes the graph (swaps or clones)."""
        return bool(self.swaps) or bool(self.recompute is not None and self.recompute.recomputes)

    @property
    def n_recomputed(self) -> int:
        return self.recompute.n_recomputed if self.recompute is not None else 0

    @property
    def recomputed_bytes(self) -> int:
        """Bytes of the recomputed tensors at the traced batch (no longer kept or swapped)."""
        return self.recompute.recomputed_bytes if self.recompute is not None else 0

    @property
    def n_swapped(self) -> int:
        return len(self.swaps)

    @property
    def n_swap_ins(self) -> int:
        return sum(len(s.swap_ins) for s in self.swaps)

    @property
    def swapped_bytes(self) -> int:
        """Bytes swapped out per step at the graph's traced batch size."""
        return sum(s.nbytes for s in self.swaps)

    def summary(self) -> dict[str, Any]:
        """JSON-ready description: counts, bytes, each swap with consumers and trigger."""
        return {
            "n_candidates": self.n_candidates,
            "n_swapped": self.n_swapped,
            "n_swap_ins": self.n_swap_ins,
            "swapped_bytes": self.swapped_bytes,
            "batch_size": self.batch_size,
            "config": self.config.to_dict(),
            "swapped": [
                {"tensor": s.tensor, "bytes": s.nbytes, "kind": s.kind, "swap_out": s.swap_out,
                 "swap_ins": [{"name": i.name, "consumers": list(i.consumers),
                               "trigger": i.trigger, "distance": i.distance,
                               "strategy": i.strategy} for i in s.swap_ins]}
                for s in self.swaps
            ],
            "skipped": [{"tensor": k.tensor, "reason": k.reason} for k in self.skipped],
            "recompute": self.recompute.summary() if self.recompute is not None else None,
        }

    def validate(self, graph: Graph) -> Graph:
        """Check the plan against `graph`; return the rewritten graph model.

        Checks: the recompute plan (`RecomputePlan.validate`), then, against
        the graph with its clones: every swapped tensor exists; every rerouted
        consumer really reads it and is rerouted once; every trigger exists, is
        not the consumer and does not depend on any consumer of its swap-in
        (else: a cycle); names are unique; and the rewritten graph lints (acyclic).

        Raises:
            PlanError: naming the swap and the problem.
        """
        if self.recompute is not None:
            graph = self.recompute.validate(graph, lint=False)  # linted below, with the swaps
        names: set[str] = set(graph.ops)
        for s in self.swaps:
            if s.tensor not in graph.tensors:
                raise PlanError(f"swap of unknown tensor {s.tensor!r}")
            readers = set(graph.consumers(s.tensor))
            seen: set[str] = set()
            for name in (s.swap_out, *(i.name for i in s.swap_ins)):
                if name in names:
                    raise PlanError(f"swap of {s.tensor!r}: op name {name!r} already in use")
                names.add(name)
            if not s.swap_ins:
                raise PlanError(f"swap of {s.tensor!r} has no swap-in")
            for si in s.swap_ins:
                if not si.consumers:
                    raise PlanError(f"{si.name}: serves no consumer")
                for c in si.consumers:
                    if c not in readers:
                        raise PlanError(f"{si.name}: {c!r} does not read {s.tensor!r}")
                    if c in seen:
                        raise PlanError(f"{si.name}: {c!r} is rerouted twice for {s.tensor!r}")
                    seen.add(c)
                if si.trigger is not None:
                    if si.trigger not in graph.ops:
                        raise PlanError(f"{si.name}: unknown trigger op {si.trigger!r}")
                    for c in si.consumers:
                        if si.trigger == c or graph.is_ancestor(c, si.trigger):
                            raise PlanError(
                                f"{si.name}: trigger {si.trigger!r} runs after consumer {c!r} (cycle)")
        rewritten = _rewrite_swaps(graph, self)
        try:
            rewritten.lint()
        except GraphError as exc:
            raise PlanError(f"rewritten graph is invalid: {exc}") from None
        return rewritten


def rewrite_graph(graph: Graph, plan: SwapPlan) -> Graph:
    """Apply `plan` to the graph model (the framework-free twin of `lms.tf.apply`).

    ``(f) -> t -> (c)`` becomes ``(f) -> t -> [swap_out] -> [swap_in] -> (c)`` with
    ``(trigger) ..> [swap_in]`` as a control edge. Swap-out outputs live on the
    host (`HOST_DEVICE`); swap-ins produce a device copy of the same size.
    Recompute clones (`plan.recompute`) are added first; the swaps refer to them.
    """
    if plan.recompute is not None:
        graph = plan.recompute.rewrite(graph)
    return _rewrite_swaps(graph, plan)


def _rewrite_swaps(graph: Graph, plan: SwapPlan) -> Graph:
    """The swaps of `plan` on `graph` (which already has the plan's clones)."""
    reroute: dict[str, dict[str, str]] = {}  # consumer -> {old tensor: new tensor}
    new_tensors: list[Tensor] = []
    insert_after: dict[str, list[Op]] = {}
    swap_ins_before: dict[str, list[Op]] = {}  # first consumer -> swap-ins placed before it
    for s in plan.swaps:
        t = graph.tensors[s.tensor]
        out_t = f"{s.swap_out}:0"
        producer = graph.producer(s.tensor)
        out_op = Op(name=s.swap_out, type=SWAP_OUT_TYPE, role=producer.role, inputs=(s.tensor,),
                    outputs=(out_t,), device=HOST_DEVICE)
        insert_after.setdefault(producer.name, []).append(out_op)
        new_tensors.append(Tensor(out_t, dtype=t.dtype, shape=t.shape, fixed_bytes=t.fixed_bytes,
                                  per_sample_bytes=t.per_sample_bytes))
        for si in s.swap_ins:
            in_t = f"{si.name}:0"
            role = graph.ops[si.consumers[0]].role
            first = min(si.consumers, key=graph.levels.__getitem__)
            swap_ins_before.setdefault(first, []).append(
                Op(name=si.name, type=SWAP_IN_TYPE, role=role, inputs=(out_t,),
                   control_inputs=(si.trigger,) if si.trigger else (), outputs=(in_t,)))
            new_tensors.append(Tensor(in_t, dtype=t.dtype, shape=t.shape, fixed_bytes=t.fixed_bytes,
                                      per_sample_bytes=t.per_sample_bytes))
            for c in si.consumers:
                reroute.setdefault(c, {})[s.tensor] = in_t
    ops: list[Op] = []
    for op in graph.ops.values():
        ops.extend(swap_ins_before.get(op.name, ()))
        if op.name in reroute:
            mapping = reroute[op.name]
            op = Op(name=op.name, type=op.type, role=op.role,
                    inputs=tuple(mapping.get(t, t) for t in op.inputs),
                    control_inputs=op.control_inputs, outputs=op.outputs,
                    grad_of=op.grad_of, device=op.device, live=op.live)
        ops.append(op)
        ops.extend(insert_after.get(op.name, ()))
    return Graph(ops, [*graph.tensors.values(), *new_tensors],
                 batch_size=graph.batch_size, name=graph.name)

