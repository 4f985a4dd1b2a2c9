"""The TFLMS paper's table as this project reproduces it, in simulation: every figure of ours is PREDICTED.

The paper (Le et al., "TFLMS: Large Model Support in TensorFlow by Graph
Rewriting", arXiv:1807.02037) trained ResNet-50 and 3D U-Net on 16 GB GPUs with
and without swapping. This script puts its figures next to the simulator's for
the same workloads as built by this project (TF 2.21 / Keras 3, `tuner.models`)
plus GPT-2 small at a long sequence as a row of our own:

- per workload, the training step is traced once (a `tuner.trial` worker
  subprocess: the only TensorFlow use; graph JSON cached under
  ``benchmarks/results/cache/``, which is gitignored);
- per device profile (P100 NVLink 1.0 and V100 NVLink 2.0, the paper's class of
  machine; A100-40GB on PCIe 4.0, with the budget still 16 GiB so the rows
  compare), the simulator (`lms.simulator.max_batch`, no TensorFlow) finds the
  largest batch without LMS and for each config of a small grid (n_tensors, lb,
  fuse_swapins, ctrld_strategy, swap_branches/branch_threshold, schedule="memory"
  with and without sync_mode 1); the tuned
  config is the one with the largest batch, then the highest throughput;
- throughput is the simulator's roofline step time at that batch (swaps on two
  copy engines over the profile's link).

    nice -n 10 .venv/bin/python benchmarks/paper.py              # about 3-5 minutes on 2 cores
    nice -n 10 .venv/bin/python benchmarks/paper.py --no-bfc     # skip the BFC-allocator replays

Writes benchmarks/results/paper_table.{json,md} and prints the Markdown.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lms import LMSConfig, plan_swaps  # noqa: E402
from lms.config import atomic_write_text  # noqa: E402
from lms.machine.devices import DeviceProfile, GiB, get_device  # noqa: E402
from lms.graph import Graph  # noqa: E402
from lms.plan import SwapPlan  # noqa: E402
from lms.simulator import InfeasibleBudget, bfc_adjusted_batch, max_batch, simulate  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CACHE = RESULTS / "cache"
LABEL = "PREDICTED"
BUDGET_GIB = 16.0
DEVICES = ("P100-16GB", "V100-16GB", "A100-40GB")
BFC_DEVICE = "P100-16GB"
PAPER_SOURCE = ("Le, Imai, Negishi, Kawachiya: TFLMS: Large Model Support in TensorFlow by Graph Rewriting, "
                "arXiv:1807.02037 (2018); IBM Power S822LC 'Minsky', P100 16 GB, NVLink 1.0, TensorFlow 1.x")


# ---------------------------------------------------------------- what is compared

@dataclass(frozen=True)
class PaperFigures:
    """The paper's figures for one workload (measured there), as text plus the numbers we compare."""

    no_lms_batch: int | None
    lms_batch: int | None
    summary: str
    throughput: str = "-"
    verified: str = ""


@dataclass(frozen=True)
class RowSpec:
    """One workload of the table.

    Attributes:
        key: row id (also the cache file prefix).
        title: what the table shows.
        workload: `tuner.models` built-in name.
        options: its options (`load_workload(workload, **options)`).
        paper: the paper's figures, or ``None`` for a row of our own.
        why: why these options.
        n_tensors: values of ``n_tensors`` in the grid (``None``: -1, N/2, N/4 of the N candidates).
    """

    key: str
    title: str
    workload: str
    options: Mapping[str, Any]
    paper: PaperFigures | None
    why: str
    n_tensors: tuple[int, ...] | None = None


