"""The training steps of `benchmarks/peers.py`: one per memory-saving method a TensorFlow 2 user has, same workload.

Every method trains the same model (`tuner.models`, random init, the workload's loss and optimizer) with the
standard step (`lms.tf.train.make_train_step`: forward, ``tf.GradientTape``, ``apply_gradients``); what
differs is how the user turns the method on:

- ``plain``: ``tf.function(step)``.
- ``remat_<mode>``: the model built inside ``keras.RematScope(mode=...)`` (Keras reads the mode in each
  layer's ``__init__``; on the TensorFlow backend a rematerialised call is ``tf.recompute_grad(call)``).
  ``list_of_layers`` names the layers `remat_callable_layers` finds (see there).
- ``recompute_grad_stage``: the functional model cut at its stage boundaries (`stage_boundaries`), each
  stage a sub-model (sharing the layers, so the same weights) called through ``tf.recompute_grad``; the
  stem and the head are called plainly.
- ``grappler_recompute``: the plain step with Grappler's memory optimizer set to
  ``RECOMPUTATION_HEURISTICS``, its target scope the one TF2's tape names backward ops with
  (``gradient_tape/``), through TensorFlow's private per-thread call options (`grappler_recompute_on`):
  ``tf.config.optimizer.set_experimental_options`` has no key for it (see `grappler_facts`).
- ``lms_config``: ``lms.function(step, config=...)`` as the tuner's trial worker wraps it.
- ``lms_auto``: ``lms.function(step, config="auto", budget=...)``, traced at the batch it runs.
- ``lms_tuned``: as ``lms_config``, with the config the tuner recommends at the common batch
  (`benchmarks/peer_tuned.py`).

Imports TensorFlow: only the child processes of `benchmarks/peers.py` import this module.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tensorflow as tf

from lms.config import atomic_write_text

__all__ = [
    "Built",
    "StagedRecompute",
    "build",
    "grappler_facts",
    "grappler_recompute_on",
    "recomputed_nodes",
    "remat_callable_layers",
    "stage_boundaries",
]

#: Grappler's recomputation targets: nodes whose name has this scope (its default, "gradients/", is TF1's).
TAPE_SCOPE = "gradient_tape/"


@dataclass
class Built:
    """A method's step, ready to measure: ``fn(x, y) -> loss``, and what it did (for the record)."""

    fn: Callable[..., Any]
    info: dict[str, Any] = field(default_factory=dict)
    summary: Callable[[], dict[str, Any]] = dict


# ---- the model cut into stages ------------------------------------------------------------------------------

def stage_boundaries(model: Any) -> list[str]:
    """Names of the layers whose outputs end the stem and each stage, in order (the head follows the last).

    ResNet-50 (keras.applications): ``pool1_pool`` (the stem), then the last ``conv{k}_block{n}_out`` of
    each stage k = 2..5. The zoo's GPT: ``wpe`` (embeddings), then each block's ``h{i}_add_2``, the last
    block's end being the start of the head (final LayerNorm, tied output). Raises ValueError for other models.
    """
    names = [layer.name for layer in model.layers]
    if "pool1_pool" in names:
        last: dict[str, str] = {}
        for name in names:
            m = re.fullmatch(r"(conv\d)_block\d+_out", name)
            if m:
                last[m.group(1)] = name
        return ["pool1_pool", *last.values()]
    blocks = [n for n in names if re.fullmatch(r"h\d+_add_2", n)]
    if "wpe" in names and blocks:
        return ["wpe", *blocks]
    raise ValueError(f"no stage boundaries known for model {model.name!r}")


def _call(segment: Any, x: Any) -> Any:
    # positional only: tf.recompute_grad in a tf.function refuses keyword arguments (custom_gradient's graph mode)
    return segment(x, training=True)


def segments(model: Any) -> list[Any]:
    """The functional `model` as consecutive sub-models: stem, each stage, head (same layers, same weights)."""
    import keras

    outs = [model.get_layer(n).output for n in stage_boundaries(model)]
    subs, prev = [], model.inputs[0]
    for i, out in enumerate([*outs, model.outputs[0]]):
        subs.append(keras.Model(prev, out, name=f"{model.name}_segment{i}"))
        prev = out
    return subs


