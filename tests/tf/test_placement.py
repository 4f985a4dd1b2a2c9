"""A swap-in's copy back to the device waits for its trigger: checked on the partition graphs TF ran.

`tests/tf/two_devices.py` runs LMS steps with real swap ops on two logical CPU
devices (a host and a "device", partitioned like a GPU step) in a fresh
process; here its findings are asserted. The synthetic cases check
`lms.tf.placement.swap_transfers` itself on hand-built partition graphs: the
placement of main before the fix (a device-side swap-in, its ``_Recv`` fed by
an ungated host swap-out) and the fixed one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests import forked_cli

tf = pytest.importorskip("tensorflow")

from lms import LMSConfig  # noqa: E402
from lms.plan import Swap, SwapIn, SwapPlan  # noqa: E402
from lms.tf.placement import SwapTransfer, swap_transfers, transfers_started_early  # noqa: E402

pytestmark = pytest.mark.tf

ROOT = Path(__file__).resolve().parents[2]
HOST, DEV = "/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/replica:0/task:0/device:GPU:0"


# ---- synthetic partition graphs --------------------------------------------------------

def _node(gd, name, op, inputs=(), device=DEV, **attrs):  # noqa: ANN001
    n = gd.node.add(name=name, op=op, device=device)
    n.input.extend(inputs)
    for k, v in attrs.items():
        n.attr[k].s = v.encode()
    return n


def _edge(src_gd, dst_gd, name, src, src_dev, dst_dev, *, control=False):  # noqa: ANN001
    """A ``_Send``/``_Recv`` pair carrying `src` from `src_dev` to `dst_dev`; returns the recv's name."""
    tensor = f"edge_{name}"
    _node(src_gd, f"{name}/send", "_Send", [("^" if control else "") + src], src_dev, tensor_name=tensor,
          send_device=src_dev, recv_device=dst_dev)
    _node(dst_gd, f"{name}/recv", "_Recv", [], dst_dev, tensor_name=tensor, send_device=src_dev,
          recv_device=dst_dev)
    return f"{name}/recv"


PLAN = SwapPlan(config=LMSConfig(), swaps=(
    Swap(tensor="relu:0", swap_out="lms/swap_out/relu_0", nbytes=1024,
         swap_ins=(SwapIn(name="relu-lms_swap_in_0_0", consumers=("relu_grad",), trigger="trigger"),)),))


def _partitions(*, gated_on_host: bool):
    """``relu`` (device) swapped out to the host and back for ``relu_grad``, triggered by ``trigger``."""
    host, dev = tf.compat.v1.GraphDef(), tf.compat.v1.GraphDef()
    _node(dev, "relu", "Relu", ["x"])
    _node(dev, "trigger", "Mul", ["a", "b"])
    out_recv = _edge(dev, host, "relu_out", "relu", DEV, HOST)
    _node(host, "lms/swap_out/relu_0", "Identity", [out_recv], HOST)
    if gated_on_host:
        ctl = _edge(dev, host, "trigger_ctl", "trigger", DEV, HOST, control=True)
        _node(host, "relu-lms_swap_in_0_0", "Identity", ["lms/swap_out/relu_0", "^" + ctl], HOST)
        back = _edge(host, dev, "relu_back", "relu-lms_swap_in_0_0", HOST, DEV)
        _node(dev, "relu_grad", "ReluGrad", ["g", back])
    else:  # main before the fix: the gate after the copy
        back = _edge(host, dev, "relu_back", "lms/swap_out/relu_0", HOST, DEV)
        _node(dev, "relu-lms_swap_in_0_0", "Identity", [back, "^trigger"])
        _node(dev, "relu_grad", "ReluGrad", ["g", "relu-lms_swap_in_0_0"])
    return [host, dev]


def test_a_swap_in_gated_on_the_host_sends_its_copy_after_the_trigger():
    (t,) = swap_transfers(_partitions(gated_on_host=True), PLAN)
    assert t == SwapTransfer(tensor="relu:0", swap_ins=("relu-lms_swap_in_0_0",), triggers=("trigger",),
                             send="relu_back/send", recv="relu_back/recv", src_device=HOST, dst_device=DEV,
                             after_trigger=True)


