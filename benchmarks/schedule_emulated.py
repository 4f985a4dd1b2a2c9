"""The pinned order (``schedule="memory"``) on the emulated device: every figure MEASURED on this CPU.

Real TensorFlow training steps, each configuration in a fresh process, run as
the tuner's emulated trials run them: TF's CPU BFC allocator is the "device"
(byte-exact peaks), swap ops are `lms.tf.emulate` copies out of that allocator,
TF's single-threaded executor (`lms.tf.measure.measure_step(...,
executor="single_threaded")`), one inter-op thread, the batch dimension left
unknown when tracing (one trace per process). Three figures (issue 14):

1. repeatability: per zoo model at its small settings, one config with the
   order pinned, measured in 3 separate processes; target: the per-step peaks
   of all processes within 1% of each other (each process's peak, and each
   timed step's; how far one process's steps differ from each other is
   printed beside it);
2. pinning cost: ResNet-50 64x64, the order pinned with nothing swapped
   (``n_tensors=0, schedule="memory"``) versus plain; target: median step time
   at most 5% longer (processes alternate, so drift hits both);
3. max batch under the tuner's default emulated budget
   (`tuner.graphs.derive_emulated_budget` of ResNet-50 64x64), found by the
   tuner's own max-batch search (a `tuner.trial` worker per config), without
   LMS and with LMS (TF's order, and the memory schedule); target: >= 4.5x the
   batch at >= 0.8x the throughput.

``--parts causes`` explains figure 1 from TF's allocator log (small models, 2
processes each, oneDNN on and off): whether the executed allocation sequence
(the op order) is the same in every step and every process, and how far the
allocator's peak (chunk bytes) and the requested-bytes peak spread.

    nice -n 10 python benchmarks/schedule_emulated.py                # all three (about 30-60 min on 2 cores)
    nice -n 10 python benchmarks/schedule_emulated.py --parts repeat cost
    nice -n 10 python benchmarks/schedule_emulated.py --parts causes   # why the peaks do not repeat

Prints a summary and writes benchmarks/results/schedule_emulated.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lms import LMSConfig  # noqa: E402
from lms.config import atomic_write_text  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "schedule_emulated.json"
WORKDIR = ROOT / "benchmarks" / "results" / "cache" / "schedule_emulated"
LABEL = "MEASURED"
MiB = 1 << 20

# The zoo at small settings (CPU-sized), and the batch each is measured at for repeatability.
ZOO: dict[str, tuple[dict[str, Any], int]] = {
    "mlp": ({}, 64),
    "cnn_bn": ({}, 32),
    "residual": ({}, 32),
    "resnet50": ({"image_size": 64}, 16),
    "unet3d": ({"input_size": 16, "base_filters": 4, "levels": 3}, 2),
    "gpt2_small": ({"seq_len": 64, "n_layers": 2, "d_model": 64, "n_heads": 2, "vocab_size": 1000,
                    "n_positions": 64}, 8),
}
REPEAT_CONFIG = LMSConfig(n_tensors=-1, lb=3, schedule="memory")
REPEAT_PROCESSES = 3
REPEAT_STEPS = 5
REPEAT_TARGET = 0.01
COST_MODEL = ("resnet50", {"image_size": 64}, 32)
COST_CONFIGS = {"plain": LMSConfig(n_tensors=0), "pinned": LMSConfig(n_tensors=0, schedule="memory")}
COST_ROUNDS = 3
COST_TARGET = 1.05
BATCH_MODEL = ("resnet50", {"image_size": 64})
BATCH_CONFIGS = {
    "no LMS": LMSConfig(n_tensors=0),
    "LMS, TF's order": LMSConfig(n_tensors=-1, lb=3),
    "LMS, memory schedule": LMSConfig(n_tensors=-1, lb=3, schedule="memory"),
}
BATCH_TARGET = 4.5
THROUGHPUT_TARGET = 0.8


# ---------------------------------------------------------------- child: one measurement (TensorFlow)

def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Trace `spec`'s model once under `lms.function` and measure steps at `spec["batch"]`."""
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(1)  # as tuner.trial's emulated backend
    from lms.schedule import schedule_ops
    from lms.tf.measure import measure_step

    config = LMSConfig.from_dict(spec["config"])
    fn, data = _traced_step(spec)
    m = measure_step(fn, [data], warmup=2, steps=spec["steps"], device="/CPU:0", executor="single_threaded",
                     live=bool(spec.get("live")))
    out = {"step_peaks_bytes": list(m.step_peaks_bytes), "step_times_s": list(m.step_times_s),
           "median_step_s": m.median_step_s, "n_swapped": fn.summary.n_swapped if fn.summary else 0,
           "live_peak_bytes": m.live_peak_bytes, "pinned_whole": fn.pinned_whole is not None,
           "whole_reason": fn.whole_reason}
    if config.pins_order and fn.graph is not None:
        sched = schedule_ops(fn.graph, fn.plan)
        out.update(n_pins=len(sched.pins), n_dropped=len(sched.dropped), chosen=sched.chosen)
    return out


