"""LMS against the memory savers a TensorFlow 2 user has today: largest batch and throughput, side by side.

MEASURED on the emulated device (this CPU, TensorFlow's BFC allocator peak), for ResNet-50 64x64 (the
tuner's default emulated search: same workload, same budget, same measurement) and a small GPT
(`benchmarks/transformer_emulated.py`'s model and budget), every method of `benchmarks/peer_steps.py`:
plain ``tf.function``; Keras 3 ``keras.RematScope`` in each of its four modes; ``tf.recompute_grad`` per
stage; Grappler's memory optimizer (``RECOMPUTATION_HEURISTICS``; no public TF2 switch, see below); LMS with
the default search's recommendation and with ``config="auto"``.
RematScope's ``full`` and ``larger_than`` modes do not run in a ``tf.function`` on Keras 3's TensorFlow backend
(Keras passes ``training=`` to ``tf.recompute_grad``, whose graph mode refuses keyword arguments): the
output says so with TensorFlow's error; ``list_of_layers`` is given the layers that can run
(`peer_steps.remat_callable_layers`).

1. Budget: ResNet-50 as ``python -m tuner search --model resnet50`` derives it
   (`tuner.graphs.derive_emulated_budget`: the simulator's no-LMS peak at batch 32, 576 MiB), less the
   tuner's 5% margin; the small GPT: 256 MiB, `transformer_emulated.py`'s (``--gpt-budget-mib``).
2. Largest batch, per method: the tuner's bracket of fresh processes (`tuner.policy.bracket.next_batch`), each
   process one batch from its first step as the tuner's ``--batch N`` worker runs it: TF's single-threaded
   executor, one inter-op thread, oneDNN on, 2 warm-up and 5 timed steps, stopped at the first timed step
   over the usable budget; until a batch that fitted ``--repeats`` processes sits next to one that did
   not. It starts from a probe process (two small batches in one process, the line through their peaks)
   for the peers, from the simulator for LMS, as the tuner does. Throughput there: its fastest process
   (the tuner's rule: noise only slows a run down).
3. The common batch (default: 90% of the smallest of the methods' largest batches, so that every method fits
   it in nearly every process), every method once per round, timed whole (not stopped over the budget),
   ``--rounds`` rounds in rotated order, so every method's throughput comes from the same minutes of this
   loaded machine; fastest and median per method.
4. PREDICTED (``lms.simulator``, ``P100-16GB`` profile, 16 GiB, live bytes): ResNet-50 224x224 and GPT-2
   small at 2048 tokens (`benchmarks/paper.py`'s rows). A peer that changes the traced graph (per-stage
   ``tf.recompute_grad``, the RematScope modes that run) is simulated as its own traced graph, no plan;
   LMS plans on the plain graph. What the simulator cannot express is said, with why: Grappler's pass runs
   inside TF's runtime after the graph the simulator reads is traced; ``LMSConfig(recompute=...)`` only
   clones cheap ops (tried with ``Conv2D``: its error is recorded). The traced peer graphs are also
   simulated at 64x64 on the ``cpu`` profile (BFC replayed) beside their MEASURED batches, as a check.

    nice -n 10 python benchmarks/peers.py                       # 27 min on a loaded 2-core box (2026-12-06)
    python benchmarks/peers.py --quick --models resnet50 --methods plain lms_recommended
    python benchmarks/peers.py --predicted-only                 # the simulator part only (minutes)

Writes benchmarks/results/peers.json and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from lms.config import atomic_write_text
from peer_tuned import run_tuner, tuned_verdict, tuner_command  # noqa: E402
from tuner.policy.bracket import ends, next_batch, start_from_peaks, verdicts

RESULTS = ROOT / "benchmarks" / "results" / "peers.json"
COMMON_RESULTS = ROOT / "benchmarks" / "results" / "peers_common.json"
CACHE = ROOT / "benchmarks" / "results" / "cache" / "peers"
RECOMMENDED = ROOT / "benchmarks" / "results" / "default_search_resnet50_emulated" / "run1_recommended.json"
MiB, GiB = 1 << 20, 1 << 30
SAFETY_MARGIN = 0.05  # the tuner's default (`tuner.policy.batch.usable_bytes`)
CAP = 4096  # the tuner's default --max-batch
MEASURED = "MEASURED (emulated device: this CPU, TF BFC allocator peak)"
PREDICTED = "PREDICTED (lms.simulator)"
#: the transformer of `benchmarks/transformer_emulated.py`: GPT-2's shape scaled down to run on a CPU
GPT_OPTIONS = {"seq_len": 512, "n_positions": 512, "n_layers": 2, "d_model": 128, "n_heads": 4, "vocab_size": 2048}
GPT_BUDGET_MIB = 256
GPT_LMS_CONFIG = {"n_tensors": -1, "lb": 1, "schedule": "memory"}


class BadArgs(ValueError):
    """A command-line value that cannot be used (one line, exit 2)."""


@dataclass(frozen=True)
class Method:
    key: str
    label: str
    how: str  # how a TF2 user turns it on
    lms: bool = False
    pinned: bool = False  # the step's order pinned whole (its fresh processes repeat to the byte)
    common_only: bool = False  # timed at the common batch only (its config is tuned for that batch)


METHODS: tuple[Method, ...] = (
    Method("plain", "plain tf.function", "tf.function(step)"),
    Method("remat_full", "RematScope(full)", "with keras.RematScope(mode='full'): model = build()"),
    Method("remat_activations", "RematScope(activations)", "with keras.RematScope(mode='activations'): ..."),
    Method("remat_larger_than", "RematScope(larger_than)",
           "with keras.RematScope(mode='larger_than') (output_size_threshold 1024): ..."),
    Method("remat_list_of_layers", "RematScope(list_of_layers)",
           "with keras.RematScope(mode='list_of_layers', layer_names=[every layer Keras can remat in a "
           "tf.function]): ..."),
    Method("recompute_grad_stage", "tf.recompute_grad per stage",
           "each stage a sub-model called through tf.recompute_grad (by hand)"),
    Method("grappler_recompute", "Grappler RECOMPUTATION_HEURISTICS",
           "private API only: context.context().function_call_options.config_proto_serialized with "
           "rewrite_options.memory_optimization=RECOMPUTATION_HEURISTICS, target scope 'gradient_tape/'"),
    Method("lms_config", "LMS, given config", "lms.function(step, config=LMSConfig.load(path)) (the config: see the model)",
           lms=True, pinned=True),
    Method("lms_auto", "LMS, config='auto'", "lms.function(step, config='auto', budget=...)", lms=True),
    Method("lms_tuned", "LMS, tuned at the common batch",
           "python -m tuner search --model M --batch <common batch>; lms.function(step, "
           "config=LMSConfig.load('studies/<study>/recommended.json'))", lms=True, pinned=True, common_only=True),
)
METHOD_KEYS = tuple(m.key for m in METHODS)
BY_KEY = {m.key: m for m in METHODS}


@dataclass(frozen=True)
class ModelSpec:
    key: str
    workload: str
    options: Mapping[str, Any]
    title: str
    budget_mib: int | None  # None: derived as the tuner's default emulated search derives it
    lms_config_source: str  # where the LMS config comes from, in words
    predicted_row: str  # benchmarks/paper.py's row for the PREDICTED part
    graph_key: str  # the traced graph's cache key (benchmarks/paper.py's load_graph), shared with other benchmarks


MODELS: dict[str, ModelSpec] = {
    "resnet50": ModelSpec("resnet50", "resnet50", {"image_size": 64}, "ResNet-50 64x64, SGD", None,
                          "the default search's recommendation (LMSConfig.load(" +
                          str(RECOMMENDED.relative_to(ROOT)) + "))", "resnet50", "resnet50_64"),
    "gpt2": ModelSpec("gpt2", "gpt2_small", GPT_OPTIONS, "small GPT (2 layers, d 128, seq 512), Adam",
                      GPT_BUDGET_MIB,
                      "transformer_emulated.py's best config (n_tensors=-1, lb=1, schedule=memory): no default "
                      "search recommendation exists for this model", "gpt2_small", "gpt2_tiny"),
}


# ---- arguments --------------------------------------------------------------------------------------------------

def pick(values: Sequence[str] | None, allowed: Sequence[str], what: str) -> list[str]:
    """`values` (each possibly comma-separated) checked against `allowed`; all of `allowed` when None."""
    if not values:
        return list(allowed)
    out: list[str] = []
    for v in values:
        for item in (s.strip() for s in v.split(",")):
            if not item:
                continue
            if item not in allowed:
                raise BadArgs(f"--{what} {item!r}: allowed values are {', '.join(allowed)}")
            if item not in out:
                out.append(item)
    if not out:
        raise BadArgs(f"--{what}: give at least one of {', '.join(allowed)}")
    return out


def positive(name: str, value: int | None, *, minimum: int = 1) -> None:
    if value is not None and value < minimum:
        raise BadArgs(f"--{name} {value}: must be an integer >= {minimum}")


# ---- the bracket, as arithmetic -----------------------------------------------------------------------------------

def bracket_result(runs: Sequence[Mapping[str, Any]], *, repeats: int) -> dict[str, Any]:
    """What a method's fresh processes say: the largest batch that fitted (``lo``), the smallest that did not
    (``hi``), whether the bracket closed (``hi == lo + 1`` and ``lo`` fitted `repeats` times), and at ``lo`` the
    fastest process's throughput (the tuner's rule), the median and the highest peak.

        >>> r = bracket_result([{"batch": 10, "status": "ok", "peak_device_bytes": 5, "throughput": 3.0},
        ...                     {"batch": 11, "status": "infeasible", "peak_device_bytes": 7}], repeats=1)
        >>> r["batch"], r["smallest_failing"], r["closed"], r["throughput"]
        (10, 11, True, 3.0)
    """
    by_batch, _ = verdicts(runs)
    lo, hi, _, _ = ends(by_batch) if by_batch else (None, None, [], [])
    out: dict[str, Any] = {"batch": lo or 0, "smallest_failing": hi, "processes": len(runs),
                           "tried": [[int(r["batch"]), _word(r.get("status"))] for r in runs]}
    at = [r for r in runs if lo is not None and int(r["batch"]) == lo and r.get("status") == "ok"]
    thr = [float(r["throughput"]) for r in at if r.get("throughput")]
    out["fits"] = len(at)
    out["closed"] = bool(lo is not None and len(at) >= repeats and (hi == lo + 1 or lo == CAP)
                         or (lo is None and hi == 1))
    out["throughput"] = max(thr) if thr else 0.0
    out["throughput_median"] = statistics.median(thr) if thr else 0.0
    peaks = [int(r["peak_device_bytes"]) for r in at if r.get("peak_device_bytes")]
    out["peak_bytes"] = max(peaks) if peaks else None
    return out


def _word(status: Any) -> str:
    return {"ok": "fits", "infeasible": "no", "oom": "no"}.get(str(status), str(status))


def probe_start(peaks: Mapping[int, int], *, usable: int, cap: int = CAP) -> tuple[int | None, float | None]:
    """(start batch, bytes per sample) from a probe's peaks at two batches (None, None: no usable line).

        >>> probe_start({8: 400 * 2**20, 24: 480 * 2**20}, usable=547 * 2**20)
        (37, 5242880.0)
    """
    pts = sorted((int(b), int(p)) for b, p in peaks.items() if p)
    if len(pts) < 2 or pts[-1][1] <= pts[0][1]:
        return None, None
    slope = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
    return start_from_peaks(dict(pts), usable=usable, cap=cap), slope


def probe_batches(plain_prediction: int) -> tuple[int, int]:
    """Two batches for a probe process: a quarter and three quarters of the simulator's plain batch.

        >>> probe_batches(34), probe_batches(5), probe_batches(0)
        ((8, 25), (1, 3), (1, 2))
    """
    b1 = max(1, plain_prediction // 4)
    return b1, max(b1 + 1, (3 * plain_prediction) // 4)


def common_batch(largest: Mapping[str, int], *, fraction: float = 0.9) -> int | None:
    """The batch every method is timed at: `fraction` of the smallest positive largest batch (None: no method
    fitted any). Below the smallest so that every method fits it in (nearly) every process: a plain step's peak
    at one batch moves by up to ~8% between processes (TF's op order is not the same in each).

        >>> common_batch({"plain": 28, "lms_config": 165, "remat_full": 0}), common_batch({"a": 1})
        (25, 1)
    """
    fitted = [b for b in largest.values() if b and b > 0]
    return max(1, math.floor(fraction * min(fitted))) if fitted else None


def rotated(keys: Sequence[str], round_index: int) -> list[str]:
    """`keys` started at position `round_index` (each round begins with another method).

        >>> rotated(["a", "b", "c"], 1), rotated(["a", "b", "c"], 4)
        (['b', 'c', 'a'], ['b', 'c', 'a'])
    """
    if not keys:
        return []
    k = round_index % len(keys)
    return list(keys[k:]) + list(keys[:k])


def throughput_stats(values: Sequence[float]) -> dict[str, Any]:
    """Fastest, median and relative spread ((max - min) / median) of a method's processes at one batch."""
    vals = [float(v) for v in values if v]
    if not vals:
        return {"n": 0, "fastest": 0.0, "median": 0.0, "spread": None}
    med = statistics.median(vals)
    return {"n": len(vals), "fastest": max(vals), "median": med,
            "spread": (max(vals) - min(vals)) / med if med else None}


# ---- verdicts: where a peer beats LMS, and why ---------------------------------------------------------------------

def verdict_lines(model: Mapping[str, Any]) -> list[str]:
    """Sentences comparing each LMS method with the peers on one model, from the measured figures and records.

    Per LMS method: its largest batch against every peer's (a peer with a larger one BEATS it); its fastest
    process at the common batch against the fastest peer's (a faster peer BEATS it, with the cause the records
    show: LMS's config still swaps at a batch that fits without saving memory, so its copies cost time; or
    its step swapped nothing, so the gap is the spread between processes, or more than it); and whether the
    claim of issue 53 holds: a batch ahead of every peer at a throughput no worse than the best peer's at the
    common batch.
    """
    methods = model.get("methods", {})
    common = model.get("common") or {}
    at = common.get("throughput", {})
    cb = common.get("batch")
    lines: list[str] = []
    peers = [k for k, m in methods.items() if not BY_KEY[k].lms and m.get("status") == "measured"]
    for key, m in methods.items():
        if not BY_KEY[key].lms or m.get("status") != "measured":
            continue
        label = BY_KEY[key].label
        batch = m["largest"]["batch"]
        beaten = [p for p in peers if methods[p]["largest"]["batch"] > batch]
        best_peer = max(peers, key=lambda p: methods[p]["largest"]["batch"], default=None)
        for p in beaten:
            lines.append(f"{BY_KEY[p].label} BEATS {label} on the largest batch: "
                         f"{methods[p]['largest']['batch']} > {batch}")
        tied = [p for p in peers if methods[p]["largest"]["batch"] == batch]
        for p in tied:
            lines.append(f"{BY_KEY[p].label} TIES with {label} on the largest batch: {batch}")
        beaten += tied  # "ahead of every peer" is what the claim asks
        if not beaten and best_peer is not None:
            lines.append(f"{label}: largest batch {batch}, ahead of every peer (best peer: {BY_KEY[best_peer].label}"
                         f", {methods[best_peer]['largest']['batch']}: {batch / max(1, methods[best_peer]['largest']['batch']):.2f}x)")
        own = m["largest"]["throughput"]
        quicker = [p for p in peers if methods[p]["largest"]["throughput"] > own]
        if quicker:
            swaps = (m.get("lms_summary_at_largest") or {}).get("n_swapped")
            lines.append(f"faster at their own (smaller) largest batch than {label} at its {batch} ({own:.1f} "
                         "samples/s): " + ", ".join(f"{BY_KEY[p].label} {methods[p]['largest']['throughput']:.1f} "
                                                     f"at {methods[p]['largest']['batch']}" for p in quicker)
                         + "; cause: the price of LMS's larger batch"
                         + (f" ({swaps} tensors swapped out and back per step)" if swaps else ""))
        ranked = sorted((p for p in peers if at.get(p, {}).get("n")), key=lambda p: -at[p]["fastest"])
        if not at.get(key, {}).get("n") or not ranked:
            claim = "cannot be judged (no common-batch throughput)"
        else:
            mine, best = at[key]["fastest"], ranked[0]
            ratio = mine / at[best]["fastest"]
            spread = max((at[k]["spread"] or 0.0) for k in (key, best))
            if ratio >= 1.0:
                lines.append(f"{label}: at the common batch {cb} its fastest process ({mine:.1f} samples/s) is no "
                             f"slower than the fastest peer's ({BY_KEY[best].label}, {at[best]['fastest']:.1f})")
            else:
                summary = (common.get("lms_summary") or {}).get(key) or {}
                swapped = summary.get("n_swapped") or 0
                if swapped:
                    cause = (f"at batch {cb}, which the peers fit without LMS, {label} still swaps {swapped} tensors "
                             f"({(summary.get('swapped_bytes') or 0) / MiB:.0f} MiB out and back per step"
                             + (f"; auto chose '{summary['auto_label']}'" if summary.get("auto_label") else "")
                             + "): those copies cost time nothing here needs")
                else:
                    cause = (f"{label} swapped nothing at batch {cb} (the plain step); the gap is "
                             + ("within" if 1 - ratio <= spread else "more than")
                             + f" the spread of the processes ({100 * spread:.0f}%)")
                faster = [BY_KEY[p].label for p in ranked if at[p]["fastest"] > mine]
                lines.append(f"{BY_KEY[best].label} BEATS {label} on throughput at the common batch {cb}: "
                             f"{at[best]['fastest']:.1f} vs {mine:.1f} samples/s ({ratio:.2f}x; faster peers: "
                             f"{', '.join(faster)}); cause: {cause}")
            claim = ("holds" if not beaten and ratio >= 1.0 else "does not hold: "
                     + "; ".join(x for x in ("a peer fits as large a batch or larger" if beaten else "",
                                             f"{ratio:.2f}x the best peer's throughput at batch {cb}"
                                             if ratio < 1.0 else "") if x))
        lines.append(f"claim (batch ahead of every peer, throughput at the common batch no worse than the best "
                     f"peer's) for {label}: {claim}")
    return lines


# ---- tables ---------------------------------------------------------------------------------------------------

def measured_table(model: Mapping[str, Any]) -> list[str]:
    """The MEASURED table of one model: per method its largest batch, throughput there, peak, and the common
    batch's throughput (fastest / median of the rounds)."""
    common = model.get("common") or {}
    at = common.get("throughput", {})
    cb = common.get("batch")
    head = (f"{'method':34s} {'largest batch':>13s} {'x plain':>7s} {'samples/s':>9s} {'peak MiB':>8s}  "
            f"{'@' + str(cb) + ' fastest/median' if cb else 'common batch':>26s}  processes")
    lines = [head, "-" * len(head)]
    plain = (model.get("methods", {}).get("plain", {}).get("largest") or {}).get("batch") or 0
    for key, m in model.get("methods", {}).items():
        label = BY_KEY[key].label
        if m.get("status") != "measured":
            lines.append(f"{label:34s} {'-':>13s}  {m.get('status', '?')}: {m.get('reason', '')[:150]}")
            continue
        big = m["largest"]
        closed = "" if big["closed"] else "?"
        ratio = f"{big['batch'] / plain:7.2f}" if plain else f"{'-':>7s}"
        peak = f"{big['peak_bytes'] / MiB:8.1f}" if big.get("peak_bytes") else f"{'-':>8s}"
        t = at.get(key)
        fit = (common.get("fits") or {}).get(key, 0)
        tcol = (f"{t['fastest']:6.1f} / {t['median']:5.1f} ({fit}/{t['n']} fit)" if t and t["n"] else "-")
        tried = " ".join(f"{b}{'+' if w == 'fits' else '-'}" for b, w in big["tried"])
        lines.append(f"{label:34s} {big['batch']:>12d}{closed:1s} {ratio} {big['throughput']:9.1f} {peak}  "
                     f"{tcol:>26s}  {tried}")
    for key, t in at.items():  # timed at the common batch only (lms_tuned; every method with --common-only)
        if key in model.get("methods", {}) or not t.get("n"):
            continue
        fit = (common.get("fits") or {}).get(key, 0)
        tcol = f"{t['fastest']:6.1f} / {t['median']:5.1f} ({fit}/{t['n']} fit)"
        lines.append(f"{BY_KEY[key].label:34s} {'-':>13s} {'-':>7s} {'-':>9s} {'-':>8s}  {tcol:>26s}")
    tuned = model.get("tuned")
    if tuned:
        lines.append(f"the tuner at batch {cb}: {tuned.get('command')} -> exit {tuned.get('exit')} in "
                     f"{tuned.get('wall_s', 0):.0f} s, " + (f"config {tuned['config']}" if tuned.get("config")
                                                            else f"no recommendation: {tuned.get('why')}"))
    return lines


def predicted_table(pred: Mapping[str, Any]) -> list[str]:
    head = f"{'method':34s} {'max batch':>9s} {'x plain':>7s} {'samples/s':>9s}  how it was simulated"
    lines = [head, "-" * len(head)]
    plain = (pred.get("rows", {}).get("plain") or {}).get("batch") or 0
    for key, r in pred.get("rows", {}).items():
        label = BY_KEY[key].label
        if r.get("batch") is None:
            lines.append(f"{label:34s} {'-':>9s}  not expressed: {r.get('why', '')[:170]}")
            continue
        ratio = f"{r['batch'] / plain:7.2f}" if plain else f"{'-':>7s}"
        lines.append(f"{label:34s} {r['batch']:9d} {ratio} {r.get('throughput', 0.0):9.1f}  {r.get('how', '')[:90]}")
    return lines


# ---- child processes ----------------------------------------------------------------------------------------------

def _child_env() -> dict[str, str]:
    from tuner.worker.run import worker_env

    return worker_env()  # BFC allocator, oneDNN on, TF's logs hidden: as the tuner's workers


def run_child(spec: Mapping[str, Any], *, timeout: float) -> dict[str, Any]:
    """One fresh process (`child_main`); its JSON result, or status ``error`` with the reason."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(dict(spec))],
                              check=False, env=_child_env(), cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "error", "reason": f"timed out after {timeout:.0f} s", "wall_s": round(timeout, 1)}
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
    if proc.returncode != 0 or line is None:
        tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        return {"status": "error", "reason": f"exit {proc.returncode}: {(tail[-1] if tail else '')[:300]}",
                "wall_s": round(time.perf_counter() - t0, 1)}
    out = json.loads(line)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


# ---- the parent: one model ------------------------------------------------------------------------------------------

@dataclass
class Run:
    """What the parent needs: how to start a process, and the run's limits."""

    repeats: int
    rounds: int
    warmup: int
    steps: int
    timeout: float
    log: Callable[[str], None]


def _spec(model: ModelSpec, method: str, batches: Sequence[int], ctx: Mapping[str, Any], run: Run,
          **extra: Any) -> dict[str, Any]:
    config = (ctx.get("configs") or {}).get(method, ctx["lms_config"])  # lms_tuned: the tuner's pick at the batch
    return {"workload": model.workload, "options": dict(model.options), "method": method,
            "batches": [int(b) for b in batches], "budget": ctx["budget"], "usable": ctx["usable"],
            "lms_config": config, "warmup": run.warmup, "steps": run.steps, **extra}


def _one_process(model: ModelSpec, method: str, batch: int, ctx: Mapping[str, Any], run: Run,
                 **extra: Any) -> dict[str, Any]:
    out = run_child(_spec(model, method, [batch], ctx, run, **extra), timeout=run.timeout)
    if out.get("status") != "done":
        return {"batch": batch, **out}
    r = dict(out["results"][0])
    r.update(wall_s=out["wall_s"], lms_summary=out.get("lms_summary") or {}, info=out.get("info") or {})
    return r


def plain_graph(model: ModelSpec) -> Any:
    """The plain step's traced graph at the measured size (`benchmarks/paper.py`'s cache, shared with
    recompute_emulated.py and transformer_emulated.py)."""
    import paper

    graph, _, _ = paper.load_graph(paper.RowSpec(key=model.graph_key, title="", workload=model.workload,
                                                 options=dict(model.options), paper=None, why=""))
    return graph


def largest_batch(model: ModelSpec, method: Method, ctx: Mapping[str, Any], run: Run) -> dict[str, Any]:
    """Method `method`'s largest batch on `model`: its start (probe or simulator), then the bracket."""
    from tuner.backends.confirm import EXTRA_PROCESSES, UNPINNED_EXTRA_PROCESSES

    start, slope, probe = None, None, None
    if method.lms:
        start, slope = ctx["lms_start"][method.key]
    else:
        b1, b2 = probe_batches(ctx["plain_predicted"])
        probe = run_child({**_spec(model, method.key, [b1, b2], ctx, run), "probe": True, "warmup": 1, "steps": 1},
                          timeout=run.timeout)
        if probe.get("status") != "done":
            run.log(f"  {method.label}: {probe.get('status')}: {probe.get('reason')}")
            return {"status": probe.get("status"), "reason": probe.get("reason", ""), "stage": probe.get("stage")}
        peaks = {int(r["batch"]): int(r["peak_device_bytes"]) for r in probe["results"]}
        start, slope = probe_start(peaks, usable=ctx["usable"])
        run.log(f"  {method.label}: probe peaks " + ", ".join(f"{b}: {p / MiB:.1f} MiB" for b, p in peaks.items())
                + f" -> start {start}")
    start = start or ctx["plain_predicted"] or 1
    limit = run.repeats + EXTRA_PROCESSES + (0 if method.pinned else UNPINNED_EXTRA_PROCESSES)
    runs: list[dict[str, Any]] = []
    while True:
        batch = next_batch(runs, start=start, repeats=run.repeats, cap=CAP, usable=ctx["usable"], slope=slope,
                           max_processes=limit)
        if batch is None:
            break
        r = _one_process(model, method.key, batch, ctx, run)
        r["process"] = len(runs) + 1
        runs.append(r)
        peak = r.get("peak_device_bytes")
        run.log(f"  {method.label}: batch {batch} {_word(r.get('status'))}"
                + (f", peak {peak / MiB:.1f} MiB" if peak else "") + (f", {r['throughput']:.1f}/s" if r.get("status") == "ok" else "")
                + f" ({r.get('wall_s', 0):.0f} s)")
        if r.get("status") not in ("ok", "infeasible"):
            return {"status": r.get("status"), "reason": r.get("reason", ""), "stage": r.get("stage"),
                    "runs": runs}
    big = bracket_result(runs, repeats=run.repeats)
    info = next((r.get("info") for r in runs if r.get("info")), {})
    summary = next((r.get("lms_summary") for r in reversed(runs)
                    if r.get("status") == "ok" and int(r["batch"]) == big["batch"]), {}) or {}
    return {"status": "measured", "start": start, "slope_bytes_per_sample": slope,
            "probe": probe and probe.get("results"), "largest": big, "runs": runs, "info": info,
            "lms_summary_at_largest": summary}


def measure_model(model: ModelSpec, methods: Sequence[str], run: Run, *, common_override: int | None,
                  gpt_budget_mib: int, common_only: bool = False) -> dict[str, Any]:
    from lms.auto import NoConfigFits, choose_config
    from lms.config import LMSConfig
    from tuner.policy.batch import predict_max_batch, usable_bytes
    from tuner.graphs import derive_emulated_budget

    t0 = time.perf_counter()
    graph = plain_graph(model)
    if model.key == "gpt2":
        budget, budget_source = gpt_budget_mib * MiB, f"{gpt_budget_mib} MiB (benchmarks/transformer_emulated.py's)"
    else:
        budget = derive_emulated_budget(graph)
        budget_source = ("as `python -m tuner search --model resnet50` derives it (tuner.graphs."
                         "derive_emulated_budget: the simulator's no-LMS peak at batch 32, BFC replayed, "
                         "rounded up to 64 MiB)")
    usable = usable_bytes(budget, SAFETY_MARGIN)
    if model.key == "resnet50":
        lms_config = LMSConfig.load(RECOMMENDED).to_dict()
    else:
        lms_config = LMSConfig(**GPT_LMS_CONFIG).to_dict()
    plain = predict_max_batch(graph, None, usable, device="cpu", cap=CAP, allocator="bfc")
    ctx: dict[str, Any] = {"budget": budget, "usable": usable, "lms_config": lms_config,
                           "plain_predicted": plain.batch, "lms_start": {}}
    pred = predict_max_batch(graph, LMSConfig.from_dict(lms_config), usable, device="cpu", cap=CAP, allocator="bfc")
    ctx["lms_start"]["lms_config"] = (pred.batch or 1, pred.slope_bytes_per_sample)
    try:
        choose_config(graph, batch=CAP, budget=budget, device="cpu", exact=True)
        auto_start = CAP
    except NoConfigFits as exc:
        auto_start = exc.max_batch or 1
    ctx["lms_start"]["lms_auto"] = (auto_start, pred.slope_bytes_per_sample)
    run.log(f"{model.title}: budget {budget / MiB:.0f} MiB, usable {usable / MiB:.1f} MiB; simulator: plain "
            f"{plain.batch}, LMS config {pred.batch}, auto {auto_start}")
    doc: dict[str, Any] = {"model": model.key, "workload": model.workload, "options": dict(model.options),
                           "title": model.title, "budget_bytes": budget, "budget_source": budget_source,
                           "usable_bytes": usable, "safety_margin": SAFETY_MARGIN, "lms_config": lms_config,
                           "lms_config_source": model.lms_config_source, "label": MEASURED,
                           "simulator_starts": {"plain": plain.batch, "lms_config": pred.batch,
                                                "lms_auto": auto_start, "label": PREDICTED + ", device 'cpu'"},
                           "methods": {}}
    if "grappler_recompute" in methods and not common_only:
        facts = run_child({"workload": model.workload, "options": dict(model.options), "facts": True},
                          timeout=run.timeout)
        doc["grappler_facts"] = facts
        run.log(f"  Grappler facts: {json.dumps({k: v for k, v in facts.items() if k != 'public'})}")
    for key in methods:
        if common_only or BY_KEY[key].common_only:
            continue
        doc["methods"][key] = {"how": BY_KEY[key].how, **largest_batch(model, BY_KEY[key], ctx, run)}
    largest = {k: m["largest"]["batch"] for k, m in doc["methods"].items() if m.get("status") == "measured"}
    cb = common_override or common_batch(largest)
    timed = [k for k in methods if k in largest or (common_only and not BY_KEY[k].common_only)]
    if cb and "lms_tuned" in methods:
        doc["tuned"] = tune_at_batch(model, cb, budget, run)
        if doc["tuned"].get("config"):
            ctx["configs"] = {"lms_tuned": doc["tuned"]["config"]}
            timed.append("lms_tuned")
    doc["common"] = measure_common(model, timed, cb, ctx, run) if cb else None
    doc["verdicts"] = verdict_lines(doc)
    line = tuned_verdict(doc["common"] or {}, peers=[k for k in timed if not BY_KEY[k].lms],
                         labels={m.key: m.label for m in METHODS})
    if line:
        doc["verdicts"].append(line)
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    return doc


def tune_at_batch(model: ModelSpec, batch: int, budget: int, run: Run) -> dict[str, Any]:
    """The tuner's own search at `batch` (emulated backend, the same budget and margin), as a user runs it."""
    cmd = tuner_command(model.workload, model.options, batch=batch, budget_bytes=budget,
                        study=f"{model.key}-batch{batch}", studies_dir=CACHE / "tuned")
    return run_tuner(cmd, studies_dir=CACHE / "tuned", study=f"{model.key}-batch{batch}", timeout=run.timeout * 4,
                     env=_child_env(), log=run.log)


def measure_common(model: ModelSpec, methods: Sequence[str], batch: int, ctx: Mapping[str, Any],
                   run: Run) -> dict[str, Any]:
    """Every method at `batch`, one fresh process each per round, `run.rounds` rounds in rotated order."""
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in methods}
    order: list[str] = []
    for i in range(run.rounds):
        for key in rotated(list(methods), i):
            r = _one_process(model, key, batch, ctx, run, time_all=True)
            r["round"] = i + 1
            runs[key].append(r)
            order.append(key)
            run.log(f"  common batch {batch}, round {i + 1}: {BY_KEY[key].label} {_word(r.get('status'))}"
                    + (f", {r['throughput']:.1f}/s" if r.get("throughput") else "")
                    + (f", peak {r['peak_device_bytes'] / MiB:.1f} MiB" if r.get("peak_device_bytes") else ""))
    return {"batch": batch, "rounds": run.rounds, "order": order,
            "throughput": {k: throughput_stats([r.get("throughput") or 0.0 for r in rs
                                                if r.get("status") in ("ok", "infeasible")])
                           for k, rs in runs.items()},
            "fits": {k: sum(1 for r in rs if r.get("status") == "ok") for k, rs in runs.items()},
            "lms_summary": {k: next((r.get("lms_summary") for r in rs if r.get("lms_summary")), {})
                            for k, rs in runs.items() if BY_KEY[k].lms},
            "runs": runs}


