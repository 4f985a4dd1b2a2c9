"""Op-type facts the planners and models share: views, resident values, what is cheap to recompute. No TensorFlow.

Kept in a module of its own (imports nothing) so that `lms.config` can
validate ``LMSConfig.recompute`` with the same sets the recompute planner uses.
"""

from __future__ import annotations

__all__ = ["VIEW_TYPES", "RESIDENT_TYPES", "INPUT_TYPES", "RECOMPUTABLE_TYPES", "RANDOM_TYPES", "STATEFUL_TYPES",
           "ZERO_COST_TYPES", "never_recomputed"]

# Output i is a view of input 0 (or of input i for IdentityN): no new memory.
VIEW_TYPES = frozenset({"Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "StopGradient",
                        "PreventGradient", "EnsureShape", "CheckNumerics", "CheckNumericsV2", "Bitcast"})
# Persistent memory: constants and variables (a variable read is a view of the variable).
RESIDENT_TYPES = frozenset({"Const", "HostConst", "VarHandleOp", "ReadVariableOp", "VariableV2", "Variable"})
# The step's inputs: held by the caller for the whole step.
INPUT_TYPES = frozenset({"Placeholder", "PlaceholderWithDefault", "_Arg"})

# Cheap, deterministic, memory-bound ops: recomputing one costs a pass over its
# tensors (on a GPU ~1 ms per GiB; the host link takes ~100 ms per GiB each way).
# Keras 3's unfused BatchNormalization normalises with Mul/AddV2/Sub by per-channel
# tensors (its mean and variance are tiny), so a BatchNorm output and the Relu after
# it can be rebuilt from the saved BiasAdd output with three or four of these.
RECOMPUTABLE_TYPES = frozenset({
    # unary elementwise
    "Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Sigmoid", "Tanh", "Softplus", "Softsign", "Neg",
    "Abs", "Square", "Sqrt", "Rsqrt", "Reciprocal", "Exp", "Log", "Log1p", "Erf", "Cast",
    # binary elementwise (broadcasting by small per-channel tensors: BatchNorm's normalisation)
    "Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "Maximum", "Minimum",
    "SquaredDifference", "Pow", "BiasAdd",
    # masks: logical and comparison ops, selects, fills of a shape (a causal attention mask is
    # LogicalAnd(Fill(Shape(scores), true), band): rebuilt from a shape and a fixed-size band)
    "LogicalAnd", "LogicalOr", "LogicalNot", "Equal", "NotEqual", "Greater", "GreaterEqual", "Less",
    "LessEqual", "Select", "SelectV2", "Fill", "ZerosLike", "OnesLike",
    # layout / views
    "Pad", "PadV2", "MirrorPad", "Reshape", "Squeeze", "ExpandDims", "Identity", "Transpose",
})

# Ops that draw random numbers: recomputing them would draw again (or, for the
# stateless kinds, depend on a seed read from a variable that the step advances).
RANDOM_TYPES = frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "RandomGamma", "RandomPoisson", "RandomPoissonV2", "RandomShuffle",
    "Multinomial", "StatelessRandomUniform", "StatelessRandomUniformV2", "StatelessRandomNormal",
    "StatelessRandomNormalV2", "StatelessTruncatedNormal", "StatelessTruncatedNormalV2",
    "StatelessRandomUniformInt", "StatelessRandomUniformIntV2", "StatelessRandomUniformFullInt",
    "StatelessRandomUniformFullIntV2", "StatelessMultinomial", "StatelessRandomGetKeyCounter",
    "StatelessRandomGetKeyCounterAlg", "StatelessRandomGetAlg", "RngReadAndSkip", "RngSkip",
    "StatefulUniform", "StatefulUniformInt", "StatefulUniformFullInt", "StatefulStandardNormal",
    "StatefulStandardNormalV2", "StatefulTruncatedNormal", "StatefulRandomBinomial",
})

# Ops with state: a copy in the backward pass would read (or change) state the step
# has changed since the forward pass.
STATEFUL_TYPES = frozenset({
    "VarHandleOp", "ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
    "ResourceGather", "Variable", "VariableV2", "Assign", "AssignAdd", "AssignSub", "Print", "PrintV2",
    "Placeholder", "PlaceholderWithDefault", "_Arg", "_Retval", "StatefulPartitionedCall",
    "PartitionedCall", "Assert", "DeepCopy", "PyFunc", "EagerPyFunc", "PyFuncStateless",
})


def never_recomputed(op_type: str) -> bool:
    """True for random and stateful op types (whatever a config lists)."""
    return (op_type in RANDOM_TYPES or op_type in STATEFUL_TYPES or "Random" in op_type
            or op_type.startswith(("Stateful", "Stateless", "Rng", "Assign", "ResourceApply")))


# Ops that do no device work of their own (views, constants, handles, control).
ZERO_COST_TYPES = frozenset({
    "Const", "NoOp", "Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "StopGradient",
    "PreventGradient", "EnsureShape", "Placeholder", "PlaceholderWithDefault", "_Arg", "_Retval",
    "VarHandleOp", "ReadVariableOp", "Shape", "ShapeN", "Size", "Rank", "VariableShape",
    "BroadcastGradientArgs",
})
