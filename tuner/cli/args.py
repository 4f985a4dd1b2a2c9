"""The command line's arguments: one parser per subcommand, the argument types, ``build_parser``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Callable

from ..backends import BACKENDS, get_backend
from ..budget import BudgetError, parse_budget
from ..errors import BadInput
from ..policy.knobs import KNOB_TABLE
from ..study.storage import DEFAULT_STUDIES_DIR, StudyNameError, validate_study_name
from .best import cmd_best
from .common import PROG, shorten, shown
from .list import cmd_list
from .report import cmd_report
from .search import cmd_search
from .search_settings import HOST_NONE
from .validate_config import cmd_validate_config

__all__ = ["build_parser", "DEFAULT_SCREEN_TRIALS", "MAX_BATCH"]


#: Simulated screening trials before the measured ones: the warm starts, the n_tensors ladder (half the screen,
#: `tuner.study.study.queue_warm_start`) and the sampler's draws. In 18 recorded ResNet-50 searches the config measured
#: was a ladder level every time; 20 keeps the whole ladder and 10 draws (30 took 40 s of a 2-core machine).
DEFAULT_SCREEN_TRIALS = 20


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (and exits 2) instead of usage + error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise BadInput(f"{shorten(message)} (see {self.prog} --help)")


def _budget(text: str) -> int:
    try:
        return parse_budget(text)
    except BudgetError as exc:
        raise argparse.ArgumentTypeError(shorten(str(exc))) from None
    except ValueError:  # e.g. more digits than Python converts
        raise argparse.ArgumentTypeError(f"{shown(text)!r} is not a memory size; use e.g. 16GiB or 512MiB") from None


def _host_budget(text: str) -> int | str:
    from ..host import parse_host_budget

    try:
        value = parse_host_budget(text)
        return HOST_NONE if value is None else value
    except BudgetError as exc:
        raise argparse.ArgumentTypeError(shorten(str(exc))) from None
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(text)!r} is not a memory size; use e.g. 8GiB or none") from None


def _int_at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer >= `minimum` (and <= `maximum` when given)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{shown(text)!r} is not an integer") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"{shown(text)} must be >= {minimum}" if maximum is None
                                             else f"{shown(text)} must be between {minimum} and {maximum}")
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
        raise argparse.ArgumentTypeError(f"{shown(text)!r} is not a number of seconds") from None
    if value < 0 or value != value:
        raise argparse.ArgumentTypeError(f"{shown(text)!r} must be >= 0 seconds")
    if value == float("inf"):  # "inf", or 1e400 overflowing: it would reach the JSON a worker reads
        raise argparse.ArgumentTypeError(f"{shown(text)!r} is not a finite number of seconds")
    return value


def _positive_seconds(text: str) -> float:
    value = _seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{shown(text)!r} must be > 0 seconds (a trial needs a time limit)")
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


def _folder(text: str) -> Path:
    """An argparse type: a folder path that is not empty (an unset shell variable would mean the current
    folder) and that this system can open (no longer than PATH_MAX, no name longer than NAME_MAX)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is empty (an unset variable?); give a folder, e.g. studies")
    reason = _path_too_long(text, room=_ROOM_UNDER_FOLDER)
    if reason:
        raise argparse.ArgumentTypeError(reason)
    return Path(text)


#: Bytes the tuner's own paths add under --studies-dir / --reports-dir: ``/<study, <= 100>/trials/0001/events.jsonl``.
_ROOM_UNDER_FOLDER = 160


def _path_too_long(text: str, *, room: int = 0) -> str:
    """Why `text`, as an absolute path with `room` bytes more under it, is too long for this system ("" when
    it is not)."""
    def limit(name: str, default: int) -> int:
        try:
            return int(os.pathconf("/", name))
        except (OSError, ValueError):
            return default

    full = os.fsencode(os.path.abspath(text))
    path_max, name_max = limit("PC_PATH_MAX", 4096), limit("PC_NAME_MAX", 255)
    if len(full) + room >= path_max:
        return (f"{shown(text)!r} is {len(full)} bytes long as a full path; this system allows {path_max - 1}"
                + (f", less {room} for the files under it" if room else ""))
    name = next((part for part in full.split(b"/") if len(part) > name_max), None)
    if name is not None:
        return f"{shown(text)!r} holds a name of {len(name)} bytes; this system allows {name_max} per name"
    return ""


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


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("-q", "--quiet", action="store_true", help="only warnings and the result; no progress bar")
    g.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def _storage_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", type=str, default=None, metavar="URL",
                   help="Optuna storage URL (default: sqlite file studies/<study>/study.db). "
                        "journal:PATH for several processes on one node, postgresql://user@host/db for several "
                        "machines. Passwords are never printed.")
    p.add_argument("--studies-dir", type=_folder, default=DEFAULT_STUDIES_DIR, metavar="DIR",
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
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--budget", type=_budget, default=None, metavar="SIZE",
                        help="device memory budget, e.g. 16GiB or 512MiB (default: the GPU's memory; simulate: the "
                             "device profile's; emulated: see above)")
    budget.add_argument("--budget-from-batch", type=_batch, default=None, metavar="N",
                        help="the budget is the no-LMS step's peak at batch N: measured in one fresh process "
                             "(gpu, emulated) or the simulator's (simulate), so the no-LMS baseline fits about N "
                             "(just under it after --safety-margin); not with --budget")
    p.add_argument("--host-budget", type=_host_budget, default=None, metavar="SIZE",
                   help="host memory the swapped tensors may hold, e.g. 8GiB, or none (default: 75%% of this "
                        "machine's RAM; on a GPU also at most TF's pinned host limit, 128 GiB; a prediction for "
                        "a GPU profile (simulate): that GPU machine's pinned limit, not this machine's RAM)")
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
    p.add_argument("--confirm", type=_int_at_least(0, 10), default=None, metavar="N",
                   help="gpu/emulated, largest-batch searches: measure each trial with one batch per fresh "
                        "process (as a training run starts; a batch's peak depends on the batches run before it "
                        "in a process), bracketing its largest batch from the simulator's (the no-LMS baseline on the "
                        "emulated device: from its measured peaks), then run the "
                        "recommended config and the no-LMS baseline again, in turn, until each batch fitted in "
                        "N processes; recommended.json says whether that finished (\"confirmed\"). 0: a trial "
                        "searches in one process instead, nothing is confirmed (default: 2; 5 for a model's "
                        "own fit or train_step, whose peaks differ from process to process under TF's default "
                        "executor)")
    p.add_argument("--json", action="store_true", help="print recommended.json to stdout instead of a summary")
    p.add_argument("--reports-dir", type=_folder, default=Path("reports"), metavar="DIR",
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
    p.add_argument("--reports-dir", type=_folder, default=Path("reports"), metavar="DIR",
                   help="the report goes to DIR/<study>/index.html (default: %(default)s)")
    p.add_argument("--peers", type=Path, default=None, metavar="JSON",
                   help="draw the peers (remat, per-stage recompute, Grappler) measured on this study's workload "
                        "and budget by benchmarks/peers.py (e.g. benchmarks/results/peers.json) on the Pareto "
                        "plots; a file measured for another workload, options or budget is refused")
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
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    _add_search(sub)
    _add_best(sub)
    _add_list(sub)
    _add_report(sub)
    _add_validate_config(sub)
    return parser
