"""Where the swap copies ran: check, on the graphs TensorFlow really ran, that each swap-in waits for its trigger.

TensorFlow splits a step into one partition graph per device and replaces each
edge between devices by a ``_Send`` (source device) and a ``_Recv`` (destination
device) that meet by the edge's ``tensor_name``. A ``_Recv`` has no inputs: it
takes the tensor as soon as the ``_Send`` ran, whatever control inputs its
readers carry. So a swap-in's copy back to the device waits for its trigger only
if the *host-side* op that feeds the ``_Send`` depends on the trigger
(`lms.tf.apply` gates it so)::

    host:   [swap_out] -> [swap_in] -> (_Send) - - - - - - - - - - - - +
                              ^                                        |
                          (_Recv) <- - - - (_Send) <- (trigger)        |  device
    device:                                                            +-> (_Recv) -> (bwd_op)

`swap_transfers` finds, for every swap of a plan, each transfer that carries
its bytes to another device and says whether the transfer's ``_Send`` depends on
the swap-in's trigger in the partition graphs (following every ``_Recv`` to its
``_Send``). `transfers_started_early` compares the same transfers with the times
TF's profiler recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

__all__ = ["SwapTransfer", "executed_partition_graphs", "swap_transfers", "op_intervals",
           "transfers_started_early", "SEND_TYPES", "RECV_TYPES"]

SEND_TYPES = frozenset({"_Send", "_HostSend"})
RECV_TYPES = frozenset({"_Recv", "_HostRecv"})


@dataclass(frozen=True)
class SwapTransfer:
    """One copy of a swapped tensor's bytes between devices, as TF ran it.

    Attributes:
        tensor: the swapped tensor (the plan's name).
        swap_ins: the plan's swap-ins this transfer serves (empty: it serves none,
            e.g. the copy out to the host).
        triggers: the ops they wait for: their triggers and the ops pinned before
            them (op names as the plan and the schedule give them).
        send: the ``_Send`` node that starts the copy.
        recv: the matching ``_Recv`` node.
        src_device: the ``_Send``'s device.
        dst_device: the ``_Recv``'s device.
        after_trigger: ``True`` when the ``_Send`` depends on every trigger of
            `swap_ins` (and every op pinned before them) in the executed graphs,
            ``False`` when it does not depend on one of them, ``None`` when one is
            not in the executed graphs (Grappler removed or fused it), or the
            transfer serves no swap-in or waits for nothing.
    """

    tensor: str
    swap_ins: tuple[str, ...]
    triggers: tuple[str | None, ...]
    send: str
    recv: str
    src_device: str
    dst_device: str
    after_trigger: bool | None


def executed_partition_graphs(fn: Callable, *args: Any, **kwargs: Any) -> list[Any]:
    """Call ``fn(*args, **kwargs)`` once and return the per-device partition graphs TF ran.

    The first call only (`lms.tf.graphdefs.instantiated_function_graphs`); the step runs.
    """
    from .graphdefs import instantiated_function_graphs

    return [pg for fg in instantiated_function_graphs(fn, *args, **kwargs) for pg in fg.partition_graphs]


def _input_op(name: str) -> str:
    return name.lstrip("^").split(":")[0]


class _Executed:
    """The partition graphs as one graph: every node's inputs, with each ``_Recv`` reading its ``_Send``."""

    def __init__(self, partition_graphs: Iterable[Any]) -> None:
        self.nodes: dict[str, Any] = {}
        for gd in partition_graphs:
            for node in gd.node:
                self.nodes[node.name] = node
        sends = {self._key(n): n.name for n in self.nodes.values() if n.op in SEND_TYPES}
        self.inputs: dict[str, tuple[str, ...]] = {}
        self.data_inputs: dict[str, tuple[str, ...]] = {}
        self.recv_of: dict[str, str] = {}
        for n in self.nodes.values():
            data = tuple(_input_op(i) for i in n.input if not i.startswith("^"))
            control = tuple(_input_op(i) for i in n.input if i.startswith("^"))
            if n.op in RECV_TYPES and self._key(n) in sends:
                send = sends[self._key(n)]
                self.recv_of[send] = n.name
                data = (*data, send)
            self.data_inputs[n.name] = data
            self.inputs[n.name] = data + control
        self.readers: dict[str, list[str]] = {}
        for name, data in self.data_inputs.items():
            for i in data:
                self.readers.setdefault(i, []).append(name)

    @staticmethod
    def _key(node: Any) -> tuple[str, str, str]:
        attr = node.attr
        return (attr["tensor_name"].s.decode(), attr["send_device"].s.decode(), attr["recv_device"].s.decode())

    def ancestors(self, name: str) -> set[str]:
        seen: set[str] = set()
        stack = [name]
        while stack:
            for p in self.inputs.get(stack.pop(), ()):
                if p not in seen:
                    seen.add(p)
                    stack.append(p)
        return seen

    def local_data_ancestors(self, name: str) -> set[str]:
        """Data inputs of `name`, transitively, on its own device (not across a ``_Recv``)."""
        seen: set[str] = set()
        stack = [name]
        while stack:
            x = stack.pop()
            if x != name and self.nodes[x].op in RECV_TYPES:
                continue
            for p in self.data_inputs.get(x, ()):
                if p not in seen and p in self.nodes and self.nodes[p].op not in SEND_TYPES:
                    seen.add(p)
                    stack.append(p)
        return seen

    def local_data_descendants(self, name: str) -> set[str]:
        """Readers of `name`, transitively, on its own device (up to and including each ``_Send``)."""
        seen: set[str] = set()
        stack = [name]
        while stack:
            x = stack.pop()
            if self.nodes[x].op in SEND_TYPES:
                continue
            for r in self.readers.get(x, ()):
                if r not in seen and self.nodes[r].op not in RECV_TYPES:
                    seen.add(r)
                    stack.append(r)
        return seen