ROWS: tuple[RowSpec, ...] = (
    RowSpec(
        key="resnet50", title="ResNet-50, 224x224x3, fp32, SGD momentum 0.9", workload="resnet50",
        options={"image_size": 224},
        paper=PaperFigures(176, 832, "176 -> 832 (4.7x)", throughput="-",
                           verified="4.7x: paper abstract; 176 and 832: the paper's ResNet-50 result as "
                                    "quoted in benchmarks/paper_simulation.py (body not re-read here)"),
        why="the paper's headline workload (keras.applications ResNet50, random init, 1000 classes)",
        n_tensors=(-1, 100, 50)),
    RowSpec(
        key="unet3d", title="3D U-Net (Cicek), whole 192^3 x4 images, 32 base filters (zoo default)",
        workload="unet3d", options={"input_size": 192},
        paper=PaperFigures(3, 4, "whole 192^3 images; batch 3 -> 4 with swap_branches, branch_threshold 20; "
                                 "abstract: 2x larger batch",
                           throughput="0.17 images/s (unverified)",
                           verified="192^3 whole images and '2x larger batch size': paper abstract; 3 -> 4 at "
                                    "threshold 20 and 0.17 images/s: project notes, not verified against the "
                                    "paper's body"),
        why="the zoo's 3D U-Net as Cicek et al. define it (32 base filters, BatchNorm), at the paper's whole "
            "192^3 volumes, BraTS-like 4 modalities in, 4 classes out (whether the paper fed 1 or 4 channels "
            "only changes the input: 27 or 108 MiB per volume)"),
    RowSpec(
        key="unet3d_w8", title="3D U-Net, whole 192^3 x4 images, 8 base filters (reduced width)",
        workload="unet3d", options={"input_size": 192, "base_filters": 8},
        paper=PaperFigures(3, 4, "as above", throughput="0.17 images/s (unverified)",
                           verified="see the row above"),
        why="the zoo default fits one 192^3 volume in 16 GiB only with LMS, so it has no ratio; the paper "
            "trained batch 3-4 of whole 192^3 volumes, i.e. its network needed at most about 4 GiB per volume "
            "with LMS. With 8 base filters (every feature map a quarter of the default) a volume needs a "
            "comparable amount, so the batch figures are comparable in kind; the paper's exact network is not "
            "known here"),
    RowSpec(
        key="gpt2_small", title="GPT-2 small (124M + 2048 positions), seq 2048, fp32, Adam (ours)",
        workload="gpt2_small", options={"seq_len": 2048, "n_positions": 2048},
        paper=None,
        why="a row of our own: at 2048 tokens every layer keeps attention scores and probabilities of "
            "12 heads x 2048^2 x 4 B = 192 MiB per sequence each, so without LMS only a batch of a few "
            "sequences fits 16 GiB; LMS matters there (n_positions raised from 1024 to 2048 to allow it)"),
)

DIFFERENCES = [
    "TensorFlow 2.21 / Keras 3 graphs, not TF 1.x: Keras 3 BatchNormalization is not fused; its forward keeps "
    "several full-size tensors per layer and its gradient makes about four full-size intermediates "
    "(docs/tf-notes.md). The paper's TF 1.x models used fused batch norm.",
    "Keras 3 Conv2D/Conv3D layers carry a bias: a BiasAdd output per convolution.",
    "Optimizers: ResNet-50 SGD with momentum 0.9 (one slot); 3D U-Net and GPT-2 Adam (two slots). The "
    "optimizer computes momentum*m for every variable as soon as the step starts (TF's executor runs it "
    "first) and holds it until that variable's gradient exists.",
    "GPU scratch memory (cuDNN workspaces) is not modelled: TF sizes it to what is free; only the copy TF "
    "makes of a variable updated while still read is counted (lms.sim.costs.GPU_TEMPORARIES). Real GPUs "
    "will fit somewhat smaller batches.",
    "fp32 everywhere, no mixed precision, no XLA (XLA would bypass graph-level swap ops).",
    "The search counts live bytes (each allocation rounded to 256 B); the BFC allocator's fragmentation is "
    "replayed afterwards on the P100 profile ('BFC' columns; lms.sim.bfc, CPU-validated).",
    "The whole 16 GiB is the budget; a real 16 GB card leaves about 15.9 GiB to TF after the CUDA context.",
    "Times are a roofline (60% of fp32 peak for convolutions and matrix products, 80% of memory bandwidth "
    "for the rest, 5 us per op) with swaps on two copy engines at 85% of the link's per-direction rate; "
    "a swapped tensor's device copy stays until its copy finished. Not calibrated on any GPU.",
    "The 3D U-Net is the zoo's Cicek et al. network ('same' padding, BatchNorm, transposed-convolution "
    "up-sampling, 4 input modalities, 4 classes); the paper's exact 3DUnet (width, normalisation, "
    "channels) is not known here.",
    "The grid is small (see the JSON); the paper tuned n_tensors and lb by hand on the real machine.",
]


# ---------------------------------------------------------------- results (plain data)

@dataclass(frozen=True)
class ConfigOutcome:
    """One config's PREDICTED largest batch at the budget on one device profile.

    ``batch`` is 0 when even batch 1 does not fit; ``peak_bytes`` is then the
    peak at batch 1 (what this config needs). ``peak_host_bytes``: the host memory
    its swapped tensors hold at their peak, at that batch (`lms.sim.host`).
    """

    config: Mapping[str, Any]
    batch: int
    peak_bytes: int
    throughput: float
    step_time_s: float
    n_swapped: int
    peak_op: str
    peak_host_bytes: int = 0

    @property
    def lms_config(self) -> LMSConfig:
        return LMSConfig.from_dict(dict(self.config))


