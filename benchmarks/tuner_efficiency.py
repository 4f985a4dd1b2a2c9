"""Tuner efficiency: how much of an exhaustive grid's Pareto front the tuner finds, and with how few trials.

Setting (the issue's): simulate backend, ResNet-50 (keras.applications, 224x224x3,
1000 classes, SGD momentum), budget 16 GiB, device profile V100-16GB, the
tuner's own search space (`tuner.policy.space.SearchSpace`) and 5% safety margin.

1. The exhaustive grid: every point of the search space, simulated
   (`tuner.policy.batch.predict_max_batch`, what the tuner's simulate backend runs).
   Points that plan identically (e.g. every ``n_tensors=0`` point) are one
   config; the grid's trial count is its number of distinct configs.
2. The tuner: `tuner.study.loop.optimize` with the tuner's sampler and warm start
   (no-LMS baseline, TFLMS defaults), for several seeds. Its trials are looked
   up in the grid's results (the simulation is deterministic, so this is what
   the tuner would compute, without paying for it twice).
3. Hypervolume of the feasible Pareto front (maximise batch size and
   throughput), reference point (0, 0); also against (no-LMS batch, 0), which
   counts only what LMS adds beyond the baseline's batch.

Prints the figures and writes ``benchmarks/results/tuner_efficiency.json``.
The traced graph and the grid's simulations are cached under
``~/.cache/lms/tuner_efficiency/`` (keyed by a digest of the planner and
simulator sources; delete it to recompute)::

    python benchmarks/tuner_efficiency.py                    # ResNet-50 at 16 GiB, 5 seeds
    python benchmarks/tuner_efficiency.py --trials 96 --seeds 0 1 2 --samplers tpe random
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lms.config import LMSConfig, atomic_write_text  # noqa: E402
from tuner.policy.batch import predict_max_batch, usable_bytes  # noqa: E402
from tuner.budget import format_bytes, parse_budget  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lms" / "tuner_efficiency"


# ---------------------------------------------------------------- hypervolume

def pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Non-dominated points (both maximised), sorted by the first coordinate."""
    front = [p for p in set(points) if not any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in points)]
    return sorted(front)


def hypervolume(points: list[tuple[float, float]], ref: tuple[float, float] = (0.0, 0.0)) -> float:
    """Area dominated by `points` (maximisation) above `ref`."""
    front = [p for p in pareto(points) if p[0] > ref[0] and p[1] > ref[1]]
    area, y_prev = 0.0, ref[1]
    for x, y in sorted(front, key=lambda p: -p[0]):  # x descending -> y ascending
        if y > y_prev:
            area += (x - ref[0]) * (y - y_prev)
            y_prev = y
    return area


# ---------------------------------------------------------------- graph and grid

def load_graph(model: str, options: dict[str, Any]) -> Any:
    from lms.graph import Graph
    from tuner.worker.protocol import TraceRequest
    from tuner.worker.run import run_worker, worker_env

    key = {"model": model, "model_options": options}
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
    path = CACHE / f"{model}-{digest}.graph.json"
    if not path.is_file():
        print(f"tracing {model} in a worker (TensorFlow) ...", flush=True)
        out = run_worker(TraceRequest(workload=model, options=options, key=key, output=str(path)),
                         workdir=CACHE / f"trace-{digest}", timeout_s=1800, env=worker_env())
        if out.status != "ok":
            raise SystemExit(f"tracing failed: {out.reason} (log: {out.log_path})")
    return Graph.from_dict(json.loads(path.read_text())["graph"])


def evaluate_grid(graph: Any, space: Any, *, usable: int, device: str, cap: int, cache_path: Path) -> dict[str, dict]:
    """canonical config key -> prediction record for every distinct grid config (cached, resumable)."""
    results: dict[str, dict] = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    configs: dict[str, LMSConfig] = space.distinct_configs()
    todo = [k for k in configs if k not in results]
    print(f"grid: {len(space.grid())} points, {len(configs)} distinct configs, {len(todo)} to simulate", flush=True)
    start = time.monotonic()
    for i, key in enumerate(todo, 1):
        t0 = time.perf_counter()
        pred = predict_max_batch(graph, configs[key], usable, device=device, cap=cap)
        results[key] = {"batch": pred.batch, "throughput": pred.throughput, "peak_bytes": pred.peak_bytes,
                        "feasible": pred.feasible, "seconds": round(time.perf_counter() - t0, 3)}
        if i % 20 == 0 or i == len(todo):
            atomic_write_text(cache_path, json.dumps(results))
            rate = (time.monotonic() - start) / i
            print(f"  {i}/{len(todo)} simulated ({rate:.1f} s each, ~{rate * (len(todo) - i) / 60:.0f} min left)",
                  flush=True)
    return {k: results[k] for k in configs}


