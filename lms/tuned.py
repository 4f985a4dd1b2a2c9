"""What a tuner recommendation was measured under, and whether that is the program it is used in. No TensorFlow.

`LMSConfig.load` attaches a ``recommended.json``'s ``tuned_for``, budget and
``measured_under`` to the config it returns (`LMSConfig.tuned`); `lms.function`
and `lms.enable_lms` warn when the program differs (`tuned_elsewhere`), and
``fit`` checks its peak against the budget (`lms.tf.fit_peaks`).
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["describe_conditions", "tuned_elsewhere"]


def describe_conditions(under: Mapping[str, Any]) -> str:
    """A recommendation's ``measured_under`` in words: "model.fit, fixed batch, TF's default executor"."""
    parts = [str(under.get("program", "?"))]
    if under.get("batch_dim"):
        parts.append(f"{under['batch_dim']} batch dimension")
    if under.get("executor"):
        parts.append(f"TF's {str(under['executor']).replace('_', '-')} executor")
    if under.get("pinned"):
        parts.append(f"order pinned {under['pinned']}")
    return ", ".join(parts)


def tuned_elsewhere(config: Any, program: str) -> str:
    """Why a loaded recommendation's figures may not hold in `program` (``"model.fit"`` or ``"lms.function"``),
    or '' when it was measured in that program (or is not a recommendation)."""
    tuned = getattr(config, "tuned", None)
    under = (tuned or {}).get("measured_under") or {}
    measured_in = under.get("program")
    if not measured_in or measured_in == program:
        return ""
    return (f"this config was tuned for batch {tuned.get('batch_size', '?')} measured under "
            f"{describe_conditions(under)}, not {program}: its peak here can be higher (the trace, the executor "
            f"and the order differ); tune this program itself (Workload(fit_model=...) for model.fit, "
            f"Workload(train_step=...) for a step; docs/tuner.md)")
