"""``report``: a study's HTML report (`tuner.report.build_report`)."""

from __future__ import annotations

import argparse

from .common import EXIT_OK, check_output_folder, open_existing

__all__ = ["cmd_report"]


def cmd_report(args: argparse.Namespace) -> int:
    open_existing(args)  # the study must exist (exit 2 otherwise)
    check_output_folder(args.reports_dir, what="--reports-dir")
    from ..report import build_report

    path = build_report(args.study, storage=args.storage, studies_dir=args.studies_dir,
                        reports_dir=args.reports_dir)
    print(f"report: {path}")
    return EXIT_OK
