"""Pin the graph TensorFlow really runs: every op of the step's optimized graph on one chain, Grappler off.

`lms.schedule.exact_order` says why and how the chain is chosen. This is the TensorFlow side,
used by `lms.function` on the first call of a memory-scheduled step on one CPU
device::

    trace (LMS rewrite, partial pins)                          lms.tf.function
    -> dry run on stand-in variables, batch 1                  capture_optimized: TF instantiates the
                                                               step, Grappler optimizes it, RunMetadata
                                                               keeps the optimized graph
    -> exact_order(optimized nodes, schedule.order)            lms.schedule.exact_order
    -> the optimized graph + the chain, as a new function       rebuild
    -> dry run of it on the stand-ins                          verify: oneDNN chose the same kernel for
                                                               every op (else: not used)
    -> every call runs it with Grappler off                    ExactStep.__call__

The dry runs read and write *stand-in* variables (zeros, the same dtypes and
shapes) passed in place of the step's captured variables, so the step's own
state is never touched. That is safe only for steps whose state is all in
variables: a step with another stateful op (``tf.print``, a summary, a
legacy random op whose kernel keeps its own seed state, a Python callback, a
dataset iterator) is not pinned whole (`unpinnable_reason`), nor is a step on
several devices or with control flow, nor one whose optimized graph has an
accumulation Grappler's memory optimizer made of a large ``AddN``: its sum
depends on the order TF's executor runs its terms in, which no chain chosen
ahead of the run reproduces (`lms.schedule.exact_order.order_dependent_sums`).
Those steps keep the partial pins.

What the dry runs leave behind is the same in every process, so TF's allocator
reports the same peak for the same step in each (to the byte): dry run 1 (the
unpinned step, whose own op order differs between processes) runs on TF's
default executor, whose kernels -- and the constants they allocate, which live
as long as TF caches that instantiation -- are made in the graph's node order;
each dry run gets its own stand-ins, freed right after it, so nothing it placed
in the allocator is where the rebuild's constants go; and every constant of the
rebuilt graph is on the chain (`lms.schedule.exact_order`), so its kernels are made in one order.
The batch must be in TF's allocator too (`lms.tf.measure.device_batch`).

Why the result trains bit for bit like plain ``tf.function``: the rebuilt
function is TF's own optimized graph of the step, node for node; Grappler does
not run on it again; oneDNN's layout pass, which still does, is checked to map
every node to the kernel it chose for the original (`ExactStep.kernels`). Only
the order differs, and on CPU a kernel's result does not depend on when it runs.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import tensorflow as tf

from ..schedule.exact_order import ExactOrder, ExactOrderError, Node, exact_order, order_dependent_sums

__all__ = ["ExactStep", "ExactUnavailable", "build_exact_step", "unpinnable_reason", "graph_nodes",
           "in_dry_run", "SAFE_STATEFUL_TYPES"]

log = logging.getLogger(__name__)

# Stateful op types whose only state is a resource input (a variable): a dry run on stand-in variables
# changes nothing else. Plus the step's arguments, results and asserts.
SAFE_STATEFUL_TYPES = frozenset({
    "_Arg", "_Retval", "Placeholder", "ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp",
    "AssignSubVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape", "VarIsInitializedOp",
    "RngReadAndSkip", "RngSkip", "Assert",
})
_SAFE_STATEFUL_PREFIXES = ("ResourceApply", "ResourceSparseApply", "ResourceScatter", "StatefulUniform",
                           "StatefulStandardNormal", "StatefulTruncatedNormal", "StatefulRandomBinomial")
# tf.cond / tf.while_loop / tf.switch_case as functional ops (lowered to Switch/Merge when the step runs)
_FUNCTIONAL_FLOW = frozenset({"If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase"})
# Partition-graph nodes that carry no kernel choice (or that the rebuilt function adds: identities).
_NOT_KERNELS = frozenset({"_Arg", "_Retval", "NoOp", "Identity", "Const"})

_dry = threading.local()


class ExactUnavailable(ValueError):
    """The step's executed graph cannot be pinned whole; the reason says why (the partial pins stay)."""


