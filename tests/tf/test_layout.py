"""On a GPU, Grappler's layout optimizer puts one Transpose beside each swap op; the simulator counts the same ones.

No GPU is needed: Grappler runs offline on the step's graph (placed on
``/device:GPU:0`` while tracing) with a virtual cluster holding an Ampere GPU
and a CPU, the way TF's own layout-optimizer tests run it. What it shows:

- fp32: each swap-out of a 4-D activation gets a ``Transpose`` (NCHW -> NHWC)
  on the GPU before it, each swap-in one (NHWC -> NCHW) after it, shared by the
  swap-in's readers; the swap ops themselves stay on the host and untouched.
- mixed precision (fp16 convolutions): NHWC is kept, no transpose.
- the simulator's rule (`lms.sim.layout`) names exactly the swaps that got them.
"""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import lms  # noqa: E402
from lms.sim.interpreter import layout_transposes_on  # noqa: E402
from lms.sim.layout import is_transposed, transposed_rank  # noqa: E402
from lms.machine.devices import get_device  # noqa: E402
from lms.tf.graphdefs import is_swap_op_name  # noqa: E402

pytestmark = pytest.mark.tf

GPU = "/job:localhost/replica:0/task:0/device:GPU:0"
CPU = "/job:localhost/replica:0/task:0/device:CPU:0"


def _optimize_on_virtual_gpu(concrete):  # noqa: ANN001
    """Grappler's default passes over the step's graph, for a cluster of one Ampere GPU and a CPU."""
    from tensorflow.core.protobuf import config_pb2, device_properties_pb2 as dp, meta_graph_pb2
    from tensorflow.python.grappler import cluster as gcluster
    from tensorflow.python.grappler import tf_optimizer

    meta = meta_graph_pb2.MetaGraphDef(graph_def=concrete.graph.as_graph_def())
    fetch = meta.collection_def["train_op"].node_list.value
    for t in concrete.graph.outputs:
        fetch.append(t.name)
    config = config_pb2.ConfigProto()
    config.graph_options.rewrite_options.min_graph_nodes = -1
    cluster = gcluster.Cluster(devices=[
        dp.NamedDevice(name=GPU, properties=dp.DeviceProperties(
            type="GPU", frequency=1410, num_cores=108, memory_size=16 << 30, environment={"architecture": "8.0"})),
        dp.NamedDevice(name=CPU, properties=dp.DeviceProperties(type="CPU", frequency=2000, num_cores=8)),
    ])
    gd = tf_optimizer.OptimizeGraph(config, meta, cluster=cluster)
    return list(gd.node) + [n for f in gd.library.function for n in f.node_def]


def _step_for(dtype_policy: str):  # noqa: ANN001
    keras.utils.set_random_seed(3)
    keras.mixed_precision.set_global_policy(dtype_policy)
    try:
        inp = keras.Input((16, 16, 3))
        h = inp
        for _ in range(4):
            h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(h)
        out = keras.layers.Dense(2, dtype="float32")(keras.layers.Flatten()(h))
        model = keras.Model(inp, out)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    opt = keras.optimizers.SGD(0.01)
    opt.build(model.trainable_variables)

    def step(x, y):  # noqa: ANN001, ANN202
        with tf.device("/device:GPU:0"):  # traced only: no GPU needed to build the graph
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step


def _transposes_beside_swaps(nodes):  # noqa: ANN001
    """(swap-outs fed by a Transpose, swap-ins read by a Transpose) in the optimized graph."""
    by_name = {n.name: n for n in nodes}
    fed, read = set(), set()
    for n in nodes:
        if n.op != "Transpose":
            continue
        src = n.input[0].split(":")[0]
        if is_swap_op_name(src) and "-lms_swap_in_" in src:
            read.add(src)
    for n in nodes:
        if n.name.startswith("lms/swap_out/") and n.op == "Identity":
            src = by_name.get(n.input[0].split(":")[0])
            if src is not None and src.op == "Transpose":
                fed.add(n.name)
    return fed, read


@pytest.mark.parametrize("config", [lms.LMSConfig(n_tensors=-1, lb=1), lms.LMSConfig(lb=3, fuse_swapins=True)],
                         ids=["all-lb1", "lb3-fused"])
def test_fp32_swaps_get_one_transpose_each_and_the_simulator_counts_them(config):
    fn = lms.function(_step_for("float32"), config=config, emulate=False)
    concrete = fn.get_concrete_function(tf.TensorSpec((4, 16, 16, 3)), tf.TensorSpec((4, 2)))
    nodes = _optimize_on_virtual_gpu(concrete)
    assert any(n.op == "Conv2D" and n.attr["data_format"].s == b"NCHW" for n in nodes)  # converted
    swap_nodes = [n for n in nodes if is_swap_op_name(n.name) and n.op == "Identity"]
    assert swap_nodes and all(n.device.endswith("CPU:0") for n in swap_nodes)  # on the host, untouched
    fed, read = _transposes_beside_swaps(nodes)
    graph, plan = fn.graph, fn.plan
    ranks = transposed_rank(graph)
    modelled = [s for s in plan.swaps if is_transposed(graph, s.tensor, ranks)]
    assert layout_transposes_on(graph, get_device("A100-40GB"))
    assert len(modelled) == len(plan.swaps) >= 4
    assert fed == {s.swap_out for s in modelled}
    assert read == {si.name for s in modelled for si in s.swap_ins}


def test_fp16_convolutions_keep_nhwc_and_no_swap_is_transposed():
    fn = lms.function(_step_for("mixed_float16"), config=lms.LMSConfig(n_tensors=-1, lb=1), emulate=False)
    concrete = fn.get_concrete_function(tf.TensorSpec((4, 16, 16, 3)), tf.TensorSpec((4, 2)))
    nodes = _optimize_on_virtual_gpu(concrete)
    assert fn.plan.n_swapped >= 4
    assert _transposes_beside_swaps(nodes) == (set(), set())
    assert not layout_transposes_on(fn.graph, get_device("A100-40GB"))
