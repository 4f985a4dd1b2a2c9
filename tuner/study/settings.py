"""`SearchSettings`: everything a search needs, validated once by the CLI (or built by a test or a benchmark)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..budget import format_bytes
from ..policy.goal import Goal, goal_of
from .storage import StorageSpec

__all__ = ["SearchSettings", "study_settings_conflict"]


@dataclass(frozen=True)
class SearchSettings:
    """Everything `tuner.search.run_search` needs, validated by the CLI.

    Attributes:
        study: study name (a plain folder name).
        model: workload spec (built-in name or ``module:function``).
        model_options: options for the workload factory.
        backend: the backend's name (``--backend``); `tuner.backends.get_backend` gives the backend. A name,
            not the `tuner.backends.Backend`: a backend's search takes these settings.
        budget_bytes: device memory budget; ``None``: derive (`tuner.graphs.derive_budget`).
        budget_source: how the budget was chosen, for people.
        budget_from_batch: derive the budget as the no-LMS step's peak at this batch (``--budget-from-batch``,
            `tuner.graphs.plain_peak_at`); needs `budget_bytes` None. None: the backend's default.
        device: simulator device profile name.
        trials: trials the main study should have (real runs on gpu/emulated).
        screen_trials: simulated screening trials before real runs (gpu/emulated).
        timeout_s: wall-clock limit of this invocation (None: none).
        trial_timeout_s: limit of one real trial.
        seed: sampler seed (None: random).
        steps / warmup: timed and warm-up steps of the final measurement.
        safety_margin: fraction of the budget kept free.
        max_batch: largest batch considered.
        batch: a fixed batch (``--batch``): maximise throughput at it instead of the batch (None: the
            largest batch); see `goal`.
        grow: an integer model option to grow at the fixed batch (``--grow``; `tuner.grow`), None: none.
        sampler: ``tpe`` | ``nsga2`` | ``random``.
        prefer / min_throughput_ratio: how the recommendation is picked (see `tuner.outputs`).
        gpu: GPU index or UUID for workers (gpu backend).
        gpus: several GPUs: one trial worker on each, in parallel (gpu backend).
        workers: parallel trial workers on the CPU (emulated backend; they share the cores, so
            their timings interfere).
        confirm: measured backends, largest-batch goal: re-measure the recommended config and the no-LMS
            baseline with one batch per fresh worker process and recommend the largest batch that fitted
            there, once it fitted in this many processes (`tuner.backends.confirm`); 0: off.
        storage: where the study lives.
        studies_dir: outputs folder root (``studies/``).
        workload: the workload's description (`tuner.models.Workload.describe`).
        notes: adjustments made to the user's input (printed and stored).
        host_budget_bytes: host memory a config's swapped tensors may hold (``--host-budget``,
            `tuner.host`); None: no host bound.
        host_budget_source: how the host budget was chosen, for people.
    """

    study: str
    model: str
    model_options: Mapping[str, Any]
    backend: str
    budget_bytes: int | None
    budget_source: str
    device: str
    trials: int
    screen_trials: int
    storage: StorageSpec
    studies_dir: Path
    timeout_s: float | None = None
    trial_timeout_s: float = 600.0
    seed: int | None = None
    steps: int = 5
    warmup: int = 2
    safety_margin: float = 0.05
    max_batch: int = 4096
    batch: int | None = None
    grow: str | None = None
    sampler: str = "tpe"
    prefer: str = "batch"
    min_throughput_ratio: float = 0.8
    gpu: str | None = None
    gpus: tuple[str, ...] = ()
    workers: int = 1
    confirm: int = 2
    workload: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    host_budget_bytes: int | None = None
    host_budget_source: str = ""
    budget_from_batch: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.backend, str):
            raise ValueError(f"SearchSettings.backend={self.backend!r}: must be a backend's name "
                             "(one of tuner.backends.BACKENDS), not a Backend")
        if self.budget_from_batch is not None and (self.budget_bytes is not None or self.budget_from_batch < 1):
            raise ValueError(f"SearchSettings.budget_from_batch={self.budget_from_batch!r}: must be a batch >= 1, "
                             f"with budget_bytes None (not {self.budget_bytes!r})")

    @property
    def study_dir(self) -> Path:
        return self.studies_dir / self.study

    @property
    def goal(self) -> Goal:
        """What the study maximises: the largest batch, or the throughput at ``batch`` (`tuner.policy.goal`)."""
        return goal_of(self.batch, cap=self.max_batch)

    def identity(self) -> dict[str, Any]:
        """What must not change when a study is resumed."""
        return {"model": self.model, "model_options": dict(self.model_options), "backend": self.backend,
                "device": self.device, "safety_margin": self.safety_margin, "max_batch": self.max_batch,
                "batch": self.batch}

    def selection(self) -> dict[str, Any]:
        """How the recommendation is picked (stored, so `best` computed from the storage picks the same)."""
        return {"prefer": self.prefer, "min_throughput_ratio": self.min_throughput_ratio}


def study_settings_conflict(stored: Mapping[str, Any] | None, settings: SearchSettings) -> str:
    """A one-line description of how `settings` differ from a study's stored settings ("" if they match)."""
    if not stored:
        return ""
    identity = settings.identity()
    for key, value in identity.items():
        if key in stored and stored[key] != value:
            return (f"study {settings.study!r} was created with {key}={stored[key]!r}, not {value!r}; "
                    "use another --study name, or the same settings to resume it")
    if settings.budget_bytes is not None and stored.get("budget_bytes") not in (None, settings.budget_bytes):
        return (f"study {settings.study!r} was created with budget {format_bytes(stored['budget_bytes'])}, "
                f"not {format_bytes(settings.budget_bytes)}; use another --study name")
    batch = settings.budget_from_batch
    if batch is not None and stored.get("budget_bytes") is not None and stored.get("budget_from_batch") != batch:
        return (f"study {settings.study!r} was created with budget {format_bytes(stored['budget_bytes'])} "
                f"({stored.get('budget_source') or 'stored'}), not the no-LMS peak at batch {batch} "
                "(--budget-from-batch); use another --study name")
    from ..host import host_budget_conflict

    return host_budget_conflict(stored, settings)
