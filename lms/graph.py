"""A framework-free model of a training graph: ops, tensors, sizes, order.

Nothing here imports TensorFlow. The TF adapter (`lms.tf.extract`) builds a
`Graph` from a traced training step; the planner, simulator and tuner work on
the `Graph` alone, so they import and test in milliseconds.

Conventions:
- A tensor is named ``"<producer op>:<output index>"`` as in TensorFlow.
- Every op has a `Role`: ``FORWARD`` (the loss depends on it through data
  edges), ``BACKWARD`` (gradient computation) or ``OTHER`` (optimizer updates,
  metrics, moving averages, ...).
- A tensor's size is affine in the batch size: ``fixed_bytes +
  per_sample_bytes * batch``. The adapter decides which part scales.
- The *level* of an op is the length of the longest path (data and control
  edges) from a source to it. An edge ``a -> b`` implies ``level(a) <
  level(b)``, which is what makes level-based trigger choices acyclic.
"""

from __future__ import annotations

import enum
import hashlib
import heapq
from dataclasses import dataclass, field
from functools import cached_property
from typing import Hashable, Iterable, Iterator, Mapping, TypeVar

__all__ = [
    "Role", "Op", "Tensor", "Graph", "GraphError", "SHAPE_ONLY_TYPES", "dtype_size", "group_pairs",
]


class GraphError(ValueError):
    """The graph model is malformed (dangling reference, cycle, bad role)."""


class Role(str, enum.Enum):
    FORWARD = "forward"
    BACKWARD = "backward"
    OTHER = "other"


# Ops that read only a tensor's shape, never its data: not real consumers.
SHAPE_ONLY_TYPES = frozenset({"Shape", "ShapeN", "Size", "Rank", "VariableShape"})

_DTYPE_SIZES = {
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
    "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
    "int64": 8, "uint64": 8, "bool": 1, "complex64": 8, "complex128": 16,
}


_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")
_LONG_GROUP = 32


def group_pairs(pairs: Iterable[tuple[_K, _V]], into: dict[_K, tuple[_V, ...]] | None = None) -> dict[_K, tuple[_V, ...]]:
    """``{key: (value, ...)}`` from ``(key, value)`` pairs, values in the order given (added to `into`).

    Builds tuples, not a list per key: in a TF process the cyclic GC keeps every
    live list on its books and promotes it, and thousands of per-op lists tip a
    full collection of the whole heap (0.3-0.5 s on a ResNet-50 trace) into
    LMS's rewrite; tuples of names and numbers leave the books at its next pass.
    A key with many values collects them in a list (linear time, however many).
    """
    out: dict[_K, tuple[_V, ...]] = {} if into is None else into
    long: dict[_K, list[_V]] = {}
    for key, value in pairs:
        if key in long:
            long[key].append(value)
            continue
        grown = out.get(key, ()) + (value,)
        out[key] = grown
        if len(grown) >= _LONG_GROUP:
            long[key] = list(grown)
    for key, values in long.items():
        out[key] = tuple(values)
    return out


def dtype_size(dtype: str) -> int:
    """Bytes per element of a dtype name (``"float32"`` -> 4); 0 if unknown."""
    return _DTYPE_SIZES.get(dtype, 0)


@dataclass(frozen=True)
class Tensor:
    """One op output.

    Attributes:
        name: ``"<op>:<index>"``.
        dtype: dtype name, e.g. ``"float32"``.
        shape: dims, ``None`` for an unknown dim; ``None`` for unknown rank.
        fixed_bytes: bytes that do not scale with the batch.
        per_sample_bytes: bytes per sample of the batch.
    """

    name: str
    dtype: str = "float32"
    shape: tuple[int | None, ...] | None = None
    fixed_bytes: int = 0
    per_sample_bytes: int = 0

    @property
    def op(self) -> str:
        return self.name.rsplit(":", 1)[0]

    @property
    def index(self) -> int:
        return int(self.name.rsplit(":", 1)[1])

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    def nbytes(self, batch: int) -> int:
        """Size in bytes at batch size `batch`."""
        return self.fixed_bytes + self.per_sample_bytes * batch


