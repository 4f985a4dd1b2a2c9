"""Training with recomputation (``LMSConfig(recompute=...)``) is bitwise identical to training without LMS.

The clones must be in the traced graph and survive Grappler as ops of their own
(not merged back into the originals), and a model whose forward pass draws
random numbers (dropout, with its stateful seed) never has those tensors
recomputed.
"""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import lms  # noqa: E402
from lms import LMSConfig  # noqa: E402
from lms.optypes import RECOMPUTABLE_TYPES  # noqa: E402
from lms.tf.graphdefs import clone_op_names, executed_graph_defs, optimized_graph_def  # noqa: E402
from tests.tf.conftest import K_STEPS, Case, RunResult, assert_bitwise  # noqa: E402

pytestmark = pytest.mark.tf

CONFIGS = {
    "swap+recompute": LMSConfig(recompute="cheap"),
    "recompute-only": LMSConfig(n_tensors=0, recompute="cheap"),
    "fused-lb3+recompute": LMSConfig(recompute="cheap", fuse_swapins=True, lb=3),
    "direct_order+types": LMSConfig(recompute=["Mul", "AddV2", "Add", "Relu"], ctrld_strategy="direct_order"),
    "memory-schedule+recompute": LMSConfig(recompute="cheap", schedule="memory"),
}
# models with BatchNorm -> ReLU chains (mlp: Dense -> ReLU has none: its ReLU's input is not saved; cnn_bn's
# ReLU is read by a MaxPool, and with its backward readers moved to a clone Grappler would compute
# max(relu(x)) as relu(max(x)): another graph, so it is kept: `lms.rules.folds_into`)
RECOMPUTING = {"residual"}


def _check(case, config, *, emulate):
    step = lms.function(case.step_fn(), config=config, emulate=emulate)
    assert_bitwise(case.baseline, case.run(step))
    summary, applied = step.summary, step.applied
    if case.name in RECOMPUTING:
        rp = step.plan.recompute
        assert summary.recomputed and summary.n_clones + rp.n_gates == len(applied.clones) > 0
        assert summary.recomputed_bytes == sum(step.graph.tensor_bytes(t) for t in summary.recomputed)
    else:
        assert not summary.recomputed and not applied.clones
        if case.name == "cnn_bn" and config.recompute_types and "Relu" in config.recompute_types:
            # the ReLU read by the MaxPool, found by structure: its layer's name (re_lu, re_lu_1, ...)
            # depends on how many models this process built before
            graph = step.graph
            into_pool = {t for op in graph if op.type == "MaxPool" for t in op.inputs if graph.producer(t).type == "Relu"}
            assert len(into_pool) == 1
            reasons = [k.reason for k in step.plan.recompute.skipped if k.tensor in into_pool]
            assert reasons and "MaxPool" in reasons[0] and "Grappler folds it into" in reasons[0]
    assert not summary.corrections  # the planner's rules, not the equivalence check
    traced = step.get_concrete_function(case.x, case.y).graph
    assert set(clone_op_names(traced.as_graph_def())) == set(applied.clones)
    for r in step.plan.recompute.recomputes:
        original = traced.get_operation_by_name(r.tensor.rsplit(":", 1)[0])
        rebuilt = traced.get_tensor_by_name(r.output)
        assert rebuilt.op.type == original.type and rebuilt.op.type in RECOMPUTABLE_TYPES
        for c in r.consumers:  # the readers read the rebuilt copy, not the original
            inputs = [t.name for t in traced.get_operation_by_name(c).inputs]
            assert r.output in inputs and r.tensor not in inputs
    return step


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("model", ["mlp", "cnn_bn", "residual"])
def test_recompute_with_emulated_swaps_trains_bitwise_identically(cases, model, config_name):
    _check(cases[model], CONFIGS[config_name], emulate=True)


@pytest.mark.parametrize("config_name", ["swap+recompute", "fused-lb3+recompute"])
@pytest.mark.parametrize("model", ["cnn_bn", "residual"])
def test_recompute_with_device_swaps_trains_bitwise_identically(cases, model, config_name):
    _check(cases[model], CONFIGS[config_name], emulate=False)


@pytest.mark.parametrize("model", sorted(RECOMPUTING))
def test_clones_survive_grappler_as_ops_of_their_own(cases, model):
    case = cases[model]
    step = _check(case, CONFIGS["swap+recompute"], emulate=False)
    optimized = optimized_graph_def(step.get_concrete_function(case.x, case.y))
    survived = set(clone_op_names(optimized))
    assert survived == set(step.applied.clones)
    nodes = {n.name: n for n in optimized.node}
    for r in step.plan.recompute.recomputes:
        # the original is still there too (its forward readers need it): not merged into one node
        assert r.clones[-1].op in nodes and r.clones[-1].name in nodes
    # and in the graph the runtime ran (oneDNN's rewrites included)
    fresh = lms.function(case.step_fn(), config=CONFIGS["swap+recompute"], emulate=False)
    executed = executed_graph_defs(fresh, case.x, case.y)
    case.reset()
    ran = {n for gd in executed for n in clone_op_names(gd)}
    assert len(ran) >= len(fresh.applied.clones) > 0


