"""``python -m tuner`` / ``lms-tuner``: search, best, list, report, validate-config.

Exit codes: 0 success; 1 failure (trials failing, interrupted, nothing fits);
2 bad input (one line on stderr, no traceback, nothing written).

    lms-tuner search --model resnet50                       # defaults for this machine
    lms-tuner search --model resnet50 --backend simulate --budget 16GiB --device V100-16GB
    lms-tuner search --model examples/user_model.py:make_workload --backend emulated --budget 256MiB
    lms-tuner best --study resnet50-emulated
    lms-tuner list
    lms-tuner report --study resnet50-emulated
    lms-tuner validate-config my_lms.json                   # check an LMS config file (or a recommended.json)
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from .backends import BACKENDS, get_backend
from .budget import BudgetError, format_bytes, parse_budget
from .errors import BadInput
from .exits import MaskSecretsFilter, StopSignals
from .knobs import KNOB_TABLE
from .storage import (DEFAULT_STUDIES_DIR, EmptyStorage, StorageError, StorageSpec, StudyNameError, check_reachable,
                      mask_secrets, mask_url, resolve_storage, storage_failure, validate_study_name, writable_folder)

__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_FAILURE", "EXIT_BAD_INPUT"]

log = logging.getLogger("tuner.cli")

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2
PROG = "lms-tuner"

#: Simulated screening trials before the measured ones: the warm starts, the n_tensors ladder (half the screen,
#: `tuner.study.queue_warm_start`) and the sampler's draws. In 18 recorded ResNet-50 searches the config measured
#: was a ladder level every time; 20 keeps the whole ladder and 10 draws (30 took 40 s of a 2-core machine).
DEFAULT_SCREEN_TRIALS = 20


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (and exits 2) instead of usage + error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise BadInput(f"{_shorten(message)} (see {self.prog} --help)")


def _shown(text: str, limit: int = 40) -> str:
    """`text` for a message: whole when short, else its start and its length (never 5,000 digits)."""
    return text if len(text) <= limit else f"{text[:limit - 10]}... ({len(text)} characters)"


def _shorten(message: str) -> str:
    """`message` with every long quoted word cut (argparse quotes the whole argument it refuses)."""
    return re.sub(r"'([^'\s]{100,})'", lambda m: repr(_shown(m.group(1))), message)


# ============================================================== argument types

def _budget(text: str) -> int:
    try:
        return parse_budget(text)
    except BudgetError as exc:
        raise argparse.ArgumentTypeError(_shorten(str(exc))) from None
    except ValueError:  # e.g. more digits than Python converts
        raise argparse.ArgumentTypeError(f"{_shown(text)!r} is not a memory size; use e.g. 16GiB or 512MiB") from None


def _int_at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer >= `minimum` (and <= `maximum` when given)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{_shown(text)!r} is not an integer") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"{_shown(text)} must be >= {minimum}" if maximum is None
                                             else f"{_shown(text)} must be between {minimum} and {maximum}")
        return value

    return parse


_positive_int = _int_at_least(1)
_nonneg_int = _int_at_least(0)
#: The largest --max-batch / --batch: a batch dimension TensorFlow and numpy index with 32 bits.
MAX_BATCH = 2**31 - 1
_batch = _int_at_least(1, MAX_BATCH)


_MAX_SEED = 2**32 - 1  # numpy's RandomState, under Optuna's samplers, takes 0 .. 2**32 - 1


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value <= _MAX_SEED:
        shown = text if len(text) <= 24 else text[:20] + "..."
        raise argparse.ArgumentTypeError(f"{shown} must be between 0 and {_MAX_SEED}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{_shown(text)!r} is not a number of seconds") from None
    if value < 0 or value != value:
        raise argparse.ArgumentTypeError(f"{_shown(text)!r} must be >= 0 seconds")
    return value


def _positive_seconds(text: str) -> float:
    value = _seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{_shown(text)!r} must be > 0 seconds (a trial needs a time limit)")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{value} must be between 0 and 1")
    return value


def _margin(text: str) -> float:
    value = _fraction(text)
    if value > 0.5:
        raise argparse.ArgumentTypeError(f"{value} must be between 0 and 0.5")
    return value


def _gpu_list(text: str) -> tuple[str, ...]:
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    if not items or len(set(items)) != len(items):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct GPU indices or UUIDs separated by commas, e.g. 0,1")
    return items


def _study_name(text: str) -> str:
    try:
        return validate_study_name(text)
    except StudyNameError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# ============================================================== parsers

def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("-q", "--quiet", action="store_true", help="only warnings and the result; no progress bar")
    g.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def _storage_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", type=str, default=None, metavar="URL",
                   help="Optuna storage URL (default: sqlite file studies/<study>/study.db). "
                        "journal:PATH for several processes on one node, postgresql://user@host/db for several "
                        "machines. Passwords are never printed.")
    p.add_argument("--studies-dir", type=Path, default=DEFAULT_STUDIES_DIR, metavar="DIR",
                   help="folder for study outputs (default: %(default)s)")


def _knob_list() -> str:
    """The searched knobs, a conditional one after what it needs (``swap_branches/branch_threshold``)."""
    names: list[str] = []
    for k in KNOB_TABLE.searched:
        if k.requires and names and names[-1] in k.requires:
            names[-1] += f"/{k.name}"
        else:
            names.append(k.name)
    return ", ".join(names)


def _search_description() -> str:
    emulated = get_backend("emulated")
    return (
        f"Search LMS configs ({_knob_list()})\n"
        "for the largest batch and the highest throughput that fit a memory budget. Running it again with\n"
        "the same --study resumes (completed trials are not redone).\n\n"
        "Backends: " + ";\n".join(f"{name} = {get_backend(name).help}" for name in reversed(BACKENDS)) + ".\n\n"
        f"Defaults without a GPU (backend emulated): {DEFAULT_SCREEN_TRIALS} simulated trials, then "
        f"{emulated.default_trials} measured ones (the no-LMS\n"
        "baseline and the screen's pick), each a bracket of fresh processes that run one batch each, then\n"
        f"both repeated side by side (--confirm), within a {emulated.default_timeout_s:.0f} s time limit (the "
        "search exits 1\n"
        "with a WARNING when the limit cuts it short); image_size reduced to "
        f"{emulated.max_image_size} for models that have one; a\n"
        "budget = the simulator's "
        "no-LMS peak at batch 32 with TF's BFC allocator replayed (so the no-LMS baseline\n"
        "fits about that batch and the result shows how far LMS goes beyond it).")


def _add_search(sub: Any) -> None:
    p = sub.add_parser(
        "search", help="run or resume a tuning study", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_search_description())
    p.add_argument("--model", required=True, type=str, metavar="NAME|MODULE:FUNC",
                   help="built-in workload (mlp, cnn_bn, residual, resnet50, unet3d, gpt2_small) or your "
                        "'package.module:function' / 'path/file.py:function' returning a tuner.models.Workload")
    p.add_argument("--model-option", action="append", default=[], metavar="KEY=VALUE", type=str,
                   help="option for the workload factory, e.g. image_size=128 (repeatable)")
    p.add_argument("--budget", type=_budget, default=None, metavar="SIZE",
                   help="device memory budget, e.g. 16GiB or 512MiB (default: the GPU's memory; simulate: the "
                        "device profile's; emulated: see above)")
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="gpu | emulated | simulate (default: gpu when a GPU and CUDA TensorFlow are found, "
                        "else emulated)")
    p.add_argument("--device", type=str, default=None, metavar="PROFILE",
                   help="simulator device profile (V100-16GB, A100-80GB, H100-80GB, cpu, ...; default: the GPU "
                        "found, else V100-16GB for simulate and cpu for emulated)")
    p.add_argument("--trials", type=_positive_int, default=None, metavar="N",
                   help="trials in the study (real runs for gpu/emulated); default: "
                        + ", ".join(f"{k} {get_backend(k).default_trials}" for k in reversed(BACKENDS)))
    p.add_argument("--screen-trials", type=_nonneg_int, default=DEFAULT_SCREEN_TRIALS, metavar="N",
                   help="simulated screening trials before real runs (gpu/emulated; default: %(default)s)")
    p.add_argument("--timeout", type=_seconds, default=None, metavar="SECONDS",
                   help="stop starting trials after this long (0: no limit; default: none, "
                        + ", ".join(f"{get_backend(k).default_timeout_s:.0f} s for {k}" for k in BACKENDS
                                    if get_backend(k).default_timeout_s) + ")")
    p.add_argument("--trial-timeout", type=_positive_seconds, default=600.0, metavar="SECONDS",
                   help="kill one real trial after this long (> 0); it also bounds loading and tracing the model, "
                        "once per study (default: %(default)s)")
    p.add_argument("--study", type=_study_name, default=None, metavar="NAME",
                   help="study name (default: <model>-<backend>)")
    _storage_args(p)
    p.add_argument("--seed", type=_seed, default=None, metavar="N",
                   help=f"sampler seed, 0 .. {_MAX_SEED} (default: random)")
    p.add_argument("--steps", type=_positive_int, default=5, metavar="N",
                   help="timed steps per measurement (default: %(default)s)")
    p.add_argument("--warmup", type=_nonneg_int, default=2, metavar="N",
                   help="warm-up steps excluded from timing (default: %(default)s)")
    p.add_argument("--safety-margin", type=_margin, default=0.05, metavar="FRACTION",
                   help="fraction of the budget kept free (default: %(default)s)")
    p.add_argument("--max-batch", type=_batch, default=4096, metavar="N",
                   help=f"largest batch considered, 1 .. {MAX_BATCH} (default: %(default)s)")
    p.add_argument("--batch", type=_batch, default=None, metavar="N",
                   help="a fixed batch: find the fastest LMS config whose peak fits the budget at batch N "
                        "(default: find the largest batch)")
    p.add_argument("--grow", type=str, default=None, metavar="OPTION",
                   help="with --batch: the largest value of this integer model option (one the workload declares "
                        "growable: image_size for resnet50, input_size for unet3d, seq_len for gpt2_small) whose "
                        "best LMS config fits at batch N, against the largest without LMS; --model-option "
                        "OPTION=V sets the first value tried")
    p.add_argument("--sampler", choices=("tpe", "nsga2", "random"), default="tpe",
                   help="Optuna sampler (default: %(default)s)")
    p.add_argument("--prefer", choices=("batch", "throughput"), default="batch",
                   help="recommend the largest batch (keeping --min-throughput-ratio of the best throughput) "
                        "or the fastest config (default: %(default)s)")
    p.add_argument("--min-throughput-ratio", type=_fraction, default=0.8, metavar="R",
                   help="with --prefer batch: keep at least this fraction of the best throughput "
                        "(default: %(default)s)")
    p.add_argument("--gpu", type=str, default=None, metavar="INDEX|UUID",
                   help="GPU for the workers: an index among the GPUs your CUDA_VISIBLE_DEVICES makes visible, "
                        "numbered as TensorFlow does, or a GPU-/MIG- UUID (nvidia-smi -L); default: the first "
                        "visible one. Workers get its UUID in CUDA_VISIBLE_DEVICES")
    p.add_argument("--gpus", type=_gpu_list, default=None, metavar="LIST",
                   help="several GPUs, e.g. 0,1,2,3: one trial worker on each, in parallel (gpu backend)")
    p.add_argument("--workers", type=_positive_int, default=1, metavar="N",
                   help="trial workers in parallel: gpu backend: one on each of GPUs 0..N-1 (same as --gpus); "
                        "emulated: N on the CPU, whose timings then interfere (default: %(default)s)")
    p.add_argument("--confirm", type=_int_at_least(0, 10), default=2, metavar="N",
                   help="gpu/emulated, largest-batch searches: measure each trial with one batch per fresh "
                        "process (as a training run starts; a batch's peak depends on the batches run before it "
                        "in a process), bracketing its largest batch from the simulator's, then run the "
                        "recommended config and the no-LMS baseline again, in turn, until each batch fitted in "
                        "N processes; recommended.json says whether that finished (\"confirmed\"). 0: a trial "
                        "searches in one process instead, nothing is confirmed (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print recommended.json to stdout instead of a summary")
    p.add_argument("--reports-dir", type=Path, default=Path("reports"), metavar="DIR",
                   help="where the HTML report is written at the end (default: reports/<study>/)")
    p.add_argument("--no-report", action="store_true", help="do not write the HTML report at the end")
    _common(p)
    p.set_defaults(func=cmd_search)


def _add_best(sub: Any) -> None:
    p = sub.add_parser("best", help="print a study's recommendation",
                       description="Print the recommendation of a study (studies/<study>/recommended.json; "
                                   "computed from the storage when the file is missing).")
    p.add_argument("--study", type=_study_name, required=True, metavar="NAME", help="study name")
    _storage_args(p)
    p.add_argument("--json", action="store_true", help="print the JSON document")
    _common(p)
    p.set_defaults(func=cmd_best)


def _add_list(sub: Any) -> None:
    p = sub.add_parser("list", help="list studies",
                       description="List the studies under --studies-dir, or in --storage.")
    _storage_args(p)
    _common(p)
    p.set_defaults(func=cmd_list)


def _add_report(sub: Any) -> None:
    p = sub.add_parser("report", help="build the HTML report of a study",
                       description="Build reports/<study>/index.html (tuner.report.build_report): the "
                                   "batch/throughput trade-off, the Pareto front, the recommendation.")
    p.add_argument("--study", type=_study_name, required=True, metavar="NAME", help="study name")
    _storage_args(p)
    p.add_argument("--reports-dir", type=Path, default=Path("reports"), metavar="DIR",
                   help="the report goes to DIR/<study>/index.html (default: %(default)s)")
    _common(p)
    p.set_defaults(func=cmd_report)


def _add_validate_config(sub: Any) -> None:
    p = sub.add_parser(
        "validate-config", help="check an LMS config file (or a recommended.json) and print it",
        description="Read an LMS config file the way lms.LMSConfig.load does (a {\"schema\": \"lms.config\", ...} "
                    "file, or a tuner recommended.json) and print the config; a file that is not valid JSON, has "
                    "unknown keys, wrong types or impossible values (lb > ub, n_tensors < -1, an unknown "
                    "ctrld_strategy) is reported in one line with exit code 2. Nothing is written.")
    p.add_argument("path", type=Path, metavar="PATH", help="the JSON file to check")
    p.add_argument("--json", action="store_true", help="print the config as JSON")
    _common(p)
    p.set_defaults(func=cmd_validate_config)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Tune Large Model Support (tensor swapping) for a model and a memory "
                                            "budget, with Optuna.")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    _add_search(sub)
    _add_best(sub)
    _add_list(sub)
    _add_report(sub)
    _add_validate_config(sub)
    return parser


# ============================================================== search

def _default_study(model: str, backend: str) -> str:
    base = model.rsplit(":", 1)[-1] if ":" in model else model
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(base).stem if base.endswith(".py") else base).strip("._-")
    return validate_study_name(f"{base or 'model'}-{backend}")


#: Loading a user's model (in a worker) takes at most this long, or --trial-timeout when shorter.
DESCRIBE_TIMEOUT_S = 120.0


def _load_workload_desc(spec: str, options: dict[str, Any], *, timeout_s: float = DESCRIBE_TIMEOUT_S
                        ) -> dict[str, Any]:
    from tuner.models import builtin_names, load_workload

    from .graphs import describe_user_workload

    if spec in builtin_names() or ":" not in spec:
        try:
            return load_workload(spec, **options).describe()  # built-ins import no TensorFlow here
        except ValueError as exc:
            raise BadInput(str(exc)) from None
    return describe_user_workload(spec, options, timeout_s=timeout_s)  # BadInput when it does not load


def check_output_folder(folder: Path, *, what: str) -> None:
    """BadInput unless `folder` is a folder this process can write, or can be made under one (nothing is made)."""
    probe = next((p for p in (folder, *folder.absolute().parents) if p.exists()), None)
    if probe is not None and probe.is_dir() and writable_folder(probe):
        return
    if probe == folder or (probe is not None and not probe.is_dir()):
        raise BadInput(f"{what} {folder}: {probe} is not a folder")
    raise BadInput(f"{what} {folder}: {probe} is not a writable folder")


def build_search_settings(args: argparse.Namespace) -> Any:
    """Validate everything the user gave; write nothing. Raises BadInput."""
    from lms.machine.devices import get_device
    from tuner.models import parse_options

    from .environment import default_backend, gpus
    from .settings import SearchSettings

    notes: list[str] = []
    if args.grow is not None and args.batch is None:
        raise BadInput(f"--grow {args.grow} needs --batch N: the option is grown at a fixed batch")
    if args.batch is not None and args.batch > args.max_batch:
        raise BadInput(f"--batch {args.batch} is larger than --max-batch {args.max_batch}; give a smaller --batch "
                       "or a larger --max-batch")
    name = args.backend
    if name is None:
        name, why = default_backend()
        notes.append(f"backend {name} chosen by default ({why})")
    backend = get_backend(name)  # chosen once: everything below asks it
    try:
        options = parse_options(args.model_option)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    study = args.study or _default_study(args.model, backend.name)
    storage = resolve_storage(args.storage, study, studies_dir=args.studies_dir)
    check_reachable(storage, create=True)
    if not args.no_report:  # the report is written at the end: a folder it cannot go to is bad input now
        check_output_folder(args.reports_dir, what="--reports-dir")
    describe_timeout = min(DESCRIBE_TIMEOUT_S, args.trial_timeout)
    desc = _load_workload_desc(args.model, options, timeout_s=describe_timeout)
    if args.grow is not None:
        growable = desc.get("growable") or {}
        if args.grow not in growable:
            raise BadInput(f"--grow {args.grow}: model {args.model} does not declare {args.grow!r} growable; "
                           + (f"growable: {', '.join(sorted(growable))}" if growable else "it declares no option "
                              "growable (a Workload's growable={option: step})"))
    small = backend.max_image_size
    if small is not None and "image_size" not in options:
        size = (desc.get("options") or {}).get("image_size")
        if isinstance(size, int) and size > small:
            options["image_size"] = small
            desc = _load_workload_desc(args.model, options, timeout_s=describe_timeout)
            notes.append(f"{backend.name} backend on CPU: image_size {size} -> {small} so the real runs take "
                         f"minutes (give --model-option image_size={size} to keep it)")
    chosen = backend.choose_gpus(gpu=args.gpu, gpus=args.gpus or (), workers=args.workers, inventory=gpus)
    notes.extend(chosen.notes)
    try:
        device = get_device(args.device).name if args.device else backend.default_device(chosen.info)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    budget = args.budget
    budget_source = "--budget"
    if budget is None:
        budget, budget_source = backend.default_budget(device=device, gpu_info=chosen.info)
    timeout = args.timeout
    if timeout is None:
        timeout = backend.default_timeout_s
    if timeout == 0:
        timeout = None
    settings = SearchSettings(
        study=study, model=args.model, model_options=options, backend=backend, budget_bytes=budget,
        budget_source=budget_source, device=device, trials=args.trials or backend.default_trials,
        screen_trials=args.screen_trials, storage=storage, studies_dir=args.studies_dir, timeout_s=timeout,
        trial_timeout_s=args.trial_timeout, seed=args.seed, steps=args.steps, warmup=args.warmup,
        safety_margin=args.safety_margin, max_batch=args.max_batch, sampler=args.sampler, prefer=args.prefer,
        min_throughput_ratio=args.min_throughput_ratio, gpu=args.gpu, gpus=chosen.gpus, workers=chosen.workers,
        batch=args.batch, grow=args.grow, confirm=args.confirm, workload=desc, notes=tuple(notes))
    problem = _claim_problem(settings)
    if problem:
        raise BadInput(problem)
    return settings


def _claim_problem(settings: Any) -> str:
    """Why the search may not use its study (`tuner.study.claim_problem`), checked early; creates nothing.

    `tuner.search.run_search` checks again under the storage's lock, where it writes the settings record.
    """
    if not settings.storage.exists():
        return ""
    from .settings import study_settings_conflict
    from .storage import open_storage
    from .study import claim_problem

    try:  # read-only: a storage that is bad input leaves nothing behind (not even a lock file)
        opened = open_storage(settings.storage, read_only=True)
    except StorageError:  # a new database (a server's, or a file another search is creating now): set it up
        if settings.storage.kind == "journal" or (
                settings.storage.kind == "sqlite"
                and _sqlite_header(settings.storage.path) not in (b"", b"SQLite format 3\0")):
            raise
        opened = open_storage(settings.storage, lock=True)
    return claim_problem(opened, settings.study, screened=settings.backend.measured,
                         conflict=lambda stored: study_settings_conflict(stored, settings),
                         display=settings.storage.display)


def _sqlite_header(path: Path | None) -> bytes:
    try:
        with open(path, "rb") as fh:  # type: ignore[arg-type]
            return fh.read(16)
    except (OSError, TypeError):
        return b"?"


def cmd_search(args: argparse.Namespace) -> int:
    from .outputs import format_recommendation
    from .progress import Progress
    from .errors import SearchError
    from .search import run_search

    settings = build_search_settings(args)  # BadInput: one line, exit 2, nothing logged before it
    if settings.grow is not None:
        return _grow(args, settings)
    try:
        outcome = run_search(settings, progress=Progress(disabled=True if args.quiet else None))
    except SearchError as exc:
        _err(f"search failed: {exc}")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        _err(f"interrupted: completed trials are kept in {settings.storage.display}; run the same command "
             "again to resume")
        return EXIT_FAILURE
    except Exception as exc:
        cause = storage_failure(exc)
        if not cause:
            raise
        _err(mask_secrets(f"storage {settings.storage.display} failed during the search ({cause}); the trials "
                          "recorded before it are kept there: run the same command again once it works",
                          settings.storage.url))
        return EXIT_FAILURE
    failure = _search_failure(settings, outcome)
    if failure:
        _report_after_search(args, settings.study, settings.studies_dir)
        _err(failure)
        return EXIT_FAILURE
    if args.json:
        print(json.dumps(outcome.recommendation, indent=2, default=str))
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
    """The search's own command line with ``--timeout 0`` (it resumes from the stored trials and processes)."""
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
            out.append(a)
    prog = "python -m tuner" if sys.argv and sys.argv[0].endswith("__main__.py") else PROG
    return f"{prog} {shlex.join(out + ['--timeout', '0'])}"