# ---- PREDICTED ------------------------------------------------------------------------------------------------------

def _source_digest() -> str:
    import hashlib

    import paper

    h = hashlib.sha1((ROOT / "benchmarks" / "peer_steps.py").read_bytes())
    h.update(paper._source_digest("peers").encode())
    return h.hexdigest()[:10]


def peer_graph(model: ModelSpec, method: str, options: Mapping[str, Any], run: Run) -> tuple[Any, dict[str, Any]]:
    """The traced graph model of `method`'s step (a child traces it once; cached), or (None, why)."""
    from lms.graph import Graph

    tag = "-".join(f"{k}{v}" for k, v in sorted(options.items()))
    path = CACHE / f"{model.key}-{method}-{tag}-{_source_digest()}.graph.json"
    if not path.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        out = run_child({"workload": model.workload, "options": dict(options), "method": method, "trace": True,
                         "output": str(path)}, timeout=max(run.timeout, 900))
        run.log(f"  traced {method} {dict(options)}: {out.get('status')} ({out.get('wall_s', 0):.0f} s)"
                + (f": {out.get('reason')}" if out.get("status") != "done" else ""))
        if out.get("status") != "done":
            return None, out
    doc = json.loads(path.read_text())
    return Graph.from_dict(doc["graph"]), {"status": "done", "info": doc.get("info", {})}


