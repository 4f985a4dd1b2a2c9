"""``--batch N`` and ``--batch N --grow OPTION`` without TensorFlow: synthetic graphs, the simulate backend."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from lms import LMSConfig
from lms.plan import find_candidates
from tests.synthetic import residual
from tuner.policy.batch import predict_at_batch, predict_max_batch, usable_bytes
from tuner.policy.goal import FixedBatch, MaxBatch, goal_of
from tuner.grow import largest_fitting, run_grow
from tuner.policy.knobs import canonical_key
from tuner.models import load_workload
from tuner.search import run_search
from tuner.study.settings import SearchSettings, study_settings_conflict
from tuner.policy.space import SearchSpace
from tuner.study.storage import resolve_storage

MiB = 1 << 20
optuna.logging.set_verbosity(optuna.logging.WARNING)
BUDGET = 300 * MiB
DEVICE = "V100-16GB"


def _settings(studies: Path, study: str = "syn", **kw) -> SearchSettings:
    base = dict(study=study, model="residual", model_options={}, backend="simulate", budget_bytes=BUDGET,
                budget_source="--budget", device=DEVICE, trials=500, screen_trials=0,
                storage=resolve_storage(None, study, studies_dir=studies), studies_dir=studies, seed=3)
    base.update(kw)
    return SearchSettings(**base)


def _seed_cache(settings: SearchSettings, graph) -> None:
    settings.study_dir.mkdir(parents=True, exist_ok=True)
    doc = {"schema": "tuner.graph", "schema_version": 1,
           "key": {"model": settings.model, "model_options": dict(settings.model_options)}, "graph": graph.to_dict()}
    (settings.study_dir / "graph.json").write_text(json.dumps(doc))


# The swap knobs only (the ordering and recompute knobs held at their defaults): a grid of 641 configs
# that one search can evaluate whole in about a minute.
# swap knobs only, and no branch swaps: 161 configs, a grid the search exhausts in seconds (with
# branch swaps 641, whose Optuna bookkeeping alone took minutes on a loaded 2-core machine)
SWAP_KNOBS_ONLY = {"schedule": ("tf",), "sync_mode": (0,), "recompute": ("none",), "swap_branches": (False,)}


def _grid_at(graph, batch: int) -> dict[str, tuple[LMSConfig, object]]:
    space = SearchSpace(n_candidates=max(1, len(find_candidates(graph, LMSConfig())[0])), ranges=SWAP_KNOBS_ONLY)
    usable = usable_bytes(BUDGET, 0.05)
    out = {}
    for key, config in space.distinct_configs().items():
        out[key] = (config, predict_at_batch(graph, config, usable, batch=batch, device=DEVICE))
    return out


# ---------------------------------------------------------------- the goal

def test_goal_of_picks_fixed_batch_only_when_a_batch_is_given() -> None:
    assert isinstance(goal_of(None), MaxBatch) and goal_of(None).batch is None
    assert goal_of(12) == FixedBatch(batch=12)
    assert FixedBatch(batch=12).first_probe(predict_stub := None or _Pred(0), 1.3) == (12, 12)  # noqa: F841
    assert MaxBatch(cap=99).first_probe(_Pred(40), 1.5) == (60, 99)


class _Pred:
    def __init__(self, batch: int) -> None:
        self.batch, self.feasible = batch, batch > 0


def test_predict_at_batch_records_the_bytes_a_config_needs() -> None:
    graph = residual(6)
    usable = usable_bytes(BUDGET, 0.05)
    off_at_8 = predict_at_batch(graph, LMSConfig(n_tensors=0), usable, batch=8, device=DEVICE)
    limit = predict_max_batch(graph, LMSConfig(n_tensors=0), usable, device=DEVICE, cap=4096).batch
    assert off_at_8.feasible and off_at_8.batch == 8 and off_at_8.throughput > 0
    over = predict_at_batch(graph, LMSConfig(n_tensors=0), usable, batch=limit + 1, device=DEVICE)
    assert not over.feasible and over.batch == 0 and over.min_bytes == over.peak_bytes > usable


def test_fixed_batch_study_is_a_different_study() -> None:
    a = _settings(Path("/tmp/x"), batch=16)
    assert study_settings_conflict(a.identity(), _settings(Path("/tmp/x"))).startswith("study 'syn' was created with batch=16")


# ---------------------------------------------------------------- --batch N

@pytest.mark.slow  # every config of the (narrowed) space is evaluated
def test_fixed_batch_search_picks_the_fastest_feasible_config_of_the_grid(tmp_path: Path, monkeypatch) -> None:
    import functools

    import tuner.search

    monkeypatch.setattr(tuner.search, "SearchSpace", functools.partial(SearchSpace, ranges=SWAP_KNOBS_ONLY))
    graph = residual(6)
    s = _settings(tmp_path / "studies", batch=9, sampler="random")
    _seed_cache(s, graph)
    out = run_search(s)
    grid = _grid_at(graph, 9)
    feasible = {k: p for k, (c, p) in grid.items() if p.feasible}
    infeasible = {k: p for k, (c, p) in grid.items() if not p.feasible}
    assert feasible and infeasible  # batch 9 separates the grid: the search has something to decide
    best_key = max(feasible, key=lambda k: feasible[k].throughput)
    rec = out.recommendation
    assert out.stop_reason in ("space", "")  # every config evaluated: a grid of its own
    assert rec["batch_size"] == 9 and rec["tuned_for"] == {"batch_size": 9}
    assert rec["goal"] == {"kind": "fixed_batch", "batch": 9}
    assert rec["throughput"] == pytest.approx(feasible[best_key].throughput)
    assert rec["throughput"] == pytest.approx(max(p.throughput for p in feasible.values()))
    assert rec["peak_device_bytes"] <= rec["usable_bytes"]
    # the throughput/peak trade-off at that batch: fastest first, each faster one holds more memory
    at = rec["at_batch"]
    assert at[0]["throughput"] == pytest.approx(rec["throughput"])
    assert all(a["throughput"] > b["throughput"] and a["peak_device_bytes"] > b["peak_device_bytes"]
               for a, b in zip(at, at[1:]))
    # configs that do not fit are recorded infeasible, with the bytes they need at batch 9
    study = optuna.load_study(study_name="syn", storage=s.storage.url)
    needs = {canonical_key(LMSConfig.from_dict(t.user_attrs["config"])): t.user_attrs["peak_device_bytes"]
             for t in study.trials if t.user_attrs.get("status") == "infeasible"}
    assert needs and all(needs[k] == infeasible[k].peak_bytes > rec["usable_bytes"] for k in needs)
    assert LMSConfig.load(out.recommended_path) == LMSConfig.from_dict(rec["config"])


def test_fixed_batch_that_nothing_fits_names_the_smallest_peak_and_the_batch_that_would(tmp_path: Path) -> None:
    graph = residual(6)
    s = _settings(tmp_path / "studies", batch=400, trials=40)
    _seed_cache(s, graph)
    out = run_search(s)
    assert out.recommendation is None and out.recommended_path is None
    nf = out.no_fit
    study = optuna.load_study(study_name="syn", storage=s.storage.url)
    peaks = [t.user_attrs["peak_device_bytes"] for t in study.trials if t.user_attrs.get("status") == "infeasible"]
    assert nf["batch"] == 400 and nf["smallest_peak_bytes"] == min(peaks)
    expect = predict_max_batch(graph, LMSConfig.from_dict(nf["config"]), usable_bytes(BUDGET, 0.05), device=DEVICE,
                               cap=4096).batch
    assert nf["fits_batch"] == expect and 0 < expect < 400


# ---------------------------------------------------------------- bracket and bisection

@pytest.mark.parametrize("limit", [0, 8, 16, 24, 56, 64, 200, 512])
@pytest.mark.parametrize("start", [8, 24, 64, 100, 512])
def test_largest_fitting_finds_the_boundary_and_evaluates_each_value_once(limit: int, start: int) -> None:
    calls: list[int] = []

    def fits(value: int) -> bool:
        calls.append(value)
        return value <= limit

    b = largest_fitting(fits, start=start, step=8, lowest=8, highest=512)
    assert b.largest == (limit if limit >= 8 else None)
    assert b.smallest_failing == (limit + 8 if limit < 512 else None)
    assert len(calls) == len(set(calls)) and all(v % 8 == 0 for v in calls)
    assert len(calls) <= 2 * 7 + 1  # log2(512 / 8) doublings, then as many bisections


def test_largest_fitting_refuses_an_empty_range() -> None:
    with pytest.raises(ValueError, match="no multiple of 32"):
        largest_fitting(lambda v: True, start=32, step=32, lowest=40, highest=60)


# ---------------------------------------------------------------- --grow

def test_grow_finds_the_largest_value_a_direct_check_confirms(tmp_path: Path, monkeypatch) -> None:
    """Per-value graphs whose activations grow with the square of image_size (an image's side)."""
    import functools

    import tuner.search

    # the direct check walks the grid: the swap knobs only, as in the search
    monkeypatch.setattr(tuner.search, "SearchSpace", functools.partial(SearchSpace, ranges=SWAP_KNOBS_ONLY))
    studies = tmp_path / "studies"
    values = studies / "grow" / "values"

    def graph_at(v: int):
        return residual(6, per_sample_bytes=v * v * 256)

    for v in range(8, 8 * 64, 8):
        sub = _settings(values, f"grow.image_size-{v}", model_options={"image_size": v})
        _seed_cache(sub, graph_at(v))
    g = _settings(studies, "grow", batch=8, grow="image_size", model_options={"image_size": 16}, trials=12,
                  workload=load_workload("residual", image_size=16).describe())
    out = run_grow(g)
    doc = out.doc
    usable = usable_bytes(BUDGET, 0.05)

    def best_fits(v: int) -> bool:  # over the whole grid, not only the configs the study evaluated
        return any(p.feasible for _, p in _grid_at(graph_at(v), 8).values())

    def base_fits(v: int) -> bool:
        return predict_at_batch(graph_at(v), LMSConfig(n_tensors=0), usable, batch=8, device=DEVICE).feasible

    lms_v, base_v = doc["with_lms"], doc["without_lms"]
    assert best_fits(lms_v) and not best_fits(lms_v + 8)
    assert base_fits(base_v) and not base_fits(base_v + 8)
    assert lms_v > base_v and doc["value_ratio"] == pytest.approx(round(lms_v / base_v, 3))
    assert doc["step"] == 8 and doc["start"] == 16 and doc["figures"] == "PREDICTED by the simulator"
    rec = json.loads(out.recommended_path.read_text())
    assert rec["tuned_for"] == {"batch_size": 8, "image_size": lms_v}
    assert rec["model_options"]["image_size"] == lms_v and rec["grow"]["without_lms"] == base_v
    assert LMSConfig.load(out.recommended_path) == LMSConfig.from_dict(rec["config"])
    # every value was traced (here: read) for its own shapes: one folder per value evaluated
    evaluated = [v["value"] for v in doc["values"]]
    assert all((values / f"grow.image_size-{v}" / "graph.json").is_file() for v in evaluated)
    assert json.loads((studies / "grow" / "grow.json").read_text())["with_lms"] == lms_v


def test_workload_declares_growable_options_and_steps() -> None:
    assert load_workload("resnet50").growable == {"image_size": 32}
    assert load_workload("unet3d").growable == {"input_size": 16}
    assert load_workload("gpt2_small").growable == {"seq_len": 128}
    with pytest.raises(ValueError, match="is not an integer option"):
        import dataclasses

        dataclasses.replace(load_workload("mlp"), growable={"no_such": 4})