def in_dry_run() -> bool:
    """True while this thread runs a dry step on stand-in variables (observers should ignore it)."""
    return bool(getattr(_dry, "active", False))


@contextlib.contextmanager
def _dry_run() -> Iterator[None]:
    _dry.active = True
    try:
        yield
    finally:
        _dry.active = False


def unpinnable_reason(graph: tf.Graph) -> str:
    """Why the traced step cannot be pinned whole ('' when it can), before anything runs.

    Refused: stateful ops other than variable reads and updates (a dry run would
    print, write, draw random numbers or call Python), ops placed on a GPU or on
    several devices, and control flow (``tf.cond``/``tf.while_loop`` become
    ``Switch``/``Merge`` in the executed graph).
    """
    def stateful_problem(op_type: str, is_stateful: bool) -> bool:
        return (is_stateful and op_type not in SAFE_STATEFUL_TYPES and op_type not in _FUNCTIONAL_FLOW
                and not op_type.startswith(_SAFE_STATEFUL_PREFIXES))

    bad: Counter = Counter()
    device_names: set[str] = set()
    flow: set[str] = set()
    for op in graph.get_operations():
        if stateful_problem(op.type, op._is_stateful):  # noqa: SLF001
            bad[op.type] += 1
        if op.type in _FUNCTIONAL_FLOW:
            flow.add(op.type)
        device_names.add(op.device)
    devices = {tf.DeviceSpec.from_string(d).device_type or "" for d in device_names if d}
    library = graph.as_graph_def().library.function if getattr(graph, "_functions", None) else ()
    for fdef in library:
        for node in fdef.node_def:
            if node.op in _FUNCTIONAL_FLOW:
                flow.add(node.op)
            op_def = _op_def(node.op)
            if op_def is not None and stateful_problem(node.op, op_def.is_stateful):
                bad[node.op] += 1
    if flow:
        return ("control flow (" + ", ".join(sorted(flow)) + "): TF lowers it to Switch/Merge, and a chain through "
                "an untaken branch would never run")
    if bad:
        return ("stateful ops other than variable updates (" + ", ".join(sorted(bad)) + "): a dry run to capture "
                "the executed graph would run them")
    if devices - {"CPU", ""}:
        return "ops placed on " + ", ".join(sorted(devices - {"CPU", ""})) + " (only one CPU device is pinned whole)"
    return ""


def _op_def(op_type: str) -> Any:
    from tensorflow.python.framework import op_def_registry

    return op_def_registry.get(op_type)


def graph_nodes(graph_def: Any) -> list[Node]:
    """The nodes of a GraphDef as `lms.schedule.exact_order.Node`s (inputs by node name, output indexes dropped)."""
    nodes = []
    for n in graph_def.node:
        data, control = [], []
        for i in n.input:
            if i.startswith("^"):
                control.append(i[1:])
            else:
                data.append(i.split(":")[0])
        nodes.append(Node(name=n.name, type=n.op, inputs=tuple(data), control_inputs=tuple(control)))
    return nodes


@dataclass(frozen=True)
class _Captured:
    optimized: Any          # GraphDef after Grappler (before oneDNN's layout pass)
    partitions: tuple       # GraphDefs after every pass: the kernels that ran
    capture_s: float


@dataclass
class ExactStep:
    """A traced step rebuilt from its optimized graph with every op on one chain.

    Call it with the concrete function's flat inputs (arguments, not captures);
    it returns the flat outputs.

    Attributes:
        order: the chain (`lms.schedule.exact_order.ExactOrder`) over the optimized graph.
        n_nodes: nodes of the optimized graph.
        kernels: kernel op types oneDNN chose, by count (the same for the
            original and the rebuilt function: checked).
        timings: seconds of ``capture_s`` (dry run 1), ``rebuild_s``,
            ``verify_s`` (dry run 2).
    """

    function: Any
    order: ExactOrder
    n_nodes: int
    kernels: dict
    timings: dict

    def __call__(self, flat_args: Sequence[Any]) -> list[Any]:
        with grappler_off():
            return list(self.function._call_flat(list(flat_args), self.function.captured_inputs))  # noqa: SLF001


