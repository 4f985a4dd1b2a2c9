"""Lay out the report as one self-contained HTML page. No matplotlib, no network.

Images arrive as PNG bytes and are embedded as ``data:`` URIs; the page carries
a Content-Security-Policy that allows nothing but those images and its own
inline style, so it opens from disk and makes no request. Every piece of text
that comes from users or the study (study name, model spec, params, failure
reasons, environment values) goes through `html.escape`.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import pandas as pd

from ..policy.knobs import KNOB_TABLE, KnobTable
from .card import recommendation_section as _recommendation
from .data import ReportData
from .markup import (Image, config_knobs as _config_knobs, escape as _e, fmt_bytes, fmt_int, fmt_num, fmt_rate,
                     img as _img, number as _num, table as _table)

__all__ = ["Image", "render_html", "CSP"]

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


# ---- sections ----------------------------------------------------------------------------------

def _header(data: ReportData) -> str:
    env = "".join(f'<div class="kv{" wide" if len(v) > 48 else ""}"><span class="k">{_e(k)}</span> '
                  f'<span class="v">{_e(v)}</span></div>' for k, v in data.environment)
    return (f'<header><h1>LMS tuning report: <span class="study">{_e(data.study_name)}</span></h1>'
            f'<p class="sub">Generated {_e(data.generated)}. Objectives: largest batch size and highest '
            f"throughput under the memory budget.</p></header>"
            f'<section id="environment"><h2>Environment</h2><div class="env">{env}</div>'
            f'<p class="note" id="measurement">{_e(data.measurement_note)}</p>{_prediction_check(data)}</section>')


def _prediction_check(data: ReportData) -> str:
    """How far the simulator's max batch and throughput were from the measured ones."""
    check = data.prediction
    if check is None or check.empty:
        return ""
    ratios = check["batch_ratio"]
    summary = (f"Simulator vs measurement, {len(check)} measured trials: measured max batch = "
               f"{ratios.median():.2f}× the predicted one (median; range {ratios.min():.2f}×–{ratios.max():.2f}×)")
    tput = check["throughput_ratio"].dropna()
    if len(tput):
        summary += f"; measured throughput = {tput.median():.2f}× the predicted (median)"
    rows = [[f"#{r.number}", fmt_int(r.predicted_batch), fmt_int(r.batch_size), f"{r.batch_ratio:.2f}×",
             fmt_rate(r.predicted_throughput), fmt_rate(r.throughput),
             "–" if math.isnan(r.throughput_ratio) else f"{r.throughput_ratio:.2f}×"] for r in check.itertuples()]
    table = _table(["trial", "predicted batch", "measured batch", "ratio", "predicted samples/s",
                    "measured samples/s", "ratio"], rows, numeric=(1, 2, 3, 4, 5, 6))
    return f'<details id="prediction"><summary>{_e(summary)}.</summary>{table}</details>'


def _front_table(data: ReportData) -> str:
    """The trials on either front, one row per distinct (batch, throughput, peak), marked per front."""
    on = [set(int(n) for n in f.front["number"]) for f in data.fronts]
    numbers = sorted(on[0] | on[1])
    if not numbers:
        return '<p class="note">No feasible trial: no front.</p>'
    groups: dict[tuple, list[dict[str, Any]]] = {}  # searches often find one point many times
    for number in numbers:
        r = data.row(number)
        assert r is not None
        groups.setdefault((r["batch_size"], r["throughput"], r["peak_bytes"]), []).append(r)
    rows, classes = [], []
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2])):
        members = sorted(groups[key], key=lambda m: (m["number"] != data.recommended_trial, m["number"]))
        r = members[0]
        headroom = (data.budget_bytes - r["peak_bytes"]) if data.budget_bytes and _num(r["peak_bytes"]) else None
        knobs = _e(_knob_text(r))
        if len(members) > 1:
            same = ", ".join(f"#{m['number']}" for m in members[1:])
            knobs += f'<br><span class="note">same figures: {same}</span>'
        marks = ["✓" if any(m["number"] in front for m in members) else "" for front in on]
        rows.append([f"#{int(r['number'])}", fmt_int(r["batch_size"]), fmt_rate(r["throughput"]),
                     fmt_bytes(r["peak_bytes"]), fmt_bytes(headroom), *marks, knobs,
                     "measured" if r["measured"] else "predicted"])
        classes.append(_row_class(data, r))
    return _table(["trial", "batch", "samples/s", "peak", "headroom", "batch front", "memory front", "knobs",
                   "figures"], rows, row_classes=classes, numeric=(1, 2, 3, 4), cls="front")