@dataclass(frozen=True)
class DeviceOutcome:
    """No LMS versus the tuned LMS config on one device profile (all PREDICTED)."""

    device: str
    link: str
    no_lms: ConfigOutcome
    lms: ConfigOutcome
    lms_without_branches: ConfigOutcome
    ratio: float | None
    throughput_cost: float | None
    no_lms_throughput_at_lms_batch: float
    swap_overhead: float | None
    lms_infinite_link_batch: int = 0
    without_branches_infinite_link_batch: int = 0
    bfc: Mapping[str, Any] | None = None
    levers: Mapping[str, Any] | None = None
    label: str = LABEL


@dataclass(frozen=True)
class RowResult:
    """One workload: its graph, the grid searched and one `DeviceOutcome` per profile (all PREDICTED)."""

    key: str
    title: str
    workload: Mapping[str, Any]
    why: str
    paper: PaperFigures | None
    n_ops: int
    n_candidates: int
    grid: tuple[Mapping[str, Any], ...]
    devices: tuple[DeviceOutcome, ...]
    outcomes: Mapping[str, tuple[ConfigOutcome, ...]] = field(default_factory=dict)
    errors: tuple[Mapping[str, Any], ...] = ()
    search_s: float = 0.0
    label: str = LABEL

    def device(self, name: str) -> DeviceOutcome:
        return next(d for d in self.devices if d.device == name)


# ---------------------------------------------------------------- the arithmetic

def ratio(lms_batch: int, base_batch: int) -> float | None:
    """LMS batch over no-LMS batch; ``None`` when batch 1 does not fit without LMS."""
    if base_batch <= 0:
        return None
    return lms_batch / base_batch


def throughput_cost(lms_throughput: float, base_throughput: float) -> float | None:
    """Fraction of the no-LMS throughput lost (negative: LMS is faster); ``None`` without a baseline."""
    if base_throughput <= 0:
        return None
    return 1.0 - lms_throughput / base_throughput


def pick_tuned(outcomes: Iterable[ConfigOutcome]) -> ConfigOutcome:
    """The largest batch, then the highest throughput; if nothing fits, the smallest need at batch 1."""
    return max(outcomes, key=lambda o: (o.batch, o.throughput if o.batch else -o.peak_bytes))


