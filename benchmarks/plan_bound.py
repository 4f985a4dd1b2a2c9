"""How far can any LMS plan go? Every zoo workload's best simulated batch against a bound on every plan's (PREDICTED).

For every workload of the zoo (`tuner.models.builtin_names`: mlp, cnn_bn, residual,
resnet50, unet3d, gpt2_small), 16 GiB, per device profile, this prints the
simulator's no-LMS max batch, the best max batch of a few swap/recompute configs
(`lms.simulator.max_batch`), and `lms.sim.bound.max_batch_bound`: the largest batch
at which no plan's simulated peak can fit (resident bytes + step inputs + the
largest single-op floor: inputs, outputs, temporaries and the backward buffers
live across the op in every order), with the op that sets it. It asserts that no
config's batch exceeds the bound.

Options: ResNet-50, the 3D U-Net and GPT-2 small as in ``benchmarks/paper.py``'s
rows (224x224; whole 192^3 x4 volumes, 32 base filters; seq 2048). mlp, cnn_bn and
residual take the zoo's default options (what ``python -m tuner search --model
<name>`` uses): samples of a few KiB, so 16 GiB holds 10^5-10^7 of them (the mlp
18-27 million) and the searches' limit is raised to 2^26 (`LIMIT`; the simulator's
default, 2^20, caps the mlp); a batch that reaches it is reported as capped.

For the 3D U-Net it also answers the resolution question at batch 1 on the P100
profile: the largest cubic ``input_size`` (multiples of 16) without LMS, with the
best of the configs, and the largest any plan could fit (the bound's floor at
batch 1 within 16 GiB). Input size changes the graph, so each size is traced once
(`benchmarks.paper.load_graph`, cached) and the sizes are bracketed and bisected
as ``tuner search --grow`` does (`tuner.grow.largest_fitting`). It asserts that no
config fits at the bound's first failing size. Graphs are traced once by a worker
(TensorFlow) and cached in benchmarks/results/cache/. Every figure is PREDICTED.

    nice -n 10 python benchmarks/plan_bound.py           # about 35-40 s on 2 cores with the graphs cached; about
                                                         # 3 min the first time (16 traces: 6 workloads, 10 sizes)
    nice -n 10 python benchmarks/plan_bound.py --rows resnet50 gpt2_small --no-input-size   # about 25 s
    nice -n 10 python benchmarks/plan_bound.py --grids   # also assert every config of paper.py's and
                                                         # recompute.py's grids (65-80 a workload) stays under
                                                         # the bound (with --devices P100-16GB: about 3.5 min)

Writes benchmarks/results/plan_bound.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.paper import ROWS, RowSpec, load_graph  # noqa: E402
from lms import LMSConfig, plan_swaps  # noqa: E402
from lms.config import atomic_write_text  # noqa: E402
from lms.sim.bound import max_batch_bound, peak_floor  # noqa: E402
from lms.simulator import InfeasibleBudget, max_batch  # noqa: E402
from tuner.grow import MAX_STEPS, largest_fitting  # noqa: E402
from tuner.models import builtin_names  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "plan_bound.json"
BUDGET = 16 << 30
DEVICES = ("P100-16GB", "V100-16GB", "A100-40GB")
WORKLOADS = builtin_names()
LIMIT = 1 << 26  # the largest batch tried (max_batch's and max_batch_bound's default, 1 << 20, caps the mlp)
TARGETS = {"resnet50": 1190, "gpt2_small": "10x"}  # gpt2: 10x its no-LMS batch (issue 15); resnet50: 6x, 1,190
CONFIGS = tuple(LMSConfig(n_tensors=-1, lb=lb, schedule=s, fuse_swapins=fuse, recompute=rc)
                for s, lb, fuse, rc in [("memory", 1, False, "none"), ("memory", 1, False, "cheap"),
                                        ("memory", 1, True, "none"), ("memory", 1, True, "cheap"),
                                        ("tf", 1, False, "cheap"), ("tf", 1, True, "cheap")])
INPUT_SIZE = {"workload": "unet3d", "option": "input_size", "device": "P100-16GB", "batch": 1, "start": 192,
              "step": 16}  # step: 2**(levels-1), the zoo's `growable` for unet3d
GiB = 1 << 30


def workload_spec(name: str, options: dict[str, Any] | None = None) -> RowSpec:
    """The spec `load_graph` traces for zoo workload `name`: paper.py's row, else the zoo's default options.

    With `options`, the paper row's options updated by them (a row key of their own, e.g. ``unet3d-input_size-240``).
    """
    base = next((r for r in ROWS if r.key == name), None)
    if base is None:
        if name not in WORKLOADS:
            raise ValueError(f"workload={name!r}: not a zoo workload; allowed: {', '.join(WORKLOADS)}")
        base = RowSpec(key=name, title=f"{name} (zoo default options)", workload=name, options={}, paper=None,
                       why="the zoo's default options, as `python -m tuner search --model NAME` uses them")
    if not options or {**base.options, **options} == dict(base.options):
        return base  # the row's own graph (one trace, one cache file)
    key = "-".join([name, *(f"{k}-{v}" for k, v in sorted(options.items()))])
    return RowSpec(key=key, title=f"{base.title} with {options}", workload=base.workload,
                   options={**base.options, **options}, paper=None, why=base.why, n_tensors=base.n_tensors)


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


def plans_for(graph, configs) -> dict[LMSConfig, Any]:
    """Each config's validated plan; a config the planner cannot plan is left out (as paper.py does)."""
    plans = {}
    for c in configs:
        try:
            plans[c] = plan_swaps(graph, c, kernels="gpu")  # every profile here is a GPU
            plans[c].validate(graph)
        except ValueError as exc:
            print(f"  skipped {_short(c)}: {type(exc).__name__}: {exc}", file=sys.stderr)
            plans.pop(c, None)
    return plans