def _knob_text(row: Mapping[str, Any]) -> str:
    config = row.get("config") or {}
    if config:
        return _config_knobs(config)
    return ", ".join(f"{k}={v}" for k, v in sorted((row.get("params") or {}).items()))


def _row_class(data: ReportData, row: Mapping[str, Any]) -> str:
    parts = []
    if row["number"] == data.recommended_trial:
        parts.append("rec")
    if row["number"] == data.baseline_trial:
        parts.append("base")
    if not row["feasible"]:
        parts.append("failed")
    return " ".join(parts)


def _pareto(data: ReportData, images: Mapping[str, Image]) -> str:
    n_failed = int((~data.trials["feasible"]).sum())
    unplotted = [f.n_unplotted for f in data.fronts]
    note = (f"{n_failed} failed trials are drawn as crosses (at zero throughput when they have none)."
            if n_failed else "No trial failed.")
    if any(unplotted):
        note += f" {max(unplotted)} trials have no batch size or peak and are not drawn."
    if data.screen_name and data.screen_trials is not None:
        note += (f" Hollow circles: the {len(data.fronts[0].screen)} feasible trials of the simulated screening "
                 f"study {data.screen_name} (predicted figures), whose front chose the configs measured here.")
    cap_batch = ("Throughput against batch size. The front: no other trial has both a larger batch and "
                 "a higher throughput. " + note)
    cap_mem = ("Throughput against peak device memory. The front: no other trial is both faster and "
               "smaller. The dashed line is the budget. " + note)
    return ('<section id="pareto"><h2>Memory / throughput trade-off</h2>'
            f'<div class="pair">{_img(images.get("pareto_batch"), caption=_e(cap_batch))}'
            f'{_img(images.get("pareto_memory"), caption=_e(cap_mem))}</div>'
            f"<h3>Pareto-optimal trials</h3>{_front_table(data)}{_peers(data)}</section>")


def _peers(data: ReportData) -> str:
    """The peers drawn on the plots (``--peers``): each one's largest batch, throughput and peak, against the
    recommendation's, and where they come from."""
    peers = data.peers
    if peers is None:
        return ""
    rec = data.recommendation
    rows = []
    for p in sorted(peers.points, key=lambda p: -p.batch_size):
        vs = (f"{rec.batch_size / p.batch_size:.2f}x" if rec is not None and p.batch_size else "–")
        rows.append([_e(p.label), fmt_int(p.batch_size) + ("" if p.closed else " ?"), fmt_rate(p.throughput),
                     fmt_bytes(p.peak_bytes), vs])
    rows += [[_e(label), "–", "–", "–", _e(f"did not run: {why}")] for label, why in peers.not_run]
    table = _table(["peer", "largest batch", "samples/s there", "peak there", "recommended batch / peer's"],
                   rows, numeric=(1, 2, 3), cls="peers")
    about = (f"{peers.label}, by {peers.command or 'benchmarks/peers.py'} ({peers.created}; file {peers.source}) on "
             f"{peers.title}: the same workload, budget and margin as this study, but other processes and other "
             "minutes of the machine, so compare throughputs loosely. '?': that peer's largest batch was not "
             "bracketed to the next batch up. Diamonds on both plots.")
    return f'<div id="peers"><h3>Against the peers</h3>{table}<p class="note">{_e(about)}</p></div>'


def _timeline(data: ReportData, images: Mapping[str, Image]) -> str:
    image = images.get("timeline")
    body = (_img(image, caption=_e(data.timeline_note)) if image is not None
            else f'<p class="note">{_e(data.timeline_note or "No timeline available.")}</p>')
    table = ""
    tl = data.timeline
    if tl is not None:
        rows = [[_e(s.label), _e(s.source), fmt_int(s.batch_size), fmt_bytes(s.peak_bytes),
                 f"{s.step_time_s * 1e3:.2f}" if s.step_time_s is not None else "–",
                 fmt_int(len(s.swap_outs)), fmt_int(len(s.swap_ins)), fmt_bytes(s.swapped_bytes)]
                for s in tl.series]
        table = _table(["series", "source", "batch", "peak", "step (ms)", "swap-outs", "swap-ins",
                        "bytes swapped out"], rows, numeric=(2, 3, 4, 5, 6, 7))
    return (f'<section id="timeline"><h2>Memory over one training step</h2>{body}{table}'
            f"{_op_order(data)}</section>")


