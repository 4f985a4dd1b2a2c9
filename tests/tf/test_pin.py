"""Pinning the order (`schedule="memory"`, serialization, sync_mode) keeps training bitwise identical.

Each case trains k steps with a plain ``tf.function`` and with ``lms.function``
under a config that pins an order; loss, weights and optimizer state must match
bit for bit, and the pinned edges must still order their ops in the graph the
runtime ran after Grappler.
"""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

import lms  # noqa: E402
from lms import LMSConfig  # noqa: E402
from lms.schedule import schedule_ops  # noqa: E402
from lms.tf.graphdefs import executed_graph_defs  # noqa: E402
from lms.tf.pin import apply_schedule, pinned_edges_survived  # noqa: E402
from tests.tf.conftest import assert_bitwise, check_pinned_schedule  # noqa: E402

# Two mechanisms broke this before pins were kept to `lms.plan.anchor.pinnable_ops`: a control edge or a
# _grappler_do_not_remove mark on an op of a Grappler rewrite (remapper's MatMul/Conv2D+BiasAdd+activation
# fusion, the arithmetic optimizer on BatchNorm's Mul/AddV2) stops the rewrite, so the pinned step ran other
# kernels (mlp's loss 1 ulp off); and oneDNN's layout pass merged Conv2DBackpropFilter with its BiasAddGrad
# sibling across a pinned path ("69 nodes in a cycle", cnn_bn).
pytestmark = [pytest.mark.tf]

PIN_CONFIGS = {
    "memory-no-swaps": LMSConfig(n_tensors=0, schedule="memory"),
    "memory-all-swapped": LMSConfig(n_tensors=-1, schedule="memory"),
    "memory-lb3-sync3": LMSConfig(n_tensors=-1, lb=3, schedule="memory", sync_mode=3),
    "memory-prefetch": LMSConfig(n_tensors=-1, lb=2, schedule="memory", prefetch="headroom"),
    "tf-serialization": LMSConfig(n_tensors=-1, serialization=["2:40"], sync_mode=1),
    "tf-serialization-by-size": LMSConfig(n_tensors=0, serialization_by_size=1e-6),
}


# The memory-scheduled configs (schedule="memory") train pinned whole on this CPU: the same runs, with these
# checks, are tests/tf/test_exact.py's (`test_a_step_pinned_whole_trains_bitwise_identically`), so this file keeps
# the configs that pin TensorFlow's own order (serialization), and the partial pins' survival below.
TF_ORDER_CONFIGS = [name for name, config in PIN_CONFIGS.items() if config.schedule != "memory"]


@pytest.mark.parametrize("config_name", TF_ORDER_CONFIGS)
@pytest.mark.parametrize("model", ["mlp", "cnn_bn", "residual"])
@pytest.mark.parametrize("emulate", [True, False])
def test_pinned_orders_train_bitwise_identically(cases, model, config_name, emulate):
    case = cases[model]
    step = lms.function(case.step_fn(), config=PIN_CONFIGS[config_name], emulate=emulate)
    assert_bitwise(case.baseline, case.run(step))
    check_pinned_schedule(step, model)


@pytest.mark.parametrize("config_name", ["memory-all-swapped", "memory-prefetch", "tf-serialization"])
def test_pinned_edges_survive_grappler(cases, config_name):
    """The partial pins (what a step keeps when it cannot be pinned whole: `lms.tf.exact`)."""
    case = cases["cnn_bn"]
    step = lms.function(case.step_fn(), config=PIN_CONFIGS[config_name], emulate=True, pin_whole=False)
    executed = executed_graph_defs(step, case.x, case.y)
    case.reset()
    edges = schedule_ops(step.graph, step.plan).edges
    assert edges and pinned_edges_survived(executed, edges) == []


def test_apply_schedule_refuses_a_cycle_or_an_unknown_op_and_adds_nothing():
    graph = tf.Graph()
    with graph.as_default():
        a = tf.constant(1.0, name="a")
        b = tf.math.square(a, name="b")
        tf.math.square(b, name="c")
    with pytest.raises(ValueError, match="cycle in the traced graph through"):
        apply_schedule(graph, [("b", "c"), ("c", "a")])
    with pytest.raises(ValueError, match="not in the graph being traced"):
        apply_schedule(graph, [("a", "inside_a_loop_body")])
    assert all(not op.control_inputs for op in graph.get_operations())
    assert apply_schedule(graph, [("a", "c")]).edges == (("a", "c"),)
    assert [op.name for op in graph.get_operation_by_name("c").control_inputs] == ["a"]


