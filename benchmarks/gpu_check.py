"""What only a GPU can show, in under 5 minutes: run this first on a GPU machine, before a search.

Every figure it prints is MEASURED on the GPU it names; each check says what to
fix when it fails. Each step runs in a fresh process under the environment a
trial worker gets (`tuner.worker.run.worker_env`: the device's UUID in
``CUDA_VISIBLE_DEVICES``, ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, ``TF_XLA_FLAGS`` and
``TF_GPU_ALLOCATOR`` removed):

1. devices: TensorFlow's GPU list against NVML and ``nvidia-smi -L`` (name, PCI
   bus id from TF's "Created device" line), and the CUDA context's size;
2. bandwidth: device->host and host->device copies of 256 MiB through pinned
   host memory, as swaps make them;
3. a real trial worker (`tuner.worker.run.run_worker`, as ``--backend gpu`` runs one): ResNet-50 64x64
   at batch 32 with every tensor swapped, under a 2,048 MiB ``memory_limit``: TF's device must be
   that size and the measured peak within the worker's budget;
4. ResNet-50 (224x224) at a fixed batch with LMS off and on (``n_tensors=-1,
   lb=1``): TF's allocator peak and NVML's process peak; on the LMS run, the
   swap ops left after Grappler, whether every host->device transfer of a
   swapped tensor depends on its trigger in the partition graphs TF ran
   (`lms.tf.placement.swap_transfers`), the Transposes next to the swap ops
   (Grappler's layout optimizer) against the simulator's count
   (`lms.sim.layout`) and, from one profiled step (xplane), when each swap-in's
   host->device copy started on the GPU against its trigger's last kernel.

    python benchmarks/gpu_check.py                    # the first GPU your CUDA_VISIBLE_DEVICES shows
    python benchmarks/gpu_check.py --gpu 1 --batch 16 # the tuner's --gpu; a smaller batch for small GPUs
    python benchmarks/gpu_check.py --dry-run          # what it would run, no TensorFlow

Writes ``benchmarks/results/gpu_check.json`` (``--out``). Exit: 0 every check
passed, 1 a check failed, 2 bad input or no GPU (after the checks it could do).
The parsers are plain functions (tested on synthetic traces in
``tests/test_gpu_check.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu_check.json"
TOTAL_S = 290.0  # the whole check, every phase included
PHASE_S = {"devices": 50.0, "bandwidth": 40.0, "off": 90.0, "on": 130.0}
TRIAL_S = 60.0  # the trial worker's phase (`run_trial`), within TOTAL_S
TRIAL = {"workload": "resnet50", "options": {"image_size": 64}, "batch": 32, "memory_limit_mib": 2048,
         "config": {"n_tensors": -1, "lb": 1}}
TRANSPOSE_OPS = frozenset({"Transpose", "ConjugateTranspose", "_MklTranspose"})
LMS_ON = {"n_tensors": -1, "lb": 1}
MiB = 1 << 20
CONTEXT_POOL_MIB = 1024  # the devices child's fixed pool (memory_limit): its CUDA context is what NVML counts beyond it


# ================================================================ pure parsers (no TensorFlow)

@dataclass(frozen=True)
class TraceEvent:
    """One profiler event: plane (``/host:CPU``, ``/device:GPU:0``), line, name, times (ps), its string stats."""

    plane: str
    line: str
    name: str
    start_ps: int
    end_ps: int
    text: str = ""


def events_from_xspace(space: Any) -> list[TraceEvent]:
    """The events of an ``XSpace`` (TF's profiler, ``xplane_pb2``) with absolute times and string stats joined.

    Works on the protobuf or anything shaped like it: ``planes[].{name, lines[], event_metadata, stat_metadata}``,
    ``lines[].{name, timestamp_ns, events[]}``, ``events[].{metadata_id, offset_ps, duration_ps, stats[]}``,
    ``stats[].{metadata_id, str_value, ref_value}`` (a ``ref_value`` names a ``stat_metadata`` entry).
    """
    out = []
    for plane in space.planes:
        names = {k: m.name for k, m in plane.event_metadata.items()}
        stat_names = {k: m.name for k, m in plane.stat_metadata.items()}
        for line in plane.lines:
            base = int(line.timestamp_ns) * 1000
            for ev in line.events:
                texts = []
                for stat in ev.stats:
                    value = getattr(stat, "str_value", "") or ""
                    ref = getattr(stat, "ref_value", 0) or 0
                    if not value and ref:
                        value = stat_names.get(ref, "")
                    if value:
                        texts.append(value)
                start = base + int(ev.offset_ps)
                out.append(TraceEvent(plane.name, line.name, names.get(ev.metadata_id, ""), start,
                                      start + int(ev.duration_ps), " ; ".join(texts)))
    return out


_H2D = re.compile(r"memcpy.*(h2d|htod)|(h2d|htod).*memcpy", re.IGNORECASE)


def is_h2d_copy(ev: TraceEvent) -> bool:
    """A host->device copy on a GPU's timeline."""
    return ev.plane.startswith("/device:") and bool(_H2D.search(ev.name) or _H2D.search(ev.line))


def _mentions(text: str, name: str, *, recv: bool = False) -> bool:
    """`text` names op `name` (``name:Type``, or alone); with `recv`, a ``_Recv`` TF named after it or an op of
    its scope (``name/_12``, ``name/gate/_12``, ``name-gate/_12``: partitioning names a Recv ``<source>/_<n>``),
    or the edge out of it that a copy annotates (``CopyTensor::ViaDMA`` runs under ``#edge_name=<tensor_name>#``,
    and partitioning names an edge's tensor ``edge_<id>_<source>``)."""
    tail = r"(?:[/-][^\s;,:]*)?/_\d+(?=$|[:\s;,])" if recv else r"(?=$|[:\s;,])"
    if re.search(r"(?:^|(?<=[\s;,:]))" + re.escape(name) + tail, text) is not None:
        return True
    return recv and re.search(r"#edge_name=edge_\d+_" + re.escape(name) + r"(?:[/-][^\s;,:#]*)?#", text) is not None


def _op_of(ev: TraceEvent) -> str:
    op, sep, kind = ev.name.rpartition(":")
    return op if sep and op and kind and " " not in ev.name and "::" not in ev.name else ev.name


def swapin_copy_delays(events: Sequence[TraceEvent], swaps: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """When each swap-in's host->device copy started against the end of its trigger op, from one profiled step.

    Args:
        events: `events_from_xspace` of the trace.
        swaps: ``{"swap_in", "swap_out", "trigger"}`` per swap-in (`lms.SwapPlan`'s names).

    The trigger's end is the end of its last GPU kernel (events whose stats name
    the op), else of its op event on the host. The copy is the first
    host->device memcpy whose stats name the ``_Recv`` TensorFlow made for the
    edge out of the swap-in or its swap-out (partitioning names both ends
    ``<op>/_<n>``), else the start of that edge's ``_Send`` on the host (an
    event ``<op>/_<n>:_Send``; not the ``_Recv``'s, which starts waiting when
    the step starts, see `lms.tf.placement`). ``delay_us`` < 0: the copy began
    before the trigger finished (nothing gated it). None where the trace did
    not show it.
    """
    host = [e for e in events if not e.plane.startswith("/device:")]
    device = [e for e in events if e.plane.startswith("/device:")]
    copies = [e for e in device if is_h2d_copy(e)]
    rows = []
    for swap in swaps:
        trigger, sources = swap.get("trigger"), [n for n in (swap.get("swap_in"), swap.get("swap_out")) if n]
        end, end_source = None, ""
        if trigger:
            kernels = [e for e in device if not is_h2d_copy(e) and _mentions(e.text, trigger)]
            ops = [e for e in host if _op_of(e) == trigger]  # its own events ("name:Type"), not its _Sends
            if kernels:
                end, end_source = max(e.end_ps for e in kernels), "gpu kernel"
            elif ops:
                end, end_source = max(e.end_ps for e in ops), "host op"
        mine = [e for e in copies if any(_mentions(e.text, n, recv=True) for n in sources)]
        start, start_source = None, ""
        if mine:
            start, start_source = min(e.start_ps for e in mine), "gpu memcpy"
        else:  # the _Send's start ("<op>/_<n>:_Send"): a _Recv starts waiting at once, the copy when its _Send runs
            sends = [e for e in host if e.name.endswith(":_Send")
                     and any(_mentions(_op_of(e), n, recv=True) for n in sources)]
            if sends:
                start, start_source = min(e.start_ps for e in sends), "host _Send"
        rows.append({"swap_in": swap.get("swap_in"), "trigger": trigger,
                     "trigger_end_us": None if end is None else end / 1e6, "trigger_source": end_source,
                     "copy_start_us": None if start is None else start / 1e6, "copy_source": start_source,
                     "delay_us": None if end is None or start is None else (start - end) / 1e6})
    return rows


def transposes_next_to_swaps(nodes: Iterable[Any], is_swap: Callable[[str], bool]) -> list[dict[str, str]]:
    """Transposes (Grappler's layout conversions) that feed a swap op or read one, in an optimized GraphDef.

    Args:
        nodes: GraphDef nodes (``name``, ``op``, ``input``).
        is_swap: whether an op name is an inserted swap op (`lms.tf.graphdefs.is_swap_op_name`).

    Returns:
        ``{"transpose", "swap", "side"}``: side ``"before"`` (its output goes to the swap op)
        or ``"after"`` (it reads the swap op's output).
    """
    nodes = list(nodes)
    ops = {n.name: n.op for n in nodes}

    def producer(ref: str) -> str:
        return ref.lstrip("^").split(":")[0]

    found = []
    for n in nodes:
        inputs = [producer(i) for i in n.input if not i.startswith("^")]
        if n.op in TRANSPOSE_OPS:
            found += [{"transpose": n.name, "swap": p, "side": "after"} for p in inputs if is_swap(p)]
        elif is_swap(n.name):
            found += [{"transpose": p, "swap": n.name, "side": "before"} for p in inputs
                      if ops.get(p) in TRANSPOSE_OPS]
    return found


_SMI = re.compile(r"^\s*(GPU \d+|MIG [^:]*?Device\s+\d+):\s*(.*?)\s*\(UUID:\s*([^)\s]+)\)")
_CREATED = re.compile(r"Created device \S+GPU:\d+ with (\d+) MB memory:.*?name: (.*?), pci bus id: ([0-9a-fA-F:.]+)"
                      r"(?:, compute capability: ([\d.]+))?")


def parse_smi_list(text: str) -> dict[str, str]:
    """``nvidia-smi -L`` as ``{uuid: name}`` (a MIG device's name: its GPU's, then its profile)."""
    found, parent = {}, ""
    for line in text.splitlines():
        m = _SMI.match(line)
        if not m:
            continue
        kind, name, uuid = m.groups()
        if kind.startswith("GPU"):
            parent = name
            found[uuid] = name
        else:
            found[uuid] = f"{parent} {kind.split('Device')[0].strip()}".strip()
    return found


def parse_created_device(log: str) -> dict[str, Any] | None:
    """TF's "Created device ... with N MB memory: -> device: 0, name: X, pci bus id: Y, compute capability: Z"."""
    m = _CREATED.search(log)
    if m is None:
        return None
    return {"memory_mib": int(m.group(1)), "name": m.group(2), "pci_bus_id": m.group(3),
            "compute_capability": m.group(4)}


def same_pci_bus(a: str | None, b: str | None) -> bool:
    """``0000:19:00.0`` (TF) and ``00000000:19:00.0`` (NVML) name one bus."""
    def norm(x: str) -> tuple[int, ...]:
        return tuple(int(p, 16) for p in re.split(r"[:.]", x.strip()))
    try:
        return bool(a and b) and norm(a) == norm(b)  # type: ignore[arg-type]
    except ValueError:
        return False


# ================================================================ checks

@dataclass
class Check:
    name: str
    status: str  # PASS | FAIL | WARN | SKIP
    detail: str
    fix: str = ""
    figures: dict[str, Any] = field(default_factory=dict)


def check_devices(child: Mapping[str, Any] | None, log: str, *, chosen: Mapping[str, Any],
                  smi: Mapping[str, str] | None) -> list[Check]:
    """TF's GPU under the worker's environment is the device NVML (and nvidia-smi) describe."""
    from tuner.worker.gpus import gpu_setup_lines

    if child is None or "error" in child:
        why = (child or {}).get("error", "the step did not finish")
        lines = " | ".join(gpu_setup_lines(log))
        return [Check("devices", "FAIL", why + (f"; TF logged: {lines}" if lines else ""),
                      "the step's log (devices.log, in the folder the JSON names)")]
    names = child.get("tf_gpu_names") or []
    if len(names) != 1:
        lines = " | ".join(gpu_setup_lines(log)) or "no reason in TF's log"
        return [Check("devices: TF sees one GPU", "FAIL", f"TF sees {len(names)} GPU(s) under CUDA_VISIBLE_DEVICES="
                      f"{chosen['uuid']}: {lines}",
                      "install the CUDA build (pip install -e '.[gpu]') and the libraries TF names above"
                      if not names else "tuner/worker/gpus.py gpu_worker_env: a worker must see exactly its device")]
    checks = []
    same = str(chosen["name"]).startswith(names[0]) or names[0].startswith(str(chosen["name"]))
    checks.append(Check("devices: TF's GPU:0 is the chosen device", "PASS" if same else "FAIL",
                        f"TF: {names[0]}; NVML: {chosen['name']} ({chosen['uuid']})",
                        "" if same else "tuner/worker/gpus.py choose_gpu/gpu_worker_env: budget and profile describe "
                                        "another GPU than TF uses"))
    created = parse_created_device(log)
    if created and chosen.get("pci_bus_id"):
        ok = same_pci_bus(created["pci_bus_id"], chosen["pci_bus_id"])
        checks.append(Check("devices: PCI bus id", "PASS" if ok else "FAIL",
                            f"TF: {created['pci_bus_id']}; NVML: {chosen['pci_bus_id']}",
                            "" if ok else "tuner/worker/gpus.py: the worker's CUDA_VISIBLE_DEVICES names another GPU",
                            {"tf_device_memory_mib": created["memory_mib"]}))
    if smi is not None:
        listed = smi.get(str(chosen["uuid"]))
        checks.append(Check("devices: nvidia-smi -L", "PASS" if listed else "FAIL",
                            f"{chosen['uuid']}: {listed or 'not listed'}",
                            "" if listed else "lms/machine/nvml.py gpu_inventory: a UUID nvidia-smi does not list"))
    limit, auto_budget = child.get("memory_limit_bytes"), child.get("auto_budget_bytes")
    if limit is not None and auto_budget is not None:
        ok = auto_budget == limit and (not created or created["memory_mib"] == limit // MiB)
        checks.append(Check("devices: memory_limit", "PASS" if ok else "FAIL",
                            f"memory_limit {limit / MiB:.0f} MiB; TF's device: "
                            f"{created['memory_mib'] if created else '?'} MiB; config='auto' budget: "
                            f"{auto_budget / MiB:.0f} MiB",
                            "" if ok else "lms/tf/auto.py default_gpu_budget / lms/machine/reachable.py: a "
                                          "memory_limit is the budget, exactly"))
    context = child.get("context_bytes")
    if context is not None:
        from lms.machine.reachable import CUDA_CONTEXT_BYTES

        ok = context <= CUDA_CONTEXT_BYTES
        checks.append(Check("devices: CUDA context", "PASS" if ok else "WARN",
                            f"NVML process bytes less TF's fixed pool (memory_limit) after a conv and a matmul: "
                            f"{context / MiB:.0f} MiB (the default budget assumes {CUDA_CONTEXT_BYTES / MiB:.0f} MiB)",
                            "" if ok else "raise CUDA_CONTEXT_BYTES in lms/machine/reachable.py (default budgets are "
                                          "too large by the difference)", {"cuda_context_bytes": context}))
    return checks


def check_bandwidth(child: Mapping[str, Any] | None, *, profile: Any) -> list[Check]:
    if child is None or "error" in child:
        return [Check("bandwidth", "FAIL", (child or {}).get("error", "did not finish"), "see the log")]
    figures = {k: child.get(k) for k in ("d2h_bytes_per_s", "h2d_bytes_per_s", "bytes")}
    worst = min(v for v in (figures["d2h_bytes_per_s"], figures["h2d_bytes_per_s"]) if v) \
        if any((figures["d2h_bytes_per_s"], figures["h2d_bytes_per_s"])) else None
    if worst is None:
        return [Check("bandwidth", "FAIL", "no copy could be timed", "see the log", figures)]
    ok = worst >= 0.7 * profile.link_bandwidth
    return [Check("bandwidth", "PASS" if ok else "WARN",
                  f"device->host {figures['d2h_bytes_per_s'] / 1e9:.1f} GB/s, host->device "
                  f"{(figures['h2d_bytes_per_s'] or 0) / 1e9:.1f} GB/s; profile {profile.name} assumes "
                  f"{profile.link_bandwidth / 1e9:.1f} GB/s ({profile.link})",
                  "" if ok else f"the simulator's link is too fast for this machine: give lms.machine.devices' {profile.name} "
                                "this link_bandwidth (DeviceProfile.replace) or add a profile for it",
                  figures)]


def check_lms(off: Mapping[str, Any] | None, on: Mapping[str, Any] | None) -> list[Check]:
    """LMS saves memory, its swap ops survive Grappler, swap-ins wait for triggers, no Transposes at the swaps."""
    if not off or not on or "error" in off or "error" in on:
        why = (off or {}).get("error") or (on or {}).get("error") or "a run did not finish (time limit?)"
        return [Check("resnet50", "FAIL", why, "smaller --batch if out of memory; else the log")]
    checks = []
    saved = 1 - on["peak_bytes"] / off["peak_bytes"]
    checks.append(Check("LMS saves GPU memory", "PASS" if saved >= 0.10 else "FAIL",
                        f"TF allocator peak {off['peak_bytes'] / 2**30:.2f} GiB off, {on['peak_bytes'] / 2**30:.2f} "
                        f"GiB on ({saved:.0%} saved); NVML process peak "
                        f"{_gib(off.get('nvml_process_peak_bytes'))} / {_gib(on.get('nvml_process_peak_bytes'))}",
                        "" if saved >= 0.10 else "swap-ins copied back early (see the swap-in check) or swaps removed: "
                                                 "lms/tf/apply.py placement", {"saved_fraction": saved}))
    n_swap_ops = on.get("swap_ops_after_grappler", 0)
    corrections = on.get("corrections") or []
    planned = on.get("n_planned", on.get("n_swaps", 0))
    if not n_swap_ops and corrections:  # the equivalence check removed them, not Grappler
        checks.append(Check("swap ops survive Grappler", "FAIL",
                            f"the equivalence check dropped the plan ({len(corrections)} corrections, e.g. "
                            f"{corrections[0]}); {planned} tensors planned, {on.get('n_swaps', 0)} kept",
                            "lms/tf/canonical.py, lms/tf/corrections.py: what the check calls a difference on "
                            "this GPU (compare lms.inspect(..., device=<this GPU's profile>))",
                            {"n_corrections": len(corrections)}))
    else:
        checks.append(Check("swap ops survive Grappler", "PASS" if n_swap_ops else "FAIL",
                            f"{n_swap_ops} swap ops in the executed graph ({on.get('n_swaps', 0)} tensors swapped of "
                            f"{planned} planned; {len(corrections)} corrections by the equivalence check)",
                            "" if n_swap_ops else "lms/tf/apply.py: _grappler_do_not_remove on every inserted op",
                            {"n_corrections": len(corrections)}))
    ungated = on.get("transfers_ungated") or []
    checks.append(Check("swap-in copies gated on the host", "FAIL" if ungated else "PASS",
                        f"{on.get('transfers_gated', 0)} host->device transfers depend on their trigger in the "
                        f"partition graphs TF ran, {len(ungated)} do not",
                        "lms/tf/apply.py: the host-side swap-in must take the trigger (issue 34 item 1)"
                        if ungated else "", {"n_ungated": len(ungated)}))
    rows = on.get("swapin_delays") or []
    known = [r for r in rows if r.get("delay_us") is not None]
    early = [r for r in known if r["delay_us"] < 0]
    if not known:
        checks.append(Check("swap-ins wait for their triggers", "WARN",
                            f"inconclusive: {len(rows)} swap-ins, none matched to a copy and a trigger in the trace",
                            f"benchmarks/gpu_check.py swapin_copy_delays: read the trace in {on.get('logdir')} "
                            "(TensorBoard) and teach the parser its names"))
    else:
        worst = min(r["delay_us"] for r in known)
        checks.append(Check("swap-ins wait for their triggers", "FAIL" if early else "PASS",
                            f"{len(early)} of {len(known)} swap-in copies began before their trigger ended "
                            f"(earliest {worst / 1000:+.2f} ms against its trigger)",
                            "gate the copy on the host side: lms/tf/apply.py and lms/tf/pin.py (issue 34 item 1)"
                            if early else "", {"n_matched": len(known), "n_early": len(early), "min_delay_us": worst}))
    transposes = len(on.get("transposes") or [])
    simulated = int(on.get("transposes_simulated") or 0)
    checks.append(Check("Transposes at the swap ops as simulated", "PASS" if transposes == simulated else "WARN",
                        f"Grappler's layout optimizer put {transposes} Transposes next to swap ops; the simulator "
                        f"counts {simulated} (one before each swap-out of an NCHW tensor, one after each swap-in "
                        "read in NCHW: lms.sim.layout.swap_transposes)",
                        "" if transposes == simulated else "lms/sim/layout.py: the simulator's count of layout "
                                                           "Transposes (issue 34 item 2)",
                        {"n_transposes": transposes, "n_simulated": simulated}))
    return checks


def run_trial(env: Mapping[str, str], workdir: Path, *, timeout_s: float, backend: str = "gpu",
              trial: Mapping[str, Any] = TRIAL) -> dict[str, Any]:
    """One trial of the tuner's own worker (`tuner.trial`), as a search runs it: a fixed batch, a budget, and
    on a GPU the budget enforced by the device's ``memory_limit`` (`tuner.worker.protocol.MeasureRequest`)."""
    from tuner.worker.protocol import MeasureRequest
    from tuner.worker.run import run_worker

    limit = int(trial["memory_limit_mib"]) * MiB
    usable = int(limit * 0.95)
    request = MeasureRequest(workload=trial["workload"], options=dict(trial["options"]), config=dict(trial["config"]),
                             backend=backend, usable_bytes=usable, start_batch=int(trial["batch"]), fixed_batch=True,
                             warmup=1, steps=2, device_memory_limit_bytes=limit if backend == "gpu" else None)
    out = run_worker(request, workdir=workdir / "trial", timeout_s=timeout_s, env=dict(env))
    r = out.result
    log = out.log_path.read_text(errors="replace") if out.log_path is not None and out.log_path.is_file() else ""
    created = parse_created_device(log)
    return {"status": out.status, "reason": out.reason, "backend": backend, "memory_limit_bytes": limit,
            "usable_bytes": usable, "batch": getattr(r, "batch_size", None),
            "peak_device_bytes": getattr(r, "peak_device_bytes", None), "peak_source": getattr(r, "peak_source", ""),
            "fits_budget": getattr(r, "fits_budget", None), "device": getattr(r, "device", None),
            "n_swapped": (getattr(r, "lms_summary", None) or {}).get("n_swapped"),
            "tf_device_memory_mib": created["memory_mib"] if created else None, "wall_s": round(out.wall_s, 1)}


def check_trial(t: Mapping[str, Any] | None) -> list[Check]:
    """The trial worker ran the step under its memory_limit, swapped, and stayed within its budget."""
    if not t or t.get("status") != "ok":
        why = (t or {}).get("reason") or (t or {}).get("error") or "no result"
        return [Check("trial worker", "FAIL", f"the worker ended {(t or {}).get('status', 'without a status')}: "
                      f"{why}", "tuner/trial.py, tuner/worker/run.py (its log is in the step logs)")]
    limit_mib = t["memory_limit_bytes"] // MiB
    seen = t.get("tf_device_memory_mib")
    limited = t.get("backend") != "gpu" or seen == limit_mib
    fits = bool(t.get("fits_budget")) and (t.get("peak_device_bytes") or 0) <= t["usable_bytes"]
    swapped = (t.get("n_swapped") or 0) > 0
    ok = limited and fits and swapped
    return [Check("trial worker", "PASS" if ok else "FAIL",
                  f"batch {t.get('batch')}: peak {_gib(t.get('peak_device_bytes'))} ({t.get('peak_source') or '?'}) "
                  f"against a budget of {_gib(t['usable_bytes'])}; TF's device {seen if seen is not None else '?'} MiB "
                  f"under memory_limit {limit_mib} MiB; {t.get('n_swapped')} tensors swapped",
                  "" if ok else ("tuner/worker/gpus.py gpu_worker_env, tuner/trial.py: the memory_limit did not take"
                                 if not limited else "tuner/trial.py: the step is over its budget or swapped nothing"))]


def _gib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**30:.2f} GiB"


# ================================================================ children (TensorFlow, in the worker's env)

def _child_devices(args: argparse.Namespace) -> dict[str, Any]:
    import tensorflow as tf

    from lms.machine.nvml import NvmlSampler

    gpus = tf.config.list_physical_devices("GPU")
    out: dict[str, Any] = {"tf_version": tf.__version__,
                           "tf_gpu_names": [tf.config.experimental.get_device_details(g).get("device_name", "")
                                            for g in gpus]}
    if not gpus:
        return out
    # A fixed pool, as the tuner's GPU workers and a user's memory_limit run: without memory growth TF's BFC
    # allocator takes its whole memory_limit at the first allocation, so what NVML counts beyond it is the CUDA
    # context and what cuDNN/cuBLAS hold outside TF's pool (with memory growth the pool's grown-but-unused
    # regions would be counted as context).
    tf.config.set_logical_device_configuration(gpus[0], [tf.config.LogicalDeviceConfiguration(
        memory_limit=CONTEXT_POOL_MIB)])
    with tf.device("/GPU:0"):  # make the context, load cuBLAS and cuDNN
        a = tf.random.uniform([512, 512])
        tf.matmul(a, a).numpy()
        tf.nn.conv2d(tf.ones([1, 32, 32, 8]), tf.ones([3, 3, 8, 8]), 1, "SAME").numpy()
    tf.test.experimental.sync_devices()
    with NvmlSampler(interval_s=60.0) as sampler:
        pass
    used = sampler.result.process_peak_bytes
    out["memory_limit_bytes"] = CONTEXT_POOL_MIB * MiB
    out["context_bytes"] = None if used is None else max(0, int(used) - CONTEXT_POOL_MIB * MiB)
    from lms.tf.auto import default_gpu_budget

    out["auto_budget_bytes"] = default_gpu_budget()[0]  # config='auto' must take the memory_limit as it is
    return out


def _protect(t: Any) -> Any:
    from tensorflow.core.framework import attr_value_pb2

    from lms.tf.apply import DO_NOT_REMOVE_ATTR

    t.op._set_attr(DO_NOT_REMOVE_ATTR, attr_value_pb2.AttrValue(b=True))  # noqa: SLF001
    return t


def _child_bandwidth(args: argparse.Namespace) -> dict[str, Any]:
    import tensorflow as tf

    n = args.copy_mib * MiB // 4
    with tf.device("/GPU:0"):
        x = tf.random.uniform([n])

    @tf.function
    def d2h(x: Any) -> Any:
        with tf.device("/CPU:0"):  # the _Recv on the host allocates pinned memory (gpu_host_bfc), as a swap-out's
            return _protect(tf.identity(x))

    @tf.function
    def roundtrip(x: Any) -> Any:
        with tf.device("/CPU:0"):
            h = _protect(tf.identity(x))
        with tf.device("/GPU:0"):
            return tf.reduce_max(_protect(tf.identity(h)))

    def seconds(fn: Callable[[], Any]) -> float:
        times = []
        for _ in range(6):
            t0 = time.perf_counter()
            out = fn()
            if out.device.endswith("GPU:0"):
                out.numpy()
            times.append(time.perf_counter() - t0)
        return sorted(times[1:])[len(times[1:]) // 2]  # the first includes tracing

    t_d2h = seconds(lambda: d2h(x))
    t_rt = seconds(lambda: roundtrip(x))
    nbytes = n * 4
    return {"bytes": nbytes, "d2h_bytes_per_s": nbytes / t_d2h,
            "h2d_bytes_per_s": nbytes / (t_rt - t_d2h) if t_rt > t_d2h else None,
            "method": "median wall time of 5 tf.function calls; host->device = round trip less device->host"}


def _child_resnet(args: argparse.Namespace, *, lms_on: bool) -> dict[str, Any]:
    import tensorflow as tf

    import lms
    from lms.config import LMSConfig
    from tensorflow.python.eager import context

    from lms.plan import plan_swaps, rewrite_graph
    from lms.sim.layout import converts_layout, nchw_tensors, swap_transposes, transposed_rank
    from lms.tf.graphdefs import is_swap_op_name, swap_op_names
    from lms.tf.placement import swap_transfers
    from lms.tf.measure import device_batch, measure_step
    from lms.tf.train import make_train_step
    from tuner.models import load_workload

    device = f"/{args.child_device}:0"
    if args.child_device == "GPU":
        tf.config.experimental.set_memory_growth(tf.config.list_physical_devices("GPU")[0], True)
    workload = load_workload(args.child_model, **({"image_size": 224} if args.child_model == "resnet50" else {}))
    model = workload.build_model()
    config = LMSConfig(**LMS_ON) if lms_on else LMSConfig(n_tensors=0)
    fn = lms.function(make_train_step(model, workload.loss_fn, workload.make_optimizer()), config=config,
                      emulate=False, input_signature=[workload.x_spec(), workload.y_spec()], autograph=False)
    data = device_batch(workload.make_batch(args.batch, 0), device)
    context.enable_run_metadata()  # the first call: TF records the graphs it ran (after Grappler)
    try:
        fn(*data)
        ran = context.export_run_metadata().function_graphs
    finally:
        context.disable_run_metadata()
    graphs = [g.post_optimization_graph for g in ran]
    partitions = [p for g in ran for p in g.partition_graphs]
    m = measure_step(fn, [data], warmup=2, steps=3, device=device)
    out: dict[str, Any] = {"batch": args.batch, "peak_bytes": int(m.peak_device_bytes),
                           "nvml_process_peak_bytes": m.nvml_process_peak_bytes, "median_step_s": m.median_step_s}
    if not lms_on:
        return out
    nodes = [n for g in graphs for n in g.node]
    plan, model = fn.plan, fn.graph
    swaps = [{"swap_in": si.name, "swap_out": s.swap_out, "trigger": si.trigger}
             for s in (plan.swaps if plan else ()) for si in s.swap_ins]
    transfers = swap_transfers(partitions, plan, edges=fn.schedule.edges if fn.schedule is not None else ()) \
        if plan else []
    on_gpu = args.child_device == "GPU"  # the layout optimizer converts on GPUs only (so does the simulator)
    expected = 0
    if on_gpu and model is not None and plan is not None:
        details = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0])
        cc = details.get("compute_capability")
        capability = f"{cc[0]}.{cc[1]}" if cc else ""
        if converts_layout(model, capability):
            rewritten = rewrite_graph(model, plan)
            ranks = transposed_rank(model)
            expected = sum(swap_transposes(rewritten, ranks, nchw_tensors(rewritten, ranks)).values())
    out.update(n_swaps=len(plan.swaps) if plan else 0, n_planned=len(plan_swaps(model, config).swaps) if model else 0,
               corrections=[str(c) for c in fn.summary.corrections][:5] if fn.summary else [],
               swap_ops_after_grappler=sum(len(swap_op_names(g)) for g in graphs),
               transposes=transposes_next_to_swaps(nodes, is_swap_op_name), transposes_simulated=expected,
               transfers_gated=sum(t.after_trigger is True for t in transfers),
               transfers_ungated=[t.send for t in transfers if t.after_trigger is False])
    logdir = tempfile.mkdtemp(prefix="gpu_check_trace_")
    tf.profiler.experimental.start(logdir)
    try:
        fn(*data).numpy()
        if args.child_device == "GPU":
            tf.test.experimental.sync_devices()
    finally:
        tf.profiler.experimental.stop()
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    events: list[TraceEvent] = []
    for path in Path(logdir).rglob("*.xplane.pb"):
        space = xplane_pb2.XSpace()
        space.ParseFromString(path.read_bytes())
        events += events_from_xspace(space)
    out.update(logdir=logdir, n_trace_events=len(events), n_h2d_copies=sum(is_h2d_copy(e) for e in events),
               swapin_delays=swapin_copy_delays(events, swaps))
    return out


CHILDREN: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "devices": _child_devices, "bandwidth": _child_bandwidth,
    "off": lambda a: _child_resnet(a, lms_on=False), "on": lambda a: _child_resnet(a, lms_on=True)}


