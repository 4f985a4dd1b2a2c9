"""Compile a graph (and plan) once into integer arrays; each batch size is then a few numpy passes.

Steps, all batch-independent (sizes stay affine: ``fixed + per_sample * batch``):

1. The executed order (`executed_order`): TF's executor scheduling, one inter-op thread.
2. Buffers: which tensors share memory (views, in-place forwarding), when each
   buffer is allocated (its producer's position) and freed (after its last
   reader: one reverse walk, `_last_readers`).
3. Per-position arrays: live bytes (as prefix sums), temporaries, FLOPs, bytes
   moved; the swap ops and the ops that wait for swap-ins.

Memory rules, following TF's allocator and kernels:
- Ops TF prunes before it runs a step (`lms.graph.Op.live` False: nothing the
  step returns or must run needs them) are left out (`prune_dead`).
- An op's outputs are allocated when it runs; its inputs are released after it
  ran. Outputs nobody reads are freed right after their producer.
- Views share their input's buffer (`ALIAS_TYPES`: Identity, Reshape, ...).
- Element-wise ops write into an input buffer when they are its last reader
  and the sizes match (TF's ``forward_input_or_allocate_output``;
  `FORWARDING_INPUTS`). A buffer a swap-out reads is never forwarded (the copy
  holds a reference).
- Variables and constants are resident (`resident_bytes`); ``ReadVariableOp``
  returns a view of the variable. Inputs (``Placeholder``/``_Arg``) are held
  by the caller for the whole step.
- Swap-out outputs (device ``"host"``) are host bytes; the device copy is a
  normal buffer whose last reader is the swap-out (or a later device reader).
  The time model may hold it longer: until the device->host copy finished.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..graph import Graph, Role
from ..optypes import INPUT_TYPES, RESIDENT_TYPES, VIEW_TYPES
from ..plan import HOST_DEVICE, SWAP_IN_TYPE, SWAP_OUT_TYPE, SwapPlan, rewrite_graph
from ..optypes import ZERO_COST_TYPES
from .costs import TemporaryModel, op_bytes, op_flops, op_temporary
from .layout import nchw_tensors, swap_transposes, transposed_rank
from ..order import bypass_identities, executed_order, prune_dead
from ..schedule import merge_edges, pin_graph
from ..shapes import complete_sizes, is_noop_reduction

__all__ = ["CompiledGraph", "compile_graph", "ALIAS_TYPES",
           "FORWARDING_INPUTS", "INPUT_TYPES", "RESIDENT_TYPES"]

log = logging.getLogger(__name__)

ALIAS_TYPES = VIEW_TYPES  # views: no new memory (`lms.optypes`)

_UNARY = ("Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Sigmoid", "Tanh", "Exp", "Log", "Log1p",
          "Neg", "Sqrt", "Rsqrt", "Square", "Reciprocal", "Inv", "Abs", "Sign", "Floor", "Ceil",
          "Round", "Softplus", "Softsign", "Erf", "Expm1", "Sin", "Cos", "BiasAdd")
_BINARY = ("Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "MulNoNan", "Maximum",
           "Minimum", "SquaredDifference", "Pow", "FloorDiv", "FloorMod", "SigmoidGrad", "TanhGrad",
           "RsqrtGrad", "SqrtGrad", "ReciprocalGrad", "InvGrad")
_GRAD_FIRST = ("ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "LeakyReluGrad", "SoftplusGrad",
               "SoftsignGrad")
# op type -> input indices TF may reuse as the output buffer (None: every input).
FORWARDING_INPUTS: Mapping[str, tuple[int, ...] | None] = {
    **{t: (0,) for t in _UNARY}, **{t: (0, 1) for t in _BINARY}, **{t: (0,) for t in _GRAD_FIRST},
    "AddN": None,
}

_ROLE_CODE = {Role.FORWARD: 0, Role.BACKWARD: 1, Role.OTHER: 2}


@dataclass(frozen=True, eq=False)
class CompiledGraph:
    """A graph (rewritten by a plan) as arrays over executed positions ``0..n-1``.

    Buffer ``i`` is live during positions ``buf_alloc[i]..buf_free[i]``. All
    byte arrays are affine in the batch: ``*_fixed + batch * *_ps``; the
    allocator rounds each allocation up to ``round_to`` bytes.
    """

    plan: SwapPlan | None
    order_kind: str
    op_names: tuple[str, ...]
    op_types: tuple[str, ...]
    roles: np.ndarray
    # buffers
    buf_tensor: tuple[str, ...]
    buf_fixed: np.ndarray
    buf_ps: np.ndarray
    buf_alloc: np.ndarray
    buf_free: np.ndarray
    buf_host: np.ndarray
    buf_pinned: np.ndarray  # step inputs, held by the caller
    resident_sizes: tuple[int, ...]  # variables, then constants
    steals: tuple[tuple[int, int, int], ...]  # (position, value buffer, variable index): AssignVariableOp
    # temporaries at each position
    temp_fixed: np.ndarray
    temp_ps: np.ndarray
    resident_fixed: int
    resident_ps: int
    round_to: int
    # time model inputs
    flops_fixed: np.ndarray  # NaN: memory-bound op
    flops_ps: np.ndarray
    bytes_fixed: np.ndarray
    bytes_ps: np.ndarray
    zero_cost: np.ndarray
    # swaps
    swap_out_pos: np.ndarray
    swap_out_tensor: tuple[str, ...]
    swap_out_src_buf: np.ndarray  # device buffer copied out, -1 if none
    swap_out_host_buf: np.ndarray
    swap_in_pos: np.ndarray
    swap_in_tensor: tuple[str, ...]
    swap_in_out_index: np.ndarray  # index into swap_out_* of its source
    swap_in_buf: np.ndarray
    events: tuple[tuple[int, int, int], ...]  # (position, kind 0=out 1=in 2=wait, index)
    waits: tuple[tuple[int, ...], ...]  # for wait events: swap-in indices the op reads
    forward_end: int
    backward_start: int

    @property
    def n_positions(self) -> int:
        return len(self.op_names)


def _last_readers(graph: Graph, order: tuple[str, ...]) -> dict[str, int]:
    """Tensor -> position of its last reader: one reverse walk over the order.

    Shape-only readers count: TF's executor holds the tensor until they ran
    (the executor runs them right after the producer anyway).
    """
    last: dict[str, int] = {}
    ops = graph.ops
    for pos in range(len(order) - 1, -1, -1):
        op = ops[order[pos]]
        for t in op.inputs:
            if t not in last:
                last[t] = pos
    return last


def resident_items(graph: Graph) -> tuple[list[int], dict[str, int]]:
    """Sizes of the variables (largest read per handle) and constants; handle -> index."""
    sizes: list[int] = []
    index: dict[str, int] = {}
    consts: list[int] = []
    for op in graph.ops.values():
        if op.type == "ReadVariableOp" and op.inputs and op.outputs:
            handle = _alias_root(graph, op.inputs[0])
            size = graph.tensors[op.outputs[0]].fixed_bytes
            if handle in index:
                sizes[index[handle]] = max(sizes[index[handle]], size)
            else:
                index[handle] = len(sizes)
                sizes.append(size)
        elif op.type in ("Const", "HostConst"):
            consts.extend(graph.tensors[t].fixed_bytes for t in op.outputs)
    return sizes + consts, index


def _round(n: int, to: int) -> int:
    return -(-n // to) * to if to > 1 else n


def _alias_root(graph: Graph, tensor: str) -> str:
    seen = 0
    while seen < 10_000:
        op = graph.producer(tensor)
        if op.type not in ALIAS_TYPES or not op.inputs:
            return tensor
        tensor = op.inputs[op.outputs.index(tensor)] if op.type == "IdentityN" else op.inputs[0]
        seen += 1
    return tensor


def compile_graph(graph: Graph, plan: SwapPlan | None = None, *, order: str = "executor",
                  expensive_op_bytes: int | None = None, temporaries: TemporaryModel,
                  resident_bytes: int | None = None, round_to: int = 256,
                  schedule: Any = None, layout_transposes: bool = False) -> CompiledGraph:
    """Rewrite `graph` by `plan` and compile it for `lms.sim.interpreter.run`.

    Args:
        graph: the training graph model.
        plan: swaps to apply (``None``: none).
        order: executed-order model (see `executed_order`).
        expensive_op_bytes: the executor's expensive-op threshold (CPU), or ``None`` (GPU).
        temporaries: per-op scratch model.
        resident_bytes: bytes resident for the whole step (weights, optimizer
            slots, constants); ``None``: derived from the graph (each variable's
            largest ``ReadVariableOp`` output, once, plus constants).
        round_to: allocation granularity (TF's BFC allocator: 256 bytes).
        schedule: a `lms.schedule.Schedule` for (graph, plan): its pins are
            added as control edges (and oneDNN's merged pairs as the schedule
            models them), and ``order`` runs over that graph: the pins fix the
            order of the pinnable ops, the executor places the rest. An exact
            schedule (`Schedule.exact`: the executed graph pinned whole) is the
            executed order itself.
        layout_transposes: each swap of a tensor in the converted layout gets a
            ``Transpose`` on the device beside its swap-out and each swap-in
            (Grappler's layout conversion on a GPU, `lms.sim.layout`): a temporary
            of the tensor's size and a pass over it on the compute stream.
    """
    g = rewrite_graph(graph, plan) if plan is not None and plan.rewrites else graph
    exact = schedule is not None and getattr(schedule, "exact", False) and bool(schedule.order)
    if schedule is not None and schedule.edges:
        g = _with_edges(g, schedule)
    g = complete_sizes(bypass_identities(prune_dead(g)))
    if exact:
        names = tuple(n for n in schedule.order if n in g.ops)
        if len(names) != len(g.ops):
            raise ValueError(f"the exact schedule orders {len(names)} of the {len(g.ops)} ops of {g.name!r}")
        order = "exact"
    else:
        names = executed_order(g, order, expensive_op_bytes=expensive_op_bytes)
    n = len(names)
    ops = [g.ops[nm] for nm in names]
    last_reader = _last_readers(g, names)
    bufs = _Buffers(n, last_reader)
    buf_of: dict[str, int] = {}
    no_forward: set[int] = set()
    # variable reads still to be consumed (copy-on-write): read output -> (handle, last reader)
    read_of: dict[str, str] = {}  # resident alias tensor -> the ReadVariableOp output it views
    reads: dict[str, list[str]] = {}  # variable handle -> its read outputs so far
    read_last: dict[str, int] = {}

    swaps = _SwapIndex()
    assigns: list[tuple[int, int, str]] = []  # (position, value buffer, variable handle)
    for pos, op in enumerate(ops):
        if op.type in RESIDENT_TYPES:
            for t in op.outputs:
                buf_of[t] = -1
            if op.type == "ReadVariableOp" and op.inputs and op.outputs:
                t = op.outputs[0]
                read_of[t] = t
                reads.setdefault(_alias_root(g, op.inputs[0]), []).append(t)
                read_last[t] = last_reader.get(t, pos)
            continue
        if op.type in ALIAS_TYPES or is_noop_reduction(g, op):
            for i, t in enumerate(op.outputs):
                src = op.inputs[i if op.type == "IdentityN" else 0] if op.inputs else None
                b = buf_of.get(src, -1) if src is not None else -1
                buf_of[t] = b
                if b >= 0:
                    bufs.last[b] = max(bufs.last[b], last_reader.get(t, -1))
                elif src in read_of:
                    read_of[t] = read_of[src]
                    read_last[read_of[t]] = max(read_last[read_of[t]], last_reader.get(t, -1))
            continue
        if temporaries.copy_on_write and op.inputs and (
                op.type in _VARIABLE_UPDATES or op.type.startswith("ResourceApply")):
            pending = [read_last[r] for r in reads.get(_alias_root(g, op.inputs[0]), ()) if read_last[r] > pos]
            if pending:
                size = g.tensors[reads[_alias_root(g, op.inputs[0])][0]].fixed_bytes
                bufs.add(f"{op.name}:copy_on_write", size, 0, pos, max(pending))
        if op.type == "AssignVariableOp" and len(op.inputs) >= 2:
            assigns.append((pos, buf_of.get(op.inputs[1], -1), op.inputs[0]))
        if op.type == SWAP_OUT_TYPE or op.device == HOST_DEVICE:
            src_buf = buf_of.get(op.inputs[0], -1) if op.inputs else -1
            if src_buf >= 0:
                no_forward.add(src_buf)
            for t in op.outputs:
                buf_of[t] = bufs.new(g, t, pos, host=True)
            if op.type == SWAP_OUT_TYPE:
                swaps.add_out(op, pos, src_buf, buf_of.get(op.outputs[0], -1) if op.outputs else -1)
            continue
        forwarded = False
        if op.type in FORWARDING_INPUTS and len(op.outputs) == 1:
            t = op.outputs[0]
            spec = g.tensors[t]
            eligible = FORWARDING_INPUTS[op.type]
            for i in range(len(op.inputs)) if eligible is None else eligible:
                if i >= len(op.inputs):
                    continue
                src = op.inputs[i]
                b = buf_of.get(src, -1)
                if (b < 0 or b in no_forward or bufs.host[b] or bufs.pinned[b] or bufs.last[b] != pos
                        or op.inputs.count(src) != 1
                        or bufs.fixed[b] != spec.fixed_bytes or bufs.ps[b] != spec.per_sample_bytes):
                    continue
                buf_of[t] = b
                bufs.last[b] = max(pos, last_reader.get(t, -1))
                forwarded = True
                break
        if not forwarded:
            pinned = op.type in INPUT_TYPES
            for t in op.outputs:
                spec = g.tensors[t]
                if spec.fixed_bytes == 0 and spec.per_sample_bytes == 0:
                    buf_of[t] = -1
                    continue
                buf_of[t] = bufs.new(g, t, pos, pinned=pinned)
        if op.type == SWAP_IN_TYPE:
            swaps.add_in(g, op, pos, buf_of.get(op.outputs[0], -1) if op.outputs else -1)

    temp_fixed = np.zeros(n)
    temp_ps = np.zeros(n)
    flops_fixed = np.full(n, np.nan)
    flops_ps = np.full(n, np.nan)
    bytes_fixed = np.zeros(n)
    bytes_ps = np.zeros(n)
    zero_cost = np.zeros(n, dtype=bool)
    for pos, op in enumerate(ops):
        temp_fixed[pos], temp_ps[pos] = op_temporary(g, op, temporaries)
        if op.type in ZERO_COST_TYPES or op.type in (SWAP_OUT_TYPE, SWAP_IN_TYPE) or op.device == HOST_DEVICE:
            zero_cost[pos] = True
            continue
        fl = op_flops(g, op)
        if fl is not None:
            flops_fixed[pos], flops_ps[pos] = fl
        bytes_fixed[pos], bytes_ps[pos] = op_bytes(g, op)

    if layout_transposes and (swaps.out_pos or swaps.in_pos):
        ranks = transposed_rank(g)
        beside = swap_transposes(g, ranks, nchw_tensors(g, ranks))
        for pos in (*swaps.out_pos, *swaps.in_pos):
            op = ops[pos]
            t = op.inputs[0] if op.type == SWAP_OUT_TYPE else op.outputs[0]
            if op.name not in beside:
                continue
            spec = g.tensors[t]
            temp_fixed[pos] += spec.fixed_bytes
            temp_ps[pos] += spec.per_sample_bytes
            bytes_fixed[pos] += 2 * spec.fixed_bytes  # read + write, on the compute stream
            bytes_ps[pos] += 2 * spec.per_sample_bytes
            zero_cost[pos] = False

    resident_sizes, var_index = resident_items(g)
    steals = tuple((pos, buf, var_index[_alias_root(g, h)]) for pos, buf, h in assigns
                   if buf >= 0 and bufs.last[buf] == pos and _alias_root(g, h) in var_index)
    if resident_bytes is None:
        resident = sum(_round(x, round_to) for x in resident_sizes)
    elif resident_bytes < 0:
        raise ValueError(f"resident_bytes={resident_bytes}: must be >= 0")
    else:
        resident = int(resident_bytes)

    events, waits = swaps.events(g, ops)
    log.debug("compiled %s (%s order): %d ops, %d buffers, %d swap-outs, %d swap-ins", g.name, order, n,
              len(bufs.tensor), len(swaps.out_pos), len(swaps.in_pos))
    roles = np.asarray([_ROLE_CODE[o.role] for o in ops], dtype=np.int8)
    fwd = np.flatnonzero(roles == 0)
    bwd = np.flatnonzero(roles == 1)
    return CompiledGraph(
        plan=plan, order_kind=order, op_names=names, op_types=tuple(o.type for o in ops),
        roles=roles, buf_tensor=tuple(bufs.tensor), buf_fixed=np.asarray(bufs.fixed, dtype=np.int64),
        buf_ps=np.asarray(bufs.ps, dtype=np.int64), buf_alloc=np.asarray(bufs.alloc, dtype=np.int64),
        buf_free=np.asarray(bufs.last, dtype=np.int64), buf_host=np.asarray(bufs.host, dtype=bool),
        buf_pinned=np.asarray(bufs.pinned, dtype=bool), resident_sizes=tuple(resident_sizes), steals=steals,
        temp_fixed=temp_fixed, temp_ps=temp_ps, resident_fixed=resident, resident_ps=0, round_to=round_to,
        flops_fixed=flops_fixed, flops_ps=flops_ps, bytes_fixed=bytes_fixed, bytes_ps=bytes_ps,
        zero_cost=zero_cost,
        swap_out_pos=np.asarray(swaps.out_pos, dtype=np.int64), swap_out_tensor=tuple(swaps.out_tensor),
        swap_out_src_buf=np.asarray(swaps.out_src, dtype=np.int64),
        swap_out_host_buf=np.asarray(swaps.out_host, dtype=np.int64),
        swap_in_pos=np.asarray(swaps.in_pos, dtype=np.int64), swap_in_tensor=tuple(swaps.in_tensor),
        swap_in_out_index=np.asarray(swaps.in_out, dtype=np.int64),
        swap_in_buf=np.asarray(swaps.in_buf, dtype=np.int64),
        events=events, waits=waits,
        forward_end=int(fwd[-1]) if fwd.size else -1,
        backward_start=int(bwd[0]) if bwd.size else -1,
    )


def _with_edges(g: Graph, schedule: Any) -> Graph:
    return pin_graph(g, schedule.edges + merge_edges(g))


_VARIABLE_UPDATES = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})


class _Buffers:
    """Growing columns of the buffer table."""

    def __init__(self, n: int, last_reader: dict[str, int]) -> None:
        self.n = n
        self.last_reader = last_reader
        self.tensor: list[str] = []
        self.fixed: list[int] = []
        self.ps: list[int] = []
        self.alloc: list[int] = []
        self.last: list[int] = []
        self.host: list[bool] = []
        self.pinned: list[bool] = []  # inputs held by the caller: never forwarded

    def add(self, label: str, fixed: int, ps: int, alloc: int, last: int, *, host: bool = False,
            pinned: bool = False) -> int:
        self.tensor.append(label)
        self.fixed.append(fixed)
        self.ps.append(ps)
        self.alloc.append(alloc)
        self.last.append(last)
        self.host.append(host)
        self.pinned.append(pinned)
        return len(self.tensor) - 1

    def new(self, g: Graph, t: str, pos: int, *, host: bool = False, pinned: bool = False) -> int:
        spec = g.tensors[t]
        if pinned:
            return self.add(t, spec.fixed_bytes, spec.per_sample_bytes, 0, self.n - 1, pinned=True)
        return self.add(t, spec.fixed_bytes, spec.per_sample_bytes, pos,
                        max(pos, self.last_reader.get(t, -1)), host=host)


class _SwapIndex:
    """Swap-outs, swap-ins and the ops waiting for swap-ins, in executed positions."""

    def __init__(self) -> None:
        self.out_pos: list[int] = []
        self.out_tensor: list[str] = []
        self.out_src: list[int] = []
        self.out_host: list[int] = []
        self.out_index: dict[str, int] = {}
        self.in_pos: list[int] = []
        self.in_tensor: list[str] = []
        self.in_out: list[int] = []
        self.in_buf: list[int] = []
        self.in_index: dict[str, int] = {}

    def add_out(self, op, pos: int, src_buf: int, host_buf: int) -> None:  # noqa: ANN001
        self.out_index[op.name] = len(self.out_pos)
        self.out_pos.append(pos)
        self.out_tensor.append(op.inputs[0] if op.inputs else "")
        self.out_src.append(src_buf)
        self.out_host.append(host_buf)

    def add_in(self, g: Graph, op, pos: int, buf: int) -> None:  # noqa: ANN001
        self.in_index[op.name] = len(self.in_pos)
        self.in_pos.append(pos)
        self.in_tensor.append(op.inputs[0] if op.inputs else "")
        src_op = g.producer(op.inputs[0]).name if op.inputs else ""
        self.in_out.append(self.out_index.get(src_op, -1))
        self.in_buf.append(buf)

    def events(self, g: Graph, ops: list) -> tuple[tuple[tuple[int, int, int], ...], tuple[tuple[int, ...], ...]]:
        waits: list[tuple[int, ...]] = []
        events = [(p, 0, i) for i, p in enumerate(self.out_pos)] + [(p, 1, i) for i, p in enumerate(self.in_pos)]
        if self.in_index or self.out_index:
            for pos, op in enumerate(ops):
                if op.type == SWAP_IN_TYPE:
                    continue
                reads = tuple(dict.fromkeys(self.in_index[g.producer(t).name] for t in op.inputs
                                            if g.producer(t).name in self.in_index))
                # a control input from a swap-out (sync_mode 1): wait for that copy; coded -1 - index
                reads += tuple(-1 - self.out_index[c] for c in op.control_inputs if c in self.out_index)
                if reads:
                    events.append((pos, 2, len(waits)))
                    waits.append(reads)
        events.sort()
        return tuple(events), tuple(waits)
