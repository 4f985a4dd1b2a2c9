"""Max-batch search (grow, then bisect, with a margin) on memory models with known answers."""

from __future__ import annotations

import pytest

from tuner.policy.batch import Measurement, predict_max_batch, search_max_batch, usable_bytes

MiB = 1 << 20


def linear(fixed: int, per_sample: int, *, oom_above: int | None = None, calls: list[int] | None = None):
    def measure(batch: int) -> Measurement:
        if calls is not None:
            calls.append(batch)
        if oom_above is not None and fixed + per_sample * batch > oom_above:
            return Measurement(None, oom=True, detail="OOM")
        return Measurement(fixed + per_sample * batch)
    return measure


def true_max(fixed: int, per_sample: int, usable: int) -> int:
    return (usable - fixed) // per_sample


@pytest.mark.parametrize("start", [1, 7, 40, 90, 100, 300, 4000])
@pytest.mark.parametrize("slope_prior", [None, 2 * MiB, 0.5 * MiB])
def test_finds_max_within_resolution(start: int, slope_prior: float | None) -> None:
    fixed, per, usable = 100 * MiB, MiB, 200 * MiB  # exact answer: 100
    r = search_max_batch(linear(fixed, per), usable=usable, start=start, cap=4096, resolution=0.05,
                         max_probes=12, slope_bytes_per_sample=slope_prior)
    best = true_max(fixed, per, usable)
    assert r.converged
    assert best * 0.95 - 1 <= r.batch <= best
    assert r.peak_bytes == fixed + per * r.batch <= usable
    assert r.smallest_failing is not None and r.smallest_failing > r.batch
    for p in r.probes:  # every verdict follows the rule
        assert p.fits == (p.peak_bytes is not None and p.peak_bytes <= usable)


def test_accurate_seed_needs_few_probes() -> None:
    calls: list[int] = []
    r = search_max_batch(linear(100 * MiB, MiB, calls=calls), usable=200 * MiB, start=98, cap=4096,
                         slope_bytes_per_sample=MiB)
    assert r.batch >= 95 and len(calls) <= 3, calls


def test_oom_counts_as_does_not_fit() -> None:
    # OOM gives no peak; the search must still bracket and bisect.
    r = search_max_batch(linear(0, MiB, oom_above=64 * MiB), usable=1000 * MiB, start=10, cap=1000, max_probes=12)
    assert 61 <= r.batch <= 64
    assert any(p.oom and not p.fits for p in r.probes)


def test_infeasible_when_batch_one_does_not_fit() -> None:
    r = search_max_batch(linear(300 * MiB, MiB), usable=200 * MiB, start=16, cap=4096, max_probes=10)
    assert r.batch == 0 and r.peak_bytes is None
    assert r.probes[-1].batch == 1 and not r.probes[-1].fits
    assert r.converged


def test_cap_stops_growth() -> None:
    r = search_max_batch(linear(0, 1), usable=200 * MiB, start=4, cap=64)
    assert r.batch == 64 and r.converged and r.smallest_failing is None


def test_probe_limit_returns_best_so_far_unconverged() -> None:
    r = search_max_batch(linear(0, MiB), usable=10_000 * MiB, start=1, cap=1 << 20, max_probes=3)
    assert len(r.probes) == 3 and not r.converged
    assert r.batch == max(p.batch for p in r.probes if p.fits)


def test_on_probe_sees_every_probe() -> None:
    seen = []
    r = search_max_batch(linear(0, MiB), usable=50 * MiB, start=10, cap=1000, on_probe=seen.append)
    assert [p.batch for p in seen] == [p.batch for p in r.probes]


@pytest.mark.parametrize("budget, margin, expected", [(1000, 0.0, 1000), (1000, 0.05, 950), (1000, 0.5, 500)])
def test_usable_bytes(budget: int, margin: float, expected: int) -> None:
    assert usable_bytes(budget, margin) == expected