def _more_trials(outcome: Any, settings: Any) -> str:
    """A command-line change that makes a rerun evaluate more configs (evaluated ones count toward --trials)."""
    return f"--trials {outcome.completed + settings.trials}"


def _search_failure(settings: Any, outcome: Any) -> str:
    """Why the search has no usable result (exit 1), or "" when it has one."""
    rec = outcome.recommendation
    if rec is not None and (rec.get("measured") or not settings.measured):
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
    from .errors import SearchError
    from .grow import format_grow, run_grow
    from .progress import Progress

    try:
        outcome = run_grow(settings, progress=Progress(disabled=True if args.quiet else None))
    except SearchError as exc:
        _err(f"search failed: {exc}")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        _err("interrupted: the values evaluated so far are kept; run the same command again to resume")
        return EXIT_FAILURE
    if outcome.recommendation is None:
        _err(format_grow(outcome.doc))
        return EXIT_FAILURE
    if args.json:
        print(json.dumps(outcome.recommendation, indent=2, default=str))
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


# ============================================================== best / list / report

def _open_existing(args: argparse.Namespace) -> tuple[StorageSpec, Any, Any]:
    """(spec, storage, study) of an existing study, or BadInput; creates and changes nothing (read-only)."""
    import optuna

    from .storage import open_storage, study_names

    spec = resolve_storage(args.storage, args.study, studies_dir=args.studies_dir)
    check_reachable(spec, create=False)
    if not spec.exists():
        raise BadInput(f"study {args.study!r} does not exist (no {spec.path}); see '{PROG} list'")
    try:
        storage = open_storage(spec, read_only=True)
    except EmptyStorage:
        raise BadInput(f"study {args.study!r} does not exist in {spec.display} (it holds no studies); see "
                       f"'{PROG} list'") from None
    if args.study not in study_names(storage):
        raise BadInput(f"study {args.study!r} does not exist in {spec.display}; see '{PROG} list'")
    return spec, storage, optuna.load_study(study_name=args.study, storage=storage)


