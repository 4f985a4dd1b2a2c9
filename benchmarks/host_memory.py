"""Host memory swapping holds: MEASURED on the emulated device against the simulator's PREDICTION.

Part 1 (MEASURED vs PREDICTED), per zoo model, every candidate swapped (``n_tensors=-1, lb=1``), one fresh
process each: ``lms.function(..., emulate=True)`` and ``measure_step(executor="single_threaded")`` (2 warm-up
steps, 3 timed); the measured figure is the peak of the emulated swap copies' host bytes over the timed steps
(`lms.tf.emulate.HOST_COPIES`: a swap-out's numpy copy counted from its creation until TF releases it). The
predicted figures, on the graph the step traced with the plan it applied:

- ``summary``: `LMSSummary.peak_host_bytes` (the order-based simulator, no device), what ``step.summary`` says;
- ``cpu``: ``simulate(..., device="cpu")`` (TF's single-threaded executor order, the emulated device's model).

Part 3 (PREDICTED only): the README's headline configurations (P100-16GB profile, 16 GiB): each one's max
batch with this code (no host bound) and the host bytes its swapped tensors hold at peak there.

Part 2 (PREDICTED only): ResNet-50 224x224 at 16 GiB with the simulate backend (device profile V100-16GB),
``python -m tuner search --model resnet50 --backend simulate --budget 16GiB --trials N --seed 0`` with
``--host-budget none``, the default (75% of this machine's RAM) and ``--host-budget 8GiB``.

    nice -n 10 python benchmarks/host_memory.py                 # about 10 minutes on 2 cores
    nice -n 10 python benchmarks/host_memory.py --skip-search   # part 1 only

Writes benchmarks/results/host_memory.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results" / "host_memory.json"
MiB = 1 << 20
GiB = 1 << 30
#: (model, options, batch): small enough for a 2-core CPU, large enough to swap tens of MB.
MODELS: list[tuple[str, dict[str, Any], int]] = [
    ("mlp", {}, 256),
    ("cnn_bn", {}, 64),
    ("residual", {}, 64),
    ("resnet50", {"image_size": 64}, 16),
    ("unet3d", {"input_size": 32, "base_filters": 8, "levels": 3}, 2),
    ("gpt2_small", {"seq_len": 128, "n_layers": 2, "d_model": 128, "n_heads": 4, "vocab_size": 1000,
                    "n_positions": 128}, 8),
]
CONFIG = {"n_tensors": -1, "lb": 1}


def child(spec: dict[str, Any], out: Path) -> None:
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import lms
    from lms import LMSConfig
    from lms.config import atomic_write_text
    from lms.simulator import simulate
    from lms.tf.measure import device_batch, measure_step
    from lms.tf.train import make_train_step
    from tuner.models import load_workload

    w = load_workload(spec["model"], **spec["options"])
    model = w.build_model()
    x, y = device_batch(w.make_batch(spec["batch"], seed=0), "/CPU:0")
    step = lms.function(make_train_step(model, w.loss_fn, w.make_optimizer()), config=LMSConfig(**spec["config"]),
                        emulate=True, input_signature=[w.x_spec(), w.y_spec()])
    step.get_concrete_function(w.x_spec(), w.y_spec())
    m = measure_step(step, (x, y), warmup=2, steps=3, device="CPU:0", executor="single_threaded")
    summary = step.summary
    cpu = simulate(step.graph, step.plan, batch=spec["batch"], device="cpu", timeline=False)
    atomic_write_text(out, json.dumps({
        "model": spec["model"], "options": spec["options"], "batch": spec["batch"], "config": spec["config"],
        "n_swapped": summary.n_swapped, "swapped_bytes": summary.swapped_bytes,
        "measured_host_bytes": m.host_copies_peak_bytes,
        "predicted_host_bytes_summary": summary.peak_host_bytes,
        "predicted_host_bytes_cpu": cpu.peak_host_bytes, "predicted_host_op_cpu": cpu.peak_host_op,
        "measured_peak_device_bytes": m.peak_device_bytes, "predicted_peak_device_bytes_cpu": cpu.peak_device_bytes,
        "tf_version": tf.__version__}))


def measure_models(timeout: float) -> list[dict[str, Any]]:
    rows = []
    for model, options, batch in MODELS:
        spec = {"model": model, "options": options, "batch": batch, "config": CONFIG}
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out.json"
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec), str(out)],
                                  env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                                  timeout=timeout)
            if proc.returncode != 0 or not out.exists():
                print(f"  {model}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
                rows.append({**spec, "error": proc.stderr[-500:]})
                continue
            row = json.loads(out.read_text())
        measured, pred = row["measured_host_bytes"], row["predicted_host_bytes_cpu"]
        row["ratio_measured_to_predicted_cpu"] = round(measured / pred, 4) if measured and pred else None
        s = row["predicted_host_bytes_summary"]
        row["ratio_measured_to_predicted_summary"] = round(measured / s, 4) if measured and s else None
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        print(f"  {model:<11} batch {batch:<4} swapped {row['n_swapped']:>4}  measured "
              f"{(measured or 0) / MiB:9.2f} MiB  predicted {pred / MiB:9.2f} MiB (cpu) "
              f"{(s or 0) / MiB:9.2f} MiB (summary)  ratio {row['ratio_measured_to_predicted_cpu']}",
              file=sys.stderr)
        rows.append(row)
    return rows


def search(trials: int, host: str | None, timeout: float) -> dict[str, Any]:
    cmd = ["search", "--model", "resnet50", "--backend", "simulate", "--budget", "16GiB", "--trials", str(trials),
           "--seed", "0", "--no-report", "--study", "host", "--json"]
    if host is not None:
        cmd += ["--host-budget", host]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "tuner", *cmd], cwd=tmp, capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=timeout)
        wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"host_budget_arg": host, "error": proc.stderr[-1000:]}
    doc = json.loads(proc.stdout)
    return {"command": "python -m tuner " + " ".join(cmd), "host_budget_arg": host or "(default)",
            "host_budget_bytes": doc["host_budget"]["bytes"], "host_budget_source": doc["host_budget"]["source"],
            "batch_size": doc["batch_size"], "throughput": round(doc["throughput"], 1),
            "peak_device_bytes": doc["peak_device_bytes"], "peak_host_bytes": doc["peak_host_bytes"],
            "config": {k: doc["config"][k] for k in ("n_tensors", "lb", "schedule", "recompute", "prefetch")},
            "figures": "PREDICTED (" + doc["sources"]["peak_host_bytes"] + ")", "wall_s": round(wall, 1)}


#: The README's headline configurations (P100-16GB profile, 16 GiB): (row key of benchmarks/paper.py, label,
#: config fields or None for no LMS, the batch the README quotes). Each config's max batch is found again
#: with this code (`max_batch`, no host bound) and its host peak taken there (PREDICTED).
HEADLINES: list[tuple[str, str, dict[str, Any] | None, int]] = [
    ("resnet50", "ResNet-50 224, no LMS", None, 198),
    ("resnet50", "ResNet-50 224, schedule=memory lb=1", {"n_tensors": -1, "lb": 1, "schedule": "memory"}, 1120),
    ("resnet50", "ResNet-50 224, schedule=memory lb=1 prefetch=headroom",
     {"n_tensors": -1, "lb": 1, "schedule": "memory", "prefetch": "headroom"}, 1048),
    ("gpt2_small", "GPT-2 small seq 2048, schedule=memory lb=1 recompute=cheap",
     {"n_tensors": -1, "lb": 1, "schedule": "memory", "recompute": "cheap"}, 22),
    ("unet3d", "3D U-Net 192^3, schedule=memory lb=1", {"n_tensors": -1, "lb": 1, "schedule": "memory"}, 1),
]


def headlines() -> list[dict[str, Any]]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import paper

    from lms import LMSConfig, plan_swaps
    from lms.simulator import InfeasibleBudget, max_batch

    specs = {r.key: r for r in paper.ROWS}
    rows = []
    for key, label, fields, readme_batch in HEADLINES:
        graph, _, _ = paper.load_graph(specs[key])
        plan = plan_swaps(graph, LMSConfig(**fields), kernels="gpu") if fields else None  # the P100 profile
        try:  # as benchmarks/recompute.py finds the batch: max_batch of the plan at 16 GiB, P100 profile
            m = max_batch(graph, plan, 16 * GiB, device="P100-16GB")
        except InfeasibleBudget as exc:
            rows.append({"row": label, "config": fields, "batch": 0, "readme_batch": readme_batch,
                         "error": str(exc)[:300]})
            continue
        rows.append({"row": label, "config": fields, "batch": m.batch, "readme_batch": readme_batch,
                     "device": "P100-16GB", "budget_bytes": 16 * GiB, "peak_device_bytes": m.peak_bytes,
                     "peak_host_bytes": m.peak_host_bytes, "throughput": round(m.throughput, 1),
                     "figures": "PREDICTED (simulator, P100-16GB profile, max_batch at 16 GiB, no host bound)"})
        print(f"  {label}: batch {m.batch} (README {readme_batch}), host {m.peak_host_bytes / GiB:.1f} GiB, "
              f"device {m.peak_bytes / GiB:.2f} GiB", file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--trials", type=int, default=20, help="trials per ResNet-50 search (default: %(default)s)")
    parser.add_argument("--skip-search", action="store_true", help="part 1 only")
    parser.add_argument("--skip-measure", action="store_true", help="part 2 only (keeps part 1 of the JSON)")
    parser.add_argument("--skip-headlines", action="store_true", help="keep part 3 of the JSON")
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.child:
        child(json.loads(args.child[0]), Path(args.child[1]))
        return 0
    from lms.config import atomic_write_text

    old = json.loads(args.output.read_text()) if args.output.exists() else {}
    doc: dict[str, Any] = {"benchmark": "host_memory", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if args.skip_measure:
        doc["emulated"] = old.get("emulated", [])
    else:
        print("part 1: emulated device, MEASURED vs PREDICTED host bytes", file=sys.stderr)
        doc["emulated"] = measure_models(args.timeout)
    doc["emulated_how"] = ("MEASURED: peak of the emulated swap copies' host bytes over 3 timed steps "
                           "(lms.tf.emulate.HOST_COPIES, measure_step(executor='single_threaded')); PREDICTED: "
                           "simulate(step.graph, step.plan, device='cpu').peak_host_bytes and step.summary."
                           "peak_host_bytes; config n_tensors=-1 lb=1")
    if args.skip_search:
        doc["resnet50_16GiB"] = old.get("resnet50_16GiB", [])
    else:
        print(f"part 2: ResNet-50 224 at 16 GiB, simulate backend, {args.trials} trials each (PREDICTED)",
              file=sys.stderr)
        doc["resnet50_16GiB"] = []
        for host in ("none", None, "8GiB"):
            row = search(args.trials, host, args.timeout)
            doc["resnet50_16GiB"].append(row)
            print(f"  --host-budget {row.get('host_budget_arg')}: batch {row.get('batch_size')}, peak_host_bytes "
                  f"{(row.get('peak_host_bytes') or 0) / GiB:.2f} GiB ({row.get('error', '')[:200]})", file=sys.stderr)
    if args.skip_headlines:
        doc["headlines"] = old.get("headlines", [])
    else:
        print("part 3: the README's headline configurations, host peak (PREDICTED)", file=sys.stderr)
        doc["headlines"] = headlines()
    atomic_write_text(args.output, json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