def _traced_step(spec: dict[str, Any]) -> tuple[Any, tuple[Any, Any]]:
    """`spec`'s training step under `lms.function` (emulated swaps, batch dim unknown) and one batch."""
    import lms
    from lms.tf.measure import device_batch
    from lms.tf.train import make_train_step
    from tuner.models import load_workload

    workload = load_workload(spec["model"], **spec["options"])
    step = make_train_step(workload.build_model(), workload.loss_fn, workload.make_optimizer())
    fn = lms.function(step, config=LMSConfig.from_dict(spec["config"]), emulate=True,
                      input_signature=[workload.x_spec(), workload.y_spec()], autograph=False)
    x, y = workload.make_batch(spec["batch"], 0)
    return fn, device_batch((x, y), "/CPU:0")


def _run_child(spec: dict[str, Any], *, timeout: float = 1800) -> dict[str, Any]:
    env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="true", TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
               TF_ENABLE_ONEDNN_OPTS=os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1"),  # as the emulated workers
               PYTHONPATH=str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"child {spec['model']} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- the three parts

def repeatability(models: list[str]) -> list[dict[str, Any]]:
    rows = []
    for name in models:
        options, batch = ZOO[name]
        runs = [_run_child({"model": name, "options": options, "config": REPEAT_CONFIG.to_dict(), "batch": batch,
                            "steps": REPEAT_STEPS, "live": True}) for _ in range(REPEAT_PROCESSES)]
        per_step = [r["step_peaks_bytes"] for r in runs]
        peaks = [max(p) for p in per_step]  # each process's peak, as a trial reports it (its steps' largest)
        spread = _spread(peaks)
        step_spread = max(_spread([p[k] for p in per_step]) for k in range(REPEAT_STEPS))
        drift = max(_spread(p) for p in per_step)
        lives = [r["live_peak_bytes"] for r in runs]
        live_spread = _spread(lives)
        row = {"model": name, "options": options, "batch": batch, "processes": REPEAT_PROCESSES,
               "pinned_whole": all(r["pinned_whole"] for r in runs),
               "whole_reason": next((r["whole_reason"] for r in runs if r["whole_reason"]), ""),
               "per_process_live_peak_bytes": lives, "live_spread": live_spread,
               "live_within_target": live_spread <= REPEAT_TARGET,
               "per_process_step_peaks_bytes": per_step, "per_process_peak_bytes": peaks,
               "spread": spread, "step_spread": step_spread, "within_target": max(spread, step_spread) <= REPEAT_TARGET,
               "drift_within_process": drift,
               "n_swapped": runs[0]["n_swapped"], "n_pins": runs[0].get("n_pins"), "chosen": runs[0].get("chosen")}
        print(f"  repeat {name:10s} batch {batch:3d} ({'pinned whole' if row['pinned_whole'] else 'partial pins'}): "
              f"TF's allocator peak {min(peaks) / MiB:.4f}-{max(peaks) / MiB:.4f} MiB across processes, spread "
              f"{spread:.3%} (step by step {step_spread:.3%}; from step to step within a process {drift:.2%}); "
              f"live bytes spread {live_spread:.3%} ({row['n_swapped']} swapped)", flush=True)
        rows.append(row)
    return rows


def pinning_cost() -> dict[str, Any]:
    name, options, batch = COST_MODEL
    times: dict[str, list[float]] = {k: [] for k in COST_CONFIGS}
    peaks: dict[str, list[int]] = {k: [] for k in COST_CONFIGS}
    extra: dict[str, Any] = {}
    for _ in range(COST_ROUNDS):
        for key, config in COST_CONFIGS.items():
            r = _run_child({"model": name, "options": options, "config": config.to_dict(), "batch": batch, "steps": 5})
            times[key].append(r["median_step_s"])
            peaks[key].extend(r["step_peaks_bytes"])
            if "n_pins" in r:
                extra = {"n_pins": r["n_pins"], "chosen": r["chosen"]}
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["pinned"] / med["plain"]
    print(f"  cost {name} batch {batch}: plain {med['plain']:.3f} s, pinned {med['pinned']:.3f} s "
          f"-> {ratio:.3f}x; peaks {max(peaks['plain']) / MiB:.1f} / {max(peaks['pinned']) / MiB:.1f} MiB", flush=True)
    return {"model": name, "options": options, "batch": batch, "rounds": COST_ROUNDS,
            "median_step_s_per_round": times, "median_step_s": med, "step_time_ratio": ratio,
            "within_target": ratio <= COST_TARGET, "peak_bytes": {k: max(v) for k, v in peaks.items()}, **extra}


