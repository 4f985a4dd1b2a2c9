"""The LMS tuning service: an Optuna study over the TFLMS knobs for a model and a memory budget.

    python -m tuner search --model resnet50        # or: lms-tuner search ...

The parent process (this package, `tuner.cli`, `tuner.search`) imports no
TensorFlow: tracing and measuring run in worker subprocesses (`tuner.trial`, started by
`tuner.worker.run`; on the CPU forked from a process that imported TensorFlow once, `tuner.worker.zygote`),
simulation in-process (`lms.simulator`).

Where it lives, top down (each imports only what is below it; each package's docstring is its map)::

    cli/               the command line: parse, run a subcommand, one line and an exit code for every way out
    report/            the HTML report of a study
    grow.py            ``search --batch N --grow OPTION``: the largest input that fits
    search.py          the search's top level: set the study up, hand it to its backend, write the outputs
    graphs.py          the model as the simulator sees it: traced once per study by a worker, cached
    outputs.py         what a search leaves behind: ``recommended.json`` and ``trials.csv``
    zygote_server.py   the zygote's program: import TensorFlow once, fork a worker per request
    trial.py           the worker's program, ``python -m tuner.trial``: TensorFlow runs here
    backends/          how a config's figures are obtained (simulate, emulated, gpu), fresh-process confirmation
    study/             the Optuna study: settings, storage, the ask/tell loop, stale trials, progress
    policy/            the search's rules: knobs, space, goal, largest batch, bracket, records, Pareto, selection
    worker/            trial workers, the parent's side: start, follow, stop; their protocol; the zygote; GPUs
    models/            the workloads: the built-in zoo and the user-model contract
    host.py            the host budget: host memory the swapped tensors may hold (``--host-budget``)
    environment.py     what machine a search ran on, found without importing TensorFlow
    budget.py          memory budgets: parse ``"16GiB"``, print bytes for people
    errors.py          the tuner's two kinds of failure (the CLI maps them to exit codes)
"""

from __future__ import annotations

from lms.config import register_document_schema

__version__ = "0.1.0"

__all__ = ["__version__", "RECOMMENDATION_SCHEMA", "RECOMMENDATION_VERSION"]

#: ``recommended.json`` (`tuner.outputs`) embeds an `LMSConfig` under "config": registered here, so
#: ``lms.LMSConfig.load`` reads it (lms imports this package when it meets the schema).
RECOMMENDATION_SCHEMA = "tuner.recommendation"
RECOMMENDATION_VERSION = 1
register_document_schema(RECOMMENDATION_SCHEMA, RECOMMENDATION_VERSION)
