"""`simulate(graph, plan, batch=...)`: device memory and step time of one training step.

The interpreter walks the executed order once per batch size over arrays
prepared by `compile_graph` (cached per graph and plan):

- memory: live bytes at each position (allocated outputs, inputs not yet
  released) + the op's temporaries + resident bytes; the peak is the maximum;
- time: ops run one after another on the compute stream (measured
  ``op_costs`` or a roofline from the `DeviceProfile`); swap-outs and swap-ins
  are copies on two copy engines (one per direction) that overlap compute. A
  copy starts when the work enqueued before it finished (TF makes the copy
  stream wait for the compute stream) and its engine is free; a swap-in also
  waits for its swap-out. An op that reads a swap-in waits for the copy: a
  stall. A swapped tensor's device copy stays allocated until its
  device->host copy finished (a slow link raises the peak).

Without a device (``device=None``) copies are instantaneous and ops take
``op_costs`` (or no) time: the result is the pure order-based memory model.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Mapping

import numpy as np

from ..config import LMSConfig
from ..machine.devices import DeviceProfile, get_device
from ..graph import Graph
from ..pipeline import cached, per_graph, plan_kernels, resolve_plan, schedule_for, store
from ..plan import SwapPlan
from .bfc import replay_bfc
from .compiled import CompiledGraph, compile_graph
from .costs import ONEDNN_TEMPORARIES, TEMPORARIES, TemporaryModel
from .layout import converts_layout
from .opcosts import OpCosts
from .result import SimResult, Timeline, TimelineEvent, Trace

__all__ = ["simulate", "SimResult", "Timeline", "TimelineEvent", "compiled_for", "exact_on",
           "layout_transposes_on",
           "DEFAULT_TEMPORARIES", "default_temporaries", "cost_array"]


DEFAULT_TEMPORARIES = ONEDNN_TEMPORARIES  # the emulated device's kernels (oneDNN)


# ---- compiled graphs, cached beside the plans and schedules (lms.pipeline) -----------------

def compiled_for(graph: Graph, plan: SwapPlan | None, *, order: str = "executor",
                 expensive_op_bytes: int | None = None, temporaries: TemporaryModel | None = None,
                 resident_bytes: int | None = None, exact: bool = False,
                 layout_transposes: bool = False) -> CompiledGraph:
    """The compiled form of (graph, plan), built once and cached while `graph` lives.

    With `exact` a memory schedule's order is the executed order (the step's
    executed graph pinned whole, `lms.tf.exact`); else `order` models TF's
    executor over the graph with the schedule's pins.
    """
    temporaries = DEFAULT_TEMPORARIES if temporaries is None else temporaries
    entries = per_graph(graph)
    pinned = plan is not None and plan.config.pins_order
    exact = bool(exact and pinned and plan.config.schedule == "memory")
    layout_transposes = bool(layout_transposes and plan is not None and plan.swaps)
    key = ("compiled", plan if plan is not None and (plan.rewrites or pinned) else None, order, expensive_op_bytes,
           id(temporaries), resident_bytes, exact, layout_transposes)
    hit = entries.get(key)
    if hit is not None and hit[0] is temporaries:
        return hit[1]
    sched = schedule_for(graph, plan, exact=exact) if pinned else None
    cg = compile_graph(graph, plan, order=order, expensive_op_bytes=expensive_op_bytes,
                       temporaries=temporaries, resident_bytes=resident_bytes, schedule=sched,
                       layout_transposes=layout_transposes)
    store(graph, key, (temporaries, cg))
    return cg


def exact_on(device: DeviceProfile | None) -> bool:
    """Whether LMS pins the executed graph of a memory-scheduled step whole on `device` (`lms.tf.exact`).

    It does on one CPU device (the emulated device: ``kernels="cpu"``); on a GPU
    the memory schedule is pinned through the pinnable ops only.
    """
    return device is not None and device.kernels == "cpu"


def layout_transposes_on(graph: Graph, device: DeviceProfile | None) -> bool:
    """Whether TF adds a layout ``Transpose`` beside each swap of `graph` on `device` (`lms.sim.layout`).

    On a GPU profile, when Grappler converts the graph's convolutions to NCHW.
    """
    if device is None or device.kernels != "gpu":
        return False
    capability = device.compute_capability
    return cached(graph, ("converts_layout", capability), lambda: converts_layout(graph, capability))


# ---- the interpreter ---------------------------------------------------------------------
def simulate(graph: Graph, plan: LMSConfig | SwapPlan | None = None, *, batch: int,
             device: DeviceProfile | str | None = None, op_costs: Mapping[str, float] | OpCosts | None = None,
             op_costs_batch: int | None = None, resident_bytes: int | None = None,
             temporaries: TemporaryModel | None = None, order: str | None = None,
             allocator: str = "exact", timeline: bool = True, exact: bool | None = None) -> SimResult:
    """Simulate one training step of `graph` rewritten by `plan` at batch size `batch`.

    Args:
        graph: the training graph model.
        plan: a `SwapPlan`, an `LMSConfig` (planned here), or ``None`` (no swapping).
        batch: batch size (tensor sizes via `Tensor.nbytes`).
        device: a `DeviceProfile` or its name: roofline op times and link speed.
            ``None``: instantaneous copies; times only from `op_costs`.
        op_costs: measured seconds per op name (ops not listed: roofline, or 0
            without a device), or an `OpCosts` (affine in the batch, from
            `lms.tf.profile.profile_op_costs`; ops it did not see cost 0).
        op_costs_batch: the batch `op_costs` were measured at; they are scaled
            by ``batch / op_costs_batch`` (``None``: used as they are).
        resident_bytes: weights + optimizer slots + constants held all step;
            ``None``: derived from the graph's variable reads and constants.
        temporaries: per-op scratch model (default: the device's, `lms.sim.costs.TEMPORARIES`
            by `DeviceProfile.kernels`; without a device oneDNN's CPU kernels', as the emulated
            device runs them; `lms.sim.costs.CPU_TEMPORARIES` for TF's Eigen kernels).
        order: executed-order model: ``"executor"`` (TF's executor, with the
            device's expensive-op rule), ``"single_threaded"`` (TF's
            single-threaded executor, as `lms.tf.measure.measure_step` runs
            under with ``executor="single_threaded"``), ``"fifo"`` or
            ``"creation"`` (see `lms.order.executed_order`). ``None``: the
            device's (`DeviceProfile.order`), ``"executor"`` without a device.
        allocator: ``"exact"``: the peak of live bytes (each allocation rounded
            to 256 bytes); ``"bfc"``: replay TF's BFC allocator over a few steps
            and report its peak bytes in use, internal fragmentation included
            (`lms.sim.bfc`; Python, about 100x slower).
        timeline: keep what `SimResult.timeline` needs (built on first access).
        exact: a memory-scheduled step runs its schedule's order exactly (its
            executed graph pinned whole, `lms.tf.exact`); ``None``: on a CPU
            device (`exact_on`), not on a GPU or without a device.

    Returns:
        A frozen `SimResult` (all figures predicted).
    """
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch={batch!r}: must be an integer >= 1")
    dev = get_device(device) if device is not None else None
    resolved = resolve_plan(graph, plan, kernels=plan_kernels(dev))
    temporaries = default_temporaries(dev) if temporaries is None else temporaries
    if order is None:
        order = dev.order if dev is not None else "executor"
    cg = compiled_for(graph, resolved, order=order, temporaries=temporaries, resident_bytes=resident_bytes,
                      expensive_op_bytes=dev.expensive_op_bytes if dev is not None else None,
                      exact=exact_on(dev) if exact is None else exact,
                      layout_transposes=layout_transposes_on(graph, dev))
    costs = cost_array(cg, op_costs, op_costs_batch, batch)
    return run(cg, batch, device=dev, op_costs=costs, want_timeline=timeline, allocator=allocator)


def default_temporaries(device: DeviceProfile | None) -> TemporaryModel:
    """The scratch model for `device`'s kernels (oneDNN's CPU kernels without a device)."""
    return TEMPORARIES[device.kernels] if device is not None else DEFAULT_TEMPORARIES


def cost_array(cg: CompiledGraph, op_costs: Mapping[str, float] | OpCosts | None,
                measured_batch: int | None, batch: int) -> np.ndarray | None:
    """Each op's seconds at `batch` from measured or given op costs (None: the device model's roofline)."""
    names = _timed_names(cg)
    if isinstance(op_costs, OpCosts):
        return op_costs.seconds(names, batch)
    if not op_costs:
        return None
    scale = batch / measured_batch if measured_batch else 1.0
    return np.fromiter((op_costs.get(n, math.nan) for n in names), dtype=float, count=len(names)) * scale


def _timed_names(cg: CompiledGraph) -> tuple[str, ...]:
    """Op names to look measured times up by: a recompute clone takes its original's time."""
    rp = cg.plan.recompute if cg.plan is not None else None
    if rp is None or not rp.recomputes:
        return cg.op_names
    names = _TIMED_NAMES.get(cg)
    if names is None:
        original = {c.name: c.op for r in rp.recomputes for c in r.clones}
        names = _TIMED_NAMES[cg] = tuple(original.get(n, n) for n in cg.op_names)
    return names