def predict_model(model: ModelSpec, methods: Sequence[str], run: Run, *, budget_gib: float,
                  device: str) -> dict[str, Any]:
    """The comparison at `budget_gib` on `device` (PREDICTED): peers as their own traced graphs, LMS planned.

    Per row its largest batch and throughput there; then each LMS row against each peer at the batch both
    fit (the smaller of their largest), with what the simulator says each step spends (compute, waiting on
    the host link, bytes over the link): `predicted_verdicts`.
    """
    import paper

    from lms import plan_swaps
    from lms.auto import NoConfigFits, choose_config
    from lms.config import LMSConfig
    from lms.simulator import InfeasibleBudget, max_batch, simulate

    t0 = time.perf_counter()
    budget = int(budget_gib * GiB)
    spec = next(r for r in paper.ROWS if r.key == model.predicted_row)
    graph, _, _ = paper.load_graph(spec)
    options = dict(spec.options)
    lms_config = LMSConfig.load(RECOMMENDED) if model.key == "resnet50" else LMSConfig(**GPT_LMS_CONFIG)
    rows: dict[str, dict[str, Any]] = {}
    # key -> batch -> (SimResult, what ran): the row's step at any batch
    steps: dict[str, Callable[[int], tuple[Any, str]]] = {}

    def simulate_max(g: Any, plan: Any) -> dict[str, Any]:
        try:
            m = max_batch(g, plan, budget, device=device)
        except InfeasibleBudget:
            return {"batch": 0, "throughput": 0.0}
        return {"batch": m.batch, "throughput": m.throughput, "peak_bytes": m.peak_bytes, "capped": m.capped}

    def fixed(g: Any, plan: Any, what: str) -> Callable[[int], tuple[Any, str]]:
        return lambda b: (simulate(g, plan, batch=b, device=device, timeline=False), what)

    def auto_at(b: int) -> tuple[Any, str]:
        choice = choose_config(graph, batch=b, budget=budget, device=device)
        return (simulate(graph, plan_swaps(graph, choice.config, kernels="gpu"), batch=b, device=device,
                         timeline=False), f"auto chose '{choice.label}'")

    try:
        LMSConfig(recompute=("Conv2D",))
        per_stage_note = "LMSConfig(recompute=('Conv2D',)) was accepted"
    except ValueError as exc:
        per_stage_note = f"LMSConfig(recompute=('Conv2D',)) raises {str(exc)[:160]}"
    for key in methods:
        meth = BY_KEY[key]
        if key == "plain":
            rows[key] = {**simulate_max(graph, None), "how": "the plain traced graph, no plan"}
            steps[key] = fixed(graph, None, "the plain step")
        elif key == "grappler_recompute":
            rows[key] = {"batch": None, "why": "Grappler's memory optimizer rewrites the graph inside TF's runtime "
                         "(function instantiation), after the step is traced; the simulator reads the traced graph "
                         "and has no model of that pass (its cheap-op set and grouping differ from "
                         "LMSConfig(recompute='cheap'), so that is not substituted)"}
        elif key == "lms_config":
            plan = plan_swaps(graph, lms_config, kernels="gpu")
            rows[key] = {**simulate_max(graph, plan), "config": lms_config.to_dict(),
                         "how": "the plain graph planned with the config (kernels='gpu'), as benchmarks/paper.py"}
            steps[key] = fixed(graph, plan, f"{plan.n_swapped} tensors swapped")
        elif key == "lms_tuned":
            continue  # after the peers: the tuner is run at the best peer's batch
        elif key == "lms_auto":
            try:
                choose_config(graph, batch=1 << 14, budget=budget, device=device)
                rows[key] = {"batch": 1 << 14, "throughput": 0.0, "how": "auto fits the probe batch 16384"}
            except NoConfigFits as exc:
                b = int(exc.max_batch or 0)
                r, what = auto_at(b) if b else (None, "nothing fits")
                rows[key] = {"batch": b, "throughput": r.throughput if r else 0.0,
                             "how": f"lms.auto.choose_config: NoConfigFits.max_batch; at it {what}"}
            steps[key] = auto_at
        else:
            g, out = peer_graph(model, key, options, run)
            if g is None:
                rows[key] = {"batch": None, "why": f"its step cannot be traced: {out.get('reason', '')}"}
                continue
            rows[key] = {**simulate_max(g, None), "how": "its own traced graph (the recompute ops are in it), no plan"}
            steps[key] = fixed(g, None, "its own graph")
            if key == "recompute_grad_stage":
                rows[key]["planner_cannot"] = per_stage_note
        rows[key]["label"] = PREDICTED + f", {device}, {budget_gib:g} GiB, live bytes"
        run.log(f"  PREDICTED {model.key} {meth.label}: {rows[key].get('batch')}")
    if "lms_tuned" in methods:
        rows["lms_tuned"], step = predict_tuned(model, spec, graph, rows, budget=budget, device=device, run=run)
        if step is not None:
            steps["lms_tuned"] = step
        rows["lms_tuned"]["label"] = PREDICTED + f", {device}, {budget_gib:g} GiB, live bytes"
    pairs = []
    for lms_key in (k for k in rows if BY_KEY[k].lms and rows[k].get("batch")):
        only = rows[lms_key].get("at_peer") if BY_KEY[lms_key].common_only else None  # tuned for that batch only
        for peer in (k for k in rows if not BY_KEY[k].lms and rows[k].get("batch") and k in steps
                     and only in (None, k)):
            b = min(rows[lms_key]["batch"], rows[peer]["batch"])
            (a, a_what), (p, p_what) = steps[lms_key](b), steps[peer](b)
            pairs.append({"lms": lms_key, "peer": peer, "batch": b,
                          "lms_step": _sim_record(a, a_what), "peer_step": _sim_record(p, p_what)})
    doc = {"model": model.key, "row": spec.key, "options": options, "device": device, "budget_bytes": budget,
           "label": PREDICTED, "per_stage_recompute_in_planner": per_stage_note, "rows": rows, "pairs": pairs,
           "wall_s": round(time.perf_counter() - t0, 1)}
    doc["verdicts"] = predicted_verdicts(doc)
    return doc


