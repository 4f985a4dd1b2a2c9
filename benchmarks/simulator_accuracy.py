"""Simulator accuracy: measured TensorFlow CPU peaks (BFC allocator) versus simulated peaks.

Each measurement runs in a fresh subprocess (``--child``) with
``TF_CPU_ALLOCATOR_USE_BFC=true`` (byte-exact ``get_memory_info``) and
``TF_ENABLE_ONEDNN_OPTS=0`` set before TensorFlow is imported: oneDNN would fuse
ops on CPU and hide small allocations from the statistics, so the executed
graph would differ from the traced one the simulator reads. Grappler's
default optimisations stay on (they are what users run).

The child traces the step, writes the graph model (JSON, gzip) and the
measured peak after warm-up; the parent (no TensorFlow) simulates the same
graph and plan and compares. Results are cached per case, so a re-run only
re-simulates (``--remeasure`` to measure again).

The targets are judged on steps run under TF's single-threaded executor
(``measure_step(executor="single_threaded")``, as the tuner's emulated device
runs), simulated with ``order="single_threaded"``: its op order is fixed by
the graph, so a peak repeats from step to step and (mostly) from process to
process. The same cases under TF's default executor (one inter-op thread)
are measured and printed beside them: there the order depends on timing and
one case's peak spreads by up to ~50% across processes, so no single
simulated order can match it.

Two simulated figures per case: ``bfc`` replays TF's BFC allocator with the
resident bytes the graph shows (weights, optimizer slots, constants): a
prediction from the graph alone. ``bfc_on_start`` puts the same simulated
step on top of the bytes the measuring process had in use when the step
began (measured before the step runs: inputs the caller holds, TF's own
cached constants, allocator state), which the graph does not show.

    .venv/bin/python benchmarks/simulator_accuracy.py            # all cases
    .venv/bin/python benchmarks/simulator_accuracy.py --quick    # small models only
    .venv/bin/python benchmarks/simulator_accuracy.py --schedule-rows [--quick]

``--schedule-rows`` measures only the same cases with the order pinned
(``schedule="memory"``; the no-swap cases as ``n_tensors=0``), single-threaded
executor, target 5% for every case, and adds them to the JSON under
``schedule_memory`` (the other rows are kept as they are).

Writes benchmarks/results/simulator_accuracy.json and prints a table plus the
simulator's own speed on ResNet-50 (one simulation, one max_batch search).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lms import LMSConfig, plan_swaps  # noqa: E402
from lms.plan import Swap, SwapIn, SwapPlan  # noqa: E402
from lms.config import atomic_write_text  # noqa: E402
from lms.graph import Graph  # noqa: E402
from lms.sim.costs import ONEDNN_TEMPORARIES  # noqa: E402
from lms.simulator import CPU_TEMPORARIES, NO_TEMPORARIES, max_batch, simulate  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lms" / "simulator_accuracy"
MiB = 1 << 20

# (model, options, batches): no-swap peaks, target |error| <= 5%.
NO_SWAP_CASES: list[tuple[str, dict[str, Any], tuple[int, ...]]] = [
    ("mlp", {"input_dim": 1024, "hidden": 2048, "n_layers": 3}, (32, 128, 512)),
    ("cnn_bn", {"image_size": 64, "filters": 32}, (4, 16, 32)),
    ("resnet50", {"image_size": 224}, (2, 4, 8)),
]
# (model, options, batch, config): emulated-swap peaks, target |error| <= 10%.
SWAP_CASES: list[tuple[str, dict[str, Any], int, dict[str, Any]]] = [
    ("cnn_bn", {"image_size": 64, "filters": 32}, 16, {"n_tensors": -1, "lb": 1}),
    ("cnn_bn", {"image_size": 64, "filters": 32}, 16, {"n_tensors": 4, "lb": 1}),
    ("cnn_bn", {"image_size": 64, "filters": 32}, 16, {"n_tensors": -1, "lb": 3}),
    ("cnn_bn", {"image_size": 64, "filters": 32}, 16, {"n_tensors": -1, "lb": 2, "fuse_swapins": True}),
    ("residual", {"image_size": 64, "filters": 32, "n_blocks": 4}, 16, {"n_tensors": -1, "lb": 1}),
    ("residual", {"image_size": 64, "filters": 32, "n_blocks": 4}, 16, {"n_tensors": 10, "lb": 2}),
    ("residual", {"image_size": 64, "filters": 32, "n_blocks": 4}, 16,
     {"n_tensors": -1, "lb": 1, "ctrld_strategy": "direct_order"}),
    ("residual", {"image_size": 64, "filters": 32, "n_blocks": 4}, 16,
     {"n_tensors": -1, "lb": 2, "swap_branches": True, "branch_threshold": 3}),
    ("resnet50", {"image_size": 224}, 4, {"n_tensors": -1, "lb": 1}),
    ("resnet50", {"image_size": 224}, 4, {"n_tensors": 100, "lb": 5}),
    ("resnet50", {"image_size": 224}, 4, {"n_tensors": 30, "lb": 3, "fuse_swapins": True}),
    ("cnn_bn", {"image_size": 64, "filters": 32}, 16, {"n_tensors": 6, "lb": 2, "ctrld_strategy": "direct_order"}),
    ("residual", {"image_size": 64, "filters": 32, "n_blocks": 4}, 16, {"n_tensors": -1, "lb": 3, "fuse_swapins": True}),
]
QUICK_MODELS = ("mlp", "cnn_bn", "residual")
SCHEDULE_TARGET = 0.05
# TF executor a measurement runs under (measure_step(executor=...)) -> the simulator's order model
ORDER_FOR = {"default": "executor", "single_threaded": "single_threaded"}


# ---- child: one measurement in a fresh process (imports TensorFlow) ---------------------------
def child(spec: dict[str, Any], out: Path) -> None:
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = spec.get("onednn", "0")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    if spec.get("inter_op"):
        tf.config.threading.set_inter_op_parallelism_threads(spec["inter_op"])

    import lms
    from lms.tf.extract import trace_train_step
    from lms.tf.measure import device_batch, measure_step
    from lms.tf.train import make_train_step
    from tuner.models import load_workload

    w = load_workload(spec["model"], **spec["options"])
    model = w.build_model()
    optimizer = w.make_optimizer()
    x, y = device_batch(w.make_batch(spec["batch"], seed=0), "/CPU:0")
    t0 = time.perf_counter()
    if spec["config"] is None:
        graph, step = trace_train_step(model, w.loss_fn, optimizer, w.x_spec(), w.y_spec(),
                                       batch_size=spec["batch"], name=w.name)
        plan_summary = None
    else:
        step = lms.function(make_train_step(model, w.loss_fn, optimizer),
                            config=LMSConfig.from_dict(spec["config"]), emulate=True,
                            input_signature=[w.x_spec(), w.y_spec()])
        step.get_concrete_function(w.x_spec(), w.y_spec())
        graph = step.graph
        plan_summary = step.plan.summary()  # the plan applied, whatever the planner of the day
    trace_s = time.perf_counter() - t0
    m = measure_step(step, (x, y), warmup=2, steps=3, device="CPU:0", executor=spec.get("executor", "default"),
                     live=bool(spec.get("live")))
    graph_path = out.with_suffix(".graph.json.gz")
    with gzip.open(graph_path, "wt", encoding="utf-8") as fh:
        json.dump(graph.to_dict(), fh)
    result = {"spec": spec, "measured_peak_bytes": m.peak_device_bytes,
              "baseline_bytes": m.baseline_device_bytes, "median_step_s": m.median_step_s,
              "trace_s": trace_s, "graph": graph_path.name, "plan": plan_summary,
              "tf_version": tf.__version__, "peak_source": m.peak_source,
              "step_peaks_bytes": list(m.step_peaks_bytes), "live_peak_bytes": m.live_peak_bytes,
              "pinned_whole": getattr(step, "pinned_whole", None) is not None,
              "whole_reason": getattr(step, "whole_reason", "")}
    atomic_write_text(out, json.dumps(result, indent=1))


# ---- parent: measure (cached), simulate, compare -------------------------------------------
def _key(spec: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


# The code that decides and applies a swap plan: a swap measurement is cached per version of it.
SWAP_CODE = ("lms/plan/swap_planner.py", "lms/plan/candidates.py", "lms/plan/triggers.py", "lms/plan/swap_plan.py",
             "lms/tf/apply.py", "lms/tf/emulate.py")


def swap_code_version() -> str:
    """A digest of `SWAP_CODE` (a changed planner or rewriter invalidates cached swap measurements)."""
    h = hashlib.sha1()
    for rel in SWAP_CODE:
        h.update((ROOT / rel).read_bytes())
    return h.hexdigest()[:10]


# ... and a measurement with the order pinned, per version of that code plus the scheduling pass.
SCHEDULE_CODE = SWAP_CODE + ("lms/schedule/scheduler.py", "lms/schedule/edges.py", "lms/schedule/models.py",
                             "lms/schedule/candidate_orders.py", "lms/plan/anchor.py", "lms/tf/pin.py",
                             "lms/tf/function.py", "lms/tf/rewriter.py", "lms/schedule/exact_order.py",
                             "lms/tf/exact.py", "lms/tf/live.py")


def schedule_code_version() -> str:
    h = hashlib.sha1()
    for rel in SCHEDULE_CODE:
        h.update((ROOT / rel).read_bytes())
    return h.hexdigest()[:10]


def schedule_specs(repeats: int) -> list[dict[str, Any]]:
    """The accuracy cases again with ``schedule="memory"`` (no-swap cases: ``n_tensors=0``).

    As the tuner's emulated device runs them: oneDNN on, the step pinned whole
    (`lms.tf.exact`), the single-threaded executor; each measurement also
    reports the requested bytes live at the step's worst moment (`lms.tf.live`).
    """
    code = schedule_code_version()
    configs = [(m, o, b, {"n_tensors": 0, "schedule": "memory"}) for m, o, batches in NO_SWAP_CASES for b in batches]
    configs += [(m, o, b, {**c, "schedule": "memory"}) for m, o, b, c in SWAP_CASES]
    return [{"model": m, "options": o, "batch": b, "config": c, "inter_op": 1, "code": code, "repeat": i,
             "executor": "single_threaded", "onednn": "1", "live": True}
            for m, o, b, c in configs for i in range(repeats)]


def summarise_schedule(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts within `SCHEDULE_TARGET` for the pinned-order rows, no-swap and swap apart."""
    out: dict[str, Any] = {"target": SCHEDULE_TARGET}
    for kind, cases in (("no_swap", [r for r in rows if not r["n_swapped"]]), ("swap", [r for r in rows if r["n_swapped"]])):
        out[f"{kind}_cases"] = len(cases)
        out[f"{kind}_pinned_whole"] = sum(bool(r.get("pinned_whole")) for r in cases)
        live_spreads = [r["live_spread"] for r in cases if r.get("live_spread") is not None]
        out[f"{kind}_max_live_spread"] = max(live_spreads, default=None)
        for variant in ("bfc", "bfc_on_start", "simulated", "live"):
            if variant == "live" and not any("live_error" in r for r in cases):
                continue
            errors = [abs(r[f"{variant}_error"]) for r in cases]
            out[f"{kind}_{variant}_within_target"] = sum(e <= SCHEDULE_TARGET for e in errors)
            out[f"{kind}_{variant}_max_abs_error"] = max(errors, default=None)
        spreads = [r["measured_spread"] for r in cases if len(r["measured_peaks"]) > 1]
        out[f"{kind}_max_measured_spread"] = max(spreads, default=None)
    return out


