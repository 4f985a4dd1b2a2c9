"""Grappler's layout conversion on a GPU, and the transposes it puts beside every swap. No TensorFlow.

On a GPU, Grappler's generic layout optimizer rewrites a graph's NHWC
convolutions (and the pooling, bias, batch-norm ops and the layout-agnostic ops
between them) to NCHW, cuDNN's faster layout for fp32, adding a ``Transpose``
wherever a converted op meets one that is not. It keeps NHWC when at least half
of the GPU convolutions prefer it: fp16 on Volta or newer, bf16 on Ampere or
newer, or TF32 without any fp32 backward convolution (``GetSrcAndDstDataFormats``
in TF's ``generic_layout_optimizer.cc``). A training step in fp32 has fp32
backward convolutions, so it is converted on every GPU.

It converts only nodes on the GPU that are not in Grappler's preserve set
(``Transposer::ShouldProcess``). LMS's swap ops must sit on the host (so that a
swap-in's copy waits for its trigger, `lms.tf.apply`) and carry
``_grappler_do_not_remove`` (or the dependency optimizer would drop them): each
is a layout boundary. So in a converted step every swapped 4-D (5-D with 3-D
convolutions) tensor is transposed NCHW -> NHWC on the GPU before it is copied
out, and NHWC -> NCHW after each swap-in is copied back (one ``Transpose`` per
swap-in, shared by its readers), checked offline with Grappler on a virtual GPU
in ``tests/tf/test_layout.py``. Nothing LMS can place avoids them: an op beside
the copy on the GPU side would be a boundary too (the host op is), and turning
the layout optimizer off would change the kernels and so the step's results.

What they cost, as the simulator counts them (`lms.sim.compiled.compile_graph`
with ``layout_transposes``, on a GPU profile when `converts_layout`): each
transpose is a temporary of the tensor's size at the swap op (the transposed
copy coexists with the tensor for a moment) and a pass over it at the device's
memory bandwidth on the compute stream: for a 100 MB tensor on a P100, 2 x 200 MB
of traffic at 732 GB/s, about 0.55 ms, against about 12.5 ms for its two copies
over a 16 GB/s PCIe 3.0 link (PREDICTED, from the datasheet bandwidths).
"""

from __future__ import annotations

from typing import Any

from ..graph import Graph
from ..plan.recompute import is_gate_op_name
from ..plan.swap_plan import SWAP_IN_TYPE, SWAP_OUT_TYPE

__all__ = ["CONV2D_TYPES", "CONV3D_TYPES", "converts_layout", "transposed_rank", "is_transposed", "nchw_tensors",
           "reads_nchw", "swap_transposes"]

CONV2D_TYPES = frozenset({"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropInputV2", "Conv2DBackpropFilter",
                          "Conv2DBackpropFilterV2", "DepthwiseConv2dNative",
                          "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter"})
CONV3D_TYPES = frozenset({"Conv3D", "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2"})
_NHWC_COUNTED = frozenset({"Conv2D", "Conv3D"})  # the convolutions TF's rule counts (IsConv2D, IsConv3D)
# NHWC-preferring dtypes and the compute capability from which Grappler keeps NHWC for them (tensor cores)
_NHWC_FROM = {"float16": (7, 0), "bfloat16": (8, 0)}


def _conv_dtype(graph: Graph, op_name: str) -> str:
    op = graph.ops[op_name]
    ref = op.inputs[0] if op.inputs else (op.outputs[0] if op.outputs else None)
    return graph.tensors[ref].dtype if ref is not None else ""


