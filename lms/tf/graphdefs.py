"""What TensorFlow built and ran: a step's optimized and executed GraphDefs, and the LMS ops in them.

For tests, benchmarks and the equivalence check: the swap ops (`swap_op_names`) and recompute
clones (`clone_op_names`) that `lms.tf.apply` inserted and Grappler kept, in the graph Grappler
optimized (`optimized_graph_def`) or the partition graphs TF ran (`executed_graph_defs`).
"""

from __future__ import annotations

from typing import Any, Callable

from ..plan.recompute import is_recompute_op_name

__all__ = ["is_swap_op_name", "swap_op_names", "clone_op_names", "optimized_graph_def", "executed_graph_defs",
           "instantiated_function_graphs"]


def is_swap_op_name(name: str) -> bool:
    """True for the name of an inserted swap op (``lms/swap_out/...``, ``...-lms_swap_in_...``, and their parts)."""
    return name.startswith("lms/swap_out/") or "-lms_swap_in_" in name


def swap_op_names(graph_def: Any) -> list[str]:
    """Names of the swap-out and swap-in nodes (`is_swap_op_name`) of a GraphDef (and its library)."""
    names = [n.name for n in graph_def.node]
    for fdef in graph_def.library.function:
        names.extend(n.name for n in fdef.node_def)
    return [n for n in names if is_swap_op_name(n)]


def clone_op_names(graph_def: Any) -> list[str]:
    """Names of the recompute clones and gates (`lms.plan.recompute.is_recompute_op_name`) of a GraphDef (and its library)."""
    names = [n.name for n in graph_def.node]
    for fdef in graph_def.library.function:
        names.extend(n.name for n in fdef.node_def)
    return [n for n in names if is_recompute_op_name(n)]


def optimized_graph_def(concrete_fn: Any) -> Any:
    """The step's GraphDef after Grappler's default optimizations, run offline (nothing executes).

    Runs Grappler's meta optimizer on the concrete function's graph, fetching
    its outputs. The dependency optimizer (which removes plain identities unless
    they carry ``_grappler_do_not_remove``) and the arithmetic and constant
    folding passes run; rewrites that need device placement (e.g. oneDNN
    fusions) do not: for the graph the runtime really ran, use
    `executed_graph_defs`.
    """
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
    from tensorflow.python.grappler import tf_optimizer

    graph = concrete_fn.graph
    meta = meta_graph_pb2.MetaGraphDef(graph_def=graph.as_graph_def())
    fetch = meta.collection_def["train_op"].node_list.value
    for t in graph.outputs:
        fetch.append(t.name)
    config = config_pb2.ConfigProto()
    config.graph_options.rewrite_options.min_graph_nodes = -1  # optimize small graphs too
    return tf_optimizer.OptimizeGraph(config, meta, verbose=False)


def instantiated_function_graphs(fn: Callable, *args: Any, **kwargs: Any) -> list[Any]:
    """Call ``fn(*args, **kwargs)`` once and return TF's record of every function the call instantiated.

    Each record (``RunMetadata.FunctionGraphs``) holds the function's graph before
    and after Grappler and its per-device partition graphs. TensorFlow records a
    function when it instantiates it, so this must be the first call of `fn` for
    these argument types (a fresh `LMSFunction` or ``tf.function``). The call
    runs: a training step updates the weights.

    Raises:
        ValueError: nothing was recorded (the function had already run).
    """
    from tensorflow.python.eager import context

    context.enable_run_metadata()
    try:
        fn(*args, **kwargs)
        metadata = context.export_run_metadata()
    finally:
        context.disable_run_metadata()
    if not metadata.function_graphs:
        raise ValueError("no function graph was recorded: TensorFlow records it when it first "
                         "instantiates a function; pass a function not yet run for these inputs")
    return list(metadata.function_graphs)


def executed_graph_defs(fn: Callable, *args: Any, **kwargs: Any) -> list[Any]:
    """Call ``fn(*args, **kwargs)`` once and return the graphs the runtime ran, after Grappler.

    See `instantiated_function_graphs` (the first call only; the step runs).

    Returns:
        The post-optimization GraphDef of every function instantiated by the call.
    """
    return [g.post_optimization_graph for g in instantiated_function_graphs(fn, *args, **kwargs)]