def _op_order(data: ReportData) -> str:
    """Which order the recommended config runs the ops in: TF's, or a pinned one and the candidates scored."""
    sched = data.schedule
    if sched is None:
        return ""
    no_recompute = ""
    if data.recommendation is not None and data.recommendation.config.get("recompute", "none") == "none":
        no_recompute = ('<p class="note" id="no-recompute">Nothing is recomputed (recompute=\'none\'): the backward '
                        "pass keeps or swaps every tensor it reads.</p>")
    if not sched.pinned:
        return (f'<div id="schedule"><h3>Op order</h3><p class="note">{_e(sched.sentence)}</p></div>'
                f"{no_recompute}")
    rows = [[_e(c.name) + (" ✓" if c.chosen else ""), _e(c.description), fmt_bytes(c.peak_bytes),
             fmt_int(c.peak_bytes),
             "chosen" if c.chosen else _signed_bytes(c.peak_bytes - _chosen_peak(sched))]
            for c in sched.candidates]
    table = _table(["scheduler", "order", "peak (PREDICTED)", "bytes", "vs chosen"], rows,
                   row_classes=["rec" if c.chosen else "" for c in sched.candidates], numeric=(2, 3, 4),
                   cls="schedule")
    about = (f"Candidates scored by lms.schedule at batch {sched.scoring_batch}: the PREDICTED peak of the order "
             "TF's executor runs with each candidate's pins, under the scheduler's liveness model (no "
             "temporaries; the timeline above adds them), lowest first. That batch is the smallest at which the "
             "per-sample tensors outweigh the fixed ones (weights, optimizer slots) several times, where the "
             "order matters (at the traced batch every order peaks alike); the order chosen there is the one "
             "pinned at every batch, so the peaks here are not those of the recommended batch.")
    return (f'<div id="schedule"><h3>Op order: scheduler {_e(sched.chosen)}, pinned</h3>'
            f'{table}<p class="note">{_e(about)}</p></div>{no_recompute}')


def _chosen_peak(sched: Any) -> int:
    return next(c.peak_bytes for c in sched.candidates if c.chosen)


def _signed_bytes(delta: int) -> str:
    return "±0" if delta == 0 else ("+" if delta > 0 else "-") + fmt_bytes(abs(delta))


def _bytes_exact(value: Any) -> str:
    return f"{fmt_bytes(value)} ({fmt_int(value)} B)"


def _ms(seconds: float | None, *, signed: bool = False) -> str:
    if seconds is None:
        return "–"
    return f"{seconds * 1e3:+.2f} ms" if signed else f"{seconds * 1e3:.2f} ms"


