"""How far can any LMS plan go? The simulator's best batch against a bound on every plan's (PREDICTED).

For ResNet-50 (224x224) and GPT-2 small (seq 2048), 16 GiB, per device profile,
this prints the simulator's no-LMS max batch, the best max batch of a few
swap/recompute configs (`lms.simulator.max_batch`), and `lms.sim.bound.max_batch_bound`:
the largest batch at which no plan's simulated peak can fit (resident bytes +
step inputs + the largest single-op floor: inputs, outputs, temporaries and the
backward buffers live across the op in every order), with the op that sets it.
It asserts that no config's batch exceeds the bound. Graphs are loaded as in
``benchmarks/paper.py`` (traced once, cached). Every figure is PREDICTED.

    nice -n 10 python benchmarks/plan_bound.py           # about 15 s on 2 cores
    nice -n 10 python benchmarks/plan_bound.py --grids   # also assert every config of paper.py's and
                                                         # recompute.py's grids stays under the bound (minutes)

Writes benchmarks/results/plan_bound.json.
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

from benchmarks.paper import ROWS, load_graph  # noqa: E402
from lms import LMSConfig, plan_swaps  # noqa: E402
from lms.config import atomic_write_text  # noqa: E402
from lms.sim.bound import max_batch_bound  # noqa: E402
from lms.simulator import InfeasibleBudget, max_batch  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "plan_bound.json"
BUDGET = 16 << 30
DEVICES = ("P100-16GB", "V100-16GB", "A100-40GB")
WORKLOADS = ("resnet50", "gpt2_small")
TARGETS = {"resnet50": 1190, "gpt2_small": None}  # gpt2: 10x its no-LMS batch (issue 15); resnet50: 6x, 1,190
CONFIGS = tuple(LMSConfig(n_tensors=-1, lb=lb, schedule=s, fuse_swapins=fuse, recompute=rc)
                for s, lb, fuse, rc in [("memory", 1, False, "none"), ("memory", 1, False, "cheap"),
                                        ("memory", 1, True, "none"), ("memory", 1, True, "cheap"),
                                        ("tf", 1, False, "cheap"), ("tf", 1, True, "cheap")])
GiB = 1 << 30


def _short(c: LMSConfig) -> dict[str, Any]:
    keys = ("n_tensors", "schedule", "lb", "fuse_swapins", "recompute", "sync_mode", "ctrld_strategy", "swap_branches",
            "branch_threshold")
    return {k: v for k, v in c.to_dict().items() if k in keys and v != LMSConfig().to_dict()[k] or k == "lb"}


def grids(spec, graph) -> tuple[LMSConfig, ...]:
    """The configs `benchmarks/paper.py` and `benchmarks/recompute.py` search (deduplicated, ours first)."""
    import paper
    import recompute

    n_candidates = plan_swaps(graph, LMSConfig()).n_candidates
    extra = paper.config_grid(n_candidates, n_tensors=spec.n_tensors)
    extra += tuple(LMSConfig(recompute=rc, **f) for f in recompute.grid() for rc in ("none", "cheap"))
    return tuple(dict.fromkeys(CONFIGS + extra))


def evaluate(key: str, graph, device: str, plans: dict[LMSConfig, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    base = max_batch(graph, None, BUDGET, device=device)
    rows = []
    for config in plans:
        try:
            batch = max_batch(graph, plans[config], BUDGET, device=device).batch
        except InfeasibleBudget:
            batch = 0
        rows.append({"config": _short(config), "batch": batch})
    bound = max_batch_bound(graph, BUDGET, device=device)
    per_op = max_batch_bound(graph, BUDGET, device=device, spanning=False).batch
    best = max(rows, key=lambda r: r["batch"])
    for r in [{"batch": base.batch, "config": "no LMS"}, *rows]:
        assert r["batch"] <= bound.batch <= per_op, f"{key} {device}: {r} beats the bound {bound.batch}"
    target = TARGETS[key] if TARGETS[key] is not None else 10 * base.batch
    return {"workload": key, "device": device, "no_lms_batch": base.batch, "configs": rows, "best": best,
            "bound_batch": bound.batch, "op_only_bound_batch": per_op, "target_batch": target,
            "bound_at": bound.at_batch.to_dict(),
            "bound_next": bound.next_floor.to_dict() if bound.next_floor else None,
            "search_s": round(time.perf_counter() - t0, 1)}


def report(r: dict[str, Any]) -> str:
    f = r["bound_at"]
    o = f["op"]
    lines = [f"{r['workload']} on {r['device']} (PREDICTED, 16 GiB): no LMS {r['no_lms_batch']}, best LMS "
             f"{r['best']['batch']} {r['best']['config']}, bound {r['bound_batch']} (op floor alone "
             f"{r['op_only_bound_batch']}), target {r['target_batch']} -> "
             + ("reachable under the bound" if r["target_batch"] <= r["bound_batch"] else "UNREACHABLE by any plan"),
             f"  bounding op at batch {f['batch']}: {o['name']} ({o['type']}, {o['role']}): inputs "
             f"{o['input_bytes'] / GiB:.3f} + outputs {o['output_bytes'] / GiB:.3f} + temporaries "
             f"{o['temporary_bytes'] / GiB:.3f} + kept {o['kept_bytes'] / GiB:.3f} + resident "
             f"{f['resident_bytes'] / GiB:.3f} + step inputs {f['step_input_bytes'] / GiB:.3f} = {f['bytes'] / GiB:.3f} GiB"
             + (f"; at {f['batch'] + 1}: {r['bound_next']['bytes'] / GiB:.3f} GiB" if r["bound_next"] else "")]
    for name, n in o["inputs"]:
        lines.append(f"    in   {n / GiB:7.3f} GiB {name}")
    for name, n in o["outputs"]:
        lines.append(f"    out  {n / GiB:7.3f} GiB {name}")
    for name, n in o["kept"][:5]:
        lines.append(f"    kept {n / GiB:7.3f} GiB {name}")
    lines += [f"    {c['batch']:5d}  {c['config']}" for c in r["configs"][:len(CONFIGS)]]
    if len(r["configs"]) > len(CONFIGS):
        lines.append(f"    ... {len(r['configs']) - len(CONFIGS)} more configs of the paper/recompute grids, all <= the bound")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--devices", nargs="+", default=list(DEVICES))
    parser.add_argument("--grids", action="store_true", help="also every config of paper.py's and recompute.py's grids")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    out = []
    for key in args.rows:
        spec = next(r for r in ROWS if r.key == key)
        graph, _, _ = load_graph(spec)
        plans = {}
        for c in grids(spec, graph) if args.grids else CONFIGS:
            try:
                plans[c] = plan_swaps(graph, c)
                plans[c].validate(graph)
            except ValueError as exc:  # as paper.py: a config the planner cannot plan is left out
                print(f"  skipped {_short(c)}: {type(exc).__name__}: {exc}", file=sys.stderr)
                plans.pop(c, None)
        for device in args.devices:
            out.append(evaluate(key, graph, device, plans))
            print(report(out[-1]), flush=True)
    doc = {"label": "PREDICTED by lms.simulator / lms.sim.bound", "budget_bytes": BUDGET, "grids": args.grids,
           "rows": out}
    atomic_write_text(RESULTS, json.dumps(doc, indent=1) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
