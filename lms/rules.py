"""What Grappler and oneDNN do to a step, as rules over the graph model: the planners and the schedule
follow them. No TensorFlow.

Below `lms.plan` and `lms.schedule`, above `lms.graph` only: every rule about TensorFlow's own rewrites lives
here, once. Without LMS, TensorFlow's graph optimizer (Grappler) rewrites the step before
running it; the rewritten arithmetic is what "bitwise identical" means. An op
LMS inserts changes a rewrite in three ways, one rule each:

- **A control edge on an inner node** (a swap-in's trigger, an ordering pin): `REWRITABLE_TYPES`,
  `safe_trigger`, `may_vanish`, `static_ops` and oneDNN's `merged_pairs` say which ops may carry one;
  `lms.plan.anchor` keeps triggers off the others and chooses the ops a schedule may pin.
- **A swap-in between two ops that a rewrite reads as one** (`hides_rewrite`):
  some rewrites look through the producer of a consumer's input whatever else
  reads it -- ``MatMul(Transpose(x), y)`` becomes ``MatMul(x, y,
  transpose_a=True)`` (`LOOK_THROUGH`). A swap-in on that edge hides the
  ``Transpose``, so the consumer reads the swapped-in copy of the transposed
  tensor and computes with another kernel. A tensor whose only reader is one
  backward op folds into it (`folds_into`) as long as nothing else reads it.
- **A recompute clone that changes how many ops read an op**
  (`recompute_changes_readers`): the arithmetic optimizer folds an op with
  exactly one reader into that reader (``(0.5 * x) * erfc(..)`` is reassociated
  once the backward pass no longer reads ``0.5 * x``), so an original whose
  backward readers move to the clone, or a clone read by one op where the
  original was read by several, is rewritten differently (GELU in a ViT's MLP).

The rules are conservative where it is cheap and incomplete by nature: the
equivalence check (`lms.tf.equivalence`) compares what Grappler makes of the
step with and without LMS and undoes whatever a rule missed.
"""

from __future__ import annotations

from .graph import Graph

__all__ = ["LOOK_THROUGH", "ONEDNN_WORKSPACE", "folds_into", "hides_rewrite", "recompute_changes_readers",
           "REWRITABLE_TYPES", "MERGED_SIBLING_TYPES", "CONSTANT_TYPES", "UNPINNABLE_TYPES", "merged_pairs",
           "static_ops", "may_vanish", "safe_trigger", "live_reader_count"]

