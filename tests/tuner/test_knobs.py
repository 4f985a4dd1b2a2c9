"""The knob table: one place (LMSConfig's field metadata) from which the tuner searches, dedups, records, reports.

The last test adds a knob to a copy of the table (a subclass of LMSConfig with
one more field) and sees it searched by the study loop, written to
``trials.csv`` and shown by the report, with no tuner code touched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import optuna
import pandas as pd
import pytest

from lms import LMSConfig
from lms.config import knob
from tests.synthetic import residual
from tuner.policy.batch import predict_max_batch, usable_bytes
from tuner.policy.knobs import KNOB_TABLE, KnobTable, canonical_key, short_label, swap_note
from tuner.study.loop import optimize
from tuner.outputs import write_trials_csv
from tuner.study.progress import Progress
from tuner.policy.records import predicted_record
from tuner.report.data import report_data
from tuner.report.html import render_html
from tuner.report.markup import config_knobs
from tuner.policy.space import SearchSpace
from tuner.study.study import make_sampler

MiB = 1 << 20
optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_table_is_lms_configs_fields_in_order() -> None:
    assert [k.name for k in KNOB_TABLE.knobs] == list(LMSConfig().to_dict())
    assert KNOB_TABLE.columns == ("n_tensors", "lb", "ub", "fuse_swapins", "ctrld_strategy", "swap_branches",
                                  "branch_threshold", "schedule", "serialization_by_size", "sync_mode", "recompute",
                                  "prefetch")
    assert [k.name for k in KNOB_TABLE.searched] == ["n_tensors", "lb", "fuse_swapins", "ctrld_strategy",
                                                      "swap_branches", "branch_threshold", "schedule", "sync_mode",
                                                      "recompute", "prefetch"]
    assert KNOB_TABLE.always_shown == ("n_tensors", "lb")


@pytest.mark.parametrize("a, b, same", [
    (LMSConfig(n_tensors=0, lb=10, fuse_swapins=True), LMSConfig(n_tensors=0), True),  # LMS off: nothing else counts
    (LMSConfig(n_tensors=0, incl_scopes=("a",)), LMSConfig(n_tensors=0), True),
    (LMSConfig(n_tensors=5, branch_threshold=25), LMSConfig(n_tensors=5), True),  # needs swap_branches
    (LMSConfig(n_tensors=5, swap_branches=True, branch_threshold=25),
     LMSConfig(n_tensors=5, swap_branches=True, branch_threshold=10), False),
    (LMSConfig(n_tensors=5, ub=20), LMSConfig(n_tensors=5), False),
    (LMSConfig(n_tensors=5, lb=4), LMSConfig(n_tensors=5), False),
    (LMSConfig(n_tensors=0, sync_mode=3), LMSConfig(n_tensors=0), True),  # sync_mode paces swaps only
    (LMSConfig(n_tensors=0, schedule="memory"), LMSConfig(n_tensors=0), False),  # an order pinned without swaps
    (LMSConfig(n_tensors=0, recompute="cheap"), LMSConfig(n_tensors=0), False),
    # prefetch places swap-ins: nothing to place without swaps
    (LMSConfig(n_tensors=0, schedule="memory", prefetch="headroom"), LMSConfig(n_tensors=0, schedule="memory"), True),
    (LMSConfig(n_tensors=5, schedule="memory", prefetch="headroom"), LMSConfig(n_tensors=5, schedule="memory"), False),
])
def test_canonical_key_is_equal_exactly_when_configs_plan_alike(a, b, same) -> None:
    assert (canonical_key(a) == canonical_key(b)) is same


def test_canonical_key_is_the_sorted_json_of_the_canonical_config() -> None:
    """Study records written before the table keep matching: the key's text did not change."""
    config = LMSConfig(n_tensors=0, lb=7)
    assert canonical_key(config) == json.dumps(LMSConfig(n_tensors=0).to_dict(), sort_keys=True)
    on = LMSConfig(n_tensors=3, swap_branches=False, branch_threshold=40)
    assert canonical_key(on) == json.dumps(on.replace(branch_threshold=0).to_dict(), sort_keys=True)


@pytest.mark.parametrize("config, label", [
    (LMSConfig(n_tensors=0, lb=4), "no LMS"),
    (LMSConfig(), "n_tensors=-1 lb=1"),
    (LMSConfig(n_tensors=40, lb=4, fuse_swapins=True, ctrld_strategy="direct_order", swap_branches=True,
               branch_threshold=25), "n_tensors=40 lb=4 fuse direct_order branches>25"),
    (LMSConfig(n_tensors=40, branch_threshold=25), "n_tensors=40 lb=1"),
    (LMSConfig(n_tensors=0, schedule="memory", sync_mode=2), "no swaps schedule=memory"),
    (LMSConfig(n_tensors=-1, schedule="memory", sync_mode=1, recompute="cheap"),
     "n_tensors=-1 lb=1 schedule=memory sync=1 recompute=cheap"),
])
def test_short_label(config, label) -> None:
    assert short_label(config) == label


