"""``list``: the studies under --studies-dir, or in --storage, one row each."""

from __future__ import annotations

import argparse

from ..budget import format_bytes
from ..errors import BadInput
from ..study.storage import EmptyStorage, StorageSpec, check_reachable, mask_secrets, resolve_storage
from .common import EXIT_OK, err

__all__ = ["cmd_list"]


def cmd_list(args: argparse.Namespace) -> int:
    rows: list[tuple[str, ...]] = []
    unreadable: list[str] = []
    if args.storage:
        spec = resolve_storage(args.storage, "list", studies_dir=args.studies_dir)
        check_reachable(spec, create=False)
        if not spec.exists():
            raise BadInput(f"storage {spec.display!r} does not exist")
        sources = [spec]
    else:
        root = args.studies_dir
        sources = [resolve_storage(None, db.parent.name, studies_dir=root)
                   for db in (sorted(root.glob("*/study.db")) if root.is_dir() else [])]
    for spec in sources:
        try:
            found = _study_rows(args, spec)
        except EmptyStorage:
            continue
        except Exception as exc:  # a corrupt or foreign file: flag it, list the others
            if args.storage:
                raise
            reason = mask_secrets(" ".join(str(exc).split()), spec.url)[:160]
            rows.append((spec.path.parent.name if spec.path else spec.display, "?", "", "", "", "",
                         f"UNREADABLE: {type(exc).__name__}: {reason}"))
            unreadable.append(str(spec.path))
            continue
        rows += found
    if not rows:
        print(f"no studies in {args.storage and mask_secrets(args.storage, args.storage) or args.studies_dir}")
        return EXIT_OK
    header = ("study", "evaluated", "model", "backend", "budget", "role", "recommendation")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    for path in unreadable:
        err(f"warning: cannot read {path}; it is listed as UNREADABLE")
    return EXIT_OK


def _study_rows(args: argparse.Namespace, spec: StorageSpec) -> list[tuple[str, ...]]:
    """`list`'s rows for the studies in one storage."""
    import optuna

    from ..policy.records import counted
    from ..study.storage import open_storage

    from ..outputs import read_recommendation
    from ..study.study import foreign_study, tuner_record

    rows = []
    storage = open_storage(spec, read_only=True)
    for summary in optuna.study.get_all_study_summaries(storage=storage, include_best_trial=False):
        attrs = tuner_record(summary.user_attrs) or {}
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        if foreign_study(study, display=spec.display):  # its trials are not the tuner's records: not read
            n = len(study.get_trials(deepcopy=False))
            rows.append((summary.study_name, str(n), "?", "?", "-", "", "(not made by lms-tuner)"))
            continue
        rec = args.studies_dir / summary.study_name / "recommended.json"
        best = ""
        if rec.is_file():
            try:
                doc = read_recommendation(rec)
                best = (f"batch {doc['batch_size']}, {doc['throughput']:.1f}/s "
                        f"({'measured' if doc.get('measured') else 'predicted'})")
            except (ValueError, OSError):  # checked by the reader: a broken file is named, not the study
                best = "(unreadable recommended.json)"
        evaluated = sum(1 for t in study.get_trials(deepcopy=False) if counted(t))
        budget = attrs.get("budget_bytes")
        rows.append((summary.study_name, str(evaluated), str(attrs.get("model", "?")),
                     str(attrs.get("backend", "?")), format_bytes(budget if isinstance(budget, int) else None),
                     str(summary.user_attrs.get("role") or attrs.get("role") or ""), best))
    return rows