def max_batches(runs: int) -> dict[str, Any]:
    from lms.graph import Graph
    from tuner.graphs import derive_emulated_budget
    from tuner.worker.protocol import TraceRequest
    from tuner.worker.run import run_worker, worker_env

    name, options = BATCH_MODEL
    WORKDIR.mkdir(parents=True, exist_ok=True)
    graph_path = WORKDIR / f"{name}.graph.json"
    out = run_worker(TraceRequest(workload=name, options=options, output=str(graph_path)),
                     workdir=WORKDIR / "trace", timeout_s=1200, env=worker_env())
    if out.status != "ok":
        raise SystemExit(f"tracing {name} failed: {out.reason}")
    graph = Graph.from_dict(json.loads(graph_path.read_text())["graph"])
    budget = derive_emulated_budget(graph)
    all_runs = [_max_batch_run(graph, name, options, budget) for _ in range(runs)]
    rows = {key: {**all_runs[0][key],
                  "batch": statistics.median(r[key]["batch"] for r in all_runs),
                  "throughput": statistics.median(r[key]["throughput"] for r in all_runs),
                  "runs": [{k: r[key][k] for k in ("batch", "throughput", "peak_device_bytes", "status")}
                           for r in all_runs]} for key in BATCH_CONFIGS}
    base = rows["no LMS"]
    summary = {}
    for key in ("LMS, TF's order", "LMS, memory schedule"):
        r = rows[key]
        summary[key] = {"batch_ratio": r["batch"] / base["batch"] if base["batch"] else None,
                        "throughput_ratio": r["throughput"] / base["throughput"] if base["throughput"] else None,
                        "per_run": [{"batch_ratio": a[key]["batch"] / a["no LMS"]["batch"] if a["no LMS"]["batch"] else None,
                                     "throughput_ratio": a[key]["throughput"] / a["no LMS"]["throughput"]
                                     if a["no LMS"]["throughput"] else None} for a in all_runs]}
        print(f"  {key}: median batch {summary[key]['batch_ratio']:.2f}x at {summary[key]['throughput_ratio']:.2f}x "
              f"throughput ({runs} runs)", flush=True)
    mem = summary["LMS, memory schedule"]
    return {"model": name, "options": options, "budget_bytes": budget, "runs": runs,
            "statistic": "median over runs (each config once per run, in turn)", "rows": rows, "ratios": summary,
            "within_target": bool(mem["batch_ratio"] and mem["batch_ratio"] >= BATCH_TARGET
                                  and mem["throughput_ratio"] >= THROUGHPUT_TARGET)}


def _max_batch_run(graph: Any, name: str, options: dict[str, Any], budget: int) -> dict[str, Any]:
    from lms import plan_swaps
    from lms.simulator import max_batch
    from tuner.worker.protocol import MeasureRequest
    from tuner.worker.run import run_worker, worker_env

    rows = {}
    for key, config in BATCH_CONFIGS.items():
        predicted = max_batch(graph, plan_swaps(graph, config), budget, device="cpu").batch
        request = MeasureRequest(workload=name, options=options, config=config.to_dict(), backend="emulated",
                                 usable_bytes=budget, start_batch=max(1, predicted), cap=4096, warmup=2, steps=3,
                                 seed=0, resolution=0.05, max_probes=6, probe_warmup=2, probe_steps=2)
        t0 = time.perf_counter()
        result = run_worker(request, workdir=WORKDIR / key.replace(" ", "_").replace(",", "").replace("'", ""),
                            timeout_s=3600, env=worker_env())
        r = result.result.to_dict() if result.result is not None else {}
        rows[key] = {"config": config.to_dict(), "predicted_batch": predicted, "status": result.status,
                     "batch": r.get("batch_size", 0), "throughput": r.get("throughput", 0.0),
                     "peak_device_bytes": r.get("peak_device_bytes"), "step_time_median_s": r.get("step_time_median_s"),
                     "probes": (r.get("search") or {}).get("probes"), "wall_s": round(time.perf_counter() - t0, 1)}
        print(f"  max batch {key:22s}: {rows[key]['batch']} (predicted {predicted}), "
              f"{rows[key]['throughput']:.1f} samples/s [{rows[key]['wall_s']:.0f} s]", flush=True)
    return rows