def _staged_class() -> type:
    import keras

    class StagedRecompute(keras.Model):
        """`model` run segment by segment, each stage through ``tf.recompute_grad`` (stem and head plainly).

        Its weights are the model's (the segments share its layers), so it trains the same network; a
        ``keras.Model`` so that the tuner's step and the graph extractor take it as they take the model.
        """

        def __init__(self, model: Any, **kwargs: Any) -> None:
            super().__init__(name=f"{model.name}_staged", **kwargs)
            self.segments = segments(model)
            n = len(self.segments)
            self._calls = [functools.partial(_call, s) if i in (0, n - 1)
                           else tf.recompute_grad(functools.partial(_call, s)) for i, s in enumerate(self.segments)]

        def call(self, x: Any, training: Any = None) -> Any:
            for c in self._calls:
                x = c(x)
            return x

    return StagedRecompute


def StagedRecompute(model: Any) -> Any:
    staged = _staged_class()(model)
    staged.build(model.inputs[0].shape)
    return staged


# ---- Keras RematScope ---------------------------------------------------------------------------------------

def remat_callable_layers(model: Any) -> list[str]:
    """Layers Keras can rematerialise inside a ``tf.function`` on the TensorFlow backend.

    Keras wraps ``layer.call`` in ``tf.recompute_grad`` and calls it with the call's keyword arguments;
    custom_gradient's graph mode refuses any (``ValueError: The custom_gradient decorator currently supports
    keywords arguments only when eager execution is enabled``). Keras passes ``training`` (and ``mask``) as
    keywords to layers whose ``call`` declares them (BatchNormalization, Dropout, MultiHeadAttention, the
    functional model itself), plus the keywords the model's graph gives a layer (e.g. ``use_causal_mask``,
    ``reverse=True``). So the list: every layer but the input and those.
    """
    import keras

    names = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        params = inspect.signature(layer.call).parameters
        if "training" in params or "mask" in params:
            continue
        if any(getattr(getattr(node, "arguments", None), "kwargs", None) for node in layer._inbound_nodes):
            continue
        names.append(layer.name)
    return names


def _remat_model(workload: Any, mode: str) -> tuple[Any, dict[str, Any]]:
    import keras

    kwargs: dict[str, Any] = {}
    if mode == "list_of_layers":
        keras.utils.set_random_seed(0)
        kwargs["layer_names"] = remat_callable_layers(workload.build_model())
    keras.utils.set_random_seed(0)
    with keras.RematScope(mode=mode, **kwargs):
        model = workload.build_model()
    marked = [layer.name for layer in model.layers if getattr(layer, "_remat_mode", None) is not None]
    info = {"remat_mode": mode, "layers_in_scope": len(marked), "model_in_scope": model._remat_mode is not None}
    if "layer_names" in kwargs:
        info["layer_names"] = len(kwargs["layer_names"])
        info["layer_names_excluded"] = sorted({type(layer).__name__ for layer in model.layers
                                               if layer.name not in kwargs["layer_names"]})
    return model, info


# ---- Grappler's memory optimizer ------------------------------------------------------------------------------

def grappler_recompute_on(scope: str | None = TAPE_SCOPE) -> None:
    """This thread's tf.function calls get ``memory_optimization=RECOMPUTATION_HEURISTICS`` (private TF API).

    TensorFlow builds each call's ConfigProto from ``context.context().function_call_options``
    (tensorflow/python/eager/context.py); the public ``tf.config.optimizer.set_experimental_options`` only
    sets the rewriter toggles listed there, and ``memory_optimization`` is not one of them. `scope`: the
    optimizer's ``memory_optimizer_target_node_name_scope`` (None: its default, ``gradients/``).
    """
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
    from tensorflow.python.eager import context

    options = context.context().function_call_options
    before = options.config_proto_serialized
    config = config_pb2.ConfigProto.FromString(before) if before else config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.memory_optimization = rewriter_config_pb2.RewriterConfig.RECOMPUTATION_HEURISTICS
    if scope is not None:
        rewrite.memory_optimizer_target_node_name_scope = scope
    options.config_proto_serialized = config


def recomputed_nodes(fn: Any, args: tuple[Any, ...], *, executor: str | None) -> dict[str, int]:
    """Call `fn(*args)` once with run metadata on: nodes of the optimized graph, and Grappler's recompute nodes."""
    from tensorflow.python.eager import context

    with tf.experimental.function_executor_type(executor):
        context.enable_run_metadata()
        try:
            fn(*args)
            metadata = context.export_run_metadata()
        finally:
            context.disable_run_metadata()
    graphs = [g.post_optimization_graph for g in metadata.function_graphs]
    big = max(graphs, key=lambda g: len(g.node)) if graphs else None
    if big is None:
        return {"nodes": 0, "recomputed": 0, "triggers": 0}
    return {"nodes": len(big.node),
            "recomputed": sum(1 for n in big.node if n.name.startswith("Recomputed/")),
            "triggers": sum(1 for n in big.node if "RecomputeTrigger" in n.name)}


