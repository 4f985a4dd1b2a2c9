"""Which GPU a trial worker runs on, and the environment it runs in; pure functions, no NVML, no TensorFlow.

The parent asks NVML for the GPUs (`lms.machine.nvml.gpu_inventory`: NVML's order,
PCI bus ids, MIG instances) and hands that listing here with the user's
environment; everything below is a function of the two, so it is tested with
fake listings.

How ``--gpu`` is read (`choose_gpu`):

- An **index** counts the GPUs this process may use, as TensorFlow numbers them
  (``GPU:0``, ``GPU:1``, ...): the entries of your ``CUDA_VISIBLE_DEVICES`` when
  it is set, else every GPU. CUDA orders them by PCI bus id when
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (``nvidia-smi``'s numbering) and fastest first
  otherwise (CUDA's default), which is the same order when all GPUs are one
  model. With different models and no ``PCI_BUS_ID`` an index is ambiguous
  (NVML cannot say which GPU CUDA calls fastest) and is refused: give a UUID.
- A **UUID** (``GPU-...``, or ``MIG-...`` for a MIG instance; a unique prefix
  is enough, as CUDA accepts) names one device; it must be among the visible ones.
- **Nothing**: the first visible GPU, the one your own TensorFlow script would
  use (on a machine of mixed models without ``PCI_BUS_ID``, the first by PCI
  bus id, and the search says so).
- A GPU in MIG mode cannot run CUDA work itself; choose one of its instances by UUID.

Every worker then gets ``CUDA_VISIBLE_DEVICES=<that device's UUID>`` and
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (`gpu_worker_env`): TensorFlow's ``GPU:0`` in
the worker is exactly the device whose NVML figures size the budget and the
device profile, whatever order CUDA would use.

The worker's environment (`gpu_worker_env`) is the user's, except for what
would change what is measured; those are removed, and the search says so:

- ``TF_XLA_FLAGS``: XLA auto-clustering (``--tf_xla_auto_jit``) compiles
  clusters that bypass graph-level swap ops (LMS and XLA do not mix).
- ``TF_GPU_ALLOCATOR``: ``cuda_malloc_async`` (or the debugging allocators)
  replaces TF's BFC allocator, whose peak the search measures, the simulator
  replays and the ``memory_limit`` budget bounds. The recommendation holds for
  a training run with TF's default allocator.
- ``TF_FORCE_GPU_ALLOW_GROWTH``: the worker enforces the budget with a logical
  device's ``memory_limit`` instead (TensorFlow refuses memory growth beside it;
  the variable would override it from below).

``TF_CPP_MIN_LOG_LEVEL`` is left at TensorFlow's default (``0``) in GPU workers
unless you set it: a CUDA library TensorFlow cannot load is reported as a
warning ("Cannot dlopen some GPU libraries") and, in TF 2.21, its name only at
INFO level; `gpu_setup_lines` finds those lines in the worker's log.
``TF_GPU_HOST_MEM_LIMIT_IN_MB`` (pinned host memory) is set by each worker
before TensorFlow starts (`host_memory_limit_bytes`, carried by its request)
unless you set it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

__all__ = [
    "GpuChoiceError", "NO_GPU_REASON", "STRIPPED_ENV", "choose_gpu", "explain_no_gpu", "gpu_setup_lines",
    "gpu_worker_env", "host_memory_limit_bytes", "visible_gpus",
]

#: The start of the reason a GPU worker gives when TensorFlow finds no GPU (`gpu_setup_lines` explains it).
NO_GPU_REASON = "backend gpu: TensorFlow sees no GPU"

#: Variables removed from GPU workers' environments, and why (`gpu_worker_env`).
STRIPPED_ENV: dict[str, str] = {
    "TF_XLA_FLAGS": "XLA auto-clustering would compile the step around the swap ops",
    "TF_GPU_ALLOCATOR": "the search measures, and the simulator replays, TF's default BFC allocator",
}

#: Fraction of the machine's RAM the trial workers may pin for swapped tensors, shared among them.
HOST_PINNABLE_FRACTION = 0.75

_MiB = 1 << 20


class GpuChoiceError(ValueError):
    """``--gpu``/``--gpus``/``CUDA_VISIBLE_DEVICES`` name no GPU, or one that cannot be told apart."""


@dataclass(frozen=True)
class _Visible:
    """What the user's environment makes visible: the devices in CUDA's order, or why the order is unknown."""

    devices: tuple[Mapping[str, Any], ...]
    ambiguous: str = ""  # why an index cannot be mapped ("" when it can)
    described: str = ""  # "CUDA_VISIBLE_DEVICES='...'" or "all GPUs"


def _gpus(inventory: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Whole GPUs (not MIG instances) in CUDA's PCI_BUS_ID order (NVML's order where NVML gave no bus id)."""
    whole = [g for g in inventory if g.get("mig") != "instance"]
    if all(g.get("pci_bus_id") for g in whole):
        return sorted(whole, key=lambda g: str(g["pci_bus_id"]).upper())
    return sorted(whole, key=lambda g: int(g["index"]))