# ---------------------------------------------------------------- why the peaks do not repeat

# `--parts causes`: the same step in fresh processes with TF's BFC allocator logging every allocation
# (TF_CPP_VMODULE=bfc_allocator=3: requested sizes, no stack traces). Steps are told apart by a marker
# allocation made between them. Per step: the allocator's peak (what `measure_step` reports: chunk
# bytes, internal fragmentation included), the peak of the *requested* bytes, and a digest of the
# allocation sequence (the executed op order, as the allocator saw it).
CAUSE_MODELS = ("mlp", "cnn_bn", "residual", "resnet50")
CAUSE_PROCESSES = 2
_MARKER_ELEMENTS = 77777  # float32: 311,108 bytes, a size no zoo step allocates
_ALLOC_LINE = re.compile(r"\] (AllocateRaw|DeallocateRaw) \S+\s+(\d+)$")


def cause_child(spec: dict[str, Any]) -> dict[str, Any]:
    """`spec`'s step under the single-threaded executor, a marker allocation before each step."""
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(1)
    fn, data = _traced_step(spec)
    peaks = []
    with tf.experimental.function_executor_type("SINGLE_THREADED_EXECUTOR"):
        for _ in range(spec["steps"]):
            marker = tf.fill([_MARKER_ELEMENTS], 0.0)
            tf.config.experimental.reset_memory_stats("CPU:0")
            tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, fn(*data))
            peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"])
            del marker
    tf.fill([_MARKER_ELEMENTS], 0.0)  # closes the last step
    return {"bfc_peaks_bytes": peaks}


def _allocation_steps(log_text: str) -> list[list[tuple[str, int]]]:
    """The allocator's log split at the marker allocations: per step, ``(kind, requested bytes)`` in order."""
    steps: list[list[tuple[str, int]]] = []
    current: list[tuple[str, int]] | None = None
    for line in log_text.splitlines():
        m = _ALLOC_LINE.search(line)
        if not m:
            continue
        kind, size = m.group(1)[0], int(m.group(2))
        if kind == "A" and size == _MARKER_ELEMENTS * 4:
            current = []
            steps.append(current)
        elif current is not None:
            current.append((kind, size))
    return steps


def _requested_peak(events: list[tuple[str, int]]) -> int:
    live = peak = 0
    for kind, size in events:
        live += size if kind == "A" else -size
        peak = max(peak, live)
    return peak


def _spread(values: list[int]) -> float:
    return (max(values) - min(values)) / min(values) if values and min(values) > 0 else 0.0


def causes(models: list[str]) -> dict[str, Any]:
    import hashlib

    rows = []
    for name in models:
        options, batch = ZOO[name]
        for onednn in (True, False):
            procs = []
            for _ in range(CAUSE_PROCESSES):
                spec = {"model": name, "options": options, "config": REPEAT_CONFIG.to_dict(), "batch": batch,
                        "steps": 4}
                env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="true", TF_CPP_MIN_LOG_LEVEL="0",
                           TF_CPP_VMODULE="bfc_allocator=3", TF_ENABLE_ONEDNN_OPTS="1" if onednn else "0",
                           CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
                proc = subprocess.run([sys.executable, __file__, "--cause-child", json.dumps(spec)], cwd=ROOT,
                                      env=env, capture_output=True, text=True, timeout=1800)
                if proc.returncode != 0:
                    raise RuntimeError(f"child {name} failed:\n{proc.stderr[-3000:]}")
                bfc = json.loads(proc.stdout.strip().splitlines()[-1])["bfc_peaks_bytes"]
                steps = _allocation_steps(proc.stderr)[1:-1]  # the first instantiates the function; the end
                procs.append({"bfc_peaks_bytes": bfc[1:], "requested_peaks_bytes": [_requested_peak(s) for s in steps],
                              "sequence_digests": [hashlib.sha1(repr(s).encode()).hexdigest()[:12] for s in steps]})
            same_order_in_process = all(len(set(p["sequence_digests"])) == 1 for p in procs)
            same_order_across = len({d for p in procs for d in p["sequence_digests"]}) == 1
            row = {"model": name, "batch": batch, "onednn": onednn, "processes": procs,
                   "same_order_within_each_process": same_order_in_process,
                   "same_order_across_processes": same_order_across,
                   "bfc_spread_within_process": max(_spread(p["bfc_peaks_bytes"]) for p in procs),
                   "requested_spread_within_process": max(_spread(p["requested_peaks_bytes"]) for p in procs),
                   "bfc_spread_across_processes": _spread([v for p in procs for v in p["bfc_peaks_bytes"]]),
                   "requested_spread_across_processes": _spread([v for p in procs
                                                                 for v in p["requested_peaks_bytes"]])}
            print(f"  {name:9s} oneDNN {'on ' if onednn else 'off'}: order same in each process "
                  f"{same_order_in_process}, across {same_order_across}; BFC peak spread "
                  f"{row['bfc_spread_within_process']:.1%} in a process, {row['bfc_spread_across_processes']:.1%} "
                  f"across; requested-bytes peak spread {row['requested_spread_within_process']:.2%} / "
                  f"{row['requested_spread_across_processes']:.2%}", flush=True)
            rows.append(row)
    return {"config": REPEAT_CONFIG.to_dict(), "processes": CAUSE_PROCESSES, "rows": rows,
            "method": "TF_CPP_VMODULE=bfc_allocator=3 logs every allocation's requested size; steps split at a "
                      "marker allocation; steps after the first (which instantiates the function)"}