# ================================================================ the parent (no TensorFlow)

def _run_child(phase: str, args: argparse.Namespace, env: Mapping[str, str], deadline: float,
               workdir: Path) -> tuple[dict[str, Any] | None, str]:
    timeout = min(PHASE_S[phase], deadline - time.monotonic())
    if timeout < 10:
        return {"error": "skipped: the check's 5-minute limit was reached"}, ""
    result = workdir / f"{phase}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", phase, "--child-out", str(result),
           "--batch", str(args.batch), "--copy-mib", str(args.copy_mib)]
    try:
        proc = subprocess.run(cmd, env=dict(env), capture_output=True, text=True, timeout=timeout)
        log = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        log = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return {"error": f"timed out after {timeout:.0f} s"}, log
    (workdir / f"{phase}.log").write_text(log)
    if result.is_file():
        return json.loads(result.read_text()), log
    tail = " | ".join(ln.strip() for ln in log.strip().splitlines()[-3:])
    return {"error": f"exited {proc.returncode} without a result: {tail[-300:]}"}, log


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", type=str, default=None, metavar="INDEX|UUID",
                   help="the GPU, as the tuner's --gpu reads it (default: the first visible one)")
    p.add_argument("--batch", type=int, default=32, help="ResNet-50 batch (default: %(default)s)")
    p.add_argument("--copy-mib", type=int, default=256, help="bytes per timed copy, MiB (default: %(default)s)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSON written (default: %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="check the machine and print the plan; no TensorFlow")
    p.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    p.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    # test-only: the ResNet steps on another workload and device (tests/test_gpu_check.py runs them on the CPU)
    p.add_argument("--child-model", default="resnet50", help=argparse.SUPPRESS)
    p.add_argument("--child-device", choices=("GPU", "CPU"), default="GPU", help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.batch < 1 or args.copy_mib < 1:
        print(f"gpu_check: --batch {args.batch} / --copy-mib {args.copy_mib}: both must be >= 1", file=sys.stderr)
        return 2
    if args.child:
        try:
            out = CHILDREN[args.child](args)
        except Exception as exc:  # noqa: BLE001 - reported to the parent as this step's failure
            out = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc) else ''}"}
        args.child_out.write_text(json.dumps(out, default=str))
        return 0

    from lms.machine.devices import get_device
    from lms.machine.nvml import gpu_inventory
    from tuner.backends.gpu import default_profile
    from tuner.environment import tensorflow_distribution
    from tuner.worker.gpus import GpuChoiceError, choose_gpu
    from tuner.worker.run import worker_env

    tf_dist = tensorflow_distribution()
    print(f"TensorFlow: {tf_dist[0] + ' ' + tf_dist[1] if tf_dist else 'not installed'}")
    try:
        smi_text = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        smi_text = None
    print(f"nvidia-smi -L: {'not found' if smi_text is None else str(len(parse_smi_list(smi_text))) + ' devices'}")
    found = gpu_inventory()
    if not found:
        print("gpu_check: no GPU: NVML lists none (no driver, no nvidia-ml-py, or no device); nothing measured",
              file=sys.stderr)
        return 2
    try:
        chosen, note = choose_gpu(args.gpu, env=os.environ, inventory=found)
    except GpuChoiceError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    if note:
        print(note)
    env = worker_env(gpu=str(chosen["uuid"]))
    profile = get_device(default_profile(chosen))
    print(f"GPU: {chosen['name']} ({chosen['uuid']}), PCI {chosen.get('pci_bus_id')}, profile {profile.name}")
    if tf_dist is not None and tf_dist[0].endswith("-cpu"):
        print("gpu_check: TensorFlow is the CPU build; install the CUDA build: pip install -e '.[gpu]'",
              file=sys.stderr)
        return 2
    if args.dry_run:
        print("would run (each in a fresh process, CUDA_VISIBLE_DEVICES=" + env["CUDA_VISIBLE_DEVICES"] + "): "
              + ", ".join(PHASE_S) + f", a trial worker; ResNet-50 batch {args.batch}")
        return 0
    start = time.monotonic()
    deadline = start + TOTAL_S
    workdir = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    results, logs = {}, {}
    for phase in PHASE_S:
        print(f"running {phase} ...", flush=True)
        results[phase], logs[phase] = _run_child(phase, args, env, deadline, workdir)
        if phase == "bandwidth":
            print("running trial ...", flush=True)
            left = min(TRIAL_S, deadline - time.monotonic())
            try:
                results["trial"] = run_trial(env, workdir, timeout_s=left) if left >= 10 else {
                    "error": "skipped: the check's 5-minute limit was reached"}
            except Exception as exc:  # noqa: BLE001 - reported as this step's failure
                results["trial"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    checks = (check_devices(results["devices"], logs["devices"], chosen=chosen,
                            smi=None if smi_text is None else parse_smi_list(smi_text))
              + check_bandwidth(results["bandwidth"], profile=profile)
              + check_trial(results.get("trial"))
              + check_lms(results["off"], results["on"]))
    for c in checks:
        print(f"{c.status:4}  {c.name}: {c.detail} [MEASURED]" + (f"\n      fix: {c.fix}" if c.fix else ""))
    doc = {"schema": "gpu_check", "label": "MEASURED", "seconds": round(time.monotonic() - start, 1),
           "gpu": dict(chosen), "profile": profile.name, "worker_env": {k: env.get(k) for k in (
               "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TF_GPU_HOST_MEM_LIMIT_IN_MB")},
           "lms_config": LMS_ON, "batch": args.batch, "steps": results, "checks": [asdict(c) for c in checks],
           "logs": str(workdir)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"wrote {args.out} ({doc['seconds']:.0f} s; step logs in {workdir})")
    return 1 if any(c.status == "FAIL" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
