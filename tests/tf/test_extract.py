"""`lms.tf.extract`: roles, gradient links and sizes of real traced training steps."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from lms import LMSConfig, Role, find_candidates  # noqa: E402
from lms.tf.extract import extract_graph, trace_train_step  # noqa: E402
from lms.tf.train import make_train_step, record_gradients  # noqa: E402

pytestmark = pytest.mark.tf


def _mlp(batch_in: int = 12) -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((batch_in,)), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(4)], name="mlp")


@pytest.fixture(scope="module")
def mlp_traced():
    """MLP step traced with an unknown batch dim (the simulator's view)."""
    model = _mlp()
    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    return trace_train_step(model, keras.losses.MeanSquaredError(), opt,
                            tf.TensorSpec([None, 12]), tf.TensorSpec([None, 4]), batch_size=8)


@pytest.fixture(scope="module")
def cnn_traced(cases):
    case = cases["cnn_bn"]
    return trace_train_step(case.model, case.loss_fn, case.optimizer,
                            tf.TensorSpec([None, 12, 12, 3]), tf.TensorSpec([None], tf.int32), batch_size=4)


def test_trace_returns_graph_and_function(mlp_traced):
    graph, concrete = mlp_traced
    assert graph.batch_size == 8
    assert len(graph.ops) == len(concrete.graph.get_operations())
    assert graph.name == "mlp"
    graph.lint()


def test_roles(mlp_traced):
    graph, _ = mlp_traced
    by_type = {}
    for op in graph:
        by_type.setdefault((op.type, op.role), []).append(op.name)
    forward_matmuls = by_type.get(("MatMul", Role.FORWARD), [])
    assert len(forward_matmuls) == 2
    assert all(not n.startswith("gradient_tape/") for n in forward_matmuls)
    for op in graph:
        if op.name.startswith("gradient_tape/"):
            assert op.role is Role.BACKWARD, op.name
    # The gradient seed is made by tape.gradient but not named gradient_tape/...: recorded.
    assert graph.ops["ones"].role is Role.BACKWARD and graph.ops["ones"].type == "Const"
    # The gradient chain depends on the forward activations it differentiates.
    relu_grad = next(op for op in graph if op.type == "ReluGrad")
    assert graph.is_ancestor(relu_grad.grad_of, relu_grad.name)
    # Optimizer updates and the returned Identity are neither forward nor backward.
    assigns = [op for op in graph if op.type in ("AssignVariableOp", "AssignAddVariableOp")]
    assert assigns and all(op.role is Role.OTHER for op in assigns)
    # Forward = what the loss depends on: the labels placeholder too, the gradients not.
    assert graph.ops["y"].role is Role.FORWARD
    assert sum(op.role is Role.BACKWARD for op in graph) > sum(op.role is Role.FORWARD for op in graph) / 2


def test_grad_of_links_backward_ops_to_their_forward_op(mlp_traced):
    graph, _ = mlp_traced
    relu_grads = [op for op in graph if op.type == "ReluGrad"]
    assert len(relu_grads) == 1
    relu = graph.ops[relu_grads[0].grad_of]
    assert relu.type == "Relu" and relu.role is Role.FORWARD
    bias_grads = [op for op in graph if op.type == "BiasAddGrad"]
    assert len(bias_grads) == 2
    assert {graph.ops[op.grad_of].type for op in bias_grads} == {"BiasAdd"}
    matmul_grads = [op for op in graph if op.type == "MatMul" and op.role is Role.BACKWARD]
    assert matmul_grads and all(graph.ops[op.grad_of].type == "MatMul" for op in matmul_grads)
    # Every backward op under the scope of a forward op is linked to a forward op of that scope.
    for op in graph:
        if op.role is Role.BACKWARD and op.grad_of is not None:
            assert graph.ops[op.grad_of].role is Role.FORWARD
            scope = graph.ops[op.grad_of].scope
            assert op.name.startswith("gradient_tape/" + scope), (op.name, op.grad_of)


def test_sizes_with_unknown_batch_are_per_sample(mlp_traced):
    graph, _ = mlp_traced
    relu = next(op for op in graph if op.type == "Relu")
    t = graph.tensors[relu.outputs[0]]
    assert t.shape == (None, 32) and t.dtype == "float32"
    assert (t.fixed_bytes, t.per_sample_bytes) == (0, 32 * 4)
    assert t.nbytes(8) == 8 * 32 * 4
    kernel = graph.tensors[graph.ops[next(op.name for op in graph if op.type == "MatMul"
                                          and op.role is Role.FORWARD)].inputs[1]]
    assert kernel.per_sample_bytes == 0 and kernel.fixed_bytes == 12 * 32 * 4
    resources = [t for t in graph.tensors.values() if t.dtype == "resource"]
    assert resources and all(t.nbytes(8) == 0 for t in resources)


def test_static_batch_sizes_use_dim0_of_tensors_computed_from_inputs():
    # Batch 12 equals the first kernel's dim 0: the kernel must stay fixed-size.
    model = _mlp(batch_in=12)
    opt = keras.optimizers.SGD(0.1)
    step = make_train_step(model, keras.losses.MeanSquaredError(), opt)
    records = []

    def traced(x, y):
        with record_gradients() as rec:
            loss = step(x, y)
        records.append(rec)
        return loss

    concrete = tf.function(traced).get_concrete_function(tf.TensorSpec([12, 12]), tf.TensorSpec([12, 4]))
    rec = records[-1]
    graph = extract_graph(concrete.graph, loss_tensor=rec.targets, batch_size=12,
                          backward_ops=rec.backward_ops)
    relu = graph.tensors[next(op for op in graph if op.type == "Relu").outputs[0]]
    assert (relu.fixed_bytes, relu.per_sample_bytes) == (0, 32 * 4)
    kernel_read = next(op for op in graph if op.type == "ReadVariableOp"
                       and graph.tensors[op.outputs[0]].shape == (12, 32))
    assert graph.tensors[kernel_read.outputs[0]].fixed_bytes == 12 * 32 * 4
    assert graph.tensors[kernel_read.outputs[0]].per_sample_bytes == 0
    # Without the recorded loss, the function's outputs give the same forward set.
    from_outputs = extract_graph(concrete.graph, batch_size=12, backward_ops=rec.backward_ops)
    assert from_outputs.by_role(Role.FORWARD) == graph.by_role(Role.FORWARD)


def test_ops_made_by_tape_gradient_are_backward_whatever_their_name(cases):
    case = cases["residual"]
    graph, _ = trace_train_step(case.model, case.loss_fn, case.optimizer,
                                tf.TensorSpec([None, 10, 10, 4]), tf.TensorSpec([None], tf.int32), batch_size=4)
    add_n = [op for op in graph if op.type == "AddN"]  # gradient sums of tensors read twice (skips)
    assert add_n and all(not op.name.startswith("gradient_tape/") for op in add_n)
    assert all(op.role is Role.BACKWARD for op in add_n)


def test_cnn_candidates_are_activations(cnn_traced):
    graph, _ = cnn_traced
    candidates, skipped = find_candidates(graph, LMSConfig())
    assert len(candidates) >= 4
    types = {graph.producer(t).type for t in candidates}
    assert types & {"Relu", "BiasAdd", "MaxPool"}
    first_conv = next(op for op in graph if op.type == "Conv2D" and op.role is Role.FORWARD)
    conv_out = graph.tensors[first_conv.outputs[0]]
    assert conv_out.per_sample_bytes == 12 * 12 * 8 * 4
    assert not any(s.tensor == t for s in skipped for t in candidates)


def test_extract_rejects_bad_batch(mlp_traced):
    _, concrete = mlp_traced
    with pytest.raises(ValueError, match="batch_size"):
        extract_graph(concrete.graph, batch_size=0)