# (producer type, consumer type): rewrites of the consumer that read through the producer, whatever
# else reads the producer (Grappler's arithmetic optimizer stages in parentheses).
LOOK_THROUGH = frozenset({
    *((t, m) for t in ("Transpose", "ConjugateTranspose")
      for m in ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")),  # FoldTransposeIntoMatMul
    ("Conj", "Transpose"),  # FoldConjugateIntoTranspose
    ("Transpose", "Transpose"),  # RemoveIdentityTranspose
    ("Neg", "Add"), ("Neg", "AddV2"), ("Neg", "Sub"),  # RemoveNegation
    ("Neg", "Neg"), ("Reciprocal", "Reciprocal"), ("Conj", "Conj"), ("LogicalNot", "LogicalNot"),  # RemoveInvolution
    ("Reshape", "Reshape"),  # RemoveRedundantReshape
    ("Cast", "Cast"), ("Bitcast", "Bitcast"),  # RemoveRedundantCast / Bitcast
    ("Sqrt", "RealDiv"), ("Sqrt", "Div"),  # SqrtDivToRsqrtMul
    ("Softmax", "Log"),  # LogSoftmax
    ("Exp", "Sub"),  # ConvertExpm1
    ("Add", "Log"), ("AddV2", "Log"),  # ConvertLog1p
    ("Sub", "Square"),  # FuseSquaredDiff
})

# Associative arithmetic: the add-chain, broadcast-minimising, common-factor and constant push-down
# rewrites reassociate a tree of these through inner nodes with one reader.
_ARITHMETIC = frozenset({"Add", "AddV2", "AddN", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "Neg",
                         "Reciprocal"})
# Element-wise unary ops: a chain of them with one reader each becomes one _UnaryOpsComposition.
_UNARY = frozenset({"Abs", "Ceil", "Cos", "Elu", "Erf", "Erfc", "Exp", "Floor", "Log", "Log1p", "Neg",
                    "Reciprocal", "Relu", "Relu6", "Rint", "Round", "Rsqrt", "Selu", "Sigmoid", "Sin",
                    "Softplus", "Sqrt", "Square", "Tan", "Tanh"})
# Remapper fusions (and the oneDNN ones that follow them): producer -> the op it is fused into.
_FUSED = frozenset({
    *((c, b) for c in ("Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul", "BatchMatMul", "BatchMatMulV2",
                       "BatchMatMulV3", "Einsum") for b in ("BiasAdd", "Add", "AddV2")),
    *(("BiasAdd", a) for a in ("Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid", "Add", "AddV2", "Mul",
                               "Erf", "Erfc", "Pow")),
    *((n, a) for n in ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
      for a in ("Relu", "Relu6", "Elu", "LeakyRelu", "Add", "AddV2")),
    ("Sigmoid", "Mul"), ("Tanh", "Mul"), ("Softplus", "Tanh"), ("Erf", "AddV2"), ("Erfc", "Mul"),
    ("Pow", "Mul"), ("Rsqrt", "Mul"), ("Mean", "Sub"), ("SquaredDifference", "Mean"),
    ("Mul", "Conv2D"), ("Cast", "Mul"),
})


# OptimizeMaxOrMinOfMonotonic: max(f(x)) -> f(max(x)) for a monotonic f with one reader (a ReLU before a
# MaxPool is applied to the pooled values instead: the same values, other ops).
_MONOTONIC = frozenset({"Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Sigmoid", "Tanh", "Exp", "Log", "Log1p",
                        "Sqrt", "Softplus", "Floor", "Ceil", "Rint", "Round", "Cast", "Erf", "Asinh", "Atan"})
_MAX_LIKE = frozenset({"Max", "Min", "ArgMax", "ArgMin", "MaxPool", "MaxPoolV2", "MaxPool3D"})


def folds_into(producer_type: str, reader_type: str) -> bool:
    """Can Grappler fold an op of `producer_type` into its only reader, of `reader_type`?"""
    return ((producer_type in _ARITHMETIC and reader_type in _ARITHMETIC)
            or (producer_type in _UNARY and reader_type in _UNARY)
            or (producer_type in _MONOTONIC and reader_type in _MAX_LIKE)
            or (producer_type, reader_type) in _FUSED or (producer_type, reader_type) in LOOK_THROUGH)


# (forward, backward) pairs whose kernels oneDNN's layout pass links by the edge between them: the backward
# op's oneDNN kernel reads the forward op's workspace (the pooling's argmax), found through its direct edge
# from the forward op's output. Read through a swap-in, the backward op runs TF's own kernel, which picks
# another argmax among equal values in overlapping windows: other gradients (issue 55's distillation).
ONEDNN_WORKSPACE = frozenset({("MaxPool", "MaxPoolGrad"), ("MaxPoolV2", "MaxPoolGradV2"),
                              ("MaxPool3D", "MaxPool3DGrad")})


def hides_rewrite(graph: Graph, tensor: str, consumer: str, *, kernels: str = "cpu") -> str:
    """Why a swap-in of `tensor` for `consumer` would change Grappler's rewrite of `consumer` ('' if not).

    A consumer that reads through the tensor's producer (`LOOK_THROUGH`), the
    tensor's only reader, into which Grappler folds the producer (`folds_into`),
    or, on CPU `kernels`, a backward op whose oneDNN kernel needs its direct edge
    from the producer (`ONEDNN_WORKSPACE`). A GPU's pooling gradient recomputes
    its argmax from the values it is given, so there the swap-in changes nothing.
    """
    producer = graph.producer(tensor)
    reader = graph.ops[consumer]
    if (producer.type, reader.type) in LOOK_THROUGH:
        return f"Grappler reads {reader.type} {consumer!r} through its {producer.type} input"
    if kernels == "cpu" and (producer.type, reader.type) in ONEDNN_WORKSPACE:
        return (f"oneDNN's {reader.type} {consumer!r} reads the {producer.type}'s workspace through this edge "
                "(through a swap-in it runs another kernel)")
    readers = graph.live_readers(tensor)
    if readers == (consumer,) and folds_into(producer.type, reader.type):
        return f"Grappler folds this {producer.type} into its only reader, {reader.type} {consumer!r}"
    return ""


def recompute_changes_readers(graph: Graph, tensor: str, chain: list[str], consumers: tuple[str, ...]) -> str:
    """Why rebuilding `tensor` by cloning `chain` for `consumers` would change a Grappler rewrite ('' if not).

    Grappler folds an op with one reader into that reader. Rerouting the
    consumers leaves the tensor's producer with its other readers only, and a
    clone is read by the consumers (the last clone) or by the next clones only:
    where an op and its stand-in fall on different sides of "one reader" and
    the op could be folded into that one reader (`folds_into`), the graph with
    the clones is rewritten differently from the graph without.
    """
    producer = graph.producer(tensor).name
    in_chain = set(chain)
    for name in chain:
        op = graph.ops[name]
        readers = {c for t in op.outputs for c in graph.live_readers(t)}
        clone_readers = {c for c in readers if c in in_chain}
        if name == producer:
            clone_readers |= set(consumers)
            kept = readers - set(consumers)  # the original keeps its other readers
            if len(readers) > 1 and len(kept) == 1:
                (only,) = kept
                if folds_into(op.type, graph.ops[only].type):
                    return (f"{op.type} {name!r} would keep one reader, {graph.ops[only].type} {only!r}, which "
                            "Grappler folds it into")
        if len(readers) > 1 and len(clone_readers) == 1:
            (only,) = clone_readers
            if folds_into(op.type, graph.ops[only].type):
                return (f"the clone of {op.type} {name!r} would have one reader, {graph.ops[only].type} "
                        f"{only!r}, which Grappler folds it into (the original has {len(readers)})")
    return ""


# ---- control edges: which ops may carry one (swap-in triggers, ordering pins) -------------------------------

# Op types Grappler may fold into a rewrite as an inner node (remapper fusions such as
# Conv2D+BiasAdd+Add+Relu or Keras' unfused batch norm -> FusedBatchNorm, the arithmetic
# optimizer's add-chain, broadcast and factor rewrites, layout and cast rewrites).
# Gradient kernels (ReluGrad, Conv2DBackprop*, MaxPoolGrad, ...) are not among them.
REWRITABLE_TYPES = frozenset({
    "Add", "AddV2", "AddN", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "Neg", "Square", "Sqrt",
    "Rsqrt", "Reciprocal", "SquaredDifference", "Maximum", "Minimum", "Pow", "Exp", "Log", "Log1p",
    "Cast", "BiasAdd", "Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul", "BatchMatMul",
    "BatchMatMulV2", "BatchMatMulV3", "Einsum", "FusedBatchNorm", "FusedBatchNormV2",
    "FusedBatchNormV3", "Pad", "Reshape", "Transpose", "Squeeze", "ExpandDims", "Identity", "Relu",
    "Relu6", "Elu", "Selu", "LeakyRelu", "Sigmoid", "Tanh", "Softplus", "Softmax", "LogSoftmax",
    "Mean", "Sum",
})

# oneDNN's graph pass (MklLayoutRewritePass, run when a function is instantiated, after Grappler)
# merges these sibling pairs -- two ops reading the same tensor -- into one op
# (_MklConv2DBackpropFilterWithBias). A path between the two through a pin closes a cycle once
# merged: TF refuses to run the step ("N nodes in a cycle").
MERGED_SIBLING_TYPES = (("Conv2DBackpropFilter", "BiasAddGrad"), ("Conv3DBackpropFilterV2", "BiasAddGrad"))
CONSTANT_TYPES = frozenset({"Const", "HostConst", "Shape", "ShapeN", "Size", "Rank"})
# Never pinned either: identities and views (Grappler bypasses or removes them), shape reads and
# resident values (folded into constants), control-flow and stateless sources.
UNPINNABLE_TYPES = frozenset({
    "Identity", "IdentityN", "NoOp", "Const", "HostConst", "Placeholder", "PlaceholderWithDefault", "_Arg",
    "VarHandleOp", "ReadVariableOp", "Shape", "ShapeN", "Size", "Rank", "VariableShape", "StopGradient",
    "PreventGradient", "EnsureShape", "CheckNumerics", "CheckNumericsV2", "Bitcast", "Switch", "Merge",
    "Enter", "Exit", "NextIteration", "LoopCond", "While", "StatelessWhile", "If", "StatelessIf",
    "PartitionedCall", "StatefulPartitionedCall",
})


def live_reader_count(graph: Graph, op: str) -> int:
    """Readers of `op`'s outputs that TensorFlow runs (a pruned reader does not count: Grappler folds
    ``mul_1`` of ``mul_1 / 10`` into the division once the gradient of the constant 10 is gone)."""
    return len({c for t in graph.ops[op].outputs for c in graph.live_readers(t)})


def safe_trigger(graph: Graph, op: str) -> bool:
    """A control edge from `op` cannot change a Grappler rewrite."""
    o = graph.ops[op]
    return (o.type not in REWRITABLE_TYPES or live_reader_count(graph, op) != 1
            or bool(graph.control_outputs(op)))


def merged_pairs(graph: Graph) -> tuple[tuple[str, str], ...]:
    """Sibling pairs ``(a, b)`` that oneDNN merges into one op (`MERGED_SIBLING_TYPES`).

    ``a`` and ``b`` read the same tensor (``b`` has no other input); the merged op
    runs after every input of both.
    """
    pairs: list[tuple[str, str]] = []
    for a_type, b_type in MERGED_SIBLING_TYPES:
        for op in graph.ops.values():
            if op.type != b_type or len(op.inputs) != 1:
                continue
            mates = [c for c in graph.data_consumers(op.inputs[0]) if graph.ops[c].type == a_type]
            if mates:
                pairs.append((mates[0], op.name))
    return tuple(pairs)


def static_ops(graph: Graph) -> set[str]:
    """Ops computed from constants and shapes only: Grappler's constant folding replaces them."""
    static: set[str] = set()
    for name in graph.topological_order:
        op = graph.ops[name]
        if op.type in CONSTANT_TYPES or (op.inputs and all(p in static for p in op.input_ops)):
            static.add(name)
    return static


# Ops Grappler often removes or merges into another (`may_vanish`): a control edge from one moves to
# another op (seen on cnn_bn and ResNet-50: the swap-in came in at another time).
_VANISHING_TYPES = frozenset({"Neg"})
_VIEW_TYPES = frozenset({"Reshape", "Squeeze", "ExpandDims"})
_REDUCTION_TYPES = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "BiasAddGrad"})


def may_vanish(graph: Graph, op) -> bool:  # noqa: ANN001
    """An op Grappler may remove or merge into another (its control edges would move).

    A negation (``x + -y`` -> ``x - y``; equal ones deduplicated), and a view of
    a view or of a reduction: Grappler collapses ``Reshape(Reshape(x))`` and
    reshapes of ``Sum``s (a bias gradient's, two branches' equal ones). Seen on
    ResNet-50: all such triggers moved; views of other ops (BatchNorm's ``gamma``
    gradient) stayed.
    """
    if op.type in _VANISHING_TYPES:
        return True
    if op.type not in _VIEW_TYPES or not op.inputs:
        return False
    return graph.producer(op.inputs[0]).type in _VIEW_TYPES | _REDUCTION_TYPES
