"""How long LMS takes to rewrite a traced ResNet-50 training step: extract + plan + apply.

The step (keras.applications.ResNet50, weights=None, 224x224, batch 8, SGD with
momentum) is traced through `lms.function` once per config; inside that trace,
after the step's Python code has built the graph, LMS times its three phases
(`LMSFunction.timings`):

- extract: `lms.tf.extract.extract_graph` (TF graph -> graph model),
- plan: `lms.plan_swaps` + `lms.tf.apply.anchor_triggers` + `SwapPlan.validate`,
- apply: `lms.tf.apply.apply_plan` (insert swap ops, reroute, add triggers),
- schedule: for configs that pin an order (``schedule="memory"``, ``sync_mode``,
  ``serialization``): `lms.schedule.schedule_ops` + `lms.tf.pin.apply_schedule`,
- check: `lms.tf.equivalence.ensure_equivalent` (Grappler run offline on the step
  without and with LMS, compared), timed apart: ``check_s`` is the first trace of
  each config with nothing cached (the step without LMS is optimized once per
  config here: the caches are emptied before each config), ``check_cached_s`` a
  later trace of the same config (the verdict remembered; what a second ``fit``
  trace, a restarted script or a tuner trial of a known config pays).

Target: plan + apply + schedule <= 1 s, and the check within it or cached. A plain
``tf.function`` trace of the same step is timed too (the first trace, which LMS
adds its phases to).

``--whole`` also runs the first call of each memory-scheduled step, which on this
CPU pins the step whole (`lms.tf.exact`): a dry run that instantiates the traced
step (TF's Grappler runs here instead of on the first real call), the rebuild of
its optimized graph with the chain, a dry run of that (oneDNN's kernels checked),
then the step itself; the first call of a plain ``tf.function`` is timed beside it.

    .venv/bin/python benchmarks/plan_apply.py            # ResNet-50, 224x224, batch 8
    .venv/bin/python benchmarks/plan_apply.py --quick    # 64x64 (same graph, smaller tensors)

Prints a table and writes benchmarks/results/plan_apply.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

RESULTS = ROOT / "benchmarks" / "results" / "plan_apply.json"
TARGET_S = 1.0

CONFIGS: dict[str, dict[str, Any]] = {
    "paper (n_tensors=100, lb=5)": {"n_tensors": 100, "lb": 5},
    "all, lb=1": {"n_tensors": -1, "lb": 1},
    "all, direct_order, fused, branches": {"n_tensors": -1, "lb": 3, "ctrld_strategy": "direct_order",
                                           "fuse_swapins": True, "swap_branches": True,
                                           "branch_threshold": 20},
    "all, lb=1, recompute=cheap": {"n_tensors": -1, "lb": 1, "recompute": "cheap"},
    "all, lb=3, fused, recompute=cheap": {"n_tensors": -1, "lb": 3, "fuse_swapins": True, "recompute": "cheap"},
    "all, lb=3, schedule=memory": {"n_tensors": -1, "lb": 3, "schedule": "memory"},
    "all, lb=3, schedule=memory, sync_mode=3": {"n_tensors": -1, "lb": 3, "schedule": "memory", "sync_mode": 3},
    "all, lb=1, schedule=memory, prefetch=headroom": {"n_tensors": -1, "lb": 1, "schedule": "memory",
                                                      "prefetch": "headroom"},
    "all, lb=1, schedule=memory, prefetch=headroom, recompute=cheap": {
        "n_tensors": -1, "lb": 1, "schedule": "memory", "prefetch": "headroom", "recompute": "cheap"},
}


_CACHE_DIRS: list[Any] = []


def _forget_checks() -> None:
    """Empty the equivalence check's caches (this process's and the disk's: a temporary folder)."""
    import tempfile

    from lms.tf.equivalence import clear_cache

    folder = tempfile.TemporaryDirectory(prefix="lms-bench-cache-")  # removed when the run ends
    _CACHE_DIRS.append(folder)
    os.environ["LMS_CACHE_DIR"] = folder.name
    clear_cache()


def _build(image_size: int) -> tuple[Any, Any, Any]:
    import keras

    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(image_size, image_size, 3), classes=1000)
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    optimizer.build(model.trainable_variables)
    return model, keras.losses.SparseCategoricalCrossentropy(), optimizer


