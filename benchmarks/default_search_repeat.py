"""The default search, run again in fresh folders: the same confirmed answer, how fast, busy or not? MEASURED.

Runs the README's main job, ``python -m tuner search --model resnet50`` (no GPU
here: the emulated backend, 64x64 images, the derived budget, its default
trials, time limit and ``--confirm``), ``--runs`` times, one after another
(never two at once: they would share the cores), each in a fresh folder under
``benchmarks/results/cache/default_search_repeat/``. With ``--beside cpu`` one
CPU-bound process (a Python busy loop) runs beside each search, from its start
to its end: the answer must not move with the load.

Per run it records the exit code, whether the recommendation is confirmed, the
config, its batch and throughput, the no-LMS baseline's, the fresh processes
of both, the wall time and the time of each phase (tracing, screening,
measuring, confirming: from the search's own ``[phase]`` log lines, stamped as
they arrive), and the load average at the start (a wall time is only
comparable on a quiet machine). Then: the median wall time (issue 35's target:
<= 300 s on a quiet 2-core machine), whether every run recommends the same
config at the same batch (with ``--beside``: batches within 2%), and the spread.

    nice -n 10 python benchmarks/default_search_repeat.py --runs 3                 # quiet machine: ~5 min a run
    nice -n 10 python benchmarks/default_search_repeat.py --runs 3 --beside cpu    # one busy process beside
    python benchmarks/default_search_repeat.py --runs 1 --tag tiny --model cnn_bn --extra --budget 48MiB
                                                                               # a check that it works (~1 min)

Writes ``benchmarks/results/default_search_repeat[_beside].json`` (``--model``
other than resnet50: ``default_search_repeat_<model>.json``) and, per run,
``<tag><i>_recommended.json``, ``<tag><i>_trials.csv`` and ``<tag><i>_stdout.txt`` (stdout, then the
search's log) in ``benchmarks/results/default_search_<model>_emulated/``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lms.config import atomic_write_text  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
WORKDIR = RESULTS / "cache" / "default_search_repeat"
TARGET_WALL_S = 300.0
TARGET_SPREAD = {"": 0.0, "cpu": 0.02}  # quiet: the same batch; one busy process beside: within 2%
#: A start is quiet under this 1-minute load average (`settle` waits for it before each run).
QUIET_LOAD = 0.5
PHASE_LINE = re.compile(r"^\[(tracing|screening|measuring|confirming)\]")
_BUSY = "import time\nwhile True:\n    sum(i * i for i in range(10000))\n"


def _busy_process() -> subprocess.Popen:
    """One CPU-bound process (pure Python: one core's worth) until it is killed."""
    return subprocess.Popen([sys.executable, "-c", _BUSY], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def settle(limit_s: float) -> float:
    """Wait until the 1-minute load average is under `QUIET_LOAD` (at most `limit_s`); the seconds waited.

    Runs go one after another, and the load average decays over a minute (from 2 to 0.5 in about
    85 s): without the wait the next run's "load at start" is mostly the run before it.
    """
    start = time.monotonic()
    while os.getloadavg()[0] >= QUIET_LOAD and time.monotonic() - start < limit_s:
        time.sleep(5)
    return round(time.monotonic() - start, 1)


def one_run(tag: str, *, model: str, extra: list[str], beside: str, settle_s: float) -> dict[str, Any]:
    folder = WORKDIR / tag
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    cmd = [sys.executable, "-m", "tuner", "search", "--model", model, "--no-report", *extra]
    waited = settle(settle_s)
    load = os.getloadavg()[0]
    busy = _busy_process() if beside == "cpu" else None
    start = time.monotonic()
    stamped: list[tuple[float, str]] = []
    try:
        proc = subprocess.Popen(cmd, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})

        def read_stderr() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                stamped.append((time.monotonic() - start, line.rstrip("\n")))

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        stdout = proc.stdout.read() if proc.stdout is not None else ""
        proc.wait()
        reader.join()
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    wall = time.monotonic() - start
    saved = RESULTS / f"default_search_{model}_emulated"
    saved.mkdir(parents=True, exist_ok=True)
    log_text = "\n".join(f"{t:7.1f}s {line}" for t, line in stamped)
    (saved / f"{tag}_stdout.txt").write_text(stdout + "\n--- log (seconds since the start) ---\n" + log_text + "\n")
    marks = [(t, m.group(1)) for t, line in stamped if (m := PHASE_LINE.match(line))]
    phases: dict[str, float] = {}
    for (t, name), (t_next, _) in zip(marks, marks[1:] + [(wall, "")]):
        phases[name] = round(phases.get(name, 0.0) + t_next - t, 1)
    study = next((m.group(1) for _, line in stamped if (m := re.match(r"study (\S+): model", line))), "")
    out: dict[str, Any] = {"tag": tag, "command": " ".join(["python", *cmd[1:]]), "returncode": proc.returncode,
                           "wall_s": round(wall, 1), "phases_s": phases, "load_average_at_start": round(load, 2),
                           "settled_s": waited,
                           "beside": beside or None, "last_line": stamped[-1][1] if stamped else ""}
    rec = folder / "studies" / study / "recommended.json"
    if not study or not rec.exists():
        out["error"] = out["last_line"] or "no recommended.json"
        return out
    shutil.copy(rec, saved / f"{tag}_recommended.json")
    shutil.copy(folder / "studies" / study / "trials.csv", saved / f"{tag}_trials.csv")
    doc = json.loads(rec.read_text())
    base = doc.get("baseline") or {}
    cfg = doc["config"]
    conf = doc.get("confirmation") or {}
    out.update(
        confirmed=doc.get("confirmed"), unconfirmed=doc.get("unconfirmed"),
        config={k: cfg[k] for k in ("n_tensors", "lb", "fuse_swapins", "ctrld_strategy", "swap_branches",
                                    "branch_threshold", "schedule", "sync_mode", "recompute", "prefetch")
                if k in cfg},
        batch=doc["batch_size"], throughput=round(doc["throughput"], 1), process_batches=conf.get("tried"),
        process_wall_s=[r.get("wall_s") for r in conf.get("runs") or []],
        baseline_batch=base.get("batch_size"), baseline_throughput=round(base.get("throughput") or 0.0, 1),
        baseline_process_batches=(base.get("confirmation") or {}).get("tried"),
        batch_ratio=(doc.get("gain_vs_baseline") or {}).get("batch_size_ratio"),
        throughput_ratio=(doc.get("gain_vs_baseline") or {}).get("throughput_ratio"),
        budget_bytes=doc["budget_bytes"], trial=doc["trial"])
    return out


def summarise(rows: list[dict[str, Any]], *, beside: str) -> dict[str, Any]:
    ok = [r for r in rows if "batch" in r]
    batches = [r["batch"] for r in ok]
    spread = (max(batches) - min(batches)) / min(batches) if len(batches) > 1 and min(batches) > 0 else None
    configs = {json.dumps(r["config"], sort_keys=True) for r in ok}
    walls = [r["wall_s"] for r in rows]
    return {
        "median_wall_s": statistics.median(walls) if walls else None,
        "target_wall_s": TARGET_WALL_S, "recommended_batches": batches, "spread": spread,
        "target_spread": TARGET_SPREAD[beside], "same_config": len(configs) == 1 and len(ok) == len(rows),
        "all_confirmed": bool(ok) and len(ok) == len(rows) and all(r.get("confirmed") is True for r in ok),
        "within_spread": spread is not None and spread <= TARGET_SPREAD[beside] + 1e-12,
        "quiet_at_start": all(r["load_average_at_start"] < QUIET_LOAD for r in rows),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tag", default="", help="run folders and saved files are <tag><i> (default: run, or busy "
                                              "with --beside)")
    ap.add_argument("--model", default="resnet50", help="the search's --model (default: %(default)s)")
    ap.add_argument("--beside", choices=("", "cpu"), default="", help="cpu: one CPU-bound process beside each run")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more search options, e.g. --budget 48MiB")
    ap.add_argument("--settle", type=float, default=150.0,
                    help="before each run, wait at most this many seconds for the 1-minute load average to fall "
                         f"under {QUIET_LOAD} (default: %(default)s; 0: do not wait)")
    args = ap.parse_args()
    tag = args.tag or ("busy" if args.beside else "run")
    rows = []
    for i in range(1, args.runs + 1):
        row = one_run(f"{tag}{i}", model=args.model, extra=list(args.extra), beside=args.beside,
                      settle_s=args.settle)
        rows.append(row)
        if "error" in row:
            print(f"run {i}: failed ({row['returncode']}, {row['wall_s']:.0f} s): {row['error']}", flush=True)
            continue
        print(f"run {i} ({row['wall_s']:.0f} s; phases {row['phases_s']}; load at start "
              f"{row['load_average_at_start']} after {row['settled_s']} s of waiting): "
              f"{'confirmed' if row['confirmed'] else 'NOT CONFIRMED'} batch "
              f"{row['batch']} (processes {row['process_batches']}), {row['throughput']} samples/s, {row['config']}; "
              f"no LMS {row['baseline_batch']} (processes {row['baseline_process_batches']}) -> "
              f"{row['batch_ratio']}x batch at {row['throughput_ratio']}x throughput", flush=True)
    summary = summarise(rows, beside=args.beside)
    doc = {"label": "MEASURED", "device": "emulated (CPU, TF BFC allocator, single-threaded executor)",
           "cpus": os.cpu_count(), "model": args.model, "extra": args.extra, "runs": rows, **summary}
    name = "default_search_repeat" + ("" if args.model == "resnet50" else f"_{args.model}") \
        + ("_beside" if args.beside else "")
    path = RESULTS / f"{name}.json"
    atomic_write_text(path, json.dumps(doc, indent=2) + "\n")
    spread = summary["spread"]
    print(f"median wall {summary['median_wall_s']} s (target <= {TARGET_WALL_S:.0f} s on a quiet machine; quiet at "
          f"every start: {summary['quiet_at_start']}); batches {summary['recommended_batches']}, spread "
          f"{'-' if spread is None else f'{spread:.1%}'} (target <= {TARGET_SPREAD[args.beside]:.0%}); same config: "
          f"{summary['same_config']}; all confirmed: {summary['all_confirmed']} -> {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