def _order_problem(env: Mapping[str, str], gpus: Sequence[Mapping[str, Any]]) -> str:
    if env.get("CUDA_DEVICE_ORDER", "").strip() == "PCI_BUS_ID":
        return ""
    names = sorted({str(g["name"]) for g in gpus})
    if len(names) <= 1:
        return ""
    return (f"GPUs of different models ({', '.join(names)}) and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA "
            "numbers them fastest first, which NVML cannot reproduce; give a UUID (nvidia-smi -L) or set "
            "CUDA_DEVICE_ORDER=PCI_BUS_ID")


def _by_uuid(entry: str, inventory: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [g for g in inventory if str(g["uuid"]).startswith(entry)]


def _visible(env: Mapping[str, str], inventory: Sequence[Mapping[str, Any]]) -> _Visible:
    gpus = _gpus(inventory)
    problem = _order_problem(env, gpus)
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return _Visible(tuple(gpus), problem, "CUDA_VISIBLE_DEVICES (unset)")
    described = f"CUDA_VISIBLE_DEVICES={value!r}"
    devices: list[Mapping[str, Any]] = []
    for raw in value.split(","):
        entry = raw.strip()
        if not entry or entry.startswith("-"):
            break  # CUDA stops at the first invalid entry ("-1" is the usual "none")
        if entry.isdigit():
            if problem:
                raise GpuChoiceError(f"{described}: {problem}")
            if int(entry) >= len(gpus):
                break  # CUDA ignores an index past the last device, and everything after it
            devices.append(gpus[int(entry)])
            continue
        matches = _by_uuid(entry, inventory)
        if len(matches) != 1:
            raise GpuChoiceError(f"{described}: entry {entry!r} matches "
                                 + (f"{len(matches)} devices" if matches else "no device NVML lists"))
        devices.append(matches[0])
    return _Visible(tuple(devices), "", described)


def visible_gpus(env: Mapping[str, str], inventory: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The devices a process with environment `env` sees, in TensorFlow's order (its ``GPU:0``, ``GPU:1``, ...).

    Raises:
        GpuChoiceError: an entry of ``CUDA_VISIBLE_DEVICES`` is ambiguous (an index on a machine of
            mixed models without ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, a UUID prefix of several devices)
            or matches nothing.
    """
    return list(_visible(env, inventory).devices)


def _label(g: Mapping[str, Any]) -> str:
    return f"{g['name']} ({g['uuid']})"


def choose_gpu(requested: str | None, *, env: Mapping[str, str],
               inventory: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any], str]:
    """The device `requested` (``--gpu``: an index, a UUID or None) names under `env`; see the module docstring.

    Args:
        requested: an index among the visible GPUs, a (prefix of a) ``GPU-``/``MIG-`` UUID, or None.
        env: the user's environment (``CUDA_VISIBLE_DEVICES``, ``CUDA_DEVICE_ORDER``).
        inventory: `lms.machine.nvml.gpu_inventory`'s listing.

    Returns:
        (the inventory entry, a note for people: "" unless the choice needs saying).

    Raises:
        GpuChoiceError: no such device, an ambiguous one, or a GPU in MIG mode.
    """
    visible = _visible(env, inventory)
    devices = visible.devices
    note = ""
    if requested is None or not str(requested).strip():
        if not devices:
            raise GpuChoiceError(f"{visible.described} makes no GPU visible" if inventory else "NVML lists no GPU")
        chosen = devices[0]
        if visible.ambiguous:
            note = (f"GPU {_label(chosen)} chosen: the first by PCI bus id. Your TensorFlow numbers these GPUs "
                    "fastest first; give --gpu UUID to choose another")
    else:
        wanted = str(requested).strip()
        shown = ", ".join(f"{i} = {_label(g)}" for i, g in enumerate(devices)) or "none"
        if wanted.isdigit():
            if visible.ambiguous:
                raise GpuChoiceError(f"--gpu {wanted}: {visible.ambiguous}")
            if int(wanted) >= len(devices):
                raise GpuChoiceError(f"--gpu {wanted}: {visible.described} makes {len(devices)} GPU(s) visible "
                                     f"(numbered as TensorFlow does: {shown})")
            chosen = devices[int(wanted)]
        else:
            # unset CUDA_VISIBLE_DEVICES hides nothing: a MIG instance is named by its UUID
            pool = devices if "CUDA_VISIBLE_DEVICES" in env else inventory
            matches = [g for g in pool if str(g["uuid"]).startswith(wanted)]
            if len(matches) != 1:
                hidden = _by_uuid(wanted, inventory)
                why = (f"matches {len(matches)} devices" if matches else
                       f"is not among the devices {visible.described} makes visible" if hidden else
                       "matches no device NVML lists")
                raise GpuChoiceError(f"--gpu {wanted}: {why} ({shown})")
            chosen = matches[0]
    if chosen.get("mig") == "enabled":
        instances = [g["uuid"] for g in inventory if g.get("parent_uuid") == chosen["uuid"]]
        raise GpuChoiceError(f"GPU {_label(chosen)} is in MIG mode: CUDA runs work only on its instances; "
                             "choose one with --gpu MIG-... (" + (", ".join(instances) or "it has none yet: "
                                                                   "create one with nvidia-smi mig") + ")")
    return chosen, note


def host_memory_limit_bytes(*, host_bytes: int, workers: int) -> int:
    """Pinned host memory one trial worker may take: `HOST_PINNABLE_FRACTION` of the RAM, shared by `workers`.

    TensorFlow's GPU host allocator (``gpu_host_bfc``) holds swapped tensors in
    page-locked memory the OS cannot page out; its cap, ``TF_GPU_HOST_MEM_LIMIT_IN_MB``,
    defaults per process to 128 GiB (``1 << 17`` MB in ``gpu_process_state.cc``'s
    ``GetGpuHostAllocator`` beside ``gpu_host_mem_limit_in_mb``, which TF 2.21's
    options have; 64 GiB before), so eight workers could try to pin 1 TiB. The
    quarter left over is for the OS, the parent and each worker's own heap.
    """
    if workers < 1:
        raise ValueError(f"workers={workers!r}: must be >= 1")
    return max(_MiB, int(host_bytes * HOST_PINNABLE_FRACTION) // workers)


def gpu_worker_env(base: Mapping[str, str], *, visible: str) -> tuple[dict[str, str], list[str]]:
    """A GPU trial worker's environment from the user's `base`, and notes on what was changed.

    Args:
        base: the user's environment.
        visible: the chosen device's UUID (``GPU-...``/``MIG-...``), from `choose_gpu`.

    Returns:
        (environment, one note per variable removed; [] when none was).
    """
    env = dict(base)
    notes = []
    for name, why in STRIPPED_ENV.items():
        value = env.pop(name, None)
        if value:
            notes.append(f"{name}={value!r} is not passed to the trial workers: {why}")
    env["CUDA_VISIBLE_DEVICES"] = visible
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env.pop("TF_FORCE_GPU_ALLOW_GROWTH", None)  # the budget is a logical device's memory_limit
    return env, notes


_SETUP_PATTERNS = re.compile(
    r"Cannot dlopen some GPU libraries|Could not load dynamic library|Could not find cuda drivers"
    r"|failed call to cuInit|CUDA_ERROR_\w+|Skipping registering GPU devices|cuDNN version")


def gpu_setup_lines(log_text: str, *, limit: int = 4) -> list[str]:
    """Lines of a worker's log that say why TensorFlow found no usable GPU (a library it could not load, ...).

    TensorFlow's own log prefix (``2024-... W tensorflow/.../gpu_device.cc:2256] ``)
    is cut off; repeated lines appear once; at most `limit`.
    """
    found: list[str] = []
    for line in log_text.splitlines():
        if not _SETUP_PATTERNS.search(line):
            continue
        text = re.sub(r"^.*?\] ", "", line.strip(), count=1) if "] " in line else line.strip()
        text = text[:300]
        if text and text not in found:
            found.append(text)
        if len(found) >= limit:
            break
    return found


def explain_no_gpu(reason: str, log_text: str) -> str:
    """A worker's `reason`, plus `gpu_setup_lines` of its log when the reason is that TensorFlow found no GPU."""
    if not reason.startswith(NO_GPU_REASON):
        return reason
    lines = gpu_setup_lines(log_text)
    return f"{reason}; TensorFlow logged: " + " | ".join(lines) if lines else reason