def measure(spec: dict[str, Any], cache: Path, *, remeasure: bool, timeout: float) -> dict[str, Any] | None:
    out = cache / f"{spec['model']}-b{spec['batch']}-{_key(spec)}.json"
    if out.exists() and not remeasure:
        record = json.loads(out.read_text())
        if spec["config"] is None or "swapped" in (record.get("plan") or {}):
            return record
    cache.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="true", TF_ENABLE_ONEDNN_OPTS=spec.get("onednn", "0"),
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, __file__, "--child", json.dumps(spec), str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not out.exists():
        print(f"  measurement failed ({spec}):\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    print(f"  measured {spec['model']} batch {spec['batch']} config {spec['config']} "
          f"in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return json.loads(out.read_text())


def load_graph(cache: Path, record: dict[str, Any]) -> Graph:
    with gzip.open(cache / record["graph"], "rt", encoding="utf-8") as fh:
        return Graph.from_dict(json.load(fh))


def plan_from_summary(summary: dict[str, Any]) -> SwapPlan:
    """The `SwapPlan` a child applied, rebuilt from its `SwapPlan.summary()`."""
    swaps = tuple(
        Swap(tensor=s["tensor"], swap_out=s["swap_out"], nbytes=s["bytes"], kind=s["kind"],
             swap_ins=tuple(SwapIn(i["name"], tuple(i["consumers"]), i["trigger"], i["distance"], i["strategy"])
                            for i in s["swap_ins"]))
        for s in summary["swapped"])
    return SwapPlan(config=LMSConfig.from_dict(summary["config"]), swaps=swaps,
                    n_candidates=summary["n_candidates"], batch_size=summary["batch_size"])


def applied_plan(record: dict[str, Any]) -> SwapPlan | None:
    """The plan the child applied (stored in full in its record)."""
    summary = record["plan"]
    return None if summary is None else plan_from_summary(summary)


def _case(spec: dict[str, Any]) -> str:
    """The case a measurement belongs to (its repeats share it)."""
    return json.dumps({k: v for k, v in spec.items() if k != "repeat"}, sort_keys=True)


def group_repeats(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Records grouped by case (repeats of one case together), in first-seen order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(_case(r["spec"]), []).append(r)
    return list(groups.values())


def compare(records: list[dict[str, Any]], graph: Graph) -> dict[str, Any]:
    """Simulated versus measured peak of one case: the median over its repeated measurements."""
    record = records[0]
    spec = record["spec"]
    plan = applied_plan(record) if spec["config"] else None
    if plan is not None:
        plan.validate(graph)
        for other in records[1:]:
            if other["plan"] != record["plan"]:
                raise ValueError(f"repeats of {spec['config']} applied different plans")
    batch = spec["batch"]
    peaks = sorted(r["measured_peak_bytes"] for r in records)
    measured = int(statistics.median(peaks))
    row: dict[str, Any] = {"model": spec["model"], "options": spec["options"], "batch": batch,
                           "config": spec["config"], "inter_op_threads": spec.get("inter_op") or "default",
                           "executor": spec.get("executor", "default"),
                           "measured_peak_bytes": measured, "measured_peaks": peaks,
                           "measured_spread": (peaks[-1] - peaks[0]) / measured,
                           "n_swapped": plan.n_swapped if plan else 0}
    order = ORDER_FOR[row["executor"]]
    # the kernels' scratch: oneDNN's where the measurement ran with it (the emulated device), else Eigen's
    onednn = spec.get("onednn", "0") == "1"
    temps = ONEDNN_TEMPORARIES if onednn else CPU_TEMPORARIES
    variants = {
        "simulated": dict(device="cpu", order=order, temporaries=temps),
        "bfc": dict(device="cpu", allocator="bfc", order=order, temporaries=temps),
        "fifo": dict(device="cpu", order="fifo", temporaries=temps),
        "liveness": dict(device="cpu", temporaries=NO_TEMPORARIES, order=order),
    }
    row["order"] = order
    row["temporaries"] = temps.name
    for label, kw in variants.items():
        r = simulate(graph, plan, batch=batch, timeline=False, **kw)
        row[f"{label}_peak_bytes"] = r.peak_device_bytes
        row[f"{label}_error"] = (r.peak_device_bytes - measured) / measured
        if label == "simulated":
            row["peak_op"] = r.peak_op
            row["resident_bytes"] = r.resident_bytes
            row["peak_temporary_bytes"] = r.peak_temporary_bytes
    lives = sorted(r["live_peak_bytes"] for r in records if r.get("live_peak_bytes"))
    if lives:
        # what the order makes live (requested bytes, no allocator rounding or history) against the
        # simulator's live-bytes peak
        live = int(statistics.median(lives))
        row.update(live_peak_bytes=live, live_peaks=lives, live_spread=(lives[-1] - lives[0]) / live,
                   live_error=(row["simulated_peak_bytes"] - live) / live,
                   pinned_whole=all(r.get("pinned_whole") for r in records),
                   whole_reason=next((r.get("whole_reason") for r in records if r.get("whole_reason")), ""))
    baseline = int(statistics.median(r["baseline_bytes"] for r in records))
    row["measured_baseline_bytes"] = baseline
    # diagnostic: the simulated step on top of what the measuring process really held when the step
    # began (weights, slots, plus whatever else it kept: varies by process, see the report)
    shifted = row["simulated_peak_bytes"] - row["resident_bytes"] + baseline
    row["simulated_on_measured_baseline_error"] = (shifted - measured) / measured
    row["bfc_on_start_peak_bytes"] = row["bfc_peak_bytes"] - row["resident_bytes"] + baseline
    row["bfc_on_start_error"] = (row["bfc_on_start_peak_bytes"] - measured) / measured
    return row


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts within target, per simulated variant.

    The targets are judged on the single-threaded-executor measurements (deterministic, see the
    module docstring); the same counts over TF's default executor (one inter-op thread) are
    given under ``default_executor`` for comparison.
    """
    out: dict[str, Any] = {}
    for label, executor in (("", "single_threaded"), ("default_executor_", "default")):
        primary = [r for r in rows if r["inter_op_threads"] == 1 and r["executor"] == executor]
        for kind, cases, target in (("no_swap", [r for r in primary if r["config"] is None], 0.05),
                                    ("swap", [r for r in primary if r["config"] is not None and r["n_swapped"]],
                                     0.10)):
            out[f"{label}{kind}_cases"] = len(cases)
            out[f"{label}{kind}_target"] = target
            for variant in ("bfc", "bfc_on_start", "simulated"):
                errors = [abs(r[f"{variant}_error"]) for r in cases]
                out[f"{label}{kind}_{variant}_within_target"] = sum(e <= target for e in errors)
                out[f"{label}{kind}_{variant}_max_abs_error"] = max(errors, default=None)
                out[f"{label}{kind}_{variant}_mean_abs_error"] = sum(errors) / len(errors) if errors else None
            spreads = [r["measured_spread"] for r in cases if len(r["measured_peaks"]) > 1]
            out[f"{label}{kind}_max_measured_spread"] = max(spreads, default=None)
        out[f"{label}swap_configs_that_swapped_nothing"] = [
            r["config"] for r in primary if r["config"] is not None and not r["n_swapped"]]
    return out


def speed(cache: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Time the simulator on ResNet-50: one simulation, one max_batch search (P100 profile)."""
    rec = next((r for r in records if r["spec"]["model"] == "resnet50" and r["spec"]["config"] is None), None)
    if rec is None:
        return {}
    data = load_graph(cache, rec).to_dict()
    out: dict[str, Any] = {"graph_ops": len(data["ops"])}
    for label, config in (("no_lms", None), ("paper_config", LMSConfig(n_tensors=100, lb=5))):
        g = Graph.from_dict(data)  # fresh: nothing cached
        t0 = time.perf_counter()
        plan = plan_swaps(g, config) if config else None
        plan_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        simulate(g, plan, batch=8, device="P100-16GB", timeline=False)
        compile_s = time.perf_counter() - t0
        runs = []
        for b in range(8, 28):
            t0 = time.perf_counter()
            simulate(g, plan, batch=b, device="P100-16GB", timeline=False)
            runs.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        simulate(g, plan, batch=8, device="P100-16GB").timeline
        timeline_ms = 1e3 * (time.perf_counter() - t0)
        t0 = time.perf_counter()
        mb = max_batch(g, plan, 16 << 30, device="P100-16GB")
        mb_s = time.perf_counter() - t0
        g2 = Graph.from_dict(data)
        t0 = time.perf_counter()
        max_batch(g2, plan, 16 << 30, device="P100-16GB")
        mb_cold = time.perf_counter() - t0
        out[label] = {"planner_s": plan_s, "compile_s": compile_s, "n_swapped": plan.n_swapped if plan else 0,
                      "simulation_with_timeline_ms": timeline_ms,
                      "simulation_ms_median": 1e3 * sorted(runs)[len(runs) // 2],
                      "max_batch_s": mb_s, "max_batch_s_incl_compile": mb_cold,
                      "max_batch": mb.batch, "max_batch_simulations": mb.n_simulations}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small models only (no ResNet-50)")
    parser.add_argument("--remeasure", action="store_true", help="ignore cached measurements")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="measurement cache folder")
    parser.add_argument("--out", type=Path, default=RESULTS / "simulator_accuracy.json", help="JSON output")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per measurement")
    parser.add_argument("--repeats", type=int, default=3,
                        help="measurements (processes) per swap config; compared against their median")
    parser.add_argument("--st-repeats", type=int, default=3,
                        help="measurements (processes) per case under the single-threaded executor")
    parser.add_argument("--measure-only", action="store_true", help="measure (fill the cache) and stop")
    parser.add_argument("--schedule-rows", action="store_true",
                        help="only the cases with schedule='memory'; added to the JSON under 'schedule_memory'")
    parser.add_argument("--child", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(json.loads(args.child[0]), Path(args.child[1]))
        return 0

    if args.schedule_rows:
        return _schedule_rows(args)
    # repeats of a no-swap case: the first has no "repeat" key (measurements cached before repeats existed)
    specs = [{"model": m, "options": o, "batch": b, "config": None, "inter_op": 1, **({"repeat": i} if i else {})}
             for m, o, batches in NO_SWAP_CASES for b in batches for i in range(args.repeats)]
    code = swap_code_version()
    specs += [{"model": m, "options": o, "batch": b, "config": c, "inter_op": 1, "code": code, "repeat": i}
              for m, o, b, c in SWAP_CASES for i in range(args.repeats)]
    # the same no-swap steps with TF's default inter-op threading (ops overlap: not modelled)
    specs += [dict(s, inter_op=0) for s in specs if s["config"] is None and "repeat" not in s]
    # the targets: the same cases under TF's single-threaded executor (deterministic order)
    specs = [dict(s, executor="single_threaded") for s in specs
             if s["inter_op"] == 1 and s.get("repeat", 0) < args.st_repeats] + specs
    if args.quick:
        specs = [s for s in specs if s["model"] in QUICK_MODELS]
    records = [r for r in (measure(s, args.cache, remeasure=args.remeasure, timeout=args.timeout)
                           for s in specs) if r is not None]
    if args.measure_only:
        return 0
    rows = [compare(group, load_graph(args.cache, group[0])) for group in group_repeats(records)]
    summary = summarise(rows)
    timing = {} if args.quick else speed(args.cache, records)
    doc = {"schema": "lms.simulator_accuracy", "schema_version": 1,
           "setup": {"allocator": "TF_CPU_ALLOCATOR_USE_BFC=true", "onednn": "TF_ENABLE_ONEDNN_OPTS=0",
                     "grappler": "default", "measure": "lms.tf.measure.measure_step(warmup=2, steps=3)",
                     "swap_ops": "emulated (lms.function emulate=True)",
                     "executor": "targets: TF's SINGLE_THREADED_EXECUTOR (measure_step(executor="
                                 "'single_threaded'), simulated with order='single_threaded'); beside them the "
                                 "default executor with one inter-op thread (order='executor') and with default "
                                 "threading (ops overlap: not modelled)",
                     "bfc_on_start": "the BFC-replayed step on top of the bytes in use when the measured step "
                                     "began (measured_baseline_bytes) instead of the graph's resident bytes",
                     "swap_plans": f"the current lms.plan_swaps (swap code {code}); the applied plan is "
                                   "stored per measurement",
                     "repeats": f"{args.st_repeats} processes per case under the single-threaded executor, "
                                f"{args.repeats} per one-thread default-executor case, compared against their "
                                "median (measured_peaks, measured_spread = (max - min) / median); one measurement "
                                "per default-threads row",
                     "simulated": "device='cpu' profile with the row's order and Eigen's kernel temporaries "
                                  "(lms.sim.costs.CPU_TEMPORARIES: these rows run with oneDNN off); "
                                  "'bfc' replays TF's BFC allocator, 'simulated' counts live bytes",
                     "tf_version": records[0]["tf_version"] if records else None},
           "summary": summary, "rows": rows, "timing": timing}
    atomic_write_text(args.out, json.dumps(doc, indent=1) + "\n")
    _print_table(rows, summary, timing)
    print(f"\nwrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


def _schedule_rows(args: argparse.Namespace) -> int:
    specs = schedule_specs(args.st_repeats)
    if args.quick:
        specs = [s for s in specs if s["model"] in QUICK_MODELS]
    records = [r for r in (measure(s, args.cache, remeasure=args.remeasure, timeout=args.timeout)
                           for s in specs) if r is not None]
    rows = [compare(group, load_graph(args.cache, group[0])) for group in group_repeats(records)]
    summary = summarise_schedule(rows)
    doc = json.loads(args.out.read_text()) if args.out.is_file() else {}
    doc["schedule_memory"] = {
        "setup": "the cases above with schedule='memory' (no-swap cases: n_tensors=0) as the emulated device runs "
                 "them: oneDNN on, pinned whole (lms.tf.exact), TF's single-threaded executor; "
                 f"{args.st_repeats} processes each, compared against their median; 'live' compares the simulated "
                 "live-bytes peak with the requested bytes live at the measured step's worst moment (lms.tf.live), "
                 "'bfc' the BFC replay with TF's allocator peak; "
                 f"scheduling code {schedule_code_version()}" + ("; small models only (--quick)" if args.quick else ""),
        "summary": summary, "rows": rows}
    atomic_write_text(args.out, json.dumps(doc, indent=1) + "\n")
    _print_table(rows, {}, {})
    _print_live(rows)
    s = summary
    for kind in ("no_swap", "swap"):
        live = (f"simulated live bytes vs measured requested bytes {s.get(f'{kind}_live_within_target')}/"
                f"{s[f'{kind}_cases']} within {100 * SCHEDULE_TARGET:.0f}% (max |error| "
                f"{100 * (s.get(f'{kind}_live_max_abs_error') or 0):.1f}%; their spread across processes up to "
                f"{100 * (s.get(f'{kind}_max_live_spread') or 0):.2f}%)")
        print(f"schedule=memory, {kind} ({s[f'{kind}_pinned_whole']}/{s[f'{kind}_cases']} pinned whole): {live}; "
              f"BFC replay vs TF's allocator peak {s[f'{kind}_bfc_within_target']}/{s[f'{kind}_cases']} "
              f"(max |error| {100 * (s[f'{kind}_bfc_max_abs_error'] or 0):.1f}%; the allocator's spread up to "
              f"{100 * (s[f'{kind}_max_measured_spread'] or 0):.1f}%)")
    print(f"\nwrote {args.out}")
    return 0


def _print_live(rows: list[dict[str, Any]]) -> None:
    """The pinned rows: requested bytes live (measured, median of processes) vs the simulated live peak."""
    head = (f"{'model':<9} {'batch':>5} {'config':<40} {'whole':>5} {'live':>9} {'live sim':>9} {'error':>7} "
            f"{'spread':>7}")
    print("\n" + head)
    print("-" * len(head))
    for r in sorted(rows, key=lambda r: (r["config"] is not None and r["n_swapped"] > 0, r["model"], r["batch"])):
        if "live_peak_bytes" not in r:
            continue
        cfg = ",".join(f"{k}={v}" for k, v in (r["config"] or {}).items() if k != "schedule") or "no LMS"
        print(f"{r['model']:<9} {r['batch']:>5} {cfg[:40]:<40} {'yes' if r['pinned_whole'] else 'no':>5} "
              f"{r['live_peak_bytes'] / MiB:>8.1f}M {r['simulated_peak_bytes'] / MiB:>8.1f}M "
              f"{100 * r['live_error']:>+6.1f}% {100 * r['live_spread']:>6.2f}%")


def _print_table(rows: list[dict[str, Any]], summary: dict[str, Any], timing: dict[str, Any]) -> None:
    head = (f"{'model':<9} {'batch':>5} {'exec':>4} {'config':<40} {'measured':>9} {'BFC sim':>9} {'error':>7} "
            f"{'on start':>8} {'live sim':>9} {'error':>7} {'fifo':>7} {'no temp':>7} {'spread':>7} {'n':>2}  "
            "simulated peak op")
    print(head)
    print("-" * len(head))
    for r in sorted(rows, key=lambda r: (r["executor"] != "single_threaded", r["inter_op_threads"] != 1,
                                         r["config"] is not None, r["model"], r["batch"])):
        cfg = "no LMS" if r["config"] is None else ",".join(f"{k}={v}" for k, v in r["config"].items())
        thr = "ST" if r["executor"] == "single_threaded" else ("1thr" if r["inter_op_threads"] == 1 else "def")
        print(f"{r['model']:<9} {r['batch']:>5} {thr:>4} {cfg[:40]:<40} {r['measured_peak_bytes'] / MiB:>8.1f}M "
              f"{r['bfc_peak_bytes'] / MiB:>8.1f}M {100 * r['bfc_error']:>+6.1f}% "
              f"{100 * r['bfc_on_start_error']:>+7.1f}% {r['simulated_peak_bytes'] / MiB:>8.1f}M {100 * r['simulated_error']:>+6.1f}% "
              f"{100 * r['fifo_error']:>+6.1f}% {100 * r['liveness_error']:>+6.1f}% {100 * r['measured_spread']:>6.1f}% "
              f"{len(r['measured_peaks']):>2}  {r['peak_op'][-50:]}")
    s = summary
    if not s:
        return
    print("\nexec: ST = TF's single-threaded executor (the targets), 1thr = default executor with one inter-op "
          "thread, def = default threading")
    for label, what in (("", "ST executor"), ("default_executor_", "default executor, 1 thread")):
        for kind, pct, title in (("no_swap", 5, "no LMS"), ("swap", 10, "emulated swap")):
            n = s[f"{label}{kind}_cases"]
            spread = s[f"{label}{kind}_max_measured_spread"]
            print(f"{what}, {title}: BFC replay {s[f'{label}{kind}_bfc_within_target']}/{n} within {pct}% "
                  f"(max |error| {100 * (s[f'{label}{kind}_bfc_max_abs_error'] or 0):.1f}%), on the measured "
                  f"start {s[f'{label}{kind}_bfc_on_start_within_target']}/{n} "
                  f"(max {100 * (s[f'{label}{kind}_bfc_on_start_max_abs_error'] or 0):.1f}%), live bytes "
                  f"{s[f'{label}{kind}_simulated_within_target']}/{n} "
                  f"(max {100 * (s[f'{label}{kind}_simulated_max_abs_error'] or 0):.1f}%); measured spread "
                  f"across processes up to {100 * (spread or 0):.1f}%")
    for label, t in timing.items():
        if isinstance(t, dict):
            print(f"ResNet-50 ({timing['graph_ops']} ops), {label} ({t['n_swapped']} swapped): one simulation "
                  f"{t['simulation_ms_median']:.2f} ms ({t['simulation_with_timeline_ms']:.1f} ms with the "
                  f"timeline); max_batch {t['max_batch_s']:.3f} s "
                  f"({t['max_batch_simulations']} simulations; {t['max_batch_s_incl_compile']:.2f} s with "
                  f"compiling the plan); planner {t['planner_s']:.1f} s (lms.plan.swap_planner, not the simulator)")


if __name__ == "__main__":
    sys.exit(main())
