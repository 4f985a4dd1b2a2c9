"""A small GPT on the emulated device: the largest batch under a budget, MEASURED, beside the simulator's.

Issue 32 asks that the emulated device confirm, on a small GPT, the direction of a change
to how transformers are planned. Per config (no LMS; every candidate swapped with the
memory schedule, `recompute` none and ``"cheap"``):

1. the simulator's largest batch under the usable budget (`tuner.policy.batch.predict_max_batch`,
   ``device="cpu"``: TF's single-threaded executor order, BFC allocator replayed): PREDICTED;
2. the largest batch whose step fits, MEASURED in fresh processes (the
   ``benchmarks/simulator_accuracy.py`` child: emulated swap ops, the schedule pinned whole,
   BFC allocator peak of three steps after two warm-ups): the tuner's bracket
   (`tuner.policy.batch.search_max_batch`) from the prediction, until a fitting batch sits next
   to one that does not.

Run it from two checkouts to compare code (each writes its own JSON, `--label`)::

    nice -n 10 python benchmarks/transformer_emulated.py --label after          # ~5-8 min on 2 cores
    git worktree add /tmp/before <commit> && cp benchmarks/transformer_emulated.py /tmp/before/benchmarks/
    (cd /tmp/before && nice -n 10 python benchmarks/transformer_emulated.py --label before \\
        --output /work/main/benchmarks/results/transformer_emulated_before.json)

Writes benchmarks/results/transformer_emulated_<label>.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from lms import LMSConfig  # noqa: E402
from lms.config import atomic_write_text  # noqa: E402

MiB = 1 << 20
# GPT-2's shape, scaled down to run on a CPU in seconds: 2 layers, 4 heads of 32, 512 tokens
OPTIONS = {"seq_len": 512, "n_positions": 512, "n_layers": 2, "d_model": 128, "n_heads": 4, "vocab_size": 2048}
CONFIGS: dict[str, dict[str, Any] | None] = {
    "no LMS": None,
    "memory schedule": {"n_tensors": -1, "lb": 1, "schedule": "memory"},
    "memory schedule, recompute=cheap": {"n_tensors": -1, "lb": 1, "schedule": "memory", "recompute": "cheap"},
}
SAFETY_MARGIN = 0.05  # the tuner's default (`tuner.policy.batch.usable_bytes`)


def _lms_digest() -> str:
    """A digest of every source file of `lms` (what a measurement here depends on)."""
    h = hashlib.sha1()
    for path in sorted((ROOT / "lms").rglob("*.py")):
        h.update(path.relative_to(ROOT).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:10]


def main(argv: list[str] | None = None) -> int:
    import paper
    import simulator_accuracy as acc
    from tuner.policy.batch import Measurement, predict_max_batch, search_max_batch, usable_bytes

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-mib", type=int, default=256, help="device budget (MiB) the batch must fit")
    parser.add_argument("--label", default="current", help="names the output file (e.g. before, after)")
    parser.add_argument("--output", type=Path, default=None, help="JSON output (default: results/transformer_emulated_<label>.json)")
    parser.add_argument("--cache", type=Path, default=None, help="measurement cache (default: under results/cache)")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)
    out = args.output or ROOT / "benchmarks" / "results" / f"transformer_emulated_{args.label}.json"
    cache = args.cache or acc.DEFAULT_CACHE / f"transformer-{_lms_digest()}"  # a measurement per version of lms/
    spec = paper.RowSpec(key="gpt2_tiny", title="", workload="gpt2_small", options=OPTIONS, paper=None, why="")
    graph, _, _ = paper.load_graph(spec)
    budget = args.budget_mib * MiB
    usable = usable_bytes(budget, SAFETY_MARGIN)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    rows = []
    t_all = time.perf_counter()
    for label, fields in CONFIGS.items():
        config = LMSConfig(**fields) if fields else None
        pred = predict_max_batch(graph, config, usable, device="cpu", cap=4096, allocator="bfc")
        probes: dict[int, dict[str, Any]] = {}

        def measure(batch: int) -> int:
            record = acc.measure({"model": "gpt2_small", "options": OPTIONS, "batch": batch, "config": fields,
                                  "executor": "single_threaded"}, cache, remeasure=False, timeout=args.timeout)
            if record is None:
                raise SystemExit(f"measurement failed at batch {batch} ({label})")
            probes[batch] = {"peak_bytes": record["measured_peak_bytes"], "step_s": record["median_step_s"],
                             "pinned_whole": record.get("pinned_whole"),
                             "fits": record["measured_peak_bytes"] <= usable}
            print(f"  {label}: batch {batch} peak {record['measured_peak_bytes'] / MiB:.1f} MiB "
                  f"({'fits' if probes[batch]['fits'] else 'over'} {usable / MiB:.1f})", file=sys.stderr, flush=True)
            return record["measured_peak_bytes"]

        # the tuner's bracket (`tuner.policy.batch.search_max_batch`), closed to adjacent batches
        found = search_max_batch(lambda b: Measurement(peak_bytes=measure(b)), usable=usable, start=pred.batch,
                                 cap=4096, resolution=0.0, max_probes=16,
                                 slope_bytes_per_sample=pred.peak_bytes / pred.batch if pred.batch else None)
        if not found.converged:
            raise SystemExit(f"{label}: no adjacent fitting / failing batches in 16 processes ({found.probes})")
        best = found.batch
        rows.append({"config": label, "fields": fields, "predicted_batch": pred.batch,
                     "predicted_peak_bytes": pred.peak_bytes, "measured_batch": best,
                     "measured_peak_bytes": probes[best]["peak_bytes"] if best else None,
                     "measured_step_s": probes[best]["step_s"] if best else None,
                     "probes": {str(b): p for b, p in sorted(probes.items())}})
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "probes"}), file=sys.stderr, flush=True)
    base = rows[0]["measured_batch"] or 1
    for r in rows:
        r["measured_ratio"] = r["measured_batch"] / base
    doc = {"schema": "lms.transformer_emulated", "label": args.label, "commit": commit, "model": "gpt2_small",
           "options": OPTIONS, "lms_digest": _lms_digest(), "budget_bytes": budget, "usable_bytes": usable,
           "labels": {"predicted_*": "PREDICTED by lms.simulator (device 'cpu', BFC replayed)",
                      "measured_*": "MEASURED on the emulated device (CPU, BFC allocator peak, fresh processes)"},
           "wall_s": round(time.perf_counter() - t_all, 1), "rows": rows}
    atomic_write_text(out, json.dumps(doc, indent=1) + "\n")
    print(f"\nsmall GPT {OPTIONS}, budget {args.budget_mib} MiB (usable {usable / MiB:.1f} MiB), code {commit}:")
    for r in rows:
        print(f"  {r['config']:34s} predicted {r['predicted_batch']:4d}   measured {r['measured_batch']:4d} "
              f"({r['measured_ratio']:.2f}x no LMS)")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
