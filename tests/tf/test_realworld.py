"""Real users' training programs train bitwise identically with LMS (`tests/tf/realworld.py`).

Every pattern runs 3 steps under ``tf.function`` (or plain ``fit``) and under
LMS with each of `CONFIGS` (emulated and device swap ops, both trigger
strategies, pinned memory schedules, recomputation); losses and every model,
optimizer and metric variable must be equal bit for bit, something must have
been swapped or recomputed, and no inserted op (swap-in, recompute clone or
gate) may move among a commutative op's inputs when Grappler sorts them.
"""

from __future__ import annotations

import gc
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from tests import forked_cli

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import lms  # noqa: E402
from tests.tf import realworld, realworld2  # noqa: E402
from tests.tf.realworld import CONFIGS, FITS, LOOPS, lms_config  # noqa: E402

pytestmark = [pytest.mark.tf, pytest.mark.slow]


class _Built(dict):
    def __init__(self, builders):
        super().__init__()
        self._builders = builders

    def __missing__(self, key):
        pattern = self._builders[key]()
        self[key] = (pattern, pattern.run(tf.function)[0] if isinstance(pattern, realworld.Loop) else pattern.run()[0])
        return self[key]


@pytest.fixture(scope="module")
def loops():
    built = _Built(LOOPS)
    yield built
    built.clear()
    gc.collect()  # Keras models hold reference cycles: not while a later test measures the allocator


@pytest.fixture(scope="module")
def fits():
    built = _Built(FITS)
    yield built
    built.clear()
    gc.collect()


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("name", list(LOOPS))
def test_custom_loop_trains_bitwise_identically(loops, name, config_name, caplog):
    loop, baseline = loops[name]
    config, emulate = lms_config(config_name)
    with caplog.at_level(logging.WARNING, logger="lms.tf.apply"):
        got, step = loop.run(lambda f: lms.function(f, config=config, emulate=emulate))
    assert baseline.differences(got) == []
    assert step.summary.n_swapped > 0 or step.summary.recomputed
    assert not step.summary.corrections, step.summary.corrections[:2]  # the planner's rules, not the check
    if config.recompute != "none":
        assert step.summary.recomputed  # every loop has a cheap saved tensor (an activation, a VAE's exp)
    if config.schedule == "memory":  # on this CPU the memory schedule runs pinned whole (lms.tf.exact)
        if name == "mixed_precision":  # LossScaleOptimizer's tf.cond: control flow keeps the partial pins
            assert step.pinned_whole is None and "control flow" in step.whole_reason
        else:
            assert step.pinned_whole is not None, step.whole_reason
    assert not _moved(caplog)


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("name", list(FITS))
def test_fit_trains_bitwise_identically(fits, name, config_name, caplog):
    fit, baseline = fits[name]
    config, emulate = lms_config(config_name)
    with caplog.at_level(logging.WARNING, logger="lms.tf.apply"):
        got, model = fit.run(lambda m: lms.enable_lms(m, config, emulate=emulate))  # before compile
    assert baseline.differences(got) == []
    assert model.lms.summary.n_swapped > 0 or model.lms.summary.recomputed
    assert not model.lms.summary.corrections, model.lms.summary.corrections[:2]
    assert not _moved(caplog)


def _moved(caplog) -> list[str]:
    """`lms.tf.apply`'s warnings that an inserted op's name sorts to another position (swap-ins, clones, gates)."""
    return [r.getMessage() for r in caplog.records if "another position" in r.getMessage()]


# ---- issue 11's two cases that Grappler's arithmetic optimizer broke ----------------------

@pytest.mark.parametrize("emulate", [True, False])
def test_vae_exp_swap_alone_is_bitwise_identical(loops, emulate):
    """Swapping only ``exp(0.5 * z_log_var)``: its backward ``Mul``s must keep their operand order."""
    loop, baseline = loops["vae"]
    got, step = loop.run(lambda f: lms.function(f, config=lms.LMSConfig(incl_types=["Exp"]), emulate=emulate))
    assert [s.tensor for s in step.summary.swapped] == ["Exp:0"]
    assert baseline.differences(got) == []