def config_grid(n_candidates: int, *, n_tensors: Sequence[int] | None = None,
                branch_thresholds: Sequence[int] = (10, 20, 40)) -> tuple[LMSConfig, ...]:
    """The configs searched: chain_rule over n_tensors x lb x fuse, direct_order, and swap_branches.

    Args:
        n_candidates: candidate tensors of the graph (for the default ``n_tensors`` values).
        n_tensors: values of ``n_tensors`` (default: -1, N/2, N/4).
        branch_thresholds: ``branch_threshold`` values tried with ``swap_branches``.
    """
    if n_tensors is None:
        n_tensors = (-1, n_candidates // 2, n_candidates // 4)
    ns = tuple(dict.fromkeys(n for n in n_tensors if n == -1 or 0 < n < n_candidates)) or (-1,)
    chain = [LMSConfig(n_tensors=n, lb=lb, fuse_swapins=fuse)
             for n, lb, fuse in itertools.product(ns, (1, 3, 5, 8), (False, True))]
    direct = [LMSConfig(n_tensors=n, lb=lb, ctrld_strategy="direct_order") for n, lb in itertools.product(ns, (1, 5))]
    branches = [LMSConfig(n_tensors=-1, lb=lb, fuse_swapins=fuse, swap_branches=True, branch_threshold=t)
                for lb, fuse, t in itertools.product((1, 3, 5), (False, True), branch_thresholds)]
    # the step's order chosen for memory and pinned (lms.schedule): swap-ins placed lb-1 ops early
    memory = [LMSConfig(n_tensors=n, lb=lb, schedule="memory") for n, lb in itertools.product(ns, (1, 3, 8))]
    memory += [LMSConfig(n_tensors=-1, lb=1, schedule="memory", sync_mode=1)]
    # ... and moved into the memory the order leaves free (prefetch="headroom")
    memory += [LMSConfig(n_tensors=n, lb=lb, schedule="memory", prefetch="headroom")
               for n, lb in itertools.product(ns, (1, 3))]
    return tuple(dict.fromkeys(chain + direct + branches + memory))


def _outcome(graph: Graph, plan: SwapPlan | None, budget: int, device: Any, config: Mapping[str, Any]) -> ConfigOutcome:
    try:
        m = max_batch(graph, plan, budget, device=device)
    except InfeasibleBudget:
        m = None
    if m is None or m.batch == 0:
        one = simulate(graph, plan, batch=1, device=device, timeline=False)
        return ConfigOutcome(dict(config), 0, one.peak_device_bytes, 0.0, one.step_time_s,
                             plan.n_swapped if plan is not None else 0, one.peak_op, one.peak_host_bytes)
    return ConfigOutcome(dict(config), m.batch, m.peak_bytes, m.throughput, m.step_time_s, m.n_swapped, m.peak_op,
                         m.peak_host_bytes)


def _levers(graph: Graph, grid: Sequence[ConfigOutcome], plans: Mapping[LMSConfig, SwapPlan], budget: int,
            fast: DeviceProfile) -> dict[str, Any]:
    """What each lever gives: the best config with TF's order, with the memory schedule (and sync_mode 1),
    and the best memory-scheduled config again with an infinitely fast link (all PREDICTED)."""
    def best(pred: Any) -> ConfigOutcome | None:
        chosen = [o for o in grid if pred(o.config)]
        return pick_tuned(chosen) if chosen else None

    out: dict[str, Any] = {}
    for key, pred in (("tf_order", lambda c: c.get("schedule", "tf") == "tf"),
                      ("memory_schedule", lambda c: c.get("schedule") == "memory" and not c.get("sync_mode")),
                      ("memory_schedule_sync_mode_1", lambda c: c.get("schedule") == "memory" and c.get("sync_mode") == 1)):
        o = best(pred)
        if o is not None:
            out[key] = {"batch": o.batch, "throughput": round(o.throughput, 2), "config": fmt_config(o.config)}
    o = best(lambda c: c.get("schedule") == "memory")
    if o is not None and o.batch:
        out["memory_schedule_infinite_link"] = _outcome(graph, plans[o.lms_config], budget, fast, o.config).batch
    return out


def evaluate_row(graph: Graph, spec: RowSpec, *, devices: Sequence[str | DeviceProfile] = DEVICES, budget_bytes: int,
                 configs: Sequence[LMSConfig] | None = None, bfc_device: str | None = BFC_DEVICE,
                 workload: Mapping[str, Any] | None = None) -> RowResult:
    """Search the grid on every device profile and build the row's data (all PREDICTED).

    A config the planner cannot plan (its plan does not validate) is left out and
    listed in `RowResult.errors` with the message.
    """
    t0 = time.perf_counter()
    profiles = [get_device(d) for d in devices]
    n_candidates = plan_swaps(graph, LMSConfig()).n_candidates
    if configs is None:
        configs = config_grid(n_candidates, n_tensors=spec.n_tensors)
    per_device: dict[str, list[ConfigOutcome]] = {p.name: [] for p in profiles}
    plans: dict[LMSConfig, SwapPlan] = {}
    errors: list[dict[str, Any]] = []
    for config in configs:  # config outer, device inner: one compiled graph per plan
        try:
            plan = plan_swaps(graph, config, kernels="gpu")  # every profile here is a GPU
            plan.validate(graph)
        except ValueError as exc:  # GraphError is a ValueError
            errors.append({"config": config.to_dict(), "error": f"{type(exc).__name__}: {exc}"})
            continue
        plans[config] = plan
        for p in profiles:
            per_device[p.name].append(_outcome(graph, plan, budget_bytes, p, config.to_dict()))
    results = []
    for p in profiles:
        base = _outcome(graph, None, budget_bytes, p, LMSConfig(n_tensors=0).to_dict())
        grid = per_device[p.name]
        best = pick_tuned(grid)
        plain = pick_tuned([o for o in grid if not o.config["swap_branches"]] or grid)
        plan = plans[best.lms_config]
        same_batch = simulate(graph, None, batch=best.batch, device=p, timeline=False).throughput \
            if best.batch else 0.0
        fast = p.replace(link_bandwidth=1e18, transfer_latency_s=0.0)
        infinite = _outcome(graph, plan, budget_bytes, fast, best.config).batch
        infinite_plain = infinite if plain is best else \
            _outcome(graph, plans[plain.lms_config], budget_bytes, fast, plain.config).batch
        levers = _levers(graph, grid, plans, budget_bytes, fast)
        bfc = None
        if bfc_device is not None and p.name == bfc_device:
            bfc = {"no_lms": bfc_adjusted_batch(graph, None, base.batch, budget_bytes, device=p),
                   "lms": bfc_adjusted_batch(graph, plan, best.batch, budget_bytes, device=p)}
        results.append(DeviceOutcome(
            device=p.name, link=p.link, no_lms=base, lms=best, lms_without_branches=plain,
            ratio=ratio(best.batch, base.batch), throughput_cost=throughput_cost(best.throughput, base.throughput),
            no_lms_throughput_at_lms_batch=same_batch,
            swap_overhead=throughput_cost(best.throughput, same_batch) if best.batch else None,
            lms_infinite_link_batch=infinite, without_branches_infinite_link_batch=infinite_plain, bfc=bfc,
            levers=levers))
    return RowResult(
        key=spec.key, title=spec.title,
        workload=dict(workload or {"name": spec.workload, "options": dict(spec.options)}),
        why=spec.why, paper=spec.paper, n_ops=len(graph.ops), n_candidates=n_candidates,
        grid=tuple(c.to_dict() for c in configs), devices=tuple(results), errors=tuple(errors),
        outcomes={k: tuple(v) for k, v in per_device.items()}, search_s=time.perf_counter() - t0)


# ---------------------------------------------------------------- formatting

def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}x"