def predict_tuned(model: ModelSpec, spec: Any, graph: Any, rows: Mapping[str, Any], *, budget: int, device: str,
                  run: Run) -> tuple[dict[str, Any], Callable[[int], tuple[Any, str]] | None]:
    """The tuner's ``--backend simulate --batch B`` search at the best peer's largest batch B; its pick simulated
    there (row, step) or why there is none."""
    from lms import plan_swaps
    from lms.config import LMSConfig
    from lms.simulator import simulate

    peers = {k: r for k, r in rows.items() if not BY_KEY[k].lms and r.get("batch")}
    if not peers:
        return {"batch": None, "why": "no peer has a predicted batch"}, None
    best = max(peers, key=lambda k: peers[k]["batch"])
    b = int(peers[best]["batch"])
    study = f"{model.key}-{device}-batch{b}"
    cmd = tuner_command(spec.workload, spec.options, batch=b, budget_bytes=budget, study=study,
                        studies_dir=CACHE / "tuned", backend="simulate", device=device, trials=80)
    tuned = run_tuner(cmd, studies_dir=CACHE / "tuned", study=study, timeout=run.timeout * 2, env=_child_env(),
                      log=run.log)
    if not tuned.get("config"):
        return {"batch": None, "why": f"the tuner at batch {b}: {tuned.get('why')}", "tuner": tuned}, None
    plan = plan_swaps(graph, LMSConfig.from_dict(tuned["config"]), kernels="gpu")
    r = simulate(graph, plan, batch=b, device=device, timeline=False)
    what = f"the tuner's pick at batch {b} ({plan.n_swapped} tensors swapped)"
    return ({"batch": b, "throughput": r.throughput, "peak_bytes": r.peak_device_bytes, "config": tuned["config"],
             "at_peer": best, "tuner": tuned,
             "how": f"python -m tuner search --backend simulate --batch {b} (the largest batch of the best peer, "
                    f"{BY_KEY[best].label}), 80 trials; its pick simulated there"},
            lambda batch: (simulate(graph, plan, batch=batch, device=device, timeline=False), what))


