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

Where it lives::

    run.py              main: parse, run a subcommand, one line and an exit code for every way out
    args.py             the arguments of every subcommand, their types, build_parser
    common.py           exit codes, the program name, one-line errors, opening an existing study
    search.py           search (and --grow); search_settings.py: its input validated into SearchSettings
    best.py  list.py  report.py  validate_config.py    one subcommand each
    exits.py            how a command ends: signals that stop it like Ctrl-C, log records that never show a secret
"""

from __future__ import annotations

from .run import main

__all__ = ["main"]