@pytest.mark.parametrize("config", [{"recompute": "cheap"}, {"recompute": "cheap", "schedule": "memory"}])
@pytest.mark.parametrize("emulate", [True, False])
def test_vae_reparameterisation_recomputed_is_bitwise_identical(loops, emulate, config, caplog):
    """``z = z_mean + exp(0.5 * z_log_var) * eps`` is rebuilt from the exp's output through a gate.

    ``exp(0.5 * z_log_var)`` itself is not recomputed: ``z_log_var`` (a Dense
    output) is not kept for the backward pass, and its ``MatMul`` is not cheap.
    But the chain of ``z`` clones the commutative ``mul_1 = Exp * eps`` (reading
    both through gates) and ``add = z_mean + mul_1`` (reading a kept tensor and
    a clone): each gate and clone must sort where the tensor it stands for did.
    """
    loop, baseline = loops["vae"]
    with caplog.at_level(logging.WARNING, logger="lms.tf.apply"):
        got, step = loop.run(lambda f: lms.function(f, config=lms.LMSConfig(**config), emulate=emulate))
    assert "add:0" in step.summary.recomputed
    (r,) = [r for r in step.plan.recompute.recomputes if r.tensor == "add:0"]
    assert [c.op for c in r.clones] == ["mul_1", "add"] and "Exp:0" in r.sources
    assert all(c.name.startswith(f"{c.op}-lms_recompute_") for c in r.clones)
    assert sorted(g.name.split("-lms_gate_")[0] for g in r.gates) == ["Exp", "eps"]
    assert r.output.startswith("add-lms_recompute_")
    assert baseline.differences(got) == []
    assert not _moved(caplog)


@pytest.mark.parametrize("emulate", [True, False])
def test_multi_head_attention_softmax_swap_alone_is_bitwise_identical(emulate):
    loop = realworld.mha_block()
    baseline, _ = loop.run(tf.function)
    got, step = loop.run(lambda f: lms.function(f, config=lms.LMSConfig(incl_types=["Softmax"]), emulate=emulate))
    assert step.summary.n_swapped == 1 and step.summary.swapped[0].tensor.endswith("Softmax:0")
    assert baseline.differences(got) == []


# ---- MirroredStrategy on two logical CPUs -------------------------------------------------

@pytest.fixture(scope="module")
def mirrored_results():
    """A fresh process: logical CPUs must be configured before TensorFlow starts."""
    root = Path(__file__).resolve().parents[2]
    proc = forked_cli.run_python(["-m", "tests.tf.realworld", "mirrored"], cwd=root, env=dict(os.environ),
                                 timeout=600)  # forked before TensorFlow starts (tests/forked_cli.py)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_mirrored_strategy_custom_loop_rewrites_each_replica_bitwise(mirrored_results, config_name):
    result = mirrored_results[f"mirrored_loop/{config_name}"]
    assert result["differences"] == [] and result["moved_inputs"] == []
    assert result["n_swapped"] > 0 or result["recomputed"]
    if result["n_swapped"]:
        assert result["devices"] == ["replica_0", "replica_1"]
    if result["recomputed"]:
        assert result["recomputed_devices"] == ["replica_0", "replica_1"]
    assert result["cross_replica_triggers"] == 0  # a replica's swap-ins wait for its own ops only
    assert result["batch_size"] == 4  # one replica's share of the global batch of 8


@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_mirrored_strategy_fit_is_bitwise_identical(mirrored_results, config_name):
    result = mirrored_results[f"mirrored_fit/{config_name}"]
    assert result["differences"] == [] and result["moved_inputs"] == []
    assert result["n_swapped"] > 0 or result["recomputed"]


# ---- round two (issue 33): every configuration class the issue ran, emulated and device -------

@pytest.fixture(scope="module")
def loops2():
    built = _Built({**realworld2.LOOPS, **{k: b for k, (b, _) in realworld2.BATCH_PROGRAMS.items()}})
    yield built
    built.clear()
    gc.collect()