_TIMED_NAMES: "weakref.WeakKeyDictionary[CompiledGraph, tuple[str, ...]]" = weakref.WeakKeyDictionary()


def run(cg: CompiledGraph, batch: int, *, device: DeviceProfile | None = None,
        op_costs: np.ndarray | None = None, want_timeline: bool = True,
        allocator: str = "exact") -> SimResult:
    """One batch size over a compiled graph (the interpreter proper)."""
    n = cg.n_positions
    b = batch
    sizes = _rounded(cg.buf_fixed + b * cg.buf_ps, cg.round_to)
    temp = _rounded(np.ceil(cg.temp_fixed + b * cg.temp_ps).astype(np.int64), cg.round_to)

    # ---- time: compute stream + one copy engine per direction
    dur = _durations(cg, b, device, op_costs)
    out_bytes = cg.buf_fixed[cg.swap_out_host_buf] + b * cg.buf_ps[cg.swap_out_host_buf] \
        if cg.swap_out_pos.size else np.zeros(0, dtype=np.int64)
    in_bytes = cg.buf_fixed[cg.swap_in_buf] + b * cg.buf_ps[cg.swap_in_buf] \
        if cg.swap_in_pos.size else np.zeros(0, dtype=np.int64)
    synchronous = device is not None and not device.async_copies
    if synchronous:  # copies are ops of their own on the one stream (CPU emulation)
        dur[cg.swap_out_pos] = device.transfer_latency_s + out_bytes / device.link_bandwidth
        dur[cg.swap_in_pos] = device.transfer_latency_s + in_bytes / device.link_bandwidth
    compute_before = np.concatenate(([0.0], np.cumsum(dur)))
    out_start = compute_before[cg.swap_out_pos] if synchronous else np.zeros(len(out_bytes))
    out_done = compute_before[cg.swap_out_pos + 1] if synchronous else np.zeros(len(out_bytes))
    in_start = compute_before[cg.swap_in_pos] if synchronous else np.zeros(len(in_bytes))
    in_done = compute_before[cg.swap_in_pos + 1] if synchronous else np.zeros(len(in_bytes))
    stall_pos: list[int] = []
    stall_len: list[float] = []
    if cg.events and not synchronous and (device is not None or op_costs is not None):
        link = device.link_bandwidth if device is not None else math.inf
        latency = device.transfer_latency_s if device is not None else 0.0
        out_xfer = (latency + out_bytes / link).tolist()
        in_xfer = (latency + in_bytes / link).tolist()
        base_list = compute_before.tolist()
        src = cg.swap_in_out_index.tolist()
        waits = cg.waits
        stall = 0.0
        d2h_free = h2d_free = 0.0
        o_start, o_done = out_start.tolist(), out_done.tolist()
        i_start, i_done = in_start.tolist(), in_done.tolist()
        for pos, kind, idx in cg.events:
            base = base_list[pos] + stall
            if kind == 0:  # swap-out: after the work enqueued before it, on the D2H engine
                s = base if base > d2h_free else d2h_free
                o_start[idx] = s
                d2h_free = o_done[idx] = s + out_xfer[idx]
            elif kind == 1:  # swap-in: also after its swap-out, on the H2D engine
                s = base if base > h2d_free else h2d_free
                j = src[idx]
                if j >= 0 and o_done[j] > s:
                    s = o_done[j]
                i_start[idx] = s
                h2d_free = i_done[idx] = s + in_xfer[idx]
            else:  # an op reading swap-ins waits for their copies (j < 0: for swap-out -1 - j)
                need = 0.0
                for j in waits[idx]:
                    d = i_done[j] if j >= 0 else o_done[-1 - j]
                    if d > need:
                        need = d
                if need > base:
                    stall += need - base
                    stall_pos.append(pos)
                    stall_len.append(need - base)
        out_start, out_done = np.asarray(o_start), np.asarray(o_done)
        in_start, in_done = np.asarray(i_start), np.asarray(i_done)
    stalls = np.zeros(n)
    if stall_pos:
        np.add.at(stalls, stall_pos, stall_len)
    start = compute_before[:n] + np.cumsum(stalls)
    compute_time = float(compute_before[-1])
    stall_time = float(stalls.sum())
    step_time = compute_time + stall_time
    if out_done.size:
        step_time = max(step_time, float(out_done.max()))
    if in_done.size:
        step_time = max(step_time, float(in_done.max()))

    # ---- memory: each buffer is live from its producer to its last reader; a swapped
    # tensor's device copy also until its device->host copy is done
    free = cg.buf_free
    if device is not None and not synchronous and cg.swap_out_pos.size:
        ok = cg.swap_out_src_buf >= 0
        release = np.searchsorted(start, out_done[ok], side="left") - 1
        free = free.copy()
        src = cg.swap_out_src_buf[ok]
        np.maximum.at(free, src, release)
    device_mask = ~cg.buf_host
    live = _live(n, cg.buf_alloc[device_mask], free[device_mask], sizes[device_mask])
    host = _live(n, cg.buf_alloc[cg.buf_host], free[cg.buf_host], sizes[cg.buf_host])
    resident = cg.resident_fixed + b * cg.resident_ps
    device_bytes = live + temp + resident
    peak_index = int(np.argmax(device_bytes)) if n else 0
    peak = int(device_bytes[peak_index]) if n else resident
    if allocator == "bfc":
        peak = _bfc_peak(cg, sizes, free, temp)
    elif allocator != "exact":
        raise ValueError(f"allocator={allocator!r}: allowed values are 'exact', 'bfc'")
    peak_host_index = int(np.argmax(host)) if n else 0
    peak_host = int(host[peak_host_index]) if n else 0

    trace = Trace(cg, start, device_bytes, host, out_start, out_done, in_start, in_done,
                   out_bytes, in_bytes, stall_pos, stall_len) if want_timeline else None
    return SimResult(
        batch=b, peak_device_bytes=peak, peak_host_bytes=peak_host, step_time_s=step_time,
        compute_time_s=compute_time, stall_time_s=stall_time,
        transfer_bytes=int(out_bytes.sum() + in_bytes.sum()),
        peak_op=cg.op_names[peak_index] if n else "", peak_index=peak_index, resident_bytes=int(resident),
        peak_temporary_bytes=int(temp[peak_index]) if n else 0,
        n_swap_outs=int(cg.swap_out_pos.size), n_swap_ins=int(cg.swap_in_pos.size),
        peak_host_index=peak_host_index, peak_host_op=cg.op_names[peak_host_index] if n and peak_host else "",
        _trace=trace)


