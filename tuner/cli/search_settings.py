"""``search``'s input: the command line validated into `tuner.study.settings.SearchSettings`, nothing written."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from ..backends import get_backend
from ..errors import BadInput
from ..study.storage import StorageError, check_reachable, resolve_storage, validate_study_name
from .common import check_output_folder

__all__ = ["build_search_settings", "DESCRIBE_TIMEOUT_S"]


HOST_NONE = "none"  # --host-budget none: no host bound (not given: `tuner.host.default_host_budget`)


def _default_study(model: str, backend: str) -> str:
    base = model.rsplit(":", 1)[-1] if ":" in model else model
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(base).stem if base.endswith(".py") else base).strip("._-")
    return validate_study_name(f"{base or 'model'}-{backend}")


#: Loading a user's model (in a worker) takes at most this long, or --trial-timeout when shorter.
DESCRIBE_TIMEOUT_S = 120.0


def _load_workload_desc(spec: str, options: dict[str, Any], *, timeout_s: float = DESCRIBE_TIMEOUT_S
                        ) -> dict[str, Any]:
    from tuner.models import builtin_names, load_workload

    from ..graphs import describe_user_workload

    if spec in builtin_names() or ":" not in spec:
        try:
            return load_workload(spec, **options).describe()  # built-ins import no TensorFlow here
        except ValueError as exc:
            raise BadInput(str(exc)) from None
    return describe_user_workload(spec, options, timeout_s=timeout_s)  # BadInput when it does not load


def build_search_settings(args: argparse.Namespace) -> Any:
    """Validate everything the user gave; write nothing. Raises BadInput."""
    from lms.machine.devices import get_device
    from tuner.models import parse_options

    from ..environment import default_backend, gpus
    from ..study.settings import SearchSettings

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
    if args.budget_from_batch is not None:  # measured (or simulated) after tracing: `tuner.graphs.derive_budget`
        budget_source = f"--budget-from-batch {args.budget_from_batch}"
    elif budget is None:
        budget, budget_source = backend.default_budget(device=device, gpu_info=chosen.info)
    from ..host import default_host_budget, targets_gpu

    host_budget, host_source = args.host_budget, "--host-budget"
    if host_budget is None:
        gpu = targets_gpu(backend, device)
        host_budget, host_source = default_host_budget(gpu=gpu, elsewhere=gpu and backend.name == "simulate")
    elif host_budget == HOST_NONE:
        host_budget, host_source = None, "--host-budget none: no host bound"
    timeout = args.timeout
    if timeout is None:
        timeout = backend.default_timeout_s
    if timeout == 0:
        timeout = None
    settings = SearchSettings(
        study=study, model=args.model, model_options=options, backend=backend.name, budget_bytes=budget,
        budget_source=budget_source, device=device, trials=args.trials or backend.default_trials,
        screen_trials=args.screen_trials, storage=storage, studies_dir=args.studies_dir, timeout_s=timeout,
        trial_timeout_s=args.trial_timeout, seed=args.seed, steps=args.steps, warmup=args.warmup,
        safety_margin=args.safety_margin, max_batch=args.max_batch, sampler=args.sampler, prefer=args.prefer,
        min_throughput_ratio=args.min_throughput_ratio, gpu=args.gpu, gpus=chosen.gpus, workers=chosen.workers,
        batch=args.batch, grow=args.grow, confirm=default_confirm(args.confirm, desc), workload=desc,
        notes=tuple(notes),
        host_budget_bytes=host_budget, host_budget_source=host_source, budget_from_batch=args.budget_from_batch)
    problem = _claim_problem(settings)
    if problem:
        raise BadInput(problem)
    return settings


def _claim_problem(settings: Any) -> str:
    """Why the search may not use its study (`tuner.study.study.claim_problem`), checked early; creates nothing.

    `tuner.search.run_search` checks again under the storage's lock, where it writes the settings record.
    """
    if not settings.storage.exists():
        return ""
    from ..study.settings import study_settings_conflict
    from ..study.storage import open_storage
    from ..study.study import claim_problem

    try:  # read-only: a storage that is bad input leaves nothing behind (not even a lock file)
        opened = open_storage(settings.storage, read_only=True)
    except StorageError:  # a new database (a server's, or a file another search is creating now): set it up
        if settings.storage.kind == "journal" or (
                settings.storage.kind == "sqlite"
                and _sqlite_header(settings.storage.path) not in (b"", b"SQLite format 3\0")):
            raise
        opened = open_storage(settings.storage, lock=True)
    return claim_problem(opened, settings.study, screened=get_backend(settings.backend).measured,
                         conflict=lambda stored: study_settings_conflict(stored, settings),
                         display=settings.storage.display)


def _sqlite_header(path: Path | None) -> bytes:
    try:
        with open(path, "rb") as fh:  # type: ignore[arg-type]
            return fh.read(16)
    except (OSError, TypeError):
        return b"?"


#: ``--confirm``'s default: the tuner's own step runs under the single-threaded executor; a program's own ``fit``
#: or step under TF's default one, whose peaks jump between processes (keras.io's DCGAN under fit at batch 8:
#: 37.9-43.9 MiB in 5 fresh processes, MEASURED 2026-12-05), so its batch must fit in more of them.
CONFIRM = 2
PROGRAM_CONFIRM = 5


def default_confirm(given: int | None, workload: dict) -> int:
    """``--confirm``'s value: as given, else `PROGRAM_CONFIRM` for a program workload (`tuner.worker.programs`), else
    `CONFIRM`."""
    if given is not None:
        return given
    return PROGRAM_CONFIRM if workload.get("form", "step") != "step" else CONFIRM