def _capability(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def converts_layout(graph: Graph, compute_capability: str = "") -> bool:
    """Whether Grappler's layout optimizer converts `graph`'s convolutions to NCHW on a GPU.

    True when the graph has convolutions and fewer than half of its forward
    ``Conv2D``/``Conv3D`` run in a dtype the GPU's tensor cores prefer in NHWC:
    fp16 from compute capability 7.0 (Volta), bf16 from 8.0 (Ampere); on an
    older GPU every dtype is converted. Without `compute_capability` the GPU is
    assumed new enough for both. A graph with only depthwise convolutions has
    none of those and is converted. fp32 counts as converted: TF32 keeps NHWC
    only for a graph without fp32 backward convolutions, i.e. not a training
    step. Checked against Grappler on virtual GPUs of compute capability 6.0,
    7.0, 7.5, 8.0 and 9.0 (``tests/tf/test_inspect.py``).
    """
    convs = [o for o in graph.ops.values() if o.type in CONV2D_TYPES or o.type in CONV3D_TYPES]
    if not convs:
        return False
    capability = _capability(compute_capability) if compute_capability else (99, 0)
    preferring = {dtype for dtype, since in _NHWC_FROM.items() if capability >= since}
    forward = [o.name for o in convs if o.type in _NHWC_COUNTED]
    half = sum(1 for name in forward if _conv_dtype(graph, name) in preferring)
    return not forward or 2 * half < len(forward)


def transposed_rank(graph: Graph) -> frozenset[int]:
    """Ranks of the tensors a converted `graph` holds in the converted layout: 4 (2-D convs) and/or 5 (3-D)."""
    ranks = set()
    for op in graph.ops.values():
        if op.type in CONV2D_TYPES:
            ranks.add(4)
        elif op.type in CONV3D_TYPES:
            ranks.add(5)
    return frozenset(ranks)


def is_transposed(graph: Graph, tensor: str, ranks: frozenset[int]) -> bool:
    """Whether `tensor` has a converted rank and a float dtype (a candidate for the converted layout)."""
    t = graph.tensors[tensor]
    return t.shape is not None and len(t.shape) in ranks and t.dtype.startswith(("float", "bfloat"))


# The ops whose output 0 Grappler's layout optimizer puts in NCHW (its layout-sensitive transposers, TF's
# ``generic_layout_optimizer_transposer.cc``), and the data inputs they read in NCHW (None: every 4-D input).
# A convolution's filter is HWIO in both layouts; Conv2DBackpropFilter's output is a filter.
_SENSITIVE: dict[str, tuple[int, ...] | None] = {
    "Conv2D": (0,), "Conv3D": (0,), "DepthwiseConv2dNative": (0,), "Conv2DBackpropInput": (2,),
    "Conv2DBackpropInputV2": (0, 2), "Conv3DBackpropInputV2": (2,), "DepthwiseConv2dNativeBackpropInput": (2,),
    "BiasAdd": (0,), "MaxPool": (0,), "MaxPoolV2": (0,), "AvgPool": (0,), "AvgPool3D": (0,), "MaxPool3D": (0,),
    "MaxPoolGrad": None, "MaxPoolGradV2": None, "MaxPoolGradGrad": None, "AvgPoolGrad": (1,),
    "FusedBatchNorm": (0,), "FusedBatchNormV2": (0,), "FusedBatchNormV3": (0,),
    "FusedBatchNormGrad": (0, 1), "FusedBatchNormGradV2": (0, 1), "FusedBatchNormGradV3": (0, 1),
    "DepthToSpace": (0,), "SpaceToDepth": (0,),
}
_READS_ONLY = {"Conv2DBackpropFilter": (0, 2), "Conv2DBackpropFilterV2": (0, 2), "Conv3DBackpropFilterV2": (0, 2),
               "DepthwiseConv2dNativeBackpropFilter": (0, 2), "BiasAddGrad": (0,)}
# Elementwise ops the layout optimizer runs in whatever layout their 4-D inputs come in (its "agnostic" ops).
_AGNOSTIC = frozenset({
    "Abs", "Add", "AddN", "AddV2", "Cast", "Ceil", "Cos", "Div", "DivNoNan", "Elu", "EluGrad", "Erf", "Exp",
    "Expm1", "Floor", "FloorDiv", "Gelu", "Identity", "Inv", "LeakyRelu", "LeakyReluGrad", "Log", "Log1p",
    "LogicalAnd", "LogicalNot", "LogicalOr", "Maximum", "Minimum", "Mul", "MulNoNan", "Neg", "OnesLike",
    "Pow", "RealDiv", "Reciprocal", "ReciprocalGrad", "Relu", "Relu6", "Relu6Grad", "ReluGrad", "Round",
    "Rsqrt", "RsqrtGrad", "Select", "SelectV2", "Selu", "SeluGrad", "Sigmoid", "SigmoidGrad", "Sign", "Sin",
    "Softplus", "SoftplusGrad", "Softsign", "SoftsignGrad", "Sqrt", "SqrtGrad", "Square", "SquaredDifference",
    "Sub", "Tanh", "TanhGrad", "ZerosLike", "Greater", "GreaterEqual", "Less", "LessEqual", "Equal",
    "NotEqual", "Snapshot", "StopGradient", "Pad", "PadV2", "MirrorPad", "ConcatV2",
    # reductions that keep the rank (keepdims): their axes are permuted
    "Mean", "Sum", "Max", "Min", "Prod",
})


def nchw_tensors(graph: Graph, ranks: frozenset[int]) -> frozenset[str]:
    """The tensors a converted `graph` holds in NCHW (NCDHW), as Grappler's layout optimizer decides.

    In topological order: a layout-sensitive op is converted; an elementwise
    ("agnostic") op is converted when a data input is *after* a converted op,
    i.e. reached from one through agnostic ops only (TF's
    ``IsAfterDstToSrcTransform`` walks back through them, LMS's swap ops and
    gates included: they are ``Identity`` ops). LMS's inserted ops themselves are
    never converted (Grappler preserves them), so what they output is NHWC.
    Returns the outputs of converted ops.
    """
    nchw: set[str] = set()
    after: set[str] = set()  # tensors from which the walk back reaches a converted op through agnostic ops
    for name in graph.topological_order:
        op = graph.ops[name]
        if not op.outputs:
            continue
        inserted = op.type in (SWAP_OUT_TYPE, SWAP_IN_TYPE) or _inserted(op)
        reaches = any(t in after for t in op.inputs)
        if inserted:
            if reaches:
                after.add(op.outputs[0])
            continue
        if op.type in _SENSITIVE or (op.type in _AGNOSTIC and reaches):
            out = op.outputs[0]
            if is_transposed(graph, out, ranks):
                nchw.add(out)
                after.add(out)
    return frozenset(nchw)


def reads_nchw(graph: Graph, op_name: str, tensor: str, nchw: frozenset[str]) -> bool:
    """Whether op `op_name` of a converted graph reads its input `tensor` in NCHW."""
    op = graph.ops[op_name]
    if _inserted(op):
        return False
    if op.type in _SENSITIVE or op.type in _READS_ONLY:
        slots = _SENSITIVE[op.type] if op.type in _SENSITIVE else _READS_ONLY[op.type]
        return any((slots is None or i in slots) and t == tensor for i, t in enumerate(op.inputs))
    return op.type in _AGNOSTIC and bool(op.outputs) and op.outputs[0] in nchw


def swap_transposes(graph: Graph, ranks: frozenset[int], nchw: frozenset[str]) -> dict[str, int]:
    """For each swap op of the rewritten `graph`: the ``Transpose`` nodes Grappler puts beside it.

    A swap-out of an NCHW tensor gets one before it (NCHW -> NHWC for the host); a
    swap-in read in NCHW by any of its readers (`reads_nchw`) gets one after it
    (the layout optimizer puts one before each such reader, and Grappler's common
    subexpression elimination keeps one of these equal nodes). Swap ops without
    one are left out.
    """
    out: dict[str, int] = {}
    for op in graph.ops.values():
        if op.type == SWAP_OUT_TYPE and op.inputs and op.inputs[0] in nchw:
            out[op.name] = 1
        elif op.type == SWAP_IN_TYPE and op.outputs:
            t = op.outputs[0]
            if is_transposed(graph, t, ranks) and any(reads_nchw(graph, c, t, nchw) for c in graph.data_consumers(t)):
                out[op.name] = 1
    return out


def _inserted(op: Any) -> bool:
    return is_gate_op_name(op.name)