def _sim_record(r: Any, what: str) -> dict[str, Any]:
    return {"what": what, "step_s": r.step_time_s, "compute_s": r.compute_time_s, "stall_s": r.stall_time_s,
            "transfer_bytes": r.transfer_bytes, "peak_bytes": r.peak_device_bytes,
            "throughput": r.throughput}


def predicted_verdicts(pred: Mapping[str, Any]) -> list[str]:
    """Where a peer beats an LMS row in the PREDICTED comparison (a larger batch; a faster step at a batch
    both fit), with the simulator's account of each step as the cause.

        >>> d = {"rows": {"plain": {"batch": 2}, "lms_auto": {"batch": 20}},
        ...      "pairs": [{"lms": "lms_auto", "peer": "plain", "batch": 2,
        ...                 "lms_step": {"what": "auto chose 'no LMS'", "step_s": 1.0, "compute_s": 1.0,
        ...                              "stall_s": 0.0, "transfer_bytes": 0, "throughput": 2.0},
        ...                 "peer_step": {"what": "the plain step", "step_s": 1.0, "compute_s": 1.0, "stall_s": 0.0,
        ...                               "transfer_bytes": 0, "throughput": 2.0}}]}
        >>> predicted_verdicts(d)
        ["LMS, config='auto': largest batch 20, ahead of every peer (best: plain tf.function, 2)"]
    """
    rows = pred.get("rows", {})
    lines: list[str] = []
    for key in (k for k in rows if BY_KEY[k].lms and rows[k].get("batch")):
        label, batch = BY_KEY[key].label, rows[key]["batch"]
        peers = {k: r for k, r in rows.items() if not BY_KEY[k].lms and r.get("batch")}
        beaten = [] if BY_KEY[key].common_only else [k for k, r in peers.items() if r["batch"] >= batch]
        for k in beaten:
            lines.append(f"{BY_KEY[k].label} " + ("BEATS" if peers[k]["batch"] > batch else "TIES with")
                         + f" {label} on the largest batch: {peers[k]['batch']} vs {batch}")
        if peers and not beaten and not BY_KEY[key].common_only:
            best = max(peers, key=lambda k: peers[k]["batch"])
            lines.append(f"{label}: largest batch {batch}, ahead of every peer (best: {BY_KEY[best].label}, "
                         f"{peers[best]['batch']})")
        for pair in (p for p in pred.get("pairs", []) if p["lms"] == key):
            a, p = pair["lms_step"], pair["peer_step"]
            if p["throughput"] <= a["throughput"] * 1.001:
                if BY_KEY[key].common_only:
                    lines.append(f"{label} at batch {pair['batch']}: {a['throughput']:.1f} samples/s, no slower than "
                                 f"{BY_KEY[pair['peer']].label} ({p['throughput']:.1f}): the tuner reaches its point")
                continue
            lines.append(
                f"{BY_KEY[pair['peer']].label} BEATS {label} on throughput at batch {pair['batch']} (both fit it): "
                f"{p['throughput']:.1f} vs {a['throughput']:.1f} samples/s ({a['throughput'] / p['throughput']:.2f}x); "
                f"cause: LMS's step ({a['what']}) is {a['compute_s']:.2f} s of compute + {a['stall_s']:.2f} s waiting "
                f"on the host link ({a['transfer_bytes'] / GiB:.1f} GiB over it), the peer's ({p['what']}) "
                f"{p['compute_s']:.2f} s of compute + {p['stall_s']:.2f} s")
    return lines


