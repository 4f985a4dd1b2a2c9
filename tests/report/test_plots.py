"""The figures draw what the data says (smoke tests that look at the artists, not pixels)."""

from __future__ import annotations

import numpy as np
import optuna
import pytest

from lms.config import LMSConfig
from tests.synthetic import chain
from tuner.report import plots
from tuner.report.data import baseline_trial, knob_effect, pareto_front, trials_frame
from tuner.report.timeline import simulated_timeline

from .studies import BUDGET, GiB, KNOWN, KNOWN_RECORDS, make_study


@pytest.fixture(scope="module")
def df(tmp_path_factory):
    url, _ = make_study(tmp_path_factory.mktemp("plots"), "plots", KNOWN_RECORDS)
    return trials_frame(optuna.load_study(study_name="plots", storage=url).get_trials())


def _collections(ax):
    """label -> offsets of each labelled scatter."""
    return {c.get_label(): np.asarray(c.get_offsets()) for c in ax.collections if not c.get_label().startswith("_")}


def test_pareto_plot_draws_each_kind_once(df):
    front = pareto_front(df, x="batch_size", maximize_x=True, baseline=baseline_trial(df),
                         recommended=KNOWN["recommended"])
    fig = plots.plot_pareto(front)
    ax = fig.axes[0]
    drawn = _collections(ax)
    assert drawn["Pareto front (4 trials)"].tolist() == [[8, 100], [24, 90], [24, 90], [32, 70]]
    assert drawn["dominated (feasible)"].tolist() == [[16, 85]]
    failed = drawn["failed: OOM / infeasible / error"]
    assert failed[:, 0].tolist() == [0, 0] and (failed[:, 1] < 0).all()  # on the strip below zero
    assert drawn["recommended"].tolist() == [[24, 90]]
    assert drawn["no LMS (baseline)"].tolist() == [[8, 100]]
    # the front line steps down: larger batch, lower throughput
    (line,) = [l for l in ax.lines if l.get_drawstyle() == "steps-pre"]
    assert line.get_xdata().tolist() == [8, 24, 24, 32]
    labels = sorted(t.get_text() for t in ax.texts)
    assert labels == ["#0", "#1", "#2,#6"]


def test_screening_trials_are_context_only(df):
    screen = df.copy()
    screen["batch_size"] = screen["batch_size"] * 10  # far better predictions must not join the front
    front = pareto_front(df, x="batch_size", maximize_x=True, screen=screen)
    assert front.front["number"].tolist() == KNOWN["front_batch"]
    assert sorted(front.screen["number"]) == [0, 1, 2, 3, 6]
    drawn = _collections(plots.plot_pareto(front).axes[0])
    assert front.screen_configs == 7  # the 7 configs simulated, 5 of them feasible (drawn)
    assert drawn["simulated screening (7 configs, 5 fit; predicted)"][:, 0].tolist() == [80, 320, 240, 160, 240]


def test_memory_plot_in_gib_with_the_budget(df):
    front = pareto_front(df, x="peak_bytes", maximize_x=False, recommended=KNOWN["recommended"])
    fig = plots.plot_pareto(front, budget_bytes=BUDGET, x_in_bytes=True)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "peak device memory (GiB)"
    budget = [l for l in ax.lines if l.get_label().startswith("budget")]
    assert budget and budget[0].get_xdata()[0] == pytest.approx(1.0)
    drawn = _collections(ax)
    assert drawn["Pareto front (1 trial)"].tolist() == [[0.5, 100]]
    assert drawn["failed: OOM / infeasible / error (x: predicted peak)"][:, 0] == pytest.approx([1.2, 1.1], abs=1e-6)


def test_knob_plot_positions_and_medians(df):
    effects = [knob_effect(df, "n_tensors"), knob_effect(df, "lb", lms_only=True)]
    fig = plots.plot_knobs(effects, budget_bytes=BUDGET)
    axes = fig.axes
    assert len(axes) == 6
    batch_n, batch_lb = axes[0], axes[1]
    assert [t.get_text() for t in batch_n.get_xticklabels()] == ["0 (off)", "5", "10", "all"]
    assert [t.get_text() for t in batch_lb.get_xticklabels()] == ["1", "3", "5"]
    median = batch_n.lines[0]
    assert median.get_xdata().tolist() == [0, 1, 2, 3] and median.get_ydata().tolist() == [8, 16, 24, 32]
    dots = np.asarray(batch_n.collections[0].get_offsets())
    assert len(dots) == 5 and np.all(np.abs(dots[:, 0] - np.round(dots[:, 0])) <= 0.125)  # small spread


def test_timeline_plot(tmp_path):
    tl = simulated_timeline(chain(6), [("no LMS", LMSConfig(n_tensors=0)), ("recommended", LMSConfig(n_tensors=3))],
                            batch=4, device="V100-16GB")
    fig = plots.plot_timeline(tl, budget_bytes=32 << 20)
    main, strip = fig.axes  # only the swapping series gets a strip
    assert main.get_ylabel() == "device memory (MiB)"
    curves = [l for l in main.lines if l.get_drawstyle() == "steps-post"]
    assert [c.get_label().split(" (")[0] for c in curves] == ["no LMS", "recommended"]
    assert max(curves[0].get_ydata()) == pytest.approx(tl.series[0].peak_bytes / 2**20)
    bars = [c for c in strip.collections]
    assert sum(len(b.get_paths()) for b in bars) == 6  # 3 swap-outs + 3 swap-ins
    assert "3 swap-outs, 3 swap-ins" in strip.get_title(loc="left")


def test_render_is_png_and_svg_and_repeatable(df):
    front = pareto_front(df, x="batch_size", maximize_x=True)
    first = plots.render(plots.plot_pareto(front))
    again = plots.render(plots.plot_pareto(front))
    assert first.png.startswith(b"\x89PNG\r\n\x1a\n") and b"<svg" in first.svg[:2000]
    assert first.png == again.png and first.svg == again.svg  # same data, same bytes
    assert (first.width_px, first.height_px) == (704, 572)


def test_empty_study_still_draws():
    empty = trials_frame([])
    fig = plots.plot_pareto(pareto_front(empty, x="batch_size", maximize_x=True))
    assert [t.get_text() for t in fig.axes[0].texts] == ["no trials to plot"]
    assert plots.render(plots.plot_knobs([knob_effect(empty, "n_tensors")])).png


@pytest.mark.parametrize("nbytes, unit", [(10, "B"), (3 << 10, "KiB"), (5 << 20, "MiB"), (GiB, "GiB"), (2 << 40, "TiB")])
def test_byte_unit(nbytes, unit):
    assert plots.byte_unit(nbytes)[1] == unit


def test_pareto_markers_have_room_at_the_top_and_the_budget_says_its_own_unit(df):
    """The baseline square and the recommended star at the highest throughput are not cut by the top edge; the
    budget is written in its own unit (MiB beside MiB peaks), not the axis's."""
    front = pareto_front(df, x="batch_size", maximize_x=True, baseline=0, recommended=KNOWN["recommended"])
    ax = plots.plot_pareto(front).axes[0]
    assert ax.get_ylim()[1] >= 1.1 * 100  # the baseline's 100 samples/s is the highest point
    mem = pareto_front(df, x="peak_bytes", maximize_x=False)
    ax = plots.plot_pareto(mem, budget_bytes=600 << 20, x_in_bytes=True).axes[0]
    assert [l.get_label() for l in ax.lines if l.get_label().startswith("budget")] == ["budget 600.00 MiB"]
