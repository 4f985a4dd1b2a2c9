"""The layout transposes beside each swap on a GPU (`lms.sim.layout`): when TF adds them, and what the simulator counts.

Grappler converts a GPU step's NHWC convolutions to NCHW unless most of them
run in fp16/bf16; every swap op is then a layout boundary (checked against
Grappler itself in ``tests/tf/test_layout.py``). Here: the rule, and that the
simulator charges exactly one transposed copy (temporary and compute-stream
pass) per swap-out and per swap-in of a converted tensor, and nothing else.
"""

from __future__ import annotations

import numpy as np
import pytest

from lms import LMSConfig
from lms.machine.devices import get_device
from lms.graph import GraphBuilder, Role
from lms.sim import simulate
from lms.sim.compiled import compile_graph
from lms.pipeline import resolve_plan
from lms.sim.interpreter import default_temporaries, layout_transposes_on, run
from lms.sim.layout import converts_layout, is_transposed, transposed_rank
from lms.plan import SWAP_IN_TYPE, SWAP_OUT_TYPE

MiB = 1 << 20
GPU = get_device("V100-16GB")


def conv_net(*, dtype: str = "float32", backward_dtype: str | None = None, rank: int = 4,
             conv: str = "Conv2D") -> "object":
    """x -> conv -> relu -> conv -> relu -> loss, with the gradients autodiff would build (rank-`rank` activations)."""
    shape = (None, 8, 8, 16) if rank == 4 else (None, 4, 8, 8, 16) if rank == 5 else (None, 1024)
    b = GraphBuilder(batch_size=4, name=f"conv-{dtype}-{rank}")
    act = dict(per_sample_bytes=MiB, shape=shape, dtype=dtype)
    kernel = dict(fixed_bytes=4096, shape=(3, 3, 16, 16), dtype=dtype)
    grad_conv_filter = "Conv3DBackpropFilterV2" if conv == "Conv3D" else "Conv2DBackpropFilter"
    grad_conv_input = "Conv3DBackpropInputV2" if conv == "Conv3D" else "Conv2DBackpropInput"
    x = b.op("x", "Placeholder", **act)
    w1 = b.op("w1", "ReadVariableOp", **kernel)
    w2 = b.op("w2", "ReadVariableOp", **kernel)
    c1 = b.op("c1", conv, x, w1, **act)
    r1 = b.op("r1", "Relu", c1, **act)
    c2 = b.op("c2", conv, r1, w2, **act)
    r2 = b.op("r2", "Relu", c2, **act)
    loss = b.op("loss", "Sum", r2, shape=(), fixed_bytes=4)
    bwd = dict(role=Role.BACKWARD, **act)
    g = b.op("gradient_tape/loss/Fill", "Fill", loss, role=Role.BACKWARD, grad_of="loss", **act)
    g = b.op("gradient_tape/r2/ReluGrad", "ReluGrad", g, r2, grad_of="r2", **bwd)
    bk = dict(bwd, dtype=backward_dtype or dtype)
    b.op("gradient_tape/c2/Filter", grad_conv_filter, r1, g, grad_of="c2", **bk)
    g = b.op("gradient_tape/c2/Input", grad_conv_input, g, w2, grad_of="c2", **bk)
    g = b.op("gradient_tape/r1/ReluGrad", "ReluGrad", g, r1, grad_of="r1", **bwd)
    b.op("gradient_tape/c1/Filter", grad_conv_filter, x, g, grad_of="c1", **bk)
    return b.build()


def test_fp32_training_is_converted_on_a_gpu():
    assert converts_layout(conv_net())
    assert converts_layout(conv_net(conv="Conv3D", rank=5))


def test_half_precision_forward_convolutions_keep_nhwc():
    assert not converts_layout(conv_net(dtype="float16"))
    assert not converts_layout(conv_net(dtype="bfloat16"))
    # TF's rule counts the forward convolutions only: fp32 backward ones do not convert an fp16 step
    assert not converts_layout(conv_net(dtype="float16", backward_dtype="float32"))
    assert converts_layout(conv_net(dtype="float32", backward_dtype="float16"))


def test_a_graph_without_convolutions_is_not_converted():
    b = GraphBuilder(batch_size=2)
    x = b.op("x", "Placeholder", per_sample_bytes=64, shape=(None, 4, 4, 4))
    b.op("y", "Relu", x, per_sample_bytes=64, shape=(None, 4, 4, 4))
    assert not converts_layout(b.build())


