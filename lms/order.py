"""The executed order of a graph: TF's executor scheduling, and Grappler's identity bypass. No TensorFlow."""

from __future__ import annotations

import collections

from .graph import Graph, Op
from .optypes import INPUT_TYPES, VIEW_TYPES, ZERO_COST_TYPES

__all__ = ["executed_order", "bypass_identities", "prune_dead", "root_rank", "ORDERS", "BYPASSED_TYPES"]

ORDERS = ("executor", "single_threaded", "fifo", "creation")

# The step's inputs (data and captured variable handles).


def executed_order(graph: Graph, kind: str = "executor", *,
                   expensive_op_bytes: int | None = None) -> tuple[str, ...]:
    """The order in which TF's executor runs the ops (one inter-op thread), as op names.

    ``"executor"`` follows TF's ``ExecutorState`` scheduling (``executor.cc``):
    each op without inputs starts a *task* on the thread pool's queue (variable
    handles first, the step's data last: `root_rank`); a task runs an inline FIFO queue: when an op
    finishes, the successors it makes ready are appended in out-edge order
    (consumer creation order), except *expensive* ones: all but the last are
    pushed as new tasks to the front of the pool's queue (a worker's own queue
    is LIFO), and the last runs inline only if the inline queue is empty. On a
    GPU no op counts as expensive (a kernel is only enqueued); on a CPU an op
    is expensive when TF measured it above 8,000 cycles, which we approximate
    by the bytes it touches (`expensive_op_bytes`; views and constants never).
    Swap-ins become ready only when their trigger (a control input) has run.

    Limits, seen in tf.profiler traces of TF 2.21 CPU steps (one inter-op
    thread): TF's cost estimate starts at 1e8 cycles and decays by 10% per
    run, so for a function's first ~90 runs *every* kernel that does not
    override ``IsExpensive()`` (Const, Identity, Reshape, Shape, NoOp, _Arg,
    ...) counts as expensive, whatever its size; and the out-edge order is
    the node order of Grappler's optimized graph, which differs from one
    process to the next (the root order alone changes between processes
    running the same step). So on CPU this is one plausible order, not *the*
    order: peaks measured in different processes spread by up to ~40% with
    emulated swaps (a swap-out left behind on the executor's task stack keeps
    its tensor alive), a few percent without.

    ``"single_threaded"``: TF's ``SINGLE_THREADED_EXECUTOR`` (select it with
    ``tf.experimental.function_executor_type``), which runs a function's ops
    one by one in a reverse post-order of its graph, fixed when the function is
    instantiated: the same order in every step, no timing in it (across
    processes it can still move, see `_reverse_post_order`).
    ``benchmarks/simulator_accuracy.py`` and the tuner's emulated trials measure
    under it (``measure_step(executor="single_threaded")``); see
    `_reverse_post_order` for the one fitted detail.

    ``"fifo"``: one global FIFO ready queue over all ops (breadth-first).
    ``"creation"``: Kahn's algorithm with creation-order ties (each branch as
    soon as possible). Both are kept for comparison: on the TF CPU traces of
    ``benchmarks/simulator_accuracy.py`` the executor order is the closest.
    """
    if kind == "creation":
        return graph.topological_order
    if kind not in ORDERS:
        raise ValueError(f"order={kind!r}: allowed values are " + ", ".join(repr(o) for o in ORDERS))
    if kind == "single_threaded":
        return _reverse_post_order(graph)
    names = list(graph.ops)
    pending = {n: len(graph.predecessors(n)) for n in names}
    succ = graph.successors
    order: list[str] = []
    roots = [n for n in names if pending[n] == 0]
    if kind == "fifo":
        ready = collections.deque(roots)
        while ready:
            name = ready.popleft()
            order.append(name)
            for s in succ[name]:
                pending[s] -= 1
                if pending[s] == 0:
                    ready.append(s)
    else:
        expensive = _expensive_ops(graph, expensive_op_bytes)
        tasks = collections.deque(sorted(roots, key=lambda n: root_rank(graph, n)))
        while tasks:
            inline = collections.deque((tasks.popleft(),))
            while inline:
                name = inline.popleft()
                order.append(name)
                current: str | None = None
                for s in succ[name]:
                    pending[s] -= 1
                    if pending[s]:
                        continue
                    if s not in expensive:
                        inline.append(s)
                        continue
                    if current is not None:
                        tasks.appendleft(current)
                    current = s
                if current is not None:
                    if inline:
                        tasks.appendleft(current)
                    else:
                        inline.append(current)
    if len(order) != len(names):
        graph.topological_order  # raises GraphError naming the cycle
    return tuple(order)


