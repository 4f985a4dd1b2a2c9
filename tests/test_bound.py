"""`lms.sim.bound`: the floor under every plan's simulated peak, exact bytes on hand-built graphs (no TensorFlow).

Sizes are multiples of the allocator's 256 bytes unless a test is about rounding.
"""

from __future__ import annotations

import pytest

from lms import LMSConfig, plan_swaps
from lms.graph import GraphBuilder, Role
from lms.sim.bound import max_batch_bound, peak_floor
from lms.simulator import ALL_SWAPPED, CPU_TEMPORARIES, NO_TEMPORARIES, max_batch, simulate
from tests.synthetic import MiB, chain, residual


def small_graph():
    """x (input) -> a = MatMul(x, w) -> v = Reshape(a); m = Mul(a, a); c = BatchMatMulV2(a, v) -> r = Relu(c) -> s = Sum(r)."""
    b = GraphBuilder(batch_size=2)
    x = b.op("x", "Placeholder", per_sample_bytes=1024)
    h = b.op("h", "VarHandleOp", dtype="resource", shape=())
    w = b.op("w", "ReadVariableOp", h, fixed_bytes=4096)
    a = b.op("a", "MatMul", x, w, per_sample_bytes=2048)
    v = b.op("v", "Reshape", a, per_sample_bytes=2048)
    b.op("shape", "Shape", a, fixed_bytes=8)
    b.op("m", "Mul", a, a, per_sample_bytes=2048)
    c = b.op("c", "BatchMatMulV2", a, v, per_sample_bytes=4096)
    r = b.op("r", "Relu", c, per_sample_bytes=4096)
    b.op("s", "Sum", r, per_sample_bytes=64)
    return b.build()


def test_op_floor_counts_each_buffer_once():
    f = peak_floor(small_graph(), 2, temporaries=NO_TEMPORARIES)
    # c reads a and a view of a: one 4 KiB buffer, plus its 8 KiB output
    assert (f.op.op, f.op.inputs, f.op.outputs) == ("c", (("a:0", 4096),), (("c:0", 8192),))
    assert f.op.total_bytes == 12288 and f.op.temporary_bytes == 0 and f.op.forwarded is None
    assert f.resident_bytes == 4096  # w, rounded; the handle is empty
    assert f.step_input_bytes == 2048  # x, held all step, not counted per op
    assert f.bytes == 4096 + 2048 + 12288
    assert f.bytes <= simulate(small_graph(), None, batch=2, temporaries=NO_TEMPORARIES).peak_device_bytes


def test_read_twice_forwarding_and_temporaries():
    g = small_graph()
    f = peak_floor(g, 1, temporaries=NO_TEMPORARIES)
    assert f.op.op == "c"
    from lms.sim.bound import _Floors

    floors = _Floors(g, CPU_TEMPORARIES, None, True)
    per_op, _ = floors.totals(2)
    by = dict(zip(floors.names, per_op.tolist()))
    assert by["m"] == 4096 + 4096  # a read twice: once; its output is not forwarded (TF needs a single read)
    assert floors.forwarded[floors.names.index("m")] is None
    assert by["r"] == 8192 and floors.forwarded[floors.names.index("r")] == "r:0"  # Relu writes into c
    assert by["s"] == 8192 + 256 + 256  # r, its 128-byte output and the CPU reduction's output-sized scratch
    assert by["shape"] == 256  # a shape-only read holds no data
    assert by["v"] == 4096 and by["w"] == 0 and by["a"] == 4096  # a view is its source; x and w are not per-op


def test_temporary_rule_attains_the_floor():
    b = GraphBuilder(batch_size=1)
    x = b.op("x", "Placeholder", per_sample_bytes=256)
    y = b.op("y", "MaxPool", x, per_sample_bytes=512)
    b.op("g", "MaxPoolGrad", x, y, y, role=Role.BACKWARD, per_sample_bytes=256)
    g = b.build()
    f = peak_floor(g, 4, temporaries=CPU_TEMPORARIES)
    # y read twice (once), x held all step; scratch 3 x input1 = 3 x 2048
    assert (f.op.op, f.op.input_bytes, f.op.output_bytes, f.op.temporary_bytes) == ("g", 2048, 1024, 6144)
    assert f.bytes == 1024 + 2048 + 1024 + 6144
    plain = peak_floor(g, 4, temporaries=NO_TEMPORARIES).op
    assert (plain.op, plain.total_bytes, plain.temporary_bytes) == ("g", 3072, 0)


def test_kept_backward_buffer_spans_ops_between_its_producer_and_reader():
    b = GraphBuilder(batch_size=1)
    x = b.op("x", "Placeholder", per_sample_bytes=256)
    f = b.op("f", "Relu", x, per_sample_bytes=768)
    g1 = b.op("g1", "G1", f, role=Role.BACKWARD, per_sample_bytes=2048)
    g2 = b.op("g2", "G2", g1, role=Role.BACKWARD, per_sample_bytes=2048)
    g3 = b.op("g3", "G3", g2, role=Role.BACKWARD, per_sample_bytes=256)
    b.op("g4", "G4", g3, g1, f, role=Role.BACKWARD, per_sample_bytes=256)
    g = b.build()
    top = peak_floor(g, 1, temporaries=NO_TEMPORARIES)
    # at g3, g1 (backward: never swapped) is live in every order; f (forward) could be swapped out
    assert top.op.op == "g3" and top.op.kept == (("g1:0", 2048),)
    assert top.op.total_bytes == 2048 + 256 + 2048 and top.op.kept_bytes == 2048
    plain = peak_floor(g, 1, temporaries=NO_TEMPORARIES, spanning=False)
    assert plain.op.op == "g2" and plain.op.kept == () and plain.op.total_bytes == 2048 + 2048


def test_max_batch_bound_is_the_last_batch_that_fits():
    g = small_graph()
    # floor(b) = 4096 + 1024 b + 6144 b
    bound = max_batch_bound(g, 4096 + 7168 * 10 + 100, temporaries=NO_TEMPORARIES)
    assert bound.batch == 10 and bound.at_batch.bytes == 4096 + 7168 * 10
    assert bound.next_floor is not None and bound.next_floor.bytes == 4096 + 7168 * 11
    assert max_batch_bound(g, 4096, temporaries=NO_TEMPORARIES).batch == 0
    capped = max_batch_bound(g, 1 << 40, temporaries=NO_TEMPORARIES, limit=50)
    assert capped.batch == 50 and capped.capped


@pytest.mark.parametrize("graph", [chain(6), residual(2)], ids=["chain", "residual"])
def test_no_plan_beats_the_bound(graph):
    budget = 64 * MiB
    bound = max_batch_bound(graph, budget, temporaries=CPU_TEMPORARIES).batch
    for config in (None, ALL_SWAPPED, LMSConfig(n_tensors=-1, lb=1, schedule="memory"),
                   LMSConfig(n_tensors=-1, lb=1, recompute="cheap")):
        plan = plan_swaps(graph, config) if config is not None else None
        assert max_batch(graph, plan, budget, temporaries=CPU_TEMPORARIES).batch <= bound