def _bfc_peak(cg: CompiledGraph, sizes: np.ndarray, free: np.ndarray, temp: np.ndarray) -> int:
    """Peak bytes in use of TF's BFC allocator replayed over this step (see `lms.sim.bfc`)."""
    transient = ~cg.buf_host & ~cg.buf_pinned
    ids = np.flatnonzero(transient)
    remap = {int(old): new for new, old in enumerate(ids)}
    steals = [(p, remap[v], r) for p, v, r in cg.steals if v in remap]
    pinned = cg.buf_pinned & ~cg.buf_host
    if cg.resident_fixed != sum(-(-x // cg.round_to) * cg.round_to for x in cg.resident_sizes):
        resident = [cg.resident_fixed]  # an explicit resident_bytes: one block
        steals = []
    else:
        resident = list(cg.resident_sizes)
    replay = replay_bfc(resident_sizes=resident, pinned_sizes=sizes[pinned].tolist(),
                        alloc=cg.buf_alloc[ids], free=free[ids], sizes=sizes[ids], temp=temp,
                        steals=steals, n_positions=cg.n_positions)
    return replay.peak_bytes_in_use


def _rounded(sizes: np.ndarray, to: int) -> np.ndarray:
    """Allocation sizes as the allocator hands them out: rounded up to `to` bytes."""
    return -(-sizes // to) * to if to > 1 else sizes


def _live(n: int, alloc: np.ndarray, free: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Bytes live during each position: +size at alloc, -size after free, prefix-summed."""
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, alloc, sizes)
    np.add.at(delta, free + 1, -sizes)
    return np.cumsum(delta[:n])


def _durations(cg: CompiledGraph, b: int, device: DeviceProfile | None,
               op_costs: np.ndarray | None) -> np.ndarray:
    n = cg.n_positions
    if device is None:
        dur = np.zeros(n)
    else:
        moved = cg.bytes_fixed + b * cg.bytes_ps
        t_mem = moved / (device.mem_bandwidth * device.memory_efficiency)
        flops = cg.flops_fixed + b * cg.flops_ps
        # only convolutions and matmuls have FLOPs: TF runs them in TF32 where the GPU has it
        t_flop = np.nan_to_num(flops / (device.matmul_flops * device.compute_efficiency), nan=0.0)
        dur = np.maximum(t_mem, t_flop) + device.op_overhead_s
        dur[cg.zero_cost] = 0.0
    if op_costs is not None:
        dur = np.where(np.isnan(op_costs), dur, op_costs)
    return dur
