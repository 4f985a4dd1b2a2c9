"""The LMS tuning service: an Optuna study over the TFLMS knobs for a model and a memory budget.

    python -m tuner search --model resnet50        # or: lms-tuner search ...

The parent process (this package, `tuner.cli`, `tuner.search`) imports no
TensorFlow: tracing and measuring run in worker subprocesses (`tuner.trial`),
simulation in-process (`lms.simulator`).
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