def _recompute(data: ReportData) -> str:
    """The recomputed tensors, the link bytes they save and the time they cost (only when the config recomputes)."""
    r = data.recompute
    if r is None:
        return (f'<section id="recompute"><h2>Recomputation</h2><p class="note">{_e(data.recompute_note)}</p></section>'
                if data.recompute_note else "")
    label = _e(f"recompute={r.recompute!r}")
    n_clones = sum(len(t.cloned_ops) for t in r.tensors)
    intro = (f"The recommended config rebuilds {len(r.tensors)} saved tensors in the backward pass ({label}) by "
             f"running {n_clones} forward ops again, instead of keeping them on the device or swapping them: "
             f"{_e(_bytes_exact(r.recomputed_bytes))} per step at batch {r.batch} (PREDICTED from the traced graph's "
             "shapes).")
    rows = [[f"<code>{_e(t.tensor)}</code>", _e(t.op_type), _bytes_exact(t.nbytes), _bytes_exact(t.link_bytes_without),
             "<br>".join(f"<code>{_e(op)}</code>" for op in t.cloned_ops)] for t in r.tensors]
    tensors = _table(["tensor", "op type", "bytes per step (PREDICTED)",
                      "link bytes per step with recompute='none' (PREDICTED)", "ops cloned"], rows,
                     numeric=(2, 3), cls="recompute")
    where = f"simulator, {r.device} profile" if r.device else "simulator, no device profile: no times"
    figures = [
        ["host link bytes per step", _bytes_exact(r.link_bytes), _bytes_exact(r.link_bytes_without),
         (f"{_bytes_exact(r.link_bytes_saved)} saved" if r.link_bytes_saved >= 0
          else f"{_bytes_exact(-r.link_bytes_saved)} more"), f"PREDICTED ({_e(where)})"],
        ["step time", _ms(r.step_time_s), _ms(r.step_time_without_s), _ms(r.time_cost_s, signed=True),
         f"PREDICTED ({_e(where)})"],
        ["peak device memory", _bytes_exact(r.peak_bytes), _bytes_exact(r.peak_bytes_without),
         _signed_bytes(r.peak_bytes - r.peak_bytes_without), f"PREDICTED ({_e(where)})"],
    ]
    m = r.measured
    if m is not None:
        figures.append([f"step time (trials #{m.trial} and #{m.trial_without})", _ms(m.step_time_s),
                        _ms(m.step_time_without_s), _ms(m.time_cost_s, signed=True),
                        f"MEASURED ({_e(m.backend)} backend)"])
    summary = _table(["at batch " + fmt_int(r.batch), label, "recompute='none'", "difference", "figures are"],
                     figures, numeric=(1, 2, 3), cls="recompute-figures")
    return (f'<section id="recompute"><h2>Recomputation</h2><p>{intro}</p>{tensors}{summary}'
            f'<p class="note" id="recompute-measured">{_e(r.measured_note)}</p></section>')


def _knobs(data: ReportData, images: Mapping[str, Image]) -> str:
    parts = []
    for effect in data.knobs:
        s = effect.summary
        if s.empty:
            continue
        rows = [[_e(r.label), fmt_int(r.n_trials), fmt_num(r.batch_median), fmt_rate(r.throughput_median),
                 fmt_rate(r.throughput_max), fmt_bytes(r.peak_median)] for r in s.itertuples()]
        scope = (" (trials that swap)" if effect.knob != "n_tensors" else "") + (", PREDICTED" if effect.predicted
                                                                                  else "")
        parts.append(f"<div><h3>{_e(effect.knob)}{scope}</h3>" + _table(
            [_e(effect.knob), "trials", "median batch", "median samples/s", "best samples/s", "median peak"],
            rows, numeric=(1, 2, 3, 4, 5), cls="knob") + "</div>")
    predicted = any(e.predicted for e in data.knobs)
    caption = ("Each dot is a " + ("feasible trial of the simulated screening study (PREDICTED figures: too few "
                                   "configs were measured to show the knobs)" if predicted else "feasible trial")
               + " (spread sideways a little so equal values stay visible); the bar is the median per knob value. "
               "n_tensors: how many candidate tensors are swapped (all = every candidate); the other panels: the "
               "knobs that took more than one value (" + ", ".join(e.knob for e in data.knobs[1:]) + ").")
    return ('<section id="knobs"><h2>How the knobs matter</h2>'
            f'{_img(images.get("knobs"), caption=_e(caption))}<div class="pair">{"".join(parts)}</div></section>')


def _varying_knobs(trials: pd.DataFrame, table: KnobTable = KNOB_TABLE) -> tuple[list[str], list[str]]:
    """(knob columns that differ between trials, plus those always shown; ``k=v`` of the constant ones)."""
    shown, constant = [], []
    for k in table.columns:
        values = {_plain(v) for v in trials[k]}
        if k in table.always_shown or len(values) > 1:
            shown.append(k)
        elif values and values != {"–"}:
            constant.append(f"{k}={values.pop()}")
    return shown, constant