def cmd_best(args: argparse.Namespace) -> int:
    from .outputs import format_recommendation, read_recommendation

    path = args.studies_dir / args.study / "recommended.json"
    if path.is_file():
        try:
            doc = read_recommendation(path)
            text = json.dumps(doc, indent=2, allow_nan=False) if args.json else format_recommendation(doc)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError, OSError) as exc:
            reason = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            _err(f"cannot read {path}: {reason.removeprefix(f'{path}: ')}; run the search again to rewrite it")
            return EXIT_FAILURE
    else:
        doc = _recommendation_from_storage(args)
        if doc is None:
            _err(f"study {args.study!r} has no feasible config yet")
            return EXIT_FAILURE
        text = json.dumps(doc, indent=2, default=str) if args.json else format_recommendation(doc)
    print(text)
    return EXIT_OK


def _recommendation_from_storage(args: argparse.Namespace) -> dict[str, Any] | None:
    """What the search would write as recommended.json, from the storage: its stored settings pick the same."""
    from .backends import backend_named
    from .confirm import CONFIRMATIONS_ATTR
    from .outputs import build_recommendation, select_recommendation
    from .settings import SearchSettings
    from .study import tuner_record

    spec, _, study = _open_existing(args)
    stored = tuner_record(study.user_attrs) or {}
    selection = stored.get("selection") if isinstance(stored.get("selection"), dict) else {}
    try:
        settings = SearchSettings(
            study=args.study, model=str(stored.get("model", "?")),
            model_options=dict(stored.get("model_options") or {}),
            backend=backend_named(stored.get("backend")) or get_backend("simulate"),
            budget_bytes=stored.get("budget_bytes"), budget_source="stored", device=str(stored.get("device", "")),
            trials=0, screen_trials=0, storage=spec, studies_dir=args.studies_dir,
            workload=dict(stored.get("workload") or {}), safety_margin=float(stored.get("safety_margin", 0.05)),
            max_batch=int(stored.get("max_batch") or 4096), batch=stored.get("batch"),
            prefer=str(selection.get("prefer", "batch")),
            min_throughput_ratio=float(selection.get("min_throughput_ratio", 0.8)))
    except (TypeError, ValueError) as exc:
        raise BadInput(f"study {args.study!r} has unreadable tuner settings ({exc})") from None
    trials = study.get_trials(deepcopy=False)
    chosen, front = select_recommendation(trials, prefer=settings.prefer,
                                          min_throughput_ratio=settings.min_throughput_ratio,
                                          confirmations=study.user_attrs.get(CONFIRMATIONS_ATTR))
    if chosen is None:
        return None
    budget = int(stored.get("budget_bytes") or 0)
    from .batch import usable_bytes

    return build_recommendation(study=args.study, chosen=chosen, front=front, trials=trials, settings=settings,
                                budget_bytes=budget, budget_source=str(stored.get("budget_source", "")),
                                usable_bytes=usable_bytes(budget, settings.safety_margin), environment={},
                                notes=["computed from the study storage (recommended.json not written yet)"],
                                confirmations=study.user_attrs.get(CONFIRMATIONS_ATTR))


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
        _err(f"warning: cannot read {path}; it is listed as UNREADABLE")
    return EXIT_OK


