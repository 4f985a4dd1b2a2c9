"""The report's HTML pieces: escaping, number formats, a table, an embedded image. No matplotlib, no data.

Every piece of text that comes from users or the study goes through `escape`
(`html.escape`). `tuner.report.html` lays the sections out with these; the
recommendation card (`tuner.report.card`) too.
"""

from __future__ import annotations

import base64
import html
import json
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from ..policy.knobs import KNOB_TABLE, KnobTable

__all__ = ["Image", "escape", "number", "fmt_bytes", "fmt_int", "fmt_num", "fmt_rate", "pct", "table", "img",
           "config_knobs"]


@dataclass(frozen=True)
class Image:
    """One figure for the page.

    Attributes:
        key: section it belongs to (``"pareto_batch"``, ``"pareto_memory"``, ``"timeline"``, ``"knobs"``).
        png: PNG bytes, embedded.
        alt: text alternative.
        files: the PNG/SVG files written beside the page (names only).
        width_px / height_px: pixel size of the PNG.
    """

    key: str
    png: bytes
    alt: str
    files: tuple[str, ...] = ()
    width_px: int = 0
    height_px: int = 0


def escape(value: Any) -> str:
    return html.escape(str(value), quote=True)


def number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def fmt_bytes(value: Any) -> str:
    f = number(value)
    if f is None:
        return "–"
    from tuner.budget import format_bytes

    return format_bytes(f)


def fmt_int(value: Any) -> str:
    f = number(value)
    return "–" if f is None else f"{int(round(f)):,}"


def fmt_num(value: Any) -> str:
    """A count or median: ``16`` rather than ``16.0``, one decimal otherwise."""
    f = number(value)
    if f is None:
        return "–"
    return f"{int(f):,}" if f.is_integer() else f"{f:,.1f}"


def fmt_rate(value: Any) -> str:
    f = number(value)
    if f is None:
        return "–"
    return f"{f:,.1f}" if f >= 10 else f"{f:.3g}"


def pct(value: float | None, *, signed: bool = True) -> str:
    if value is None or math.isnan(value):
        return "–"
    return f"{value * 100:+.1f}%" if signed else f"{value * 100:.1f}%"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, row_classes: Sequence[str] = (),
           numeric: Sequence[int] = (), cls: str = "") -> str:
    """A table from already-escaped cell HTML."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        rc = row_classes[i] if i < len(row_classes) and row_classes[i] else ""
        cells = "".join(f'<td class="num">{c}</td>' if j in numeric else f"<td>{c}</td>"
                        for j, c in enumerate(row))
        body.append(f'<tr class="{rc}">{cells}</tr>' if rc else f"<tr>{cells}</tr>")
    return (f'<table class="{cls}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def img(image: Image | None, *, caption: str) -> str:
    if image is None:
        return ""
    data = base64.b64encode(image.png).decode("ascii")
    size = f' width="{image.width_px}" height="{image.height_px}"' if image.width_px else ""
    files = ", ".join(f"<code>{escape(f)}</code>" for f in image.files)
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{escape(image.alt)}"{size}>'
            f"<figcaption>{caption}{' Files: ' + files + '.' if files else ''}</figcaption></figure>")


def config_knobs(config: Mapping[str, Any], table: KnobTable = KNOB_TABLE) -> str:
    """``n_tensors=100, lb=5, fuse_swapins=true``: the knobs shown always (n_tensors, lb), other fields where
    they differ from the config's defaults. Without swaps (``n_tensors=0``) the swap knobs mean nothing:
    ``n_tensors=0 (LMS off)``, or ``n_tensors=0 (no swaps), recompute="cheap"`` (`KnobTable.swap_note`)."""
    defaults = table.config_cls().to_dict()
    note = table.swap_note(config)
    if note:
        swap_knobs = {k.name for k in table.knobs if k.swaps_only}
        return ", ".join([f"n_tensors=0 ({note})"] + [f"{k}={json.dumps(v)}" for k, v in config.items()
                                                      if k != "n_tensors" and k not in swap_knobs
                                                      and defaults.get(k, object()) != v])
    always = table.always_shown
    shown = [f"{k}={json.dumps(v)}" + (" (all)" if k == "n_tensors" and v == -1 else "")
             for k, v in config.items() if k in always or defaults.get(k, object()) != v]
    return ", ".join(shown)
