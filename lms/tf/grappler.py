"""Whose Grappler the equivalence check runs: this machine's, or a GPU's on any machine. TensorFlow.

TensorFlow optimizes a step with Grappler before it runs it, and which passes
act depends on the devices: on a GPU the layout optimizer converts fp32
convolutions to NCHW (and puts a ``Transpose`` at every boundary, every host
swap op included), the memory optimizer reads the device's memory size, the
remapper fuses for cuDNN. `lms.tf.equivalence` compares the step optimized
without and with LMS under one `GrapplerTarget`:

- `local_target()`: this machine as TensorFlow sees it (what the runtime does
  here; on a machine without GPUs the layout and memory optimizers, which change
  nothing there, are off);
- `virtual_target(device)`: a *virtual cluster* of one GPU of a simulator
  profile (`lms.machine.devices`: compute capability, memory size, cores) and a
  CPU, so Grappler makes a GPU's decisions offline on a CPU-only build
  (``tensorflow.python.grappler.cluster.Cluster(devices=[...])``, the way TF's
  own layout-optimizer tests run it). The graph's unplaced nodes go on
  ``/device:GPU:0`` (`compute_device`); host swap ops keep ``/device:CPU:0``.

`lms.inspect` traces a step under a virtual target (`using_target`); a step
traced on a real GPU uses the local target, whose Grappler is the one that runs.
What a virtual GPU cannot show: kernels, memory and timings (nothing runs).
The remapper's cuDNN fusions do happen there (``_FusedConv2D`` for a 3x3
Conv2D + BiasAdd + Relu), given the filters' static shapes: `lms.tf.equivalence`
passes the variables' shapes, and without them (a plain MetaGraphDef of the
traced graph) the remapper sees a filter of unknown size and fuses nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from dataclasses import dataclass
from typing import Any, Iterator

import tensorflow as tf

from ..machine.devices import DeviceProfile, get_device

__all__ = ["GrapplerTarget", "local_target", "virtual_target", "using_target", "current_target", "GPU_DEVICE",
           "CPU_DEVICE"]

GPU_DEVICE = "/job:localhost/replica:0/task:0/device:GPU:0"
CPU_DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"


@dataclass(frozen=True)
class GrapplerTarget:
    """The devices Grappler optimizes for.

    Attributes:
        name: ``"local"`` (this machine) or the device profile's name (a virtual cluster).
        gpu: the target has a GPU (Grappler's GPU passes act).
        compute_capability: the GPU's (``"7.0"``; '' without one).
        memory_bytes: the GPU memory the cluster reports (0: local, TF's own).
    """

    name: str
    gpu: bool
    compute_capability: str = ""
    memory_bytes: int = 0

    @property
    def virtual(self) -> bool:
        return self.name != "local"

    @property
    def compute_device(self) -> str:
        """Where the step's unplaced ops run under this target."""
        if self.virtual:
            return "/device:GPU:0" if self.gpu else "/device:CPU:0"
        return "/device:GPU:0" if tf.config.list_logical_devices("GPU") else "/device:CPU:0"

    def key(self) -> bytes:
        """What distinguishes this target's decisions (part of the check's cache keys)."""
        return f"{self.name}|{self.gpu}|{self.compute_capability}|{self.memory_bytes}".encode()

    def config(self) -> Any:
        """Grappler's options as the runtime uses them (``tf.config.optimizer``); without a GPU the layout and
        memory optimizers, which change nothing there, are off."""
        from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
        from tensorflow.python.eager import context

        config = config_pb2.ConfigProto()
        config.CopyFrom(context.context().config)
        if not self.gpu:
            rewrite = config.graph_options.rewrite_options
            rewrite.layout_optimizer = rewriter_config_pb2.RewriterConfig.OFF
            rewrite.memory_optimization = rewriter_config_pb2.RewriterConfig.NO_MEM_OPT
        return config

    def optimize(self, meta: Any, config: Any) -> Any:
        """``tf_optimizer.OptimizeGraph`` of `meta` for this target."""
        from tensorflow.python.grappler import tf_optimizer

        cluster = _cluster(self) if self.virtual else None
        if cluster is None:
            return tf_optimizer.OptimizeGraph(config, meta, verbose=False)
        with _CLUSTER_LOCK:
            return tf_optimizer.OptimizeGraph(config, meta, verbose=False, cluster=cluster)


def local_target() -> GrapplerTarget:
    """This machine as TensorFlow sees it."""
    return GrapplerTarget("local", gpu=bool(tf.config.list_physical_devices("GPU")))


def virtual_target(device: str | DeviceProfile) -> GrapplerTarget:
    """A virtual cluster of one GPU of profile `device` and a CPU (``"cpu"``: a CPU alone).

    Raises:
        ValueError: unknown profile name (the message lists the known ones).
    """
    profile = get_device(device)
    if profile.kernels == "cpu" or not profile.compute_capability:
        return GrapplerTarget(profile.name, gpu=False)
    return GrapplerTarget(profile.name, gpu=True, compute_capability=profile.compute_capability,
                          memory_bytes=int(profile.memory_bytes))


_CURRENT: contextvars.ContextVar[GrapplerTarget | None] = contextvars.ContextVar("lms_grappler_target",
                                                                                  default=None)


@contextlib.contextmanager
def using_target(target: GrapplerTarget) -> Iterator[GrapplerTarget]:
    """Within the block, steps traced in this thread are checked for `target` (`current_target`)."""
    token = _CURRENT.set(target)
    try:
        yield target
    finally:
        _CURRENT.reset(token)


def current_target() -> GrapplerTarget:
    """The target set by `using_target`, else `local_target()`."""
    return _CURRENT.get() or local_target()


_CLUSTER_LOCK = threading.Lock()  # Grappler's virtual clusters are not meant for concurrent use
_CLUSTERS: dict[GrapplerTarget, Any] = {}


def _cluster(target: GrapplerTarget) -> Any:
    """The virtual cluster of `target`, made once per process."""
    from tensorflow.core.protobuf import device_properties_pb2 as dp
    from tensorflow.python.grappler import cluster as gcluster

    with _CLUSTER_LOCK:
        found = _CLUSTERS.get(target)
        if found is not None:
            return found
        cpu = dp.NamedDevice(name=CPU_DEVICE, properties=dp.DeviceProperties(type="CPU", frequency=2000,
                                                                             num_cores=8))
        devices = [cpu]
        if target.gpu:
            profile = get_device(target.name)
            devices.insert(0, dp.NamedDevice(name=GPU_DEVICE, properties=dp.DeviceProperties(
                type="GPU", frequency=1500, num_cores=80, memory_size=target.memory_bytes,
                bandwidth=int(profile.mem_bandwidth / 1e3),  # KB/s, as TF's device properties give it
                environment={"architecture": target.compute_capability, "cuda": "12000", "cudnn": "9000"})))
        found = _CLUSTERS[target] = gcluster.Cluster(devices=devices)
        return found
