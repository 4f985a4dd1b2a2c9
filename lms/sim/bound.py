"""A lower bound on the simulated peak of *any* LMS plan, and the batch bound it implies. No TensorFlow.

Whatever a plan swaps, recomputes or reorders, every op of the graph still
runs (a recompute clone runs in addition), and while it runs the simulator
(`lms.sim.compiled`, `lms.sim.interpreter.run`) holds on the device at once:

- the buffers of its data inputs and its outputs (a buffer a swap-in brought
  back, or a clone recomputed, is as large as the original);
- its temporaries (`lms.sim.costs.op_temporary` under the device's model,
  `lms.sim.interpreter.default_temporaries`);
- the resident bytes (each variable's largest read, once, plus constants, as
  `compile_graph` derives them when ``resident_bytes`` is not given) and the
  step's inputs (``Placeholder``/``_Arg`` outputs: the caller holds them all step).

So ``peak(plan, b) >= resident + inputs + max over ops of (op floor)(b)`` for every
plan, with the op floor counted as the simulator counts buffers: each buffer once
(an op reading a tensor twice, or a tensor and a view of it); views
(`ALIAS_TYPES`, reductions that reduce nothing) are their source's buffer;
variables, constants and their views are in the resident term, not the op's;
host tensors (swap-out outputs) are not device bytes; an element-wise op's output
is taken to be written into an input buffer whenever TF *could* forward it
(`FORWARDING_INPUTS`, same size, read once), since a plan may make the op that
input's last reader. Every allocation is rounded to the allocator's 256 bytes,
as the simulator rounds.

With ``spanning=True`` (the default) an op's floor also counts the *kept* buffers
live across it in every order: outputs of backward/other ops (the planner swaps
and recomputes forward tensors only, `lms.plan.find_candidates`), made by an
ancestor and read by a descendant of the op along backward/other ops alone (paths
no plan reroutes). These are counted unrounded.

Not counted (so the bound stays below every plan's simulated peak): other live
tensors (activations kept for the backward pass, buffers live only in some
orders), shape-only reads (the simulator holds their input until they ran), a swapped tensor's device copy held until its copy finished, and the
copy-on-write buffer of a variable updated while a read of it is pending (an
order can avoid it). The bound is a figure of the simulator's model: it says
no plan *the simulator can express* beats it, not what a real GPU does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..machine.devices import DeviceProfile, get_device
from ..graph import SHAPE_ONLY_TYPES, Graph, Role
from ..plan import HOST_DEVICE, SWAP_OUT_TYPE
from .compiled import ALIAS_TYPES, FORWARDING_INPUTS, INPUT_TYPES, RESIDENT_TYPES, resident_items
from .costs import TemporaryModel, op_temporary
from .interpreter import default_temporaries
from ..order import bypass_identities
from ..shapes import complete_sizes, is_noop_reduction

__all__ = ["OpFloor", "PeakFloor", "BatchBound", "peak_floor", "max_batch_bound"]

_ROUND_TO = 256


def _round(n: int) -> int:
    return -(-n // _ROUND_TO) * _ROUND_TO


@dataclass(frozen=True)
class OpFloor:
    """What one op holds on the device while it runs, at one batch (bytes, rounded as allocated).

    Attributes:
        op / type / role: the op.
        inputs: ``(tensor, bytes)`` per input buffer, each buffer once (named by
            the first input that reads it); resident, host and step-input buffers left out.
        outputs: ``(tensor, bytes)`` per newly allocated output buffer.
        forwarded: the output written into an input buffer (not in `outputs`), or ``None``.
        temporary_bytes: its temporaries.
        kept: ``(tensor, bytes)`` per kept buffer live across the op in every
            order (see `peak_floor`; unrounded), largest first.
    """

    op: str
    type: str
    role: Role
    inputs: tuple[tuple[str, int], ...]
    outputs: tuple[tuple[str, int], ...]
    forwarded: str | None
    temporary_bytes: int
    kept: tuple[tuple[str, int], ...] = ()

    @property
    def input_bytes(self) -> int:
        return sum(n for _, n in self.inputs)

    @property
    def output_bytes(self) -> int:
        return sum(n for _, n in self.outputs)

    @property
    def kept_bytes(self) -> int:
        return sum(n for _, n in self.kept)

    @property
    def total_bytes(self) -> int:
        return self.input_bytes + self.output_bytes + self.temporary_bytes + self.kept_bytes


@dataclass(frozen=True)
class PeakFloor:
    """A lower bound on the simulated peak of every plan at `batch`: ``bytes``.

    ``bytes = resident_bytes + step_input_bytes + op.total_bytes``, `op` the op with
    the largest floor (the first in graph order on a tie).
    """

    batch: int
    resident_bytes: int
    step_input_bytes: int
    op: OpFloor

    @property
    def bytes(self) -> int:
        return self.resident_bytes + self.step_input_bytes + self.op.total_bytes

    def to_dict(self) -> dict[str, Any]:
        o = self.op
        return {"batch": self.batch, "bytes": self.bytes, "resident_bytes": self.resident_bytes,
                "step_input_bytes": self.step_input_bytes,
                "op": {"name": o.op, "type": o.type, "role": o.role.value, "total_bytes": o.total_bytes,
                       "input_bytes": o.input_bytes, "output_bytes": o.output_bytes,
                       "temporary_bytes": o.temporary_bytes, "kept_bytes": o.kept_bytes, "forwarded": o.forwarded,
                       "inputs": [list(x) for x in o.inputs], "outputs": [list(x) for x in o.outputs],
                       "kept": [list(x) for x in o.kept]}}


@dataclass(frozen=True)
class BatchBound:
    """No plan's simulated peak fits `budget_bytes` above `batch` (0: not even batch 1).

    Attributes:
        batch: the largest batch whose floor fits (an upper bound on any plan's max batch).
        budget_bytes: the budget.
        at_batch: the floor at `batch` (at batch 1 when `batch` is 0).
        next_floor: the floor at ``batch + 1``, which exceeds the budget (``None`` at `limit`).
        capped: the search stopped at `limit`.
    """

    batch: int
    budget_bytes: int
    at_batch: PeakFloor
    next_floor: PeakFloor | None
    capped: bool = False


class _Floors:
    """Per-op buffer items compiled once; the floor at any batch is a few numpy passes."""

    def __init__(self, graph: Graph, temporaries: TemporaryModel, resident_bytes: int | None,
                 spanning: bool) -> None:
        g = complete_sizes(bypass_identities(graph))
        self.graph = g
        self._roots: dict[str, str] = {}
        root_of = self.root

        def kind(r: str) -> str:  # where a root buffer lives
            op = g.producer(r)
            if op.type in RESIDENT_TYPES:
                return "resident"
            if op.type == SWAP_OUT_TYPE or op.device == HOST_DEVICE:
                return "host"
            if op.type in INPUT_TYPES:
                return "input"
            t = g.tensors[r]
            return "none" if t.fixed_bytes == 0 and t.per_sample_bytes == 0 else "device"

        self.names: list[str] = list(g.ops)
        item_op: list[int] = []
        item_root: list[str] = []
        item_out: list[bool] = []
        self.forwarded: list[str | None] = []
        temp = np.zeros((len(self.names), 2))
        for i, name in enumerate(self.names):
            op = g.ops[name]
            temp[i] = op_temporary(g, op, temporaries)
            seen: set[str] = set()
            for t in () if op.type in SHAPE_ONLY_TYPES else op.inputs:
                r = root_of(t)
                if r not in seen and kind(r) == "device":
                    seen.add(r)
                    item_op.append(i), item_root.append(r), item_out.append(False)
            fwd = self._forwardable(g, op, root_of, kind)
            self.forwarded.append(fwd)
            host_op = op.type == SWAP_OUT_TYPE or op.device == HOST_DEVICE
            for t in op.outputs:
                r = root_of(t)
                if t == fwd or host_op or r in seen or kind(r) != "device":
                    continue
                seen.add(r)
                item_op.append(i), item_root.append(r), item_out.append(True)
        self.item_op = np.asarray(item_op, dtype=np.int64)
        self.item_root = item_root
        self.item_out = np.asarray(item_out, dtype=bool)
        self.item_fixed = np.asarray([g.tensors[r].fixed_bytes for r in item_root], dtype=np.int64)
        self.item_ps = np.asarray([g.tensors[r].per_sample_bytes for r in item_root], dtype=np.int64)
        self.temp = temp
        self.span_fixed = np.zeros(len(self.names), dtype=np.int64)
        self.span_ps = np.zeros(len(self.names), dtype=np.int64)
        self.spans: dict[str, tuple[int, ...]] = {}  # kept buffer -> positions of the ops it spans
        if spanning:
            self._spanning(kind)
        inputs = [t for op in g.ops.values() if op.type in INPUT_TYPES for t in op.outputs]
        self.input_fixed = np.asarray([g.tensors[t].fixed_bytes for t in inputs], dtype=np.int64)
        self.input_ps = np.asarray([g.tensors[t].per_sample_bytes for t in inputs], dtype=np.int64)
        if resident_bytes is None:
            self.resident = sum(_round(x) for x in resident_items(g)[0])
        elif resident_bytes < 0:
            raise ValueError(f"resident_bytes={resident_bytes}: must be >= 0")
        else:
            self.resident = int(resident_bytes)

    def _spanning(self, kind: Any) -> None:
        """Kept buffers live across an op in every order (see `peak_floor`), summed per op (unrounded)."""
        g = self.graph
        kept = [n for n in g.topological_order if g.ops[n].role is not Role.FORWARD]
        bit = {n: 1 << k for k, n in enumerate(kept)}
        desc: dict[str, int] = {}
        for n in reversed(kept):
            d = 0
            for x in g.successors[n]:
                if x in bit:
                    d |= desc[x] | bit[x]
            desc[n] = d
        anc: dict[str, int] = {}
        for n in kept:
            a = 0
            for x in g.predecessors(n):
                if x in bit:
                    a |= anc[x] | bit[x]
            anc[n] = a
        readers: dict[str, dict[str, None]] = {}
        for op in g.ops.values():
            if op.type not in SHAPE_ONLY_TYPES and op.name in bit:
                for t in op.inputs:
                    readers.setdefault(self.root(t), {})[op.name] = None
        pos = {n: i for i, n in enumerate(self.names)}
        where = np.asarray([pos[n] for n in kept], dtype=np.int64)
        width = (len(kept) + 7) // 8
        for root, rs in readers.items():
            producer = g.producer(root).name
            if producer not in bit or kind(root) != "device":
                continue
            after = 0
            for c in rs:
                after |= anc[c]
            mask = desc[producer] & after
            for c in rs:
                mask &= ~bit[c]
            if not mask:
                continue
            bits = np.unpackbits(np.frombuffer(mask.to_bytes(width, "little"), dtype=np.uint8), bitorder="little")
            idx = where[np.flatnonzero(bits[:len(kept)])]
            t = g.tensors[root]
            self.span_fixed[idx] += t.fixed_bytes
            self.span_ps[idx] += t.per_sample_bytes
            self.spans[root] = idx

    @staticmethod
    def _forwardable(g: Graph, op: Any, root_of: Any, kind: Any) -> str | None:
        """The output TF may write into an input buffer (same size, read once), else ``None``."""
        if op.type not in FORWARDING_INPUTS or len(op.outputs) != 1:
            return None
        out = g.tensors[op.outputs[0]]
        eligible = FORWARDING_INPUTS[op.type]
        for i in range(len(op.inputs)) if eligible is None else eligible:
            if i >= len(op.inputs) or op.inputs.count(op.inputs[i]) != 1:
                continue
            r = root_of(op.inputs[i])
            src = g.tensors[r]
            if kind(r) == "device" and (src.fixed_bytes, src.per_sample_bytes) == (out.fixed_bytes, out.per_sample_bytes):
                return out.name
        return None

    def totals(self, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """(per-op floor bytes, per-item rounded bytes) at `batch`."""
        sizes = _rounded(self.item_fixed + batch * self.item_ps)
        per_op = np.bincount(self.item_op, weights=sizes, minlength=len(self.names)).astype(np.int64)
        temps = _rounded(np.ceil(self.temp[:, 0] + batch * self.temp[:, 1]).astype(np.int64))
        return per_op + temps + self.span_fixed + batch * self.span_ps, sizes

    def floor(self, batch: int) -> PeakFloor:
        per_op, sizes = self.totals(batch)
        i = int(np.argmax(per_op)) if len(per_op) else 0
        mask = self.item_op == i
        items = [(self.item_root[k], int(sizes[k]), bool(self.item_out[k])) for k in np.flatnonzero(mask)]
        name = self.names[i]
        op = self.graph.ops[name]
        temp = int(_rounded(np.ceil(self.temp[i, 0] + batch * self.temp[i, 1]).astype(np.int64)))
        # name each input buffer by the tensor the op reads (a view's name if it reads a view)
        reads: dict[str, str] = {}
        for t in op.inputs:
            reads.setdefault(self.root(t), t)
        of = OpFloor(op=name, type=op.type, role=op.role,
                     inputs=tuple((reads.get(r, r), n) for r, n, out in items if not out),
                     outputs=tuple((r, n) for r, n, out in items if out),
                     forwarded=self.forwarded[i], temporary_bytes=temp,
                     kept=tuple(sorted(((r, self.graph.tensors[r].nbytes(batch)) for r, idx in self.spans.items()
                                        if i in idx), key=lambda x: -x[1])))
        step_inputs = int(_rounded(self.input_fixed + batch * self.input_ps).sum())
        return PeakFloor(batch=batch, resident_bytes=self.resident, step_input_bytes=step_inputs, op=of)

    def root(self, t: str) -> str:
        """The tensor whose buffer `t` is (itself unless `t` is a view)."""
        g, roots = self.graph, self._roots
        chain = []
        while t not in roots:
            op = g.producer(t)
            if not op.inputs or not (op.type in ALIAS_TYPES or is_noop_reduction(g, op)):
                roots[t] = t
                break
            chain.append(t)
            t = op.inputs[op.outputs.index(t)] if op.type == "IdentityN" else op.inputs[0]
        for c in chain:
            roots[c] = roots[t]
        return roots[t]

    def bytes(self, batch: int) -> int:
        per_op, _ = self.totals(batch)
        top = int(per_op.max()) if len(per_op) else 0
        return self.resident + int(_rounded(self.input_fixed + batch * self.input_ps).sum()) + top


def _rounded(sizes: np.ndarray) -> np.ndarray:
    return -(-sizes // _ROUND_TO) * _ROUND_TO


def _floors(graph: Graph, device: DeviceProfile | str | None, temporaries: TemporaryModel | None,
            resident_bytes: int | None, spanning: bool) -> _Floors:
    dev = get_device(device) if device is not None else None
    return _Floors(graph, default_temporaries(dev) if temporaries is None else temporaries, resident_bytes,
                   spanning)


def peak_floor(graph: Graph, batch: int, *, device: DeviceProfile | str | None = None,
               temporaries: TemporaryModel | None = None, resident_bytes: int | None = None,
               spanning: bool = True) -> PeakFloor:
    """A lower bound on the simulated peak device bytes of any plan for `graph` at `batch` (see the module).

    `device`, `temporaries` and `resident_bytes` as for `lms.simulator.simulate`
    (the device only selects the temporaries model; without one, the CPU model).
    """
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch={batch!r}: must be an integer >= 1")
    return _floors(graph, device, temporaries, resident_bytes, spanning).floor(batch)


def max_batch_bound(graph: Graph, budget_bytes: int, *, device: DeviceProfile | str | None = None,
                    temporaries: TemporaryModel | None = None, resident_bytes: int | None = None,
                    spanning: bool = True, limit: int = 1 << 20) -> BatchBound:
    """The largest batch whose `peak_floor` fits `budget_bytes`: no plan's simulated max batch exceeds it.

    The floor grows with the batch (every size is affine in it, rounded up), so
    this is a doubling bracket and a bisection, up to `limit`.
    """
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes={budget_bytes}: must be > 0")
    if limit < 1:
        raise ValueError(f"limit={limit}: must be >= 1")
    f = _floors(graph, device, temporaries, resident_bytes, spanning)
    if f.bytes(1) > budget_bytes:
        return BatchBound(0, budget_bytes, f.floor(1), f.floor(1))
    lo, hi = 1, 2
    while hi < limit and f.bytes(hi) <= budget_bytes:
        lo, hi = hi, hi * 2
    if hi >= limit:
        if f.bytes(limit) <= budget_bytes:
            return BatchBound(limit, budget_bytes, f.floor(limit), None, capped=True)
        hi = limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if f.bytes(mid) <= budget_bytes:
            lo = mid
        else:
            hi = mid
    return BatchBound(lo, budget_bytes, f.floor(lo), f.floor(lo + 1))
