"""Keep, swap or recompute: what ``LMSConfig(recompute="cheap")`` adds to swapping, in simulation (PREDICTED).

For ResNet-50 (224x224) and GPT-2 small (seq 2048) at a 16 GiB budget on the
P100 profile (NVLink 1.0, the TFLMS paper's machine), the simulator
(`lms.simulator.max_batch`, no TensorFlow; graphs traced once and cached as in
``benchmarks/paper.py``) finds the largest batch of a small grid of configs,
each with and without recomputation:

    schedule in ("tf", "memory") x lb in (1, 3) x fuse_swapins in (False, True)
    (x prefetch in ("lb", "headroom") with the memory schedule)

and reports per config the batch, the throughput cost against no LMS, and the
bytes moved over the host link per sample. "Same batch" compares the bytes per
sample of swapping alone and of swap + recompute at the recompute config's
batch. Every figure is PREDICTED; none is measured.

    nice -n 10 python benchmarks/recompute.py            # about 2-4 minutes on 2 cores
    nice -n 10 python benchmarks/recompute.py --rows resnet50

Writes benchmarks/results/recompute.{json,md} and prints the Markdown.
"""

from __future__ import annotations

import argparse
import itertools
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
from lms.machine.devices import GiB, get_device  # noqa: E402
from lms.simulator import InfeasibleBudget, max_batch, simulate  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
DEVICE = "P100-16GB"
BUDGET_GIB = 16.0
ROWS = ("resnet50", "gpt2_small")
TARGETS = {"resnet50": {"ratio": 6.0, "max_cost": 0.35, "link_cut": 0.30}, "gpt2_small": {"ratio": 10.0}}
MiB = 1 << 20


KNOBS = ("schedule", "lb", "fuse_swapins", "prefetch")


def grid() -> list[dict[str, Any]]:
    return [{"schedule": s, "lb": lb, "fuse_swapins": fuse, "prefetch": pf}
            for s, lb, fuse, pf in itertools.product(("tf", "memory"), (1, 3), (False, True), ("lb", "headroom"))
            if s == "memory" or pf == "lb"]


def _outcome(graph, config: LMSConfig, budget: int, device, base_throughput: float) -> dict[str, Any]:
    plan = plan_swaps(graph, config, kernels=device.kernels)
    plan.validate(graph)
    try:
        m = max_batch(graph, plan, budget, device=device)
    except InfeasibleBudget:
        return {"config": config.to_dict(), "batch": 0}
    if m.batch == 0:
        return {"config": config.to_dict(), "batch": 0}
    r = simulate(graph, plan, batch=m.batch, device=device, timeline=False)
    return {
        "config": {k: v for k, v in config.to_dict().items() if k in (*KNOBS, "recompute")},
        "batch": m.batch, "throughput": m.throughput, "step_time_s": r.step_time_s,
        "compute_time_s": r.compute_time_s, "stall_time_s": r.stall_time_s,
        "throughput_cost": 1 - m.throughput / base_throughput,
        "link_bytes_per_sample": r.transfer_bytes / m.batch, "n_swapped": plan.n_swapped,
        "n_recomputed": plan.n_recomputed, "n_clones": plan.recompute.n_clones if plan.recompute else 0,
        "recomputed_bytes_per_sample": plan.recomputed_bytes / graph.batch_size, "peak_op": m.peak_op,
    }


