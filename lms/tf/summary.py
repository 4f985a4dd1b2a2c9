"""What LMS did to one traced step (`LMSSummary`), and the configs `lms.function` accepts (`as_config`)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

from ..config import LMSConfig
from ..graph import Graph
from ..plan import SwapPlan
from .corrections import Correction

__all__ = ["LMSSummary", "SwappedTensor", "as_config"]


@dataclass(frozen=True)
class SwappedTensor:
    """One swapped tensor of a traced step.

    Attributes:
        tensor: tensor name.
        bytes: size at the traced batch.
        kind: ``"backward"``, ``"branch"`` or ``"backward+branch"``.
        consumers: ops that read the swapped-in copy.
        trigger: trigger of the first swap-in (the one serving the earliest consumer).
        swap_ins: names of its swap-in ops.
    """

    tensor: str
    bytes: int
    kind: str
    consumers: tuple[str, ...]
    trigger: str | None
    swap_ins: tuple[str, ...]


@dataclass(frozen=True)
class LMSSummary:
    """What LMS did to one traced step.

    Attributes:
        n_swapped: tensors swapped.
        swapped_bytes: their bytes at `batch_size`.
        n_swap_ins: swap-in ops.
        n_candidates: tensors the planner considered.
        batch_size: batch the sizes refer to.
        swap_ops: ``"device"`` or ``"emulated"``.
        swapped: one entry per swapped tensor.
        note: why nothing was swapped when LMS did not run (running eagerly,
            ``n_tensors=0``), or why a recurrent layer's activations were not
            (While-loop accumulators); empty otherwise.
        recomputed: tensors the backward pass rebuilds instead (``LMSConfig.recompute``).
        recomputed_bytes: their bytes at `batch_size` (no longer kept or swapped).
        n_clones: forward ops cloned into the backward pass to rebuild them.
        corrections: what the equivalence check (`lms.tf.equivalence`) changed so that
            Grappler optimizes the step as without LMS: triggers moved, swap-ins or
            recomputes dropped, each with its reason.
        config: the `LMSConfig` this trace was planned with (with ``config="auto"``: the one chosen).
        auto: with ``config="auto"``, the `lms.auto.AutoChoice` (what was simulated and why this config);
            None otherwise.
        peak_host_bytes: host memory the plan's swapped tensors hold at once at their peak, at
            `batch_size` (PREDICTED by the simulator's order model, `lms.sim.host`: each host copy from
            its swap-out until its last swap-in); 0 without swaps, None where no graph model was kept.
            On a GPU this is pinned memory, capped by ``TF_GPU_HOST_MEM_LIMIT_IN_MB`` (128 GiB by default).
    """

    n_swapped: int
    swapped_bytes: int
    n_swap_ins: int
    n_candidates: int
    batch_size: int
    swap_ops: str
    swapped: tuple[SwappedTensor, ...]
    recomputed: tuple[str, ...] = ()
    recomputed_bytes: int = 0
    n_clones: int = 0
    note: str = ""
    corrections: tuple[Correction, ...] = ()
    config: LMSConfig | None = None
    auto: Any = None
    peak_host_bytes: int | None = None

    def at_batch(self, graph: Graph, batch: int) -> "LMSSummary":
        """The same swaps with their bytes at `batch` (sizes from the graph model, affine in the batch)."""
        swapped = tuple(replace(s, bytes=graph.tensor_bytes(s.tensor, batch)) for s in self.swapped)
        recomputed_bytes = sum(graph.tensor_bytes(t, batch) for t in self.recomputed)
        return replace(self, batch_size=batch, swapped=swapped, swapped_bytes=sum(s.bytes for s in swapped),
                       recomputed_bytes=recomputed_bytes, peak_host_bytes=None)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(replace(self, config=None, auto=None))
        out["swapped"] = [dict(s, consumers=list(s["consumers"]), swap_ins=list(s["swap_ins"]))
                          for s in out["swapped"]]
        out["recomputed"] = list(self.recomputed)
        out["corrections"] = [dict(c) for c in out["corrections"]]
        out["config"] = self.config.to_dict() if self.config is not None else None
        out["auto"] = self.auto.to_dict() if self.auto is not None else None
        return out

    @classmethod
    def from_plan(cls, plan: SwapPlan, *, swap_ops: str, note: str = "", auto: Any = None,
                  corrections: tuple[Correction, ...] = ()) -> "LMSSummary":
        swapped = tuple(
            SwappedTensor(tensor=s.tensor, bytes=s.nbytes, kind=s.kind, consumers=s.consumers,
                          trigger=s.swap_ins[0].trigger if s.swap_ins else None,
                          swap_ins=tuple(i.name for i in s.swap_ins))
            for s in plan.swaps)
        rp = plan.recompute
        return cls(n_swapped=plan.n_swapped, swapped_bytes=plan.swapped_bytes, n_swap_ins=plan.n_swap_ins,
                   n_candidates=plan.n_candidates, batch_size=plan.batch_size, swap_ops=swap_ops,
                   swapped=swapped, recomputed=rp.tensors if rp is not None else (),
                   recomputed_bytes=plan.recomputed_bytes, n_clones=rp.n_clones if rp is not None else 0,
                   note=note, corrections=tuple(corrections), config=plan.config, auto=auto)


def as_config(config: Any) -> LMSConfig:
    """An `LMSConfig` from a config, a mapping of its fields, or a config file's path (`LMSConfig.load`:
    an ``lms.config`` file or a tuner ``recommended.json``); ValueError otherwise."""
    if isinstance(config, LMSConfig):
        return config
    if isinstance(config, Mapping):
        return LMSConfig.from_dict(config)
    if isinstance(config, (str, os.PathLike)):
        if not os.path.isfile(config):
            raise ValueError(f"config {str(config)!r} is not an lms.LMSConfig, a dict of its fields or an existing "
                             "config file")
        return LMSConfig.load(config)
    raise ValueError("config must be an lms.LMSConfig, a dict of its fields or a config file's path, got "
                     f"{type(config).__name__}")