def swap_transfers(partition_graphs: Iterable[Any], plan: Any, *,
                   edges: Iterable[tuple[str, str]] = ()) -> list[SwapTransfer]:
    """Every transfer between devices of a swapped tensor of `plan`, and whether it waits for its triggers.

    A transfer belongs to a swap when its ``_Send`` reads the swap's swap-out
    (through any host-side ops). It serves the swap-ins on its path: those the
    ``_Send`` reads (the swap-in gated on the host) or, if none, those that read
    its ``_Recv`` on the other side (a swap-in gated after the copy: the copy
    does not wait).

    Args:
        partition_graphs: `executed_partition_graphs` of the step.
        plan: the `lms.plan.SwapPlan` applied to the step.
        edges: the ordering edges ``(before, after)`` pinned on the step
            (`lms.schedule.Schedule.edges`): a swap-in waits for its trigger and
            for every op pinned before it (``prefetch="headroom"`` places swap-ins
            by such edges alone).
    """
    g = _Executed(partition_graphs)
    swap_in_trigger: dict[str, tuple[str, ...]] = {si.name: (si.trigger,) if si.trigger else ()
                                                   for s in plan.swaps for si in s.swap_ins}
    for before, after in edges:
        if after in swap_in_trigger and before not in swap_in_trigger[after]:
            swap_in_trigger[after] += (before,)
    out: list[SwapTransfer] = []
    for s in plan.swaps:
        if s.swap_out not in g.nodes:
            continue
        for send in sorted(n for n in g.local_data_descendants(s.swap_out) if g.nodes[n].op in SEND_TYPES):
            recv = g.recv_of.get(send)
            if recv is None:
                continue
            served = sorted(n for n in g.local_data_ancestors(send) if n in swap_in_trigger)
            if not served:
                served = sorted(n for n in g.local_data_descendants(recv) if n in swap_in_trigger)
            triggers = tuple(dict.fromkeys(t for n in served for t in swap_in_trigger[n]))
            after: bool | None
            if not served or not triggers or any(t not in g.nodes for t in triggers):
                after = None
            else:
                before_send = g.ancestors(send)
                after = all(t in before_send for t in triggers)
            node, rnode = g.nodes[send], g.nodes[recv]
            out.append(SwapTransfer(tensor=s.tensor, swap_ins=tuple(served), triggers=triggers, send=send,
                                    recv=recv, src_device=node.device, dst_device=rnode.device,
                                    after_trigger=after))
    return out


def op_intervals(logdir: str) -> dict[str, tuple[int, int]]:
    """``{op name: (first start, last end)}`` in picoseconds, from the op events TF's profiler wrote under `logdir`.

    Op events are named ``name:Type`` (`lms.tf.profile.op_seconds_from_xspace`);
    times are absolute (each line's start plus the event's offset).
    """
    from .profile import xplane_events

    spans: dict[str, tuple[int, int]] = {}
    for _plane, line, ev, name in xplane_events(logdir):
        op, sep, kind = name.rpartition(":")
        if not sep or not op or not kind or " " in name or "::" in name:
            continue
        start = line.timestamp_ns * 1000 + ev.offset_ps
        end = start + ev.duration_ps
        lo, hi = spans.get(op, (start, end))
        spans[op] = (min(lo, start), max(hi, end))
    return spans


def transfers_started_early(transfers: Iterable[SwapTransfer],
                            intervals: Mapping[str, tuple[int, int]]) -> tuple[list[SwapTransfer], int]:
    """The transfers whose ``_Send`` started before one of their triggers ended, and how many could be timed.

    A transfer can be timed when the profile holds its ``_Send`` and all its
    triggers (cheap ops may run without a profiler event).
    """
    early: list[SwapTransfer] = []
    timed = 0
    for t in transfers:
        if not t.swap_ins or not t.triggers or t.send not in intervals or any(
                tr not in intervals for tr in t.triggers):
            continue
        timed += 1
        send_start = intervals[t.send][0]
        if any(send_start < intervals[tr][1] for tr in t.triggers):
            early.append(t)
    return early, timed