def fmt_pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def fmt_rate(value: float) -> str:
    if value <= 0:
        return "-"
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def fmt_bytes(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / (1 << 20):.1f} MiB"


def fmt_batch(o: ConfigOutcome) -> str:
    """``"198"``, or ``"0 (needs 26.2 GiB)"`` when batch 1 does not fit."""
    return str(o.batch) if o.batch else f"0 (needs {fmt_bytes(o.peak_bytes)})"


def fmt_config(config: Mapping[str, Any]) -> str:
    if not config.get("n_tensors"):  # no swaps: "LMS off" only when nothing else acts either
        acting = [f"{k}={config[k]}" for k, off in (("schedule", "tf"), ("recompute", "none"))
                  if config.get(k, off) != off]
        return ", ".join(["no swaps" if acting else "LMS off", *acting])
    parts = [f"n_tensors={config['n_tensors']}", f"lb={config['lb']}"]
    if config.get("fuse_swapins"):
        parts.append("fuse")
    if config.get("ctrld_strategy") != "chain_rule":
        parts.append(str(config.get("ctrld_strategy")))
    if config.get("swap_branches"):
        parts.append(f"branches@{config['branch_threshold']}")
    if config.get("schedule", "tf") != "tf":
        parts.append(f"schedule={config['schedule']}")
    if config.get("sync_mode"):
        parts.append(f"sync_mode={config['sync_mode']}")
    return ", ".join(parts)


def batch_row(row: RowResult, dev: DeviceOutcome) -> list[str]:
    """Cells of the max-batch table for one workload on one device profile."""
    first = dev is row.devices[0]
    paper = ("(ours)" if row.paper is None else row.paper.summary) if first else ""
    bfc = "-"
    if dev.bfc is not None:
        bfc = f"{dev.bfc['no_lms']['batch']} -> {dev.bfc['lms']['batch']}"
    host = fmt_bytes(dev.lms.peak_host_bytes) if dev.lms.batch else "-"
    return [row.key if first else "", paper, dev.device, fmt_batch(dev.no_lms), fmt_batch(dev.lms), host,
            fmt_ratio(dev.ratio), bfc, fmt_config(dev.lms.config)]


def throughput_row(row: RowResult, dev: DeviceOutcome) -> list[str]:
    """Cells of the throughput table for one workload on one device profile."""
    first = dev is row.devices[0]
    paper = row.paper.throughput if row.paper is not None and first else ""
    base = f"{fmt_rate(dev.no_lms.throughput)} @ {dev.no_lms.batch}" if dev.no_lms.batch else "does not fit"
    lms = f"{fmt_rate(dev.lms.throughput)} @ {dev.lms.batch}" if dev.lms.batch else "does not fit"
    return [row.key if first else "", dev.device, base, lms,
            fmt_pct(dev.throughput_cost), fmt_pct(dev.swap_overhead), paper]


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


BATCH_HEADER = ("workload", "paper (measured, P100 16 GB)", "device profile", "max batch, no LMS (PREDICTED)",
                "max batch, tuned LMS (PREDICTED)", "host memory it holds (PREDICTED)", "ratio (PREDICTED)", "with BFC fragmentation (PREDICTED)",
                "tuned config (PREDICTED best)")
THROUGHPUT_HEADER = ("workload", "device profile", "no LMS, samples/s @ batch (PREDICTED)",
                     "tuned LMS, samples/s @ batch (PREDICTED)", "cost vs no LMS (PREDICTED)",
                     "swap overhead at the same batch (PREDICTED)", "paper (measured)")


def branch_thresholds(row: RowResult) -> tuple[int, ...]:
    """The ``branch_threshold`` values the row's grid tried with ``swap_branches``."""
    return tuple(sorted({int(c["branch_threshold"]) for c in row.grid if c.get("swap_branches")}))


