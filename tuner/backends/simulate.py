"""``simulate``: every trial predicted in-process by `lms.simulator` on the traced graph (figures PREDICTED)."""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

from ..errors import BadInput
from ..study.loop import optimize
from .base import Backend, GpuChoice, SearchRun

__all__ = ["SimulateBackend"]


class SimulateBackend(Backend):
    name = "simulate"
    measured = False
    default_trials = 80
    help = "every figure PREDICTED by the simulator (seconds per config)"

    def choose_gpus(self, *, gpu: str | None, gpus: tuple[str, ...], workers: int,
                    inventory: Callable[[], list[dict[str, Any]]]) -> GpuChoice:
        if gpus:
            raise BadInput(f"--gpus needs --backend gpu (the backend is {self.name})")
        if workers > 1:
            raise BadInput("--workers needs --backend emulated or gpu (simulate predicts every trial in this process)")
        from ..worker.gpus import GpuChoiceError, choose_gpu

        found = inventory()
        if gpu is None:  # a GPU here sizes the default device profile
            try:
                return GpuChoice(info=choose_gpu(None, env=os.environ, inventory=found)[0] if found else None)
            except GpuChoiceError:
                return GpuChoice()
        try:
            info = choose_gpu(gpu, env=os.environ, inventory=found)[0] if found else None
            problem = "NVML sees none" if info is None else ""
        except GpuChoiceError as exc:
            info, problem = None, str(exc)
        if info is None:
            raise BadInput(f"--gpu {gpu}: no such GPU ({problem}); with --backend simulate it only picks "
                           "the device profile: give --device instead")
        return GpuChoice(info=info)

    def default_device(self, gpu_info: Mapping[str, Any] | None) -> str:
        from .gpu import default_profile

        return default_profile(gpu_info)

    def default_budget(self, *, device: str, gpu_info: Mapping[str, Any] | None) -> tuple[int | None, str]:
        from lms.machine.devices import get_device

        return get_device(device).memory_bytes, f"memory of device profile {device}"

    def search(self, run: SearchRun) -> tuple[int, int]:
        s = run.settings
        ran = optimize(run.main, run.space, run.evaluate_predicted, n_trials=s.trials, deadline=run.deadline,
                       progress=run.progress, desc="search (simulated)", seed=s.seed, ask_lock=run.ask_lock,
                       stopped=run.stopped)
        return ran, 0