def _batch(graph, plan, device: str, *, budget_bytes: int = BUDGET, limit: int = LIMIT) -> tuple[int, bool]:
    """(max batch, capped at `limit`); 0 when batch 1 does not fit."""
    try:
        r = max_batch(graph, plan, budget_bytes, device=device, limit=limit)
    except InfeasibleBudget:
        return 0, False
    return r.batch, r.capped


def evaluate(key: str, graph, device: str, plans: dict[LMSConfig, Any], *, options: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    t0 = time.perf_counter()
    base, base_capped = _batch(graph, None, device)
    rows = []
    for config in plans:
        batch, capped = _batch(graph, plans[config], device)
        rows.append({"config": _short(config), "batch": batch, "capped": capped})
    bound = max_batch_bound(graph, BUDGET, device=device, limit=LIMIT)
    per_op = max_batch_bound(graph, BUDGET, device=device, spanning=False, limit=LIMIT).batch
    best = max(rows, key=lambda r: r["batch"])
    for r in [{"batch": base, "config": "no LMS"}, *rows]:
        assert r["batch"] <= bound.batch <= per_op, f"{key} {device}: {r} beats the bound {bound.batch}"
    target = TARGETS.get(key)
    return {"workload": key, "device": device, "options": options, "no_lms_batch": base,
            "no_lms_capped": base_capped, "configs": rows, "best": best, "bound_batch": bound.batch,
            "bound_capped": bound.capped, "op_only_bound_batch": per_op, "limit": LIMIT,
            "target_batch": 10 * base if target == "10x" else target,
            "bound_at": bound.at_batch.to_dict(),
            "bound_next": bound.next_floor.to_dict() if bound.next_floor else None,
            "search_s": round(time.perf_counter() - t0, 1)}


def fmt_batch(batch: int, capped: bool) -> str:
    """A batch in words: with thousands separators, ">= N (capped at the limit)" where the search stopped there."""
    return f">= {batch:,} (capped at the limit)" if capped else f"{batch:,}"


def report(r: dict[str, Any]) -> str:
    f = r["bound_at"]
    o = f["op"]
    target = r["target_batch"]
    verdict = ("" if target is None else f", target {target} -> "
               + ("reachable under the bound" if target <= r["bound_batch"] else "UNREACHABLE by any plan"))
    lines = [f"{r['workload']} on {r['device']} (PREDICTED, 16 GiB): no LMS "
             f"{fmt_batch(r['no_lms_batch'], r['no_lms_capped'])}, best LMS "
             f"{fmt_batch(r['best']['batch'], r['best']['capped'])} {r['best']['config']}, bound "
             f"{fmt_batch(r['bound_batch'], r['bound_capped'])} (op floor alone {r['op_only_bound_batch']:,}){verdict}",
             f"  bounding op at batch {f['batch']:,}: {o['name']} ({o['type']}, {o['role']}): inputs "
             f"{o['input_bytes'] / GiB:.3f} + outputs {o['output_bytes'] / GiB:.3f} + temporaries "
             f"{o['temporary_bytes'] / GiB:.3f} + kept {o['kept_bytes'] / GiB:.3f} + resident "
             f"{f['resident_bytes'] / GiB:.3f} + step inputs {f['step_input_bytes'] / GiB:.3f} = {f['bytes'] / GiB:.3f} GiB"
             + (f"; at {f['batch'] + 1:,}: {r['bound_next']['bytes'] / GiB:.3f} GiB" if r["bound_next"] else "")]
    for name, n in o["inputs"]:
        lines.append(f"    in   {n / GiB:7.3f} GiB {name}")
    for name, n in o["outputs"]:
        lines.append(f"    out  {n / GiB:7.3f} GiB {name}")
    for name, n in o["kept"][:5]:
        lines.append(f"    kept {n / GiB:7.3f} GiB {name}")
    lines += [f"    {c['batch']:9,d}{'+' if c['capped'] else ' '} {c['config']}" for c in r["configs"][:len(CONFIGS)]]
    if len(r["configs"]) > len(CONFIGS):
        lines.append(f"    ... {len(r['configs']) - len(CONFIGS)} more configs of the paper/recompute grids, all <= the bound")
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]], device: str) -> str:
    """One line per workload on `device`: no LMS, best config, bound and the op that sets it."""
    head = f"{'workload':<11} {'no LMS':>11} {'best LMS':>11} {'bound':>11}  bounding op ({device}, 16 GiB, PREDICTED)"
    lines = [head]
    for r in (r for r in rows if r["device"] == device):
        cells = (fmt_batch(r["no_lms_batch"], r["no_lms_capped"]), fmt_batch(r["best"]["batch"], r["best"]["capped"]),
                 fmt_batch(r["bound_batch"], r["bound_capped"]))
        lines.append(f"{r['workload']:<11} " + " ".join(f"{c:>11}" for c in cells)
                     + f"  {r['bound_at']['op']['name']} ({r['bound_at']['op']['type']})")
    return "\n".join(lines)


