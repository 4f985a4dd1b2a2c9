"""The peak check under ``model.fit`` (issue 51): ``config="auto"`` and a loaded recommendation.

Before, ``fit`` with ``config="auto"`` peaked above its budget with no word (``lms.function`` warned), and a
``recommended.json`` tuned under another program said nothing. `lms.tf.fit_peaks.FitPeakCheck` reads step 2's
allocator peak under ``fit`` and compares it with the budget.
"""

from __future__ import annotations

import gc
import json
import logging
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import lms  # noqa: E402
import tuner  # noqa: E402,F401 - registers the recommendation schema
from lms import LMSConfig  # noqa: E402
from lms.tf.fit_peaks import batch_that_fits, with_callback  # noqa: E402

pytestmark = pytest.mark.tf
MiB = 1 << 20


def _model():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((32, 32, 3))
    h = keras.layers.Conv2D(16, 3, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.Flatten()(h)))
    return model


def _fit(model, batch: int = 16, steps: int = 3, callbacks=None):
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).random((batch * steps, 32, 32, 3), dtype=np.float32)
    y = np.zeros(batch * steps, np.int32)
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=callbacks)
    gc.collect()


def test_auto_under_fit_warns_when_the_measured_peak_is_over_its_budget(caplog) -> None:
    # the simulator's peak for the step without LMS (auto, with room to spare, chooses no LMS and says it)
    roomy = lms.enable_lms(_model(), "auto", budget=1 << 30)
    _fit(roomy)
    predicted = roomy.lms.summary.auto.peak_bytes
    assert roomy.lms.summary.auto.label == "no LMS" and roomy.lms.peak_check.over_budget is False
    # 10% above that prediction auto still chooses no LMS; fit's own step (Keras' train function, the batch made
    # by the pipeline inside it) peaks higher than the simulator's trace of the step (4.7-8.7 MiB against 3.4)
    # the allocator is the process's: what other tests left in it counts in fit's peak, not in the simulator's
    gc.collect()
    budget = int(predicted * 1.1) + int(tf.config.experimental.get_memory_info("CPU:0")["current"])
    model = lms.enable_lms(_model(), "auto", budget=budget)
    with caplog.at_level(logging.INFO):
        _fit(model)
    check = model.lms.peak_check
    assert model.lms.summary.auto.label == "no LMS"
    assert check.over_budget is True and check.measured_peak_bytes > budget
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "fit_peaks" in r.name]
    assert len(warnings) == 1, warnings
    assert "step 2 of fit) at batch 16, above the" in warnings[0] and "budget config='auto' chose for" in warnings[0]
    fits = batch_that_fits(16, check.measured_peak_bytes, budget, check.in_use[1])
    assert 1 <= fits < 16 and f"about batch {fits} would fit (the step's bytes above the" in warnings[0]


def _recommendation(tmp_path: Path, *, usable: int, program: str) -> Path:
    doc = {"schema": "tuner.recommendation", "schema_version": 1, "config": LMSConfig(n_tensors=-1, lb=1).to_dict(),
           "tuned_for": {"batch_size": 16}, "usable_bytes": usable, "budget_bytes": usable,
           "measured_under": {"program": program, "batch_dim": "fixed", "executor": "default"}}
    path = tmp_path / "recommended.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_recommendation_under_fit_is_checked_against_the_budget_it_was_tuned_to(tmp_path: Path, caplog) -> None:
    small = _recommendation(tmp_path, usable=64 * 1024, program="model.fit")  # 64 KiB: no step fits
    model = lms.enable_lms(_model(), str(small))
    with caplog.at_level(logging.INFO):
        _fit(model)
    check = model.lms.peak_check
    assert check.over_budget is True and check.measured_peak_bytes > 64 * 1024
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("above the 64.00 KiB it was tuned to fit" in m and "not even batch 1 would fit" in m for m in said), said
    assert not any("this config was tuned for batch" in m for m in said)  # measured under model.fit: no mismatch

    caplog.clear()
    large = _recommendation(tmp_path, usable=1 << 40, program="model.fit")
    model = lms.enable_lms(_model(), str(large))
    with caplog.at_level(logging.INFO):
        _fit(model)
    assert model.lms.peak_check.over_budget is False
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("lms")]


def test_a_recommendation_measured_in_another_program_is_named_when_used(tmp_path: Path, caplog) -> None:
    path = _recommendation(tmp_path, usable=1 << 40, program="the tuner's step")
    with caplog.at_level(logging.WARNING):
        lms.enable_lms(_model(), str(path))
        lms.function(lambda x: x, config=LMSConfig.load(path))
    said = [r.getMessage() for r in caplog.records if "this config was tuned for batch 16" in r.getMessage()]
    assert len(said) == 2 and "measured under the tuner's step" in said[0] and "not model.fit" in said[0]
    assert "not lms.function" in said[1]


def test_the_batch_that_fits_scales_only_the_step_s_own_bytes() -> None:
    # 100 MiB in use before the step (weights, optimizer state), the step adds 50 MiB at batch 10
    assert batch_that_fits(10, 150 * MiB, 125 * MiB, 100 * MiB) == 5
    assert batch_that_fits(10, 150 * MiB, 250 * MiB, 100 * MiB) == 30
    assert batch_that_fits(10, 150 * MiB, 99 * MiB, 100 * MiB) == 0     # the budget is gone before the step
    assert batch_that_fits(10, 150 * MiB, 125 * MiB) == 8              # nothing known in use: the whole peak scales


def test_without_a_budget_fit_gets_no_extra_callback() -> None:
    model = lms.enable_lms(_model(), LMSConfig(lb=2))
    _fit(model)
    assert model.lms.peak_check is None


def test_the_callback_is_added_however_fit_was_given_its_callbacks() -> None:
    mine, check = object(), object()
    assert with_callback((), {}, check) == ((), {"callbacks": [check]})
    assert with_callback((), {"callbacks": [mine]}, check)[1]["callbacks"] == [mine, check]
    args, _ = with_callback((1, 2, 3, 4, 5, [mine], 0.1), {}, check)
    assert args == (1, 2, 3, 4, 5, [mine, check], 0.1)
    assert batch_that_fits(10, 200, 100) == 5 and batch_that_fits(10, 2000, 100) == 0