@dataclass(frozen=True)
class Op:
    """One graph node.

    Attributes:
        name: unique op name; its scope is everything before the last ``/``.
        type: op type, e.g. ``"Conv2D"``.
        role: forward, backward or other.
        inputs: data inputs, tensor names.
        control_inputs: op names this op must wait for.
        outputs: output tensor names (``"<name>:0"``, ...).
        grad_of: for backward ops, the forward op whose gradient this op helps
            compute (``None`` if unknown). Used by the ``chain_rule`` strategy.
        device: placement, as the framework spelled it (may be empty).
        live: False for an op whose results nothing uses: no output of the step
            and no op that must run (a variable update, a metric) depends on it,
            so TensorFlow prunes it before running the step (a frozen layer's
            filter gradient, the gradient of a constant divisor). The planners
            neither swap for it nor take it as a trigger. True when unknown.
    """

    name: str
    type: str
    role: Role = Role.FORWARD
    inputs: tuple[str, ...] = ()
    control_inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    grad_of: str | None = None
    device: str = ""
    live: bool = True

    @property
    def scope(self) -> str:
        return self.name.rsplit("/", 1)[0] if "/" in self.name else ""

    @cached_property
    def input_ops(self) -> tuple[str, ...]:
        """Producers of `inputs` (one per input; cached: graphs derived from a graph share its ops)."""
        return tuple(t.rsplit(":", 1)[0] for t in self.inputs)


@dataclass(frozen=True)
class _Index:
    consumers: Mapping[str, tuple[str, ...]]
    control_outputs: Mapping[str, tuple[str, ...]]