def grappler_facts() -> dict[str, Any]:
    """What TF2's public switch does with ``memory_optimization``: read back from the ConfigProto TF builds."""
    from tensorflow.core.protobuf import rewriter_config_pb2
    from tensorflow.python.eager import context

    name = rewriter_config_pb2.RewriterConfig.MemOptType.Name
    before = context.context().config.graph_options.rewrite_options.memory_optimization
    wanted = rewriter_config_pb2.RewriterConfig.RECOMPUTATION_HEURISTICS
    try:
        tf.config.optimizer.set_experimental_options({"memory_optimization": wanted})
        raised = None
    except Exception as exc:  # noqa: BLE001 - whatever it says is the fact
        raised = f"{type(exc).__name__}: {exc}"[:200]
    after = context.context().config.graph_options.rewrite_options.memory_optimization
    return {"public_call": "tf.config.optimizer.set_experimental_options({'memory_optimization': "
                           "RECOMPUTATION_HEURISTICS})",
            "raised": raised, "public_value_before": name(before), "public_value_after": name(after),
            "ignored": raised is None and after != wanted,
            "read_back": sorted(tf.config.optimizer.get_experimental_options()),
            "mem_opt_types": list(rewriter_config_pb2.RewriterConfig.MemOptType.keys())}


# ---- one method's step ----------------------------------------------------------------------------------------

def build(method: str, workload: Any, *, budget_bytes: int, lms_config: dict[str, Any] | None = None,
          trace_only: bool = False) -> Built:
    """The step of `method` on `workload` (a `tuner.models.Workload`), as `benchmarks/peers.py` measures it.

    The batch dimension is left unknown (one trace for any batch, as the tuner's trial), except for
    ``lms_auto``, which chooses its config at the traced batch. `trace_only`: the model and step for
    tracing into a graph model (no ``lms.function``); returns ``Built(fn=model, info)``.
    """
    import keras

    from lms.tf.train import make_train_step

    info: dict[str, Any] = {}
    if method.startswith("remat_"):
        model, info = _remat_model(workload, method[len("remat_"):])
    else:
        keras.utils.set_random_seed(0)
        model = workload.build_model()
    if method == "recompute_grad_stage":
        base = model
        model = StagedRecompute(base)
        info.update(stages=[s.name for s in model.segments[1:-1]], boundaries=stage_boundaries(base),
                    weights=len(model.trainable_variables), model_weights=len(base.trainable_variables))
    if trace_only:
        return Built(fn=model, info=info)
    optimizer = workload.make_optimizer()
    step = make_train_step(model, workload.loss_fn, optimizer)
    signature = [workload.x_spec(), workload.y_spec()]
    if method in ("lms_config", "lms_auto", "lms_tuned"):
        import lms
        from tuner.trial import lms_summary_record

        if method in ("lms_config", "lms_tuned"):  # lms_tuned: the tuner's pick at the common batch
            fn = lms.function(step, config=lms.LMSConfig.from_dict(lms_config or {}), emulate=True,
                              input_signature=signature, autograph=False)
        else:
            fn = lms.function(step, config="auto", budget=int(budget_bytes), emulate=True, autograph=False)

        def summary() -> dict[str, Any]:
            out = lms_summary_record(fn)
            s = getattr(fn, "summary", None)
            if s is not None and getattr(s, "config", None) is not None:
                out["config"] = s.config.to_dict()
            if s is not None and getattr(s, "auto", None) is not None:
                auto = s.auto.to_dict()
                out["auto_label"] = auto.get("label")
            return out

        return Built(fn=fn, info=info, summary=summary)
    if method == "grappler_recompute":
        grappler_recompute_on(TAPE_SCOPE)
        info["memory_optimization"] = "RECOMPUTATION_HEURISTICS"
        info["target_scope"] = TAPE_SCOPE
    return Built(fn=tf.function(step, input_signature=signature, autograph=False), info=info)


# ---- a child process of benchmarks/peers.py --------------------------------------------------------------------

def _first_line(exc: BaseException) -> str:
    text = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    # Keras wraps the cause: "Exception encountered when calling X.call(). <blank> <cause> ..."
    for ln in text:
        if "custom_gradient" in ln or "keyword" in ln:
            return f"{type(exc).__name__}: {ln.replace(chr(27) + '[1m', '').replace(chr(27) + '[0m', '')}"[:300]
    return f"{type(exc).__name__}: {(text[0] if text else '')}"[:300]