def _model_fingerprint() -> str:
    """Digest of the planner and simulator sources (every module of lms/ but its TensorFlow adapter, and the
    tuner's batch rules): a changed model invalidates the cached grid. It named single files before; three of
    them had moved away since, and the benchmark failed to start."""
    h = hashlib.sha1()
    paths = [p for p in (ROOT / "lms").rglob("*.py") if "tf" not in p.relative_to(ROOT / "lms").parts[:1]]
    for path in sorted([*paths, ROOT / "tuner" / "policy" / "batch.py"]):
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


# ---------------------------------------------------------------- tuner runs

def run_tuner(space: Any, grid: dict[str, dict], *, sampler: str, seed: int, trials: int, usable: int,
              device: str, explore_on_repeat: bool = True) -> dict[str, Any]:
    import optuna

    from tuner.policy.batch import Prediction
    from tuner.study.progress import Progress
    from tuner.policy.knobs import canonical_key
    from tuner.study.loop import optimize
    from tuner.policy.records import predicted_record
    from tuner.study.study import make_sampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["maximize", "maximize"], sampler=make_sampler(sampler, seed=seed))
    for params in (space.baseline_params(), space.tflms_default_params()):
        study.enqueue_trial(params, user_attrs={"warm_start": True}, skip_if_exists=True)
    visited: list[str] = []

    def evaluate(config: LMSConfig, trial: Any):
        key = canonical_key(config)
        visited.append(key)
        r = grid[key]
        pred = Prediction(r["batch"], r["peak_bytes"], 0.0, r["throughput"], min_bytes=None if r["feasible"]
                          else r["peak_bytes"], reason="" if r["feasible"] else "simulator: does not fit")
        return predicted_record(config, pred, usable=usable, device=device)

    optimize(study, space, evaluate, n_trials=trials, deadline=None, progress=Progress(disabled=True), desc="bench",
             explore_on_repeat=explore_on_repeat, seed=seed)
    # A trial = one config evaluated (what --trials counts); repeats the sampler proposed were answered
    # from the study for free and are reported separately.
    curve, points = [], []
    evaluated = [t for t in sorted(study.trials, key=lambda t: t.number) if "duplicate_of" not in t.user_attrs]
    for t in evaluated:
        if t.user_attrs.get("status") == "ok":
            points.append((t.values[0], t.values[1]))
        curve.append(hypervolume(points))
    return {"sampler": sampler, "seed": seed, "trials": len(evaluated), "study_trials": len(study.trials),
            "repeats": len(study.trials) - len(evaluated), "hv_curve": curve, "points": points,
            "distinct_configs_simulated": len(set(visited)),
            "simulation_seconds": round(sum(grid[k]["seconds"] for k in set(visited)), 1)}