def _study_rows(args: argparse.Namespace, spec: StorageSpec) -> list[tuple[str, ...]]:
    """`list`'s rows for the studies in one storage."""
    import optuna

    from .records import counted
    from .storage import open_storage

    from .outputs import read_recommendation
    from .study import tuner_record

    rows = []
    storage = open_storage(spec, read_only=True)
    for summary in optuna.study.get_all_study_summaries(storage=storage, include_best_trial=False):
        attrs = tuner_record(summary.user_attrs) or {}
        rec = args.studies_dir / summary.study_name / "recommended.json"
        best = ""
        if rec.is_file():
            try:
                doc = read_recommendation(rec)
                best = (f"batch {doc['batch_size']}, {doc['throughput']:.1f}/s "
                        f"({'measured' if doc.get('measured') else 'predicted'})")
            except (ValueError, OSError):  # checked by the reader: a broken file is named, not the study
                best = "(unreadable recommended.json)"
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        evaluated = sum(1 for t in study.get_trials(deepcopy=False) if counted(t))
        budget = attrs.get("budget_bytes")
        rows.append((summary.study_name, str(evaluated), str(attrs.get("model", "?")),
                     str(attrs.get("backend", "?")), format_bytes(budget if isinstance(budget, int) else None),
                     str(summary.user_attrs.get("role") or attrs.get("role") or ""), best))
    return rows