def test_a_swap_in_gated_on_the_device_receives_its_copy_before_the_trigger():
    (t,) = swap_transfers(_partitions(gated_on_host=False), PLAN)
    assert (t.swap_ins, t.send, t.after_trigger) == (("relu-lms_swap_in_0_0",), "relu_back/send", False)


def test_a_pinned_edge_counts_as_what_a_swap_in_waits_for():
    parts = _partitions(gated_on_host=True)
    (t,) = swap_transfers(parts, PLAN, edges=[("relu", "relu-lms_swap_in_0_0")])
    assert t.triggers == ("trigger", "relu") and t.after_trigger is True  # relu precedes the swap-out
    (t,) = swap_transfers(parts, PLAN, edges=[("relu_grad", "relu-lms_swap_in_0_0")])
    assert t.after_trigger is False  # not pinned in the executed graph


def test_a_trigger_missing_from_the_executed_graph_is_unknown_not_passed():
    plan = SwapPlan(config=LMSConfig(), swaps=(Swap(
        tensor="relu:0", swap_out="lms/swap_out/relu_0", nbytes=1024,
        swap_ins=(SwapIn(name="relu-lms_swap_in_0_0", consumers=("relu_grad",), trigger="folded_away"),)),))
    (t,) = swap_transfers(_partitions(gated_on_host=True), plan)
    assert t.after_trigger is None


def test_transfers_started_early_compares_the_send_with_the_trigger_end():
    (t,) = swap_transfers(_partitions(gated_on_host=True), PLAN)
    early, timed = transfers_started_early([t], {"trigger": (100, 200), "relu_back/send": (150, 160)})
    assert (early, timed) == ([t], 1)
    early, timed = transfers_started_early([t], {"trigger": (100, 200), "relu_back/send": (200, 210)})
    assert (early, timed) == ([], 1)
    assert transfers_started_early([t], {"relu_back/send": (150, 160)}) == ([], 0)  # the trigger was not timed


# ---- a real step on two logical devices ------------------------------------------------

@pytest.fixture(scope="module")
def two_devices() -> dict[str, dict]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = forked_cli.run_python(["-m", "tests.tf.two_devices"], cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["config"]: r for r in json.loads(proc.stdout.strip().splitlines()[-1])}


CONFIGS = ("all-lb1", "lb3-fused", "direct-branches", "memory-headroom", "recompute-fused")


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS)
def test_every_swap_in_copies_back_after_its_trigger_on_two_devices(two_devices, config):
    r = two_devices[config]
    assert r["n_swaps"] >= 5
    assert r["swap_in_devices"] == ["/job:localhost/replica:0/task:0/device:CPU:0"]  # gated on the host
    # each swap-in is its own transfer to the device, and none leaves before what it waits for
    assert len(r["to_device"]) == r["n_swap_ins"] and all(len(s) == 1 for s in r["to_device"])
    assert r["ungated"] == []
    assert r["early"] == [] and r["timed"] >= r["n_swap_ins"] // 2, r
    assert r["bitwise"] is True


@pytest.mark.slow
def test_only_swap_ins_whose_trigger_grappler_removed_or_that_wait_for_nothing_are_unchecked(two_devices):
    for config in ("all-lb1", "lb3-fused", "recompute-fused"):
        assert two_devices[config]["unknown"] == [] and two_devices[config]["timed"] == two_devices[config]["n_swap_ins"]
    # a branch swap-in triggered by a forward StopGradient, which Grappler removes (its edge moves to the input)
    assert len(two_devices["direct-branches"]["unknown"]) <= 2
    # headroom: the last forward tensor's swap-in may come back at once (nothing pinned before it)
    assert len(two_devices["memory-headroom"]["unknown"]) <= 1


@pytest.mark.slow
def test_recompute_clones_and_gates_stay_on_the_device(two_devices):
    r = two_devices["recompute-fused"]
    assert r["n_recomputed"] >= 1
    assert r["clone_devices"] == ["/job:localhost/replica:0/task:0/device:CPU:1"]
