"""Fixed-batch tuning (``tuner search --batch N``): does the tuner find the fastest config that fits at N?

Setting (issue 16's): simulate backend, ResNet-50 (224x224x3, 1000 classes, SGD
momentum), budget 16 GiB with the tuner's 5% safety margin, device profile
P100-16GB; every figure is PREDICTED by the simulator.

1. The no-LMS max batch B0 (`tuner.policy.batch.predict_max_batch` of ``n_tensors=0``).
2. For N = 2 B0, 3 B0, 4 B0, the exhaustive grid: every distinct config of the
   tuner's space simulated at batch N (`tuner.policy.batch.predict_at_batch`, what the
   simulate backend runs with ``--batch N``); the best is the fastest that fits.
3. The tuner: `tuner.study.loop.optimize` with the fixed-batch goal, its sampler and
   warm start, for several seeds, with at most 15% of the grid's configs; its
   trials are looked up in the grid (deterministic, so what the tuner would compute).
   Its pick is the fastest feasible config it evaluated (`tuner.policy.selection.select_recommendation`).

Prints the figures and writes ``benchmarks/results/fixed_batch.json``::

    python benchmarks/fixed_batch.py                          # 5 seeds, about 10 minutes on 2 cores
    python benchmarks/fixed_batch.py --seeds 0 1 --multiples 2 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from lms.config import LMSConfig, atomic_write_text  # noqa: E402
from tuner.policy.batch import Prediction, predict_at_batch, predict_max_batch, usable_bytes  # noqa: E402
from tuner.budget import format_bytes, parse_budget  # noqa: E402

import tuner_efficiency as te  # noqa: E402  (the traced graph and the model fingerprint, shared)

RESULTS = ROOT / "benchmarks" / "results"


def grid_at(graph: Any, space: Any, *, batch: int, usable: int, device: str, cache_path: Path) -> dict[str, dict]:
    """canonical key -> the prediction at `batch` for every distinct config (cached, resumable)."""
    results: dict[str, dict] = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    configs: dict[str, LMSConfig] = space.distinct_configs()
    todo = [k for k in configs if k not in results]
    print(f"batch {batch}: {len(configs)} distinct configs, {len(todo)} to simulate", flush=True)
    for i, key in enumerate(todo, 1):
        t0 = time.perf_counter()
        p = predict_at_batch(graph, configs[key], usable, batch=batch, device=device)
        results[key] = {"feasible": p.feasible, "throughput": p.throughput, "peak_bytes": p.peak_bytes,
                        "seconds": round(time.perf_counter() - t0, 3)}
        if i % 50 == 0 or i == len(todo):
            atomic_write_text(cache_path, json.dumps(results))
    return {k: results[k] for k in configs}


def run_tuner(space: Any, grid: dict[str, dict], *, batch: int, seed: int, trials: int, usable: int,
              device: str, sampler: str) -> dict[str, Any]:
    """The tuner's loop at a fixed batch, its evaluations answered from the grid."""
    import optuna

    from tuner.policy.records import predicted_record
    from tuner.policy.knobs import canonical_key
    from tuner.study.loop import optimize
    from tuner.policy.selection import select_recommendation
    from tuner.study.progress import Progress
    from tuner.study.study import make_sampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["maximize", "maximize"], sampler=make_sampler(sampler, seed=seed))
    for params in (space.baseline_params(), space.tflms_default_params()):
        study.enqueue_trial(params, user_attrs={"warm_start": True}, skip_if_exists=True)

    def evaluate(config: LMSConfig, trial: Any):
        r = grid[canonical_key(config)]
        pred = (Prediction(batch, r["peak_bytes"], 0.0, r["throughput"]) if r["feasible"] else
                Prediction(0, r["peak_bytes"], 0.0, 0.0, min_bytes=r["peak_bytes"], reason="does not fit"))
        return predicted_record(config, pred, usable=usable, device=device)

    optimize(study, space, evaluate, n_trials=trials, deadline=None, progress=Progress(disabled=True), desc="bench",
             seed=seed)
    evaluated = [t for t in study.trials if "duplicate_of" not in t.user_attrs]
    chosen, _ = select_recommendation(study.trials)
    return {"seed": seed, "sampler": sampler, "trials": len(evaluated),
            "throughput": chosen.values[1] if chosen is not None else None,
            "config": chosen.user_attrs["config"] if chosen is not None else None,
            "peak_bytes": chosen.user_attrs["peak_device_bytes"] if chosen is not None else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=parse_budget, default=parse_budget("16GiB"), help="budget (default: 16GiB)")
    p.add_argument("--device", default="P100-16GB", help="simulator device profile (default: %(default)s)")
    p.add_argument("--multiples", type=int, nargs="+", default=[2, 3, 4], help="N = k x the no-LMS max batch")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="sampler seeds")
    p.add_argument("--sampler", default="tpe", choices=["tpe", "nsga2", "random"])
    p.add_argument("--fraction", type=float, default=0.15, help="tuner trials as a fraction of the grid")
    p.add_argument("--tolerance", type=float, default=0.03, help="allowed shortfall vs the grid's best")
    p.add_argument("--out", type=Path, default=RESULTS / "fixed_batch.json", help="JSON output")
    args = p.parse_args(argv)

    from lms.plan import find_candidates
    from tuner.policy.space import SearchSpace

    te.CACHE.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    usable = usable_bytes(args.budget, 0.05)
    graph = te.load_graph("resnet50", {})
    space = SearchSpace(n_candidates=max(1, len(find_candidates(graph, LMSConfig())[0])))
    base = predict_max_batch(graph, LMSConfig(n_tensors=0), usable, device=args.device, cap=4096)
    print(f"ResNet-50, budget {format_bytes(args.budget)} (usable {format_bytes(usable)}), {args.device}: "
          f"no-LMS max batch {base.batch} (PREDICTED)", flush=True)
    rows = []
    for k in args.multiples:
        batch = k * base.batch
        tag = hashlib.sha1(json.dumps([batch, args.budget, args.device, space.to_dict(), len(graph.ops),
                                       te._model_fingerprint()], sort_keys=True).encode()).hexdigest()[:10]
        grid = grid_at(graph, space, batch=batch, usable=usable, device=args.device,
                       cache_path=te.CACHE / f"resnet50-fixed-{tag}.json")
        feasible = {key: r for key, r in grid.items() if r["feasible"]}
        best_key = max(feasible, key=lambda key: feasible[key]["throughput"]) if feasible else None
        best = feasible[best_key]["throughput"] if best_key else None
        trials = math.floor(args.fraction * len(grid))
        runs = [run_tuner(space, grid, batch=batch, seed=s, trials=trials, usable=usable, device=args.device,
                          sampler=args.sampler) for s in args.seeds]
        for r in runs:
            r["ratio_to_grid_best"] = (r["throughput"] / best) if best and r["throughput"] else None
        if best is None:
            ok = all(r["throughput"] is None for r in runs)  # nothing fits: the tuner must say so, not invent one
        else:
            ok = all(r["ratio_to_grid_best"] is not None and r["ratio_to_grid_best"] >= 1 - args.tolerance
                     for r in runs)
        ratios = [r["ratio_to_grid_best"] for r in runs if r["ratio_to_grid_best"] is not None]
        row = {"multiple": k, "batch": batch, "grid_configs": len(grid), "grid_feasible": len(feasible),
               "grid_best_throughput": best, "grid_best_config": json.loads(best_key) if best_key else None,
               "grid_min_peak_bytes": min(r["peak_bytes"] for r in grid.values()),
               "tuner_trials": trials, "tuner_trials_fraction": trials / len(grid),
               "ratio_min": min(ratios) if ratios else None, "ratio_median": sorted(ratios)[len(ratios) // 2]
               if ratios else None, "passes": ok, "runs": runs}
        rows.append(row)
        if best is None:
            print(f"  batch {batch} ({k}x): no config of the grid fits (smallest peak "
                  f"{format_bytes(row['grid_min_peak_bytes'])}); the tuner finds none either: "
                  f"{'PASS' if ok else 'FAIL'}", flush=True)
        else:
            print(f"  batch {batch} ({k}x): grid best {best:.1f} samples/s ({len(feasible)} of {len(grid)} configs fit); "
                  f"tuner with {trials} trials ({trials / len(grid):.1%}): min {row['ratio_min']:.1%}, median "
                  f"{row['ratio_median']:.1%} of it over {len(runs)} seeds -> {'PASS' if ok else 'FAIL'}", flush=True)
    doc = {"benchmark": "fixed_batch", "model": "resnet50", "options": {"image_size": 224},
           "budget_bytes": args.budget, "usable_bytes": usable, "device": args.device, "backend": "simulate",
           "figures": "PREDICTED by the simulator", "no_lms_max_batch": base.batch, "sampler": args.sampler,
           "tolerance": args.tolerance, "rows": rows, "wall_s": round(time.monotonic() - t0, 1)}
    atomic_write_text(args.out, json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(r["passes"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
