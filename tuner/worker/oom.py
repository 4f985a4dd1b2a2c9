"""What ran out when TensorFlow raised ``ResourceExhaustedError``: the device's memory, or pinned host memory.

On a GPU, swapped-out tensors live in TensorFlow's GPU host allocator
(``gpu_host_bfc``: page-locked memory, capped per process by
``TF_GPU_HOST_MEM_LIMIT_IN_MB``; ``cuda_host_bfc`` in TF 1.x). When it is
exhausted the batch does not fit *this machine*, but not for lack of GPU
memory, and more GPU memory would not help: the trial says so.

The messages, from TensorFlow 2.21's source:

- a kernel's output or temporary (``OpKernelContext::allocate_tensor``,
  ``op_kernel.cc``)::

      OOM when allocating tensor with shape[64,256,56,56] and type float on
      /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc

  (``by allocator gpu_host_bfc`` when the tensor is pinned host memory);
- the receiving end of a copy between devices (``SameWorkerRecvDone``,
  ``rendezvous_mgr.cc``), e.g. a swap-out's GPU->host copy, whose host buffer
  comes from ``gpu_host_bfc``::

      SameWorkerRecvDone unable to allocate output tensor. Key:
      /job:localhost/replica:0/task:0/device:GPU:0;<incarnation>;
      /job:localhost/replica:0/task:0/device:CPU:0;edge_12_lms/swap_out/...;0:0

  The key is ``source;incarnation;destination;edge;frame``: a CPU destination
  is host memory.

In TF 2 functions these come after a first line ``Graph execution error:``,
and eager ops put ``{{function_node __wrapped__Fill_device_/job:...}}`` before
them on their line, so the whole message is searched, not its first line.
"""

from __future__ import annotations

import re

__all__ = ["HOST_OOM", "DEVICE_OOM", "oom_memory", "describe_oom"]

#: How `describe_oom` starts for each kind (events and logs test for the prefix).
HOST_OOM = "out of pinned host memory"
DEVICE_OOM = "out of device memory"

_HOST_ALLOCATOR = re.compile(r"\b(gpu_host_bfc|cuda_host_bfc)\b")
_RECV_KEY = re.compile(r"SameWorkerRecvDone unable to allocate output tensor\. Key: ([^;\s]+);[^;]*;([^;\s]+);")


def oom_memory(message: str) -> str:
    """``"host"`` when `message` (a ``ResourceExhaustedError``'s text) is pinned host memory, else ``"device"``."""
    if _HOST_ALLOCATOR.search(message):
        return "host"
    recv = _RECV_KEY.search(message)
    if recv is not None and "/device:CPU:" in recv.group(2) and "/device:CPU:" not in recv.group(1):
        return "host"  # a copy from an accelerator to the host: its buffer is pinned (gpu_host_bfc)
    return "device"


_KEY = re.compile(r"(OOM when allocating|SameWorkerRecvDone).*")


def _key_line(message: str) -> str:
    """The line that says what: from "OOM when allocating ..." on (eager errors put ``{{function_node ...}}`` first)."""
    for line in message.splitlines():
        found = _KEY.search(line)
        if found is not None:
            return found.group(0).strip()
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    return lines[0] if lines else ""


def describe_oom(message: str, *, host_limit_mb: str | None = None) -> str:
    """One line for people: what ran out, and TensorFlow's own line about it (at most 300 characters).

    Args:
        message: the ``ResourceExhaustedError``'s text.
        host_limit_mb: ``TF_GPU_HOST_MEM_LIMIT_IN_MB`` as the worker ran (None: TF's default).
    """
    line = _key_line(message)[:240]
    if oom_memory(message) == "host":
        limit = f"TF_GPU_HOST_MEM_LIMIT_IN_MB={host_limit_mb}" if host_limit_mb else "TF's default limit, 128 GiB"
        return f"{HOST_OOM} (gpu_host_bfc, {limit}; not the GPU's memory): {line}"[:300]
    return f"{DEVICE_OOM}: {line}"[:300]