@pytest.mark.parametrize("margin", [-0.1, 0.6])
def test_usable_bytes_rejects_bad_margin(margin: float) -> None:
    with pytest.raises(ValueError, match="safety_margin"):
        usable_bytes(1000, margin)


# ---------------------------------------------------------------- simulator seed

def test_prediction_agrees_with_simulator() -> None:
    from lms import LMSConfig
    from lms.simulator import max_batch, simulate
    from tests.synthetic import residual

    graph = residual(4)
    budget = 400 * MiB
    config = LMSConfig(n_tensors=-1, lb=2)
    pred = predict_max_batch(graph, config, budget, device="V100-16GB", cap=4096)
    ref = max_batch(graph, config, budget, device="V100-16GB", limit=4096)
    assert pred.feasible and pred.batch == ref.batch and pred.peak_bytes == ref.peak_bytes
    assert pred.throughput == pytest.approx(ref.throughput)
    assert simulate(graph, config, batch=pred.batch, device="V100-16GB").peak_device_bytes <= budget
    assert simulate(graph, config, batch=pred.batch + 1, device="V100-16GB").peak_device_bytes > budget
    assert pred.slope_bytes_per_sample is not None and pred.slope_bytes_per_sample > 0


def test_prediction_with_the_bfc_allocator_replayed() -> None:
    # what measured trials see: the largest batch whose replayed BFC peak fits, never above the
    # live-byte answer; on this graph TF's unsplit chunks cost a batch (9 -> 8)
    from lms import LMSConfig
    from lms.simulator import bfc_adjusted_batch, simulate
    from tests.synthetic import residual

    graph, config, budget = residual(6, per_sample_bytes=MiB), LMSConfig(n_tensors=-1, lb=2), 300 * MiB
    exact = predict_max_batch(graph, config, budget, device="cpu", cap=4096)
    bfc = predict_max_batch(graph, config, budget, device="cpu", cap=4096, allocator="bfc")
    assert bfc.batch == bfc_adjusted_batch(graph, config, exact.batch, budget, device="cpu")["batch"]
    assert 1 <= bfc.batch < exact.batch
    assert bfc.peak_bytes == simulate(graph, config, batch=bfc.batch, device="cpu", allocator="bfc",
                                      timeline=False).peak_device_bytes <= budget
    assert simulate(graph, config, batch=bfc.batch + 1, device="cpu", allocator="bfc",
                    timeline=False).peak_device_bytes > budget
    with pytest.raises(ValueError, match="allocator='tf': allowed values are 'exact', 'bfc'"):
        predict_max_batch(graph, config, budget, device="cpu", cap=4096, allocator="tf")


def test_prediction_infeasible_budget() -> None:
    from lms import LMSConfig
    from tests.synthetic import residual

    pred = predict_max_batch(residual(4), LMSConfig(n_tensors=0), 1024, device=None, cap=64)
    assert not pred.feasible and pred.batch == 0 and pred.throughput == 0
    assert pred.min_bytes is not None and pred.min_bytes > 1024
    assert "simulator" in pred.reason


def test_a_timed_run_too_big_backs_off_by_the_samples_its_excess_is_worth():
    from tuner.policy.batch import smaller_timed_batch

    # 5.2 MB over at 1.4 MB per sample: 4 samples, and 1% more for the allocator's spread
    assert smaller_timed_batch(153, 579_000_000, 573_800_000, slope_bytes_per_sample=1.4e6) == 147
    # no slope or no peak (out of memory): 8% fewer
    assert smaller_timed_batch(150, 579_000_000, 573_800_000, slope_bytes_per_sample=None) == 138
    assert smaller_timed_batch(150, None, 573_800_000, slope_bytes_per_sample=1.4e6) == 138
    # a larger probe that fitted is tried first; never the same batch again
    assert smaller_timed_batch(150, 700_000_000, 573_800_000, slope_bytes_per_sample=1.4e6,
                               fitted_below=[120, 140, 150]) == 140
    assert smaller_timed_batch(2, 573_800_001, 573_800_000, slope_bytes_per_sample=1e9) == 0
