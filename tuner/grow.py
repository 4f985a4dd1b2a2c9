"""``search --batch N --grow OPTION``: the largest input (image side, volume side, sequence length) that fits.

The question TFLMS v2 answered for the 3D U-Net ("5.6x larger images"): at a
fixed batch, how large may an integer model option grow before the step no
longer fits the budget, with the best LMS config and without LMS?

Values are multiples of the step the workload declares (`Workload.growable`,
e.g. 32 for ResNet-50's ``image_size``, 16 for the 3D U-Net's ``input_size``).
Shapes change with the value, so each value is its own fixed-batch study
(`tuner.search.run_search` with ``batch=N``), traced and cached in its own
folder, ``studies/<study>/values/<study>.<option>-<value>/``::

    fits_lms(v)   some config of the space fits at batch N (the study's recommendation exists)
    fits_none(v)  the no-LMS baseline fits at batch N (a one-trial study of that value,
                  or the baseline trial of its full study)

Both are assumed to fall from True to False as v grows. `largest_fitting`
brackets the boundary from the starting value (doubling up, or halving down),
then bisects it to one step; the no-LMS search reuses every value already
evaluated and is bounded by the LMS answer (no LMS is one of LMS's configs).
The budget is fixed once for every value (``--budget``, else the backend's
default; the emulated backend's derived budget is taken at the starting value).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from lms.config import atomic_write_text

from .backends import get_backend
from .budget import format_bytes
from .errors import BadInput
from .policy.knobs import KNOB_TABLE
from .study.settings import SearchSettings
from .study.storage import resolve_storage

__all__ = ["Bracket", "largest_fitting", "ValueVerdict", "GrowOutcome", "run_grow", "format_grow",
           "MAX_STEPS"]

log = logging.getLogger(__name__)

#: The largest value tried is this many steps (4096 x 32 pixels for ResNet-50): a bound, not a target.
MAX_STEPS = 4096


@dataclass(frozen=True)
class Bracket:
    """The outcome of `largest_fitting`.

    Attributes:
        largest: the largest value seen to fit (None: not even the smallest allowed value fits).
        smallest_failing: the smallest value seen not to fit (None: the largest allowed value fits).
        probes: (value, fits) in the order they were evaluated.
    """

    largest: int | None
    smallest_failing: int | None
    probes: tuple[tuple[int, bool], ...] = ()


def largest_fitting(fits: Callable[[int], bool], *, start: int, step: int, lowest: int, highest: int) -> Bracket:
    """The largest multiple of `step` in ``[lowest, highest]`` for which `fits` holds: bracket, then bisect.

    From `start` (rounded down to a multiple of `step`, clamped to the range):
    while it fits, double it (up to `highest`); while it does not, halve it
    (down to `lowest`); then bisect the bracket ``(fits, does not)`` until the
    two are one step apart. `fits` must be monotone (True up to a value, False
    after it); each value is evaluated at most once.
    """
    if step < 1:
        raise ValueError(f"step={step}: must be >= 1")
    k_lo = max(1, -(-lowest // step))
    k_hi = highest // step
    if k_hi < k_lo:
        raise ValueError(f"no multiple of {step} between {lowest} and {highest}")
    seen: dict[int, bool] = {}
    order: list[tuple[int, bool]] = []

    def check(k: int) -> bool:
        if k not in seen:
            seen[k] = bool(fits(k * step))
            order.append((k * step, seen[k]))
        return seen[k]

    k = min(max(start // step, k_lo), k_hi)
    lo: int | None = None  # fits
    hi: int | None = None  # does not
    if check(k):
        lo = k
        while lo < k_hi:
            nxt = min(2 * lo, k_hi)
            if check(nxt):
                lo = nxt
            else:
                hi = nxt
                break
    else:
        hi = k
        while hi > k_lo:
            nxt = max(hi // 2, k_lo)
            if check(nxt):
                lo = nxt
                break
            hi = nxt
    if lo is not None and hi is not None:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if check(mid):
                lo = mid
            else:
                hi = mid
    return Bracket(None if lo is None else lo * step, None if hi is None else hi * step, tuple(order))


# ---------------------------------------------------------------- the search over values

@dataclass
class ValueVerdict:
    """What is known about one value of the grown option (filled in as studies run).

    Attributes:
        value: the option's value.
        study: the fixed-batch study of that value.
        fits_with_lms: the study found a config that fits (None: not searched yet).
        fits_without_lms: the no-LMS baseline fits (None: not evaluated yet).
        refused: the workload refuses the value (e.g. ``seq_len`` > ``n_positions``): it fits nothing.
        recommendation: the study's recommended.json (when a config fits).
        baseline: the no-LMS trial's figures.
        no_fit: when nothing fits: the smallest peak found (`tuner.search.SearchOutcome.no_fit`).
    """

    value: int
    study: str
    fits_with_lms: bool | None = None
    fits_without_lms: bool | None = None
    refused: str = ""
    recommendation: dict[str, Any] | None = None
    recommended_path: str | None = None
    baseline: dict[str, Any] | None = None
    no_fit: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        rec = self.recommendation or {}
        return {"value": self.value, "study": self.study, "fits_with_lms": self.fits_with_lms,
                "fits_without_lms": self.fits_without_lms, "refused": self.refused,
                "best": ({"config": rec.get("config"), "throughput": rec.get("throughput"),
                          "peak_device_bytes": rec.get("peak_device_bytes"), "measured": rec.get("measured")}
                         if rec else None),
                "baseline": self.baseline, "no_fit": dict(self.no_fit) if self.no_fit else None}


@dataclass(frozen=True)
class GrowOutcome:
    """What `run_grow` produced: grow.json's document, the recommendation (None: no value fits)."""

    doc: dict[str, Any]
    recommendation: dict[str, Any] | None
    recommended_path: Path | None
    grow_path: Path
    verdicts: tuple[ValueVerdict, ...] = field(default=())