def check_peer_graphs(model: ModelSpec, measured: Mapping[str, Any], run: Run) -> dict[str, Any]:
    """The peer graphs traced at the measured model's size, simulated on the ``cpu`` profile (BFC replayed) at
    the usable budget: PREDICTED largest batch beside the MEASURED one (how far to trust the PREDICTED part)."""
    from tuner.policy.batch import predict_max_batch

    out = {}
    for key, m in measured.get("methods", {}).items():
        if BY_KEY[key].lms or key == "grappler_recompute" or m.get("status") != "measured":
            continue
        if key == "plain":
            g = plain_graph(model)
        else:
            g, _ = peer_graph(model, key, model.options, run)
        if g is None:
            continue
        p = predict_max_batch(g, None, measured["usable_bytes"], device="cpu", cap=CAP, allocator="bfc")
        out[key] = {"predicted_batch": p.batch, "measured_batch": m["largest"]["batch"],
                    "label": "PREDICTED (cpu profile, BFC replayed) vs MEASURED"}
    return out


# ---- CLI ----------------------------------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """argparse, its errors one line (exit 2) rather than the usage and the error."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        print(f"peers.py: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _code_state() -> dict[str, Any]:
    """The commit, and the files of lms/ and tuner/ that differ from it (what LMS's figures ran with)."""
    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True, check=False).stdout

    return {"commit": git("rev-parse", "--short", "HEAD").strip(),
            "uncommitted": [ln[3:] for ln in git("status", "--short", "--", "lms", "tuner").splitlines() if ln]}


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--models", nargs="+", metavar="MODEL", help=f"models (default: all of {', '.join(MODELS)})")
    p.add_argument("--methods", nargs="+", metavar="METHOD", help=f"methods (default: all of {', '.join(METHOD_KEYS)})")
    p.add_argument("--repeats", type=int, default=2, help="fresh processes the largest batch must fit (the tuner's "
                   "--confirm; default 2)")
    p.add_argument("--rounds", type=int, default=2, help="rounds at the common batch, every method once each "
                   "(default 2)")
    p.add_argument("--common-batch", type=int, default=None, help="the common batch (default: 90%% of the "
                   "smallest of the methods' largest batches)")
    p.add_argument("--common-only", action="store_true", help="only the common batch (--common-batch, required): "
                   "no largest batches, no PREDICTED part; writes benchmarks/results/peers_common.json")
    p.add_argument("--gpt-budget-mib", type=int, default=GPT_BUDGET_MIB, help="the small GPT's device budget, MiB")
    p.add_argument("--budget-gib", type=float, default=16.0, help="PREDICTED part: device memory (default 16)")
    p.add_argument("--device", default="P100-16GB", help="PREDICTED part: device profile (default P100-16GB)")
    p.add_argument("--quick", action="store_true", help="develop: 1 repeat, 1 round, 1 warm-up and 2 timed steps")
    p.add_argument("--no-predicted", action="store_true", help="skip the PREDICTED part")
    p.add_argument("--predicted-only", action="store_true", help="only the PREDICTED part")
    p.add_argument("--timeout", type=float, default=600, help="seconds one process may take (default 600)")
    p.add_argument("--output", type=Path, default=None, help=f"JSON output (default: {RESULTS.relative_to(ROOT)}; "
                   f"with --common-only {COMMON_RESULTS.relative_to(ROOT)})")
    return p