# ---------------------------------------------------------------- the U-Net's input size at batch 1

def input_size_bound(*, load: Callable[[int], Any] | None = None, configs=CONFIGS, budget_bytes: int = BUDGET,
                     device: str = INPUT_SIZE["device"], start: int = INPUT_SIZE["start"],
                     step: int = INPUT_SIZE["step"], highest: int = INPUT_SIZE["step"] * MAX_STEPS) -> dict[str, Any]:
    """The largest cubic input at batch 1: no LMS, the best of `configs`, and the bound (no plan fits above it).

    `load(size)` gives the graph at that size (default: the U-Net traced by `load_graph`, cached). Each of the
    three is bracketed and bisected in multiples of `step` (`tuner.grow.largest_fitting`); the searches with
    and without LMS stop at the bound's largest size. At the bound's first failing size every config and no
    LMS are simulated too and must not fit.
    """
    if load is None:
        def load(size: int) -> Any:
            return load_graph(workload_spec(INPUT_SIZE["workload"], {INPUT_SIZE["option"]: size}))[0]
    batch = INPUT_SIZE["batch"]
    seen: dict[int, dict[str, Any]] = {}
    graphs: dict[int, Any] = {}

    def graph(size: int) -> Any:
        if size not in graphs:
            graphs[size] = load(size)
            seen[size] = {"size": size}
        return graphs[size]

    def bound_fits(size: int) -> bool:
        floor = peak_floor(graph(size), batch, device=device)
        seen[size].update(floor_bytes=floor.bytes, floor_op=floor.op.op, floor_op_type=floor.op.type)
        return floor.bytes <= budget_bytes

    def fits(g: Any, plan: Any) -> bool:
        return _batch(g, plan, device, budget_bytes=budget_bytes, limit=batch)[0] >= batch

    def best_fits(size: int) -> bool:
        g = graph(size)
        if "fitting_configs" not in seen[size]:
            seen[size]["fitting_configs"] = [_short(c) for c, p in plans_for(g, configs).items() if fits(g, p)]
        return bool(seen[size]["fitting_configs"])

    def none_fits(size: int) -> bool:
        g = graph(size)
        if "no_lms_fits" not in seen[size]:
            seen[size]["no_lms_fits"] = fits(g, None)
        return seen[size]["no_lms_fits"]

    t0 = time.perf_counter()
    bound = largest_fitting(bound_fits, start=start, step=step, lowest=step, highest=highest)
    top = bound.largest or step
    best = largest_fitting(best_fits, start=min(start, top), step=step, lowest=step, highest=top)
    base = largest_fitting(none_fits, start=min(start, top), step=step, lowest=step, highest=top)
    failing = bound.smallest_failing
    if failing is not None:  # the check: no config (nor no LMS) fits where the bound says no plan can
        assert not best_fits(failing) and not none_fits(failing), \
            f"a config fits {INPUT_SIZE['option']}={failing}, above the bound {bound.largest}"
    for b in (base, best):
        assert (b.largest or 0) <= (bound.largest or 0), f"{b} above the bound {bound}"

    def said(b) -> dict[str, Any]:  # a search stopped at the bound's largest fails where the bound does (checked)
        return {"largest": b.largest, "first_failing": failing if b.smallest_failing is None else b.smallest_failing,
                "probes": [list(p) for p in b.probes]}

    return {"workload": INPUT_SIZE["workload"], "option": INPUT_SIZE["option"], "device": device, "batch": batch,
            "budget_bytes": budget_bytes, "step": step, "start": start, "no_lms": said(base), "best": said(best),
            "best_configs": seen[best.largest]["fitting_configs"] if best.largest else [],
            "bound": said(bound), "bound_at": seen.get(bound.largest), "bound_first_failing": seen.get(failing),
            "sizes": [seen[s] for s in sorted(seen)],
            "search_s": round(time.perf_counter() - t0, 1),
            "rule": f"multiples of {step} from {start}: double while it fits (halve while not), then bisect; the "
                    "best config's and no LMS's searches stop at the bound's largest"}


