"""Which order the recommended config runs the step's ops in, as plain data (no TensorFlow, no matplotlib).

With ``schedule="tf"`` and no ``serialization``/``sync_mode`` TF's executor
decides the order and nothing is computed here. Otherwise the summary is that
of the `lms.schedule.Schedule` the simulator uses for the timeline
(`lms.pipeline.schedule_for`, cached per graph and plan), so the table
and the curve describe the same pins::

    LMSConfig(schedule="memory") --resolve_plan--> SwapPlan --schedule_for--> Schedule --> ScheduleSummary

Every figure here is PREDICTED: candidate peaks come from the scheduler's own
liveness model (outputs live from producer to last reader, no temporaries) at
the batch it scores at (`Schedule.batch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ScheduleCandidate", "ScheduleSummary", "schedule_summary"]


@dataclass(frozen=True)
class ScheduleCandidate:
    """One order the memory scheduler scored.

    Attributes:
        name: its key in `Schedule.candidates` (``"list_lifo"``, ..., ``"tf"``).
        description: what the order is (`lms.schedule.CANDIDATES`).
        peak_bytes: PREDICTED peak of the order TF's executor runs with its pins.
        chosen: whether the scheduler kept it.
    """

    name: str
    description: str
    peak_bytes: int
    chosen: bool


@dataclass(frozen=True)
class ScheduleSummary:
    """The ordering of the recommended config.

    Attributes:
        kind: ``"tf"`` (TF's executor orders the ops) or ``"memory"`` (an order is pinned).
        chosen: the candidate kept (``""`` for ``"tf"``).
        n_ordered: ops in the pinned order (0 for ``"tf"``).
        n_pins: control edges added (the memory order's chain and the anchored constraints).
        n_constraints: ``serialization``/``sync_mode`` edges requested; `n_dropped` of them no
            pinnable pair could express.
        candidates: each scored order, lowest peak first (empty for ``"tf"``).
        scoring_batch: the batch the candidates were scored at.
        prefetch_share: with ``prefetch="headroom"``, the share of the order's peak its swap-ins
            were moved into (0: none moved, or ``prefetch="lb"``).
        exact: the order runs exactly: on the device simulated (a CPU: the emulated device) LMS
            pins the step's executed graph whole (`lms.tf.exact`), so every op runs where the order
            puts it; else only the pinnable ops carry the pins.
    """

    kind: str
    chosen: str = ""
    n_ordered: int = 0
    n_pins: int = 0
    n_constraints: int = 0
    n_dropped: int = 0
    candidates: tuple[ScheduleCandidate, ...] = ()
    scoring_batch: int = 0
    prefetch_share: float = 0.0
    exact: bool = False

    @property
    def pinned(self) -> bool:
        return self.kind != "tf" and self.n_ordered > 0

    @property
    def sentence(self) -> str:
        """One sentence for the timeline's caption."""
        if not self.pinned:
            text = "TF's executor decides the order (schedule='tf')"
            if self.n_pins or self.n_constraints:
                text += (f", with {self.n_pins} ordering edges added (serialization / sync_mode; "
                         f"{self.n_dropped} of {self.n_constraints} requested could not be pinned)")
            return text + "."
        best = min(c.peak_bytes for c in self.candidates) if self.candidates else 0
        tied = [c.name for c in self.candidates if c.peak_bytes == best and c.name != self.chosen]
        tie = f" (tied with {', '.join(tied)}; kept by tie-break order)" if tied else ""
        moved = (f" Its swap-ins were moved earlier into {self.prefetch_share:.0%} of the memory the order "
                 "leaves free below its peak (prefetch='headroom')." if self.prefetch_share else "")
        if self.exact:
            return (f"The recommended config pins the order (schedule='{self.kind}'): scheduler {self.chosen!r} "
                    f"was chosen of {len(self.candidates)} candidates{tie}, each scored by its own peak; on this "
                    f"device the step's executed graph is pinned whole (one chain through every op of TF's "
                    f"optimized graph), so its {self.n_ordered} ops run in that order, and the recommended curve "
                    f"is simulated in it.{moved}")
        return (f"The recommended config pins the order (schedule='{self.kind}'): scheduler {self.chosen!r} was "
                f"chosen of {len(self.candidates)} candidates{tie}; it orders {self.n_ordered} ops with "
                f"{self.n_pins} control edges, and the recommended curve is simulated with those pins.{moved}")


def schedule_summary(graph: Any, config: Any, *, device: Any = None) -> ScheduleSummary:
    """The ordering `config` gives `graph` (an `lms.graph.Graph` and an `lms.config.LMSConfig`) on `device`.

    Uses the same cached `Schedule` as `lms.simulator.simulate` on that device
    (pinned whole on a CPU profile, `lms.sim.interpreter.exact_on`), so the
    summary is of the order the simulated timeline runs.
    """
    if not config.pins_order:
        return ScheduleSummary(kind="tf")
    from lms.machine.devices import get_device
    from lms.schedule import CANDIDATES
    from lms.pipeline import plan_kernels, resolve_plan, schedule_for
    from lms.sim.interpreter import exact_on

    dev = get_device(device) if device is not None else None
    exact = config.schedule == "memory" and exact_on(dev)
    sched = schedule_for(graph, resolve_plan(graph, config, kernels=plan_kernels(dev)), exact=exact)
    rank = list(CANDIDATES)
    candidates = tuple(
        ScheduleCandidate(name=name, description=CANDIDATES.get(name, ""), peak_bytes=int(peak),
                          chosen=name == sched.chosen)
        for name, peak in sorted(sched.candidates.items(),
                                 key=lambda kv: (kv[1], rank.index(kv[0]) if kv[0] in rank else len(rank))))
    return ScheduleSummary(kind=sched.kind, chosen=sched.chosen, n_ordered=len(sched.order), n_pins=len(sched.pins),
                           n_constraints=len(sched.constraints), n_dropped=len(sched.dropped),
                           candidates=candidates, scoring_batch=sched.batch if sched.order else 0,
                           prefetch_share=sched.prefetch_share, exact=bool(sched.exact))
