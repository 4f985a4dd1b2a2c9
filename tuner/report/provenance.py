"""Where the report's figures come from: the recommendation document, the environment, the method.

Plain data and plain words (no matplotlib): `Recommendation` parses
``recommended.json``; `environment_rows` gathers the header from the study's
attributes and the recommendation; `measurement_note` says, in one paragraph,
how memory and throughput were measured or predicted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import pandas as pd

from ..backends import backend_named

__all__ = ["Recommendation", "environment_rows", "measurement_note"]


# ---- the recommendation -------------------------------------------------------------------------

@dataclass(frozen=True)
class Recommendation:
    """What ``recommended.json`` says (schema ``tuner.recommendation``).

    Attributes:
        config: the `LMSConfig` dict.
        batch_size: the batch size it reaches under the budget.
        throughput: samples/s at that batch (None if not known).
        peak_device_bytes: peak device memory at that batch.
        budget_bytes: the memory budget the study ran against.
        backend: ``"gpu"``, ``"emulated"`` or ``"simulate"``.
        measured: True if throughput and peak were measured (else predicted).
        trial_number: the trial it came from, when the document says.
        environment: the document's ``environment`` member.
        source: where the figures come from, in words (``sources.batch_size``).
        usable_bytes: the budget minus the safety margin, when recorded.
        selection: the rule that picked this point of the front.
        notes: the tuner's notes (adjusted inputs, predicted-only fallbacks, ...).
        document: the whole document (other members are read from it).
    """

    config: Mapping[str, Any]
    batch_size: int
    throughput: float | None = None
    peak_device_bytes: int | None = None
    budget_bytes: int | None = None
    backend: str = ""
    measured: bool = False
    trial_number: int | None = None
    environment: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    usable_bytes: int | None = None
    selection: str = ""
    notes: tuple[str, ...] = ()
    document: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> "Recommendation":
        """Parse a ``tuner.recommendation`` document; ValueError naming what is wrong."""
        if not isinstance(doc, Mapping) or doc.get("schema") != "tuner.recommendation":
            raise ValueError("not a tuner.recommendation document (key 'schema')")
        if not isinstance(doc.get("config"), Mapping):
            raise ValueError("recommendation has no 'config' object")
        batch = doc.get("batch_size")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"recommendation key 'batch_size'={batch!r}: must be a positive integer")
        measured = doc.get("measured")
        if measured is None and isinstance(doc.get("labels"), Mapping):
            measured = doc["labels"].get("measured")
        trial = doc.get("trial_number", doc.get("trial"))
        return cls(
            config=dict(doc["config"]), batch_size=batch,
            throughput=_opt_float(doc.get("throughput")),
            peak_device_bytes=_opt_int(doc.get("peak_device_bytes")),
            budget_bytes=_opt_int(doc.get("budget_bytes")),
            backend=str(doc.get("backend") or ""), measured=bool(measured),
            trial_number=trial if isinstance(trial, int) and not isinstance(trial, bool) else None,
            environment=dict(doc.get("environment") or {}),
            source=str((doc.get("sources") or {}).get("batch_size") or ""),
            usable_bytes=_opt_int(doc.get("usable_bytes")),
            selection=str((doc.get("selection") or {}).get("rule") or ""),
            notes=tuple(str(n) for n in doc.get("notes") or ()),
            document=dict(doc),
        )

    @property
    def headroom_bytes(self) -> int | None:
        """Budget minus peak (negative = over budget), None if either is unknown."""
        if self.budget_bytes is None or self.peak_device_bytes is None:
            return None
        return self.budget_bytes - self.peak_device_bytes

    @property
    def headroom_fraction(self) -> float | None:
        if self.headroom_bytes is None or not self.budget_bytes:
            return None
        return self.headroom_bytes / self.budget_bytes


def _opt_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def _opt_int(value: Any) -> int | None:
    f = _opt_float(value)
    return None if f is None else int(f)


# ---- words ---------------------------------------------------------------------------------------

_PEAK_SOURCES = {
    "tf-bfc-cpu": ("TensorFlow's BFC allocator on the CPU (TF_CPU_ALLOCATOR_USE_BFC=true; "
                   "tf.config.experimental.get_memory_info('CPU:0')['peak'] after warm-up steps, "
                   "byte-exact, variables included), with swapped tensors copied out of TensorFlow's "
                   "allocator by the emulated host swap"),
    "tf-allocator-gpu": ("TensorFlow's GPU allocator (get_memory_info('GPU:0')['peak'] after warm-up "
                         "steps): the bytes TensorFlow's tensors held, without the CUDA context and "
                         "the allocator pool's slack that nvidia-smi also counts"),
    "simulator": ("lms.simulator, an interpreter over the traced training graph that allocates each "
                  "op's outputs, frees each tensor after its last use and models swap-out/swap-in "
                  "transfers over the device profile's host link"),
}


def _peak_source_words(source: str) -> str:
    if source in _PEAK_SOURCES:
        return _PEAK_SOURCES[source]
    if source.startswith("simulator"):  # "simulator (V100-16GB)": the device profile in brackets
        return _PEAK_SOURCES["simulator"]
    return source


def measurement_note(df: pd.DataFrame, *, device: str = "") -> str:
    """One paragraph: how many trials were measured or predicted, and how peak memory was read."""
    n = len(df)
    if n == 0:
        return "The study has no trials yet."
    measured = int(df["measured"].sum())
    predicted = n - measured
    backends = sorted({str(b) for b in df["backend"].dropna()})
    sources = sorted({str(s) for s in df["peak_source"].dropna()})
    parts = []
    where = f" on {device}" if device else ""
    if measured and predicted:
        parts.append(f"{measured} of {n} trials were measured{where} and {predicted} predicted "
                     "(the trial table's \"measured\" column says which).")
    elif measured:
        parts.append(f"All {n} trials were measured{where}.")
    else:
        parts.append(f"No trial was measured: all {n} figures are predictions, not measurements.")
    if backends:
        parts.append("Backend: " + ", ".join(backends) + ".")
    for s in sources:
        parts.append(f"Peak device memory ({s}) comes from {_peak_source_words(s)}.")
    if not sources and predicted:
        parts.append(f"Peak device memory comes from {_PEAK_SOURCES['simulator']}.")
    for b in backends:
        known = backend_named(b)
        if known is not None and known.report_note():
            parts.append(known.report_note())
    if measured:
        parts.append("Throughput is the batch size divided by the median step time over the timed "
                     "steps, after warm-up.")
    if predicted:
        parts.append("Predicted throughput is the batch size divided by the simulator's step time "
                     "(roofline compute time per op plus stalls waiting for swap-ins); treat it as a "
                     "ranking, and confirm the recommendation with a measured run.")
    return " ".join(parts)


def environment_rows(*, study_attrs: Mapping[str, Any], recommendation: Recommendation | None,
                     df: pd.DataFrame, study_name: str) -> list[tuple[str, str]]:
    """(label, value) rows for the report header; values are plain text (escaped later).

    Looks each value up in the study's user attrs (top level, then the ``tuner``
    member the search stores), then in ``recommended.json`` (top level, then
    its ``environment``); rows with no value are left out.
    """
    import shlex

    from tuner.budget import format_bytes

    layers: list[Mapping[str, Any]] = [study_attrs]
    if isinstance(study_attrs.get("tuner"), Mapping):
        layers.append(study_attrs["tuner"])
    if isinstance(study_attrs.get("environment"), Mapping):
        layers.append(study_attrs["environment"])
    if recommendation is not None:
        layers += [recommendation.document, recommendation.environment]

    def pick(*keys: str) -> Any:
        for layer in layers:
            for k in keys:
                if layer.get(k) not in (None, "", [], {}):
                    return layer[k]
        return None

    def size(value: Any) -> str | None:
        return format_bytes(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    backends = sorted({str(b) for b in df["backend"].dropna()}) if not df.empty else []
    backend = pick("backend") or ", ".join(backends) or None
    profile = pick("device_profile", "simulator_device", "device")
    profile = profile.get("name") if isinstance(profile, Mapping) else profile
    device_name = pick("device_name")
    chosen = backend_named(backend)
    predicted_only = chosen is not None and not chosen.measured
    simulated_only = predicted_only or not device_name or str(device_name).startswith("none")
    device = (f"simulated {profile} profile" if profile else device_name) if simulated_only else device_name
    device_mem = pick("device_memory_bytes", "memory_bytes")
    if device_mem is None and predicted_only and isinstance(profile, str):
        try:
            from lms.machine.devices import get_device

            device_mem = get_device(profile).memory_bytes
        except (ImportError, KeyError, ValueError):
            device_mem = None
    budget = pick("budget_bytes", "budget")
    if budget is None and recommendation is not None:
        budget = recommendation.budget_bytes
    budget_text = None
    if isinstance(budget, (int, float)) and not isinstance(budget, bool):
        budget_text = f"{format_bytes(budget)} ({int(budget):,} bytes)"
        source = pick("budget_source")
        if source:
            budget_text += f" [{source}]"
    usable = pick("usable_bytes")
    margin = pick("safety_margin")
    usable_text = size(usable)
    if usable_text and isinstance(margin, (int, float)):
        usable_text += f" (safety margin {margin:.0%})"
    model = pick("model", "model_spec", "workload")
    options = pick("model_options")
    if isinstance(options, Mapping) and options:
        model = f"{model} ({', '.join(f'{k}={v}' for k, v in options.items())})"
    tf = pick("tensorflow_version", "tensorflow")
    if tf and pick("tensorflow_distribution"):
        tf = f"{tf} ({pick('tensorflow_distribution')})"
    host = pick("hostname", "host")
    cpu = pick("cpu")
    if host and cpu:
        cores = pick("cpu_count")
        host = f"{host}: {cpu}" + (f", {cores} cores" if cores else "")
        memory = size(pick("host_memory_bytes"))
        host += f", {memory} RAM" if memory else ""
    command = pick("command_line", "command", "argv")
    if isinstance(command, (list, tuple)):
        command = shlex.join(str(c) for c in command)
    n_ok = int(df["feasible"].sum()) if not df.empty else 0
    rows = [
        ("study", study_name),
        ("model", model),
        ("backend", backend),
        ("device", device),
        ("simulator profile", None if simulated_only else profile),
        ("device memory", size(device_mem)),
        ("memory budget", budget_text),
        ("usable", usable_text),
        ("TensorFlow", tf),
        ("Keras", pick("keras_version", "keras")),
        ("tuner", pick("tuner_version", "tflms_tuner")),
        ("Optuna", pick("optuna_version", "optuna")),
        ("Python", pick("python_version", "python")),
        ("GPU driver", pick("driver_version")),
        ("host", host),
        ("sampler", pick("sampler")),
        ("seed", pick("seed")),
        ("storage", pick("storage")),
        ("trials", f"{len(df)} ({n_ok} feasible)"),
        ("command line", command),
        ("recommendation written", pick("created", "created_at")),
    ]
    return [(k, str(v)) for k, v in rows if v not in (None, "")]