@contextlib.contextmanager
def grappler_off() -> Iterator[None]:
    """This thread's function calls with Grappler's meta optimizer off (the rest of the call options kept)."""
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.eager import context

    options = context.context().function_call_options
    before = options.config_proto_serialized
    config = config_pb2.ConfigProto.FromString(before) if before else config_pb2.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    options.config_proto_serialized = config
    try:
        yield
    finally:
        options.config_proto_serialized = config_pb2.ConfigProto.FromString(before) if before else None


def build_exact_step(concrete_fn: Any, flat_args: Sequence[Any], schedule_order: Sequence[str], *,
                     name: str = "step") -> ExactStep:
    """Capture `concrete_fn`'s optimized graph, chain it in `schedule_order`, rebuild it, check its kernels.

    Args:
        concrete_fn: the traced step (a ``tf.function`` concrete function).
        flat_args: its flat arguments for one call (sliced to one sample where
            the batch dim is unknown: the dry runs need the shapes, not the data).
        schedule_order: the memory schedule's order over the traced graph.
        name: for log lines.

    Raises:
        ExactUnavailable: naming why the step cannot be pinned whole.
    """
    reason = unpinnable_reason(concrete_fn.graph)
    if reason:
        raise ExactUnavailable(reason)
    small = _one_sample(concrete_fn, flat_args)
    # Each dry run gets its own stand-ins, freed right after it: what dry run 1 (unpinned: its order differs
    # between processes) leaves in TF's allocator must not be where the rebuild's kernels place their
    # constants, or those land elsewhere in each process and move every later buffer.
    stand_ins, keep = _stand_in_captures(concrete_fn)
    t0 = time.perf_counter()
    # Dry run 1 instantiates the unpinned step, and TF keeps that instantiation with the constants its
    # kernels allocated. On TF's default executor the kernels are made in the graph's node order, the same
    # in every process; the caller's single-threaded executor walks pointer-ordered edge sets, and its
    # constants would land elsewhere in TF's allocator in each process, moving every later buffer.
    with tf.experimental.function_executor_type(None):
        captured = _capture(lambda: concrete_fn._call_flat(small, captured_inputs=stand_ins),  # noqa: SLF001
                            concrete_fn)
    nodes = graph_nodes(captured.optimized)
    sums = order_dependent_sums(nodes)
    if sums:
        _free(stand_ins, keep)
        raise ExactUnavailable(f"Grappler's memory optimizer made {', '.join(sums[:3])} an accumulation whose bits "
                               "depend on the order TF's executor adds its terms in (lms.schedule.exact_order."
                               "order_dependent_sums); pinned whole, it would add them in another order")
    devices = {tf.DeviceSpec.from_string(n.device).device_type or "" for n in captured.optimized.node if n.device}
    if len({n.device for n in captured.optimized.node if n.device}) > 1 or devices - {"CPU"}:
        raise ExactUnavailable("the optimized graph runs on " + ", ".join(sorted({n.device for n in
                               captured.optimized.node if n.device})) + " (only one CPU device is pinned whole)")
    try:
        chain = exact_order(nodes, schedule_order, onednn=_onednn_enabled())
    except ExactOrderError as exc:
        raise ExactUnavailable(str(exc)) from None
    _free(stand_ins, keep)
    del stand_ins, keep
    t1 = time.perf_counter()
    function = _rebuild(captured.optimized, concrete_fn, chain)
    t2 = time.perf_counter()
    stand_ins, keep = _stand_in_captures(concrete_fn)
    rebuilt = _capture(lambda: _call_dry(function, small, stand_ins), None)
    _free(stand_ins, keep)
    del stand_ins, keep
    t3 = time.perf_counter()
    before, after = _kernels(captured.partitions), _kernels(rebuilt.partitions)
    if before != after:
        diff = sorted(f"{n}: {before.get(n)} -> {after.get(n)}" for n in set(before) | set(after)
                      if before.get(n) != after.get(n))[:4]
        raise ExactUnavailable("pinned whole, oneDNN would run other kernels (" + "; ".join(diff) + ")")
    kinds = Counter(before.values())
    log.info("LMS: %s pinned whole: %d ops of its optimized graph on one chain (%d edges, %d placed by the "
             "memory schedule); capture %.2f s, rebuild %.2f s, check %.2f s", name, chain.n_chained,
             len(chain.edges), chain.n_placed, t1 - t0, t2 - t1, t3 - t2)
    return ExactStep(function=function, order=chain, n_nodes=len(nodes), kernels=dict(kinds),
                     timings={"capture_s": t1 - t0, "rebuild_s": t2 - t1, "verify_s": t3 - t2})