def limits_row(row: RowResult, device: str) -> list[str]:
    """Cells of the swap_branches / link table: best batch with branches off, at each threshold, both best
    configs (branches off / tuned) with an infinitely fast link, then the op at the tuned config's peak."""
    outcomes = row.outcomes.get(device, ())
    dev = row.device(device)

    def best(pred: Any) -> str:
        chosen = [o for o in outcomes if pred(o.config)]
        if not chosen:
            return "-"
        o = pick_tuned(chosen)
        return f"{fmt_batch(o)} ({fmt_rate(o.throughput)}/s)" if o.batch else fmt_batch(o)

    cells = [row.key, best(lambda c: not c["swap_branches"])]
    cells += [best(lambda c, t=t: c["swap_branches"] and c["branch_threshold"] == t) for t in branch_thresholds(row)]
    return cells + [f"{dev.without_branches_infinite_link_batch} / {dev.lms_infinite_link_batch}",
                    f"`{dev.lms.peak_op}`"]


def _lever_cells(dev: DeviceOutcome) -> list[str]:
    lv = dev.levers or {}

    def cell(key: str) -> str:
        v = lv.get(key)
        return "-" if v is None else f"{v['batch']} ({fmt_rate(v['throughput'])}/s)"

    inf = lv.get("memory_schedule_infinite_link")
    return [cell("tf_order"), cell("memory_schedule"), cell("memory_schedule_sync_mode_1"),
            "-" if inf is None else str(inf)]


def markdown(doc: Mapping[str, Any], rows: Sequence[RowResult]) -> str:
    """The report: every heading and every table header says PREDICTED."""
    budget = doc["budget_bytes"] / GiB
    main_device = doc["devices"][0]
    lines = [
        f"# The TFLMS paper's table, reproduced in simulation (all our figures {LABEL})",
        "",
        f"Every figure in a column marked {LABEL} comes from this project's simulator (`lms.simulator`, no GPU "
        "used); the paper's columns are its measurements on a 16 GB P100 (IBM Minsky, NVLink 1.0, TF 1.x). "
        f"Budget {budget:.0f} GiB on every device profile (the A100-40GB PCIe row too, so the rows compare). "
        f"Generated by `benchmarks/paper.py` in {doc['wall_s']:.0f} s.",
        "",
        f"## Max batch at {budget:.0f} GiB ({LABEL}; the paper's measured figures beside them)",
        "",
        *_table(BATCH_HEADER, (batch_row(r, d) for r in rows for d in r.devices),
                ("---", "---", "---", "---:", "---:", "---:", "---:", "---:", "---")),
        "",
        f"'host memory it holds' ({LABEL}): the bytes the tuned config's swapped tensors hold in host memory "
        "at their peak, at its max batch (pinned memory on a GPU; TF 2.21 pins at most 128 GiB unless "
        "TF_GPU_HOST_MEM_LIMIT_IN_MB says otherwise).",
        "",
        f"'with BFC fragmentation' ({LABEL}, P100 profile only): the no-LMS and tuned-LMS batches stepped down "
        "until TF's BFC allocator, replayed over the step, fits the budget. A batch of 0 means batch 1 does not "
        "fit; the bytes it needs are given.",
        "",
        f"## Throughput at those batches ({LABEL}, roofline time model)",
        "",
        *_table(THROUGHPUT_HEADER, (throughput_row(r, d) for r in rows for d in r.devices),
                ("---", "---", "---:", "---:", "---:", "---:", "---")),
        "",
        f"'cost vs no LMS' ({LABEL}): 1 - LMS samples/s at its max batch / no-LMS samples/s at its own max batch. "
        f"'swap overhead at the same batch' ({LABEL}): 1 - LMS samples/s / no-LMS samples/s at the LMS batch on "
        "a device with unlimited memory (what the swaps cost in time alone).",
        "",
    ]
    thresholds = branch_thresholds(rows[0]) if rows else ()
    lines += [f"## swap_branches and the link ({LABEL}, {main_device} profile; paper: 3DUnet batch 3 -> 4 with "
              "swap_branches at branch_threshold 20)", "",
              *_table(("workload", f"best, swap_branches off ({LABEL})",
                       *(f"best, threshold {t} ({LABEL})" for t in thresholds),
                       f"infinitely fast link: best off / tuned ({LABEL})", f"tuned config's peak at op ({LABEL})"),
                      (limits_row(r, r.devices[0].device) for r in rows),
                      ("---", "---:", *("---:" for _ in thresholds), "---:", "---")),
              "",
              f"Cells: max batch (samples/s), all {LABEL}. 'infinitely fast link': the best config without "
              "swap_branches and the tuned config again, with copies that take no time; where that batch is "
              "larger, the link limits the batch: a swapped tensor's device copy stays until its device-to-host "
              "copy finished, and when the forward pass produces activations faster than the link drains them "
              "the copies pile up. Branch swap-ins make forward ops wait for copies, which paces the forward pass.",
              ""]
    lines += [f"## What each lever gives ({LABEL}, max batch (samples/s) at {budget:.0f} GiB)", "",
              *_table(("workload", "device profile", f"TF's order, best config ({LABEL})",
                       f"schedule=memory ({LABEL})", f"schedule=memory + sync_mode=1 ({LABEL})",
                       f"schedule=memory, infinitely fast link ({LABEL})"),
                      ([r.key if d is r.devices[0] else "", d.device, *_lever_cells(d)] for r in rows for d in r.devices),
                      ("---", "---", "---:", "---:", "---:", "---:")),
              "",
              "schedule=memory: the step's order chosen by `lms.schedule` (one branch's backward at a time, weight "
              "gradients as soon as their inputs exist, swap-ins just in time) and pinned by control edges.",
              ""]
    lines += [f"## Workloads and assumptions (inputs of the {LABEL} figures)", ""]
    for r in rows:
        opts = ", ".join(f"{k}={v}" for k, v in r.workload.get("options", {}).items())
        lines.append(f"- **{r.key}**: {r.title}. {r.workload.get('description', '')}. Options: {opts}. Graph: "
                     f"{r.n_ops} ops, {r.n_candidates} swap candidates; {len(r.grid)} LMS configs x "
                     f"{len(r.devices)} profiles searched in {r.search_s:.0f} s. Why: {r.why}.")
        if r.errors:
            lines.append(f"  {len(r.errors)} of the {len(r.grid)} configs could not be planned (left out; "
                         f"messages in the JSON), e.g. {fmt_config(r.errors[0]['config'])}: "
                         f"{r.errors[0]['error']}")
        if r.paper is not None:
            lines.append(f"  Paper figures: {r.paper.summary}; throughput {r.paper.throughput}. Source: "
                         f"{r.paper.verified}.")
    lines += ["", f"Paper: {PAPER_SOURCE}.", "",
              f"## What differs from the paper (applies to every {LABEL} figure)", "",
              *[f"- {d}" for d in DIFFERENCES], "",
              f"## Best configs per workload ({LABEL}, {main_device} profile, top 5)", ""]
    for r in rows:
        top = sorted(r.outcomes.get(r.devices[0].device, ()), key=lambda o: (-o.batch, -o.throughput, o.peak_bytes))[:5]
        lines += [f"{r.key}:", "",
                  *_table(("config", f"max batch ({LABEL})", f"samples/s ({LABEL})", f"peak at op ({LABEL})"),
                          ([fmt_config(o.config), fmt_batch(o), fmt_rate(o.throughput), f"`{o.peak_op}`"] for o in top),
                          ("---", "---:", "---:", "---")), ""]
    return "\n".join(lines).rstrip() + "\n"