def _value_settings(settings: SearchSettings, value: int, *, budget: int | None, budget_source: str,
                    workload: Mapping[str, Any], baseline_only: bool) -> SearchSettings:
    option = settings.grow
    study = f"{settings.study}.{option}-{value}"
    studies_dir = settings.studies_dir / settings.study / "values"
    storage = settings.storage if not settings.storage.default else resolve_storage(None, study,
                                                                                    studies_dir=studies_dir)
    return dataclasses.replace(
        settings, study=study, studies_dir=studies_dir, storage=storage,
        model_options={**settings.model_options, option: value}, budget_bytes=budget, budget_source=budget_source,
        budget_from_batch=settings.budget_from_batch if budget is None else None,  # derived once, then given
        grow=None, workload=workload, trials=1 if baseline_only else settings.trials,
        notes=tuple(n for n in settings.notes if option not in n),  # e.g. the emulated default image_size
        screen_trials=0 if baseline_only else settings.screen_trials)


def _describe(settings: SearchSettings, value: int) -> dict[str, Any]:
    """The workload at `value` (BadInput when the workload refuses it)."""
    from .graphs import describe_user_workload
    from .models import builtin_names, load_workload

    options = {**settings.model_options, settings.grow: value}
    if settings.model in builtin_names():
        try:
            return load_workload(settings.model, **options).describe()
        except ValueError as exc:
            raise BadInput(str(exc)) from None
    return describe_user_workload(settings.model, options)


