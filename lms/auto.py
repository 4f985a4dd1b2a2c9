"""`choose_config`: an LMS config for one traced step that fits a memory budget, chosen by the simulator, no trials.

``lms.function(step, config="auto", budget="14GiB")`` calls it at each trace,
with the step's graph model at the traced batch. No TensorFlow here.

The candidates are rungs of a ladder, each saving more memory than the one
before, drawn from the knobs the tuner searches (`lms.config.LMSConfig`'s knob
table) where they matter most:

    "no LMS"                       LMSConfig(n_tensors=0)
    "swap all, TF's order"         LMSConfig(n_tensors=-1, lb=1)
    "swap all, memory schedule"    LMSConfig(n_tensors=-1, lb=1, schedule="memory")
    "... + headroom prefetch"      prefetch="headroom" (devices whose copies overlap compute)
    "... + recompute"              recompute="cheap" (only when no rung above fits)

Each is planned and simulated (`lms.sim.simulate`) at the batch, with TF's BFC
allocator replayed (`lms.sim.bfc`: the peak the allocator reaches, chunk rounding
and fragmentation included, which the budget is about; bytes in use alone read
13% low for ResNet-50's pinned step); a rung fits when that peak is at most the
budget less the safety margin (the tuner's default 5%). The choice is the fitting rung with the shortest predicted
step (the smaller peak on a tie). "no LMS" is the fastest step there is, so when
it fits nothing else is simulated. When nothing fits, `NoConfigFits` names the
smallest predicted peak, its config and the largest batch that config fits, or
says that batch cannot be told from this trace (`batch_shaped`).

The list is fixed so that the same graph, batch, budget and device always get
the same config (no time limit decides). Fewer swaps (``n_tensors``) or an
earlier prefetch (``lb``) may be faster still on a given machine: that is what
the tuner's trials measure.
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
import time
from dataclasses import dataclass
from typing import Any

from .config import LMSConfig
from .machine.devices import DeviceProfile, get_device
from .graph import Graph
from .optypes import RESIDENT_TYPES
from .sizes import MIN_SIZE, format_size, parse_size

__all__ = ["AUTO", "DEFAULT_MARGIN", "AutoChoice", "Candidate", "NoConfigFits", "batch_shaped", "choose_config",
           "ladder"]

log = logging.getLogger(__name__)

AUTO = "auto"
#: Fraction of the budget kept free, as the tuner's ``--safety-margin`` default: run-to-run variation and
#: allocator fragmentation the simulator's live bytes do not see.
DEFAULT_MARGIN = 0.05

_SWAP_ALL = dict(n_tensors=-1, lb=1)


def ladder(device: DeviceProfile) -> tuple[tuple[str, LMSConfig], ...]:
    """The swap rungs tried after "no LMS", in order (recompute comes last, see `choose_config`)."""
    rungs = [("swap all, TF's order", LMSConfig(**_SWAP_ALL)),
             ("swap all, memory schedule", LMSConfig(**_SWAP_ALL, schedule="memory"))]
    if device.async_copies:  # prefetching into headroom only helps copies that overlap compute
        rungs.append(("swap all, memory schedule, headroom prefetch",
                      LMSConfig(**_SWAP_ALL, schedule="memory", prefetch="headroom")))
    return tuple(rungs)


_RECOMPUTE = ("swap all, memory schedule, recompute", LMSConfig(**_SWAP_ALL, schedule="memory", recompute="cheap"))
_NO_LMS = ("no LMS", LMSConfig(n_tensors=0))


@dataclass(frozen=True)
class Candidate:
    """One rung as simulated: its label, config, predicted peak (bytes) and step time (s), and whether it fits."""

    label: str
    config: LMSConfig
    peak_bytes: int
    step_s: float
    fits: bool

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "config": self.config.to_dict(), "peak_bytes": self.peak_bytes,
                "step_s": self.step_s, "fits": self.fits}


@dataclass(frozen=True)
class AutoChoice:
    """What `choose_config` chose and why. Every figure is PREDICTED by the simulator.

    Attributes:
        config: the chosen `LMSConfig`.
        label: its rung's name.
        batch: the batch it was chosen for.
        budget_bytes: the device memory budget.
        usable_bytes: the budget less the safety margin: what a peak may reach.
        peak_bytes: the chosen config's predicted peak.
        step_s: its predicted step time.
        baseline_step_s: the predicted step time without LMS (whether or not it fits).
        device: the device profile simulated.
        candidates: every rung simulated, in order.
        reason: one sentence: why this rung.
        elapsed_s: seconds spent choosing (planning and simulating).
    """

    config: LMSConfig
    label: str
    batch: int
    budget_bytes: int
    usable_bytes: int
    peak_bytes: int
    step_s: float
    baseline_step_s: float
    device: str
    candidates: tuple[Candidate, ...]
    reason: str
    elapsed_s: float

    @property
    def throughput_cost(self) -> float:
        """Predicted fraction of throughput lost to LMS: ``1 - baseline step / step`` (0: none)."""
        return 1.0 - self.baseline_step_s / self.step_s if self.step_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "label": self.label, "batch": self.batch,
                "budget_bytes": self.budget_bytes, "usable_bytes": self.usable_bytes,
                "peak_bytes": self.peak_bytes, "step_s": self.step_s, "baseline_step_s": self.baseline_step_s,
                "throughput_cost": self.throughput_cost, "device": self.device,
                "candidates": [c.to_dict() for c in self.candidates], "reason": self.reason,
                "elapsed_s": self.elapsed_s, "predicted": True}


class NoConfigFits(ValueError):
    """No LMS config fits the budget at this batch (`choose_config`).

    Attributes:
        batch: the batch that does not fit.
        budget_bytes / usable_bytes: the budget and what a peak may reach.
        smallest_peak_bytes: the smallest predicted peak of any rung.
        config: the config that reached it.
        max_batch: the largest batch that config fits (0: not even batch 1; None: this trace cannot tell,
            see `batch_shaped`).
        estimated_max_batch: the largest batch that config fits if the tensors `batch_shaped` finds grow
            with the batch (an estimate; `max_batch` where that is known).
    """

    def __init__(self, message: str, *, batch: int, budget_bytes: int, usable_bytes: int, smallest_peak_bytes: int,
                 config: LMSConfig, max_batch: int | None, estimated_max_batch: int | None = None) -> None:
        super().__init__(message)
        self.batch = batch
        self.budget_bytes = budget_bytes
        self.usable_bytes = usable_bytes
        self.smallest_peak_bytes = smallest_peak_bytes
        self.config = config
        self.max_batch = max_batch
        self.estimated_max_batch = max_batch if estimated_max_batch is None else estimated_max_batch


def _check_margin(margin: float) -> float:
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin <= 0.5:
        raise ValueError(f"margin={margin!r}: must be a fraction between 0 and 0.5 (the tuner's default: "
                         f"{DEFAULT_MARGIN})")
    return float(margin)


def choose_config(graph: Graph, *, batch: int, budget: int | str, device: DeviceProfile | str,
                  margin: float = DEFAULT_MARGIN, exact: bool | None = None) -> AutoChoice:
    """The fitting rung of `ladder` with the shortest predicted step for `graph` at `batch`.

    Args:
        graph: the step's graph model.
        batch: the batch the step runs at.
        budget: device memory for the step: bytes or a size such as ``"14GiB"``.
        device: the device profile to simulate (``"cpu"`` for the emulated device).
        margin: fraction of the budget kept free.
        exact: a memory-scheduled step runs its order exactly (pinned whole,
            `lms.schedule.exact_order`); ``None``: as `lms.sim.simulate` decides for `device`.

    Raises:
        NoConfigFits: no rung fits; the message names the smallest predicted peak,
            its config and the largest batch it fits.
        ValueError: a bad budget, margin or batch.
    """
    from .sim import simulate  # lms.sim imports the planner: loaded on first use

    start = time.perf_counter()
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch={batch!r}: must be an integer >= 1")
    # bytes given as an int are taken as they are (a toy model's step may need less than 1 MiB)
    budget_bytes = parse_size(budget, what="budget", minimum=1 if isinstance(budget, numbers.Integral) else MIN_SIZE)
    margin = _check_margin(margin)
    dev = get_device(device)
    usable = int(budget_bytes * (1.0 - margin))

    def evaluate(label: str, config: LMSConfig) -> Candidate:
        r = simulate(graph, config, batch=batch, device=dev, timeline=False, exact=exact, allocator="bfc")
        return Candidate(label, config, r.peak_device_bytes, r.step_time_s, r.peak_device_bytes <= usable)

    tried = [evaluate(*_NO_LMS)]
    baseline = tried[0]
    if not baseline.fits:
        tried += [evaluate(label, config) for label, config in ladder(dev)]
        if not any(c.fits for c in tried):
            tried.append(evaluate(*_RECOMPUTE))
    fitting = [c for c in tried if c.fits]
    elapsed = time.perf_counter() - start
    name = graph.name or "the step"
    if not fitting:
        best = min(tried, key=lambda c: c.peak_bytes)
        fits_batch = _largest_fitting_batch(graph, best.config, usable, dev, exact=exact, below=batch)
        estimate, tail = fits_batch, f"with it batch {fits_batch} would fit"
        if not fits_batch:
            tail = "with it not even batch 1 fits"
            scaled, names = batch_shaped(graph)
            if scaled is not None:
                estimate = _largest_fitting_batch(scaled, best.config, usable, dev, exact=exact, below=batch)
            if estimate:
                fits_batch = None
                unscaled = sum(graph.tensors[n].fixed_bytes for n in names)
                tail = (f"the largest batch that fits cannot be told from this trace: {len(names)} tensors "
                        f"({format_size(unscaled)} in all) lead with the traced batch {graph.batch_size} or a "
                        "multiple yet keep that size at every batch in the graph model (a random draw shaped by "
                        f"the batch, two batches concatenated); if they grow with the batch, batch {estimate} "
                        "would fit with it (a trace at that batch tells)")
        raise NoConfigFits(
            f"no LMS config fits {name} at batch {batch} in {format_size(budget_bytes)} "
            f"({format_size(usable)} usable after the {margin:.0%} margin): the smallest predicted peak is "
            f"{format_size(best.peak_bytes)}, with {best.label} ({_short(best.config)}); {tail}",
            batch=batch, budget_bytes=budget_bytes, usable_bytes=usable, smallest_peak_bytes=best.peak_bytes,
            config=best.config, max_batch=fits_batch, estimated_max_batch=estimate)
    chosen = min(fitting, key=lambda c: (c.step_s, c.peak_bytes))
    reason = _reason(chosen, tried, usable)
    choice = AutoChoice(config=chosen.config, label=chosen.label, batch=batch, budget_bytes=budget_bytes,
                        usable_bytes=usable, peak_bytes=chosen.peak_bytes, step_s=chosen.step_s,
                        baseline_step_s=baseline.step_s, device=dev.name, candidates=tuple(tried), reason=reason,
                        elapsed_s=elapsed)
    log.debug("auto: %s for %s at batch %d (%d rungs simulated in %.2f s)", chosen.label, name, batch, len(tried),
              elapsed)
    return choice


def _largest_fitting_batch(graph: Graph, config: LMSConfig, usable: int, device: DeviceProfile, *,
                           exact: bool | None, below: int) -> int:
    """The largest batch < `below` whose BFC-replayed peak with `config` fits `usable` (0: not even batch 1).

    `lms.sim.max_batch` (live bytes) bounds it from above; the replay steps down from there.
    """
    from .sim import bfc_adjusted_batch, max_batch

    try:
        top = max_batch(graph, config, usable, device=device, exact=exact, limit=max(1, below - 1)).batch
    except ValueError:  # InfeasibleBudget: not even batch 1 by live bytes
        return 0
    return int(bfc_adjusted_batch(graph, config, top, usable, device=device, exact=exact)["batch"])


def batch_shaped(graph: Graph) -> tuple[Graph | None, tuple[str, ...]]:
    """`graph` with its fixed-size tensors that look batch-shaped made per-sample, and their names.

    A step traced at a static batch has a batch dimension in the graph model only where a tensor is
    computed from the step's inputs and leads with the batch (`lms.tf.extract`). A random draw shaped by
    the batch (a GAN's latent vectors, and the generator's activations after it) or two batches
    concatenated (its real and generated images, 2B rows) keep their traced size at every batch, so the
    model cannot say how the step shrinks below the traced batch. Here a fixed-size tensor counts as
    batch-shaped when its leading dimension is a multiple of the traced batch, its producer is not a
    variable or constant, and no variable or constant has its shape (a weight's gradient, an optimizer
    update). A heuristic: the result is an estimate, for a message.

    Returns:
        ``(graph with those tensors per-sample, their names)``; ``(None, ())`` when there are none (or the
        graph was traced at batch 1, where every leading dimension is a multiple).
    """
    traced = graph.batch_size
    if traced < 2:
        return None, ()
    resident = {t.op for t in graph.tensors.values() if graph.ops[t.op].type in RESIDENT_TYPES}
    resident_shapes = {t.shape for t in graph.tensors.values() if t.op in resident}
    tensors, moved = [], []
    for t in graph.tensors.values():
        lead = t.shape[0] if t.shape else None
        if (t.fixed_bytes and not t.per_sample_bytes and isinstance(lead, int) and lead >= traced
                and lead % traced == 0 and t.op not in resident and t.shape not in resident_shapes):
            moved.append(t.name)
            t = dataclasses.replace(t, fixed_bytes=0, per_sample_bytes=t.fixed_bytes // traced)
        tensors.append(t)
    if not moved:
        return None, ()
    return Graph(graph.ops.values(), tensors, batch_size=traced, name=graph.name), tuple(moved)


def _short(config: LMSConfig) -> str:
    changed = {k: v for k, v in config.to_dict().items() if k in ("n_tensors", "lb", "schedule", "prefetch",
                                                                  "recompute") and v != getattr(LMSConfig(), k)}
    return "LMSConfig(" + ", ".join(f"{k}={v!r}" for k, v in changed.items()) + ")"


def _reason(chosen: Candidate, tried: list[Candidate], usable: int) -> str:
    if chosen is tried[0]:
        return f"the step fits without LMS (predicted peak {format_size(chosen.peak_bytes)} <= " \
               f"{format_size(usable)} usable)"
    too_big = [c for c in tried if not c.fits]
    slower = [c for c in tried if c.fits and c is not chosen]
    parts = [f"{c.label} peaks at {format_size(c.peak_bytes)}" for c in too_big]
    text = f"{'; '.join(parts)} (> {format_size(usable)} usable)" if parts else ""
    text += ("; " if text else "") + f"{chosen.label} fits at {format_size(chosen.peak_bytes)}"
    if slower:
        text += " with the shortest predicted step of the " + str(len(slower) + 1) + " that fit"
    return text