def cmd_report(args: argparse.Namespace) -> int:
    _open_existing(args)  # the study must exist (exit 2 otherwise)
    check_output_folder(args.reports_dir, what="--reports-dir")
    from .report import build_report

    path = build_report(args.study, storage=args.storage, studies_dir=args.studies_dir,
                        reports_dir=args.reports_dir)
    print(f"report: {path}")
    return EXIT_OK


def _report_after_search(args: argparse.Namespace, study: str, studies_dir: Path) -> None:
    """Write reports/<study>/index.html at the end of `search`; a failure only warns."""
    if args.no_report:
        return
    try:
        from .report import build_report

        path = build_report(study, storage=args.storage, studies_dir=studies_dir, reports_dir=args.reports_dir)
    except Exception as exc:  # the search's own outputs are written; the report is a bonus
        log.warning("report not written (%s: %s); run 'lms-tuner report --study %s'",
                    type(exc).__name__, exc, study)
        return
    print(f"report: {path}")


def cmd_validate_config(args: argparse.Namespace) -> int:
    from lms.config import LMSConfig

    path: Path = args.path
    try:
        is_file = path.stat().st_mode  # follows links: a loop or a dangling link says so here
    except OSError as exc:
        if exc.errno == errno.ENOENT and not path.is_symlink():
            raise BadInput(f"config file {path} does not exist") from None
        what = ("is a symbolic link to a missing file" if exc.errno == errno.ENOENT
                else "is a symbolic link loop" if exc.errno == errno.ELOOP else f"cannot be read ({exc.strerror})")
        raise BadInput(f"config file {path} {what}") from None
    if not stat.S_ISREG(is_file):
        raise BadInput(f"{path} is not a file")
    try:
        config = LMSConfig.load(path)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadInput(f"invalid LMS config: {exc}") from None
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}") from None
    if args.json:
        print(json.dumps(config.to_dict(), indent=2))
    else:
        print(f"{path}: valid LMS config: " + ", ".join(f"{k}={v!r}" for k, v in config.to_dict().items()))
    return EXIT_OK