TUNER_ZOO = {"gpt2_small": dict(seq_len=16, n_layers=2, d_model=32, n_heads=2, vocab_size=100, n_positions=16),
             "unet3d": dict(input_size=8, base_filters=2, levels=2)}


@pytest.mark.parametrize("model", list(TUNER_ZOO))
def test_tuner_zoo_pinned_with_an_unknown_batch_dim_trains_bitwise_identically(model):
    """As the tuner's trials trace (batch dim unknown, one trace): attention, LayerNorm, Conv3D, Adam.

    gpt2_small once aborted here ("1555 nodes in a cycle"): the schedule read a position embedding after
    Adam's update of it, and tf.function's automatic control dependencies order reads before writes.
    """
    import numpy as np

    from lms.tf.train import make_train_step
    from tuner.models import load_workload

    w = load_workload(model, **TUNER_ZOO[model])
    net = w.build_model()
    optimizer = w.make_optimizer()
    optimizer.build(net.trainable_variables)
    start = [v.numpy() for v in net.weights + optimizer.variables]
    x, y = (tf.constant(a) for a in w.make_batch(2, 0))
    signature = [w.x_spec(), w.y_spec()]

    def run(fn):
        for v, value in zip(net.weights + optimizer.variables, start):
            v.assign(value)
        losses = [fn(x, y).numpy() for _ in range(3)]
        return losses, [v.numpy() for v in net.weights + optimizer.variables]

    expected = run(tf.function(make_train_step(net, w.loss_fn, optimizer), input_signature=signature))
    for config in (PIN_CONFIGS["memory-no-swaps"], PIN_CONFIGS["memory-lb3-sync3"], PIN_CONFIGS["memory-prefetch"],
                   PIN_CONFIGS["tf-serialization"]):
        for emulate in (True, False):
            step = lms.function(make_train_step(net, w.loss_fn, optimizer), config=config, emulate=emulate,
                                input_signature=signature)
            losses, values = run(step)
            assert all(np.array_equal(a, b) for a, b in zip(expected[0], losses)), (config, emulate)
            assert all(np.array_equal(a, b) for a, b in zip(expected[1], values)), (config, emulate)
            assert schedule_ops(step.graph, step.plan).edges


def test_an_edge_to_an_emulated_swap_in_with_a_bandwidth_reaches_its_first_op():
    """An emulated swap-in with a link speed is three ops (``<name>/transfer`` sleeps, ``/shaped``, ``<name>``):
    the pin must hold back the transfer, not only the final copy, or the emulated link starts early."""
    from lms.tf.emulate import emulated_swap_in, emulated_swap_out

    graph = tf.Graph()
    with graph.as_default():
        p = tf.fill([4, 4], 1.0, name="p")
        host = emulated_swap_out(p, name="lms/swap_out/p_0", bandwidth=1e9)
        emulated_swap_in(host, like=p, name="p-lms_swap_in_0_0", bandwidth=1e9)
        tf.math.square(p, name="trigger")
    apply_schedule(graph, [("trigger", "p-lms_swap_in_0_0")])
    transfer = graph.get_operation_by_name("p-lms_swap_in_0_0/transfer")
    assert [op.name for op in transfer.control_inputs] == ["trigger"]


def test_a_pinned_trace_times_its_schedule_apart_from_its_check(cases):
    """The finished rewrite is checked in one Grappler run with the pins on (`lms.tf.rewriter`): the time of
    scheduling still counts as ``schedule_s``, not as the check's."""
    case = cases["cnn_bn"]
    step = lms.function(case.step_fn(), config=PIN_CONFIGS["memory-lb3-sync3"], emulate=True)
    case.run(step)
    case.reset()
    timings = step.timings
    assert step.summary.n_swapped > 0 and not step.summary.corrections
    assert timings["schedule_s"] > 1e-3 and timings["check_s"] > 1e-3
