"""What holds GPT-2 small below its plan bound, in simulation (PREDICTED; no TensorFlow once traced).

GPT-2 small at seq 2048, 16 GiB, P100 profile (as in ``benchmarks/paper.py``), the best config of
``benchmarks/plan_bound.py`` (`n_tensors=-1, lb=1, schedule="memory", recompute="cheap"`):

1. its max batch and the buffers live at its peak one batch above (what the peak is made of);
2. what-if rows, none of them what LMS does: the max batch if element-wise ops could carry the memory
   schedule's pins on a GPU (every ``Sum``; every ``Sum, Sub, Mul``; only the softmax gradient's), if
   they could only trigger swap-ins (control outputs), and with the executed step pinned whole as on
   a CPU.

The what-ifs change `lms.plan.anchor`'s rules in this process only, to show which rule the gap
comes from. Whether a pin changes Grappler's rewrite on a GPU is judged offline by the virtual GPU's
Grappler (`lms.inspect`, tests/tf/test_inspect.py): every ``Mul`` pinnable changes the GELU
gradient's rewrite there (the check drops the order); the softmax gradient's ops alone do not.

    nice -n 10 python benchmarks/transformer_gap.py     # about 30 s on 2 cores with the graph cached

Writes benchmarks/results/transformer_gap.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.paper import ROWS, load_graph  # noqa: E402
from lms import LMSConfig  # noqa: E402
from lms.config import atomic_write_text  # noqa: E402
from lms.plan import anchor  # noqa: E402
from lms.schedule import scheduler  # noqa: E402
from lms.simulator import max_batch, simulate  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "transformer_gap.json"
BUDGET = 16 << 30
DEVICE = "P100-16GB"
CONFIG = LMSConfig(n_tensors=-1, lb=1, schedule="memory", recompute="cheap")
MiB = 1 << 20


def peak_buffers(graph, config: LMSConfig, batch: int, top: int = 6) -> dict[str, Any]:
    """The simulated peak at `batch` and its largest live buffers."""
    r = simulate(graph, config, batch=batch, device=DEVICE, timeline=True)
    cg = r.compiled  # the compiled graph this very simulation ran over
    p = r.peak_index
    sizes = cg.buf_fixed + batch * cg.buf_ps
    live = np.flatnonzero((cg.buf_alloc <= p) & (cg.buf_free >= p) & ~cg.buf_host)
    biggest = sorted(live, key=lambda i: -sizes[i])[:top]
    return {"batch": batch, "peak_bytes": r.peak_device_bytes, "peak_op": r.peak_op,
            "resident_bytes": r.resident_bytes,
            "largest_live": [{"tensor": cg.buf_tensor[i], "bytes": int(sizes[i]),
                              "made_by": cg.op_types[cg.buf_alloc[i]]} for i in biggest]}


def softmax_gradient_ops(graph) -> frozenset[str]:
    """The backward ``Sum``/``Sub``/``Mul`` ops of a ``Softmax``'s gradient."""
    return frozenset(o.name for o in graph.ops.values()
                     if o.type in ("Sum", "Sub", "Mul") and o.role.value == "backward" and o.grad_of
                     and o.grad_of in graph.ops and graph.ops[o.grad_of].type == "Softmax")


def what_if(spec, *, pinnable: frozenset[str] = frozenset(), triggers: frozenset[str] = frozenset(),
            exact: bool | None = None, softmax_gradient: bool = False) -> int:
    """Max batch with `pinnable` types pinnable, `triggers` types allowed as backward triggers, and with
    `softmax_gradient` the softmax gradient's element-wise ops pinnable (this process only).

    The graph is loaded afresh: plans, schedules and compiled forms are cached per graph object."""
    graph, _, _ = load_graph(spec)
    rewritable, safe, ops = anchor.REWRITABLE_TYPES, anchor._safe_trigger, scheduler.pinnable_ops  # noqa: SLF001

    def safe_trigger(g, op: str) -> bool:
        return (g.ops[op].type in triggers and g.ops[op].role.value == "backward") or safe(g, op)

    def pinnable_ops(g) -> frozenset[str]:
        return ops(g) | softmax_gradient_ops(g) if softmax_gradient else ops(g)

    try:
        anchor.REWRITABLE_TYPES = frozenset(rewritable - pinnable)
        anchor._safe_trigger = safe_trigger  # noqa: SLF001
        scheduler.pinnable_ops = pinnable_ops
        return max_batch(graph, CONFIG, BUDGET, device=DEVICE, exact=exact).batch
    finally:
        anchor.REWRITABLE_TYPES, anchor._safe_trigger = rewritable, safe  # noqa: SLF001
        scheduler.pinnable_ops = ops


def main() -> int:
    spec = next(r for r in ROWS if r.key == "gpt2_small")
    graph, _, _ = load_graph(spec)
    best = max_batch(graph, CONFIG, BUDGET, device=DEVICE).batch
    rows = {
        "as LMS plans it": best,
        "what-if: Sum pinnable": what_if(spec, pinnable=frozenset({"Sum"})),
        "what-if: Sum, Sub, Mul pinnable": what_if(spec, pinnable=frozenset({"Sum", "Sub", "Mul"})),
        "what-if: the softmax gradient's Sum, Sub, Mul pinnable (those only)": what_if(spec, softmax_gradient=True),
        "what-if: Sum, Sub, Mul as swap-in triggers only": what_if(spec, triggers=frozenset({"Sum", "Sub", "Mul"})),
        "what-if: the executed step pinned whole (a CPU's exact order)": what_if(spec, exact=True),
    }
    peak = peak_buffers(graph, CONFIG, best + 1)
    doc = {"label": "PREDICTED by lms.simulator; what-if rows change lms.plan.anchor's rules in-process only",
           "workload": "gpt2_small", "options": dict(spec.options), "device": DEVICE, "budget_bytes": BUDGET,
           "config": CONFIG.to_dict(), "max_batch": rows, "peak_above_best": peak}
    atomic_write_text(RESULTS, json.dumps(doc, indent=1) + "\n")
    knobs = ", ".join(f"{k}={CONFIG.to_dict()[k]!r}" for k in ("n_tensors", "lb", "schedule", "recompute"))
    print(f"GPT-2 small seq 2048, {DEVICE}, 16 GiB, {knobs} (PREDICTED):")
    for name, batch in rows.items():
        print(f"  {batch:4d}  {name}")
    print(f"  peak at batch {peak['batch']}: {peak['peak_bytes'] / (1 << 30):.2f} GiB at {peak['peak_op']}; "
          f"resident {peak['resident_bytes'] / (1 << 30):.2f} GiB; largest live:")
    for b in peak["largest_live"]:
        print(f"    {b['bytes'] / MiB:8.1f} MiB  {b['made_by']:14s} {b['tensor']}")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
