"""``emulated``: real runs on the CPU with emulated swaps; the budget enforced on TF's BFC-allocator peak.

The "device" is TensorFlow's CPU BFC allocator and the budget is enforced by
comparing its measured peak (``peak_source == "tf-bfc-cpu"``) with the budget;
nothing stops the process from using more, so a batch "does not fit" when
that peak exceeds the usable budget. Swapped-out tensors live outside that
allocator, in ordinary host memory (recorded as ``host_peak_rss_bytes``).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..errors import BadInput
from .base import GpuChoice
from .measured import MeasuredBackend

__all__ = ["EmulatedBackend"]


class EmulatedBackend(MeasuredBackend):
    name = "emulated"
    # The no-LMS baseline and the screen's pick, each a bracket of fresh processes (`tuner.backends.confirm`; ResNet-50
    # 64x64 on 2 cores: 15-20 s and 35-50 s a process, 4-6 each), then their repeats side by side; the search
    # measures the screen's next pick only when the rule keeps no LMS config (`EXTRA_TRIALS`)
    default_trials = 2
    # well above the default search's few minutes: the confirmation is budgeted inside it on a busy machine too
    default_timeout_s = 1200.0
    max_image_size = 64
    profiles_op_times = True  # its trials run on this CPU: the simulator times ops as profiled here
    # the pick's first processes may overlap the baseline's last: memory verdicts do not depend on the load (two
    # processes at batch 180 run together peaked step for step to the byte as one alone) and the throughput the
    # recommendation compares is taken again, one process at a time, in the confirmation
    concurrent_trials = True
    peak_source = "tf-bfc-cpu"
    help = ("simulated screening, then real runs on the CPU with emulated swaps, the budget enforced on "
            "TensorFlow's measured BFC-allocator peak (MEASURED on the emulated device)")
    tf_device = "/CPU:0"
    emulate = True
    executor = "single_threaded"

    def choose_gpus(self, *, gpu: str | None, gpus: tuple[str, ...], workers: int,
                    inventory: Callable[[], list[dict[str, Any]]]) -> GpuChoice:
        if gpus:
            raise BadInput(f"--gpus needs --backend gpu (the backend is {self.name})")
        if gpu is not None:
            raise BadInput(f"--gpu needs --backend gpu or simulate (the {self.name} backend runs on the CPU)")
        return GpuChoice(workers=workers)

    def default_device(self, gpu_info: Mapping[str, Any] | None) -> str:
        return "cpu"

    def source_label(self, *, measured: bool, device: str = "", device_name: str = "") -> str:
        if not measured:
            return super().source_label(measured=False, device=device)
        return "measured on the emulated device (CPU, TensorFlow BFC allocator)"

    def device_info(self, info: Mapping[str, Any], *, gpu: str | None) -> dict[str, Any]:
        return {"device_name": f"emulated device on CPU ({info.get('cpu')}), TensorFlow BFC allocator"}

    def report_note(self) -> str:
        return ("On the emulated backend, swaps are real copies to host memory through tf.numpy_function, so "
                "memory is real but transfer times are those of this machine's memory system (or a set "
                "bandwidth), not a device link.")

    def configure_tensorflow(self, tf: Any, *, memory_limit_bytes: int | None = None,
                             user_program: bool = False) -> str:
        if user_program:  # measured as the user's run will be: TF's default executor and threads
            return ""
        # The emulated device runs under TF's single-threaded executor: one op order, fixed when
        # the function is built, the one the simulator's "cpu" profile models, so every step of a
        # trial peaks alike. (Under the default executor the order depends on timing: up to 50%
        # apart between processes with swaps; under this one, at most 12% on our benchmark.)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        return ""

    def device_label(self, measured_name: str) -> str:
        return f"emulated device on CPU ({measured_name or 'CPU:0'}), TF BFC allocator"
