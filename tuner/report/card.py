"""The recommendation card of the report: the figures recommended.json and ``tuner best`` state, and the
fresh processes behind them (one truth: the baseline and the ratios are the document's own)."""

from __future__ import annotations

import json
from typing import Any, Mapping

from ..policy.bracket import start_origin
from .data import ReportData
from .markup import (config_knobs as _config_knobs, escape as _e, fmt_bytes, fmt_int, fmt_num, fmt_rate,
                     number as _num, pct as _pct, table as _table)

__all__ = ["recommendation_section"]


def recommendation_section(data: ReportData) -> str:
    rec = data.recommendation
    if rec is None:
        failures = data.trials[~data.trials["feasible"]]
        counts = failures["status"].value_counts()
        reasons = failures["reason"][failures["reason"] != ""].value_counts().head(3)
        lines = "".join(f"<li>{_e(k)}: {int(v)} trials</li>" for k, v in counts.items())
        why = "".join(f"<li><code>{_e(k)}</code> ({int(v)}×)</li>" for k, v in reasons.items())
        return ('<section id="recommendation" class="box none"><h2>No recommendation</h2>'
                "<p>No trial produced a configuration that fits the budget, so there is no "
                "<code>recommended.json</code> yet.</p>"
                + (f"<ul>{lines}</ul>" if lines else "")
                + (f"<p>Most common reasons:</p><ul>{why}</ul>" if why else "") + "</section>")
    base = _baseline_figures(data)
    figures = []
    batch_vs = ""
    tput_vs = ""
    if base is not None and _num(base.get("batch_size")):
        # the ratios recommended.json and `tuner best` print (gain_vs_baseline), else computed the same way
        gain = rec.document.get("gain_vs_baseline") or {}
        ratio = _num(gain.get("batch_size_ratio")) or rec.batch_size / float(base["batch_size"])
        batch_vs = f"{ratio:.2f}× the no-LMS maximum of {fmt_int(base['batch_size'])}"
        if rec.throughput is not None and _num(base.get("throughput")):
            t_ratio = _num(gain.get("throughput_ratio")) or rec.throughput / float(base["throughput"])
            tput_vs = (f"{t_ratio:.2f}× no LMS ({fmt_rate(base['throughput'])} samples/s at batch "
                       f"{fmt_int(base['batch_size'])})")
    elif base is None:
        batch_vs = "no no-LMS baseline trial in this study"
    figures.append(("batch size", fmt_int(rec.batch_size), batch_vs))
    figures.append(("throughput", f"{fmt_rate(rec.throughput)} samples/s", tput_vs))
    figures.append(("peak device memory", fmt_bytes(rec.peak_device_bytes),
                    f"{fmt_int(rec.peak_device_bytes)} bytes" if rec.peak_device_bytes is not None else ""))
    if "peak_host_bytes" in rec.document:  # host memory the swapped tensors hold (tuner.host)
        host = rec.document.get("peak_host_bytes")
        hb = (rec.document.get("host_budget") or {}).get("bytes")
        figures.append(("peak host memory (swapped)", fmt_bytes(host),
                        f"{(rec.document.get('sources') or {}).get('peak_host_bytes', '')}; "
                        + (f"host budget {fmt_bytes(hb)}" if hb else "no host budget")))
    if rec.headroom_bytes is not None:
        figures.append(("headroom", fmt_bytes(rec.headroom_bytes),
                        f"{_pct(rec.headroom_fraction, signed=False)} of the {fmt_bytes(rec.budget_bytes)} budget"))
    else:
        figures.append(("headroom", "–", "budget or peak unknown"))
    cells = "".join(f'<div class="fig"><div class="label">{_e(label)}</div><div class="value">{_e(value)}</div>'
                    f'<div class="detail">{_e(detail)}</div></div>' for label, value, detail in figures)
    kind = rec.source or ("measured" if rec.measured else "predicted (simulator)")
    trial = f"trial #{data.recommended_trial}" if data.recommended_trial is not None else "trial not found in the study"
    warnings = []
    if rec.document.get("unconfirmed"):
        warnings.append(f"NOT CONFIRMED: {rec.document['unconfirmed']}. The finished search may recommend another "
                        "config; run the search again to finish it.")
    corrected = rec.document.get("plan_corrections")
    if isinstance(corrected, dict) and corrected.get("warning"):
        warnings.append(f"Plan corrected: {corrected['warning']}.")
    if not rec.measured:
        warnings.append("These figures are predictions: confirm with a measured run before relying on the batch size.")
    if rec.headroom_fraction is not None and rec.headroom_fraction < 0.02:
        warnings.append("Less than 2% headroom: fragmentation or a different input size may run out of memory.")
    if rec.headroom_bytes is not None and rec.headroom_bytes < 0:
        warnings.append("The recorded peak is above the budget.")
    warn = "".join(f'<p class="warn">{_e(w)}</p>' for w in warnings)
    about = []
    if rec.selection:
        about.append(f"Chosen as the {rec.selection}.")
    about += list(rec.notes)
    about_html = "".join(f'<p class="note">{_e(a)}</p>' for a in about)
    path = json.dumps(data.recommendation_path)
    code = (f"import lms\n"
            f"cfg = lms.LMSConfig.load({path})\n"
            f"step = lms.function(train_step, config=cfg)  # train with batch size {rec.batch_size}")
    config_json = json.dumps(dict(rec.config), indent=2)
    return (f'<section id="recommendation" class="box"><h2>Recommendation</h2>'
            f'<p class="kind">{_e(trial)} · backend {_e(rec.backend or "–")} · <strong>{_e(kind)}</strong> · '
            f"knobs: <code>{_e(_config_knobs(rec.config, data.knob_table))}</code></p>"
            f'<div class="figs">{cells}</div>{warn}{about_html}{_processes(rec)}'
            f"<p>Load and use it in a training script:</p><pre><code>{_e(code)}</code></pre>"
            f"<details><summary>Full configuration</summary><pre><code>{_e(config_json)}</code></pre></details>"
            "</section>")