def test_summary_and_log_report_the_recomputed_tensors(cases, caplog):
    import logging

    case = cases["residual"]
    step = lms.function(case.step_fn(), config=CONFIGS["swap+recompute"])
    with caplog.at_level(logging.INFO, logger="lms.tf.rewriter"):
        case.run(step, k=1)
    summary = step.summary
    as_dict = summary.to_dict()
    assert as_dict["recomputed"] == list(summary.recomputed) and as_dict["n_clones"] == summary.n_clones
    assert any(f"recomputes {len(summary.recomputed)} tensors" in r.getMessage() for r in caplog.records)


# ---- randomness and state --------------------------------------------------------------

def _dropout_case() -> Case:
    keras.utils.set_random_seed(5)
    inp = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(6, 3, padding="same")(inp)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.ReLU()(h)
    h = keras.layers.Dropout(0.3, seed=11)(h)
    h = keras.layers.Conv2D(6, 3, padding="same")(h)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.ReLU()(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    h = keras.layers.Dropout(0.2, seed=12)(h)
    out = keras.layers.Dense(3)(h)
    model = keras.Model(inp, out, name="drop_model")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 8, 8, 3)).astype("float32")
    y = rng.integers(0, 3, (4,)).astype("int32")
    return Case("dropout", model, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                keras.optimizers.SGD(0.05, momentum=0.9), x, y)


class _SeededCase(Case):
    """Also restores the dropout layers' seed-generator state, so every run draws the same masks."""

    def reset(self) -> None:
        super().reset()
        for layer, state in zip(self._dropouts(), self._states):
            layer.seed_generator.state.assign(state)

    def _dropouts(self):
        return [layer for layer in self.model.layers if isinstance(layer, keras.layers.Dropout)]

    def __post_init__(self) -> None:
        super().__post_init__()
        self._states = [layer.seed_generator.state.numpy() for layer in self._dropouts()]


def test_dropout_and_its_seed_state_are_never_recomputed():
    base = _dropout_case()
    case = _SeededCase(base.name, base.model, base.loss_fn, base.optimizer, base.x, base.y)
    again = case.run(tf.function(case.step_fn()))
    assert_bitwise(case.baseline, again)  # the masks are reproducible, so the comparison means something
    step = lms.function(case.step_fn(), config=LMSConfig(recompute="cheap"), emulate=True)
    assert_bitwise(case.baseline, case.run(step))
    graph, plan = step.graph, step.plan
    rp = plan.recompute
    assert rp.n_recomputed > 0  # the BatchNorm -> ReLU chains are
    random_ops = {o.name for o in graph if "Random" in o.type or "Stateless" in o.type}
    stateful = {o.name for o in graph if o.type in ("ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp")}
    assert random_ops  # the model does draw
    dropout_scope = {o.name for o in graph if "stateless_dropout/" in o.name}
    for r in rp.recomputes:
        for c in r.clones:
            assert c.op not in random_ops | stateful | dropout_scope, c
        for s in r.sources:
            assert graph.producer(s).name not in random_ops | dropout_scope, s
    # the dropout outputs the backward pass reads are swapped or kept, and the plan says why
    saved_dropout = [t for t in (s.tensor for s in plan.swaps) if t.rsplit(":", 1)[0] in dropout_scope]
    reasons = {k.tensor: k.reason for k in rp.skipped}
    assert len(saved_dropout) >= 3  # the masks (GreaterEqual) and the first dropout's output (SelectV2)
    assert all("random draw" in reasons[t] for t in saved_dropout)


def test_keras_fit_with_recompute_is_bitwise_identical():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((12, 8, 8, 3)).astype("float32")
    y = rng.integers(0, 3, (12,)).astype("int32")

    def build(cls, **kw):
        keras.utils.set_random_seed(9)
        inputs = keras.Input((8, 8, 3))
        h = keras.layers.Conv2D(6, 3, padding="same")(inputs)
        h = keras.layers.BatchNormalization()(h)
        h = keras.layers.ReLU()(h)
        r = keras.layers.Conv2D(6, 3, padding="same")(h)
        r = keras.layers.BatchNormalization()(r)
        h = keras.layers.ReLU()(keras.layers.Add()([h, r]))
        out = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(h))
        return cls(inputs, out, **kw)

    def fit(model, initial):
        for v, value in zip(model.weights, initial):
            v.assign(value)
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        return RunResult(tuple(np.float32(v) for v in history.history["loss"]),
                         tuple(v.numpy() for v in model.weights),
                         tuple(v.numpy() for v in model.optimizer.variables))

    plain = build(keras.Model)
    initial = [v.numpy() for v in plain.weights]
    expected = fit(plain, initial)
    for config in (LMSConfig(recompute="cheap"), LMSConfig(n_tensors=0, recompute="cheap")):
        model = build(lms.LMSModel, lms_config=config)
        assert_bitwise(expected, fit(model, initial))
        assert model.lms.summary.recomputed


def test_k_steps_is_what_the_cases_train():
    assert K_STEPS >= 3  # the comparisons above cover optimizer state after several updates