_CONFIG_KEYS = ("n_tensors", "lb", "fuse_swapins", "ctrld_strategy", "swap_branches", "branch_threshold",
                "schedule", "sync_mode")


def _compact(config: Mapping[str, Any]) -> dict[str, Any]:
    """The knobs the grid varies (the others keep LMSConfig's defaults)."""
    return {k: config[k] for k in _CONFIG_KEYS if k in config}


_OUTCOME_FIELDS = ("config", "batch", "peak_bytes", "throughput", "step_time_s", "n_swapped", "peak_host_bytes")


def to_json(doc: Mapping[str, Any], rows: Sequence[RowResult]) -> dict[str, Any]:
    """The report as JSON-ready data (configs: the knobs the grid varies; per-config outcomes as a table)."""
    def outcome(o: ConfigOutcome) -> dict[str, Any]:
        d = asdict(o)
        d["config"] = _compact(o.config)
        d["throughput"], d["step_time_s"] = round(o.throughput, 4), round(o.step_time_s, 5)
        return d

    def row_dict(r: RowResult) -> dict[str, Any]:
        d = asdict(r)
        d["grid"] = [_compact(c) for c in r.grid]
        d["devices"] = [{**asdict(dev), "no_lms": outcome(dev.no_lms), "lms": outcome(dev.lms),
                         "lms_without_branches": outcome(dev.lms_without_branches)} for dev in r.devices]
        d["outcomes"] = {k: {"fields": list(_OUTCOME_FIELDS),
                             "rows": [[fmt_config(o.config), o.batch, o.peak_bytes, round(o.throughput, 4),
                                       round(o.step_time_s, 5), o.n_swapped, o.peak_host_bytes] for o in v]}
                         for k, v in r.outcomes.items()}
        return d

    return {**doc, "rows": [row_dict(r) for r in rows]}


