"""The search space: the knob table's searched fields, with ``n_tensors`` scaled to the graph.

Derived from `tuner.policy.knobs.KnobTable` (values from each field's ``search``
metadata); for `LMSConfig` it is::

    n_tensors         0 .. all candidates, in 8 equal steps (0 = LMS off, the top = all)
    lb                1, 4, 7, 10, 13        (swap-in trigger distance, levels)
    fuse_swapins      False, True
    ctrld_strategy    chain_rule, direct_order
    swap_branches     False, True
    branch_threshold  10, 25, 40             (only when swap_branches)

``ub`` stays at its TFLMS default (10000): the planner takes the nearest
trigger at or beyond ``lb`` anyway, so a smaller ``ub`` only drops swaps, which
``n_tensors`` already controls.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from .knobs import KNOB_TABLE, Knob, KnobTable

__all__ = ["SearchSpace", "DistinctCounter"]


@dataclass(frozen=True)
class SearchSpace:
    """The knobs searched and their discrete values (also the benchmark's exhaustive grid).

    Attributes:
        n_candidates: swap candidates in the graph (`lms.plan.find_candidates`).
        n_tensor_levels: steps from 0 to all candidates.
        ranges: values that replace a knob's own ``search`` metadata, by name (a tuple or a range).
        table: the knob table (`tuner.policy.knobs.KNOB_TABLE`: `LMSConfig`'s fields).
    """

    n_candidates: int
    n_tensor_levels: int = 8
    ranges: Mapping[str, Any] = field(default_factory=dict)
    table: KnobTable = field(default=KNOB_TABLE, compare=False, repr=False)

    @property
    def n_tensor_step(self) -> int:
        levels = max(1, min(self.n_tensor_levels, self.n_candidates))
        return max(1, math.ceil(self.n_candidates / levels))

    @property
    def n_tensor_high(self) -> int:
        step = self.n_tensor_step
        return step * max(1, math.ceil(self.n_candidates / step))

    @property
    def knobs(self) -> tuple[Knob, ...]:
        return tuple(k for k in self.table.knobs if k.searched or k.name in self.ranges)

    def values(self, knob: Knob) -> tuple[Any, ...]:
        """The values searched for `knob` (``range`` searches stay ranges for `suggest`)."""
        return tuple(self._search(knob))

    def _search(self, knob: Knob) -> Any:
        search = self.ranges.get(knob.name, knob.search)
        if search == "candidates":
            return range(0, self.n_tensor_high + 1, self.n_tensor_step)
        return search

    def suggest(self, trial: Any) -> Any:
        """Ask `trial` for every knob (a conditional one only when its ``requires`` hold); the config."""
        params: dict[str, Any] = {}
        for k in self.knobs:
            if not k.applies(params):
                continue
            search = self._search(k)
            if isinstance(search, range):
                params[k.name] = trial.suggest_int(k.name, search.start, search[-1], step=search.step)
            else:
                params[k.name] = trial.suggest_categorical(k.name, list(search))
        return self.config_of(params)

    def complete(self, params: Mapping[str, Any]) -> bool:
        """Whether `params` holds every knob `suggest` would ask for (a trial done suggesting)."""
        return all(k.name in params for k in self.knobs if k.applies(params))

    def config_of(self, params: Mapping[str, Any]) -> Any:
        """The canonical config of a parameter set (off: all swap knobs at defaults; the top n_tensors: -1)."""
        values = {k.name: k.cast(params[k.name]) for k in self.table.knobs if k.name in params}
        for k in self.table.knobs:
            if k.search == "candidates" and values.get(k.name, 0) >= self.n_candidates:
                values[k.name] = -1  # the top level means "every candidate"
        filled = {k.name: values.get(k.name, k.default) for k in self.table.knobs}
        held = {k.name: k.default for k in self.table.knobs if not k.applies(filled)}
        config = self.table.config_cls(**{**filled, **held})
        return self.table.canonical(config)

    def _first(self, knob: Knob) -> Any:
        values = self.values(knob)
        return knob.default if knob.default in values else values[0]

    def baseline_params(self) -> dict[str, Any]:
        """No LMS: the reference every other trial is compared with (each other knob at its default)."""
        params: dict[str, Any] = {}
        for k in self.knobs:
            if k.applies(params):
                params[k.name] = 0 if k.search == "candidates" else self._first(k)
        return params

    def tflms_default_params(self) -> dict[str, Any]:
        """TFLMS's defaults: every candidate, lb=1, chain_rule, no fusing, no branches."""
        top = {k.name: self.n_tensor_high for k in self.knobs if k.search == "candidates"}
        return {**self.baseline_params(), **top}

    def warm_start_params(self) -> list[dict[str, Any]]:
        """What every search starts from: no LMS, TFLMS's defaults, and those with each knob's ``warm`` value.

        A knob declares a value worth trying first (`lms.config.knob`'s ``warm``:
        ``schedule="memory"``); a sampler would otherwise need to draw that value
        together with the right swap knobs out of thousands of configs.
        """
        tflms = self.tflms_default_params()
        starts = [self.baseline_params(), tflms]
        for k in self.knobs:
            if k.warm is not None and k.applies(tflms) and k.warm in self.values(k):
                start = {**tflms, k.name: k.warm}
                for j in self.knobs:  # knobs the warm value makes apply (prefetch with schedule="memory")
                    if j.name not in start and j.applies(start):
                        start[j.name] = self._first(j)  # at their defaults, not drawn by the sampler
                starts.append(start)
        return starts

    def ladder_params(self) -> list[dict[str, Any]]:
        """Every level of the ``candidates`` knob (``n_tensors``) on the warm starts of the knobs' ``warm`` values.

        (On TFLMS's defaults when no knob declares one; the levels those starts have already are left out.)

        A simulated screen starts from these too (`tuner.study.study.queue_warm_start`'s ``ladder``, up to half
        its trials): how many tensors are swapped moves the largest batch most, and not monotonically once
        TF's allocator is replayed (PREDICTED, ResNet-50 64x64, ``schedule="memory"``, 547 MiB usable:
        ``n_tensors`` 34 -> batch 50, 136 -> 172, 170 -> 189, 204 -> 154, every candidate -> 152), so a
        sampler that drew one level near another learned little about it; each level costs one
        simulation (about 1 s there).
        """
        levels = [k for k in self.knobs if k.search == "candidates"]
        out: list[dict[str, Any]] = []
        starts = self.warm_start_params()
        for start in starts[2:] or starts[1:2]:  # [no LMS, TFLMS's defaults, the warm values' starts...]
            for k in levels:
                for value in self.values(k):
                    if value not in (0, start[k.name]):
                        out.append({**start, k.name: value})
        return out

    def grid(self) -> list[dict[str, Any]]:
        """Every parameter combination (the exhaustive grid of this space), conditional knobs expanded last."""
        plain = [k for k in self.knobs if not k.requires]
        conditional = [k for k in self.knobs if k.requires]
        out = []
        for combo in itertools.product(*(self.values(k) for k in plain)):
            points = [dict(zip((k.name for k in plain), combo))]
            for k in conditional:
                points = [{**p, k.name: v} for p in points for v in self.values(k)] if k.applies(points[0]) \
                    else points
            out += points
        return out

    @property
    def n_distinct(self) -> int:
        """Distinct configs in the space (grid points that plan differently)."""
        return len(self.distinct_configs())

    def distinct_configs(self) -> dict[str, Any]:
        """canonical key -> config, one per distinct config of the grid, in grid order."""
        return dict(self.iter_distinct())

    def iter_distinct(self) -> Iterator[tuple[str, Any]]:
        """(canonical key, config) for each distinct config of the grid, in grid order, as they are found."""
        seen: set[str] = set()
        for params in self.grid():
            config = self.config_of(params)
            key = self.table.canonical_key(config)
            if key not in seen:
                seen.add(key)
                yield key, config

    def to_dict(self) -> dict[str, Any]:
        return {"n_candidates": self.n_candidates, "n_tensor_levels": self.n_tensor_levels,
                "knobs": {k.name: list(self.values(k)) for k in self.knobs}}


class DistinctCounter:
    """How many distinct configs a space holds, enumerated only as far as a question needs.

    The search loop asks after every trial whether the configs it has evaluated are all the space
    holds. Counting the whole default space builds every grid point's config (8,640 points, 8,162
    distinct for ResNet-50: about 0.6 s of every search process); the answer needs at most one
    config more than were evaluated, and the count goes on from where the last question stopped.
    """

    def __init__(self, space: SearchSpace) -> None:
        self._distinct = space.iter_distinct()
        self.found = 0  #: distinct configs enumerated so far
        self.complete = False  #: every grid point enumerated (`found` is the space's size)

    def at_most(self, n: int) -> bool:
        """Whether the space holds at most `n` distinct configs (enumerates at most ``n + 1`` of them)."""
        while not self.complete and self.found <= n:
            if next(self._distinct, None) is None:
                self.complete = True
            else:
                self.found += 1
        return self.complete and self.found <= n
