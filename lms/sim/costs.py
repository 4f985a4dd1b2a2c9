"""Per-op cost estimates from tensor shapes: FLOPs, bytes moved, temporaries. No TensorFlow.

Every quantity is affine in the batch size, returned as ``(fixed, per_sample)``,
because tensor sizes are (`lms.graph.Tensor.nbytes`). Element counts are taken
from byte sizes, so an op's FLOPs scale with the batch exactly as its tensors do.

FLOPs (multiply-add = 2) are estimated for the ops that dominate training
time: convolutions and matrix products and their gradients. Every other op is
treated as memory-bound (one pass over its inputs and outputs).

Temporaries are the scratch buffers an op allocates while it runs (TF's
``allocate_temp``), which a liveness analysis of the graph cannot see. They are
modelled per op type as ``factor x basis`` with a basis taken from the op's
tensors (see `TemporaryRule`); the factors live in `CPU_TEMPORARIES` (TF's
Eigen CPU kernels, oneDNN off) and `ONEDNN_TEMPORARIES` (oneDNN on: what the
emulated device runs) with their provenance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from ..graph import Graph, Op, Tensor, dtype_size

__all__ = ["TemporaryRule", "TemporaryModel", "CPU_TEMPORARIES", "ONEDNN_TEMPORARIES", "GPU_TEMPORARIES",
           "NO_TEMPORARIES", "TEMPORARIES",
           "op_flops", "op_bytes", "op_temporary"]

Affine = tuple[float, float]

_CONV_FORWARD = frozenset({"Conv2D", "_FusedConv2D", "_MklNativeConv2D", "_MklNativeFusedConv2D",
                           "_MklConv2D", "_MklFusedConv2D", "Conv3D"})
_CONV_INPUT_GRAD = frozenset({"Conv2DBackpropInput", "Conv2DBackpropInputV2", "Conv3DBackpropInputV2",
                              "_MklNativeConv2DBackpropInput"})
_CONV_FILTER_GRAD = frozenset({"Conv2DBackpropFilter", "Conv2DBackpropFilterV2", "Conv3DBackpropFilterV2",
                               "_MklNativeConv2DBackpropFilter"})
_DEPTHWISE = frozenset({"DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
                        "DepthwiseConv2dNativeBackpropFilter"})
_MATMUL = frozenset({"MatMul", "_FusedMatMul", "_MklMatMul", "_MklNativeFusedMatMul", "BatchMatMul",
                     "BatchMatMulV2", "BatchMatMulV3", "Einsum"})



def _elements(t: Tensor) -> Affine:
    size = dtype_size(t.dtype) or 4
    return t.fixed_bytes / size, t.per_sample_bytes / size


def _static_dims(t: Tensor) -> tuple[int, ...] | None:
    if t.shape is None or any(d is None for d in t.shape):
        return None
    return tuple(int(d) for d in t.shape)


def _filter_volume(graph: Graph, op: Op) -> float | None:
    """kh*kw*ci (*kd) of a convolution: the multiply-adds per output element."""
    if op.type in _CONV_FILTER_GRAD:
        dims = _static_dims(graph.tensors[op.outputs[0]]) if op.outputs else None
    else:
        dims = _static_dims(graph.tensors[op.inputs[1]]) if len(op.inputs) > 1 else None
    if not dims or len(dims) < 3:
        return None
    if op.type in _DEPTHWISE:
        return float(math.prod(dims[:-2]))  # kh*kw: one input channel per output element
    return float(math.prod(dims[:-1]))  # kh*kw*ci


def op_flops(graph: Graph, op: Op) -> Affine | None:
    """(fixed, per-sample) FLOPs of a compute-bound op, or ``None`` if it is memory-bound."""
    if op.type in _CONV_FORWARD or op.type in _CONV_INPUT_GRAD or op.type in _CONV_FILTER_GRAD \
            or op.type in _DEPTHWISE:
        volume = _filter_volume(graph, op)
        if volume is None:
            return None
        # the output-gradient (input 2 of the backprops) has the forward output's shape
        ref = op.outputs[0] if op.type in _CONV_FORWARD or op.type == "DepthwiseConv2dNative" \
            else (op.inputs[2] if len(op.inputs) > 2 else None)
        if ref is None:
            return None
        f, p = _elements(graph.tensors[ref])
        return 2 * volume * f, 2 * volume * p
    if op.type in _MATMUL and len(op.inputs) >= 2 and op.outputs:
        a, b, out = (graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]],
                     graph.tensors[op.outputs[0]])
        k = _contraction_size(graph, a, b, out)
        if k is None:
            return None
        f, p = _elements(out)
        return 2 * k * f, 2 * k * p
    return None


def _contraction_size(graph: Graph, a: Tensor, b: Tensor, out: Tensor) -> float | None:
    """K of ``(..., M, K) x (..., K, N)``, from element counts (transposes need no attrs).

    With batch dims ``Ba``, ``Bb``, ``Bo``: ``|a||b| / |out| = K^2 Ba Bb / Bo``.
    """
    batch = graph.batch_size

    def count(t: Tensor) -> float:
        return t.nbytes(batch) / (dtype_size(t.dtype) or 4)

    def lead(t: Tensor) -> float:
        if t.shape is None or len(t.shape) < 2:
            return 1.0
        dims = [batch if d is None else d for d in t.shape[:-2]]
        return float(math.prod(dims)) if dims else 1.0

    ea, eb, eo = count(a), count(b), count(out)
    if min(ea, eb, eo) <= 0:
        return None
    k2 = ea * eb * lead(out) / (eo * lead(a) * lead(b))
    return math.sqrt(k2) if k2 > 0 else None


def op_bytes(graph: Graph, op: Op) -> Affine:
    """(fixed, per-sample) bytes an op reads and writes (each distinct input once)."""
    f = p = 0.0
    for name in (*dict.fromkeys(op.inputs), *op.outputs):
        t = graph.tensors[name]
        f += t.fixed_bytes
        p += t.per_sample_bytes
    return f, p


@dataclass(frozen=True)
class TemporaryRule:
    """Scratch memory of one op type: ``factor x basis`` bytes, live while the op runs.

    Attributes:
        factor: multiplier of the basis.
        basis: what the scratch is proportional to:
            ``"output"``: the op's outputs;
            ``"input<i>"``: its data input ``i`` (e.g. ``"input1"``);
            ``"conv_filter_col"``: the patch matrix (im2col) of a filter
            gradient, batched in shards of images sized to a ``working_set``
            (TF's CPU ``Conv2DCustomBackpropFilterOp``:
            ``shard = ceil(working_set / (P*F + P*Co + F*Co))`` images of
            ``P*F`` elements, P = output positions, F = kh*kw*ci; the shard is
            not capped by the batch, so the buffer does not grow with it);
            ``"conv_input_col"``: one image's patch matrix, ``P*F`` elements
            (TF's CPU ``Conv2DCustomBackpropInputOp`` with parallel contraction).
        working_set: elements per shard for ``"conv_filter_col"``.
        provenance: where the rule comes from.
    """

    factor: float
    basis: str = "output"
    working_set: int = 0
    provenance: str = ""

    def __post_init__(self) -> None:
        ok = self.basis in ("output", "conv_filter_col", "conv_input_col") or (
            self.basis.startswith("input") and self.basis[5:].isdigit())
        if not ok:
            raise ValueError(f"TemporaryRule.basis={self.basis!r}: allowed 'output', 'input<i>', "
                             "'conv_filter_col', 'conv_input_col'")
        if self.factor < 0:
            raise ValueError(f"TemporaryRule.factor={self.factor!r}: must be >= 0")
        if self.basis == "conv_filter_col" and self.working_set <= 0:
            raise ValueError("TemporaryRule.working_set must be > 0 for basis 'conv_filter_col'")


@dataclass(frozen=True)
class TemporaryModel:
    """Per-op-type temporaries (op types not listed have none), plus copy-on-write.

    Attributes:
        name: label.
        rules: op type -> rule.
        copy_on_write: model TF's copy of a variable that is updated
            (``Assign*VariableOp``) while a read of it (``ReadVariableOp``)
            is still to be consumed: the update writes a fresh copy, and the
            old buffer lives until that read's last reader ran.
        notes: free text.
    """

    name: str
    rules: Mapping[str, TemporaryRule] = field(default_factory=dict)
    copy_on_write: bool = False
    notes: str = ""

    def rule(self, op_type: str) -> TemporaryRule | None:
        return self.rules.get(op_type)


NO_TEMPORARIES = TemporaryModel("none", {}, notes="plain liveness: outputs and inputs only")


def _rules(types: Iterable[str], rule: TemporaryRule) -> dict[str, TemporaryRule]:
    return {t: rule for t in types}


_SRC = ("TF 2.21 CPU kernels (oneDNN off), read from allocate_temp calls in the kernels and checked "
        "against tf.profiler memory traces (region_type=temp) of cnn_bn and ResNet-50 steps; "
        "see benchmarks/simulator_accuracy.py")
CPU_TEMPORARIES = TemporaryModel(
    "tf-cpu-eigen",
    {
        # col_buffer [shard, P, F] with the working set 30 MiB of float32 (TF's constant)
        **_rules(("Conv2DBackpropFilter", "Conv2DBackpropFilterV2"),
                 TemporaryRule(1.0, "conv_filter_col", working_set=(30 << 20) // 4, provenance=_SRC)),
        # col_buffer [1, P, F]
        **_rules(("Conv2DBackpropInput", "Conv2DBackpropInputV2"),
                 TemporaryRule(1.0, "conv_input_col", provenance=_SRC)),
        # a copy of the forward output (float) and an int64 argmax of the same shape: 3x for float32
        "MaxPoolGrad": TemporaryRule(3.0, "input1", provenance=_SRC),
        # reductions keep an output-sized accumulator
        **_rules(("Mean", "Sum", "Prod", "Max", "Min"), TemporaryRule(1.0, "output", provenance=_SRC)),
    },
    copy_on_write=True,
    notes="CPU (Eigen) kernels; GPU temporaries (cuDNN workspace) are not calibrated here.",
)


# oneDNN's kernels (TF's CPU default on AVX-512 / AMX machines, and what the tuner's CPU workers run) take
# their scratch from a primitive-owned scratchpad or a few KiB of temporaries: measured with tf.profiler
# (allocations with region_type=temp) over cnn_bn, residual and ResNet-50 64x64 steps, TF 2.21, oneDNN on:
# at most 0.12 MiB per op, none for the convolution gradients (Eigen's filter gradient takes a 30 MiB
# patch buffer). With this model the simulated live bytes of the 22 accuracy cases pinned whole came within
# 1.3% of the requested bytes measured (benchmarks/simulator_accuracy.py --schedule-rows).
ONEDNN_TEMPORARIES = TemporaryModel(
    "tf-cpu-onednn", {}, copy_on_write=True,
    notes="CPU oneDNN kernels: scratch of at most 0.12 MiB per op measured, not modelled; Eigen's "
          "(oneDNN off) temporaries are CPU_TEMPORARIES.",
)


GPU_TEMPORARIES = TemporaryModel(
    "tf-gpu", {}, copy_on_write=True,
    notes="GPU kernels: cuDNN workspaces are not modelled (TF sizes them to the memory left); only "
          "the copy of a variable updated while still read. Not calibrated (no GPU here).",
)
# DeviceProfile.kernels -> the scratch model: the CPU profile is the emulated device, which runs oneDNN
TEMPORARIES: Mapping[str, TemporaryModel] = {"cpu": ONEDNN_TEMPORARIES, "cpu-eigen": CPU_TEMPORARIES,
                                             "gpu": GPU_TEMPORARIES}


def op_temporary(graph: Graph, op: Op, model: TemporaryModel) -> tuple[float, float]:
    """(fixed, per-sample) temporary bytes of `op` under `model`."""
    rule = model.rule(op.type)
    if rule is None or rule.factor == 0:
        return 0.0, 0.0
    basis = rule.basis
    if basis == "output":
        f = sum(graph.tensors[t].fixed_bytes for t in op.outputs)
        p = sum(graph.tensors[t].per_sample_bytes for t in op.outputs)
        return rule.factor * f, rule.factor * p
    if basis.startswith("input"):
        i = int(basis[5:])
        if i >= len(op.inputs):
            return 0.0, 0.0
        t = graph.tensors[op.inputs[i]]
        return rule.factor * t.fixed_bytes, rule.factor * t.per_sample_bytes
    conv = _conv_geometry(graph, op)
    if conv is None:
        return 0.0, 0.0
    positions, patch, out_channels, itemsize = conv
    per_image = positions * patch
    if basis == "conv_input_col":
        return rule.factor * per_image * itemsize, 0.0
    work = per_image + positions * out_channels + patch * out_channels
    shard = -(-rule.working_set // work) if work else 1
    return rule.factor * shard * per_image * itemsize, 0.0


def _conv_geometry(graph: Graph, op: Op) -> tuple[float, float, int, int] | None:
    """(output positions per image P, patch size F = kh*kw*ci, out channels, itemsize) of a conv gradient."""
    if len(op.inputs) < 3:
        return None
    grad = graph.tensors[op.inputs[2]]  # the output gradient: [N, Ho, Wo, Co] (NHWC)
    filt = _static_dims(graph.tensors[op.outputs[0]]) if op.type in _CONV_FILTER_GRAD and op.outputs \
        else _static_dims(graph.tensors[op.inputs[1]])
    if not filt or len(filt) != 4 or not grad.shape or not grad.shape[-1]:
        return None
    out_channels = int(filt[-1])
    itemsize = dtype_size(grad.dtype) or 4
    per_sample = grad.per_sample_bytes or grad.fixed_bytes  # one image's output gradient
    if grad.per_sample_bytes == 0 and grad.shape and grad.shape[0]:
        per_sample = grad.fixed_bytes // int(grad.shape[0])
    positions = per_sample / itemsize / out_channels
    return positions, float(math.prod(filt[:-1])), out_channels, itemsize