@pytest.fixture(scope="module")
def fits2():
    built = _Built(realworld2.FITS)
    yield built
    built.clear()
    gc.collect()


def _dead_swaps(graph, summary) -> list[str]:
    """Swapped tensors whose every reader is an op TensorFlow prunes (their swap-ins would never run).

    A reader not in the traced graph is a recompute clone or gate, which runs before its live readers."""
    return [s.tensor for s in summary.swapped
            if all(c in graph.ops and not graph.ops[c].live for c in s.consumers)]


@pytest.mark.parametrize("config_name", list(realworld2.CONFIGS))
@pytest.mark.parametrize("name", list(realworld2.LOOPS))
def test_round_two_loop_trains_bitwise_identically(loops2, name, config_name):
    loop, baseline = loops2[name]
    fields, emulate = realworld2.CONFIGS[config_name]
    got, step = loop.run(lambda f: lms.function(f, config=lms.LMSConfig(**fields), emulate=emulate))
    assert baseline.differences(got) == []
    summary = step.summary
    assert summary.n_swapped > 0 or summary.recomputed
    assert _dead_swaps(step.graph, summary) == []
    if name == "lstm_seq2seq":  # the loops' accumulators are not swapped, and the summary says why
        assert "While-loop accumulators" in summary.note and "cannot swap" in summary.note
    else:
        assert summary.note == ""


@pytest.mark.parametrize("config_name", list(realworld2.CONFIGS))
@pytest.mark.parametrize("name", list(realworld2.FITS))
def test_round_two_fit_trains_bitwise_identically(fits2, name, config_name, caplog):
    fit, baseline = fits2[name]
    fields, emulate = realworld2.CONFIGS[config_name]
    with caplog.at_level(logging.INFO, logger="lms.tf.rewriter"):
        got, model = fit.run(lambda m: lms.enable_lms(m, lms.LMSConfig(**fields), emulate=emulate))
    assert baseline.differences(got) == []
    summary = model.lms.summary
    assert summary.n_swapped > 0 or summary.recomputed
    assert _dead_swaps(model.lms.graph, summary) == []
    assert summary.batch_size == 8 if name != "hard_swish_fit" else summary.batch_size == 4
    # Keras traces train_step twice (the first trace creates the optimizer's variables): planned once
    assert sum("LMS: swapped" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("name", list(realworld2.BATCH_PROGRAMS))
def test_the_batch_is_the_data_arguments_leading_dimension(loops2, name):
    """Not the leading dimension of the first tensor swapped (patch rows, a concatenation, a state vector)."""
    program, baseline = loops2[name]
    expected = realworld2.BATCH_PROGRAMS[name][1]
    if isinstance(program, realworld.Loop):
        got, step = program.run(lambda f: lms.function(f, config=lms.LMSConfig(), emulate=True))
        summary = step.summary
    else:  # fit on tf.data: the batch is unknown when the step is traced, and observed when it runs
        got, model = program.run(lambda m: lms.enable_lms(m, lms.LMSConfig(), emulate=True))
        summary = model.lms.summary
    assert baseline.differences(got) == []
    assert summary.n_swapped > 0 and summary.batch_size == expected


def test_a_frozen_layers_pruned_gradient_gets_no_swap(fits2):
    """Its filter gradient reads the activation before it, and nothing uses that gradient."""
    fit, _ = fits2["frozen_fit_tf_data"]
    _, model = fit.run(lambda m: lms.enable_lms(m, lms.LMSConfig(), emulate=True))
    graph, summary = model.lms.graph, model.lms.summary
    dead = [op.name for op in graph.ops.values() if not op.live and op.type == "Conv2DBackpropFilter"]
    assert dead  # the frozen layer's
    reasons = {k.tensor: k.reason for k in model.lms.plan.skipped}
    assert any("TensorFlow prunes" in r for r in reasons.values())
    assert _dead_swaps(graph, summary) == [] and summary.batch_size == 8
