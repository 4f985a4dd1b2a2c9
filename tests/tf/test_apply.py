"""`lms.tf.apply` and `lms.tf.emulate`: inserted ops, rerouting, triggers, exact copies, errors.

Plans here are written by hand (not by the planner), so these tests check the
rewriter alone: it must do exactly what a plan says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tests.tf.conftest import assert_bitwise  # noqa: E402
from lms import GraphBuilder, LMSConfig, Role, Swap, SwapIn, SwapPlan  # noqa: E402
from lms.plan import swap_op_name  # noqa: E402
from lms.tf.apply import (  # noqa: E402
    DO_NOT_REMOVE_ATTR,
    REWRITABLE_TYPES,
    anchor_triggers,
    apply_plan,
)
from lms.tf.graphdefs import executed_graph_defs, optimized_graph_def, swap_op_names  # noqa: E402
from lms.tf.emulate import aligned_empty, emulated_swap_in, emulated_swap_out  # noqa: E402
from lms.tf.extract import extract_graph  # noqa: E402
from lms.tf.train import record_gradients  # noqa: E402

pytestmark = pytest.mark.tf


# ---- emulated swap ops ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int32", "int64", "uint8"])
def test_emulated_round_trip_is_bit_exact(dtype):
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 255, size=(3, 5, 7 * 8), dtype=np.uint8)
    if dtype in ("float32", "float16", "float64", "bfloat16"):
        values = tf.constant(rng.standard_normal((3, 5, 7)).astype("float32"))
        special = tf.constant([[-0.0, np.inf, -np.inf, np.nan, 1e-40, 3.0, -2.5]] * 5, dtype="float32")
        values = tf.cast(tf.concat([values, special[None]], axis=0), dtype)
    else:
        values = tf.constant(raw[..., :7].astype(dtype))

    @tf.function
    def round_trip(t):
        h = emulated_swap_out(t, name="lms/swap_out/t")
        return h, emulated_swap_in(h, like=t, name="lms/swap_in/t_0")

    host, back = round_trip(values)
    assert back.shape == values.shape and back.dtype == values.dtype
    as_bits = lambda t: tf.io.serialize_tensor(t).numpy()  # noqa: E731 - byte-exact, NaN included
    assert as_bits(back) == as_bits(values)
    assert as_bits(host) == as_bits(values)


@pytest.mark.parametrize("shape", [[None, 4, 5], [3, 4, 5]])
@pytest.mark.parametrize("bandwidth", [None, 1e9])
def test_emulated_ops_keep_shapes(shape, bandwidth):
    graph = tf.Graph()
    with graph.as_default():
        t = tf.compat.v1.placeholder(tf.float32, shape)
        h = emulated_swap_out(t, name="lms/swap_out/t", bandwidth=bandwidth)
        back = emulated_swap_in(h, like=t, name="lms/swap_in/t_0", bandwidth=bandwidth)
    assert h.shape.as_list() == shape and back.shape.as_list() == shape
    assert graph.get_operation_by_name("lms/swap_out/t").type == "PyFuncStateless"
    # The shape goes back on for Grappler as far as Grappler knows it, static or not: a Reshape to
    # Shape(Identity(t)), never Python's static shape (a constant).
    shaped = graph.get_operation_by_name("lms/swap_out/t/shaped")
    assert shaped.type == "Reshape" and shaped.inputs[1].op.type == "Shape"
    assert sorted(op.type for op in t.consumers()) == ["Identity", "PyFuncStateless"]
    assert back.op.type == "Snapshot" and back.op.name == "lms/swap_in/t_0"
    names = {op.name for op in graph.get_operations()}
    assert ("lms/swap_in/t_0/transfer" in names) == (bandwidth is not None)


def test_bandwidth_sleeps_bytes_over_bandwidth():
    t = tf.ones([64, 1024])  # 256 KiB
    nbytes = 64 * 1024 * 4

    @tf.function
    def slow(x):
        h = emulated_swap_out(x, name="lms/swap_out/x", bandwidth=nbytes / 0.15)
        return tf.reduce_sum(emulated_swap_in(h, like=x, name="lms/swap_in/x_0", bandwidth=nbytes / 0.15))

    slow(t)  # trace
    start = time.perf_counter()
    slow(t)
    elapsed = time.perf_counter() - start
    assert 0.29 <= elapsed < 3.0  # two transfers of 0.15 s each


@pytest.mark.parametrize("bandwidth", [0, -1.0])
def test_bad_bandwidth(bandwidth):
    with pytest.raises(ValueError, match="bandwidth"):
        emulated_swap_out(tf.ones([2, 2]), name="x", bandwidth=bandwidth)


def test_aligned_empty():
    for shape in [(3,), (5, 7), (1000, 3)]:
        a = aligned_empty(shape, np.float32)
        assert a.shape == shape and a.flags.c_contiguous and a.ctypes.data % 64 == 0
    assert aligned_empty((0, 4), np.float32).shape == (0, 4)


_BFC_SCRIPT = textwrap.dedent("""
    import json, os
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf
    from lms.tf.emulate import emulated_swap_in, emulated_swap_out

    N = 2 * 1024 * 1024  # 8 MiB of float32

    @tf.function
    def to_host(x):
        return emulated_swap_out(x * 2.0, name="lms/swap_out/y")

    @tf.function
    def on_device(x):
        return x * 2.0

    @tf.function
    def back(h, like):
        return emulated_swap_in(h, like=like, name="lms/swap_in/y_0")

    x = tf.ones([N])
    cur = lambda: tf.config.experimental.get_memory_info("CPU:0")["current"]
    out = {}
    for name, fn in (("device", on_device), ("host", to_host)):
        fn(x)
        before = cur()
        kept = fn(x)
        out[name] = cur() - before
    before = cur()
    restored = back(kept, x)
    out["swapped_in"] = cur() - before
    out["equal"] = bool(tf.reduce_all(restored == x * 2.0))
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_swapped_out_bytes_leave_tf_allocator():
    """Held swap-out outputs cost TF's allocator nothing; a swap-in allocates the full copy."""
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true"}
    proc = subprocess.run([sys.executable, "-c", _BFC_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=300, check=True)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    mib = 1 << 20
    assert out["device"] >= 8 * mib  # a normal result lives in the allocator
    assert out["host"] < 1 * mib  # the swapped-out copy does not
    assert out["swapped_in"] >= 8 * mib
    assert out["equal"]


# ---- apply_plan on a traced step, with hand-written plans -----------------------------------

class _PlannedStep:
    """A training step traced with `plan_for(graph_model)` applied at the end of the trace."""

    def __init__(self, case, plan_for, *, swap_ops: str):
        self.case = case
        step = case.step_fn()
        self.applied = self.plan = self.model = self.func_graph = None

        def traced(x, y):
            graph = tf.compat.v1.get_default_graph()
            with record_gradients(graph) as rec:
                loss = step(x, y)
            self.model = extract_graph(graph, loss_tensor=rec.targets, batch_size=int(x.shape[0]),
                                       backward_ops=rec.backward_ops)
            self.plan = plan_for(self.model)
            self.plan.validate(self.model)
            self.applied = apply_plan(graph, self.plan, swap_ops=swap_ops)
            self.func_graph = graph
            return loss

        self.fn = tf.function(traced, autograph=False)


def _first_relu_plan(model, *, fused: bool = False, trigger: str | None = "auto") -> SwapPlan:
    """Swap the first forward Relu output; its backward readers get swap-ins."""
    relu = next(op for op in model.by_role(Role.FORWARD) if model.ops[op].type == "Relu")
    tensor = f"{relu}:0"
    readers = [c for c in model.data_consumers(tensor) if model.ops[c].role is Role.BACKWARD]
    assert len(readers) >= 2
    groups = [readers] if fused else [[r] for r in readers]
    swap_ins = []
    for i, group in enumerate(groups):
        first = min(group, key=model.levels.__getitem__)
        trig = None
        if trigger == "auto":  # a backward op two levels up that precedes the reader
            trig = next(p for p in model.predecessors(first) if model.ops[p].role is Role.BACKWARD)
        swap_ins.append(SwapIn(swap_op_name("swap_in", tensor, i), tuple(group), trig, 1, "manual"))
    swap = Swap(tensor, swap_op_name("swap_out", tensor), tuple(swap_ins), model.tensor_bytes(tensor))
    return SwapPlan(config=LMSConfig(), swaps=(swap,), n_candidates=1, batch_size=model.batch_size)


@pytest.mark.parametrize("swap_ops", ["emulated", "device"])
@pytest.mark.parametrize("fused", [False, True])
def test_apply_inserts_reroutes_and_triggers(cases, swap_ops, fused):
    case = cases["cnn_bn"]
    planned = _PlannedStep(case, lambda m: _first_relu_plan(m, fused=fused), swap_ops=swap_ops)
    result = case.run(planned.fn)
    assert_bitwise(case.baseline, result)

    g, plan, applied = planned.func_graph, planned.plan, planned.applied
    (swap,) = plan.swaps
    original = g.get_tensor_by_name(swap.tensor)
    out_op = g.get_operation_by_name(swap.swap_out)
    assert applied.swap_outs == (swap.swap_out,)
    assert out_op.inputs[0].name == swap.tensor
    assert "CPU:0" in out_op.device
    assert out_op.get_attr(DO_NOT_REMOVE_ATTR) is True
    assert applied.rerouted_inputs == len(swap.consumers)
    assert applied.triggers == len(swap.swap_ins)
    for si in swap.swap_ins:
        in_op = g.get_operation_by_name(si.name)
        assert in_op.type == ("Snapshot" if swap_ops == "emulated" else "Identity")
        assert [c.name for c in in_op.control_inputs] == [si.trigger]
        for c in si.consumers:
            inputs = [t.name for t in g.get_operation_by_name(c).inputs]
            assert f"{si.name}:0" in inputs and swap.tensor not in inputs
    for name in applied.inserted_ops:
        assert g.get_operation_by_name(name).get_attr(DO_NOT_REMOVE_ATTR) is True
    # Forward readers keep the original; the swap-out is an extra reader of it.
    readers = {op.name for op in original.consumers()}
    assert swap.swap_out in readers
    assert all(planned.model.ops[r].role is not Role.BACKWARD for r in readers - {swap.swap_out}
               if r in planned.model.ops)


def test_emulated_with_bandwidth_triggers_the_transfer(cases):
    case = cases["mlp"]
    step = case.step_fn()
    holder = {}

    def traced(x, y):
        graph = tf.compat.v1.get_default_graph()
        with record_gradients(graph) as rec:
            loss = step(x, y)
        model = extract_graph(graph, loss_tensor=rec.targets, batch_size=6, backward_ops=rec.backward_ops)
        holder["plan"] = plan = _first_relu_plan(model)
        holder["applied"] = apply_plan(graph, plan, swap_ops="emulated", bandwidth=1e10)
        holder["graph"] = graph
        return loss

    assert_bitwise(case.baseline, case.run(tf.function(traced, autograph=False)))
    g = holder["graph"]
    for si in holder["plan"].swaps[0].swap_ins:
        transfer = g.get_operation_by_name(f"{si.name}/transfer")
        assert [c.name for c in transfer.control_inputs] == [si.trigger]
        assert transfer.name in holder["applied"].inserted_ops


def test_swap_in_without_trigger(cases):
    case = cases["mlp"]
    planned = _PlannedStep(case, lambda m: _first_relu_plan(m, trigger=None), swap_ops="emulated")
    assert_bitwise(case.baseline, case.run(planned.fn))
    assert planned.applied.triggers == 0


def test_swap_ops_survive_grappler(cases):
    case = cases["cnn_bn"]
    for swap_ops in ("emulated", "device"):
        planned = _PlannedStep(case, _first_relu_plan, swap_ops=swap_ops)
        executed = executed_graph_defs(planned.fn, case.x, case.y)
        case.reset()
        names = set(planned.applied.swap_outs + planned.applied.swap_ins)
        assert names and names <= {n for gd in executed for n in swap_op_names(gd)}
        concrete = planned.fn.get_concrete_function(case.x, case.y)
        assert names <= set(swap_op_names(optimized_graph_def(concrete)))


def test_grappler_check_can_fail():
    """Without `_grappler_do_not_remove` Grappler drops a plain identity: the check above is real."""
    def probe(protect: bool):
        @tf.function
        def f(x):
            y = x * 2.0
            ident = tf.identity(y, name="lms/swap_out/probe")
            if protect:
                ident.op._set_attr(DO_NOT_REMOVE_ATTR, tf.compat.v1.AttrValue(b=True))
            return ident * 3.0
        return swap_op_names(optimized_graph_def(f.get_concrete_function(tf.TensorSpec([4]))))

    assert probe(protect=True) == ["lms/swap_out/probe"]
    assert probe(protect=False) == []


def test_apply_errors(cases):
    case = cases["mlp"]

    def bad_tensor(model):
        plan = _first_relu_plan(model)
        swap = plan.swaps[0]
        return SwapPlan(config=plan.config, swaps=(Swap("no/such:0", "lms/swap_out/x", swap.swap_ins, 4),))

    step = case.step_fn()

    def run_with(make_plan, **kwargs):
        def traced(x, y):
            graph = tf.compat.v1.get_default_graph()
            with record_gradients(graph) as rec:
                loss = step(x, y)
            model = extract_graph(graph, loss_tensor=rec.targets, batch_size=6, backward_ops=rec.backward_ops)
            plan = make_plan(model)
            apply_plan(graph, plan, **kwargs)
            apply_plan(graph, plan, **kwargs)  # the same names again
            return loss
        return tf.function(traced, autograph=False).get_concrete_function(case.x, case.y)

    with pytest.raises(ValueError, match="not in the graph"):
        run_with(bad_tensor)
    with pytest.raises(ValueError, match="already used"):
        run_with(_first_relu_plan)
    with pytest.raises(ValueError, match="swap_ops"):
        apply_plan(tf.Graph(), SwapPlan(config=LMSConfig()), swap_ops="nvlink")
    with pytest.raises(ValueError, match="bandwidth"):
        apply_plan(tf.Graph(), SwapPlan(config=LMSConfig()), swap_ops="device", bandwidth=1e9)
    with pytest.raises(ValueError, match="tf.Graph"):
        apply_plan("graph", SwapPlan(config=LMSConfig()))


# ---- anchor_triggers (graph model only) -------------------------------------------------------

def _chain():
    """f0 -> f1 -> f2 -> loss; backward g2 -> g1a (Mul) -> g1b -> g0, g2 -> side; a Const c."""
    b = GraphBuilder(batch_size=2)
    b.op("x", "Placeholder", per_sample_bytes=8)
    f0 = b.op("f0", "Relu", "x:0", per_sample_bytes=64)
    f1 = b.op("f1", "Relu", f0, per_sample_bytes=64)
    f2 = b.op("f2", "Relu", f1, per_sample_bytes=64)
    b.op("loss", "Sum", f2, shape=())
    c = b.op("gradient_tape/c", "Const", role=Role.BACKWARD)
    g2 = b.op("g2", "ReluGrad", c, f2, role=Role.BACKWARD, grad_of="f2")
    g1a = b.op("g1a", "Mul", g2, c, role=Role.BACKWARD, grad_of="f1")
    g1b = b.op("g1b", "ReluGrad", g1a, f1, role=Role.BACKWARD, grad_of="f1")
    g0a = b.op("g0a", "AddV2", g1b, c, role=Role.BACKWARD, grad_of="f0")
    b.op("g0", "ReluGrad", g0a, f0, role=Role.BACKWARD, grad_of="f0")
    b.op("side", "Neg", g2, role=Role.BACKWARD)
    return b.build()


def _plan(graph, trigger, consumer="g0"):
    si = SwapIn(swap_op_name("swap_in", "f0:0", 0), (consumer,), trigger, 2, "manual")
    return SwapPlan(config=LMSConfig(), swaps=(Swap("f0:0", swap_op_name("swap_out", "f0:0"), (si,), 128),))


def test_anchor_moves_a_rewritable_single_reader_trigger_to_a_safe_ancestor():
    graph = _chain()
    anchored = anchor_triggers(graph, _plan(graph, "g1a"))
    (si,) = anchored.swaps[0].swap_ins
    assert si.trigger == "g2"  # g1a (Mul) has one reader, g1b; g2 has two: g1a and side
    assert si.strategy == "manual+anchored"
    assert si.distance == graph.levels["g0"] - graph.levels["g2"]
    anchored.validate(graph)


def test_anchor_keeps_safe_triggers():
    graph = _chain()
    for trigger in ("g2", "g1b", None):  # several readers; a gradient kernel (ReluGrad); none
        plan = _plan(graph, trigger)
        assert anchor_triggers(graph, plan) is plan


def test_anchor_never_moves_to_a_source():
    graph = _chain()
    # g0a (AddV2, one reader) -> parents g1b (ReluGrad: safe) and the Const c (a source: never).
    (si,) = anchor_triggers(graph, _plan(graph, "g0a", consumer="g0")).swaps[0].swap_ins
    assert si.trigger == "g1b"
    assert REWRITABLE_TYPES >= {"AddV2", "Mul", "BiasAdd", "Conv2D"}
    assert not REWRITABLE_TYPES & {"ReluGrad", "Conv2DBackpropInput", "MaxPoolGrad", "Const"}


@pytest.mark.parametrize("swap_in_name,moves", [(swap_op_name("swap_in", "Exp:0", 0), False),
                                                ("lms/swap_in/Exp_0_0", True)])
def test_a_commutative_consumer_keeps_its_sorted_input_order(swap_in_name, moves, caplog):
    """Grappler sorts a Mul's inputs by name: ``Exp`` < ``gradient_tape/g`` < ``lms/...`` (issue 11)."""
    from tensorflow.python.framework import func_graph

    graph = func_graph.FuncGraph("order")
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="x")
        e = tf.exp(x, name="Exp")
        g = tf.identity(x * 2.0, name="gradient_tape/g")
        mul = tf.multiply(g, e, name="gradient_tape/mul")
    si = SwapIn(swap_in_name, ("gradient_tape/mul",), None, None, "manual")
    plan = SwapPlan(config=LMSConfig(), swaps=(Swap("Exp:0", swap_op_name("swap_out", "Exp:0"), (si,), 24),))
    with caplog.at_level("WARNING", logger="lms.tf.apply"):
        apply_plan(graph, plan, swap_ops="device")
    assert [t.op.name for t in mul.op.inputs] == ["gradient_tape/g", swap_in_name]
    assert sorted(t.op.name for t in mul.op.inputs)[0] == (swap_in_name if not moves else "gradient_tape/g")
    warned = [r.getMessage() for r in caplog.records if "another position" in r.getMessage()]
    assert warned == ([f"LMS: gradient_tape/mul reads {swap_in_name} in another position among its inputs after "
                       "Grappler sorts them by name; results may differ in the last bits"] if moves else [])


