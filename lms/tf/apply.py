"""Apply a finished `SwapPlan` to a TensorFlow graph: clone recomputed chains, insert swap ops, reroute, add triggers.

This is the only place that edits a TensorFlow graph. What to swap and when was
decided elsewhere (`lms.plan.plan_swaps` over the framework-free graph
model); this module does exactly what the plan says::

    (fwd_op@dev) -> t -> [lms/swap_out/t @host] -> [fwd_op-lms_swap_in_0_i @host] ==copy==> (bwd_op@dev)
                                                         ^
                                   (trigger@dev) ........+  control edge

With real swap ops (``swap_ops="device"``) both swap ops sit on the host, as in
TFLMS. TensorFlow partitions a step per device and turns every edge between
devices into a ``_Send``/``_Recv`` pair; the receiving ``_Recv`` gets none of its
destination's control inputs (``graph_partition.cc``), so a trigger on a
device-side swap-in would not delay the copy: the ``_Recv`` would take the tensor
as soon as the swap-out sent it, in the forward pass. Gating the host-side op
that feeds the ``_Send`` makes the host->device copy start after the trigger (and,
on a GPU, the copy stream waits for the compute stream too). Each swap-in is its
own host op, so each gets its own copy. `host_gated_swap_ins` checks it on the
partition graphs TF really ran.

Swap-ins are named after the producer (`lms.plan.swap_op_name`) so that
Grappler, which sorts the inputs of commutative ops by name, sees each
consumer's inputs in the order it sees them without LMS; `apply_plan` checks it.

With ``plan.recompute``, recomputed chains are cloned into the backward pass
first (`_insert_clones`), so the swaps can serve the clones::

    (b) -> [b-lms_gate_t_0_0] -> [<op>-lms_recompute_t_0_0] ... -> t' -> (bwd_op)

Clones and gates are named after the op they stand in for
(`lms.plan.recompute.recompute_op_name`, `lms.plan.recompute.gate_op_name`) for the same
reason. After inserting everything `apply_plan` checks every commutative op
that reads an inserted op (a swap-in, a clone or a gate; clones read clones)
and warns when Grappler's sort would put an input in another position.

Edit the graph while it is being built (inside the traced Python function,
before TensorFlow turns it into a function): `lms.function` and `lms.LMSModel`
do that. Edits to a graph whose function was already created have no effect.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.eager import record

from ..plan.anchor import anchor_triggers  # noqa: F401  (re-exported)
from ..rules import REWRITABLE_TYPES  # noqa: F401  (re-exported)
from ..plan import Swap, SwapIn, SwapPlan
from ..plan.recompute import GATE_TYPE, RecomputePlan
from .emulate import emulated_swap_in, emulated_swap_out

__all__ = ["apply_plan", "observe_swapped_size", "anchor_triggers", "AppliedPlan", "SWAP_OPS", "HOST_DEVICE",
           "REWRITABLE_TYPES", "DO_NOT_REMOVE_ATTR", "default_compute_device"]

log = logging.getLogger(__name__)

SWAP_OPS = ("device", "emulated")
HOST_DEVICE = "/device:CPU:0"
DO_NOT_REMOVE_ATTR = "_grappler_do_not_remove"


@dataclass(frozen=True)
class AppliedPlan:
    """What `apply_plan` inserted.

    Attributes:
        swap_outs: names of the inserted swap-out ops (plan order).
        swap_ins: names of the inserted swap-in ops (the ops consumers read).
        inserted_ops: every inserted op (emulated: a swap-out is a copy and a shape op; a
            swap-in is a Snapshot copy, plus a transfer and a shape op with a bandwidth).
        rerouted_inputs: consumer inputs now reading a swap-in.
        triggers: control edges added (trigger op -> swap-in op).
        swap_ops: ``"device"`` or ``"emulated"``.
        clones: the inserted recompute ops (gates and clones, `lms.plan.recompute.is_recompute_op_name`), in plan order.
    """

    swap_outs: tuple[str, ...]
    swap_ins: tuple[str, ...]
    inserted_ops: tuple[str, ...]
    rerouted_inputs: int
    triggers: int
    swap_ops: str
    clones: tuple[str, ...] = ()


def default_compute_device() -> str:
    """``/device:GPU:0`` when a GPU is visible, else ``/device:CPU:0``."""
    return "/device:GPU:0" if tf.config.list_logical_devices("GPU") else "/device:CPU:0"


def apply_plan(graph: tf.Graph, plan: SwapPlan, *, swap_ops: str = "emulated",
               bandwidth: float | None = None, device: str | None = None) -> AppliedPlan:
    """Insert the swap ops of `plan` into `graph` (edited in place).

    Before / after, for a swapped tensor ``t`` read by backward ops ``b1``, ``b2``::

        (f) -> t -> (b1)          (f) -> t -> [swap_out] -+-> [swap_in_0] -> (b1)
               \\-> (b2)                                   \\-> [swap_in_1] -> (b2)
                                   (trigger_0) ..> [swap_in_0],  (trigger_1) ..> [swap_in_1]

    Forward readers of ``t`` that the plan does not name keep reading ``t``.

    Args:
        graph: the graph being traced (a ``FuncGraph``), with the ops the plan names.
        plan: the plan (`SwapPlan.validate` it against the graph model first).
        swap_ops: ``"device"``: a swap-out and a swap-in ``tf.identity`` on the host
            (``/device:CPU:0``), the swap-in gated by its trigger; TF copies the tensor
            to the host after the swap-out and back to the consumers' device after
            the swap-in (a no-op on a CPU). ``"emulated"``: `lms.tf.emulate` ops that
            move the bytes out of TF's allocator and back on any machine, the swap-ins
            on their consumers' device.
        bandwidth: bytes/s for emulated transfers (each sleeps nbytes/bandwidth).
        device: device for emulated swap-ins whose consumer has no device set;
            default: `default_compute_device`.

    Returns:
        `AppliedPlan` listing what was inserted.

    Raises:
        ValueError: bad `swap_ops`, or the plan does not match the graph (unknown
            tensor/op, name already taken, a consumer that does not read the tensor).
    """
    if swap_ops not in SWAP_OPS:
        raise ValueError(f"swap_ops={swap_ops!r}: allowed values are " + ", ".join(map(repr, SWAP_OPS)))
    if swap_ops == "device" and bandwidth is not None:
        raise ValueError("bandwidth applies to emulated swap ops only (swap_ops='emulated')")
    if not isinstance(graph, tf.Graph):
        raise ValueError(f"apply_plan needs the tf.Graph being traced, got {type(graph).__name__}")
    default_device = device or default_compute_device()
    swap_outs: list[str] = []
    swap_ins: list[str] = []
    inserted: list[str] = []
    rerouted = triggers = 0
    clones: list[str] = []
    stands_for: dict[str, str] = {}  # inserted tensor -> the tensor it stands in for
    with graph.as_default(), record.stop_recording():
        if plan.recompute is not None:  # first: the swaps may serve clones
            clones, n_rerouted, n_triggers = _insert_clones(graph, plan.recompute, stands_for)
            inserted.extend(clones)
            rerouted += n_rerouted
            triggers += n_triggers
        for swap in plan.swaps:
            t = _tensor(graph, swap.tensor)
            host, new_ops = _insert_swap_out(graph, t, swap, swap_ops=swap_ops, bandwidth=bandwidth)
            swap_outs.append(swap.swap_out)
            inserted.extend(new_ops)
            for si in swap.swap_ins:
                consumers = [_op(graph, c, what=f"consumer of {swap.tensor}") for c in si.consumers]
                # real copies: the swap-in (the op that takes the trigger) on the host, so that the
                # host->device copy waits for it (module docstring); emulated: beside its consumers
                dev = HOST_DEVICE if swap_ops == "device" else (
                    next((c.device for c in consumers if c.device), "") or default_device)
                new_t, new_ops = _insert_swap_in(graph, host, t, si, device=dev, swap_ops=swap_ops,
                                                 bandwidth=bandwidth)
                swap_ins.append(si.name)
                inserted.extend(new_ops)
                stands_for[new_t.name] = t.name
                for c in consumers:
                    rerouted += _reroute(c, t, new_t)
                if si.trigger is not None:
                    graph.get_operation_by_name(new_ops[0])._add_control_input(  # noqa: SLF001
                        _op(graph, si.trigger, what=f"trigger of {si.name}"))
                    triggers += 1
        _check_input_order(graph, stands_for)
    applied = AppliedPlan(tuple(swap_outs), tuple(swap_ins), tuple(inserted), rerouted, triggers, swap_ops,
                          tuple(clones))
    log.debug("applied %d swap-outs, %d swap-ins (%s), %d inputs rerouted", len(swap_outs),
              len(swap_ins), swap_ops, rerouted)
    return applied


def _insert_clones(graph: tf.Graph, recompute: RecomputePlan,
                   stands_for: dict[str, str]) -> tuple[list[str], int, int]:
    """Clone each chain of `recompute` into the backward pass and reroute its readers.

    For a tensor ``t`` rebuilt by the chain ``(m) -> (a) -> (r)`` from the source ``b``::

        (m) -> (a) -> (r) -> t -> (bwd)        (m) -> (a) -> (r) -> t
        b --^                                  b -> [gate] -> [clone m] -> [clone a] -> [clone r] -> t' -> (bwd)
                                                     ^
                                     (trigger) ......+  control edge

    A gate is an ``Identity`` marked ``_grappler_do_not_remove``; it is where the
    trigger's control edge goes. A clone is the original's op type with its
    attributes and device, created with no control inputs, outside any name scope,
    reading gates or other clones where the original read the sources. It is *not* marked
    ``_grappler_do_not_remove``: Grappler must rewrite a chain of clones exactly as
    it rewrites the original chain (its arithmetic optimizer turns
    ``(mul_1 + sub) + shortcut`` into one ``AddN``; a protected clone chain would
    add in another order and differ in the last bit). Common-subexpression
    elimination cannot merge a clone back into its original: the chain's first
    clones read gates, the others read clones. `lms.tf.graphdefs.clone_op_names` of `lms.tf.graphdefs.optimized_graph_def`
    shows which survived. A clone with a control input is rewritten differently
    too (a tanh-GELU's ``Pow(x, 3)``): hence the gates.

    Records in `stands_for` which tensor each gate's and clone's output stands in for.

    Returns:
        (clone names, inputs rerouted, trigger edges added).
    """
    names: list[str] = []
    rerouted = triggers = 0
    for r in recompute.recomputes:
        made: dict[str, tf.Tensor] = {}
        for gate in r.gates:
            _check_free_name(graph, gate.name)
            source = _tensor(graph, gate.tensor)
            with graph.name_scope(None), graph.control_dependencies(None), graph.colocate_with(
                    None, ignore_existing=True), graph.device(source.op.device):
                op = graph._create_op_internal(GATE_TYPE, [source], [source.dtype], name=gate.name,  # noqa: SLF001
                                               attrs={"T": attr_value_pb2.AttrValue(type=source.dtype.as_datatype_enum)})
            if op.name != gate.name:
                raise ValueError(f"gate op was named {op.name!r}, expected {gate.name!r}")
            _protect(op)  # Grappler's dependency optimizer would bypass an identity
            for c in gate.control_inputs:
                op._add_control_input(_op(graph, c, what=f"trigger of {gate.name}"))  # noqa: SLF001
                triggers += 1
            made[gate.output] = op.outputs[0]
            stands_for[op.outputs[0].name] = source.name
            names.append(op.name)
        for clone in r.clones:
            original = _op(graph, clone.op, what=f"forward op recomputed for {r.tensor}")
            _check_free_name(graph, clone.name)
            inputs = [made[name] if name in made else _tensor(graph, name) for name in clone.inputs]
            attrs = {k: v for k, v in original.node_def.attr.items() if not k.startswith("_")}
            with graph.name_scope(None), graph.control_dependencies(None), graph.colocate_with(
                    None, ignore_existing=True), graph.device(original.device):
                op = graph._create_op_internal(  # noqa: SLF001
                    original.type, inputs, [t.dtype for t in original.outputs], name=clone.name, attrs=attrs,
                    op_def=original.op_def)
            if op.name != clone.name:
                raise ValueError(f"clone op was named {op.name!r}, expected {clone.name!r}")
            for c in clone.control_inputs:
                op._add_control_input(_op(graph, c, what=f"trigger of {clone.name}"))  # noqa: SLF001
                triggers += 1
            for i, t in enumerate(original.outputs):
                made[clone.output(t.name)] = op.outputs[i]
                stands_for[op.outputs[i].name] = t.name
            names.append(op.name)
        new_t = made[r.output]
        old_t = _tensor(graph, r.tensor)
        for c in r.consumers:
            rerouted += _reroute(_op(graph, c, what=f"reader of recomputed {r.tensor}"), old_t, new_t)
    return names, rerouted, triggers


def _insert_swap_out(graph: tf.Graph, t: tf.Tensor, swap: Swap, *, swap_ops: str,
                     bandwidth: float | None) -> tuple[tf.Tensor, list[str]]:
    """``(f) -> t``  becomes  ``(f) -> t -> [lms/swap_out/t @host]`` (no reader rerouted yet).

    Created with no control inputs and no name scope, on the host device.
    Emulated: ``t -> [lms/swap_out/t] -> [lms/swap_out/t/shaped]`` (see `lms.tf.emulate`).
    """
    _check_free_name(graph, swap.swap_out)
    with graph.name_scope(None), graph.control_dependencies(None), graph.colocate_with(
            None, ignore_existing=True), graph.device(HOST_DEVICE):
        if swap_ops == "emulated":
            host = emulated_swap_out(t, name=swap.swap_out, bandwidth=bandwidth)
        else:
            host = tf.identity(t, name=swap.swap_out)
    ops = _ops_between(host.op, stop={t.name})
    for op in ops:
        _protect(op)
    if swap.swap_out not in {op.name for op in ops}:
        raise ValueError(f"swap-out op {swap.swap_out!r} was not created under its name (name taken?)")
    return host, [op.name for op in ops]


def _insert_swap_in(graph: tf.Graph, host: tf.Tensor, like: tf.Tensor, si: SwapIn, *, device: str,
                    swap_ops: str, bandwidth: float | None) -> tuple[tf.Tensor, list[str]]:
    """``[swap_out] -> h``  becomes  ``[swap_out] -> h -> [<producer>-lms_swap_in_<k>_<i> @device]``.

    `device` is the host for real swap ops (`apply_plan` says why).

    Returns the new tensor and the inserted op names, the op that takes the
    trigger (the first to run) first. Emulated: ``h -> [<name>: Snapshot]``, with a
    bandwidth ``h -> [<name>/transfer] -> [<name>/shaped] -> [<name>]`` (see `lms.tf.emulate`).
    """
    _check_free_name(graph, si.name)
    with graph.name_scope(None), graph.control_dependencies(None), graph.colocate_with(
            None, ignore_existing=True), graph.device(device):
        if swap_ops == "emulated":
            new_t = emulated_swap_in(host, like=like, name=si.name, bandwidth=bandwidth)
            ops = _ops_between(new_t.op, stop={host.name, like.name})
        else:
            new_t = tf.identity(host, name=si.name)
            ops = [new_t.op]
    for op in ops:
        _protect(op)
    if new_t.op.name != si.name:
        raise ValueError(f"swap-in op was named {new_t.op.name!r}, expected {si.name!r}")
    acd = getattr(graph, "experimental_acd_manager", None)
    for op in ops:
        if acd is not None and op.op_def.is_stateful:
            # A stateful swap op (none today): without this, automatic control dependencies would
            # chain every swap-in after the previously created stateful op (cycles).
            acd.run_independently(op)
    return new_t, [op.name for op in ops]


def _ops_between(last: tf.Operation, *, stop: set[str]) -> list[tf.Operation]:
    """Ops from `last` back to the tensors named in `stop`, in creation (= execution) order."""
    found: dict[str, tf.Operation] = {}
    stack = [last]
    while stack:
        op = stack.pop()
        if op.name in found:
            continue
        found[op.name] = op
        stack.extend(t.op for t in op.inputs if t.name not in stop)
    return sorted(found.values(), key=lambda op: op._id)  # noqa: SLF001


def _reroute(consumer: tf.Operation, old: tf.Tensor, new: tf.Tensor) -> int:
    """``t -> (c)``  becomes  ``new -> (c)`` for every input of `consumer` that reads `old`."""
    indices = [i for i, inp in enumerate(list(consumer.inputs)) if inp.name == old.name]
    if not indices:
        raise ValueError(f"op {consumer.name!r} does not read {old.name!r}; the plan does not match the graph")
    for i in indices:
        consumer._update_input(i, new)  # noqa: SLF001
    return len(indices)


def _input_key(name: str) -> str:
    """A tensor name as a GraphDef input: ``op`` for output 0, else ``op:k``."""
    return name[:-2] if name.endswith(":0") else name


def _sorted_inputs(names: list[str]) -> list[str]:
    """Tensor names in the order Grappler's ``CanonicalizeNode`` puts them as a commutative op's inputs.

    It sorts the inputs' names (``op`` or ``op:k``) before optimizing; which
    input ends up first decides how its rewrites reassociate ``a * b * c``.
    """
    return sorted(names, key=_input_key)


def _check_input_order(graph: tf.Graph, stands_for: dict[str, str]) -> None:
    """Warn for each commutative op that reads an inserted op in another sorted position than the original.

    For every commutative op reading a swap-in, a clone or a gate (clones
    included), the inputs sorted by their names must be, input for input, the
    tensors they stand in for sorted by theirs (what Grappler sees without LMS).
    """
    def original(name: str) -> str:
        while name in stands_for:  # a swap-in may serve a gate: follow to the forward tensor
            name = stands_for[name]
        return name

    readers: dict[str, tf.Operation] = {}
    for name in stands_for:
        for op in graph.get_tensor_by_name(name).consumers():
            readers.setdefault(op.name, op)
    for op in readers.values():
        if not op.op_def.is_commutative:
            continue
        names = [t.name for t in op.inputs]
        got = [original(n) for n in _sorted_inputs(names)]
        if got != _sorted_inputs([original(n) for n in names]):
            moved = [n for n, o in zip(_sorted_inputs(names), _sorted_inputs([original(n) for n in names]))
                     if n in stands_for and original(n) != o]
            log.warning("LMS: %s reads %s in another position among its inputs after Grappler sorts them by name; "
                        "results may differ in the last bits", op.name,
                        ", ".join(dict.fromkeys(n.rsplit(":", 1)[0] for n in moved)) or "an inserted op")


def _protect(op: tf.Operation) -> None:
    """Mark an inserted op for Grappler to leave alone (its dependency optimizer drops identities)."""
    op._set_attr(DO_NOT_REMOVE_ATTR, attr_value_pb2.AttrValue(b=True))  # noqa: SLF001


def _check_free_name(graph: tf.Graph, name: str) -> None:
    with graph.name_scope(None):
        if graph.unique_name(name, mark_as_used=False) != name:
            raise ValueError(f"op name {name!r} is already used in the graph (plan applied twice?)")


def _tensor(graph: tf.Graph, name: str) -> tf.Tensor:
    try:
        return graph.get_tensor_by_name(name)
    except (KeyError, ValueError):
        raise ValueError(f"the plan swaps tensor {name!r}, which is not in the graph") from None


def _op(graph: tf.Graph, name: str, *, what: str) -> tf.Operation:
    try:
        return graph.get_operation_by_name(name)
    except (KeyError, ValueError):
        raise ValueError(f"{what}: op {name!r} is not in the graph") from None


def observe_swapped_size(graph: tf.Graph, swap: Swap, callback: Callable[[int], None]) -> None:
    """Call ``callback(nbytes)`` with the swapped tensor's size each time the step runs.

    For a batch unknown at trace time. Reads the size of the swap-out's host
    copy, an inserted op, so that no op of the step gains a reader::

        [lms/swap_out/t] -> h -> [lms/swap_out/t/observe/size] -> [lms/swap_out/t/observe]
                                                                  ..> [first swap-in of t]

    The control edge keeps the observer in the step (and cannot make a cycle:
    the swap-in reads ``h`` anyway). Apply `swap` first.
    """
    out = graph.get_operation_by_name(swap.swap_out)
    try:  # emulated: the swap-ins read its /shaped op
        host = graph.get_operation_by_name(f"{swap.swap_out}/shaped").outputs[0]
    except KeyError:
        host = out.outputs[0]
    itemsize = host.dtype.size

    def observe(size: Any) -> Any:
        callback(int(size) * itemsize)
        return size

    with graph.as_default(), record.stop_recording(), graph.name_scope(None), graph.control_dependencies(None), \
            graph.colocate_with(None, ignore_existing=True), graph.device(HOST_DEVICE):
        size = tf.size(host, out_type=tf.int64, name=f"{swap.swap_out}/observe/size")
        seen = tf.numpy_function(observe, [size], tf.int64, stateful=False, name=f"{swap.swap_out}/observe")
    for op in (size.op, seen.op):
        _protect(op)
    graph.get_operation_by_name(swap.swap_ins[0].name)._add_control_input(seen.op)  # noqa: SLF001


# ---- checking what survived Grappler ------------------------------------------------
