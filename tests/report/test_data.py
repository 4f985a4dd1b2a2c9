"""The data behind the report's plots and tables, on hand-built studies with known answers."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest

from tuner.report.data import (Recommendation, baseline_trial, environment_rows, knob_effect, knob_label,
                               measurement_note, pareto_front, pareto_mask, prediction_check, recommended_trial,
                               report_data, trial_table, trials_frame)

from .studies import BUDGET, USABLE, GiB, KNOWN, KNOWN_RECORDS, make_study, record, recommendation_doc

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    """The known study, stored in and loaded back from a real SQLite file."""
    root = tmp_path_factory.mktemp("known")
    url, _ = make_study(root, "known", KNOWN_RECORDS, recommended=KNOWN["recommended"])
    study = optuna.load_study(study_name="known", storage=url)
    return study, trials_frame(study.get_trials())


# ---- pareto_mask ------------------------------------------------------------------------------

@pytest.mark.parametrize("points, maximize, expected", [
    # both maximized: (3,1) (2,2) (1,3) trade off; (1,1) is dominated by all of them
    ([[3, 1], [2, 2], [1, 3], [1, 1]], (True, True), [True, True, True, False]),
    # equal points do not dominate each other: both stay
    ([[2, 2], [2, 2], [1, 1]], (True, True), [True, True, False]),
    # weakly dominated (equal in one, worse in the other) is off the front
    ([[2, 5], [2, 4]], (True, True), [True, False]),
    # minimize x, maximize y: smaller and faster wins
    ([[1.0, 10], [2.0, 20], [3.0, 15], [0.5, 5]], (False, True), [True, True, False, True]),
    # a NaN row is never on the front and dominates nothing
    ([[np.nan, 100], [1, 1]], (True, True), [False, True]),
    # a single point is its own front; no points, no front
    ([[7, 7]], (True, True), [True]),
])
def test_pareto_mask_known_fronts(points, maximize, expected):
    assert pareto_mask(points, maximize=maximize).tolist() == expected


def test_pareto_mask_empty_and_bad_shape():
    assert pareto_mask(np.empty((0, 2)), maximize=(True, True)).tolist() == []
    with pytest.raises(ValueError, match="n x 2"):
        pareto_mask([[1, 2, 3]], maximize=(True, True))


@pytest.mark.parametrize("n", [5, 40, 200])
def test_pareto_mask_matches_brute_force(n):
    rng = np.random.default_rng(n)
    pts = rng.integers(0, 8, size=(n, 2)).astype(float)
    mask = pareto_mask(pts, maximize=(True, False))
    for i, p in enumerate(pts):
        dominated = any(q[0] >= p[0] and q[1] <= p[1] and (q[0] > p[0] or q[1] < p[1]) for q in pts)
        assert mask[i] == (not dominated)


# ---- trial frame, fronts, baseline, recommendation -----------------------------------------------

def test_trials_frame_reads_the_trial_records(known):
    _, df = known
    assert df["number"].tolist() == list(range(len(KNOWN_RECORDS)))
    assert df.loc[4, "status"] == "oom" and df.loc[4, "reason"].startswith("batch 40 does not fit")
    assert df["feasible"].tolist() == [True, True, True, True, False, False, True]
    assert df.loc[2, "n_tensors"] == 10 and df.loc[2, "lb"] == 3
    assert df.loc[0, "lms"] is False or df.loc[0, "lms"] == False  # noqa: E712
    # constraint: peak / usable - 1, read from Optuna's constraints (<= 0 fits)
    assert df.loc[0, "constraint"] == pytest.approx((GiB // 2) / USABLE - 1.0)
    assert df.loc[5, "constraint"] == pytest.approx(int(1.1 * GiB) / USABLE - 1.0) and df.loc[5, "constraint"] > 0
    # the OOM trial has no measured peak: the predicted one stands in, and says so
    assert df.loc[4, "peak_bytes"] == int(1.2 * GiB) and bool(df.loc[4, "peak_is_predicted"])
    assert not df.loc[5, "peak_is_predicted"] and df.loc[5, "peak_bytes"] == int(1.1 * GiB)


def test_fronts_of_the_known_study(known):
    _, df = known
    base, rec = baseline_trial(df), KNOWN["recommended"]
    batch = pareto_front(df, x="batch_size", maximize_x=True, baseline=base, recommended=rec)
    memory = pareto_front(df, x="peak_bytes", maximize_x=False, baseline=base, recommended=rec)
    assert batch.front["number"].tolist() == KNOWN["front_batch"]
    assert memory.front["number"].tolist() == KNOWN["front_memory"]
    for front in (batch, memory):
        failed = front.points[front.points["kind"] == "failed"]
        assert sorted(failed["number"]) == KNOWN["failed"]
        assert front.points.loc[front.points["baseline"], "number"].tolist() == [KNOWN["baseline"]]
        assert front.points.loc[front.points["recommended"], "number"].tolist() == [rec]
        assert front.n_unplotted == 0
    # the front line steps through the points in x order
    assert batch.front["x"].tolist() == [8.0, 24.0, 24.0, 32.0]
    assert batch.front["y"].tolist() == [100.0, 90.0, 90.0, 70.0]
    # failed trials keep their (predicted) peak on the memory plot
    failed = memory.points.set_index("number").loc[[4, 5]]
    assert failed["x"].tolist() == [float(int(1.2 * GiB)), float(int(1.1 * GiB))]
    assert failed["predicted"].tolist() == [True, False]


def test_failed_trials_never_join_the_front():
    # a failed trial with a huge batch and throughput would dominate everything if counted
    records = [record(n_tensors=0, batch=8, throughput=10.0, peak=GiB // 4),
               record(n_tensors=-1, batch=999, throughput=999.0, peak=GiB // 8, status="error", reason="boom")]
    df = trials_frame(_frozen(records))
    front = pareto_front(df, x="batch_size", maximize_x=True)
    assert front.front["number"].tolist() == [0]
    assert front.points.set_index("number").loc[1, "kind"] == "failed"


def test_trial_states_other_than_complete_are_failures():
    fail = optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, params={}, distributions={},
                                     user_attrs={})
    df = trials_frame([_with_number(fail, 0)])
    assert df.loc[0, "state"] == "fail" and df.loc[0, "status"] == "error"
    assert not df.loc[0, "feasible"]
    front = pareto_front(df, x="batch_size", maximize_x=True)
    assert front.n_unplotted == 1 and front.points.empty


def test_baseline_is_the_best_no_lms_trial():
    records = [record(n_tensors=0, batch=8, throughput=100.0, peak=GiB // 2),
               record(n_tensors=0, batch=12, throughput=90.0, peak=GiB // 2),
               record(n_tensors=0, batch=12, throughput=95.0, peak=GiB // 2),
               record(n_tensors=0, batch=64, throughput=0.0, peak=None, status="oom"),
               record(n_tensors=4, batch=30, throughput=80.0, peak=GiB // 2)]
    df = trials_frame(_frozen(records))
    assert baseline_trial(df) == 2  # largest feasible batch, then the faster
    assert baseline_trial(df[df["lms"] == True]) is None  # noqa: E712


def test_recommended_trial_by_number_or_by_config(known):
    _, df = known
    by_number = Recommendation.from_document(recommendation_doc(KNOWN_RECORDS, 2))
    assert recommended_trial(df, by_number) == 2
    # without trial_number: the first feasible trial with the same config and batch
    by_config = Recommendation.from_document(recommendation_doc(KNOWN_RECORDS, 6, with_trial_number=False))
    assert recommended_trial(df, by_config) == 6
    stranger = Recommendation(config={"n_tensors": 3}, batch_size=5)
    assert recommended_trial(df, stranger) is None
    assert recommended_trial(df, None) is None


def test_recommendation_document_and_headroom():
    rec = Recommendation.from_document(recommendation_doc(KNOWN_RECORDS, 2))
    peak = int(0.93 * GiB)
    assert rec.batch_size == 24 and rec.throughput == 90.0 and rec.peak_device_bytes == peak
    assert rec.headroom_bytes == BUDGET - peak
    assert rec.headroom_fraction == pytest.approx((BUDGET - peak) / BUDGET)
    assert Recommendation(config={}, batch_size=1, peak_device_bytes=10).headroom_bytes is None
    with pytest.raises(ValueError, match="batch_size"):
        Recommendation.from_document({**recommendation_doc(KNOWN_RECORDS, 2), "batch_size": 0})
    with pytest.raises(ValueError, match="schema"):
        Recommendation.from_document({"schema": "lms.config", "config": {}})


# ---- knobs ------------------------------------------------------------------------------------------

def test_knob_effect_n_tensors(known):
    _, df = known
    effect = knob_effect(df, "n_tensors")
    s = effect.summary
    # display order: off first, counts ascending, "all" last
    assert s["label"].tolist() == ["0 (off)", "5", "10", "all"]
    assert s["position"].tolist() == [0, 1, 2, 3]
    assert s["n_trials"].tolist() == [1, 1, 2, 1]
    row10 = s.set_index("label").loc["10"]
    assert row10["batch_median"] == 24 and row10["throughput_max"] == 90.0
    assert row10["peak_median"] == pytest.approx((int(0.93 * GiB) + int(0.80 * GiB)) / 2)
    assert effect.n_failed == 2  # trials 4 and 5
    assert sorted(effect.points["number"]) == [0, 1, 2, 3, 6]


def test_knob_effect_lb_leaves_out_lms_off_trials(known):
    _, df = known
    effect = knob_effect(df, "lb", lms_only=True)
    assert effect.summary["label"].tolist() == ["1", "3", "5"]
    assert effect.summary["n_trials"].tolist() == [2, 1, 1]  # trials 1, 3 | 2 | 6; not the baseline
    assert 0 not in set(effect.points["number"])
    assert knob_effect(df, "lb").summary["n_trials"].tolist() == [3, 1, 1]


@pytest.mark.parametrize("knob, value, label", [
    ("n_tensors", -1, "all"), ("n_tensors", 0, "0 (off)"), ("n_tensors", 12.0, "12"),
    ("lb", 3.0, "3"), ("ctrld_strategy", "chain_rule", "chain_rule"), ("lb", None, "-"),
])
def test_knob_labels(knob, value, label):
    assert knob_label(knob, value) == label


# ---- words and the table ----------------------------------------------------------------------------

def test_measurement_note_says_what_was_measured():
    measured = record(n_tensors=0, batch=8, throughput=10.0, peak=GiB // 4, backend="emulated", measured=True)
    predicted = record(n_tensors=2, batch=8, throughput=10.0, peak=GiB // 4)
    mixed = measurement_note(trials_frame(_frozen([measured, predicted])), device="CPU")
    assert mixed.startswith("1 of 2 trials were measured on CPU and 1 predicted")
    assert "BFC" in mixed and "lms.simulator" in mixed and "emulated" in mixed
    only_predicted = measurement_note(trials_frame(_frozen([predicted])))
    assert only_predicted.startswith("No trial was measured")
    assert "BFC" not in only_predicted
    assert measurement_note(trials_frame([])) == "The study has no trials yet."


def test_environment_rows_of_a_simulated_study():
    """The layout the search writes: study attrs {"tuner": {...}}, recommended.json with "environment"."""
    rec = Recommendation.from_document(recommendation_doc(KNOWN_RECORDS, 2))
    attrs = {"role": "main", "tuner": {"model": "resnet50", "model_options": {"image_size": 64},
                                       "backend": "simulate", "device": "V100-16GB", "seed": 7,
                                       "budget_bytes": 2 * GiB, "budget_source": "--budget 2GiB",
                                       "command_line": ["python", "-m", "tuner", "search", "--model", "a b"]}}
    rows = dict(environment_rows(study_attrs=attrs, recommendation=rec, df=trials_frame([]), study_name="s"))
    assert rows["model"] == "resnet50 (image_size=64)"
    assert rows["device"] == "simulated V100-16GB profile"
    assert rows["device memory"] == "16.00 GiB"  # from the profile
    assert rows["memory budget"] == "2.00 GiB (2,147,483,648 bytes) [--budget 2GiB]"  # the study's, first
    assert rows["usable"] == "972.80 MiB (safety margin 5%)"
    assert rows["TensorFlow"] == "2.21.0 (tensorflow-cpu)" and rows["Optuna"] == "5.0.0"
    assert rows["host"] == "build-7: Xeon, 2 cores, 8.00 GiB RAM"
    assert rows["seed"] == "7" and rows["command line"] == "python -m tuner search --model 'a b'"
    assert rows["trials"] == "0 (0 feasible)" and "GPU driver" not in rows and "simulator profile" not in rows


def test_environment_rows_of_a_gpu_study():
    rec = Recommendation(config={}, batch_size=4, budget_bytes=2 * GiB,
                         environment={"device_name": "NVIDIA H200", "device_memory_bytes": 141 * GiB,
                                      "driver_version": "560.35"})
    attrs = {"tuner": {"backend": "gpu", "device": "H200-141GB"}}
    rows = dict(environment_rows(study_attrs=attrs, recommendation=rec, df=trials_frame([]), study_name="s"))
    assert rows["device"] == "NVIDIA H200" and rows["simulator profile"] == "H200-141GB"
    assert rows["device memory"] == "141.00 GiB" and rows["GPU driver"] == "560.35"
    assert rows["memory budget"] == "2.00 GiB (2,147,483,648 bytes)"


def test_trial_table_marks_fronts_baseline_and_recommendation(known):
    study, df = known
    data = report_data("known", study.get_trials(), study_attrs=study.user_attrs,
                       recommendation=Recommendation.from_document(recommendation_doc(KNOWN_RECORDS, 2)),
                       recommendation_path="studies/known/recommended.json", generated="now")
    table = data.table
    assert table.loc[table["recommended"], "number"].tolist() == [2]
    assert table.loc[table["baseline"], "number"].tolist() == [0]
    assert table.loc[table["pareto_batch_size"], "number"].tolist() == [0, 1, 2, 6]
    assert table.loc[table["pareto_peak_bytes"], "number"].tolist() == [0]
    assert table.loc[3, "params"] == "fuse_swapins=False, lb=1, n_tensors=5"
    assert data.budget_bytes == BUDGET
    assert [k.knob for k in data.knobs] == ["n_tensors", "lb"]


def test_prediction_check_compares_measured_with_predicted():
    records = [
        record(n_tensors=0, batch=30, throughput=90.0, peak=GiB // 2, backend="emulated", measured=True,
               predicted_batch=40, predicted_throughput=100.0),
        record(n_tensors=4, batch=50, throughput=60.0, peak=GiB // 2, backend="emulated", measured=True,
               predicted_batch=40, predicted_throughput=0.0),
        # skipped by the simulator (not measured) and a measured failure: not compared
        record(n_tensors=8, batch=0, throughput=0.0, peak=None, status="infeasible", backend="emulated"),
        record(n_tensors=9, batch=0, throughput=0.0, peak=None, status="oom", backend="emulated", measured=True,
               predicted_batch=12),
    ]
    check = prediction_check(trials_frame(_frozen(records)))
    assert check["number"].tolist() == [0, 1]
    assert check["batch_ratio"].tolist() == [0.75, 1.25]
    assert check["throughput_ratio"].iloc[0] == pytest.approx(0.9)
    assert math.isnan(check["throughput_ratio"].iloc[1])  # no predicted throughput: no ratio
    assert prediction_check(trials_frame(_frozen(KNOWN_RECORDS))).empty  # nothing measured


# ---- helpers ----------------------------------------------------------------------------------------

def _with_number(trial, number):
    trial.number = number
    return trial


def _frozen(records):
    """FrozenTrials without a storage (trial_table, trials_frame only read their fields)."""
    from .studies import DISTRIBUTIONS

    out = []
    for i, attrs in enumerate(records):
        cfg = attrs["config"]
        t = optuna.trial.create_trial(
            values=[float(attrs["batch_size"]), float(attrs["throughput"] or 0.0)],
            params={"n_tensors": cfg["n_tensors"], "lb": cfg["lb"], "fuse_swapins": cfg["fuse_swapins"]},
            distributions=DISTRIBUTIONS, user_attrs=attrs)
        out.append(_with_number(t, i))
    return out


def test_trials_frame_shows_the_fresh_process_figures_of_confirmed_trials(known):
    """The study's stored fresh processes replace a trial's own figures in every table and plot (one truth with
    recommended.json); trials without them keep theirs."""
    from tuner.policy.bracket import METHOD

    study, own = known
    runs = [{"process": 1, "batch": 30, "status": "ok", "throughput": 80.0, "peak_device_bytes": 900},
            {"process": 2, "batch": 31, "status": "infeasible", "peak_device_bytes": 1001},
            {"process": 3, "batch": 30, "status": "ok", "throughput": 84.0, "peak_device_bytes": 905}]
    df = trials_frame(study.get_trials(), confirmations={"2": {"method": METHOD, "runs": runs, "closed": True}})
    row = df[df["number"] == 2].iloc[0]
    assert (row["batch_size"], row["throughput"], row["peak_device_bytes"]) == (30, 84.0, 905)
    assert row["confirmed"] and row["processes"] == 3
    others = df[df["number"] != 2]
    assert not others["confirmed"].any()
    assert others["batch_size"].tolist() == own[own["number"] != 2]["batch_size"].tolist()


def test_knob_panels_are_the_knobs_that_varied_screen_figures_when_few_were_measured():
    from tuner.report.data import knob_effects

    measured = trials_frame([_trial(0, record(n_tensors=0, batch=8, throughput=100.0, peak=GiB // 2)),
                             _trial(1, record(n_tensors=-1, lb=1, batch=32, throughput=90.0, peak=GiB // 2,
                                              schedule="memory"))])
    screen = trials_frame([_trial(i, record(n_tensors=n, lb=1, batch=b, throughput=90.0, peak=GiB // 2,
                                            schedule=sched))
                           for i, (n, b, sched) in enumerate([(0, 8, "tf"), (-1, 20, "tf"), (-1, 32, "memory"),
                                                              (10, 24, "memory"), (5, 12, "tf")])])
    effects = knob_effects(measured, screen=screen)
    # two measured configs vary nothing worth a panel: the screen's (PREDICTED); lb took one value: no panel
    assert [e.knob for e in effects] == ["n_tensors", "schedule"] and all(e.predicted for e in effects)
    assert effects[1].summary["label"].tolist() == ["memory", "tf"]
    assert [e.knob for e in knob_effects(screen)] == ["n_tensors", "schedule"]  # enough measured: not predicted
    assert not any(e.predicted for e in knob_effects(screen))


def _trial(number: int, attrs: dict) -> optuna.trial.FrozenTrial:
    import datetime

    return optuna.trial.FrozenTrial(
        number=number, state=optuna.trial.TrialState.COMPLETE, value=None,
        values=[attrs["batch_size"], attrs["throughput"]],
        datetime_start=datetime.datetime.now(), datetime_complete=datetime.datetime.now(), params={},
        distributions={}, user_attrs=attrs, system_attrs={}, intermediate_values={}, trial_id=number)
