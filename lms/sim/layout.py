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

from ..graph import Graph

__all__ = ["CONV2D_TYPES", "CONV3D_TYPES", "converts_layout", "transposed_rank", "is_transposed"]

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
    """Whether a swap of `tensor` gets a transpose on each side in a converted graph (a float tensor of a converted rank)."""
    t = graph.tensors[tensor]
    return t.shape is not None and len(t.shape) in ranks and t.dtype.startswith(("float", "bfloat"))