def _onednn_enabled() -> bool:
    """Whether TF's oneDNN (MKL) graph passes run in this process (they merge some op pairs)."""
    try:
        from tensorflow.python.util import _pywrap_util_port

        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):
        return True  # keep the pairs adjacent: right either way but for one op's place


def _one_sample(concrete_fn: Any, flat_args: Sequence[Any]) -> list[Any]:
    """`flat_args` cut to one sample along dim 0 where the traced input's dim 0 is unknown."""
    n_args = len(concrete_fn.inputs) - len(concrete_fn.captured_inputs)
    out = []
    for spec, value in zip(concrete_fn.inputs[:n_args], flat_args):
        shape = spec.shape
        if (spec.dtype not in (tf.resource, tf.variant) and shape.rank and shape[0] is None
                and getattr(value, "shape", None) is not None and len(value.shape) and value.shape[0]):
            value = value[:1]
        out.append(value)
    return out


def _stand_in_captures(concrete_fn: Any) -> tuple[list[Any], list[Any]]:
    """A zero variable of the same dtype and shape for each captured variable; other captures as they are."""
    from tensorflow.python.ops import resource_variable_ops

    out, keep = [], []
    with tf.init_scope():
        for c in concrete_fn.captured_inputs:
            if c.dtype != tf.resource:
                out.append(c)
                continue
            data = resource_variable_ops.get_eager_safe_handle_data(c)
            if not data.is_set or len(data.shape_and_type) != 1:
                raise ExactUnavailable("it captures a resource that is not a variable")
            st = data.shape_and_type[0]
            dtype = tf.dtypes.as_dtype(st.dtype)
            if dtype in (tf.variant, tf.resource, tf.string):
                raise ExactUnavailable(f"it captures a resource holding {dtype.name} values")
            with tf.device(c.device):
                v = tf.Variable(tf.zeros(tf.TensorShape(st.shape), dtype), trainable=False)
            keep.append(v)
            out.append(v.handle)
    return out, keep


def _free(stand_ins: list[Any], keep: list[Any]) -> None:
    """Release a dry run's stand-in variables (the caller drops its names for them), now, not at some later
    collection: their buffers must leave TF's allocator before the next dry run or the rebuild allocates.

    Reference counting frees them as the lists go; only a stand-in a reference cycle still holds needs the
    full collection, which costs 0.2-0.4 s in a process that has built a model (MEASURED 2026-12-04: ResNet-50
    64x64, GPT-2 small and a small CNN freed every stand-in without it, and the collection, then run at
    each dry run's end, found none of theirs: 0 objects for the first two).
    """
    refs = [weakref.ref(v) for v in keep]
    stand_ins.clear()
    keep.clear()
    if any(r() is not None for r in refs):
        gc.collect()


