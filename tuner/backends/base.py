"""What every backend answers: how to choose its device and budget, label its figures, and run a search.

A backend is chosen once (`tuner.backends.get_backend`, from ``--backend`` or
the study's stored name) and asked; nothing else compares backend names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

from ..policy.bracket import start_from_peaks

if TYPE_CHECKING:
    from ..study.progress import Progress
    from ..policy.records import TrialRecord
    from ..study.settings import SearchSettings
    from ..policy.space import SearchSpace

__all__ = ["Backend", "SearchRun", "GpuChoice"]


@dataclass(frozen=True)
class GpuChoice:
    """The GPUs a search uses: `info` sizes the default budget and device profile; one worker per `slots` entry.

    Attributes:
        info: the (smallest) chosen GPU's `lms.machine.nvml.gpu_inventory` entry.
        gpus: the devices the workers use (gpu backend: their UUIDs, one worker each).
        workers: parallel trial workers.
        notes: what the choice changed or assumed, for people (stored with the study's notes).
    """

    info: Mapping[str, Any] | None = None
    gpus: tuple[str, ...] = ()
    workers: int = 1
    notes: tuple[str, ...] = ()


@dataclass
class SearchRun:
    """One search in progress: what a backend's `Backend.search` needs (built once by `tuner.search.run_search`).

    Attributes:
        main: the Optuna study.
        storage: the opened Optuna storage it lives in.
        space: the search space.
        settings: the validated settings.
        usable: the budget minus the safety margin, in bytes.
        predict: the simulator's (cached) prediction of a config.
        deadline: `time.monotonic()` after which no trial starts (None: none).
        progress: the progress bar.
        ask_lock: the storage lock around ``study.ask`` (`tuner.study.storage.storage_lock`).
        attrs: the study's stored tuner settings (a screening study copies them).
        stopped: why the loop ended (``stopped["reason"]``, see `tuner.study.loop.optimize`).
        screen: the screening study, once a measured backend made it.
        notes: what the backend has to say in recommended.json (e.g. a confirmation cut short).
        plain_peaks: batch -> the allocator peak of the plain step in TF's own order, measured by the
            trace worker (``graph.json``'s ``plain_peaks``; empty: not measured, e.g. on a GPU).
    """

    main: Any
    storage: Any
    space: "SearchSpace"
    settings: "SearchSettings"
    usable: int
    predict: Callable[[Any], Any]
    deadline: float | None
    progress: "Progress"
    ask_lock: Callable[[], Any]
    attrs: Mapping[str, Any]
    stopped: dict[str, str] = field(default_factory=dict)
    screen: Any = None
    notes: list[str] = field(default_factory=list)
    plain_peaks: Mapping[int, int] = field(default_factory=dict)

    def plain_start(self, config: Any) -> int | None:
        """Where a bracket of fresh processes starts for a config that runs the plain step in TF's order
        (the no-LMS baseline): from the measured `plain_peaks` (`tuner.policy.bracket.start_from_peaks`); None for
        any other config, or without them (then the simulator's batch)."""
        if not self.plain_peaks or config.enabled or config.pins_order:
            return None
        return start_from_peaks(self.plain_peaks, usable=self.usable, cap=self.settings.max_batch)

    def evaluate_predicted(self, config: Any, trial: Any) -> "TrialRecord":
        from ..policy.records import predicted_record

        return predicted_record(config, self.predict(config), usable=self.usable, device=self.settings.device)


class Backend:
    """The base of `SimulateBackend`, `EmulatedBackend` and `GpuBackend` (one module each).

    Class attributes:
        name: what ``--backend`` and the study's attributes call it.
        measured: trials are real runs in workers (after a simulated screening study).
        default_trials: ``--trials`` when not given.
        default_timeout_s: ``--timeout`` when not given (None: no limit).
        max_image_size: workloads with an ``image_size`` option are shrunk to this unless given.
        prediction_allocator: the simulator's allocator model (``"bfc"``: TF's, replayed).
        profiles_op_times: the trace worker measures per-op times for the simulator.
        peak_source: the peak memory's source when a worker did not say.
        help: one line for ``--help``.
    """

    name: ClassVar[str] = ""
    measured: ClassVar[bool] = False
    default_trials: ClassVar[int] = 10
    default_timeout_s: ClassVar[float | None] = None
    max_image_size: ClassVar[int | None] = None
    prediction_allocator: ClassVar[str] = "exact"
    profiles_op_times: ClassVar[bool] = False
    peak_source: ClassVar[str] = ""
    help: ClassVar[str] = ""
    #: worker side (measured backends): where tensors live, swap emulation, TF's executor
    tf_device: ClassVar[str] = "/CPU:0"
    emulate: ClassVar[bool] = False
    executor: ClassVar[str] = "default"

    def __repr__(self) -> str:
        return f"<backend {self.name}>"

    def __str__(self) -> str:
        return self.name

    # ---- choosing (CLI) -----------------------------------------------------------------------------
    def choose_gpus(self, *, gpu: str | None, gpus: tuple[str, ...], workers: int,
                    inventory: Callable[[], list[dict[str, Any]]]) -> GpuChoice:
        """Check ``--gpu``/``--gpus``/``--workers`` against this backend (BadInput when they do not apply)."""
        raise NotImplementedError

    def default_device(self, gpu_info: Mapping[str, Any] | None) -> str:
        """The simulator's device profile when ``--device`` is not given."""
        return "V100-16GB"

    def default_budget(self, *, device: str, gpu_info: Mapping[str, Any] | None) -> tuple[int | None, str]:
        """(budget bytes or None: derived from the graph, where it comes from) when ``--budget`` is not given."""
        return None, "derived"

    # ---- figures ------------------------------------------------------------------------------------
    def source_label(self, *, measured: bool, device: str = "", device_name: str = "") -> str:
        """Where a figure comes from, in words (next to every number)."""
        return f"predicted (simulator, device profile {device})" if device else "predicted (simulator)"

    def device_info(self, info: Mapping[str, Any], *, gpu: str | None) -> dict[str, Any]:
        """The device fields of recommended.json's environment (``device_name`` etc.)."""
        return {"device_name": "none (simulated)"}

    def report_note(self) -> str:
        """A sentence the report adds about how this backend's figures come about ("" for none)."""
        return ""

    # ---- running ------------------------------------------------------------------------------------
    def worker_env(self, *, gpu: str | None = None) -> dict[str, str]:
        from ..worker.run import worker_env

        return worker_env()

    def worker_limits(self, settings: "SearchSettings") -> dict[str, Any]:
        """`tuner.worker.protocol.MeasureRequest` fields that bound a worker's memory (none here; see `GpuBackend`)."""
        return {}

    def search(self, run: SearchRun) -> tuple[int, int]:
        """Run the trials of `run`; (configs evaluated now, screening trials simulated now)."""
        raise NotImplementedError

    # ---- worker side (TensorFlow imported by the caller) ----------------------------------------------
    def configure_tensorflow(self, tf: Any, *, memory_limit_bytes: int | None = None,
                             user_program: bool = False) -> str:
        """Set TensorFlow up before the model is built; a reason when it cannot run here, else "".

        `memory_limit_bytes`: the request's device memory limit (`worker_limits`; None: none).
        `user_program`: the trial runs the user's own ``fit`` or step (`tuner.worker.programs`): TensorFlow's
        executor and threads stay as the user's run has them.
        """
        return ""

    def device_label(self, measured_name: str) -> str:
        """The device a worker measured on, for the trial record."""
        return measured_name