@pytest.mark.parametrize("config, note, knobs", [
    (LMSConfig(n_tensors=0, lb=4), "LMS off", "n_tensors=0 (LMS off)"),
    # recompute without swaps saves memory: not "LMS off" (issue 51); the swap knobs (lb) mean nothing
    (LMSConfig(n_tensors=0, lb=4, recompute="cheap"), "no swaps", 'n_tensors=0 (no swaps), recompute="cheap"'),
    (LMSConfig(n_tensors=0, schedule="memory"), "no swaps", 'n_tensors=0 (no swaps), schedule="memory"'),
    (LMSConfig(n_tensors=5, lb=3, recompute="cheap"), "", 'n_tensors=5, lb=3, recompute="cheap"'),
])
def test_only_a_config_that_does_nothing_is_labelled_lms_off(config, note, knobs) -> None:
    assert swap_note(config) == swap_note(config.to_dict()) == note
    assert config_knobs(config.to_dict()) == knobs


def test_integer_knobs_are_bounded_with_the_field_named() -> None:
    with pytest.raises(ValueError, match=r"LMSConfig.n_tensors=<a 1329-bit integer>: must be between"):
        LMSConfig(n_tensors=10**400)
    with pytest.raises(ValueError, match=r"LMS config key 'lb'|LMSConfig.lb=2147483648"):
        LMSConfig.from_dict({"lb": 2**31})


# ---------------------------------------------------------------- a new knob, end to end

@dataclass(frozen=True)
class _DummyConfig(LMSConfig):
    """LMSConfig plus one knob the planner ignores (searched over 3 values, shown when changed)."""

    dummy_knob: int = knob(0, search=(0, 1, 2), label="dummy={value}")


def test_a_new_knob_is_searched_recorded_in_trials_csv_and_reported(tmp_path: Path) -> None:
    table = KnobTable(_DummyConfig)
    assert table.columns[-1] == "dummy_knob" and [k.name for k in table.searched][-1] == "dummy_knob"
    graph = residual(4)
    from lms.plan import find_candidates

    space = SearchSpace(n_candidates=len(find_candidates(graph, LMSConfig())[0]), table=table)
    assert {p["dummy_knob"] for p in space.grid()} == {0, 1, 2}
    # configs that differ only in the new knob are distinct (not swaps_only: it counts with LMS off too)
    assert space.n_distinct == 3 * SearchSpace(n_candidates=space.n_candidates).n_distinct
    usable = usable_bytes(300 * MiB, 0.05)
    study = optuna.create_study(directions=["maximize", "maximize"], sampler=make_sampler("random", seed=3),
                                study_name="dummy")
    for params in (space.baseline_params(), space.tflms_default_params()):
        study.enqueue_trial(params, user_attrs={"warm_start": True})

    def evaluate(config, trial):
        assert isinstance(config, _DummyConfig)
        pred = predict_max_batch(graph, config, usable, device="V100-16GB", cap=4096)
        return predicted_record(config, pred, usable=usable, device="V100-16GB")

    optimize(study, space, evaluate, n_trials=16, deadline=None, progress=Progress(disabled=True), desc="t")
    trials = study.get_trials(deepcopy=False)
    searched = {t.params.get("dummy_knob") for t in trials}
    assert searched == {0, 1, 2}, searched  # the sampler was asked for it
    recorded = {t.user_attrs["config"]["dummy_knob"] for t in trials if t.user_attrs.get("config")}
    assert recorded == {0, 1, 2}  # and the record carries it
    assert table.short_label(_DummyConfig(n_tensors=3, dummy_knob=2)) == "n_tensors=3 lb=1 dummy=2"

    csv = pd.read_csv(write_trials_csv(tmp_path / "trials.csv", [("dummy", study)], table=table))
    assert "dummy_knob" in csv.columns
    by_number = {t.number: t.user_attrs["config"]["dummy_knob"] for t in trials}
    assert {int(r.number): int(r.dummy_knob) for r in csv.itertuples()} == by_number

    data = report_data("dummy", trials, study_attrs={}, recommendation=None, recommendation_path="r.json",
                       generated="2026-01-01T00:00:00+00:00", table=table)
    assert "dummy_knob" in data.trials.columns and "dummy_knob" in data.table.columns
    assert sorted(set(data.trials["dummy_knob"])) == [0, 1, 2]
    html = render_html(data, {})
    assert "<th>dummy_knob</th>" in html  # a varying knob gets a column in the trial table
