"""Search logic without TensorFlow: the space, the ask/tell loop with the simulator, resume, picks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from lms import LMSConfig
from tests.synthetic import residual
from tuner.policy.batch import predict_max_batch, usable_bytes
from tuner.study.progress import Progress
from tuner.policy.knobs import canonical_key
from tuner.study.loop import optimize
from tuner.policy.pareto import pareto_picks
from tuner.policy.records import predicted_record
from tuner.policy.records import TrialRecord
from tuner.study.recovery import recover_stale_trials
from tuner.search import run_search
from tuner.study.settings import SearchSettings, study_settings_conflict
from tuner.policy.space import DistinctCounter, SearchSpace
from tuner.study.study import make_sampler
from tuner.study.storage import open_storage, resolve_storage

MiB = 1 << 20
optuna.logging.set_verbosity(optuna.logging.WARNING)


# ---------------------------------------------------------------- the space

def test_space_levels_for_resnet50_sized_graph() -> None:
    space = SearchSpace(n_candidates=213)
    assert space.n_tensor_step == 27 and space.n_tensor_high == 216
    assert space.config_of({"n_tensors": 216, "lb": 4}).n_tensors == -1  # the top level means "all"
    assert space.config_of({"n_tensors": 189, "lb": 4}).n_tensors == 189


def test_space_small_graph_has_one_level_per_tensor() -> None:
    space = SearchSpace(n_candidates=3)
    assert (space.n_tensor_step, space.n_tensor_high) == (1, 3)
    assert sorted({p["n_tensors"] for p in space.grid()}) == [0, 1, 2, 3]


def test_grid_is_the_whole_space() -> None:
    space = SearchSpace(n_candidates=213)
    grid = space.grid()
    # n_tensors x lb x fuse x strategy x (no branches + 3 thresholds) x (schedule tf + memory x 2 prefetch)
    # x sync_mode x recompute
    assert len(grid) == 9 * 5 * 2 * 2 * 4 * 3 * 2 * 2
    keys = {canonical_key(space.config_of(p)) for p in grid}
    swap_knobs = 5 * 2 * 2 * 4 * 2  # lb, fuse, strategy, branches, sync_mode: meaningless without swaps or clones
    # n_tensors=0 without recompute: one config per schedule (no LMS; an order pinned alone);
    # n_tensors=0 with recompute: the swap knobs still shape the clones' triggers (and count as planning apart,
    # prefetch too).
    assert len(keys) == 2 + 3 * swap_knobs + 8 * swap_knobs * 3 * 2
    assert {p["lb"] for p in grid} == {1, 4, 7, 10, 13}
    assert {p.get("branch_threshold") for p in grid} == {None, 10, 25, 40}


def test_config_of_is_canonical() -> None:
    space = SearchSpace(n_candidates=50)
    off = space.config_of({"n_tensors": 0, "lb": 10, "fuse_swapins": True, "ctrld_strategy": "direct_order",
                           "swap_branches": True, "branch_threshold": 25})
    assert off == LMSConfig(n_tensors=0)
    no_branches = space.config_of({"n_tensors": 7, "lb": 4, "swap_branches": False, "branch_threshold": 25})
    assert no_branches.branch_threshold == 0 and not no_branches.swap_branches
    assert canonical_key(LMSConfig(n_tensors=0, lb=5)) == canonical_key(LMSConfig(n_tensors=0))
    assert canonical_key(LMSConfig(lb=5)) != canonical_key(LMSConfig(lb=4))


def test_suggest_matches_fixed_params() -> None:
    space = SearchSpace(n_candidates=20)
    params = {"n_tensors": 9, "lb": 7, "fuse_swapins": True, "ctrld_strategy": "direct_order",
              "swap_branches": True, "branch_threshold": 40, "schedule": "memory", "sync_mode": 1,
              "recompute": "cheap", "prefetch": "headroom"}
    config = space.suggest(optuna.trial.FixedTrial(params))
    assert config == LMSConfig(n_tensors=9, lb=7, fuse_swapins=True, ctrld_strategy="direct_order",
                               swap_branches=True, branch_threshold=40, schedule="memory", sync_mode=1,
                               recompute="cheap", prefetch="headroom")


def test_warm_start_params() -> None:
    space = SearchSpace(n_candidates=20)
    assert space.config_of(space.baseline_params()) == LMSConfig(n_tensors=0)
    assert space.config_of(space.tflms_default_params()) == LMSConfig()  # TFLMS's defaults
    # every search starts from those and from each knob's `warm` value on top of TFLMS's defaults
    assert [space.config_of(p) for p in space.warm_start_params()] == [
        LMSConfig(n_tensors=0), LMSConfig(), LMSConfig(schedule="memory")]


# ---------------------------------------------------------------- the loop

def _simulated_study(graph, budget: int, *, n_trials: int, seed: int = 0, storage=None):
    from lms.plan import find_candidates

    space = SearchSpace(n_candidates=len(find_candidates(graph, LMSConfig())[0]))
    usable = usable_bytes(budget, 0.05)
    if storage is not None:
        storage = open_storage(resolve_storage(storage, "t"))  # WAL: fast commits
    study = optuna.create_study(directions=["maximize", "maximize"], sampler=make_sampler("tpe", seed=seed),
                                storage=storage, study_name="t", load_if_exists=True)
    for params in (space.baseline_params(), space.tflms_default_params()):
        study.enqueue_trial(params, user_attrs={"warm_start": True}, skip_if_exists=True)

    def evaluate(config, trial):
        return predicted_record(config, predict_max_batch(graph, config, usable, device="V100-16GB", cap=4096),
                                 usable=usable, device="V100-16GB")

    ran = optimize(study, space, evaluate, n_trials=n_trials, deadline=None, progress=Progress(disabled=True),
                   desc="t")
    return study, ran, space, usable


def test_optimize_records_trials_with_constraints() -> None:
    graph = residual(6)
    study, ran, space, usable = _simulated_study(graph, 300 * MiB, n_trials=14)
    trials = study.get_trials()
    assert ran == 14 and sum(1 for t in trials if "duplicate_of" not in t.user_attrs) == 14
    baseline, defaults = trials[0], trials[1]
    assert baseline.user_attrs["config"]["n_tensors"] == 0 and baseline.user_attrs["warm_start"]
    assert defaults.user_attrs["config"] == LMSConfig().to_dict()
    for t in trials:
        a = t.user_attrs
        assert t.state == TrialState.COMPLETE
        assert a["backend"] == "simulate" and a["measured"] is False
        assert set(a) >= {"batch_size", "throughput", "peak_device_bytes", "peak_source", "predicted_peak_bytes",
                          "predicted_throughput", "status", "reason", "config", "constraint"}
        assert t.values == [a["batch_size"], a["throughput"]]
        assert t.constraints["memory"] == a["constraint"][0]
        if a["status"] == "ok":
            assert a["peak_device_bytes"] <= usable and a["constraint"][0] <= 0
        else:
            assert a["status"] == "infeasible" and a["constraint"][0] > 0 and t.values == [0.0, 0.0]
    # LMS makes a larger batch fit than no LMS on this graph
    best_batch = max(t.values[0] for t in trials)
    assert best_batch > baseline.values[0]


def test_infeasible_budget_is_recorded_not_failed() -> None:
    study, ran, _, usable = _simulated_study(residual(3), 2 * MiB, n_trials=4)
    for t in study.get_trials():
        assert t.state == TrialState.COMPLETE
        assert t.user_attrs["status"] == "infeasible" and t.constraints["memory"] > 0
        assert "simulator" in t.user_attrs["reason"]


def test_duplicates_are_answered_from_the_study_and_not_counted() -> None:
    calls = []
    space = SearchSpace(n_candidates=4)
    study = optuna.create_study(directions=["maximize", "maximize"], sampler=make_sampler("random", seed=0))
    for _ in range(3):
        study.enqueue_trial({**space.baseline_params(), "n_tensors": 0, "lb": 4, "fuse_swapins": True})

    def evaluate(config, trial):
        calls.append(canonical_key(config))
        return TrialRecord(config, "simulate", False, "ok", 8 + len(calls), 1.0, 10, "sim", 10, 1.0,
                           constraint=-0.5)

    ran = optimize(study, space, evaluate, n_trials=4, deadline=None, progress=Progress(disabled=True), desc="t")
    assert ran == 4 and len(calls) == 4 and len(set(calls)) == 4  # four distinct evaluations
    trials = study.get_trials()
    assert [t.user_attrs.get("duplicate_of") for t in trials[:3]] == [None, 0, 0]
    assert trials[1].values == trials[0].values == [9.0, 1.0]
    assert sum(1 for t in trials if "duplicate_of" not in t.user_attrs) == 4


def test_exhausted_space_stops() -> None:
    space = SearchSpace(n_candidates=1, ranges={"lb": range(1, 2), "branch_threshold": (10,), "schedule": ("tf",),
                                                "sync_mode": (0,), "recompute": ("none",)})
    assert space.n_distinct == 1 + 1 * 1 * 2 * 2 * 2  # off, or n=1 x fuse x strategy x (no branches, 10)

    def evaluate(config, trial):
        return TrialRecord(config, "simulate", False, "ok", 8, 1.0, 10, "sim", 10, 1.0, constraint=-0.5)

    study = optuna.create_study(directions=["maximize", "maximize"], sampler=make_sampler("random", seed=0))
    ran = optimize(study, space, evaluate, n_trials=50, deadline=None, progress=Progress(disabled=True), desc="t")
    assert ran == space.n_distinct


def test_the_distinct_counter_answers_as_the_full_count_does_and_stops_early() -> None:
    small = SearchSpace(n_candidates=1, ranges={"lb": range(1, 2), "branch_threshold": (10,), "schedule": ("tf",),
                                                "sync_mode": (0,), "recompute": ("none",)})
    size = small.n_distinct
    assert size == 9
    assert list(small.iter_distinct()) == list(small.distinct_configs().items())
    counter = DistinctCounter(small)
    for n in range(size + 3):  # asked as the loop asks: the evaluated count only grows
        assert counter.at_most(n) is (n >= size), n
    assert counter.complete and counter.found == size
    # a question about 10 configs of the default ResNet-50 space (8,162 distinct) looks at 11 of them
    big = DistinctCounter(SearchSpace(n_candidates=339))
    assert big.at_most(10) is False and big.found == 11 and not big.complete
    assert big.at_most(3) is False and big.found == 11  # nothing enumerated again


def test_resume_in_same_storage_runs_only_the_rest(tmp_path: Path) -> None:
    graph = residual(4)
    url = f"sqlite:///{tmp_path}/s.db"
    study, ran, _, _ = _simulated_study(graph, 300 * MiB, n_trials=5, storage=url)
    first = [(t.number, t.params, t.values, t.datetime_start) for t in study.get_trials()]
    study2, ran2, _, _ = _simulated_study(graph, 300 * MiB, n_trials=9, storage=url)
    assert ran == 5 and ran2 == 4
    again = [(t.number, t.params, t.values, t.datetime_start) for t in study2.get_trials()][:len(first)]
    assert again == first


def test_recover_stale_trial_requeues_its_params() -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    study = optuna.create_study(directions=["maximize", "maximize"])
    trial = study.ask()
    trial.suggest_int("n_tensors", 0, 8, step=2)
    import socket
    trial.set_user_attr("owner", {"host": socket.gethostname(), "pid": int(dead)})
    live = study.ask()  # owned by this (live) process: left alone
    live.set_user_attr("owner", {"host": socket.gethostname(), "pid": os.getpid()})
    assert recover_stale_trials(study) == 1
    t0 = study.trials[0]
    assert t0.state == TrialState.FAIL and t0.user_attrs["status"] == "interrupted"
    waiting = [t for t in study.trials if t.state == TrialState.WAITING]
    assert len(waiting) == 1 and waiting[0].user_attrs["retry_of"] == 0
    assert waiting[0].system_attrs["fixed_params"] == t0.params
    assert study.trials[1].state == TrialState.RUNNING


def test_pareto_picks_spread_along_front() -> None:
    study = optuna.create_study(directions=["maximize", "maximize"])
    points = [(10, 100.0, 0), (20, 90.0, 27), (30, 70.0, 54), (40, 40.0, 108), (15, 50.0, 81), (40, 30.0, 216)]
    for batch, thr, n in points:
        cfg = LMSConfig(n_tensors=n).to_dict()
        study.add_trial(optuna.trial.create_trial(
            params={"n_tensors": n}, distributions={"n_tensors": optuna.distributions.IntDistribution(0, 216, step=27)},
            values=[batch, thr], user_attrs={"status": "ok", "config": cfg}))
    picks = pareto_picks(study.trials, 3)
    assert len(picks) == 3
    chosen = [p["n_tensors"] for p in picks]
    assert 81 not in chosen and 216 not in chosen  # dominated
    assert set(chosen) <= {0, 27, 54, 108}
    assert {0, 108} & set(chosen)  # an extreme of the front is among the spread picks
    assert pareto_picks(study.trials, 0) == []
    no_baseline = pareto_picks(study.trials, 5, exclude={canonical_key(LMSConfig(n_tensors=0))})
    assert 0 not in [p["n_tensors"] for p in no_baseline] and len(no_baseline) == 3


# ---------------------------------------------------------------- run_search on a cached graph

def _settings(tmp_path: Path, **kw) -> SearchSettings:
    studies = tmp_path / "studies"
    base = dict(study="syn", model="residual", model_options={}, backend="simulate", budget_bytes=300 * MiB,
                budget_source="--budget", device="V100-16GB", trials=10, screen_trials=0,
                storage=resolve_storage(None, "syn", studies_dir=studies), studies_dir=studies, seed=3)
    base.update(kw)
    return SearchSettings(**base)


def _seed_cache(settings: SearchSettings, graph) -> None:
    """A graph cache as the trace worker writes it (here: a synthetic graph, so no TensorFlow runs)."""
    settings.study_dir.mkdir(parents=True, exist_ok=True)
    doc = {"schema": "tuner.graph", "schema_version": 1,
           "key": {"model": settings.model, "model_options": dict(settings.model_options)},
           "graph": graph.to_dict()}
    (settings.study_dir / "graph.json").write_text(json.dumps(doc))


def test_run_search_simulate_writes_outputs(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    _seed_cache(settings, residual(6))
    out = run_search(settings)
    assert out.ran == 10 and out.completed == 10 and not out.stopped_early
    doc = json.loads(out.recommended_path.read_text())
    assert doc["schema"] == "tuner.recommendation" and doc["schema_version"] == 1
    assert doc["backend"] == "simulate" and doc["measured"] is False
    assert all(v.startswith("predicted") for v in doc["sources"].values())
    assert LMSConfig.load(out.recommended_path) == LMSConfig.from_dict(doc["config"])
    assert doc["peak_device_bytes"] <= doc["usable_bytes"] == usable_bytes(300 * MiB, 0.05)
    assert doc["baseline"]["batch_size"] <= doc["batch_size"]
    import pandas as pd
    frame = pd.read_csv(out.trials_csv)
    assert len(frame) == 10 and set(frame["backend"]) == {"simulate"} and not frame["measured"].any()
    # a second run with more trials resumes: the first ten are untouched
    out2 = run_search(_settings(tmp_path, trials=13))
    assert out2.ran == 3 and out2.completed == 13


def test_resume_with_other_settings_is_refused(tmp_path: Path) -> None:
    from tuner.errors import BadInput

    settings = _settings(tmp_path, trials=3)
    _seed_cache(settings, residual(3))
    run_search(settings)
    with pytest.raises(BadInput, match="budget"):
        run_search(_settings(tmp_path, budget_bytes=400 * MiB))
    with pytest.raises(BadInput, match="device"):
        run_search(_settings(tmp_path, device="A100-80GB"))


def test_settings_conflict_messages(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    assert study_settings_conflict(None, settings) == ""
    assert study_settings_conflict({**settings.identity(), "budget_bytes": 300 * MiB}, settings) == ""
    assert "model" in study_settings_conflict({**settings.identity(), "model": "mlp"}, settings)


def test_parallel_workers_share_one_study_without_double_work() -> None:
    """Threads (one per GPU) on one study: no queued trial popped twice, no overshoot."""
    import threading
    import time as _time

    space = SearchSpace(n_candidates=40)
    study = optuna.create_study(directions=["maximize", "maximize"], sampler=make_sampler("tpe", seed=0))
    for n in (0, 5, 10, 15, 20, 25):
        study.enqueue_trial({**space.baseline_params(), "n_tensors": n})
    seen: list[tuple[int, str]] = []
    lock = threading.Lock()

    def evaluate(config, trial):
        with lock:
            seen.append((trial.number, canonical_key(config)))
        _time.sleep(0.02)
        return TrialRecord(config, "emulated", True, "ok", 8 + config.n_tensors, 100.0 - config.n_tensors, 10,
                           "tf-bfc-cpu", 10, 1.0, constraint=-0.5)

    stop = threading.Event()
    threads = [threading.Thread(target=optimize, args=(study, space, evaluate),
                                kwargs=dict(n_trials=10, deadline=None, progress=Progress(disabled=True), desc="t",
                                            seed=i, stop=stop, own_progress=False)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    numbers = [n for n, _ in seen]
    assert len(numbers) == len(set(numbers))  # every trial evaluated once
    assert len(seen) == 10  # no overshoot
    # two threads may draw the same new config at the same moment (neither result is stored yet)
    assert len({k for _, k in seen}) >= 9
    assert {n for n in range(6)} <= set(numbers)  # the six queued trials each ran


def test_pareto_picks_start_where_the_recommendation_rule_points() -> None:
    """The first pick is the largest batch within `min_throughput_ratio` of the front's best throughput
    (the baseline's, excluded from the picks), not the best normalised sum."""
    study = optuna.create_study(directions=["maximize", "maximize"])
    points = [(35, 86.0, 0), (150, 80.0, 27), (170, 70.0, 54), (189, 69.5, 81), (200, 60.0, 108)]
    for batch, thr, n in points:
        study.add_trial(optuna.trial.create_trial(
            params={"n_tensors": n}, distributions={"n_tensors": optuna.distributions.IntDistribution(0, 216, step=27)},
            values=[batch, thr], user_attrs={"status": "ok", "config": LMSConfig(n_tensors=n).to_dict()}))
    base = {canonical_key(LMSConfig(n_tensors=0))}
    assert pareto_picks(study.trials, 1, exclude=base)[0]["n_tensors"] == 81  # 69.5 >= 0.8 x 86; 60 is not
    assert pareto_picks(study.trials, 1, exclude=base, min_throughput_ratio=0.6)[0]["n_tensors"] == 108
    assert pareto_picks(study.trials, 1, exclude=base, prefer="throughput")[0]["n_tensors"] == 27


def test_screen_ladder_covers_every_n_tensors_level_of_the_warm_starts() -> None:
    space = SearchSpace(n_candidates=20)
    ladder = [space.config_of(p) for p in space.ladder_params()]
    step = space.n_tensor_step
    levels = [n for n in range(step, space.n_tensor_high, step)]
    assert len(levels) == 6 and ladder == [LMSConfig(n_tensors=n, schedule="memory") for n in levels]
    # a space with no warm values: the levels on TFLMS's defaults
    plain = SearchSpace(n_candidates=20, ranges={"schedule": ("tf",)})
    assert [plain.config_of(p) for p in plain.ladder_params()] == [LMSConfig(n_tensors=n) for n in levels]
