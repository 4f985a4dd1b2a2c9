"""``report``: a study's HTML report (`tuner.report.build_report`)."""

from __future__ import annotations

import argparse
import errno

from .common import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, check_output_folder, err, open_existing

__all__ = ["cmd_report"]


def cmd_report(args: argparse.Namespace) -> int:
    open_existing(args)  # the study must exist (exit 2 otherwise)
    check_output_folder(args.reports_dir, what="--reports-dir")
    from ..report import build_report, report_folder_name
    from ..report.peers import PeersMismatch

    try:
        path = build_report(args.study, storage=args.storage, studies_dir=args.studies_dir,
                            reports_dir=args.reports_dir, peers=getattr(args, "peers", None))
    except PeersMismatch as exc:  # raised before anything is written
        err(f"--peers {args.peers}: {exc}")
        return EXIT_BAD_INPUT
    except OSError as exc:
        if exc.errno not in _CANNOT_WRITE:
            raise
        folder = args.reports_dir / report_folder_name(args.study)
        err(f"cannot write the report in {folder}: {exc.strerror}; make room there or give another --reports-dir, "
            "and run the report again")
        return EXIT_FAILURE
    print(f"report: {path}")
    return EXIT_OK


#: A folder that takes no more: disk full, quota, file size limit, read-only.
_CANNOT_WRITE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})
