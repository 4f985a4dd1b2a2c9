"""The LMS tuning service: an Optuna study over the TFLMS knobs for a model and a memory budget.

    python -m tuner search --model resnet50        # or: lms-tuner search ...

The parent process (this package, `tuner.cli`, `tuner.search`) imports no
TensorFlow: tracing and measuring run in worker subprocesses (`tuner.trial`, started by
`tuner.worker.run`; on the CPU forked from a process that imported TensorFlow once, `tuner.worker.zygote`),
simulation in-process (`lms.simulator`).
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
