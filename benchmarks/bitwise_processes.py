"""Does LMS train bit for bit like plain ``tf.function``, across fresh processes? MEASURED.

Issue 55's check at the size the default search recommends: a zoo workload (default ResNet-50 64x64, SGD)
trained ``--steps`` steps from the same seed in fresh processes, each single-threaded
(``TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1``, where plain ``tf.function`` can repeat itself; with
TF's default threads it does not), every model and optimizer variable and each step's loss saved:

1. plain ``tf.function``, twice: plain must repeat itself first, or no comparison across processes means
   anything (the verdict says so);
2. ``lms.function`` with the config (default: the default search's recommendation, run 3), once.

Then: how many arrays differ between the two plain runs, and between plain and LMS.

    python benchmarks/bitwise_processes.py                       # ResNet-50 64x64 at batch 162 (~3 min)
    python benchmarks/bitwise_processes.py --batch 16 --steps 2  # quicker

Writes ``benchmarks/results/bitwise_processes.json``.
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

from lms.config import atomic_write_text  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "bitwise_processes.json"
RECOMMENDED = ROOT / "benchmarks" / "results" / "default_search_resnet50_emulated" / "run3_recommended.json"
SINGLE_THREADED = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One fresh process: train, save every variable and the losses to ``spec["out"]`` (npz)."""
    import numpy as np

    from lms.tf.allocator import configure_cpu_allocator

    configure_cpu_allocator()
    import keras
    import tensorflow as tf

    import lms
    from lms.tf.train import make_train_step
    from tuner.models import load_workload

    w = load_workload(spec["model"], **spec["options"])
    keras.utils.set_random_seed(0)
    model = w.build_model()
    optimizer = w.make_optimizer()
    optimizer.build(model.trainable_variables)
    step = make_train_step(model, w.loss_fn, optimizer)
    signature = [w.x_spec(), w.y_spec()]
    if spec["config"] is None:
        fn = tf.function(step, input_signature=signature)
    else:
        fn = lms.function(step, config=lms.LMSConfig.from_dict(spec["config"]), emulate=True,
                          input_signature=signature)
    losses = []
    t0 = time.perf_counter()
    for i in range(spec["steps"]):
        x, y = w.make_batch(spec["batch"], seed=i)
        losses.append(fn(tf.constant(x), tf.constant(y)).numpy())
    arrays = {f"v{i}": v.numpy() for i, v in enumerate([*model.weights, *optimizer.variables])}
    np.savez(spec["out"], losses=np.asarray(losses), **arrays)
    summary = getattr(fn, "summary", None)
    return {"wall_s": round(time.perf_counter() - t0, 1), "n_arrays": len(arrays),
            "n_swapped": getattr(summary, "n_swapped", None),
            "corrections": [str(c) for c in getattr(summary, "corrections", ())],
            "pinned_whole": getattr(fn, "pinned_whole", None) is not None if summary is not None else None}


def run(spec: dict[str, Any], *, timeout: float) -> dict[str, Any]:
    env = {**os.environ, **SINGLE_THREADED, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
    if proc.returncode or line is None:
        tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise SystemExit(f"bitwise_processes.py: a child failed (exit {proc.returncode}): {tail[-1] if tail else ''}")
    return json.loads(line)


def compare(a: Path, b: Path) -> dict[str, Any]:
    """Arrays that differ between two runs' files (losses included), and the largest difference."""
    import numpy as np

    x, y = np.load(a), np.load(b)
    differ = [k for k in x.files if not np.array_equal(x[k], y[k])]
    biggest = max((float(np.max(np.abs(x[k].astype("float64") - y[k].astype("float64")))) for k in differ
                   if x[k].dtype.kind == "f"), default=0.0)
    return {"arrays": len(x.files), "differ": len(differ), "losses_equal": "losses" not in differ,
            "max_abs_difference": biggest}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch", type=int, default=162)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--config", type=Path, default=RECOMMENDED, help="an LMS config or recommended.json")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    if args.batch < 1 or args.steps < 1:
        print("bitwise_processes.py: error: --batch and --steps must be >= 1", file=sys.stderr)
        return 2
    from lms.config import LMSConfig

    try:
        config = LMSConfig.load(args.config).to_dict()
    except (OSError, ValueError) as exc:
        print(f"bitwise_processes.py: error: --config {args.config}: {exc}", file=sys.stderr)
        return 2
    options = {"image_size": args.image_size} if args.model == "resnet50" else {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for name, cfg in (("plain_1", None), ("plain_2", None), ("lms", config)):
            spec = {"model": args.model, "options": options, "batch": args.batch, "steps": args.steps,
                    "config": cfg, "out": str(Path(tmp) / f"{name}.npz")}
            runs[name] = run(spec, timeout=args.timeout)
            print(f"{name}: {runs[name]}", file=sys.stderr, flush=True)
        plain = compare(Path(tmp) / "plain_1.npz", Path(tmp) / "plain_2.npz")
        lms_vs_plain = compare(Path(tmp) / "plain_2.npz", Path(tmp) / "lms.npz")
    repeats = plain["differ"] == 0
    verdict = ("plain does not repeat itself in fresh single-threaded processes: the comparison proves nothing"
               if not repeats else
               "BITWISE: LMS trains exactly like plain" if lms_vs_plain["differ"] == 0 else
               f"NOT BITWISE: {lms_vs_plain['differ']} of {lms_vs_plain['arrays']} arrays differ")
    doc = {"schema": "benchmarks.bitwise_processes", "schema_version": 1, "label": "MEASURED",
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "command": "python benchmarks/bitwise_processes.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "model": args.model, "options": options, "batch": args.batch, "steps": args.steps, "config": config,
           "config_source": str(args.config), "threads": SINGLE_THREADED, "runs": runs,
           "plain_vs_plain": plain, "lms_vs_plain": lms_vs_plain, "verdict": verdict,
           "load_average_end": os.getloadavg(), "wall_s": round(time.perf_counter() - t0, 1)}
    atomic_write_text(args.output, json.dumps(doc, indent=1) + "\n")
    print(f"plain vs plain: {plain}\nLMS vs plain: {lms_vs_plain}\n{verdict}\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