def check_args(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The models and methods asked for; BadArgs for anything unusable."""
    models = pick(args.models, list(MODELS), "models")
    methods = pick(args.methods, METHOD_KEYS, "methods")
    positive("repeats", args.repeats)
    positive("rounds", args.rounds)
    positive("common-batch", args.common_batch)
    positive("gpt-budget-mib", args.gpt_budget_mib)
    if not args.budget_gib > 0 or not math.isfinite(args.budget_gib):
        raise BadArgs(f"--budget-gib {args.budget_gib}: must be a positive number")
    if not args.timeout > 0:
        raise BadArgs(f"--timeout {args.timeout}: must be a positive number of seconds")
    if args.no_predicted and args.predicted_only:
        raise BadArgs("--no-predicted and --predicted-only exclude each other")
    if args.common_only and (args.common_batch is None or args.predicted_only):
        raise BadArgs("--common-only needs --common-batch N (the batch every method is timed at) and excludes "
                      "--predicted-only")
    from lms.machine.devices import get_device

    try:
        get_device(args.device)
    except (KeyError, ValueError) as exc:
        raise BadArgs(f"--device {args.device!r}: {str(exc).strip(chr(39))[:200]}") from None
    return models, methods


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.child:  # a fresh process: TensorFlow imported there only, after the allocator is set to BFC
        from lms.tf.allocator import configure_cpu_allocator
        from tuner.trial import import_tensorflow

        configure_cpu_allocator()
        import_tensorflow()  # as the tuner's workers: without the modules Keras imports for notebooks
        from peer_steps import child_main

        print(json.dumps(child_main(json.loads(args.child))), flush=True)
        return 0
    try:
        models, methods = check_args(args)
    except BadArgs as exc:
        print(f"peers.py: error: {exc}", file=sys.stderr)
        return 2
    if args.output is None:
        args.output = COMMON_RESULTS if args.common_only else RESULTS
    if args.quick:
        args.repeats, args.rounds, warmup, steps = 1, 1, 1, 2
    else:
        warmup, steps = 2, 5  # the tuner's --warmup / --steps defaults
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.0f} s] {msg}", file=sys.stderr, flush=True)

    run = Run(repeats=args.repeats, rounds=args.rounds, warmup=warmup, steps=steps, timeout=args.timeout, log=log)
    doc: dict[str, Any] = {"schema": "benchmarks.peers", "schema_version": 1,
                           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "command": "python benchmarks/peers.py " + " ".join(argv if argv is not None
                                                                               else sys.argv[1:]),
                           "labels": {"measured": MEASURED, "predicted": PREDICTED},
                           "methods": {m.key: {"label": m.label, "how": m.how} for m in METHODS if m.key in methods},
                           "settings": {"repeats": run.repeats, "rounds": run.rounds, "warmup": warmup,
                                        "steps": steps, "executor": "single_threaded", "inter_op_threads": 1,
                                        "quick": args.quick},
                           "code": _code_state(),
                           "load_average_start": os.getloadavg(), "measured": {}, "predicted": {}, "checks": {}}
    if not args.predicted_only:
        for key in models:
            doc["measured"][key] = measure_model(MODELS[key], methods, run, common_override=args.common_batch,
                                                 gpt_budget_mib=args.gpt_budget_mib, common_only=args.common_only)
            if not args.common_only:
                doc["checks"][key] = check_peer_graphs(MODELS[key], doc["measured"][key], run)
    if not args.no_predicted and not args.common_only:
        for key in models:
            doc["predicted"][key] = predict_model(MODELS[key], methods, run, budget_gib=args.budget_gib,
                                                  device=args.device)
    doc["load_average_end"] = os.getloadavg()
    doc["code_end"] = _code_state()  # another change to lms/ during the run shows here
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    atomic_write_text(args.output, json.dumps(doc, indent=1, default=str) + "\n")
    print_report(doc)
    print(f"wrote {args.output.relative_to(ROOT) if args.output.is_relative_to(ROOT) else args.output} "
          f"({doc['wall_s']:.0f} s)")
    return 0


def print_report(doc: Mapping[str, Any]) -> None:
    start, end = doc.get("code") or {}, doc.get("code_end") or {}
    if start and end and start != end:
        print(f"WARNING: lms/ or tuner/ changed during the run (start: {start.get('commit')} + "
              f"{len(start.get('uncommitted', []))} uncommitted files, end: {end.get('commit')} + "
              f"{len(end.get('uncommitted', []))}): the LMS figures may come from either")
    for key, m in doc.get("measured", {}).items():
        print(f"\n{m['title']}: {MEASURED}; budget {m['budget_bytes'] / MiB:.0f} MiB, usable "
              f"{m['usable_bytes'] / MiB:.1f} MiB; LMS config: {m['lms_config_source']}")
        print("largest batch: fresh processes, one batch each ('?': bracket not closed); samples/s there: fastest "
              "process; '@N': every method at the common batch N, rounds alternated")
        for line in measured_table(m):
            print("  " + line)
        facts = m.get("grappler_facts")
        if facts and facts.get("status") == "done":
            pub = facts["public"]
            fate = (f"raises {pub['raised']}" if pub["raised"] else
                    f"is accepted and {'ignored' if pub['ignored'] else 'applied'} (the ConfigProto TF builds has "
                    f"memory_optimization={pub['public_value_after']})")
            print(f"  Grappler: {pub['public_call']} {fate}; through TF's private call options, Grappler's "
                  "recomputed nodes in the step's optimized graph: "
                  + ", ".join(f"{k}: {v['recomputed']}" for k, v in facts.items()
                              if isinstance(v, dict) and "recomputed" in v))
        for line in m.get("verdicts", []):
            print("  * " + line)
        check = doc.get("checks", {}).get(key) or {}
        if check:
            print("  peer graphs on the simulator at this size (PREDICTED cpu/BFC vs MEASURED): "
                  + "; ".join(f"{BY_KEY[k].label} {v['predicted_batch']} vs {v['measured_batch']}"
                              for k, v in check.items()))
    for key, p in doc.get("predicted", {}).items():
        print(f"\n{PREDICTED}: {p['row']} {p['options']}, {p['device']}, {p['budget_bytes'] / GiB:g} GiB "
              "(live bytes, no allocator replay)")
        for line in predicted_table(p):
            print("  " + line)
        print(f"  per-stage recompute in the LMS planner: {p['per_stage_recompute_in_planner']}")
        for line in p.get("verdicts", []):
            print("  * " + line)
        check = doc.get("checks", {}).get(key) or {}
        if check:
            print("  how far the simulator is from measurement on these graphs (at the MEASURED size above, cpu "
                  "profile, BFC replayed), predicted vs measured largest batch: "
                  + "; ".join(f"{BY_KEY[k].label} {v['predicted_batch']} vs {v['measured_batch']}"
                              for k, v in check.items()))


if __name__ == "__main__":
    sys.exit(main())
