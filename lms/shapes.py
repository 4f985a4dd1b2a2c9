"""Sizes the trace left unknown, recovered from the graph's structure. No TensorFlow.

TensorFlow's shape inference loses dims in a few gradient patterns; the commonest
is the gradient of a broadcasting binary op (``Add``, ``Mul``, ...)::

    g -> Sum(g, BroadcastGradientArgs(...)) -> Reshape(., Shape(x))

The ``Sum``'s reduction axes are computed at run time, so its output shape is
unknown (``(None, None, None, None)``) and the trace records it as 4 bytes per
sample, although in a residual network it reduces nothing and is as large as
``g``. Two exact rules recover such sizes:

- ``Reshape`` keeps the number of elements: an unknown input or output takes
  the size of the known side.
- A reduction whose output is as large as its input reduced nothing; TF's
  reduction kernels then return the input buffer itself (``ReductionOp``'s
  "reduces nothing" case), so the simulator treats it as a view
  (`is_noop_reduction`).
"""

from __future__ import annotations

from .graph import Graph, Op, Tensor

__all__ = ["complete_sizes", "is_noop_reduction", "REDUCTION_TYPES"]

REDUCTION_TYPES = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "All", "Any"})
_RESHAPES = frozenset({"Reshape"})


def _known(t: Tensor) -> bool:
    return t.shape is not None and all(d is not None for d in t.shape[1:])


def complete_sizes(graph: Graph) -> Graph:
    """`graph` with unknown tensor sizes filled in where a rule above decides them (else itself)."""
    tensors = dict(graph.tensors)
    changed = False
    for _ in range(4):  # chains of reshapes settle in a pass or two
        progress = False
        for op in graph.ops.values():
            if op.type not in _RESHAPES or not op.inputs or not op.outputs:
                continue
            src, dst = tensors[op.inputs[0]], tensors[op.outputs[0]]
            if src.dtype != dst.dtype or _known(src) == _known(dst):
                continue
            known, unknown = (src, dst) if _known(src) else (dst, src)
            tensors[unknown.name] = Tensor(unknown.name, dtype=unknown.dtype, shape=known.shape,
                                           fixed_bytes=known.fixed_bytes, per_sample_bytes=known.per_sample_bytes)
            progress = changed = True
        if not progress:
            break
    if not changed:
        return graph
    return Graph(graph.ops.values(), tensors.values(), batch_size=graph.batch_size, name=graph.name)


def is_noop_reduction(graph: Graph, op: Op) -> bool:
    """A reduction whose output is exactly as large as its input (it reduces nothing)."""
    if op.type not in REDUCTION_TYPES or not op.inputs or len(op.outputs) != 1:
        return False
    src, dst = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
    return (src.dtype == dst.dtype and (src.fixed_bytes, src.per_sample_bytes) == (dst.fixed_bytes, dst.per_sample_bytes)
            and (src.fixed_bytes or src.per_sample_bytes) > 0)