# ---------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50", help="built-in workload (default: %(default)s)")
    p.add_argument("--budget", type=parse_budget, default=parse_budget("16GiB"), help="budget (default: 16GiB)")
    p.add_argument("--device", default="V100-16GB", help="simulator device profile (default: %(default)s)")
    p.add_argument("--trials", type=int, default=None,
                   help="tuner trials per run (default: 15%% of the grid's distinct configs, rounded down)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="sampler seeds")
    p.add_argument("--samplers", nargs="+", default=["tpe", "random"], choices=["tpe", "nsga2", "random"],
                   help="samplers to compare (the tuner's default is tpe)")
    p.add_argument("--target", type=float, default=0.95, help="hypervolume fraction to reach (default: 0.95)")
    p.add_argument("--max-batch", type=int, default=4096, help="batch cap, as the tuner's --max-batch")
    p.add_argument("--out", type=Path, default=RESULTS / "tuner_efficiency.json", help="JSON output")
    args = p.parse_args(argv)

    from lms.plan import find_candidates
    from tuner.policy.space import SearchSpace

    CACHE.mkdir(parents=True, exist_ok=True)
    usable = usable_bytes(args.budget, 0.05)
    t0 = time.monotonic()
    graph = load_graph(args.model, {})
    space = SearchSpace(n_candidates=max(1, len(find_candidates(graph, LMSConfig())[0])))
    tag = hashlib.sha1(json.dumps([args.model, args.budget, args.device, args.max_batch, space.to_dict(),
                                   len(graph.ops), _model_fingerprint()], sort_keys=True).encode()).hexdigest()[:10]
    grid = evaluate_grid(graph, space, usable=usable, device=args.device, cap=args.max_batch,
                         cache_path=CACHE / f"{args.model}-grid-{tag}.json")
    n_grid = len(grid)
    grid_points = [(r["batch"], r["throughput"]) for r in grid.values() if r["feasible"]]
    baseline = grid[next(k for k in grid if json.loads(k)["n_tensors"] == 0)]
    ref_strict = (float(baseline["batch"]), 0.0)
    hv_grid = hypervolume(grid_points)
    hv_grid_strict = hypervolume(grid_points, ref_strict)
    trials = args.trials or math.floor(0.15 * n_grid)
    print(f"\n{args.model}, budget {format_bytes(args.budget)} (usable {format_bytes(usable)}), device {args.device}, "
          f"space of {n_grid} distinct configs; grid simulated in "
          f"{sum(r['seconds'] for r in grid.values()) / 60:.1f} min (sum of per-config times)")
    print(f"grid Pareto front (batch, samples/s, PREDICTED): {pareto(grid_points)}")
    print(f"no-LMS baseline: batch {baseline['batch']}, {baseline['throughput']:.1f} samples/s")
    print(f"grid hypervolume: {hv_grid:.1f} (ref 0,0); {hv_grid_strict:.1f} (ref = baseline batch, 0)")

    runs = []
    for sampler in args.samplers:
        for seed in args.seeds:
            run = run_tuner(space, grid, sampler=sampler, seed=seed, trials=trials, usable=usable, device=args.device)
            curve = run["hv_curve"]
            run["hv_fraction"] = curve[-1] / hv_grid if hv_grid else 0.0
            run["hv_fraction_strict"] = (hypervolume(run["points"], ref_strict) / hv_grid_strict
                                         if hv_grid_strict else 0.0)
            reach = next((i + 1 for i, hv in enumerate(curve) if hv >= args.target * hv_grid), None)
            run["trials_to_target"] = reach
            runs.append(run)
            print(f"  {sampler:6s} seed {seed}: {run['hv_fraction']:.1%} of the grid's hypervolume after "
                  f"{run['trials']} trials ({run['trials'] / n_grid:.1%} of the grid), strict "
                  f"{run['hv_fraction_strict']:.1%}; {args.target:.0%} reached after {reach} trials; "
                  f"{run['repeats']} repeats answered from the study; {run['simulation_seconds']:.0f} s of "
                  "simulation",
                  flush=True)

    summary = {}
    for sampler in args.samplers:
        mine = [r for r in runs if r["sampler"] == sampler]
        fr = sorted(r["hv_fraction"] for r in mine)
        strict = sorted(r["hv_fraction_strict"] for r in mine)
        reach = [r["trials_to_target"] for r in mine]
        summary[sampler] = {
            "hv_fraction_min": fr[0], "hv_fraction_median": fr[len(fr) // 2],
            "hv_fraction_strict_min": strict[0], "hv_fraction_strict_median": strict[len(strict) // 2],
            "trials_to_target": reach,
            "trials_to_target_max": None if None in reach else max(reach),
            "passes": fr[0] >= args.target and trials <= 0.15 * n_grid,
        }
    doc = {
        "benchmark": "tuner_efficiency", "model": args.model, "budget_bytes": args.budget, "usable_bytes": usable,
        "device": args.device, "backend": "simulate", "figures": "PREDICTED by the simulator",
        "space": space.to_dict(), "grid_distinct_configs": n_grid, "grid_points": len(space.grid()),
        "tuner_trials": trials, "tuner_trials_fraction_of_grid": trials / n_grid, "target": args.target,
        "grid_hypervolume": hv_grid, "grid_hypervolume_strict": hv_grid_strict,
        "reference_points": {"standard": [0, 0], "strict": list(ref_strict)},
        "grid_pareto_front": pareto(grid_points), "baseline": baseline,
        "grid_simulation_seconds": round(sum(r["seconds"] for r in grid.values()), 1),
        "model_fingerprint": _model_fingerprint(),
        "summary": summary, "runs": runs, "wall_s": round(time.monotonic() - t0, 1),
    }
    atomic_write_text(args.out, json.dumps(doc, indent=1) + "\n")
    print("\nsummary:")
    for sampler, s in summary.items():
        print(f"  {sampler}: {trials} trials = {trials / n_grid:.1%} of the grid; hypervolume min "
              f"{s['hv_fraction_min']:.1%} / median {s['hv_fraction_median']:.1%} of the grid's "
              f"(strict: min {s['hv_fraction_strict_min']:.1%}); {args.target:.0%} reached after "
              f"{s['trials_to_target']} trials -> {'PASS' if s['passes'] else 'FAIL'}")
    print(f"wrote {args.out}")
    return 0 if all(s["passes"] for k, s in summary.items() if k == "tpe") else 1


if __name__ == "__main__":
    sys.exit(main())
