"""Real users' training programs train bitwise identically with LMS (`tests/tf/realworld.py`).

Every pattern runs 3 steps under ``tf.function`` (or plain ``fit``) and under
LMS with each of `CONFIGS` (emulated and device swap ops, both trigger
strategies); losses and every model, optimizer and metric variable must be
equal bit for bit, and something must have been swapped.
"""

from __future__ import annotations

import gc
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import lms  # noqa: E402
from tests.tf import realworld  # noqa: E402
from tests.tf.realworld import CONFIGS, FITS, LOOPS, lms_config  # noqa: E402

pytestmark = [pytest.mark.tf, pytest.mark.slow]


class _Built(dict):
    def __init__(self, builders):
        super().__init__()
        self._builders = builders

    def __missing__(self, key):
        pattern = self._builders[key]()
        self[key] = (pattern, pattern.run(tf.function)[0] if key in LOOPS else pattern.run()[0])
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
    assert step.summary.n_swapped > 0
    assert not [r for r in caplog.records if "another position" in r.getMessage()]  # swap-in names sort right


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("name", list(FITS))
def test_fit_trains_bitwise_identically(fits, name, config_name):
    fit, baseline = fits[name]
    config, emulate = lms_config(config_name)
    got, model = fit.run(lambda m: lms.enable_lms(m, config, emulate=emulate))  # before compile
    assert baseline.differences(got) == []
    assert model.lms.summary.n_swapped > 0


# ---- issue 11's two cases that Grappler's arithmetic optimizer broke ----------------------

@pytest.mark.parametrize("emulate", [True, False])
def test_vae_exp_swap_alone_is_bitwise_identical(loops, emulate):
    """Swapping only ``exp(0.5 * z_log_var)``: its backward ``Mul``s must keep their operand order."""
    loop, baseline = loops["vae"]
    got, step = loop.run(lambda f: lms.function(f, config=lms.LMSConfig(incl_types=["Exp"]), emulate=emulate))
    assert [s.tensor for s in step.summary.swapped] == ["Exp:0"]
    assert baseline.differences(got) == []


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
    proc = subprocess.run([sys.executable, "-m", "tests.tf.realworld", "mirrored"], cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_mirrored_strategy_custom_loop_rewrites_each_replica_bitwise(mirrored_results, config_name):
    result = mirrored_results[f"mirrored_loop/{config_name}"]
    assert result["differences"] == []
    assert result["n_swapped"] > 0 and result["devices"] == ["replica_0", "replica_1"]
    assert result["cross_replica_triggers"] == 0  # a replica's swap-ins wait for its own ops only
    assert result["batch_size"] == 4  # one replica's share of the global batch of 8


@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_mirrored_strategy_fit_is_bitwise_identical(mirrored_results, config_name):
    result = mirrored_results[f"mirrored_fit/{config_name}"]
    assert result["differences"] == [] and result["n_swapped"] > 0