def build_doc(*, budget_bytes: int, devices: Sequence[str] = DEVICES, bfc_device: str | None = BFC_DEVICE,
              timings: Mapping[str, Any] | None = None, wall_s: float = 0.0) -> dict[str, Any]:
    """The report's header data (everything but the rows)."""
    return {"schema": "lms.paper_table", "schema_version": 1,
            "label": f"{LABEL} by lms.simulator (every figure except those under 'paper')",
            "budget_bytes": budget_bytes, "devices": list(devices), "bfc_device": bfc_device,
            "paper_source": PAPER_SOURCE, "differences": DIFFERENCES, "timings": dict(timings or {}),
            "wall_s": round(wall_s, 1)}


# ---------------------------------------------------------------- tracing (TensorFlow in a subprocess)

def _source_digest(workload: str) -> str:
    """Digest of what shapes a traced graph: the extractor, the step and the zoo."""
    h = hashlib.sha1()
    for path in sorted([ROOT / "lms" / "tf" / "extract.py", ROOT / "lms" / "tf" / "train.py", ROOT / "lms" / "graph.py",
                        *(ROOT / "tuner" / "models").glob("*.py")]):
        if path.is_file():
            h.update(path.read_bytes())
    h.update(workload.encode())
    return h.hexdigest()[:10]


def load_graph(spec: RowSpec, *, cache: Path = CACHE) -> tuple[Graph, dict[str, Any], float]:
    """The traced graph of `spec` (traced once by a `tuner.trial` worker, then cached); (graph, workload, trace_s)."""
    from tuner.worker.protocol import TraceRequest
    from tuner.worker.run import run_worker, worker_env

    key = {"model": spec.workload, "model_options": dict(spec.options), "source": _source_digest(spec.workload)}
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
    path = cache / f"{spec.key}-{digest}.graph.json"
    trace_s = 0.0
    if not path.is_file():
        print(f"tracing {spec.key} ({spec.workload} {dict(spec.options)}) in a worker (TensorFlow) ...",
              file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        out = run_worker(TraceRequest(workload=spec.workload, options=dict(spec.options), key=key,
                                      output=str(path)), workdir=cache / f"trace-{spec.key}-{digest}", timeout_s=900,
                         env=worker_env())
        trace_s = time.perf_counter() - t0
        if out.status != "ok":
            raise SystemExit(f"tracing {spec.key} failed: {out.reason} (log: {out.log_path})")
    doc = json.loads(path.read_text())
    return Graph.from_dict(doc["graph"]), dict(doc.get("workload") or {}), trace_s


# ---------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", choices=[r.key for r in ROWS], default=[r.key for r in ROWS],
                        help="workloads to include (default: all)")
    parser.add_argument("--budget-gib", type=float, default=BUDGET_GIB, help="memory budget in GiB on every profile")
    parser.add_argument("--no-bfc", action="store_true", help="skip the BFC-allocator replays (P100 profile)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help="where to write paper_table.{json,md}")
    parser.add_argument("--cache", type=Path, default=CACHE, help="where traced graphs are cached")
    parser.add_argument("--no-resolution", action="store_true",
                        help="skip TFLMS v2's resolution row (benchmarks/resolution.py; with the unet3d row)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    budget = int(args.budget_gib * GiB)
    rows: list[RowResult] = []
    timings: dict[str, dict[str, float]] = {}
    for spec in (r for r in ROWS if r.key in args.rows):
        graph, workload, trace_s = load_graph(spec, cache=args.cache)
        row = evaluate_row(graph, spec, budget_bytes=budget, bfc_device=None if args.no_bfc else BFC_DEVICE,
                           workload=workload or None)
        rows.append(row)
        timings[spec.key] = {"trace_s": round(trace_s, 1), "search_s": round(row.search_s, 1)}
        d = row.device(DEVICES[0])
        print(f"{spec.key}: no LMS {fmt_batch(d.no_lms)}, LMS {fmt_batch(d.lms)} ({fmt_ratio(d.ratio)}) on "
              f"{DEVICES[0]} [{row.search_s:.0f} s]", file=sys.stderr, flush=True)
    doc = build_doc(budget_bytes=budget, bfc_device=None if args.no_bfc else BFC_DEVICE, timings=timings,
                    wall_s=time.perf_counter() - t0)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    text = markdown(doc, rows)
    table = to_json(doc, rows)
    if "unet3d" in args.rows and not args.no_resolution:  # TFLMS v2's row: the largest cube at batch 1
        import resolution

        table["resolution"] = resolution.resolution_row(budget_bytes=budget, device=BFC_DEVICE)
        text += "\n" + "\n".join(resolution.markdown_lines(table["resolution"]))
    atomic_write_text(args.out_dir / "paper_table.json", json.dumps(table, indent=1, default=str) + "\n")
    atomic_write_text(args.out_dir / "paper_table.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
