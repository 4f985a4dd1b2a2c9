"""The tuner run at the batch where the peers win: does it reach their point? (`benchmarks/peers.py`'s ``lms_tuned``)

At a batch every method fits, each peer was faster than the default search's recommendation (a config tuned
for the *largest* batch: it still swaps 136 tensors at batch 16). A user who trains at that batch asks the
tuner for it: ``python -m tuner search --model resnet50 --batch 16``. That search (fixed batch: the fastest
config that fits, the no-LMS step among the candidates) is run here as a user runs it, in its own folder, and
its recommendation is timed beside the peers in the same rotation (MEASURED), or simulated beside the best
peer at that peer's largest batch (PREDICTED, ``--backend simulate``).

Pure helpers (the command line, reading the result, the verdict) are tested in tests/test_peers.py; running
the search is `run_tuner`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20

__all__ = ["tuner_command", "run_tuner", "read_recommendation", "tuned_verdict"]


def tuner_command(workload: str, options: Mapping[str, Any], *, batch: int, budget_bytes: int, study: str,
                  studies_dir: Path, backend: str = "emulated", device: str | None = None,
                  trials: int | None = None, seed: int = 0) -> list[str]:
    """The ``python -m tuner search ... --batch N`` command line a user would type for this workload.

        >>> tuner_command("resnet50", {"image_size": 64}, batch=16, budget_bytes=576 << 20, study="s",
        ...               studies_dir=Path("d"))[3:]
        ['search', '--model', 'resnet50', '--model-option', 'image_size=64', '--budget', '576MiB', '--batch', '16', '--backend', 'emulated', '--study', 's', '--studies-dir', 'd', '--seed', '0', '--no-report']
    """
    budget = f"{budget_bytes // MiB}MiB" if budget_bytes % MiB == 0 else f"{budget_bytes}B"
    cmd = [sys.executable, "-m", "tuner", "search", "--model", workload]
    for key, value in options.items():
        cmd += ["--model-option", f"{key}={value}"]
    cmd += ["--budget", budget, "--batch", str(int(batch)), "--backend", backend]
    if device:
        cmd += ["--device", device]
    if trials:
        cmd += ["--trials", str(int(trials))]
    return cmd + ["--study", study, "--studies-dir", str(studies_dir), "--seed", str(seed), "--no-report"]


def read_recommendation(path: Path) -> dict[str, Any]:
    """What a search's ``recommended.json`` says: the config (as a dict), its figures, confirmed or not.

    A missing or unreadable file is ``{"config": None, "why": ...}``: the search recommended nothing.
    """
    from lms.config import LMSConfig

    try:
        doc = json.loads(path.read_text())
        config = LMSConfig.load(path).to_dict()
    except (OSError, ValueError) as exc:
        return {"config": None, "why": f"{path.name}: {str(exc)[:200]}"}
    return {"config": config, "lms_on": not LMSConfig.from_dict(config).off,
            "figures": {k: doc.get(k) for k in ("batch_size", "throughput", "peak_device_bytes", "backend")},
            "confirmed": doc.get("confirmed"), "baseline": (doc.get("baseline") or {}).get("throughput")}


def run_tuner(cmd: Sequence[str], *, studies_dir: Path, study: str, timeout: float, env: Mapping[str, str],
              log: Any) -> dict[str, Any]:
    """Run the search in a fresh study folder (an old one would be resumed); its exit code, wall time and
    recommendation."""
    folder = studies_dir / study
    shutil.rmtree(folder, ignore_errors=True)
    studies_dir.mkdir(parents=True, exist_ok=True)
    log("  the tuner at this batch: " + " ".join(str(c) for c in cmd[1:]))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(list(cmd), cwd=ROOT, env=dict(env), capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        return {"command": _shown(cmd), "exit": None, "wall_s": round(timeout, 1), "config": None,
                "why": f"timed out after {timeout:.0f} s"}
    wall = round(time.perf_counter() - t0, 1)
    out = {"command": _shown(cmd), "exit": proc.returncode, "wall_s": wall,
           "stdout_tail": proc.stdout.strip().splitlines()[-12:]}
    out.update(read_recommendation(folder / "recommended.json"))
    if out["config"] is None and proc.returncode:
        tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        out["why"] = f"exit {proc.returncode}: {(tail[-1] if tail else '')[:300]}"
    log(f"  the tuner at this batch: exit {proc.returncode} in {wall:.0f} s, "
        + (f"recommends {_short(out['config'])}" if out["config"] else f"no recommendation ({out.get('why')})"))
    return out


def _shown(cmd: Sequence[str]) -> str:
    return "python " + " ".join(str(c) for c in cmd[1:])


def _short(config: Mapping[str, Any]) -> str:
    """The config in the tuner's own words.

        >>> _short({"n_tensors": 0})
        'no LMS'
    """
    from tuner.policy.knobs import KNOB_TABLE

    return KNOB_TABLE.short_label(KNOB_TABLE.from_dict(dict(config)))


def tuned_verdict(common: Mapping[str, Any], *, peers: Sequence[str], labels: Mapping[str, str],
                  key: str = "lms_tuned") -> str | None:
    """One sentence: the tuner's recommendation at the common batch against the fastest peer there (fastest
    processes), and whether the gap is within the spread of the processes.

        >>> c = {"batch": 16, "throughput": {"plain": {"n": 2, "fastest": 85.0, "median": 84.0, "spread": 0.05},
        ...                                  "lms_tuned": {"n": 2, "fastest": 84.0, "median": 83.0, "spread": 0.02}}}
        >>> tuned_verdict(c, peers=["plain"], labels={"plain": "plain", "lms_tuned": "tuned"})
        'tuned (16): 84.0 samples/s, 0.99x the fastest peer (plain, 85.0): within the spread of the processes (5%): the tuner reaches the peers there'
    """
    at = common.get("throughput") or {}
    mine = at.get(key) or {}
    ranked = sorted((p for p in peers if (at.get(p) or {}).get("n")), key=lambda p: -at[p]["fastest"])
    if not mine.get("n") or not ranked:
        return None
    best = ranked[0]
    ratio = mine["fastest"] / at[best]["fastest"]
    spread = max((at[k].get("spread") or 0.0) for k in (key, best))
    if ratio >= 1.0:
        how = "no slower: the tuner reaches the peers there"
    elif 1.0 - ratio <= spread:
        how = f"within the spread of the processes ({100 * spread:.0f}%): the tuner reaches the peers there"
    else:
        how = (f"more than the spread of the processes ({100 * spread:.0f}%): the peer's point is NOT reached")
    return (f"{labels[key]} ({common.get('batch')}): {mine['fastest']:.1f} samples/s, "
            f"{ratio:.2f}x the fastest peer ({labels[best]}, {at[best]['fastest']:.1f}): {how}")