def input_size_report(d: dict[str, Any]) -> str:
    def cube(v: Any) -> str:
        return f"{v}^3" if v else "none"

    def floor(s: dict[str, Any] | None) -> str:
        return (f"{s['floor_bytes'] / GiB:.2f} GiB at {s['floor_op']} ({s['floor_op_type']})"
                if s and "floor_bytes" in s else "-")

    def mark(s: dict[str, Any]) -> str:  # y / n per question, . where it was not asked
        under = None if "floor_bytes" not in s else s["floor_bytes"] <= d["budget_bytes"]
        lms = None if "fitting_configs" not in s else bool(s["fitting_configs"])
        return "".join("." if v is None else "yn"[not v] for v in (s.get("no_lms_fits"), lms, under))

    lines = [
        f"{d['workload']} largest cubic {d['option']} at batch {d['batch']} on {d['device']} (PREDICTED, 16 GiB): "
        f"no LMS {cube(d['no_lms']['largest'])}, best LMS {cube(d['best']['largest'])}, bound "
        f"{cube(d['bound']['largest'])} (no plan fits {cube(d['bound']['first_failing'])})",
        f"  best configs at {cube(d['best']['largest'])}: {d['best_configs']}",
        f"  bound's floor at {cube(d['bound']['largest'])}: {floor(d['bound_at'])}",
        f"  at {cube(d['bound']['first_failing'])}: {floor(d['bound_first_failing'])}",
        "  sizes traced (fits without LMS / with a config / under the bound's floor; y, n, . not asked): "
        + ", ".join(f"{s['size']} {mark(s) or '-'}" for s in d["sizes"]) + f" [{d['search_s']:.0f} s]"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", choices=WORKLOADS, default=list(WORKLOADS), help="zoo workloads")
    parser.add_argument("--devices", nargs="+", default=list(DEVICES), help="device profiles")
    parser.add_argument("--grids", action="store_true", help="also every config of paper.py's and recompute.py's grids")
    parser.add_argument("--no-input-size", action="store_true",
                        help="skip the 3D U-Net's largest input at batch 1 (traces a graph per size)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    t0 = time.perf_counter()
    out = []
    for key in args.rows:
        spec = workload_spec(key)
        graph, workload, _ = load_graph(spec)
        plans = plans_for(graph, grids(spec, graph) if args.grids else CONFIGS)
        for device in args.devices:
            out.append(evaluate(key, graph, device, plans, options=workload.get("options") or dict(spec.options)))
            print(report(out[-1]), flush=True)
    doc = {"label": "PREDICTED by lms.simulator / lms.sim.bound", "budget_bytes": BUDGET, "grids": args.grids,
           "workloads": list(args.rows), "rows": out}
    if not args.no_input_size:
        doc["unet3d_input_size"] = input_size_bound()
        print(input_size_report(doc["unet3d_input_size"]), flush=True)
    print("\n" + summary(out, args.devices[0]))
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    atomic_write_text(RESULTS, json.dumps(doc, indent=1) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)} [{doc['wall_s']:.0f} s]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