def test_only_float_tensors_of_the_converted_rank_are_transposed():
    g = conv_net()
    assert transposed_rank(g) == frozenset({4})
    assert is_transposed(g, "r1:0", frozenset({4}))
    assert not is_transposed(g, "r1:0", frozenset({5}))
    assert not is_transposed(g, "loss:0", frozenset({4}))
    assert transposed_rank(conv_net(conv="Conv3D", rank=5)) == frozenset({5})


def test_transposes_are_modelled_on_gpu_profiles_of_converted_graphs_only():
    assert layout_transposes_on(conv_net(), GPU)
    assert not layout_transposes_on(conv_net(), get_device("cpu"))  # the emulated device: no layout optimizer
    assert not layout_transposes_on(conv_net(dtype="float16"), GPU)
    assert not layout_transposes_on(conv_net(), None)


@pytest.mark.parametrize("batch", [1, 8])
def test_each_swap_op_of_a_converted_tensor_adds_one_transposed_copy_and_one_pass(batch):
    g = conv_net()
    plan = resolve_plan(g, LMSConfig(n_tensors=-1, lb=1))
    assert plan.n_swapped >= 2
    temps = default_temporaries(GPU)
    plain = compile_graph(g, plan, temporaries=temps, layout_transposes=False)
    converted = compile_graph(g, plan, temporaries=temps, layout_transposes=True)
    swap_pos = [i for i, t in enumerate(converted.op_types) if t in (SWAP_OUT_TYPE, SWAP_IN_TYPE)]
    n_swap_ops = sum(1 + len(s.swap_ins) for s in plan.swaps)
    assert len(swap_pos) == n_swap_ops
    tensor_bytes = {s.tensor: g.tensors[s.tensor].nbytes(batch) for s in plan.swaps}
    assert len(set(tensor_bytes.values())) == 1  # every activation is 1 MiB per sample
    size = next(iter(tensor_bytes.values()))
    extra_temp = (converted.temp_fixed + batch * converted.temp_ps) - (plain.temp_fixed + batch * plain.temp_ps)
    np.testing.assert_array_equal(np.flatnonzero(extra_temp), swap_pos)
    assert set(extra_temp[swap_pos]) == {size}
    a, b = run(plain, batch, device=GPU), run(converted, batch, device=GPU)
    one_pass = 2 * size / (GPU.mem_bandwidth * GPU.memory_efficiency) + GPU.op_overhead_s
    assert b.compute_time_s - a.compute_time_s == pytest.approx(n_swap_ops * one_pass, rel=1e-9)
    assert b.peak_device_bytes >= a.peak_device_bytes


def test_rank_two_swaps_get_no_transpose_in_a_converted_graph():
    g = conv_net(rank=2)  # a conv net's swapped tensors that are not 4-D (e.g. after a Flatten)
    plan = resolve_plan(g, LMSConfig(n_tensors=-1, lb=1))
    temps = default_temporaries(GPU)
    a = run(compile_graph(g, plan, temporaries=temps, layout_transposes=False), 4, device=GPU)
    b = run(compile_graph(g, plan, temporaries=temps, layout_transposes=True), 4, device=GPU)
    assert (a.peak_device_bytes, a.compute_time_s) == (b.peak_device_bytes, b.compute_time_s)


def test_simulate_on_a_gpu_charges_the_transposes_and_the_cpu_does_not():
    g, g16 = conv_net(), conv_net(dtype="float16")
    plan = LMSConfig(n_tensors=-1, lb=1)
    on_gpu = simulate(g, plan, batch=8, device=GPU)
    temps = default_temporaries(GPU)
    without = run(compile_graph(g, resolve_plan(g, plan), temporaries=temps, order=GPU.order,
                                expensive_op_bytes=GPU.expensive_op_bytes), 8, device=GPU)
    assert on_gpu.compute_time_s > without.compute_time_s
    r16 = simulate(g16, plan, batch=8, device=GPU)
    r16_plain = run(compile_graph(g16, resolve_plan(g16, plan), temporaries=temps, order=GPU.order,
                                  expensive_op_bytes=GPU.expensive_op_bytes), 8, device=GPU)
    assert r16.compute_time_s == r16_plain.compute_time_s


def test_the_compute_capability_decides_which_half_precision_keeps_nhwc():
    """fp16 keeps NHWC from Volta (7.0), bf16 from Ampere (8.0); Pascal converts both (Grappler on virtual GPUs,
    tests/tf/test_inspect.py)."""
    fp16, bf16 = conv_net(dtype="float16"), conv_net(dtype="bfloat16")
    assert converts_layout(fp16, "6.0") and converts_layout(bf16, "6.0")
    assert not converts_layout(fp16, "7.0") and converts_layout(bf16, "7.5")
    assert not converts_layout(fp16, "8.0") and not converts_layout(bf16, "8.0")
    assert converts_layout(conv_net(), "9.0")
