"""Draw the report's figures from the data `tuner.report.data` computed. The only matplotlib code.

Figures are built with `matplotlib.figure.Figure` and rendered by the Agg canvas
directly: no pyplot, no global backend switch, nothing left open. Each
``plot_*`` function returns a Figure; `render` turns one into PNG and SVG bytes.
Text from users (study names, model specs) never goes into a figure: matplotlib
would read ``$...$`` in it as math.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

try:
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
except ImportError as exc:  # pragma: no cover - matplotlib is a dependency of the package
    raise ImportError("the report needs matplotlib: pip install matplotlib") from exc

import pandas as pd

from ..budget import byte_unit, format_bytes

if TYPE_CHECKING:
    from .data import KnobEffect, ParetoFront
    from .peers import PeerPoint
    from .timeline import Timeline

__all__ = ["RenderedFigure", "render", "plot_pareto", "plot_knobs", "plot_timeline", "byte_unit"]

# Colour-blind-safe (Okabe-Ito) roles, used the same way in every figure.
FRONT = "#0072B2"
DOMINATED = "#9a9a9a"
FAILED = "#D55E00"
BASELINE = "#000000"
RECOMMENDED = "#E69F00"
BUDGET = "#CC79A7"
SWAP_OUT = "#009E73"
SWAP_IN = "#56B4E9"
SCREEN = "#7fa7c9"
PEER = "#6a3d9a"
_DPI = 110


@dataclass(frozen=True)
class RenderedFigure:
    """One figure as files: PNG (embedded in the HTML) and SVG (for slides)."""

    png: bytes
    svg: bytes
    width_px: int
    height_px: int


def render(fig: Figure) -> RenderedFigure:
    """PNG and SVG bytes of `fig`, without timestamps (same data, same bytes)."""
    canvas = FigureCanvasAgg(fig)
    png = io.BytesIO()
    canvas.print_png(png, metadata={"Software": None})
    svg = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": "tuner-report"}):  # stable ids: same data, same file
        fig.savefig(svg, format="svg", metadata={"Date": None, "Creator": None})
    width, height = canvas.get_width_height()
    return RenderedFigure(png=png.getvalue(), svg=svg.getvalue(), width_px=int(width), height_px=int(height))


def _trials(n: int) -> str:
    return f"{n} trial" if n == 1 else f"{n} trials"


def _new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _style(ax) -> None:
    ax.grid(True, color="#e6e6e6", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


# ---- Pareto plots ------------------------------------------------------------------------------

def plot_pareto(front: "ParetoFront", *, budget_bytes: int | None = None, x_in_bytes: bool = False,
                title: str = "", peers: Sequence["PeerPoint"] = ()) -> Figure:
    """Throughput against `front.x`: front highlighted, baseline and recommendation marked.

    Failed trials without a throughput (NaN or 0) sit on a strip just below zero. `peers`
    (`tuner.report.peers`): other methods' points on the same workload, each a labelled diamond (on the
    memory plot those with a recorded peak).
    """
    fig = _new_figure(6.4, 5.2)
    ax = fig.add_subplot()
    _style(ax)
    pts = front.points
    peer_pts = [(p, float(p.peak_bytes if x_in_bytes else p.batch_size)) for p in peers
                if (p.peak_bytes if x_in_bytes else p.batch_size)]
    scale, unit = 1.0, ""
    if x_in_bytes:
        finite = pd.concat([pts["x"], front.screen["x"]]).dropna()
        candidates = [float(finite.max()) if len(finite) else 0.0, float(budget_bytes or 0),
                      *(x for _, x in peer_pts)]
        scale, unit = byte_unit(max(candidates))
    xs = pts["x"] / scale
    ys = pts["y"]
    all_y = pd.concat([ys, front.screen["y"]] + ([pd.Series([p.throughput for p, _ in peer_pts])] if peer_pts else []))
    ymax = float(all_y.max()) if all_y.notna().any() else 1.0
    strip = -0.06 * (ymax if ymax > 0 else 1.0)

    if len(front.screen):
        ax.scatter(front.screen["x"] / scale, front.screen["y"], s=22, facecolors="none", edgecolors=SCREEN,
                   linewidths=0.8, zorder=1,
                   label=(f"simulated screening ({front.screen_configs or len(front.screen)} configs, "
                          f"{len(front.screen)} fit; predicted)"))
    dominated = pts["kind"] == "dominated"
    ax.scatter(xs[dominated], ys[dominated], s=28, color=DOMINATED, alpha=0.8, linewidths=0,
               label="dominated (feasible)", zorder=2)
    failed = pts["kind"] == "failed"
    if failed.any():
        fy = ys[failed].where(ys[failed] > 0, strip)  # no throughput (NaN or 0): on the strip below 0
        label = "failed: OOM / infeasible / error"
        if x_in_bytes and bool(pts.loc[failed, "predicted"].any()):
            label += " (x: predicted peak)"
        ax.scatter(xs[failed], fy, marker="x", s=36, color=FAILED, linewidths=1.6, label=label, zorder=3)
    f = front.front
    if not f.empty:
        ax.plot(f["x"] / scale, f["y"], drawstyle="steps-pre" if front.maximize_x else "steps-post",
                color=FRONT, linewidth=1.4, alpha=0.9, zorder=3)
        ax.scatter(f["x"] / scale, f["y"], s=42, color=FRONT, edgecolors="white", linewidths=0.6,
                   label=f"Pareto front ({_trials(len(f))})", zorder=4)
        for (x, y), group in f.groupby(["x", "y"], sort=False):  # one label per spot: "#2,#6" or "#4 +7"
            numbers = [f"#{n}" for n in group["number"]]
            text = ",".join(numbers) if len(numbers) <= 3 else f"{numbers[0]} +{len(numbers) - 1}"
            ax.annotate(text, (x / scale, y), xytext=(4, 4), textcoords="offset points", fontsize=7, color=FRONT)
    base = pts[pts["baseline"]]
    if not base.empty:
        ax.scatter(base["x"] / scale, base["y"].where(base["y"] > 0, strip), marker="s", s=110, facecolors="none",
                   edgecolors=BASELINE, linewidths=1.8, label="no LMS (baseline)", zorder=5)
    rec = pts[pts["recommended"]]
    if not rec.empty:
        ax.scatter(rec["x"] / scale, rec["y"], marker="*", s=260, color=RECOMMENDED, edgecolors=BASELINE,
                   linewidths=0.8, label="recommended", zorder=6)
    if peer_pts:
        ax.scatter([x / scale for _, x in peer_pts], [p.throughput for p, _ in peer_pts], marker="D", s=54,
                   facecolors="none", edgecolors=PEER, linewidths=1.5, zorder=5,
                   label="peers, largest batch (MEASURED)")
        for p, x in peer_pts:  # matplotlib reads $...$ as math: the label is shown as text
            ax.annotate(p.label.replace("$", r"\$")[:40], (x / scale, p.throughput), xytext=(5, -10),
                        textcoords="offset points", fontsize=7, color=PEER)
    if x_in_bytes and budget_bytes:
        ax.axvline(budget_bytes / scale, color=BUDGET, linestyle="--", linewidth=1.3,
                   label=f"budget {format_bytes(budget_bytes)}", zorder=1)
    if failed.any() and not (ys[failed] > 0).all():
        ax.axhline(0, color="#cccccc", linewidth=0.8, zorder=1)
    # room above the highest point: the big baseline / recommended markers are not cut at the top edge
    ax.set_ylim(bottom=min(strip * 1.6, 0) if failed.any() else 0, top=(ymax if ymax > 0 else 1.0) * 1.12)
    if not x_in_bytes:
        finite = pd.concat([xs, front.screen["x"] / scale]
                           + ([pd.Series([x for _, x in peer_pts])] if peer_pts else [])).dropna()
        ax.set_xlim(0, float(finite.max()) * 1.1 if len(finite) and finite.max() > 0 else 1)
    else:
        ax.margins(x=0.08)
    ax.set_xlabel(f"{front.x_label} ({unit})" if unit else front.x_label)
    ax.set_ylabel(front.y_label)
    if title:
        ax.set_title(title, fontsize=11, loc="left")
    if len(pts):  # below the axes: a legend must never hide a trial
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=2, frameon=False)
    else:
        ax.text(0.5, 0.5, "no trials to plot", transform=ax.transAxes, ha="center", va="center")
    return fig


# ---- knobs --------------------------------------------------------------------------------------

_KNOB_METRICS = (("batch_size", "max batch size", None),
                 ("throughput", "throughput (samples/s)", None),
                 ("peak_bytes", "peak device memory", "bytes"))


def plot_knobs(effects: Sequence["KnobEffect"], *, budget_bytes: int | None = None) -> Figure:
    """One column per knob, one row per outcome: trials as dots, the median per value as a line."""
    ncols = max(len(effects), 1)
    fig = _new_figure(3.4 * ncols + 0.6, 7.2)
    axes = fig.subplots(len(_KNOB_METRICS), ncols, squeeze=False, sharey="row")
    peak_max = max([float(e.points["peak_bytes"].max()) for e in effects if len(e.points)] + [float(budget_bytes or 0), 1.0])
    scale, unit = byte_unit(peak_max)
    for col, effect in enumerate(effects):
        summary, points = effect.summary, effect.points
        # a small deterministic spread so trials with one knob value do not hide each other
        jitter = ((points["number"] * 0.618034) % 1.0 - 0.5) * 0.25 if len(points) else points["number"]
        for row, (metric, label, kind) in enumerate(_KNOB_METRICS):
            ax = axes[row][col]
            _style(ax)
            div = scale if kind == "bytes" else 1.0
            if len(points):
                ax.scatter(points["position"] + jitter, points[metric] / div, s=16, color=FRONT, alpha=0.55,
                           linewidths=0, zorder=2)
                median_col = {"batch_size": "batch_median", "throughput": "throughput_median",
                              "peak_bytes": "peak_median"}[metric]
                ax.plot(summary["position"], summary[median_col] / div, color=BASELINE, marker="_",
                        markersize=14, linewidth=1.0, zorder=3)
            if kind == "bytes" and budget_bytes:
                ax.axhline(budget_bytes / div, color=BUDGET, linestyle="--", linewidth=1.1, zorder=1)
            ax.set_xticks(list(summary["position"]), list(summary["label"]), fontsize=8,
                          rotation=45 if len(summary) > 8 else 0)
            if len(summary):
                ax.set_xlim(-0.6, len(summary) - 0.4)
            if col == 0:
                ax.set_ylabel(f"{label} ({unit})" if kind == "bytes" else label, fontsize=9)
            if row == len(_KNOB_METRICS) - 1:
                ax.set_xlabel(effect.knob)
            if row == 0:
                title = (effect.knob + (" (screening, PREDICTED)" if effect.predicted else "")
                         + (f"  ({_trials(effect.n_failed)} failed, not shown)" if effect.n_failed else ""))
                ax.set_title(title, fontsize=10, loc="left")
            if not len(points):
                ax.text(0.5, 0.5, "no feasible trials", transform=ax.transAxes, ha="center", va="center",
                        fontsize=8, color=DOMINATED)
    handles = [Line2D([], [], color=FRONT, marker="o", linestyle="", alpha=0.6, label="feasible trial"),
               Line2D([], [], color=BASELINE, marker="_", markersize=12, label="median per value")]
    if budget_bytes:
        handles.append(Line2D([], [], color=BUDGET, linestyle="--", label="budget"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8, frameon=False)
    return fig


# ---- memory timeline -------------------------------------------------------------------------------

def plot_timeline(timeline: "Timeline", *, budget_bytes: int | None = None) -> Figure:
    """Device bytes over one step per series, end of the forward pass marked; swap copies on strips below.

    A strip is drawn for each series that swaps; the budget line is drawn when it is
    within twice the highest peak (else the legend says it is off the scale).
    """
    series = timeline.series
    swapping = [s for s in series if s.swap_outs or s.swap_ins]
    fig = _new_figure(9.6, 4.2 + 0.9 * len(swapping))
    axes = fig.subplots(1 + len(swapping), 1, sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": [4.0] + [0.8] * len(swapping)})[:, 0]
    ax = axes[0]
    _style(ax)
    highest = max([s.peak_bytes for s in series] + [1])
    budget_on_scale = bool(budget_bytes) and budget_bytes <= 2 * highest
    scale, unit = byte_unit(max(highest, budget_bytes or 0) if budget_on_scale else highest)
    k = 1e3 if timeline.x_is_time else 1.0  # seconds -> ms, or executed-order positions
    colors = [BASELINE, RECOMMENDED, FRONT, DOMINATED]
    styles = {"simulated": "-", "measured": (0, (4, 1.5))}
    color_of = {}
    marked: list[float] = []  # boundaries already labelled (series often share one)
    for i, s in enumerate(series):
        color = color_of[s.label] = colors[i % len(colors)]
        ax.plot(s.time_s * k, s.device_bytes / scale, drawstyle="steps-post", color=color, linewidth=1.5,
                linestyle=styles.get(s.source, "-"),
                label=f"{s.label} ({s.source}, batch {s.batch_size}): peak {format_bytes(s.peak_bytes)}",
                zorder=3)
        ax.scatter([s.peak_time_s * k], [s.peak_bytes / scale], color=color, s=30, zorder=4)
        if s.forward_end_s is not None:
            ax.axvline(s.forward_end_s * k, color=color, linestyle=":", linewidth=1.1, zorder=2)
            span = max(float(s.time_s[-1]), 1e-12)
            if not any(abs(s.forward_end_s - m) < 0.02 * span for m in marked):
                ax.annotate("forward | backward", (s.forward_end_s * k, 1.0), xycoords=("data", "axes fraction"),
                            xytext=(0, -12 - 11 * len(marked)), textcoords="offset points", fontsize=7,
                            color=color, ha="center")
                marked.append(s.forward_end_s)
    if budget_bytes and budget_on_scale:
        ax.axhline(budget_bytes / scale, color=BUDGET, linestyle="--", linewidth=1.3,
                   label=f"budget {format_bytes(budget_bytes)}", zorder=1)
    elif budget_bytes:
        ax.plot([], [], color=BUDGET, linestyle="--", label=f"budget {format_bytes(budget_bytes)} (above the plot)")
    ax.set_ylim(bottom=0, top=max(highest, budget_bytes or 0 if budget_on_scale else 0) / scale * 1.12)
    ax.set_ylabel(f"device memory ({unit})")
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.01), ncols=2, frameon=False)  # above: hides nothing
    for strip, s in zip(axes[1:], swapping):
        for side in ("top", "right", "left"):
            strip.spines[side].set_visible(False)
        strip.set_yticks([0.5, 1.5], ["swap-in", "swap-out"], fontsize=7)
        strip.set_ylim(0, 2)
        strip.tick_params(axis="y", length=0)
        span = max((float(x.time_s[-1]) for x in series if len(x.time_s)), default=0.0)
        for events, y, color in ((s.swap_outs, 1, SWAP_OUT), (s.swap_ins, 0, SWAP_IN)):
            if events:  # each copy at least 0.2% of the step wide, no edges: hundreds of short copies stay visible
                strip.broken_barh([(e.start_s * k, max(e.end_s - e.start_s, 0.002 * span) * k) for e in events],
                                  (y + 0.1, 0.8), facecolors=color, edgecolors="none", alpha=0.85)
        strip.set_title(f"{s.label} ({s.source}): {len(s.swap_outs)} swap-outs, {len(s.swap_ins)} swap-ins",
                        fontsize=8, loc="left", color=color_of[s.label])
        if s.forward_end_s is not None:
            strip.axvline(s.forward_end_s * k, color=DOMINATED, linestyle=":", linewidth=1.0)
    axes[-1].set_xlabel("time in the training step (ms)" if timeline.x_is_time
                        else "position in the executed order (ops); no time model")
    end = max((float(s.time_s[-1]) for s in series if len(s.time_s)), default=0.0)
    if end > 0 and math.isfinite(end):
        axes[-1].set_xlim(0, end * k * 1.01)
    return fig
