"""`find_candidates(graph, config)`: the tensors a plan may swap (or recompute), and why others are skipped.

No TensorFlow. The rules (as in TFLMS) are in `lms.plan.swap_planner`'s docstring;
both planners (`lms.plan.swap_planner`, `lms.plan.recompute_planner`) start from these candidates.
"""

from __future__ import annotations

import logging
from typing import Iterable

from ..config import LMSConfig
from ..graph import Graph, Role
from .verdicts import Skip

__all__ = ["find_candidates", "SKIPPED_PRODUCER_TYPES", "LOOP_ACCUMULATOR_REASON", "rejection"]

log = logging.getLogger(__name__)

# Producers whose outputs TFLMS never swapped: inputs, constants, variable reads,
# views and cheap fills. Swapping them moves bytes for nothing.
SKIPPED_PRODUCER_TYPES = frozenset({
    "Const", "Identity", "IdentityN", "Reshape", "Shape", "ShapeN", "Size", "Rank",
    "Placeholder", "PlaceholderWithDefault", "VarHandleOp", "ReadVariableOp",
    "VarIsInitializedOp", "VariableShape", "Variable", "VariableV2", "Read",
    "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "ResourceGather",
    "Fill", "Range", "RandomUniform", "ZerosLike", "OnesLike", "StopGradient",
    "Squeeze", "ExpandDims", "NoOp", "_Arg", "_Retval",
})


def find_candidates(graph: Graph, config: LMSConfig) -> tuple[list[str], list[Skip]]:
    """Forward tensors read by backward ops that the config allows, in forward order.

    Returns:
        (candidate tensor names, skipped tensors with reasons).
    """
    _warn_unmatched_filters(graph, config)
    candidates: list[str] = []
    skipped: list[Skip] = []
    for op_name in graph.topological_order:
        op = graph.ops[op_name]
        if op.role is not Role.FORWARD:
            continue
        for t in op.outputs:
            readers = graph.data_consumers(t)
            if not any(graph.ops[r].role is Role.BACKWARD for r in readers):
                continue
            if not any(graph.ops[r].role is Role.BACKWARD for r in graph.live_readers(t)):
                skipped.append(Skip(t, "read only by backward ops TensorFlow prunes (nothing uses their results, "
                                       "e.g. a frozen layer's gradient)"))
                continue
            reason = rejection(graph, config, t, graph.live_readers(t))
            if reason:
                skipped.append(Skip(t, reason))
            else:
                candidates.append(t)
    return candidates, skipped


_WARNED: set[tuple[str, str, tuple[str, ...]]] = set()


def _warn_unmatched_filters(graph: Graph, config: LMSConfig) -> None:
    """Warn (once per graph and filter) about scopes and op types of the config that name no op of `graph`.

    A config tuned for another model names that model's scopes: with ``incl_scopes`` it would
    swap nothing here, silently (and an ``excl_scopes`` entry would protect nothing).
    """
    for field in ("incl_scopes", "excl_scopes", "incl_types", "excl_types"):
        wanted = tuple(getattr(config, field))
        if not wanted or (graph.name, field, wanted) in _WARNED:
            continue
        if field.endswith("scopes"):
            unmatched = [s for s in wanted if not any(_in_scopes(op.name, (s,)) for op in graph.ops.values())]
        else:
            types = {op.type for op in graph.ops.values()}
            unmatched = [t for t in wanted if t not in types]
        _WARNED.add((graph.name, field, wanted))
        if unmatched:
            effect = ("nothing is swapped" if len(unmatched) == len(wanted) and field.startswith("incl")
                      else "they have no effect")
            log.warning("LMS config %s %s name no op of graph %r: %s (a config made for another model?)", field,
                        ", ".join(repr(u) for u in unmatched), graph.name, effect)


# A recurrent layer (Keras' LSTM, GRU, SimpleRNN without cuDNN) runs a While loop that keeps the activations of
# every step for the backward loop in TensorLists: variant tensors, whose contents a graph rewrite outside the
# loop cannot move (an emulated swap op cannot copy a variant; a device identity copies the list, not its storage).
LOOP_ACCUMULATOR_REASON = ("a While loop's accumulator (a recurrent layer's activations of every step, one "
                           "TensorList): graph rewriting outside the loop cannot swap it")
_LOOP_TYPES = frozenset({"While", "StatelessWhile"})


def rejection(graph: Graph, config: LMSConfig, tensor: str, readers: Iterable[str]) -> str:
    op = graph.producer(tensor)
    spec = graph.tensors[tensor]
    if op.type in _LOOP_TYPES and spec.dtype == "variant":
        return LOOP_ACCUMULATOR_REASON
    if op.type in SKIPPED_PRODUCER_TYPES and not _view_holds_its_source(graph, tensor):
        return f"producer type {op.type} is not worth swapping"
    if spec.rank is None or spec.rank <= 1:
        return "rank <= 1 or unknown rank"
    if graph.tensor_bytes(tensor) == 0:
        return "empty tensor"
    if config.incl_scopes and not _in_scopes(op.name, config.incl_scopes):
        return "not in incl_scopes"
    if config.incl_types and op.type not in config.incl_types:
        return "not in incl_types"
    if _in_scopes(op.name, config.excl_scopes):
        return "in excl_scopes"
    if op.type in config.excl_types:
        return "in excl_types"
    for r in readers:
        if graph.ops[r].role is Role.OTHER:
            return f"also read by non-gradient op {r!r}, which keeps it on the device"
    return ""


# Views: their output is their input's buffer (as `lms.schedule` and `lms.sim.compiled` model them).
_VIEW_TYPES = frozenset({"Reshape", "Identity", "Squeeze", "ExpandDims"})


def _view_holds_its_source(graph: Graph, tensor: str) -> bool:
    """True when `tensor` is a view of a computed forward tensor that the backward pass reads only through views.

    Keras's ``Dense`` on a 3-D input reshapes a ``Transpose`` (``Tensordot``) and
    its gradient reads the reshaped tensor: the view is the only thing that holds
    the transpose's buffer into the backward pass (GPT-2 small at seq 2048: 31 MiB
    per sample and layer). Swapping the view frees it. A view of a tensor the
    backward pass also reads directly is not: that tensor is a candidate itself.
    """
    t = tensor
    while True:
        op = graph.producer(t)
        if op.type not in _VIEW_TYPES or not op.inputs:
            break
        t = op.inputs[0]
        if any(graph.ops[r].role is Role.BACKWARD for r in graph.live_readers(t)):
            return False  # the source is read by the backward pass itself (a candidate of its own)
    src = graph.producer(t)
    return t != tensor and src.role is Role.FORWARD and src.type not in SKIPPED_PRODUCER_TYPES


def _in_scopes(name: str, scopes: Iterable[str]) -> bool:
    return any(name == s.rstrip("/") or name.startswith(s.rstrip("/") + "/") for s in scopes)
