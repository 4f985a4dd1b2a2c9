"""What recomputation bought the recommended config, as plain data (no TensorFlow, no matplotlib).

For a recommended config with ``recompute != "none"``: which tensors the
backward pass rebuilds (`lms.plan.recompute.RecomputePlan` of the traced graph), and
the simulator's step at the recommended batch with and without recompute (the
same config with ``recompute="none"``)::

    graph + config --simulate--> link bytes, step time, peak   (PREDICTED)
    graph + config.replace(recompute="none") --simulate--> the same figures
    trials: both configs measured at that batch --> step times  (MEASURED, if the study has the pair)

Link bytes per step are `SimResult.transfer_bytes`: device -> host plus
host -> device copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import pandas as pd

__all__ = ["RecomputedTensor", "MeasuredPair", "RecomputeSummary", "recompute_summary", "measured_pair",
           "recompute_label"]


@dataclass(frozen=True)
class RecomputedTensor:
    """One tensor the backward pass rebuilds instead of keeping or swapping it.

    Attributes:
        tensor: its name in the traced graph.
        op_type: the type of the op that makes it.
        nbytes: its size at the batch (PREDICTED from the traced shapes).
        cloned_ops: the forward ops run again to rebuild it (execution order; all chains of it).
        link_bytes_without: bytes it crosses the link per step with ``recompute="none"``
            (one swap-out and each swap-in; 0 where that plan keeps it on the device).
    """

    tensor: str
    op_type: str
    nbytes: int
    cloned_ops: tuple[str, ...]
    link_bytes_without: int


@dataclass(frozen=True)
class MeasuredPair:
    """Two measured trials at one batch: the recommended config and the same with ``recompute="none"``."""

    backend: str
    batch: int
    trial: int
    trial_without: int
    step_time_s: float
    step_time_without_s: float

    @property
    def time_cost_s(self) -> float:
        return self.step_time_s - self.step_time_without_s


@dataclass(frozen=True)
class RecomputeSummary:
    """The recommended config's recomputation at the recommended batch.

    Attributes:
        recompute: the config's ``recompute`` as text (``"cheap"`` or the type list).
        batch: the recommended batch.
        device: the simulator's device profile (None: memory order only, no times).
        tensors: each recomputed tensor, in forward order.
        link_bytes / link_bytes_without: PREDICTED bytes per step over the host link, with the
            config and with ``recompute="none"``.
        step_time_s / step_time_without_s: PREDICTED step times (None without a device profile).
        peak_bytes / peak_bytes_without: PREDICTED peak device bytes.
        measured: the MEASURED pair, or None (`measured_note` says why).
        measured_note: how the pair was found, or why there is none.
    """

    recompute: str
    batch: int
    device: str | None
    tensors: tuple[RecomputedTensor, ...]
    link_bytes: int
    link_bytes_without: int
    step_time_s: float | None
    step_time_without_s: float | None
    peak_bytes: int
    peak_bytes_without: int
    measured: MeasuredPair | None = None
    measured_note: str = ""

    @property
    def recomputed_bytes(self) -> int:
        """Bytes per step of the recomputed tensors (each once)."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def link_bytes_saved(self) -> int:
        """PREDICTED bytes per step that no longer cross the link (negative: more cross)."""
        return self.link_bytes_without - self.link_bytes

    @property
    def time_cost_s(self) -> float | None:
        """PREDICTED step time added by recomputing (negative: the step got faster)."""
        if self.step_time_s is None or self.step_time_without_s is None:
            return None
        return self.step_time_s - self.step_time_without_s


def recompute_label(value: Any) -> str:
    """``"cheap"``, or ``"Relu, Mul"`` for a list of types."""
    return value if isinstance(value, str) else ", ".join(value)


