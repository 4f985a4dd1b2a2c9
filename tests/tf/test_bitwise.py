"""Training with `lms.function` is bitwise identical to training without LMS.

Each case trains k steps from the same weights and optimizer state with a plain
``tf.function`` and with ``lms.function`` under a config, then compares the loss
of every step, every weight and every optimizer variable bit for bit. The
swap ops must be in the traced graph and in the graph the runtime ran after
Grappler.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import pytest

from tests import forked_cli

tf = pytest.importorskip("tensorflow")

import lms  # noqa: E402
from tests.tf.conftest import assert_bitwise  # noqa: E402
from lms import LMSConfig  # noqa: E402
from lms.tf.graphdefs import executed_graph_defs, swap_op_names  # noqa: E402

pytestmark = pytest.mark.tf

CONFIGS = {
    "chain_rule": LMSConfig(),
    "chain_rule-lb3-fused": LMSConfig(lb=3, fuse_swapins=True),
    "direct_order-lb2": LMSConfig(ctrld_strategy="direct_order", lb=2),
    "direct_order-fused-branches": LMSConfig(ctrld_strategy="direct_order", fuse_swapins=True,
                                             swap_branches=True, branch_threshold=1),
    "chain_rule-branches": LMSConfig(lb=2, swap_branches=True, branch_threshold=2),
    "direct_order-n2": LMSConfig(ctrld_strategy="direct_order", n_tensors=2),
}
DEVICE_CONFIGS = ("chain_rule", "direct_order-fused-branches")


def _check_lms_run(case, config: LMSConfig, *, emulate: bool) -> lms.LMSFunction:
    step = lms.function(case.step_fn(), config=config, emulate=emulate)
    result = case.run(step)
    assert_bitwise(case.baseline, result)
    summary = step.summary
    assert summary.n_swapped > 0
    assert summary.swap_ops == ("emulated" if emulate else "device")
    if config.n_tensors > 0 and not config.swap_branches:
        assert summary.n_swapped == config.n_tensors
    graph = step.get_concrete_function(case.x, case.y).graph
    names = set(swap_op_names(graph.as_graph_def()))
    for swap in step.plan.swaps:
        assert swap.swap_out in names
        assert {si.name for si in swap.swap_ins} <= names
    assert len(step.plan.swaps) == summary.n_swapped
    return step


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("model", ["mlp", "cnn_bn", "residual"])
def test_emulated_swaps_train_bitwise_identically(cases, model, config_name):
    step = _check_lms_run(cases[model], CONFIGS[config_name], emulate=True)
    if model == "residual" and config_name == "direct_order-fused-branches":
        assert any("branch" in s.kind for s in step.summary.swapped)  # the skip connections


@pytest.mark.parametrize("config_name", DEVICE_CONFIGS)
@pytest.mark.parametrize("model", ["mlp", "cnn_bn", "residual"])
def test_device_swaps_train_bitwise_identically(cases, model, config_name):
    _check_lms_run(cases[model], CONFIGS[config_name], emulate=False)


RESNET50_RUNS = {
    "chain_rule-fused-branches-emulated": (
        LMSConfig(lb=3, fuse_swapins=True, swap_branches=True, branch_threshold=20), True),
    "direct_order-paper-branches-device": (
        LMSConfig(ctrld_strategy="direct_order", n_tensors=100, lb=5, swap_branches=True, branch_threshold=5),
        False),
    # the order pinned (lms.schedule): no pin may touch an op Grappler or oneDNN rewrites
    "memory-sync3-branches-emulated": (
        LMSConfig(lb=3, schedule="memory", sync_mode=3, swap_branches=True, branch_threshold=20), True),
    "memory-serialization-branches-device": (
        LMSConfig(n_tensors=100, lb=5, schedule="memory", serialization=["1:"], swap_branches=True,
                  branch_threshold=5), False),
}
# pinned whole (lms.tf.exact): every op of TF's optimized graph on one chain; emulated swap ops
RESNET50_WHOLE_RUNS = {
    "memory-all": LMSConfig(n_tensors=-1, schedule="memory"),
    "memory-recompute-fused": LMSConfig(n_tensors=-1, schedule="memory", recompute="cheap", fuse_swapins=True),
}


def resnet50_worker() -> dict[str, dict]:
    """Every `RESNET50_RUNS` and `RESNET50_WHOLE_RUNS` entry against one baseline; raises if one is not bitwise
    identical."""
    from tests.tf.conftest import BUILDERS

    case = BUILDERS["resnet50"]()
    out = {}
    runs = {**RESNET50_RUNS, **{f"{name}-whole": (config, True) for name, config in RESNET50_WHOLE_RUNS.items()}}
    for name, (config, emulate) in runs.items():
        step = _check_lms_run(case, config, emulate=emulate)
        out[name] = {"n_swapped": step.summary.n_swapped,
                     "kinds": sorted({s.kind for s in step.summary.swapped})}
        whole = step.pinned_whole
        if whole is not None:
            out[name]["whole"] = {"merged": bool(whole.order.merged), "fused": bool(whole.order.fused),
                                  "with_bias": any("WithBias" in k for k in whole.kernels),
                                  "pad_with": any("PadWith" in k for k in whole.kernels)}
        else:
            out[name]["whole_reason"] = step.whole_reason
    return out


@pytest.fixture(scope="module")
def resnet50_results():
    """Run in a fresh process: TF keeps every traced graph (and its captured ResNet-50
    weights, 200 MB) alive through its gradient registry, which would skew later
    in-process memory measurements."""
    root = Path(__file__).resolve().parents[2]
    proc = forked_cli.run_python(["-m", "tests.tf.test_bitwise", "resnet50"], cwd=root, env=dict(os.environ),
                                 timeout=900)  # forked before TensorFlow starts (tests/forked_cli.py)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("run", list(RESNET50_RUNS))
def test_resnet50_trains_bitwise_identically(resnet50_results, run):
    result = resnet50_results[run]
    assert result["n_swapped"] >= 50
    assert any("branch" in kind for kind in result["kinds"])


@pytest.mark.slow
@pytest.mark.parametrize("run", list(RESNET50_WHOLE_RUNS))
def test_resnet50_pinned_whole_trains_bitwise_identically(resnet50_results, run):
    """Pinned whole (`lms.tf.exact`), ResNet-50 trains bit for bit like the plain step.

    oneDNN merges each conv's filter and bias gradients, and conv1's pad into conv1 where nothing else reads
    the pad (with recomputation; swapped, the pad has a second reader): the chain kept every pair adjacent
    with the same control inputs (else oneDNN picks other kernels and the check refuses)."""
    result = resnet50_results[f"{run}-whole"]
    assert "whole" in result, result.get("whole_reason")
    whole = result["whole"]
    assert result["n_swapped"] >= 50
    assert whole["merged"] and whole["with_bias"]
    assert whole["fused"] == whole["pad_with"] == (RESNET50_WHOLE_RUNS[run].recompute != "none")


@pytest.mark.parametrize("emulate", [True, False])
def test_swap_ops_survive_in_the_executed_graph(cases, emulate):
    case = cases["cnn_bn"]
    step = lms.function(case.step_fn(), config=CONFIGS["chain_rule"], emulate=emulate)
    executed = executed_graph_defs(step, case.x, case.y)
    case.reset()
    survived = {n for gd in executed for n in swap_op_names(gd)}
    applied = step.applied
    expected = set(applied.swap_outs + applied.swap_ins)
    if emulate:
        expected |= {f"{name}/shaped" for name in applied.swap_outs}
    assert expected and expected <= survived


def test_summary_plan_and_log(cases, caplog):
    case = cases["cnn_bn"]
    step = lms.function(case.step_fn(), config=LMSConfig(lb=2))
    assert step.summary is None and step.plan is None
    with caplog.at_level(logging.INFO, logger="lms.tf.rewriter"):
        case.run(step, k=1)
    summary = step.summary
    assert summary.n_swapped == len(summary.swapped) == step.plan.n_swapped
    assert summary.swapped_bytes == sum(s.bytes for s in summary.swapped) > 0
    assert summary.batch_size == case.x.shape[0]
    graph = step.get_concrete_function(case.x, case.y).graph
    for s in summary.swapped:
        assert s.bytes == step.graph.tensor_bytes(s.tensor)
        assert s.consumers and s.trigger is not None
        for name in (*s.consumers, s.trigger):
            graph.get_operation_by_name(name)  # exists in the TF graph
    as_dict = summary.to_dict()
    assert as_dict["n_swapped"] == summary.n_swapped and isinstance(as_dict["swapped"][0]["consumers"], list)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("LMS: swapped")]
    assert len(lines) == 1 and f"swapped {summary.n_swapped} tensors" in lines[0]


def test_retrace_replans_for_the_new_batch(cases):
    case = cases["mlp"]
    step = lms.function(case.step_fn(), config=LMSConfig())
    case.run(step, k=1)
    first = step.summary
    step(case.x[:3], case.y[:3])
    case.reset()
    assert first.batch_size == 6 and step.summary.batch_size == 3
    assert step.summary.swapped_bytes * 2 == first.swapped_bytes


@pytest.mark.parametrize("model,config_name", [("mlp", "chain_rule"), ("residual", "direct_order-fused-branches")])
def test_unknown_batch_dim_uses_the_call_batch(cases, model, config_name):
    case = cases[model]
    signature = [tf.TensorSpec([None, *case.x.shape[1:]]), tf.TensorSpec([None, *case.y.shape[1:]], case.y.dtype)]
    # The baseline has the same signature: Grappler optimizes unknown-batch graphs differently.
    baseline = case.run(tf.function(case.step_fn(), input_signature=signature))
    step = lms.function(case.step_fn(), config=CONFIGS[config_name], input_signature=signature)
    assert_bitwise(baseline, case.run(step))
    assert step.summary.batch_size == case.x.shape[0]
    t = step.graph.tensors[step.summary.swapped[0].tensor]
    assert t.shape[0] is None and t.per_sample_bytes > 0 and t.fixed_bytes == 0
    assert step.summary.swapped[0].bytes == t.per_sample_bytes * case.x.shape[0]


def test_lms_off_runs_the_step_unchanged(cases):
    case = cases["mlp"]
    step = lms.function(case.step_fn(), config=LMSConfig(n_tensors=0))
    assert_bitwise(case.baseline, case.run(step))
    assert step.summary.n_swapped == 0
    assert swap_op_names(step.get_concrete_function(case.x, case.y).graph.as_graph_def()) == []


def test_decorator_form_and_dict_config(cases):
    case = cases["mlp"]
    inner = case.step_fn()

    @lms.function(config={"n_tensors": 1, "lb": 2})
    def train_step(x, y):
        return inner(x, y)

    assert isinstance(train_step, lms.LMSFunction)
    assert train_step.__name__ == "train_step"
    assert_bitwise(case.baseline, case.run(train_step))
    assert train_step.summary.n_swapped == 1 and train_step.config.lb == 2


def test_method_decorator(cases):
    case = cases["mlp"]

    class Trainer:
        def __init__(self):
            self.inner = case.step_fn()

        @lms.function(config=LMSConfig(n_tensors=2))
        def train_step(self, x, y):
            return self.inner(x, y)

    trainer = Trainer()
    assert trainer.train_step is trainer.train_step  # one bound function per instance
    assert_bitwise(case.baseline, case.run(trainer.train_step))
    assert trainer.train_step.summary.n_swapped == 2
    assert Trainer.train_step.summary is None  # the unbound one was never traced


# ---- bad input ----------------------------------------------------------------------------

def test_jit_compile_is_refused():
    with pytest.raises(ValueError, match="jit_compile"):
        lms.function(lambda x: x, config=LMSConfig(), jit_compile=True)


@pytest.mark.parametrize("config,match", [
    ({"lb": 0}, "lb"),
    ({"n_tensors": "all"}, "n_tensors"),
    ({"strategy": "chain_rule"}, "unknown LMS config key"),
    ("chain_rule", "LMSConfig"),
    (None, "LMSConfig"),
])
def test_invalid_config_is_refused(config, match):
    with pytest.raises(ValueError, match=match):
        lms.function(lambda x: x, config=config)


def test_a_recommended_json_path_is_a_config(tmp_path, caplog):
    doc = {"schema": "tuner.recommendation", "schema_version": 1, "tuned_for": {"batch_size": 256},
           "config": {"n_tensors": 7, "lb": 3}}
    (tmp_path / "recommended.json").write_text(json.dumps(doc))
    with caplog.at_level(logging.INFO, logger="lms.config"):
        fn = lms.function(lambda x: x, config=str(tmp_path / "recommended.json"))
    assert fn.config == LMSConfig(n_tensors=7, lb=3)
    assert any("tuned for batch 256" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("kwargs,match", [
    ({"bandwidth": 0}, "bandwidth"),
    ({"bandwidth": -5.0}, "bandwidth"),
    ({"bandwidth": 1e9, "emulate": False}, "emulate"),
])
def test_invalid_options_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        lms.function(lambda x: x, config=LMSConfig(), **kwargs)


def test_step_without_gradient_tape_is_a_clear_error():
    step = lms.function(lambda x: tf.reduce_sum(x * 2.0), config=LMSConfig())
    with pytest.raises(ValueError, match="no gradients with tf.GradientTape"):
        step(tf.ones([2, 3]))


def test_running_eagerly_warns_once_and_says_so_in_the_summary(cases, caplog):
    case = cases["mlp"]
    step = lms.function(case.step_fn(), config=LMSConfig())
    tf.config.run_functions_eagerly(True)
    try:
        with caplog.at_level(logging.WARNING, logger="lms.tf.rewriter"):
            eager = case.run(step)
    finally:
        tf.config.run_functions_eagerly(False)
    warnings = [r for r in caplog.records if "running eagerly" in r.getMessage()]
    assert len(warnings) == 1  # three steps, one warning
    summary = step.summary
    assert summary.n_swapped == 0 and summary.swapped == () and summary.batch_size == case.x.shape[0]
    assert "running eagerly" in summary.note and "nothing swapped" in summary.note
    assert len(eager.losses) == 3


def test_inside_an_outer_xla_function_is_refused_with_a_clear_message(cases):
    case = cases["mlp"]
    step = lms.function(case.step_fn(), config=LMSConfig())

    @tf.function(jit_compile=True)
    def outer(x, y):
        return step(x, y)

    with pytest.raises(ValueError, match="jit_compile=True.*bypasses graph-level swap ops"):
        outer(case.x, case.y)
    case.reset()


def test_gradient_tape_is_restored_after_tracing(cases):
    original = tf.GradientTape.gradient
    step = lms.function(cases["mlp"].step_fn(), config=LMSConfig())
    cases["mlp"].run(step, k=1)
    assert tf.GradientTape.gradient is original
    x = tf.Variable(2.0)
    with tf.GradientTape() as tape:
        y = x * x
    assert float(tape.gradient(y, x)) == 4.0
    assert step.summary.n_swapped > 0


if __name__ == "__main__":  # python -m tests.tf.test_bitwise resnet50
    from tuner.trial import exit_now

    if sys.argv[1:] == ["resnet50"]:
        print(json.dumps(resnet50_worker()))
        exit_now(0)  # without TF's teardown (about 2 s)
    else:
        sys.exit("usage: python -m tests.tf.test_bitwise resnet50")