@pytest.mark.parametrize("naming,moves", [("stand-in", False), ("lms/recompute", True)])
def test_commutative_readers_of_clones_and_gates_keep_their_sorted_input_order(naming, moves, caplog):
    """Clones and gates stand in for forward tensors among commutative inputs too (issue 15).

    ``Exp = exp(m)``, ``m = x * w`` recomputed for ``gradient_tape/mul = g * Exp``:
    the clone of ``m`` reads a gate of ``x`` (sorted: ``w`` < ``x``), and the
    reader reads the clone of ``Exp`` (sorted: ``Exp`` < ``gradient_tape/g``).
    Names under ``lms/recompute/`` (issue 15's first names) put both in the other position.
    """
    from tensorflow.python.framework import func_graph

    from lms.plan.recompute import Clone, Gate, Recompute, RecomputePlan, gate_op_name, recompute_op_name

    graph = func_graph.FuncGraph("order")
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="x")
        w = tf.compat.v1.placeholder(tf.float32, [2, 3], name="w")
        e = tf.exp(tf.multiply(x, w, name="m"), name="Exp")
        g = tf.identity(x * 2.0, name="gradient_tape/g")
        mul = tf.multiply(g, e, name="gradient_tape/mul")
    if moves:
        gate, clone_m, clone_e = "lms/recompute/Exp_0_0/gate/x_0", "lms/recompute/Exp_0_0/m", "lms/recompute/Exp_0_0/Exp"
    else:
        gate, clone_m, clone_e = (gate_op_name("Exp:0", 0, "x:0"), recompute_op_name("Exp:0", 0, "m"),
                                  recompute_op_name("Exp:0", 0, "Exp"))
    r = Recompute("Exp:0", ("gradient_tape/mul",),
                  (Clone(clone_m, "m", (f"{gate}:0", "w:0")), Clone(clone_e, "Exp", (f"{clone_m}:0",))),
                  ("x:0", "w:0"), None, 24, gates=(Gate(gate, "x:0"),))
    plan = SwapPlan(config=LMSConfig(), swaps=(), recompute=RecomputePlan(recomputes=(r,)))
    with caplog.at_level("WARNING", logger="lms.tf.apply"):
        applied = apply_plan(graph, plan, swap_ops="device")
    assert applied.clones == (gate, clone_m, clone_e)
    assert [t.op.name for t in mul.op.inputs] == ["gradient_tape/g", clone_e]
    warned = {r.getMessage() for r in caplog.records if "another position" in r.getMessage()}
    assert warned == ({f"LMS: {clone_m} reads {gate} in another position among its inputs after Grappler sorts "
                       "them by name; results may differ in the last bits",
                       f"LMS: gradient_tape/mul reads {clone_e} in another position among its inputs after "
                       "Grappler sorts them by name; results may differ in the last bits"} if moves else set())