def _trial_table(data: ReportData) -> str:
    knobs, constant = _varying_knobs(data.trials, data.knob_table)
    rows, classes = [], []
    for r in data.trials.to_dict("records"):
        peak_kind = "predicted" if r["peak_is_predicted"] or not r["measured"] else "measured"
        no_rate = not r["feasible"] and not (_num(r["throughput"]) or 0) > 0
        cells = [f"#{r['number']}", _e(r["status"] if r["state"] == "complete" else f"{r['status']} ({r['state']})"),
                 fmt_int(r["batch_size"]), "–" if no_rate else fmt_rate(r["throughput"]), fmt_bytes(r["peak_bytes"]),
                 _e(peak_kind if _num(r["peak_bytes"]) is not None else "–"), _e(r["backend"] or "–")]
        cells += [_e(_plain(r[k])) for k in knobs]
        cells.append(_e(r["reason"]))
        rows.append(cells)
        classes.append(_row_class(data, r))
    headers = ["trial", "status", "batch", "samples/s", "peak", "peak is", "backend", *knobs, "reason"]
    table = _table([_e(c) for c in headers], rows, row_classes=classes, numeric=(2, 3, 4), cls="trials")
    same = (" Same in every trial: <code>" + _e(", ".join(constant)) + "</code>.") if constant else ""
    return ('<section id="trials"><h2>All trials</h2>'
            '<p class="note"><span class="swatch rec"></span> recommended · <span class="swatch base"></span> '
            'no-LMS baseline · <span class="swatch failed"></span> failed (batch 0: no batch fits).'
            f"{same} Every column, as data: <code>trials.csv</code> beside this page.</p>" + table + "</section>")


def _plain(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d1d1f;margin:0 auto;
 max-width:1280px;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0 2px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;
 padding-bottom:4px}h3{font-size:14px;margin:16px 0 6px}
.sub,.note,figcaption{color:#555;font-size:13px}.study{font-family:ui-monospace,Menlo,monospace}
table{border-collapse:collapse;font-size:12.5px;margin:4px 0 8px}th,td{padding:3px 8px;
 border-bottom:1px solid #eee;text-align:left;vertical-align:top}thead th{background:#f5f5f7;
 position:sticky;top:0}td.num{text-align:right;font-variant-numeric:tabular-nums}
.env{display:grid;grid-template-columns:repeat(auto-fill,minmax(380px,1fr));gap:2px 24px;font-size:13px}
.kv .k{font-weight:600;color:#444;display:inline-block;min-width:8.5em}.kv .v{overflow-wrap:anywhere}.kv.wide{grid-column:1/-1}
td.num{white-space:nowrap}
tr.rec td{background:#fff3d6}tr.base td{background:#ececec}tr.failed td{color:#a33d00}
.swatch{display:inline-block;width:10px;height:10px;border:1px solid #bbb}.swatch.rec{background:#fff3d6}
.swatch.base{background:#ececec}.swatch.failed{background:#a33d00}
.box{border:2px solid #E69F00;border-radius:8px;padding:4px 18px 12px;background:#fffbf2}
.box.none{border-color:#D55E00;background:#fff6f1}.box h2{border:0}
.figs{display:flex;flex-wrap:wrap;gap:12px;margin:8px 0}.fig{background:#fff;border:1px solid #eee;
 border-radius:6px;padding:8px 12px;min-width:190px}.fig .label{color:#666;font-size:12px}
.fig .value{font-size:22px;font-weight:600}.fig .detail{color:#555;font-size:12px}
.warn{color:#a33d00;font-weight:600}
pre{background:#f5f5f7;padding:10px 12px;border-radius:6px;overflow-x:auto}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px}
figure{margin:8px 0}img{max-width:100%;height:auto;border:1px solid #eee}
.pair{display:flex;flex-wrap:wrap;gap:16px}.pair>figure{flex:1 1 560px}.pair>div{flex:0 1 auto}
footer{margin-top:32px;color:#777;font-size:12px}
"""


def render_html(data: ReportData, images: Mapping[str, Image], *, files: Sequence[str] = ()) -> str:
    """The whole page as one string (UTF-8, no external references).

    Args:
        data: everything computed for the report.
        images: figures by key (missing keys leave their section without a figure).
        files: names of the files written beside the page, listed in the footer.
    """
    listed = ", ".join(f"<code>{_e(f)}</code>" for f in files)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{_e(CSP)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="referrer" content="no-referrer">'
        f"<title>LMS tuning report: {_e(data.study_name)}</title><style>{_STYLE}</style></head><body>\n"
        + _header(data) + "\n" + _recommendation(data) + "\n" + _pareto(data, images) + "\n"
        + _timeline(data, images) + "\n" + _recompute(data) + "\n" + _knobs(data, images) + "\n"
        + _trial_table(data) + "\n"
        + f"<footer>Written by <code>python -m tuner report</code>. Files beside this page: {listed or '–'}."
        "</footer>\n</body></html>\n")
