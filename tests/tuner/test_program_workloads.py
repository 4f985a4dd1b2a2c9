"""The user's own program as a workload (issue 51): ``Workload(fit_model=...)`` and ``Workload(train_step=...)``.

The form checks run without TensorFlow. The worker tests run a trial's worker as the search does (a fresh
process): a ``fit`` program is measured through Keras' own ``fit``, at the fixed batch of the pipeline, and a
custom step through `lms.function` at the batch it is called with; both under TensorFlow's default executor.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lms.config import LMSConfig
from lms.tuned import describe_conditions, tuned_elsewhere
from tuner.backends import get_backend
from tuner.models import Workload, load_workload
from tuner.worker.programs import conditions
from tuner.worker.protocol import MeasureRequest, TraceRequest
from tuner.worker.run import run_worker, worker_env


def _batch(b: int, seed: int = 0) -> tuple:
    return np.zeros((b, 4, 4, 3), np.float32), np.zeros((b,), np.int32)


def _noop() -> None:
    return None


# ---------------------------------------------------------------- the forms, without TensorFlow

def test_the_three_forms_are_told_apart_and_described() -> None:
    fit = Workload(name="f", description="d", fit_model=_noop, make_batch=_batch)
    step = Workload(name="s", description="d", train_step=_noop, make_batch=_batch)
    assert (fit.form, fit.program) == ("fit", "model.fit")
    assert (step.form, step.program) == ("train_step", "lms.function")
    described = fit.describe()
    assert described["form"] == "fit" and described["program"] == "model.fit"
    assert described["batch"] == [[[1, 4, 4, 3], "float32"], [[1], "int32"]]
    assert "x_shape" not in described
    assert fit.sample_bytes() == 4 * 4 * 3 * 4 + 4
    builtin = load_workload("residual")
    assert builtin.form == "step" and builtin.describe()["x_shape"]


@pytest.mark.parametrize("kwargs, fragment", [
    ({"fit_model": _noop, "train_step": _noop}, "give fit_model= or train_step=, not both"),
    ({"fit_model": _noop, "build_model": _noop}, "fit_model= is the whole program; build_model belong"),
    ({"train_step": 3}, "Workload.train_step=3: must be callable"),
    ({}, "Workload.build_model=None: must be callable (or give fit_model= or train_step="),
])
def test_a_mixed_or_missing_form_is_refused_in_one_line(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValueError) as err:
        Workload(name="w", description="d", make_batch=_batch, **kwargs)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_the_examples_load_as_their_forms() -> None:
    assert load_workload("examples/unet_fit.py:make_workload").form == "fit"
    assert load_workload("examples/dcgan_fit.py:make_workload").form == "fit"
    loop = load_workload("examples/gan_loop.py:make_workload")
    assert loop.form == "train_step" and loop.describe()["batch"] == [[1, 32, 32, 3], "float32"]


def test_the_conditions_a_recommendation_records() -> None:
    emulated = get_backend("emulated")
    fit = Workload(name="f", description="d", fit_model=_noop, make_batch=_batch).describe()
    assert conditions(fit, emulated, {"pinned_whole": False}) == {
        "program": "model.fit", "batch_dim": "fixed", "executor": "default", "pinned": "partly"}
    own = load_workload("residual").describe()
    assert conditions(own, emulated, {}) == {"program": "the tuner's step", "batch_dim": "unknown",
                                             "executor": "single_threaded"}
    assert describe_conditions(conditions(fit, emulated, {})) == (
        "model.fit, fixed batch dimension, TF's default executor")


def _recommendation(tmp_path: Path, program: str, usable: int = 1 << 20) -> Path:
    doc = {"schema": "tuner.recommendation", "schema_version": 1, "config": LMSConfig(lb=2).to_dict(),
           "tuned_for": {"batch_size": 12}, "usable_bytes": usable, "budget_bytes": usable + 1,
           "measured_under": {"program": program, "batch_dim": "fixed", "executor": "default"}}
    path = tmp_path / "recommended.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_loaded_recommendation_says_what_it_was_measured_under(tmp_path: Path) -> None:
    import tuner  # noqa: F401 - registers the recommendation schema

    config = LMSConfig.load(_recommendation(tmp_path, "model.fit", usable=5 << 20))
    assert config == LMSConfig(lb=2)
    assert config.tuned["batch_size"] == 12 and config.tuned["usable_bytes"] == 5 << 20
    assert config.tuned["measured_under"]["program"] == "model.fit"
    assert tuned_elsewhere(config, "model.fit") == ""
    said = tuned_elsewhere(config, "lms.function")
    assert said.startswith("this config was tuned for batch 12 measured under model.fit, fixed batch dimension")
    assert "Workload(train_step=...)" in said
    assert LMSConfig(lb=2).tuned is None and tuned_elsewhere(LMSConfig(lb=2), "model.fit") == ""


# ---------------------------------------------------------------- the worker, with TensorFlow

def _measure(tmp_path: Path, model: str, config: LMSConfig, batch: int) -> dict:
    request = MeasureRequest(workload=model, config=config.to_dict(), backend="emulated", usable_bytes=1 << 40,
                             start_batch=batch, cap=batch, fixed_batch=True, warmup=1, steps=3, seed=0)
    out = run_worker(request, workdir=tmp_path / model.replace(":", "_"), timeout_s=300, env=worker_env())
    assert out.status == "ok", (out.status, out.reason, out.log_path)
    return json.loads((tmp_path / model.replace(":", "_") / "result.json").read_text())


@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.parametrize("model", ["tests.program_workloads:tiny_fit", "tests.program_workloads:tiny_gan",
                                   "tests.program_workloads:tiny_loop"])
def test_a_trial_measures_the_program_with_lms_at_its_fixed_batch(tmp_path: Path, model: str) -> None:
    result = _measure(tmp_path, model, LMSConfig(n_tensors=-1, lb=1), batch=6)
    assert result["batch_size"] == 6 and result["peak_source"] == "tf-bfc-cpu"
    assert result["peak_device_bytes"] > 0 and len(result["step_times_s"]) == 3
    summary = result["lms_summary"]
    assert summary["n_swapped"] > 0, summary  # the program's own step was rewritten
    assert result["host_copies_peak_bytes"] and result["host_copies_peak_bytes"] > 0
    plain = _measure(tmp_path / "plain", model, LMSConfig(n_tensors=0), batch=6)
    assert plain["lms_summary"].get("n_swapped", 0) == 0 and plain["host_copies_peak_bytes"] is None


@pytest.mark.tf
@pytest.mark.slow
def test_tracing_a_program_records_every_tape(tmp_path: Path) -> None:
    out_path = tmp_path / "g.json"
    out = run_worker(TraceRequest(workload="tests.program_workloads:tiny_gan", output=str(out_path)),
                     workdir=tmp_path, timeout_s=300, env=worker_env())
    assert out.status == "ok", (out.reason, out.log_path)
    doc = json.loads(out_path.read_text())
    from lms.graph import Graph, Role

    graph = Graph.from_dict(doc["graph"])
    assert doc["workload"]["form"] == "fit"
    backward = [name for name, op in graph.ops.items() if op.role is Role.BACKWARD]
    # the maker's weights get gradients from the second tape only: both tapes were recorded
    assert any("maker" in name and "Conv2DBackpropFilter" in graph.ops[name].type for name in backward), backward
    assert any("critic" in name and "Conv2DBackpropFilter" in graph.ops[name].type for name in backward)


@pytest.mark.tf
def test_a_batch_without_the_batch_size_first_is_bad_input(tmp_path: Path) -> None:
    request = MeasureRequest(workload="tests.program_workloads:bad_batch", config=LMSConfig().to_dict(),
                             backend="emulated", usable_bytes=1 << 40, start_batch=4, cap=4, fixed_batch=True,
                             warmup=1, steps=1)
    out = run_worker(request, workdir=tmp_path, timeout_s=300, env=worker_env())
    assert out.status == "error" and "make_batch(4) gave an array of shape (5, 16, 16, 3)" in out.reason