# ============================================================== main

def _err(message: str) -> None:
    try:
        print(f"{PROG}: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # the terminal is gone (SIGHUP) or stderr closed: nobody to tell
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (also used as the console script).

    Every exit path is one line on stderr with its code: 0 done, 1 failure (interrupted by
    SIGINT/SIGTERM/SIGHUP included), 2 bad input.
    """
    final = argv is None
    argv = _join_negative_values(list(sys.argv[1:] if argv is None else argv))
    storage_url = _find_storage(argv)
    code = None
    with StopSignals(final=final) as signals:
        code = _run(argv, storage_url)
    if code is None or (signals.received and code == EXIT_OK):
        # an interrupt outside the command's own handling, or one swallowed on the way (a finalizer, a thread)
        _err(f"interrupted ({signals.received or 'SIGINT'})")
        code = EXIT_FAILURE
    return code


def _run(argv: list[str], storage_url: str | None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        args.argv = list(argv)  # the command as typed (a search cut short names the command that finishes it)
        from .progress import setup_logging

        setup_logging(quiet=args.quiet, verbose=args.verbose)
        if storage_url:
            for handler in logging.getLogger().handlers:
                handler.addFilter(MaskSecretsFilter(storage_url))
        func: Callable[[argparse.Namespace], int] = args.func
        return func(args)
    except (BadInput, StorageError, StudyNameError, BudgetError) as exc:
        _err(mask_secrets(_shorten(" ".join(str(exc).split())), storage_url))
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:
        _err(f"interrupted ({exc.args[0]})" if exc.args and isinstance(exc.args[0], str) else "interrupted")
        return EXIT_FAILURE
    except BrokenPipeError:  # e.g. `lms-tuner best ... | head`: the reader left; not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except SystemExit as exc:  # --help / --version
        return int(exc.code or 0) if isinstance(exc.code, int) else EXIT_OK
    except Exception as exc:  # a bug or an environment problem: one line, exit 1 (traceback with -v)
        if "-v" in argv or "--verbose" in argv:
            raise
        cause = storage_failure(exc)
        if cause:
            shown = mask_url(storage_url) if storage_url else "the study's database"
            _err(mask_secrets(f"storage {shown} failed ({cause})", storage_url))
            return EXIT_FAILURE
        if isinstance(exc, RecursionError):
            _err("error: an input nested too deeply (RecursionError)")
            return EXIT_FAILURE
        _err(mask_secrets(f"error: {type(exc).__name__}: {_shorten(' '.join(str(exc).split()))} "
                          "(run with -v for details)", storage_url))
        return EXIT_FAILURE


def _join_negative_values(argv: list[str]) -> list[str]:
    """``--budget -1GiB`` -> ``--budget=-1GiB``, so argparse reports the bad size, not a missing value."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in ("--budget", "--timeout", "--trial-timeout", "--seed") and i + 1 < len(argv) \
                and argv[i + 1].startswith("-") and argv[i + 1][1:2].isdigit():
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def _find_storage(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a == "--storage" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--storage="):
            return a.split("=", 1)[1]
    return None


if __name__ == "__main__":
    sys.exit(main())