def evaluate(key: str, graph, *, budget: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    device = get_device(DEVICE)
    base = max_batch(graph, None, budget, device=device)
    rows = []
    for fields in grid():
        for recompute in ("none", "cheap"):
            rows.append(_outcome(graph, LMSConfig(recompute=recompute, **fields), budget, device, base.throughput))
    best = {rc: max((r for r in rows if r["config"]["recompute"] == rc), key=lambda r: (r["batch"], r.get("throughput", 0)))
            for rc in ("none", "cheap")}
    within = {rc: max((r for r in rows if r["config"]["recompute"] == rc and r["batch"]
                       and r["throughput_cost"] <= 0.35), key=lambda r: r["batch"], default=None)
              for rc in ("none", "cheap")}
    # bytes over the link at the same batch: the best recompute config vs the same knobs swapping alone
    same = []
    for r in rows:
        if r["config"]["recompute"] != "cheap" or not r["batch"]:
            continue
        knobs = {k: r["config"][k] for k in KNOBS}
        alone = simulate(graph, LMSConfig(**knobs), batch=r["batch"], device=device, timeline=False)
        same.append({"config": knobs, "batch": r["batch"], "swap_alone_bytes_per_sample": alone.transfer_bytes / r["batch"],
                     "with_recompute_bytes_per_sample": r["link_bytes_per_sample"],
                     "cut": 1 - r["link_bytes_per_sample"] / (alone.transfer_bytes / r["batch"])})
    return {"key": key, "n_ops": len(graph.ops), "no_lms": {"batch": base.batch, "throughput": base.throughput},
            "configs": rows, "best": best, "best_within_35pct_cost": within, "same_batch": same,
            "targets": TARGETS.get(key, {}), "search_s": round(time.perf_counter() - t0, 1)}


def markdown(doc: dict[str, Any]) -> str:
    lines = [f"# Keep, swap or recompute (PREDICTED by lms.simulator, {DEVICE}, {BUDGET_GIB:g} GiB)", "",
             "Every figure is a simulator prediction; none is measured. Throughput cost is against no LMS at "
             "its own largest batch.", ""]
    for row in doc["rows"]:
        base = row["no_lms"]
        lines += [f"## {row['key']} ({row['n_ops']} ops): no LMS batch {base['batch']}", "",
                  "| schedule | lb | fuse | prefetch | recompute | batch | x no-LMS | throughput cost | "
                  "MiB/sample over link | recomputed | clones |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in row["configs"]:
            c = r["config"]
            if not r["batch"]:
                lines.append(f"| {c.get('schedule')} | {c.get('lb')} | {c.get('fuse_swapins')} | {c.get('prefetch')} | "
                             f"{c.get('recompute')} | 0 | - | - | - | - | - |")
                continue
            lines.append(f"| {c['schedule']} | {c['lb']} | {c['fuse_swapins']} | {c['prefetch']} | {c['recompute']} | "
                         f"{r['batch']} | "
                         f"{r['batch'] / base['batch']:.2f}x | {100 * r['throughput_cost']:.1f}% | "
                         f"{r['link_bytes_per_sample'] / MiB:.1f} | {r['n_recomputed']} | {r['n_clones']} |")
        lines += ["", "Link bytes per sample at the same batch (swap alone vs swap + recompute, same knobs):", "",
                  "| schedule | lb | fuse | prefetch | batch | swap alone MiB | + recompute MiB | cut |",
                  "|---|---|---|---|---|---|---|---|"]
        for s in row["same_batch"]:
            c = s["config"]
            lines.append(f"| {c['schedule']} | {c['lb']} | {c['fuse_swapins']} | {c['prefetch']} | {s['batch']} | "
                         f"{s['swap_alone_bytes_per_sample'] / MiB:.1f} | {s['with_recompute_bytes_per_sample'] / MiB:.1f} | "
                         f"{100 * s['cut']:.0f}% |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import paper

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS), help="workloads (default: all)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help="where to write recompute.{json,md}")
    args = parser.parse_args(argv)
    budget = int(BUDGET_GIB * GiB)
    rows = []
    for key in args.rows:
        spec = next(r for r in paper.ROWS if r.key == key)
        graph, _, _ = paper.load_graph(spec)
        rows.append(evaluate(key, graph, budget=budget))
        print(f"{key}: done in {rows[-1]['search_s']} s", file=sys.stderr, flush=True)
    doc = {"schema": "lms.recompute_benchmark", "label": "PREDICTED by lms.simulator", "device": DEVICE,
           "budget_bytes": budget, "rows": rows}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    text = markdown(doc)
    atomic_write_text(args.out_dir / "recompute.json", json.dumps(doc, indent=1) + "\n")
    atomic_write_text(args.out_dir / "recompute.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
