"""Check that LMS leaves the step's arithmetic unchanged, and undo what does not.

Before TensorFlow runs a step it optimizes it with Grappler, and that
optimized graph is what "training with LMS is bitwise identical to training
without" is about. An inserted op can change it: a trigger's control edge keeps
an op out of a rewrite, a swap-in hides the ``Transpose`` a ``MatMul`` would
absorb, a recompute clone leaves an op with one reader that Grappler then
folds. The planners avoid the cases they know (`lms.plan.anchor`,
`lms.rules`); this module is the safety net for the rest::

    graph before apply --Grappler--> plain   \\
                                               compare compute ops -> differences -> correct, again
    graph after apply  --Grappler--> with LMS /

`ensure_equivalent` runs Grappler offline (`tf_optimizer.OptimizeGraph`, the
step's outputs and must-run ops as fetches) on the traced graph as it was
before `lms.tf.apply.apply_plan` and as it is after, the way the runtime does
when it first runs the step: nodes placed, the step's arguments with their
static shapes and the captured variables with theirs (`_meta`), so
shape-dependent rewrites (broadcast minimisation, constant push-down) happen
as they do at run time. Each optimized graph is reduced to its compute nodes
(`_canonical`): inserted swap ops and gates are looked through to the tensor
they stand for, clones are compared with the node their original became,
constants by value (Grappler keeps one of several equal constants, under
either name). A difference is attributed to the inserted elements nearest to
it in the graph model (within `_RADIUS` edges): a trigger moves to another
ancestor (`lms.plan.anchor.alternative_trigger`; the old one is avoided from then
on) or is dropped with its swap-in, a swap-in or a recompute is dropped. The
edits are made in the graph being traced (consumers read the original tensor
again; the dropped ops are left without readers, and TensorFlow prunes them),
and the check runs again, at most `MAX_ROUNDS` times; whatever still differs
then is all dropped. Every change is a `Correction` in the summary.

Cost: two Grappler runs per trace (about 1.4 s without LMS and 2-5 s with,
for ResNet-50 224x224 on a 2-core CPU; MEASURED by ``benchmarks/plan_apply.py``),
one more per correcting round. Results are kept per process, keyed by the
graphs' contents: a second trace of the same step (Keras traces ``train_step``
twice under ``fit``) costs two hashes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tensorflow as tf

from ..config import atomic_write_bytes
from ..graph import Graph
from ..plan import SwapPlan
from .canonical import CHECK_PREFIX, Canonical, Difference, Naming, canonical, differences, optimized_differences
from .corrections import Correction, correct, drop_all
from .extract import must_run
from .grappler import GrapplerTarget, current_target

__all__ = ["Correction", "Difference", "EquivalenceResult", "ensure_equivalent", "optimized_differences",
           "optimized_graph_def", "order_differences",
           "cache_dir", "clear_cache", "MAX_ROUNDS", "CHECK_PREFIX", "CHECK_VERSION"]

log = logging.getLogger(__name__)

MAX_ROUNDS = 4
CHECK_VERSION = 4  # part of every cache key: raise it when what the check compares changes
_CACHE_SIZE = 16
_PY_FUNCS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})


@dataclass(frozen=True)
class EquivalenceResult:
    """What `ensure_equivalent` found and did.

    Attributes:
        plan: the plan now in the graph (`SwapPlan`; the input plan when nothing changed).
        corrections: changes made, in order.
        rounds: Grappler comparisons run (0: nothing to check, or a cached verdict).
        seconds: time spent.
        cached: the verdict came from an earlier check of the same graphs.
    """

    plan: SwapPlan
    corrections: tuple[Correction, ...] = ()
    rounds: int = 0
    seconds: float = 0.0
    cached: bool = False


# ---- offline Grappler, as the runtime runs it ------------------------------------------------

def _device(default: str) -> Any:
    return tf.DeviceSpec.from_string("/job:localhost/replica:0/task:0").make_merged_spec(
        tf.DeviceSpec.from_string(default))


def _meta(graph_def: Any, graph: tf.Graph, fetch: tuple[str, ...], keep: tuple[str, ...], device: str) -> Any:
    """A MetaGraphDef of `graph_def` that Grappler optimizes as the runtime optimizes the step.

    Arguments become ``ReadVariableOp``s of stand-in resources with their static
    shapes (a ``Placeholder`` is a feed to offline Grappler, of unknown shape),
    captured variables ``_Arg``s with their handles' shapes; every node is placed
    (`device` where unset: Grappler fuses placed nodes only); each fetched tensor
    gets an ``Identity`` reader (as a function's return value does).
    """
    from tensorflow.core.protobuf import meta_graph_pb2
    from tensorflow.python.ops import handle_data_util

    gd = type(graph_def)()
    gd.CopyFrom(graph_def)
    nodes = {n.name: n for n in gd.node}
    index = 0
    for op in graph.get_operations():
        if op.type != "Placeholder" or op.name not in nodes:
            continue
        node = nodes[op.name]
        dtype = op.outputs[0].dtype
        for attr in ("dtype", "shape"):
            if attr in node.attr:
                del node.attr[attr]
        if dtype == tf.resource:
            handle = node
            data = handle_data_util.get_resource_handle_data(op.outputs[0])
            pairs = [(st.dtype, st.shape) for st in data.shape_and_type] if data.is_set else []
        else:  # the argument's value, read from a stand-in resource of its static shape
            handle = gd.node.add()
            handle.name = f"{CHECK_PREFIX}arg/{op.name}"
            node.op = "ReadVariableOp"
            node.input.append(handle.name)
            node.attr["dtype"].type = dtype.as_datatype_enum
            pairs = [(dtype.as_datatype_enum, op.outputs[0].shape.as_proto())]
        handle.op = "_Arg"
        handle.attr["T"].type = tf.resource.as_datatype_enum
        handle.attr["index"].i = index
        index += 1
        for dt, shape in pairs:
            handle.attr["_handle_dtypes"].list.type.append(dt)
            handle.attr["_handle_shapes"].list.shape.add().CopyFrom(shape)
    fetched = []
    for i, name in enumerate(fetch):
        producer = nodes.get(name.rsplit(":", 1)[0])
        if producer is None:
            continue
        node = gd.node.add()
        node.name = f"{CHECK_PREFIX}fetch_{i}"
        node.op = "Identity"
        node.input.append(name[:-2] if name.endswith(":0") else name)
        node.attr["T"].type = _output_dtype(graph, name)
        fetched.append(node.name)
    fetched.extend(k for k in keep if k in nodes)
    base = _device(device)
    for node in gd.node:
        if "_gradient_op_type" in node.attr:  # a per-process counter ("CustomGradient-122"): only for tape.gradient
            del node.attr["_gradient_op_type"]
        if node.op in _PY_FUNCS:  # a Python callback's registry key, new in every trace (emulated swap ops)
            node.attr["token"].s = b"lms_check"
        node.device = base.make_merged_spec(tf.DeviceSpec.from_string(node.device)).to_string() if node.device \
            else base.to_string()
    meta = meta_graph_pb2.MetaGraphDef(graph_def=gd)
    meta.collection_def["train_op"].node_list.value.extend(fetched)
    return meta


def _output_dtype(graph: tf.Graph, name: str) -> int:
    return graph.get_tensor_by_name(name).dtype.as_datatype_enum


def _digest(target: GrapplerTarget, *protos: Any) -> str:
    h = hashlib.sha1(f"{CHECK_VERSION} {tf.__version__}".encode())
    h.update(target.key())
    for p in protos:
        h.update(p.SerializeToString(deterministic=True))
    return h.hexdigest()


# ---- what is known already: in this process, and on disk -------------------------------------

def cache_dir() -> Path | None:
    """Where checked graphs are remembered across processes: ``$LMS_CACHE_DIR`` (empty: nowhere), else
    ``$XDG_CACHE_HOME/lms/equivalence`` (``~/.cache/lms/equivalence``)."""
    explicit = os.environ.get("LMS_CACHE_DIR")
    if explicit is not None:
        return Path(explicit) / "equivalence" if explicit else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lms" / "equivalence"


class _Store:
    """Optimized graphs without LMS (as `Canonical`) and positive verdicts, by content digest."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._plain: "OrderedDict[str, Canonical]" = OrderedDict()
        self._verdicts: "OrderedDict[str, bool]" = OrderedDict()

    def _remember(self, cache: OrderedDict, key: str, value: Any) -> None:
        with self._lock:
            cache[key] = value
            cache.move_to_end(key)
            while len(cache) > _CACHE_SIZE:
                cache.popitem(last=False)

    def plain(self, key: str) -> Canonical | None:
        with self._lock:
            found = self._plain.get(key)
        if found is None and (folder := cache_dir()) is not None:
            try:
                found = Canonical.from_json(json.loads((folder / f"plain-{key}.json").read_text()))
            except (OSError, ValueError, KeyError, TypeError):
                return None
            self._remember(self._plain, key, found)
        return found

    def put_plain(self, key: str, value: Canonical) -> None:
        self._remember(self._plain, key, value)
        self._write(f"plain-{key}.json", json.dumps(value.to_json()).encode())

    def equivalent(self, key: str) -> bool:
        with self._lock:
            if self._verdicts.get(key):
                return True
        folder = cache_dir()
        if folder is not None and (folder / f"equivalent-{key}").exists():
            self._remember(self._verdicts, key, True)
            return True
        return False

    def put_equivalent(self, key: str) -> None:
        self._remember(self._verdicts, key, True)
        self._write(f"equivalent-{key}", b"")

    @staticmethod
    def _write(name: str, data: bytes) -> None:
        folder = cache_dir()
        if folder is None:
            return
        try:
            atomic_write_bytes(folder / name, data)
        except OSError as exc:  # a read-only or full disk: remember in this process only
            log.debug("LMS: equivalence cache %s not written: %s", folder, exc)


_STORE = _Store()


def clear_cache() -> None:
    """Forget what this process checked (the disk cache is `cache_dir`'s: point ``LMS_CACHE_DIR`` elsewhere)."""
    global _STORE
    _STORE = _Store()


def ensure_equivalent(graph: tf.Graph, plain_def: Any, model: Graph, plan: SwapPlan, *, outputs: Any,
                      device: str | None = None, target: GrapplerTarget | None = None) -> EquivalenceResult:
    """Make the step Grappler optimizes with `plan` applied compute what it computes without it.

    Args:
        graph: the graph being traced, `plan` already applied (`lms.tf.apply.apply_plan`).
        plain_def: ``graph.as_graph_def()`` taken before applying.
        model: the graph model the plan was made for.
        plan: the applied plan.
        outputs: what the step returns (fetched, with the ops TensorFlow must run).
        device: where unplaced ops run (None: the target's `GrapplerTarget.compute_device`).
        target: whose Grappler to run (None: `lms.tf.grappler.current_target`, this machine's unless
            `lms.inspect` set a virtual GPU).

    Returns:
        `EquivalenceResult`: the plan as corrected (and the graph edited to match).
    """
    start = time.perf_counter()
    if not plan.rewrites:
        return EquivalenceResult(plan)
    run = _Comparison.of(graph, plain_def, outputs=outputs, device=device, target=target)
    target, config, plain_key = run.target, run.config, run.plain_key
    plain = _STORE.plain(plain_key)
    naming = Naming(plan)
    corrections: list[Correction] = []
    avoid: set[str] = set()
    rounds = 0
    while True:
        lms_meta = run.meta(graph.as_graph_def())
        key = f"{plain_key}-{_digest(target, config, lms_meta)}"
        if _STORE.equivalent(key):
            return EquivalenceResult(plan, tuple(corrections), rounds, time.perf_counter() - start, cached=not rounds)
        if plain is None:
            plain = run.plain(plan)
        rounds += 1
        diffs = differences(plain, canonical(target.optimize(lms_meta, config), naming))
        if not diffs:
            _STORE.put_equivalent(key)
            return EquivalenceResult(plan, tuple(corrections), rounds, time.perf_counter() - start)
        log.info("LMS: Grappler optimizes %d compute nodes differently with LMS, e.g. %s", len(diffs), diffs[0])
        before = len(corrections)
        if rounds < MAX_ROUNDS:
            plan = correct(graph, model, plan, diffs, avoid, corrections)
        if len(corrections) == before:  # nothing attributed, or out of rounds: drop what is left
            log.warning("LMS: the optimized step still differs from the step without LMS after %d round(s) "
                        "(e.g. %s): every swap and recompute left is dropped", rounds, diffs[0])
            plan = drop_all(graph, plan, corrections, str(diffs[0]))
            return EquivalenceResult(plan, tuple(corrections), rounds, time.perf_counter() - start)


def order_differences(graph: tf.Graph, plain_def: Any, plan: SwapPlan, *, outputs: Any, device: str | None = None,
                      target: GrapplerTarget | None = None) -> list[Difference]:
    """What Grappler optimizes differently in the finished rewrite (`plan` applied, checked, and the schedule's
    ordering edges pinned) than in the step without LMS; empty when the same.

    The pins are control edges: they change no value, but an op with a control input or output is kept
    out of some of Grappler's rewrites (folding, fusions, reassociation). One Grappler run of the pinned
    graph (the step without LMS is cached), remembered by content like `ensure_equivalent`'s verdicts.
    """
    run = _Comparison.of(graph, plain_def, outputs=outputs, device=device, target=target)
    lms_meta = run.meta(graph.as_graph_def())
    key = f"{run.plain_key}-{_digest(run.target, run.config, lms_meta)}"
    if _STORE.equivalent(key):
        return []
    plain = _STORE.plain(run.plain_key) or run.plain(plan)
    diffs = differences(plain, canonical(run.target.optimize(lms_meta, run.config), Naming(plan)))
    if not diffs:
        _STORE.put_equivalent(key)
    return diffs


@dataclass(frozen=True)
class _Comparison:
    """What both of a check's Grappler runs share: the target, its options, the fetches and the plain step."""

    graph: Any
    target: GrapplerTarget
    config: Any
    fetch: tuple[str, ...]
    keep: tuple[str, ...]
    device: str
    plain_meta: Any
    plain_key: str

    @classmethod
    def of(cls, graph: tf.Graph, plain_def: Any, *, outputs: Any, device: str | None,
           target: GrapplerTarget | None) -> "_Comparison":
        target = target or current_target()
        device = device or target.compute_device
        fetch = _fetches(graph, outputs)
        present = _names(plain_def)
        keep = tuple(op.name for op in graph.get_operations() if op.name in present and must_run(op))
        config = target.config()
        plain_meta = _meta(plain_def, graph, fetch, keep, device)
        return cls(graph, target, config, fetch, keep, device, plain_meta, _digest(target, config, plain_meta))

    def meta(self, graph_def: Any) -> Any:
        return _meta(graph_def, self.graph, self.fetch, self.keep, self.device)

    def plain(self, plan: SwapPlan) -> Canonical:
        """The step without LMS, optimized and reduced to its values (and remembered)."""
        found = canonical(self.target.optimize(self.plain_meta, self.config), Naming(SwapPlan(config=plan.config)))
        _STORE.put_plain(self.plain_key, found)
        return found


def optimized_graph_def(graph: tf.Graph, *, outputs: Any, target: GrapplerTarget | None = None,
                        device: str | None = None) -> Any:
    """The GraphDef Grappler makes of the traced `graph` for `target`, as `ensure_equivalent` optimizes it
    (nodes placed, the step's arguments with their static shapes, `outputs` fetched)."""
    target = target or current_target()
    keep = tuple(op.name for op in graph.get_operations() if must_run(op))
    meta = _meta(graph.as_graph_def(), graph, _fetches(graph, outputs), keep, device or target.compute_device)
    return target.optimize(meta, target.config())


def _fetches(graph: tf.Graph, outputs: Any) -> tuple[str, ...]:
    return tuple(dict.fromkeys(t.name for t in tf.nest.flatten(outputs, expand_composites=True)
                               if tf.is_tensor(t) and getattr(t, "graph", None) is graph))


def _names(graph_def: Any) -> set[str]:
    return {n.name for n in graph_def.node}
