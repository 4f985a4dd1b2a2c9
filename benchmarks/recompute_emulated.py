"""Recomputation on the emulated device: ResNet-50 64x64, MEASURED against the simulator's prediction.

The tuner does not search ``recompute`` yet, so this script does by hand what
its default emulated search does for a few configs:

1. the budget the default search derives (`tuner.graphs.derive_emulated_budget`:
   the simulator's no-LMS peak at batch 32, BFC allocator replayed), minus the
   default 5% safety margin;
2. per config, the simulator's largest batch under it (`tuner.policy.batch.predict_max_batch`,
   ``device="cpu"``: TF's single-threaded executor order, BFC replayed): PREDICTED;
3. per config, one measured run at that batch in a fresh process (the
   ``benchmarks/simulator_accuracy.py`` child: emulated swap ops, TF's
   single-threaded executor, BFC allocator peak, median step time): MEASURED.

    nice -n 10 python benchmarks/recompute_emulated.py       # about 5 minutes on 2 cores

Writes benchmarks/results/recompute_emulated.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from lms import LMSConfig, plan_swaps  # noqa: E402
from lms.config import atomic_write_text  # noqa: E402
from lms.simulator import simulate  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "recompute_emulated.json"
MiB = 1 << 20
CONFIGS: dict[str, dict[str, Any] | None] = {
    "no LMS": None,
    "swap all, lb=1": {"n_tensors": -1, "lb": 1},
    "swap all, lb=1, recompute=cheap": {"n_tensors": -1, "lb": 1, "recompute": "cheap"},
    "recompute only": {"n_tensors": 0, "recompute": "cheap"},
}


def main(argv: list[str] | None = None) -> int:
    import paper
    import simulator_accuracy as acc
    from tuner.policy.batch import predict_max_batch, usable_bytes
    from tuner.graphs import derive_emulated_budget

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--cache", type=Path, default=acc.DEFAULT_CACHE / "recompute")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--timeout", type=float, default=1200)
    args = parser.parse_args(argv)
    spec = paper.RowSpec(key=f"resnet50_{args.image_size}", title="", workload="resnet50",
                         options={"image_size": args.image_size}, paper=None, why="")
    graph, _, _ = paper.load_graph(spec)
    budget = derive_emulated_budget(graph)
    usable = usable_bytes(budget, 0.05)
    rows = []
    for label, fields in CONFIGS.items():
        config = LMSConfig(**fields) if fields else LMSConfig(n_tensors=0)
        pred = predict_max_batch(graph, config if fields else None, usable, device="cpu", cap=4096, allocator="bfc")
        row: dict[str, Any] = {"config": label, "fields": fields, "predicted_batch": pred.batch,
                               "predicted_peak_bytes": pred.peak_bytes, "predicted_throughput": pred.throughput}
        if fields:
            plan = plan_swaps(graph, config)
            row.update(n_swapped=plan.n_swapped, n_recomputed=plan.n_recomputed,
                       recomputed_mib=plan.recomputed_bytes / MiB)
        if pred.batch:
            t0 = time.perf_counter()
            record = acc.measure({"model": "resnet50", "options": {"image_size": args.image_size},
                                  "batch": pred.batch, "config": fields, "executor": "single_threaded"},
                                 args.cache, remeasure=False, timeout=args.timeout)
            if record is not None:
                measured_graph = acc.load_graph(args.cache, record)
                plan = plan_swaps(measured_graph, config) if fields else None
                sim = simulate(measured_graph, plan, batch=pred.batch, device="cpu", allocator="bfc", timeline=False)
                row.update(measured_peak_bytes=record["measured_peak_bytes"],
                           measured_step_s=record["median_step_s"],
                           measured_throughput=pred.batch / record["median_step_s"],
                           simulated_peak_bytes=sim.peak_device_bytes,
                           peak_error=(sim.peak_device_bytes - record["measured_peak_bytes"])
                           / record["measured_peak_bytes"],
                           fits=record["measured_peak_bytes"] <= usable, measure_s=time.perf_counter() - t0)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    base = rows[0]
    for r in rows:
        if base.get("measured_throughput") and r.get("measured_throughput"):
            r["batch_ratio"] = r["predicted_batch"] / base["predicted_batch"]
            r["throughput_ratio"] = r["measured_throughput"] / base["measured_throughput"]
    doc = {"schema": "lms.recompute_emulated", "image_size": args.image_size, "budget_bytes": budget,
           "usable_bytes": usable, "labels": {"predicted_*": "PREDICTED by lms.simulator (device 'cpu', BFC replayed)",
                                              "measured_*": "MEASURED on the emulated device (CPU)"},
           "rows": rows}
    atomic_write_text(args.output, json.dumps(doc, indent=1) + "\n")
    print(f"ResNet-50 {args.image_size}x{args.image_size}, emulated device, usable budget {usable / MiB:.0f} MiB")
    print(f"{'config':36s} {'batch':>5s} {'x':>5s} {'meas. peak':>10s} {'sim. peak':>10s} {'err':>6s} "
          f"{'samples/s':>9s} {'x thr':>6s}")
    for r in rows:
        if "measured_peak_bytes" not in r:
            print(f"{r['config']:36s} {r['predicted_batch']:5d}  (not measured)")
            continue
        print(f"{r['config']:36s} {r['predicted_batch']:5d} {r.get('batch_ratio', 0):5.2f} "
              f"{r['measured_peak_bytes'] / MiB:9.0f}M {r['simulated_peak_bytes'] / MiB:9.0f}M "
              f"{100 * r['peak_error']:5.1f}% {r['measured_throughput']:9.1f} {r.get('throughput_ratio', 0):6.2f}")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