def run(*, image_size: int, batch: int, emulate: bool, repeats: int,
        configs: list[str] | None = None, whole: bool = False) -> dict[str, Any]:
    import tensorflow as tf

    import lms
    from lms.tf.train import make_train_step

    model, loss_fn, optimizer = _build(image_size)
    x_spec = tf.TensorSpec([batch, image_size, image_size, 3])
    y_spec = tf.TensorSpec([batch], tf.int32)

    start = time.perf_counter()
    plain = tf.function(make_train_step(model, loss_fn, optimizer))
    plain.get_concrete_function(x_spec, y_spec)
    plain_trace_s = time.perf_counter() - start
    x, y = tf.zeros(x_spec.shape), tf.zeros(y_spec.shape, tf.int32)
    plain_first_call_s = None
    if whole:
        start = time.perf_counter()
        plain(x, y).numpy()
        plain_first_call_s = time.perf_counter() - start

    rows = []
    for label, fields in CONFIGS.items():
        if configs is not None and label not in configs:
            continue
        runs = []
        _forget_checks()
        for _ in range(repeats):
            gc.collect()
            step = lms.function(make_train_step(model, loss_fn, optimizer), config=lms.LMSConfig(**fields),
                                emulate=emulate)
            start = time.perf_counter()
            step.get_concrete_function(x_spec, y_spec)
            runs.append({**step.timings, "trace_s": time.perf_counter() - start})
        for r in runs:
            r.setdefault("schedule_s", 0.0)
            r.setdefault("check_s", 0.0)
            r["plan_plus_apply_s"] = r["plan_s"] + r["apply_s"] + r["schedule_s"]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        med["check_s"] = runs[0]["check_s"]  # nothing cached: the first trace
        med["check_cached_s"] = statistics.median(r["check_s"] for r in runs[1:]) if len(runs) > 1 else None
        plan = step.plan
        pinned: dict[str, Any] = {}
        if whole and fields.get("schedule") == "memory":  # the last trace's first call
            start = time.perf_counter()
            step(x, y).numpy()
            pinned = {"first_call_s": time.perf_counter() - start, "pinned_whole": step.pinned_whole is not None,
                      "whole_reason": step.whole_reason,
                      **({f"whole_{k}": v for k, v in step.pinned_whole.timings.items()} if step.pinned_whole else {})}
        rows.append({**pinned,
            "config": label, "config_fields": plan.config.to_dict(), **med,
            "plan_plus_apply_min_s": min(r["plan_plus_apply_s"] for r in runs),
            "plan_plus_apply_max_s": max(r["plan_plus_apply_s"] for r in runs), "runs": runs,
            "n_swapped": plan.n_swapped, "n_swap_ins": plan.n_swap_ins,
            "swapped_mib": plan.swapped_bytes / 2**20, "inserted_ops": len(step.applied.inserted_ops),
            "n_recomputed": plan.n_recomputed, "recomputed_mib": plan.recomputed_bytes / 2**20,
            "n_corrections": len(step.summary.corrections),
        })

    return {
        "model": "keras.applications.ResNet50(weights=None)", "image_size": image_size, "batch": batch,
        "n_ops": len(step.graph.ops), "swap_ops": step.swap_ops, "plain_trace_s": plain_trace_s,
        "plain_first_call_s": plain_first_call_s,
        "repeats": repeats, "statistic": "median over repeats (each a fresh trace)",
        "target_plan_plus_apply_s": TARGET_S, "configs": rows,
        "environment": {"python": platform.python_version(), "tensorflow": tf.__version__,
                        "machine": platform.machine(), "cpus": os.cpu_count()},
    }


def _print(result: dict[str, Any]) -> None:
    print(f"ResNet-50 {result['image_size']}x{result['image_size']}, batch {result['batch']}: "
          f"{result['n_ops']} ops before LMS, {result['swap_ops']} swap ops; "
          f"plain tf.function trace {result['plain_trace_s']:.1f} s")
    print(f"medians of {result['repeats']} traces per config")
    print(f"{'config':42s} {'swapped':>7s} {'MiB':>6s} {'ops':>5s} {'extract':>8s} {'plan':>7s} {'apply':>7s} "
          f"{'schedule':>8s} {'plan+apply':>10s} {'(min-max)':>11s} {'trace':>7s} {'check':>7s} {'cached':>7s}")
    for r in result["configs"]:
        ok = "ok" if r["plan_plus_apply_s"] <= TARGET_S else "OVER TARGET"
        print(f"{r['config']:42s} {r['n_swapped']:7d} {r['swapped_mib']:6.0f} {r['inserted_ops']:5d} "
              f"{r['extract_s']:7.2f}s {r['plan_s']:6.2f}s {r['apply_s']:6.2f}s {r['schedule_s']:7.2f}s "
              f"{r['plan_plus_apply_s']:9.2f}s "
              f"({r['plan_plus_apply_min_s']:.2f}-{r['plan_plus_apply_max_s']:.2f}) {r['trace_s']:6.1f}s "
              f"{r['check_s']:6.2f}s {_seconds(r['check_cached_s'])}  {ok}")
    for r in result["configs"]:
        if "first_call_s" in r:
            what = (f"pinned whole: capture {r['whole_capture_s']:.2f} s, rebuild {r['whole_rebuild_s']:.2f} s, "
                    f"check {r['whole_verify_s']:.2f} s" if r["pinned_whole"] else f"not pinned whole: {r['whole_reason']}")
            print(f"{r['config']:42s} first call {r['first_call_s']:.1f} s (plain tf.function "
                  f"{result['plain_first_call_s']:.1f} s); {what}")


def _seconds(value: float | None) -> str:
    return "      -" if value is None else f"{value:6.2f}s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image-size", type=int, default=224, help="input height and width (default 224)")
    parser.add_argument("--batch", type=int, default=8, help="batch size (default 8)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="traces per config; the table shows medians (default 3)")
    parser.add_argument("--device-swap-ops", action="store_true",
                        help="real (identity) swap ops instead of the emulated ones (default on CPU)")
    parser.add_argument("--quick", action="store_true", help="64x64 inputs (same graph, faster)")
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"JSON output (default {RESULTS})")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS), metavar="CONFIG",
                        help="configs to time (default: all)")
    parser.add_argument("--whole", action="store_true",
                        help="also time the first call of memory-scheduled steps (pinned whole on this CPU)")
    args = parser.parse_args(argv)
    from lms.config import atomic_write_text

    result = run(image_size=64 if args.quick else args.image_size, batch=args.batch,
                 emulate=not args.device_swap_ops, repeats=args.repeats, configs=args.configs, whole=args.whole)
    _print(result)
    atomic_write_text(args.output, json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