def recompute_summary(graph: Any, config: Any, *, batch: int, device: Any = None,
                      trials: pd.DataFrame | None = None, prefer_trial: int | None = None) -> RecomputeSummary:
    """Recomputed tensors and the simulator's figures with and without recompute at `batch`.

    Args:
        graph: the traced `lms.graph.Graph`.
        config: the recommended `LMSConfig` (``recompute != "none"``).
        batch: the recommended batch.
        device: the simulator's device profile (name or `DeviceProfile`), or None.
        trials: the study's `tuner.report.data.trials_frame`, searched for a measured pair.
        prefer_trial: the recommended trial's number, taken first when it is one of a pair.

    Raises:
        ValueError: `config` recomputes nothing.
    """
    from lms.machine.devices import get_device
    from lms.pipeline import plan_kernels, resolve_plan
    from lms.sim.interpreter import simulate

    if config.recompute == "none":
        raise ValueError("recompute_summary: the config has recompute='none', so nothing is recomputed")
    without = config.replace(recompute="none")
    kernels = plan_kernels(get_device(device) if device is not None else None)
    plan = resolve_plan(graph, config, kernels=kernels)
    plan_without = resolve_plan(graph, without, kernels=kernels)
    swapped = {s.tensor: s for s in plan_without.swaps}
    rows: list[RecomputedTensor] = []
    recomputes = plan.recompute.recomputes if plan.recompute is not None else ()
    for tensor in dict.fromkeys(r.tensor for r in recomputes):
        chains = [r for r in recomputes if r.tensor == tensor]
        cloned = tuple(dict.fromkeys(c.op for r in chains for c in r.clones))
        nbytes = graph.tensor_bytes(tensor, batch)
        swap = swapped.get(tensor)
        rows.append(RecomputedTensor(tensor=tensor, op_type=graph.producer(tensor).type, nbytes=nbytes,
                                     cloned_ops=cloned,
                                     link_bytes_without=nbytes * (1 + len(swap.swap_ins)) if swap else 0))
    with_r = simulate(graph, plan, batch=batch, device=device, timeline=False)
    without_r = simulate(graph, plan_without, batch=batch, device=device, timeline=False)
    timed = device is not None
    pair, note = (measured_pair(trials, config, batch=batch, prefer_trial=prefer_trial)
                  if trials is not None else (None, "No trials were given to look for a measured pair."))
    return RecomputeSummary(
        recompute=recompute_label(config.recompute), batch=batch,
        device=getattr(device, "name", device), tensors=tuple(rows),
        link_bytes=with_r.transfer_bytes, link_bytes_without=without_r.transfer_bytes,
        step_time_s=with_r.step_time_s if timed else None,
        step_time_without_s=without_r.step_time_s if timed else None,
        peak_bytes=with_r.peak_device_bytes, peak_bytes_without=without_r.peak_device_bytes,
        measured=pair, measured_note=note)


def measured_pair(trials: pd.DataFrame, config: Any, *, batch: int,
                  prefer_trial: int | None = None) -> tuple[MeasuredPair | None, str]:
    """Measured feasible trials at `batch` of `config` and of ``config.replace(recompute="none")``, on one backend.

    Emulated measurements are taken before others. A trial's step time is its
    ``step_time_median_s``, else ``batch / throughput``.

    Returns:
        (the pair or None, a sentence saying which trials or why there is none).
    """
    from lms.config import LMSConfig

    without = config.replace(recompute="none")
    label = recompute_label(config.recompute)
    ok = trials[trials["feasible"] & trials["measured"] & (trials["batch_size"] == batch)] if len(trials) else trials
    same: list[Mapping[str, Any]] = []
    base: list[Mapping[str, Any]] = []
    for row in ok.to_dict("records"):
        try:
            cfg = LMSConfig.from_dict(row["config"])
        except (TypeError, ValueError):
            continue
        if cfg == config:
            same.append(row)
        elif cfg == without:
            base.append(row)
    pairs = [(a, b) for a in same for b in base if a["backend"] == b["backend"] and _step_time(a) and _step_time(b)]
    if not pairs:
        return None, (f"MEASURED: no measured pair exists: the study has no measured trial of both this config "
                      f"(recompute={label!r}) and the same config with recompute='none' at batch {batch}.")
    pairs.sort(key=lambda p: (p[0]["backend"] != "emulated", p[0]["number"] != prefer_trial,
                              -p[0]["number"], -p[1]["number"]))
    a, b = pairs[0]
    pair = MeasuredPair(backend=str(a["backend"]), batch=batch, trial=int(a["number"]), trial_without=int(b["number"]),
                        step_time_s=_step_time(a) or 0.0, step_time_without_s=_step_time(b) or 0.0)
    return pair, (f"MEASURED on the {pair.backend} backend: trial #{pair.trial} (recompute={label!r}) against "
                  f"trial #{pair.trial_without} (recompute='none'), both at batch {batch}.")


def _step_time(row: Mapping[str, Any]) -> float | None:
    median = row.get("step_time_median_s")
    if isinstance(median, (int, float)) and median == median and median > 0:
        return float(median)
    tput = row.get("throughput")
    if isinstance(tput, (int, float)) and tput == tput and tput > 0:
        return float(row["batch_size"]) / float(tput)
    return None
