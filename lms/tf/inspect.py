"""`lms.inspect`: what LMS will do to a step on a given GPU, asked from any machine. TensorFlow.

Traces the step with `lms.function` under a virtual cluster of that GPU
(`lms.tf.grappler.virtual_target`): the plan, the equivalence check and TF's
Grappler run as they would on the GPU, nothing runs::

    rec = lms.inspect(train_step, x, y, config=lms.LMSConfig(n_tensors=-1, lb=1), device="V100-16GB")
    rec.n_planned, rec.n_swapped, rec.corrections       # what the plan swaps, what survives the check
    rec.transposes_at_swaps, rec.predicted_transposes_at_swaps

The record's figures are Grappler's decisions for that device (which ops run in
NCHW, where ``Transpose`` nodes go, which swaps the check keeps), not timings or
memory: those are the simulator's (`lms.simulate`) or a run's on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import tensorflow as tf

from ..config import LMSConfig
from ..machine.devices import get_device
from ..plan import plan_swaps, rewrite_graph
from ..sim.interpreter import layout_transposes_on
from ..sim.layout import nchw_tensors, swap_transposes, transposed_rank
from .corrections import Correction
from .equivalence import optimized_graph_def
from .graphdefs import is_swap_op_name
from .grappler import using_target, virtual_target

__all__ = ["Inspection", "inspect", "transposes_at_swaps"]


@dataclass(frozen=True)
class Inspection:
    """What LMS does to one step on one device (`inspect`).

    Attributes:
        device: the device profile's name.
        config: the `LMSConfig` traced with.
        n_planned: tensors the config's plan swaps or recomputes, before the equivalence check.
        n_swapped: tensors swapped after the check.
        n_recomputed: tensors recomputed after the check.
        corrections: what the check changed (triggers moved, swap-ins or recomputes dropped).
        optimized_graph: the ``GraphDef`` Grappler makes of the rewritten step for the device.
        nchw_ops: ops the layout optimizer runs in NCHW (0 where it converts nothing).
        swap_ops_on_host: every swap op in the optimized graph is placed on the host.
        transposes_at_swaps: ``Transpose`` nodes in it that feed a swap-out or read a swap-in.
        predicted_transposes_at_swaps: the simulator's count of the same (`lms.sim.layout`).
        transposed_swap_ops: the swap ops (by name) with a ``Transpose`` beside them in the optimized graph.
        predicted_transposed_swap_ops: the swap ops the simulator gives one (`lms.sim.layout.swap_transposes`).
        note: the trace's note (`LMSSummary.note`), e.g. "LMS did nothing" when the check dropped the whole plan.
    """

    device: str
    config: LMSConfig
    n_planned: int
    n_swapped: int
    n_recomputed: int
    corrections: tuple[Correction, ...]
    optimized_graph: Any
    nchw_ops: int
    swap_ops_on_host: bool
    transposes_at_swaps: int
    predicted_transposes_at_swaps: int
    transposed_swap_ops: frozenset[str] = frozenset()
    predicted_transposed_swap_ops: frozenset[str] = frozenset()
    note: str = ""


def inspect(step: Callable, *example_args: Any, config: LMSConfig, device: str = "V100-16GB",
            **example_kwargs: Any) -> Inspection:
    """Trace `step` with LMS for `device` and return what its GPU would run (nothing is run).

    Args:
        step: the training step, undecorated (as given to `lms.function`).
        *example_args, **example_kwargs: its arguments: tensors, arrays or ``tf.TensorSpec``s.
        config: the `LMSConfig` (an explicit config; ``"auto"`` needs a real device's budget).
        device: a device profile name (`lms.machine.devices.DEVICES`), ``"cpu"`` too.

    Returns:
        `Inspection`.
    """
    from .function import LMSFunction

    if not isinstance(config, LMSConfig):
        raise ValueError(f"lms.inspect: config={config!r}: give an LMSConfig (config='auto' chooses with a real "
                         "device's memory; inspect its choice with lms.function(...).config)")
    profile = get_device(device)
    target = virtual_target(profile)
    fn = LMSFunction(step, config=config, emulate=False, device=target.compute_device, pin_whole=False)
    with using_target(target):
        concrete = fn.get_concrete_function(*example_args, **example_kwargs)
        optimized = optimized_graph_def(concrete.graph, outputs=concrete.graph.outputs, target=target)
    model, plan, summary = fn.graph, fn.plan, fn.summary
    planned = plan_swaps(model, config, kernels=profile.kernels) if model is not None else plan
    nodes = _nodes(optimized)
    transposes, beside = _transposes_at_swaps(nodes)
    predicted: dict[str, int] = {}
    if model is not None and layout_transposes_on(model, profile):
        rewritten = rewrite_graph(model, plan)
        ranks = transposed_rank(model)
        predicted = swap_transposes(rewritten, ranks, nchw_tensors(rewritten, ranks))
    return Inspection(
        device=profile.name, config=config, n_planned=planned.n_swapped + planned.n_recomputed,
        n_swapped=plan.n_swapped, n_recomputed=plan.n_recomputed, corrections=tuple(summary.corrections),
        optimized_graph=optimized,
        nchw_ops=sum(1 for n in nodes if n.attr["data_format"].s in (b"NCHW", b"NCDHW")),
        swap_ops_on_host=all(n.device.endswith("CPU:0") for n in nodes
                             if is_swap_op_name(n.name) and not n.name.endswith("-LayoutOptimizer")),
        transposes_at_swaps=transposes, predicted_transposes_at_swaps=sum(predicted.values()),
        transposed_swap_ops=frozenset(beside), predicted_transposed_swap_ops=frozenset(predicted), note=summary.note)


def transposes_at_swaps(nodes: Any) -> int:
    """``Transpose`` nodes that feed a swap-out or read a swap-in, in an optimized graph's nodes."""
    return _transposes_at_swaps(list(nodes))[0]


def _transposes_at_swaps(nodes: list[Any]) -> tuple[int, set[str]]:
    """(``Transpose`` nodes beside swap ops, the swap ops beside one)."""
    transposes = {n.name for n in nodes if n.op == "Transpose"}
    count, beside = 0, set()
    for n in nodes:
        source = n.input[0].split(":")[0] if n.input else ""
        if n.name.startswith("lms/swap_out/") and source in transposes:
            count += 1
            beside.add(n.name)
        elif n.op == "Transpose" and "-lms_swap_in_" in source and is_swap_op_name(source):
            count += 1
            beside.add(source)
    return count, beside


def _nodes(graph_def: Any) -> list[Any]:
    return list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