def _baseline_figures(data: ReportData) -> Mapping[str, Any] | None:
    """The no-LMS baseline as recommended.json states it (its confirmed figures), else its trial's row."""
    doc = data.recommendation.document if data.recommendation is not None else {}
    if isinstance(doc.get("baseline"), Mapping) and _num(doc["baseline"].get("batch_size")):
        return doc["baseline"]
    return data.row(data.baseline_trial)


def _processes(rec: Any) -> str:
    """The fresh processes behind the recommended batch (and the baseline's), one row each."""
    conf = rec.document.get("confirmation") or {}
    runs = conf.get("runs") or []
    if not runs:
        return ""
    verdicts = {"ok": "fits", "infeasible": "does not fit", "oom": "out of memory"}
    rows = [[fmt_int(r.get("process")), fmt_int(r.get("batch")),
             _e(verdicts.get(r.get("status"), f"no verdict ({r.get('status')})")),
             fmt_bytes(r.get("peak_device_bytes")),
             fmt_rate(r.get("throughput")) if r.get("status") == "ok" else "–",
             fmt_int(r.get("timed_steps")) if r.get("timed_steps") else "–", fmt_num(r.get("wall_s"))]
            for r in runs]
    classes = ["rec" if r.get("status") == "ok" and r.get("batch") == conf.get("batch_size") else "" for r in runs]
    table = _table(["process", "batch", "verdict", "peak", "samples/s", "timed steps", "wall (s)"], rows,
                   row_classes=classes, numeric=(0, 1, 3, 4, 5, 6), cls="processes")
    base = ((rec.document.get("baseline") or {}).get("confirmation") or {})
    base_line = ""
    if base.get("tried"):
        base_line = (f'<p class="note">No-LMS baseline: batch {fmt_int(base.get("batch_size"))} fitted in '
                     f'{fmt_int(base.get("fits"))} fresh processes (one batch per process: '
                     + _e(", ".join(f"{b} {v}" for b, v in base["tried"])) + ").</p>")
    start = f", the first at {start_origin(conf)} batch {fmt_int(conf['start'])}" if conf.get("start") else ""
    return (f'<details id="processes" open><summary>Fresh processes: batch {fmt_int(conf.get("batch_size"))} fitted '
            f'in {fmt_int(conf.get("fits"))} of {fmt_int(conf.get("processes"))}{_e(start)} (one batch per process, '
            "from its first step; the figures above are the fastest process at that batch and the highest peak "
            f"there)</summary>{table}{base_line}</details>")