# ---------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=("repeat", "cost", "batch", "causes"),
                        default=["repeat", "cost", "batch"],
                        help="which figures to measure (default: the three targets; 'causes': why peaks do not "
                             "repeat, from the allocator's log)")
    parser.add_argument("--models", nargs="+", choices=list(ZOO), default=list(ZOO),
                        help="zoo models for the repeatability part")
    parser.add_argument("--batch-runs", type=int, default=3,
                        help="max-batch searches per config (the figures are medians; default 3)")
    parser.add_argument("--child", type=str, help=argparse.SUPPRESS)
    parser.add_argument("--cause-child", type=str, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    if args.cause_child:
        print(json.dumps(cause_child(json.loads(args.cause_child))))
        return 0
    doc: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    doc.update({"label": LABEL, "device": "emulated (CPU, TF BFC allocator, single-threaded executor)",
                "targets": {"repeat_spread": REPEAT_TARGET, "pinning_step_time_ratio": COST_TARGET,
                            "batch_ratio": BATCH_TARGET, "throughput_ratio": THROUGHPUT_TARGET}})
    t0 = time.perf_counter()
    if "repeat" in args.parts:
        print("repeatability (per-step peak, 3 processes):", flush=True)
        new = repeatability(args.models)
        kept = [r for r in (doc.get("repeatability") or {}).get("rows", []) if r["model"] not in args.models]
        rows = sorted(kept + new, key=lambda r: list(ZOO).index(r["model"]))
        doc["repeatability"] = {"config": REPEAT_CONFIG.to_dict(), "rows": rows,
                                "live_all_within_target": all(r.get("live_within_target") for r in rows),
                                "all_within_target": all(r["within_target"] for r in rows),
                                "figures": "spread: (max - min) / min across processes of each process's TF BFC "
                                           "allocator peak (the largest of its timed steps, as a trial reports "
                                           "it); step_spread: the same for each timed step, worst step; "
                                           "drift_within_process: how far one process's steps differ from each "
                                           "other (TF's allocator history; the same in every process); live: "
                                           "requested bytes live at the worst moment of one profiled step "
                                           "(lms.tf.live), one per process"}
    if "cost" in args.parts:
        print("pinning cost (n_tensors=0, schedule='memory' vs plain):", flush=True)
        doc["pinning_cost"] = pinning_cost()
    if "causes" in args.parts:
        print("why per-step peaks do not repeat (allocator log, 2 processes, oneDNN on and off):", flush=True)
        models = [m for m in args.models if m in CAUSE_MODELS] or list(CAUSE_MODELS)
        new = causes(models)
        kept = [r for r in (doc.get("causes") or {}).get("rows", []) if r["model"] not in models]
        new["rows"] = sorted(kept + new["rows"], key=lambda r: (list(ZOO).index(r["model"]), not r["onednn"]))
        doc["causes"] = new
    if "batch" in args.parts:
        print("max batch under the tuner's default emulated budget:", flush=True)
        doc["max_batch"] = max_batches(args.batch_runs)
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    atomic_write_text(RESULTS, json.dumps(doc, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
