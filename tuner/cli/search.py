"""``search``: run or resume a study (`tuner.search.run_search`, or `tuner.grow.run_grow` with ``--grow``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from ..backends import get_backend
from ..budget import format_bytes
from ..policy.knobs import KNOB_TABLE
from ..study.storage import mask_secrets, storage_failure
from .common import EXIT_FAILURE, EXIT_OK, PROG, err
from .search_settings import build_search_settings

__all__ = ["cmd_search", "no_fit_message"]

log = logging.getLogger("tuner.cli")


def cmd_search(args: argparse.Namespace) -> int:
    from ..outputs import format_recommendation
    from ..study.progress import Progress
    from ..errors import SearchError
    from ..search import run_search

    settings = build_search_settings(args)  # BadInput: one line, exit 2, nothing logged before it
    if settings.grow is not None:
        return _grow(args, settings)
    try:
        outcome = run_search(settings, progress=Progress(disabled=True if args.quiet else None))
    except SearchError as exc:  # a trial's reason may quote a driver's message, URL and all
        err(mask_secrets(f"search failed: {exc}", args.storage))
        return EXIT_FAILURE
    except KeyboardInterrupt:
        err(f"interrupted: completed trials are kept in {settings.storage.display}; run the same command "
            "again to resume")
        return EXIT_FAILURE
    except Exception as exc:
        cause = storage_failure(exc)
        if not cause:
            raise
        err(mask_secrets(f"storage {settings.storage.display} failed during the search ({cause}); the trials "
                         "recorded before it are kept there: run the same command again once it works",
                         settings.storage.url))
        return EXIT_FAILURE
    failure = _search_failure(settings, outcome)
    if failure:
        _report_after_search(args, settings.study, settings.studies_dir)
        err(failure)
        return EXIT_FAILURE
    if args.json:
        print(json.dumps(outcome.recommendation, indent=2, default=str, allow_nan=False))
    else:
        print(format_recommendation(outcome.recommendation))
        print(f"wrote {outcome.recommended_path} and {outcome.trials_csv} "
              f"({outcome.completed} trials; {outcome.ran} run now"
              + (f", {outcome.screened} simulated for screening" if outcome.screened else "")
              + f"; {outcome.wall_s:.0f} s)")
        if outcome.stopped_early and not outcome.unconfirmed:
            print(_stopped_early(settings, outcome))
    _report_after_search(args, settings.study, settings.studies_dir)
    if outcome.unconfirmed:  # a time limit never turns into another answer: say so last, and fail
        then = (f"Finish it with: {_finish_command(args)}" if outcome.cut_short else
                f"See its fresh processes with: {PROG} best --study {settings.study}")
        print(f"WARNING: the recommendation is NOT CONFIRMED: {outcome.unconfirmed}; {outcome.recommended_path} "
              f"says so (\"confirmed\": false) and may name another config than a finished confirmation would. "
              + then, file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def _finish_command(args: argparse.Namespace) -> str:
    """The search's own command line with ``--timeout 0`` (it resumes from the stored trials and processes).

    The storage URL's secrets are masked (`mask_secrets`, ``postgresql://u:***@h/db``): the line is made to be
    copied into CI logs, so whoever runs it puts the password back (or keeps it in ``~/.pgpass``).
    """
    import shlex

    argv = list(getattr(args, "argv", None) or ["search"])
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--timeout":
            skip = True
            continue
        if not a.startswith("--timeout="):
            out.append(mask_secrets(a, args.storage))  # args.storage: also when typed as --stor or --storage=
    prog = "python -m tuner" if sys.argv and sys.argv[0].endswith("__main__.py") else PROG
    return f"{prog} {shlex.join(out + ['--timeout', '0'])}"


def _more_trials(outcome: Any, settings: Any) -> str:
    """A command-line change that makes a rerun evaluate more configs (evaluated ones count toward --trials)."""
    return f"--trials {outcome.completed + settings.trials}"


def _search_failure(settings: Any, outcome: Any) -> str:
    """Why the search has no usable result (exit 1), or "" when it has one."""
    rec = outcome.recommendation
    if rec is not None and (rec.get("measured") or not get_backend(settings.backend).measured):
        return ""
    statuses = dict(outcome.statuses)
    evaluated = sum(statuses.values())
    if outcome.stop_reason == "time limit" and not any(statuses.get(s) for s in ("ok",)):
        limit = f"{settings.timeout_s:g} s" if settings.timeout_s else "the time limit"
        what = "before any config was evaluated" if evaluated == 0 else "before any config was measured to fit"
        return (f"the time limit ({limit}) ran out {what} in study {settings.study} ({evaluated} trials); give a "
                f"longer --timeout (0: no limit) and run again")
    if outcome.no_fit:
        return no_fit_message(outcome.no_fit, study=settings.study)
    failed = {s: n for s, n in statuses.items() if s in ("error", "timeout", "killed")}
    shown = ", ".join(f"{n} {s}" for s, n in sorted(failed.items()))
    predicted = (f"; {outcome.recommended_path} holds the simulator's PREDICTED pick only" if rec is not None else "")
    if evaluated and sum(failed.values()) == evaluated:
        return (f"every measured trial failed or timed out ({shown}) in study {settings.study}{predicted}; see "
                f"the reasons in {outcome.trials_csv} and the workers' logs, fix the cause (e.g. a longer "
                f"--trial-timeout), and run again with {_more_trials(outcome, settings)} to measure more configs")
    if outcome.stopped_early and outcome.stop_reason == "others" and evaluated == 0:
        return (f"no config evaluated yet in study {settings.study}: its trials are running in another process "
                f"({outcome.running_elsewhere}); see their results with '{PROG} best --study {settings.study}'")
    return (f"no config fits the budget in study {settings.study} ({evaluated} trials"
            + (f": {shown}" if shown else "") + f"){predicted}; see {outcome.trials_csv}")


def no_fit_message(no_fit: Any, *, study: str) -> str:
    """``--batch N`` and no config fits: the smallest peak found and the batch that config would fit."""
    knobs = " ".join(f"{k}={v}" for k, v in no_fit["config"].items() if k in KNOB_TABLE.columns)
    fits = (f"batch {no_fit['fits_batch']} would fit with that config ({no_fit['fits_batch_source']})"
            if no_fit.get("fits_batch") else "that config does not fit even batch 1 "
            f"({no_fit['fits_batch_source']})")
    return (f"no LMS config fits batch {no_fit['batch']} in study {study}: the smallest peak found is "
            f"{format_bytes(no_fit['smallest_peak_bytes'])} ({knobs}; {no_fit['peak_source']}); {fits}")


def _grow(args: argparse.Namespace, settings: Any) -> int:
    """``search --batch N --grow OPTION``: the largest option value that fits, with and without LMS."""
    from ..errors import SearchError
    from ..grow import format_grow, run_grow
    from ..study.progress import Progress

    try:
        outcome = run_grow(settings, progress=Progress(disabled=True if args.quiet else None))
    except SearchError as exc:
        err(mask_secrets(f"search failed: {exc}", args.storage))
        return EXIT_FAILURE
    except KeyboardInterrupt:
        err("interrupted: the values evaluated so far are kept; run the same command again to resume")
        return EXIT_FAILURE
    if outcome.recommendation is None:
        err(format_grow(outcome.doc))
        return EXIT_FAILURE
    if args.json:
        print(json.dumps(outcome.recommendation, indent=2, default=str, allow_nan=False))
    else:
        print(format_grow(outcome.doc))
        print(f"wrote {outcome.recommended_path} and {outcome.grow_path}")
    return EXIT_OK


def _stopped_early(settings: Any, outcome: Any) -> str:
    """The line that says why the search ended before --trials configs were evaluated."""
    head = f"stopped before {settings.trials} trials"
    if outcome.stop_reason == "time limit":
        return f"{head} (time limit); run the same command to continue"
    if outcome.stop_reason == "others":
        return (f"{head}: the other {outcome.running_elsewhere} trial(s) are running in another process sharing "
                "the study; its results are recorded there")
    if outcome.stop_reason in ("space", "repeats"):
        return f"{head}: every config of the search space has been evaluated"
    if outcome.stop_reason == "stop":
        return f"{head} (stopped); run the same command to continue"
    return f"{head}; run the same command with {_more_trials(outcome, settings)} to continue"


def _report_after_search(args: argparse.Namespace, study: str, studies_dir: Path) -> None:
    """Write reports/<study>/index.html at the end of `search`; a failure only warns."""
    if args.no_report:
        return
    try:
        from ..report import build_report

        path = build_report(study, storage=args.storage, studies_dir=studies_dir, reports_dir=args.reports_dir)
    except Exception as exc:  # the search's own outputs are written; the report is a bonus
        log.warning("report not written (%s: %s); run 'lms-tuner report --study %s'",
                    type(exc).__name__, exc, study)
        return
    print(f"report: {path}")