def _reverse_post_order(graph: Graph) -> tuple[str, ...]:
    """TF's ``GetReversePostOrder``: a depth-first search from the ops without inputs, reversed post-order.

    TF pushes an op's consumers in its out-edge order, so the last is explored
    first. Which order TF's rebuilt graph holds them in is not visible from
    Python; pushing them in *reverse creation order* (the first-created
    consumer explored first, its region last) reproduced the orders seen in
    allocation traces of TF 2.21 steps, and creation order did not (a small
    CNN's no-LMS peak came out 121 MiB against 84 MiB measured).

    The search starts from the ops without inputs (variable handles, the
    step's data, constants), taken in creation order. TF keeps them as the
    out-edges of its source node in a pointer-keyed hash set, so a few of
    them (seen: SGD's gradient-independent ``momentum * m`` products) land
    elsewhere in some processes: an MLP's peak measured 129-161 MiB over six
    processes, 130 MiB in four; with oneDNN's rewrites on, an 8-conv CNN's
    no-LMS peak was 37, 52 and 61 MiB in three processes. Shuffling the roots
    at random does not model this (it predicted worse in every case tried);
    it stays a known spread.
    """
    succ = graph.successors
    names = list(graph.ops)
    roots = [n for n in names if not graph.predecessors(n)]
    visited: set[str] = set()
    post: list[str] = []
    stack: list[tuple[str, bool]] = [(r, False) for r in roots]
    while stack:
        name, leave = stack.pop()
        if leave:
            post.append(name)
            continue
        if name in visited:
            continue
        visited.add(name)
        stack.append((name, True))
        stack.extend((s, False) for s in reversed(succ[name]) if s not in visited)
    if len(post) != len(names):
        graph.topological_order  # raises GraphError naming the cycle
    post.reverse()
    return tuple(post)


def root_rank(graph: Graph, name: str) -> int:
    """Task order of the ops without inputs: variable handles, then the rest, then the step's data.

    Seen in TF's CPU traces: the variable reads (and what they feed, e.g. the
    optimizer's ``momentum * m``) run before the forward pass starts from the
    step's inputs. The sort is stable: creation order within each group.
    """
    op = graph.ops[name]
    if op.type not in INPUT_TYPES:
        return 1
    return 0 if all(graph.tensors[t].dtype == "resource" for t in op.outputs) else 2


def _expensive_ops(graph: Graph, threshold: int | None) -> frozenset[str]:
    """Ops TF's CPU executor would run as their own task (see `executed_order`)."""
    if threshold is None:
        return frozenset()
    batch = graph.batch_size
    out = set()
    for op in graph.ops.values():
        if op.type in ZERO_COST_TYPES or op.type in VIEW_TYPES:
            continue
        touched = sum(graph.tensors[t].nbytes(batch) for t in (*dict.fromkeys(op.inputs), *op.outputs))
        if touched > threshold:
            out.add(op.name)
    return frozenset(out)


BYPASSED_TYPES = frozenset({"Identity", "IdentityN"})


def bypass_identities(graph: Graph) -> Graph:
    """The graph as Grappler's dependency optimizer leaves it: identities bypassed.

    ``a -> [Identity] -> c`` becomes ``a -> c``; an ``IdentityN`` over many
    tensors (Keras passes all gradients through one before the optimizer
    update) no longer makes every update wait for the last gradient. Kept:
    identities with control inputs, with readers through control edges, that
    cross devices, or that nobody reads (the step's outputs). Views cost no
    memory either way; this only changes *when* readers may run.
    """
    control_readers = {c for op in graph.ops.values() for c in op.control_inputs}
    source: dict[str, str] = {}
    for op in graph.ops.values():
        if (op.type not in BYPASSED_TYPES or op.control_inputs or op.name in control_readers
                or len(op.inputs) < len(op.outputs)):
            continue
        if any(graph.producer(t).device != op.device for t in op.inputs):
            continue
        for i, t in enumerate(op.outputs):
            if graph.consumers(t):
                source[t] = op.inputs[i if op.type == "IdentityN" else 0]
    if not source:
        return graph

    def resolve(t: str) -> str:
        while t in source:
            t = source[t]
        return t

    bypassed = {t.rsplit(":", 1)[0] for t in source}
    ops: list[Op] = []
    for op in graph.ops.values():
        if op.name in bypassed:
            continue
        if any(t in source for t in op.inputs):
            op = Op(name=op.name, type=op.type, role=op.role, inputs=tuple(resolve(t) for t in op.inputs),
                    control_inputs=op.control_inputs, outputs=op.outputs, grad_of=op.grad_of,
                    device=op.device, live=op.live)
        ops.append(op)
    kept = {t for op in ops for t in op.outputs}
    return Graph(ops, [t for t in graph.tensors.values() if t.name in kept],
                 batch_size=graph.batch_size, name=graph.name)


def prune_dead(graph: Graph) -> Graph:
    """The graph as TensorFlow runs it: ops nothing needs removed (`lms.graph.Op.live`).

    TF prunes a function's body to what its outputs and its stateful ops depend on
    before it runs a step (a frozen layer's filter gradient, the gradient of
    ``where``'s constant branch in a masked softmax): their outputs never take
    memory and their inputs are not held for them. An op marked dead stays when
    a kept op waits on it through a control edge added since the trace (a pin).
    """
    if all(op.live for op in graph.ops.values()):
        return graph
    keep = {name for name, op in graph.ops.items() if op.live}
    stack = list(keep)
    while stack:
        op = graph.ops[stack.pop()]
        for dep in (*(graph.producer(t).name for t in op.inputs), *op.control_inputs):
            if dep not in keep:
                keep.add(dep)
                stack.append(dep)
    if len(keep) == len(graph.ops):
        return graph
    ops = [op for op in graph.ops.values() if op.name in keep]
    kept = {t for op in ops for t in op.outputs}
    return Graph(ops, [t for t in graph.tensors.values() if t.name in kept],
                 batch_size=graph.batch_size, name=graph.name)