def _capture(call: Any, concrete_fn: Any) -> _Captured:
    """Run `call` once with run metadata on; the function graphs TF instantiated for it."""
    from tensorflow.python.eager import context

    t0 = time.perf_counter()
    context.enable_run_metadata()
    try:
        with _dry_run():
            try:
                call()
            except (tf.errors.OpError, ValueError) as exc:
                raise ExactUnavailable("the dry run on stand-in variables failed: "
                                       + str(exc).strip().splitlines()[0][:200]) from None
        metadata = context.export_run_metadata()
    finally:
        context.disable_run_metadata()
    graphs = list(metadata.function_graphs)
    if concrete_fn is not None:
        n_in, n_out = len(concrete_fn.inputs), len(concrete_fn.outputs)
        graphs = [g for g in graphs if _count(g.post_optimization_graph, "_Arg") == n_in
                  and _count(g.post_optimization_graph, "_Retval") == n_out] or graphs
    if not graphs:
        raise ExactUnavailable("TensorFlow recorded no optimized graph for the step (it had already run with "
                               "these arguments)")
    g = graphs[-1]
    return _Captured(optimized=g.post_optimization_graph, partitions=tuple(g.partition_graphs),
                     capture_s=time.perf_counter() - t0)


def _count(graph_def: Any, op_type: str) -> int:
    return sum(1 for n in graph_def.node if n.op == op_type)


def _call_dry(function: Any, args: Sequence[Any], stand_ins: Sequence[Any]) -> Any:
    with grappler_off():
        return function._call_flat(list(args), captured_inputs=list(stand_ins))  # noqa: SLF001


def _kernels(partitions: Sequence[Any]) -> dict[str, str]:
    """Node name -> kernel op type of every node that chooses a kernel, over the executed partitions."""
    return {n.name: n.op for p in partitions for n in p.node if n.op not in _NOT_KERNELS}


def _rebuild(optimized: Any, concrete_fn: Any, chain: ExactOrder) -> Any:
    """A function of the same inputs and captures running `optimized` with `chain`'s edges added.

    ``(_Arg i) -> ... -> (_Retval j)`` becomes ``input i -> [imported nodes + chain] -> output j``; captured
    variables are captured again by the new function, in the concrete function's order.
    """
    from tensorflow.core.framework import graph_pb2

    body = graph_pb2.GraphDef()
    body.versions.CopyFrom(optimized.versions)
    library = optimized.library if len(optimized.library.function) else concrete_fn.graph.as_graph_def().library
    body.library.CopyFrom(library)
    extra: dict[str, list[str]] = {}
    for a, b in chain.edges:
        extra.setdefault(b, []).append(a)
    args: dict[int, str] = {}
    results: dict[int, str] = {}
    for n in optimized.node:
        if n.op == "_Arg":
            args[n.attr["index"].i] = n.name
        elif n.op == "_Retval":
            src = n.input[0]
            results[n.attr["index"].i] = src if ":" in src else src + ":0"
    arg_names = set(args.values())
    for n in optimized.node:
        if n.op in ("_Arg", "_Retval"):
            continue
        node = body.node.add()
        node.CopyFrom(n)
        # an argument is there from the start: control edges from it order nothing
        kept = [i for i in node.input if not (i.startswith("^") and i[1:] in arg_names)]
        kept += [c for c in dict.fromkeys("^" + a for a in extra.get(n.name, ()) if a not in arg_names)
                 if c not in kept]
        del node.input[:]
        node.input.extend(kept)
    n_args = len(concrete_fn.inputs) - len(concrete_fn.captured_inputs)
    captures = list(concrete_fn.captured_inputs)
    specs = [tf.TensorSpec(t.shape, t.dtype) for t in concrete_fn.inputs[:n_args]]
    outputs = [results[i] for i in sorted(results)]

    def body_fn(*flat: Any) -> Any:
        graph = tf.compat.v1.get_default_graph()
        input_map = {}
        for i, node_name in sorted(args.items()):  # captures in the concrete function's order
            input_map[node_name + ":0"] = flat[i] if i < n_args else graph.capture(captures[i - n_args])
        return tf.graph_util.import_graph_def(body, input_map=input_map, return_elements=outputs, name="")

    return tf.compat.v1.wrap_function(body_fn, specs, name="lms_exact")