def run_grow(settings: SearchSettings, *, progress: Any = None) -> GrowOutcome:
    """Grow ``settings.grow`` at batch ``settings.batch``: the largest value that fits with and without LMS.

    Writes ``studies/<study>/grow.json`` (every value evaluated) and, when some
    value fits, ``studies/<study>/recommended.json``: the best config at the
    largest value, with ``model_options`` and ``tuned_for`` naming that value.
    """
    from .graphs import derive_budget, load_graph
    from .search import run_search

    if settings.grow is None or settings.batch is None:
        raise ValueError("run_grow needs settings.grow and settings.batch")
    option = settings.grow
    step = int((settings.workload.get("growable") or {}).get(option) or 0)
    if step < 1:
        raise BadInput(f"--grow {option}: model {settings.model} does not declare {option!r} growable")
    start = int((settings.workload.get("options") or {}).get(option) or settings.model_options.get(option) or step)
    start = max(step, start // step * step)
    settings.study_dir.mkdir(parents=True, exist_ok=True)
    budget, budget_source = settings.budget_bytes, settings.budget_source
    if budget is None:  # the emulated default or --budget-from-batch: derived once, at the starting value
        first = _value_settings(settings, start, budget=None, budget_source="", workload=_describe(settings, start),
                                baseline_only=True)
        budget, budget_source = derive_budget(first, load_graph(first), label=f"{option}={start}")
        budget_source += "; the same for every value"
    verdicts: dict[int, ValueVerdict] = {}

    def verdict(value: int) -> ValueVerdict:
        if value not in verdicts:
            verdicts[value] = ValueVerdict(value, f"{settings.study}.{option}-{value}")
        return verdicts[value]

    def evaluate(value: int, *, baseline_only: bool) -> ValueVerdict:
        v = verdict(value)
        if v.refused or (v.fits_with_lms is not None) or (baseline_only and v.fits_without_lms is not None):
            return v
        try:
            workload = _describe(settings, value)
        except BadInput as exc:
            v.refused, v.fits_with_lms, v.fits_without_lms = str(exc), False, False
            log.info("%s=%d: refused by the workload (%s)", option, value, exc)
            return v
        sub = _value_settings(settings, value, budget=budget, budget_source=budget_source, workload=workload,
                              baseline_only=baseline_only)
        log.info("%s=%d at batch %d: %s", option, value, settings.batch,
                 "the no-LMS baseline only" if baseline_only else f"searching LMS configs ({sub.trials} trials)")
        outcome = run_search(sub, progress=progress)
        v.baseline = _baseline_of(sub)
        v.fits_without_lms = bool(v.baseline and v.baseline.get("fits"))
        if not baseline_only:
            v.fits_with_lms = outcome.recommendation is not None
            v.recommendation = outcome.recommendation
            v.recommended_path = str(outcome.recommended_path) if outcome.recommended_path else None
            v.no_fit = outcome.no_fit
        elif not v.fits_without_lms:
            v.no_fit = outcome.no_fit
        log.info("%s=%d at batch %d: with LMS %s, without LMS %s", option, value, settings.batch,
                 {True: "fits", False: "does not fit", None: "not searched"}[v.fits_with_lms],
                 "fits" if v.fits_without_lms else "does not fit")
        return v

    highest = step * MAX_STEPS
    with_lms = largest_fitting(lambda value: bool(evaluate(value, baseline_only=False).fits_with_lms),
                               start=start, step=step, lowest=step, highest=highest)
    # no LMS is one config of the LMS space: it cannot fit where LMS does not
    top = with_lms.largest if with_lms.largest is not None else step
    without = largest_fitting(lambda value: bool(evaluate(value, baseline_only=True).fits_without_lms),
                              start=min(start, top), step=step, lowest=step, highest=top)
    doc = _grow_doc(settings, step=step, start=start, budget=budget, budget_source=budget_source,
                    with_lms=with_lms, without=without, verdicts=verdicts)
    grow_path = atomic_write_text(settings.study_dir / "grow.json",
                                  json.dumps(doc, indent=2, default=str, allow_nan=False) + "\n")
    rec, rec_path = None, None
    if with_lms.largest is not None:
        best = verdicts[with_lms.largest]
        rec = {**(best.recommendation or {}), "study": settings.study,
               "tuned_for": {"batch_size": settings.batch, option: with_lms.largest},
               "grow": {k: doc[k] for k in ("option", "step", "with_lms", "without_lms", "value_ratio",
                                            "size_ratio_3d", "size_ratio_2d", "value_study")}}
        rec_path = atomic_write_text(settings.study_dir / "recommended.json",
                                     json.dumps(rec, indent=2, default=str, allow_nan=False) + "\n")
        from lms.config import LMSConfig

        LMSConfig.load(rec_path)  # what a training script does: it must read back
    return GrowOutcome(doc, rec, rec_path, grow_path, tuple(verdicts[k] for k in sorted(verdicts)))


def _baseline_of(settings: SearchSettings) -> dict[str, Any] | None:
    """The no-LMS trial of a value's study: whether it fits at the batch, its peak and throughput."""
    import optuna

    from .study.storage import open_storage

    study = optuna.load_study(study_name=settings.study, storage=open_storage(settings.storage))
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        a = t.user_attrs
        if (a.get("config") or {}).get("n_tensors") == 0 and t.state.name in ("COMPLETE", "FAIL") \
                and a.get("status") in ("ok", "infeasible", "oom"):
            return {"fits": a.get("status") == "ok", "peak_device_bytes": a.get("peak_device_bytes"),
                    "throughput": a.get("throughput"), "measured": bool(a.get("measured")), "trial": t.number}
    return None


def _grow_doc(settings: SearchSettings, *, step: int, start: int, budget: int, budget_source: str,
              with_lms: Bracket, without: Bracket, verdicts: Mapping[int, ValueVerdict]) -> dict[str, Any]:
    option = settings.grow
    lms_v, base_v = with_lms.largest, without.largest
    ratio = (lms_v / base_v) if lms_v and base_v else None
    measured = get_backend(settings.backend).measured
    return {
        "schema": "tuner.grow", "schema_version": 1, "study": settings.study, "model": settings.model,
        "model_options": dict(settings.model_options), "option": option, "step": step, "start": start,
        "batch": settings.batch, "budget_bytes": budget, "budget_source": budget_source,
        "backend": settings.backend, "device": settings.device,
        "figures": ("MEASURED (each value's best config and baseline were run)" if measured
                    else "PREDICTED by the simulator"),
        "with_lms": lms_v, "with_lms_first_failing": with_lms.smallest_failing,
        "without_lms": base_v, "without_lms_first_failing": without.smallest_failing,
        "value_ratio": None if ratio is None else round(ratio, 3),
        "size_ratio_2d": None if ratio is None else round(ratio ** 2, 3),
        "size_ratio_3d": None if ratio is None else round(ratio ** 3, 3),
        "value_study": verdicts[lms_v].study if lms_v else None,
        "search": {"with_lms": [list(p) for p in with_lms.probes], "without_lms": [list(p) for p in without.probes],
                   "rule": f"multiples of {step}: from {start}, double while it fits (halve while it does not), "
                           "then bisect to one step"},
        "values": [verdicts[k].to_dict() for k in sorted(verdicts)],
    }


def format_grow(doc: Mapping[str, Any]) -> str:
    """The grow search's answer in words (every figure labelled)."""
    option, batch, step = doc["option"], doc["batch"], doc["step"]
    kind = "MEASURED" if doc["backend"] != "simulate" else "PREDICTED"
    lines = [f"study {doc['study']}: model {doc['model']}, {option} grown at batch {batch} in steps of {step}, "
             f"backend {doc['backend']}, budget {format_bytes(doc['budget_bytes'])}"]

    def said(value: Any, failing: Any) -> str:
        if value is None:
            return f"none fits (not even {option}={step})"
        return f"{option}={value}" + (f" ({failing} does not fit)" if failing else " (the largest value tried)")

    lines.append(f"  largest with LMS     {said(doc['with_lms'], doc['with_lms_first_failing'])}  ({kind})")
    lines.append(f"  largest without LMS  {said(doc['without_lms'], doc['without_lms_first_failing'])}  ({kind})")
    if doc.get("value_ratio"):
        lines.append(f"  ratio                {doc['value_ratio']:.2f}x the {option} "
                     f"({doc['size_ratio_2d']:.2f}x as an area, {doc['size_ratio_3d']:.2f}x as a volume)")
    best = next((v["best"] for v in doc["values"] if v["value"] == doc["with_lms"]), None)
    if best:
        cfg = best["config"] or {}
        lines.append(f"  best config at {option}={doc['with_lms']}: "
                     + " ".join(f"{k}={cfg[k]}" for k in KNOB_TABLE.columns if k in cfg)
                     + f", {best['throughput']:.1f} samples/s, peak {format_bytes(best['peak_device_bytes'])}"
                     + f" ({'MEASURED' if best.get('measured') else 'PREDICTED'})")
    said_lms = {True: "fits with LMS", False: "not with LMS", None: "LMS not searched"}
    lines.append("  values evaluated: " + ", ".join(
        f"{v['value']} ({said_lms[v['fits_with_lms']]}, {'fits' if v['fits_without_lms'] else 'not'} without)"
        for v in doc["values"]))
    return "\n".join(lines)
