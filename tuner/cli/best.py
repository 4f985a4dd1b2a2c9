"""``best``: a study's recommendation, from its recommended.json or computed from the storage."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..backends import get_backend
from ..errors import BadInput
from .common import EXIT_FAILURE, EXIT_OK, err, open_existing

__all__ = ["cmd_best"]


def cmd_best(args: argparse.Namespace) -> int:
    from ..outputs import format_recommendation, read_recommendation

    path = args.studies_dir / args.study / "recommended.json"
    if path.is_file():
        try:
            doc = read_recommendation(path)
            text = json.dumps(doc, indent=2, allow_nan=False) if args.json else format_recommendation(doc)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError, OSError) as exc:
            reason = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            err(f"cannot read {path}: {reason.removeprefix(f'{path}: ')}; run the search again to rewrite it")
            return EXIT_FAILURE
    else:
        doc = _recommendation_from_storage(args)
        if doc is None:
            err(f"study {args.study!r} has no feasible config yet")
            return EXIT_FAILURE
        text = json.dumps(doc, indent=2, default=str, allow_nan=False) if args.json else format_recommendation(doc)
    print(text)
    return EXIT_OK


def _recommendation_from_storage(args: argparse.Namespace) -> dict[str, Any] | None:
    """What the search would write as recommended.json, from the storage: its stored settings pick the same."""
    from ..backends import backend_named
    from ..backends.confirm import CONFIRMATIONS_ATTR
    from ..outputs import build_recommendation
    from ..policy.selection import select_recommendation
    from ..study.settings import SearchSettings
    from ..study.record import StudyRecord
    from ..study.study import study_record

    spec, _, study = open_existing(args)
    try:
        stored = study_record(study.user_attrs) or StudyRecord()
        settings = SearchSettings(
            study=args.study, model=stored.model, model_options=dict(stored.model_options),
            backend=(backend_named(stored.backend) or get_backend("simulate")).name,
            budget_bytes=stored.budget_bytes, budget_source="stored", device=stored.device,
            trials=0, screen_trials=0, storage=spec, studies_dir=args.studies_dir,
            workload=dict(stored.workload), safety_margin=stored.safety_margin, max_batch=stored.max_batch,
            batch=stored.batch, prefer=stored.prefer, min_throughput_ratio=stored.min_throughput_ratio,
            host_budget_bytes=stored.host_budget_bytes, host_budget_source=stored.host_budget_source)
    except (TypeError, ValueError) as exc:
        raise BadInput(f"study {args.study!r} has unreadable tuner settings ({exc})") from None
    trials = study.get_trials(deepcopy=False)
    chosen, front = select_recommendation(trials, prefer=settings.prefer,
                                          min_throughput_ratio=settings.min_throughput_ratio,
                                          confirmations=study.user_attrs.get(CONFIRMATIONS_ATTR))
    if chosen is None:
        return None
    budget = int(stored.budget_bytes or 0)
    from ..policy.batch import usable_bytes

    return build_recommendation(study=args.study, chosen=chosen, front=front, trials=trials, settings=settings,
                                budget_bytes=budget, budget_source=stored.budget_source,
                                usable_bytes=usable_bytes(budget, settings.safety_margin), environment={},
                                notes=["computed from the study storage (recommended.json not written yet)"],
                                confirmations=study.user_attrs.get(CONFIRMATIONS_ATTR))
