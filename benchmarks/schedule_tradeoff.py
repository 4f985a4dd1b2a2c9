"""Max batch versus throughput cost with the order pinned (``schedule="memory"``): ResNet-50, 16 GiB, PREDICTED.

Issue 14 asked whether a memory-scheduled config reaches a batch of at least
990 on the P100 profile at a throughput cost of at most 35% against no LMS at
its own max batch. This script walks a grid of the knobs that trade memory for
time -- how many tensors are swapped (``n_tensors``), how early swap-ins start
(``lb``, ``prefetch``), ``sync_mode``, ``recompute`` -- with the simulator (`lms.simulator.max_batch`, the
graph traced by `benchmarks/paper.py` and cached there), and prints every
config's batch and cost, then the Pareto front.

    python benchmarks/schedule_tradeoff.py [--device P100-16GB]

Writes benchmarks/results/schedule_tradeoff.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.paper import ROWS, load_graph  # noqa: E402
from lms import LMSConfig  # noqa: E402
from lms.config import atomic_write_text  # noqa: E402
from lms.simulator import max_batch  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "schedule_tradeoff.json"
BUDGET = 16 << 30
TARGET_BATCH = 990
TARGET_COST = 0.35
# Fewer swapped tensors cost less link time; the finer steps near 100 are where the front crosses 35%.
N_TENSORS = (-1, 250, 200, 150, 120, 100, 95, 90)
LBS = (1, 3, 5, 6, 8)
SYNC_MODES = (0, 2)
RECOMPUTE = ("none", "cheap")
PREFETCH = ("lb", "headroom")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="P100-16GB", help="device profile (default P100-16GB)")
    args = parser.parse_args(argv)
    spec = next(r for r in ROWS if r.key == "resnet50")
    graph, _, _ = load_graph(spec)
    base = max_batch(graph, None, BUDGET, device=args.device)
    rows = []
    grid = itertools.product(N_TENSORS, LBS, SYNC_MODES, RECOMPUTE, PREFETCH)
    for n_tensors, lb, sync_mode, recompute, prefetch in grid:
        if prefetch != "lb" and sync_mode in (2, 3):
            continue  # synchronous swap-ins: nothing to prefetch (LMSConfig refuses the pair)
        config = LMSConfig(n_tensors=n_tensors, lb=lb, schedule="memory", sync_mode=sync_mode, recompute=recompute,
                           prefetch=prefetch)
        t0 = time.perf_counter()
        m = max_batch(graph, config, BUDGET, device=args.device)
        cost = 1 - m.throughput / base.throughput
        rows.append({"config": {"n_tensors": n_tensors, "lb": lb, "sync_mode": sync_mode, "recompute": recompute,
                                "prefetch": prefetch},
                     "batch": m.batch, "throughput": m.throughput, "cost": cost, "n_swapped": m.n_swapped})
        print(f"n_tensors={n_tensors:4d} lb={lb} sync_mode={sync_mode} recompute={recompute:5s} "
              f"prefetch={prefetch:8s}: batch {m.batch:5d}, "
              f"{m.throughput:6.1f} samples/s, cost {cost:5.1%} ({m.n_swapped} swapped) "
              f"[{time.perf_counter() - t0:.1f} s]", flush=True)
    front = [r for r in rows if not any(o["batch"] >= r["batch"] and o["cost"] < r["cost"]
                                        or o["batch"] > r["batch"] and o["cost"] <= r["cost"] for o in rows)]
    front.sort(key=lambda r: -r["batch"])
    hits = [r for r in rows if r["batch"] >= TARGET_BATCH and r["cost"] <= TARGET_COST]
    print(f"\nno LMS: batch {base.batch}, {base.throughput:.1f} samples/s ({args.device}, 16 GiB; PREDICTED)")
    print("Pareto front (batch, cost):", ", ".join(f"{r['batch']} @ {r['cost']:.0%} {r['config']}" for r in front))
    print(f"configs with batch >= {TARGET_BATCH} at cost <= {TARGET_COST:.0%}: {len(hits)}")
    doc = {"label": "PREDICTED", "device": args.device, "budget_bytes": BUDGET, "workload": "resnet50 224x224",
           "no_lms": {"batch": base.batch, "throughput": base.throughput},
           "targets": {"batch": TARGET_BATCH, "cost": TARGET_COST}, "rows": rows, "front": front, "hits": hits}
    atomic_write_text(RESULTS, json.dumps(doc, indent=1) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
