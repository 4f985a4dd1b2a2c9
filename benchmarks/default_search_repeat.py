"""The default search, run again in fresh folders: does it recommend the same batch? Every figure MEASURED.

Runs the README's main job, ``python -m tuner search --model resnet50`` (no GPU
here: the emulated backend, 64x64 images, the derived budget, its default
trials, time limit and ``--confirm``), ``--runs`` times, one after another
(never two at once: they would share the two cores), each in a fresh folder
under ``benchmarks/results/cache/default_search_repeat/``. Prints, per run, the
recommended config, its batch and throughput, the no-LMS baseline's, and the
largest batch of every process that measured them (``--confirm``); then the
spread of the recommended batches, ``(max - min) / min`` (issue 14's target:
within 5%).

    nice -n 10 python benchmarks/default_search_repeat.py --runs 3     # 11-15 min a run on 2 cores

Writes benchmarks/results/default_search_repeat.json and, per run,
``<tag>_recommended.json``, ``<tag>_trials.csv`` and ``<tag>_stdout.txt`` in
benchmarks/results/default_search_resnet50_emulated/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lms.config import atomic_write_text  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "default_search_repeat.json"
SAVED = ROOT / "benchmarks" / "results" / "default_search_resnet50_emulated"
WORKDIR = ROOT / "benchmarks" / "results" / "cache" / "default_search_repeat"
STUDY = "resnet50-emulated"
TARGET = 0.05


def one_run(tag: str, extra: list[str]) -> dict[str, Any]:
    folder = WORKDIR / tag
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    cmd = [sys.executable, "-m", "tuner", "search", "--model", "resnet50", "--no-report", *extra]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.monotonic() - start
    SAVED.mkdir(parents=True, exist_ok=True)
    (SAVED / f"{tag}_stdout.txt").write_text(proc.stdout + ("\n--- stderr ---\n" + proc.stderr[-4000:]
                                                            if proc.returncode else ""))
    out: dict[str, Any] = {"tag": tag, "command": " ".join(["python", *cmd[1:]]), "returncode": proc.returncode,
                           "wall_s": round(wall, 1)}
    rec = folder / "studies" / STUDY / "recommended.json"
    if proc.returncode != 0 or not rec.exists():
        out["error"] = proc.stderr.strip().splitlines()[-1:] or ["no recommended.json"]
        return out
    shutil.copy(rec, SAVED / f"{tag}_recommended.json")
    shutil.copy(folder / "studies" / STUDY / "trials.csv", SAVED / f"{tag}_trials.csv")
    doc = json.loads(rec.read_text())
    base = doc.get("baseline") or {}
    cfg = doc["config"]
    out.update(
        config={k: cfg[k] for k in ("n_tensors", "lb", "fuse_swapins", "ctrld_strategy", "swap_branches",
                                    "branch_threshold", "schedule", "sync_mode", "recompute", "prefetch")
                if k in cfg},
        batch=doc["batch_size"], throughput=round(doc["throughput"], 1),
        process_batches=(doc.get("confirmation") or {}).get("tried"),
        baseline_batch=base.get("batch_size"), baseline_throughput=round(base.get("throughput") or 0.0, 1),
        baseline_process_batches=(base.get("confirmation") or {}).get("tried"),
        batch_ratio=(doc.get("gain_vs_baseline") or {}).get("batch_size_ratio"),
        throughput_ratio=(doc.get("gain_vs_baseline") or {}).get("throughput_ratio"),
        budget_bytes=doc["budget_bytes"], trial=doc["trial"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tag", default="confirm", help="run folders and saved files are <tag><i>")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more search options, e.g. --confirm 0")
    args = ap.parse_args()
    rows = []
    for i in range(1, args.runs + 1):
        row = one_run(f"{args.tag}{i}", list(args.extra))
        rows.append(row)
        if "error" in row:
            print(f"run {i}: failed ({row['returncode']}): {row['error']}", flush=True)
            continue
        print(f"run {i} ({row['wall_s']:.0f} s): recommended batch {row['batch']} "
              f"(processes {row['process_batches']}), {row['throughput']} samples/s, {row['config']}; "
              f"no LMS {row['baseline_batch']} (processes {row['baseline_process_batches']}) -> "
              f"{row['batch_ratio']}x batch at {row['throughput_ratio']}x throughput", flush=True)
    batches = [r["batch"] for r in rows if "batch" in r]
    spread = (max(batches) - min(batches)) / min(batches) if len(batches) > 1 and min(batches) > 0 else None
    doc = {"label": "MEASURED", "device": "emulated (CPU, TF BFC allocator, single-threaded executor)",
           "target_spread": TARGET, "runs": rows, "recommended_batches": batches, "spread": spread,
           "within_target": spread is not None and spread <= TARGET}
    atomic_write_text(RESULTS, json.dumps(doc, indent=2) + "\n")
    print(f"recommended batches {batches}: spread {spread if spread is None else f'{spread:.1%}'} "
          f"(target <= {TARGET:.0%}) -> {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
