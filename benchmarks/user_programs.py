"""Tune the user's own programs, then run each program itself with the recommendation: does it fit? MEASURED.

For each example program (issue 51), on the emulated device:

1. ``python -m tuner search --model examples/<program>.py:make_workload --budget-from-batch 8``: the
   tuner measures the program's own ``fit`` (`examples/unet_fit.py`, `examples/dcgan_fit.py`, keras.io's
   U-Net and DCGAN with its ``train_step`` override) or its step under ``lms.function``
   (`examples/gan_loop.py`), the budget being the program's no-LMS peak at batch 8;
2. ``--processes`` fresh processes of the program itself (``python examples/<program>.py
   recommended.json``: fixed batch, TensorFlow's default executor, as a training script runs), each step's
   allocator peak read; and as many of the program without LMS at the no-LMS baseline's batch.

It records per program: the budget, the recommended config and batch, the no-LMS batch, the tuner's
peak, and every own-run step's peak; then whether every own run's steps after the first stayed within the
usable budget (the budget less the safety margin) and within the budget. The first step of a run traces
and plans; its peak is recorded too.

    python benchmarks/user_programs.py                      # all three, 5 own runs each (~6 min on 2 cores)
    python benchmarks/user_programs.py --programs gan_loop --processes 2

Writes ``benchmarks/results/user_programs.json`` (the studies under ``benchmarks/results/cache/user_programs/``).
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

RESULTS = ROOT / "benchmarks" / "results"
WORKDIR = RESULTS / "cache" / "user_programs"
PROGRAMS = ("unet_fit", "dcgan_fit", "gan_loop")
MiB = 1 << 20


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}


def own_run(program: str, config: str, batch: int | None = None) -> dict[str, Any]:
    """One fresh process of the program itself; its JSON line (peaks of every step)."""
    cmd = [sys.executable, str(ROOT / "examples" / f"{program}.py"), config, *([str(batch)] if batch else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=900)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("{")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    out = json.loads(line)
    out["warnings"] = [ln for ln in proc.stderr.splitlines() if "WARNING:lms" in ln or "WARNING lms" in ln]
    return out


def run_program(program: str, processes: int) -> dict[str, Any]:
    study_dir = WORKDIR / program
    shutil.rmtree(study_dir, ignore_errors=True)
    start = time.monotonic()
    cmd = [sys.executable, "-m", "tuner", "search", "--model", f"examples/{program}.py:make_workload",
           "--budget-from-batch", "8", "--study", program, "--studies-dir", str(WORKDIR),
           "--reports-dir", str(WORKDIR / "reports")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=3600)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise RuntimeError(f"search of {program} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    rec_path = study_dir / "recommended.json"
    rec = json.loads(rec_path.read_text())
    usable, budget = int(rec["usable_bytes"]), int(rec["budget_bytes"])
    base = (rec.get("baseline") or {})
    runs = [own_run(program, str(rec_path)) for _ in range(processes)]
    plain = [own_run(program, "off", int(base["batch_size"])) for _ in range(processes)] if base.get("batch_size") \
        else []

    def after_first(r: dict[str, Any]) -> list[int]:
        return list(r["peaks_bytes"][1:])

    worst = max(max(after_first(r)) for r in runs)
    return {
        "program": program, "search_wall_s": round(wall, 1), "budget_bytes": budget, "usable_bytes": usable,
        "budget_source": rec.get("budget_source"), "config": rec["config"], "batch": rec["batch_size"],
        "measured_under": rec.get("measured_under"), "tuner_peak_bytes": rec.get("peak_device_bytes"),
        "confirmation": rec.get("confirmation"), "baseline_batch": base.get("batch_size"),
        "baseline_peak_bytes": base.get("peak_device_bytes"),
        "own_runs": runs, "own_runs_no_lms": plain,
        "own_worst_after_first_bytes": worst,
        "own_first_step_max_bytes": max(r["peaks_bytes"][0] for r in runs),
        "within_usable": worst <= usable, "within_budget": worst <= budget,
        "no_lms_worst_after_first_bytes": max((max(after_first(r)) for r in plain), default=None),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", nargs="+", choices=PROGRAMS, default=list(PROGRAMS))
    parser.add_argument("--processes", type=int, default=5, help="fresh own runs of each program (default: 5)")
    args = parser.parse_args(argv)
    WORKDIR.mkdir(parents=True, exist_ok=True)
    rows = []
    for program in args.programs:
        row = run_program(program, args.processes)
        rows.append(row)
        print(f"{program:10s} budget {row['budget_bytes'] / MiB:7.2f} MiB (usable {row['usable_bytes'] / MiB:6.2f}) "
              f"batch {row['batch']} (no LMS {row['baseline_batch']}); tuner peak "
              f"{(row['tuner_peak_bytes'] or 0) / MiB:6.2f} MiB; own runs, steps after the first: "
              f"{min(min(r['peaks_bytes'][1:]) for r in row['own_runs']) / MiB:6.2f}-"
              f"{row['own_worst_after_first_bytes'] / MiB:6.2f} MiB -> within usable: {row['within_usable']}, "
              f"within budget: {row['within_budget']}; search {row['search_wall_s']:.0f} s", flush=True)
    doc = {"benchmark": "user_programs", "measured": True,
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "command": "python benchmarks/user_programs.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "device": "emulated device (CPU, TF BFC allocator)", "processes": args.processes, "programs": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    atomic_write_text(RESULTS / "user_programs.json", json.dumps(doc, indent=1) + "\n")
    print(f"wrote {RESULTS / 'user_programs.json'}")
    return 0 if all(r["within_budget"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
