"""``config="auto"`` against the tuner's confirmed recommendation: ResNet-50 64x64 on the emulated device.

1. The batch auto reaches (PREDICTED): the step's graph model is traced once and
   `lms.auto.choose_config` asked for batch 4096 at the default search's budget
   (576 MiB): no config fits, and `NoConfigFits.max_batch` is the largest batch
   the config with the smallest peak fits; auto's choice at that batch is the
   config it would run.
2. That batch, run (MEASURED, fresh process): ``lms.function(step, config="auto",
   budget=...)``: TF's allocator peak over 3 timed steps (after 2 warm-up steps),
   samples/s, auto's own check of the second call's peak, and how long choosing
   and rewriting took next to a plain ``tf.function`` trace of the same step (both
   after a first, untimed trace: Keras and TF warm up on the first one in a process).
3. The tuner's recommendation (`--recommended`, default: the committed default
   search's ``recommended.json``), its config at its batch, in a fresh process
   right after, so both throughputs come from the same minutes of this machine.

    python benchmarks/auto.py                      # about 6-8 minutes on 2 cores; run on a quiet machine

Prints a table and writes benchmarks/results/auto.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results" / "auto.json"
RECOMMENDED = ROOT / "benchmarks" / "results" / "default_search_resnet50_emulated" / "simstart1_recommended.json"
BUDGET = 576 << 20
MODEL, OPTIONS = "resnet50", {"image_size": 64}


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), TF_CPU_ALLOCATOR_USE_BFC="true", TF_CPP_MIN_LOG_LEVEL="2",
                TF_ENABLE_ONEDNN_OPTS="1")


def _setup(batch: int | None) -> tuple[Any, ...]:
    import keras

    from lms.tf.train import make_train_step
    from tuner.models.base import load_workload

    workload = load_workload(MODEL, **OPTIONS)
    keras.utils.set_random_seed(0)
    model = workload.build_model()
    optimizer = workload.make_optimizer()
    optimizer.build(model.trainable_variables)
    data = workload.make_batch(batch, 0) if batch else None
    return workload, model, optimizer, make_train_step(model, workload.loss_fn, optimizer), data


def predict() -> dict[str, Any]:
    """Step 1, in this process: the batch auto reaches and its choice there (no step runs)."""
    from lms.auto import NoConfigFits, choose_config
    from lms.tf.extract import trace_train_step

    workload, model, optimizer, _, _ = _setup(None)
    graph, _ = trace_train_step(model, workload.loss_fn, optimizer, workload.x_spec(batch_size=None),
                                workload.y_spec(batch_size=None), name=MODEL)
    try:
        choose_config(graph, batch=4096, budget=BUDGET, device="cpu", exact=True)
        raise SystemExit("batch 4096 fits: raise the probe batch")
    except NoConfigFits as exc:
        batch = exc.max_batch
    start = time.perf_counter()
    choice = choose_config(graph, batch=batch, budget=BUDGET, device="cpu", exact=True)
    return {"batch": batch, "label": choice.label, "config": choice.config.to_dict(),
            "predicted_peak_bytes": choice.peak_bytes, "usable_bytes": choice.usable_bytes,
            "choose_s_in_benchmark": time.perf_counter() - start}


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """Steps 2 and 3, in a fresh process: one config (or "auto") at one batch."""
    from lms.tf.allocator import configure_cpu_allocator
    from lms.tf.measure import measure_step

    configure_cpu_allocator()
    import tensorflow as tf

    import lms

    _, _, _, step, data = _setup(spec["batch"])
    specs = [tf.TensorSpec(a.shape, a.dtype) for a in data]
    tf.function(step).get_concrete_function(*specs)  # the first trace in a process warms Keras and TF up
    start = time.perf_counter()
    tf.function(step).get_concrete_function(*specs)
    plain_trace_s = time.perf_counter() - start
    if spec["config"] == "auto":
        fn = lms.function(step, config="auto", budget=BUDGET)
    else:
        fn = lms.function(step, config=lms.LMSConfig.from_dict(spec["config"]))
    start = time.perf_counter()
    fn.get_concrete_function(*specs)
    lms_trace_s = time.perf_counter() - start
    m = measure_step(fn, data, warmup=2, steps=3)
    summary = fn.summary
    return {"config": summary.config.to_dict(), "batch": spec["batch"], "peak_bytes": m.peak_device_bytes,
            "step_peaks_bytes": list(m.step_peaks_bytes), "step_time_s": m.median_step_s,
            "step_times_s": list(m.step_times_s),
            "samples_per_s": spec["batch"] / m.median_step_s, "plain_trace_s": plain_trace_s,
            "lms_trace_s": lms_trace_s, "timings": fn.timings,
            "auto_checked_peak_bytes": getattr(fn, "auto_measured_peak_bytes", None),
            "auto": summary.auto.to_dict() if summary.auto is not None else None}


def _fresh(spec: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--run", json.dumps(spec)], env=_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"run {spec} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--recommended", type=Path, default=RECOMMENDED,
                        help="the tuner's recommended.json to compare with (default: %(default)s)")
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run_one(json.loads(args.run))))
        return
    recommended = json.loads(args.recommended.read_text(encoding="utf-8"))
    predicted = predict()
    auto = _fresh({"config": "auto", "batch": predicted["batch"]})
    tuner = _fresh({"config": recommended["config"], "batch": int(recommended["batch_size"])})
    mib = 1 << 20
    rows = [("auto (MEASURED)", auto), ("tuner's recommendation (MEASURED)", tuner)]
    print(f"ResNet-50 64x64, emulated device, budget {BUDGET // mib} MiB; auto's batch {predicted['batch']} "
          f"({predicted['label']}, PREDICTED peak {predicted['predicted_peak_bytes'] / mib:.1f} MiB)")
    print(f"{'':36} {'batch':>6} {'peak MiB':>9} {'samples/s':>10} {'trace s':>8} {'plain trace s':>14}")
    for name, r in rows:
        print(f"{name:36} {r['batch']:>6} {r['peak_bytes'] / mib:>9.1f} {r['samples_per_s']:>10.1f} "
              f"{r['lms_trace_s']:>8.2f} {r['plain_trace_s']:>14.2f}")
    print(f"auto chose in {auto['timings'].get('choose_s', 0):.2f} s; trace with auto {auto['lms_trace_s']:.2f} s "
          f"vs plain {auto['plain_trace_s']:.2f} s (+{auto['lms_trace_s'] - auto['plain_trace_s']:.2f} s); "
          f"fits the budget: {auto['peak_bytes'] <= BUDGET}; batch {auto['batch'] / tuner['batch']:.2f}x and "
          f"throughput {auto['samples_per_s'] / tuner['samples_per_s']:.2f}x the tuner's")
    RESULTS.write_text(json.dumps({"budget_bytes": BUDGET, "model": MODEL, "options": OPTIONS,
                                   "predicted": predicted, "auto": auto, "tuner": tuner,
                                   "tuner_recommended": str(args.recommended.relative_to(ROOT)),
                                   "command": "python benchmarks/auto.py"}, indent=1) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