def child_main(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: measure one method at each of ``spec["batches"]``, or trace it (``spec["trace"]``),
    or read Grappler's facts (``spec["facts"]``). TF's CPU allocator must be BFC (`benchmarks/peers.py` sets it
    before this module imports TensorFlow)."""
    tf.config.threading.set_inter_op_parallelism_threads(1)  # as the emulated backend's trials run

    from lms.tf.measure import device_batch, measure_step
    from tuner.models import load_workload

    workload = load_workload(spec["workload"], **spec["options"])
    if spec.get("facts"):
        return _facts(workload, tf)
    if spec.get("trace"):
        return _trace(workload, spec)
    try:
        built = build(spec["method"], workload, budget_bytes=spec["budget"], lms_config=spec.get("lms_config"))
    except Exception as exc:  # noqa: BLE001 - a method that cannot be built does not run: say why
        return {"status": "unsupported", "stage": "build", "reason": _first_line(exc)}
    usable = int(spec["usable"])
    # a probe reads both batches' peaks; at the common batch every method is timed whole, fitting or not
    stop = None if spec.get("probe") or spec.get("time_all") else (lambda peak: peak > usable)
    results = []
    for batch in spec["batches"]:
        data = device_batch(workload.make_batch(int(batch), 0), "/CPU:0")
        try:
            m = measure_step(built.fn, [data], warmup=spec["warmup"], steps=spec["steps"], device="/CPU:0",
                             executor="single_threaded", stop_after=stop)
        except Exception as exc:  # noqa: BLE001
            from lms.auto import NoConfigFits

            if isinstance(exc, NoConfigFits):  # auto refuses the batch: it does not fit
                results.append({"batch": batch, "status": "infeasible", "reason": _first_line(exc),
                                "peak_device_bytes": None})
                continue
            return {"status": "unsupported", "stage": "run", "reason": _first_line(exc), "batch": batch,
                    "info": built.info}
        peak = int(m.peak_device_bytes)
        fits = peak <= usable
        results.append({"batch": batch, "status": "ok" if fits or spec.get("probe") else "infeasible",
                        "peak_device_bytes": peak, "step_peaks_bytes": list(map(int, m.step_peaks_bytes)),
                        "step_time_median_s": float(m.median_step_s), "step_times_s": list(m.step_times_s),
                        "throughput": (batch / float(m.median_step_s)) if m.median_step_s else 0.0,
                        "fits": fits, "timed_steps": len(m.step_times_s)})
    return {"status": "done", "results": results, "info": built.info, "lms_summary": built.summary(),
            "tensorflow": tf.__version__}


def _facts(workload: Any, tf: Any) -> dict[str, Any]:
    """Grappler's memory optimizer from a TF2 program: the public switch, and what the private one rewrites."""

    from lms.tf.measure import device_batch
    from lms.tf.train import make_train_step

    out: dict[str, Any] = {"status": "done", "public": grappler_facts()}
    data = device_batch(workload.make_batch(2, 0), "/CPU:0")
    for label, scope in (("off", False), ("default scope 'gradients/'", None),
                         (f"scope '{TAPE_SCOPE}'", TAPE_SCOPE)):
        if scope is not False:
            grappler_recompute_on(scope)
        model = workload.build_model()
        step = tf.function(make_train_step(model, workload.loss_fn, workload.make_optimizer()), autograph=False)
        out[label] = recomputed_nodes(step, data, executor="SINGLE_THREADED_EXECUTOR")
    return out


def _trace(workload: Any, spec: Mapping[str, Any]) -> dict[str, Any]:

    from lms.tf.extract import trace_train_step

    try:
        built = build(spec["method"], workload, budget_bytes=0, trace_only=True)
        graph, _ = trace_train_step(built.fn, workload.loss_fn, workload.make_optimizer(), workload.x_spec(),
                                    workload.y_spec(), batch_size=workload.default_batch, name=spec["method"])
    except Exception as exc:  # noqa: BLE001
        return {"status": "unsupported", "stage": "trace", "reason": _first_line(exc)}
    atomic_write_text(Path(spec["output"]), json.dumps({"graph": graph.to_dict(), "info": built.info}) + "\n")
    return {"status": "done", "output": spec["output"], "n_ops": len(graph.ops), "info": built.info}