class Graph:
    """An immutable training graph with derived indexes (computed once, cached).

    Args:
        ops: ops in creation order (used to break ties in the topological order).
        tensors: every tensor that some op outputs.
        batch_size: the batch size the graph was traced at (sizes are given
            for any batch via `Tensor.nbytes`).
        name: free-form label (e.g. the model name).
    """

    def __init__(self, ops: Iterable[Op], tensors: Iterable[Tensor], *,
                 batch_size: int = 1, name: str = "") -> None:
        self.ops: dict[str, Op] = {}
        for op in ops:
            if op.name in self.ops:
                raise GraphError(f"duplicate op name {op.name!r}")
            self.ops[op.name] = op
        self.tensors: dict[str, Tensor] = {}
        for t in tensors:
            if t.name in self.tensors:
                raise GraphError(f"duplicate tensor name {t.name!r}")
            self.tensors[t.name] = t
        if batch_size < 1:
            raise GraphError(f"batch_size={batch_size}: must be >= 1")
        self.batch_size = batch_size
        self.name = name

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops.values())

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, ops={len(self.ops)}, tensors={len(self.tensors)}, batch={self.batch_size})"

    # ---- indexes -----------------------------------------------------------------
    @cached_property
    def _index(self) -> _Index:
        ops = self.ops.values()
        consumers = group_pairs((t, op.name) for op in ops for t in op.inputs)
        return _Index(
            consumers={k: tuple(dict.fromkeys(v)) if len(v) > 1 else v for k, v in consumers.items()},
            control_outputs=group_pairs((c, op.name) for op in ops for c in op.control_inputs),
        )

    def producer(self, tensor: str) -> Op:
        return self.ops[tensor.rsplit(":", 1)[0]]

    def consumers(self, tensor: str) -> tuple[str, ...]:
        """Ops that read `tensor` through a data edge (shape-only readers included)."""
        return self._index.consumers.get(tensor, ())

    def data_consumers(self, tensor: str) -> tuple[str, ...]:
        """Consumers that read the tensor's data (shape-only readers excluded)."""
        found = self._data_consumers.get(tensor)
        if found is None:
            found = self._data_consumers[tensor] = tuple(
                c for c in self.consumers(tensor) if self.ops[c].type not in SHAPE_ONLY_TYPES)
        return found

    @cached_property
    def _data_consumers(self) -> dict[str, tuple[str, ...]]:
        return {}  # filled as asked (`data_consumers`)

    def control_outputs(self, op: str) -> tuple[str, ...]:
        return self._index.control_outputs.get(op, ())

    def live_readers(self, tensor: str) -> tuple[str, ...]:
        """Data consumers of `tensor` that TensorFlow runs (`Op.live`)."""
        return tuple(c for c in self.data_consumers(tensor) if self.ops[c].live)

    def predecessors(self, op: str) -> tuple[str, ...]:
        """Producers of `op`'s inputs, then its control inputs, each once."""
        return self._predecessors[op]

    @cached_property
    def _predecessors(self) -> Mapping[str, tuple[str, ...]]:
        return {name: tuple(dict.fromkeys(o.input_ops + o.control_inputs)) for name, o in self.ops.items()}

    @cached_property
    def successors(self) -> Mapping[str, tuple[str, ...]]:
        return group_pairs(((p, name) for name, preds in self._predecessors.items() for p in preds if p in self.ops),
                           into=dict.fromkeys(self.ops, ()))

    @cached_property
    def topological_order(self) -> tuple[str, ...]:
        """Kahn's algorithm, ties broken by creation order. Raises on a cycle."""
        position = {name: i for i, name in enumerate(self.ops)}
        indegree = {name: 0 for name in self.ops}
        for name, preds in self._predecessors.items():
            indegree[name] = sum(p in indegree for p in preds)
        heap = [(position[n], n) for n, d in indegree.items() if d == 0]
        heapq.heapify(heap)
        order: list[str] = []
        succ = self.successors
        while heap:
            _, name = heapq.heappop(heap)
            order.append(name)
            for s in succ[name]:
                indegree[s] -= 1
                if indegree[s] == 0:
                    heapq.heappush(heap, (position[s], s))
        if len(order) != len(self.ops):
            stuck = sorted((n for n, d in indegree.items() if d > 0), key=position.__getitem__)
            raise GraphError(f"graph has a cycle through {len(stuck)} ops, e.g. {stuck[:3]}")
        return tuple(order)

    @cached_property
    def levels(self) -> Mapping[str, int]:
        """Longest-path level of each op (sources are level 0)."""
        level: dict[str, int] = {}
        for name in self.topological_order:
            preds = [level[p] for p in self.predecessors(name) if p in level]
            level[name] = 1 + max(preds) if preds else 0
        return level

    @cached_property
    def ops_by_level(self) -> Mapping[int, tuple[str, ...]]:
        by: dict[int, list[str]] = {}
        for name in self.topological_order:
            by.setdefault(self.levels[name], []).append(name)
        return {k: tuple(v) for k, v in by.items()}

    @cached_property
    def forward_levels(self) -> Mapping[str, int]:
        """Longest-path level within the forward subgraph (data edges only)."""
        level: dict[str, int] = {}
        for name in self.topological_order:
            op = self.ops[name]
            if op.role is not Role.FORWARD:
                continue
            preds = [level[p] for p in op.input_ops if p in level]
            level[name] = 1 + max(preds) if preds else 0
        return level

    @cached_property
    def forward_end(self) -> str | None:
        """The deepest forward op whose data a backward op reads (e.g. the logits).

        Backward ops at or above its level may still be running alongside the
        forward pass (gradient constants, shapes of activations); the planner
        takes swap-in triggers only from deeper levels.
        """
        best: str | None = None
        for name, level in self.forward_levels.items():
            readers = (r for t in self.ops[name].outputs for r in self.data_consumers(t))
            if any(self.ops[r].role is Role.BACKWARD for r in readers):
                if best is None or self.levels[name] > self.levels[best]:
                    best = name
        return best

    @cached_property
    def _position(self) -> Mapping[str, int]:
        return {name: i for i, name in enumerate(self.ops)}

    @cached_property
    def gradient_ops(self) -> Mapping[str, tuple[str, ...]]:
        """Forward op name -> backward ops whose `grad_of` names it."""
        grads: dict[str, list[str]] = {}
        for op in self.ops.values():
            if op.role is Role.BACKWARD and op.grad_of is not None:
                grads.setdefault(op.grad_of, []).append(op.name)
        return {k: tuple(v) for k, v in grads.items()}

    def by_role(self, role: Role) -> tuple[str, ...]:
        return tuple(n for n in self.topological_order if self.ops[n].role is role)

    def tensor_bytes(self, tensor: str, batch: int | None = None) -> int:
        return self.tensors[tensor].nbytes(self.batch_size if batch is None else batch)

    @cached_property
    def _descendants(self) -> Mapping[str, int]:
        """Each op's descendants as a bitset over creation positions (one reverse walk)."""
        pos = self._position
        desc: dict[str, int] = {}
        for name in reversed(self.topological_order):
            bits = 0
            for s in self.successors[name]:
                bits |= desc[s] | (1 << pos[s])
            desc[name] = bits
        return desc

    def is_ancestor(self, ancestor: str, op: str) -> bool:
        """True if there is a path `ancestor` -> ... -> `op` (or they are the same op).

        O(1) after a one-off reachability pass over the graph.
        """
        if ancestor == op:
            return True
        if self.levels[op] <= self.levels[ancestor]:
            return False
        return bool((self._descendants[ancestor] >> self._position[op]) & 1)

    def fingerprint(self, roles: Iterable[Role] = (Role.FORWARD, Role.BACKWARD)) -> str:
        """A digest of the ops of `roles` (names, types, edges, liveness, output specs) and the batch.

        Two traces of one training step have the same forward and backward ops
        (Keras traces ``train_step`` twice under ``fit``: the first trace also
        creates the optimizer's variables), so a plan made for one applies to the other.
        """
        wanted = set(roles)
        h = hashlib.sha1(f"{self.batch_size}".encode())
        for op in self.ops.values():
            if op.role in wanted:
                specs = tuple((t, self.tensors[t].dtype, self.tensors[t].shape, self.tensors[t].fixed_bytes,
                               self.tensors[t].per_sample_bytes) for t in op.outputs)
                h.update(repr((op.name, op.type, op.role.value, op.inputs, op.control_inputs, op.live, op.grad_of,
                               specs)).encode())
        return h.hexdigest()

    # ---- lint --------------------------------------------------------------------
    def lint(self) -> None:
        """Check references, roles and acyclicity; raise `GraphError` on the first problem."""
        for op in self.ops.values():
            if not isinstance(op.role, Role):
                raise GraphError(f"op {op.name!r}: role {op.role!r} is not a Role")
            for t in op.inputs:
                if t not in self.tensors:
                    raise GraphError(f"op {op.name!r} reads unknown tensor {t!r}")
            for c in op.control_inputs:
                if c not in self.ops:
                    raise GraphError(f"op {op.name!r} has unknown control input {c!r}")
            for t in op.outputs:
                if t not in self.tensors:
                    raise GraphError(f"op {op.name!r} outputs unknown tensor {t!r}")
                if t.rsplit(":", 1)[0] != op.name:
                    raise GraphError(f"op {op.name!r} outputs {t!r}, which names another producer")
            if op.grad_of is not None and op.grad_of not in self.ops:
                raise GraphError(f"op {op.name!r}: grad_of names unknown op {op.grad_of!r}")
        for t in self.tensors.values():
            if t.op not in self.ops:
                raise GraphError(f"tensor {t.name!r} has no producer op")
            if t.name not in self.ops[t.op].outputs:
                raise GraphError(f"tensor {t.name!r} is not listed in its producer's outputs")
            if t.fixed_bytes < 0 or t.per_sample_bytes < 0:
                raise GraphError(f"tensor {t.name!r} has a negative size")
        self.topological_order  # raises on a cycle

    # ---- (de)serialisation ---------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "batch_size": self.batch_size,
            "ops": [
                {"name": o.name, "type": o.type, "role": o.role.value, "inputs": list(o.inputs),
                 "control_inputs": list(o.control_inputs), "outputs": list(o.outputs),
                 "grad_of": o.grad_of, "device": o.device, **({} if o.live else {"live": False})}
                for o in self.ops.values()
            ],
            "tensors": [
                {"name": t.name, "dtype": t.dtype,
                 "shape": None if t.shape is None else list(t.shape),
                 "fixed_bytes": t.fixed_bytes, "per_sample_bytes": t.per_sample_bytes}
                for t in self.tensors.values()
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> "Graph":
        ops = [
            Op(name=o["name"], type=o["type"], role=Role(o["role"]), inputs=tuple(o["inputs"]),
               control_inputs=tuple(o["control_inputs"]), outputs=tuple(o["outputs"]),
               grad_of=o.get("grad_of"), device=o.get("device", ""), live=o.get("live", True))
            for o in data["ops"]
        ]
        tensors = [
            Tensor(name=t["name"], dtype=t["dtype"],
                   shape=None if t["shape"] is None else tuple(t["shape"]),
                   fixed_bytes=t["fixed_bytes"], per_sample_bytes=t["per_sample_bytes"])
            for t in data["tensors"]
        ]
        return cls(ops, tensors, batch_size=data["batch_size"], name=data.get("name", ""))


@dataclass
class GraphBuilder:
    """Small helper to build synthetic graphs in tests and examples.

    >>> b = GraphBuilder(batch_size=4)
    >>> x = b.op("x", "Placeholder", per_sample_bytes=16)
    >>> y = b.op("y", "Relu", x, per_sample_bytes=16)
    >>> g = b.build()
    """

    batch_size: int = 1
    name: str = ""
    _ops: list[Op] = field(default_factory=list)
    _tensors: list[Tensor] = field(default_factory=list)

    def op(self, name: str, type: str, *inputs: str, role: Role = Role.FORWARD,
           control_inputs: Iterable[str] = (), grad_of: str | None = None,
           fixed_bytes: int = 0, per_sample_bytes: int = 0, n_outputs: int = 1,
           shape: tuple[int | None, ...] | None = (None, 4), dtype: str = "float32", live: bool = True) -> str:
        """Add an op with `n_outputs` equal-sized outputs; return its first output's name."""
        outputs = tuple(f"{name}:{i}" for i in range(n_outputs))
        self._ops.append(Op(name=name, type=type, role=role, inputs=tuple(inputs),
                            control_inputs=tuple(control_inputs), outputs=outputs, grad_of=grad_of, live=live))
        for t in outputs:
            self._tensors.append(Tensor(t, dtype=dtype, shape=shape, fixed_bytes=fixed_bytes,
                                        per_sample_bytes=per_sample_bytes))
        return outputs[0] if outputs else f"{name}:0"

    def build(self) -> Graph:
        g = Graph(self._ops, self._tensors, batch_size=self.batch_size, name=self.name)
        g.lint()
        return g
