"""Shared fixtures for the TensorFlow adapter tests: tiny models, a k-step trainer, bitwise checks.

Every case builds its model once (module scope); each run restores the same
initial weights and optimizer variables (Keras 3 optimizers keep
``iterations``/``learning_rate`` as variables: restored, not zeroed), so a
run with LMS can be compared bitwise with the run without.

oneDNN stays on (``TF_ENABLE_ONEDNN_OPTS`` is not set): the rewrite keeps
Grappler's and oneDNN's fusions as they are without LMS (see
`lms.tf.apply.anchor_triggers` and `lms.tf.emulate`), so results are bitwise
identical with the optimizations users run.
"""

from __future__ import annotations

import gc
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from dataclasses import dataclass, field  # noqa: E402
from typing import Callable, Iterator  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from lms.tf.train import make_train_step  # noqa: E402

K_STEPS = 3


@dataclass(frozen=True)
class RunResult:
    losses: tuple[np.ndarray, ...]
    weights: tuple[np.ndarray, ...]
    optimizer_variables: tuple[np.ndarray, ...]


def assert_bitwise(expected: RunResult, got: RunResult) -> None:
    """Loss of every step, every weight and every optimizer variable: same bits."""
    assert len(expected.losses) == len(got.losses)
    for i, (a, b) in enumerate(zip(expected.losses, got.losses)):
        assert np.array_equal(a, b), f"loss of step {i} differs: {a!r} != {b!r}"
    assert len(expected.weights) == len(got.weights)
    for i, (a, b) in enumerate(zip(expected.weights, got.weights)):
        assert a.dtype == b.dtype and np.array_equal(a, b), (
            f"weight {i} differs in {np.sum(a != b)} of {a.size} values")
    for i, (a, b) in enumerate(zip(expected.optimizer_variables, got.optimizer_variables)):
        assert np.array_equal(a, b), f"optimizer variable {i} differs"


def check_pinned_schedule(step, model: str) -> None:
    """The step's config pins something, and a headroom prefetch moved swap-ins (mlp at batch 6: no pinnable op
    touches 4 KiB, its MatMuls being fused or Grappler-rewritable, so nothing to pin or to move them behind)."""
    from lms.schedule import schedule_ops

    sched = schedule_ops(step.graph, step.plan)
    assert sched.edges or model == "mlp", "the config pins something"
    if step.plan.config.prefetch == "headroom":
        assert sched.prefetch_share > 0 or model == "mlp"


@dataclass
class Case:
    """A model with fixed data, initial weights and optimizer state, trained k steps on demand."""

    name: str
    model: object
    loss_fn: Callable
    optimizer: object
    x: np.ndarray
    y: np.ndarray
    initial_weights: list[np.ndarray] = field(default_factory=list)
    initial_optimizer: list[np.ndarray] = field(default_factory=list)
    _baseline: RunResult | None = None

    def __post_init__(self) -> None:
        self.optimizer.build(self.model.trainable_variables)
        self.initial_weights = [v.numpy() for v in self.model.weights]
        self.initial_optimizer = [v.numpy() for v in self.optimizer.variables]

    def reset(self) -> None:
        for v, value in zip(self.model.weights, self.initial_weights):
            v.assign(value)
        for v, value in zip(self.optimizer.variables, self.initial_optimizer):
            v.assign(value)

    def step_fn(self) -> Callable:
        """A fresh undecorated training step for this case."""
        return make_train_step(self.model, self.loss_fn, self.optimizer)

    def run(self, step: Callable, k: int = K_STEPS) -> RunResult:
        self.reset()
        losses = tuple(np.asarray(step(self.x, self.y)) for _ in range(k))
        result = RunResult(losses, tuple(v.numpy() for v in self.model.weights),
                           tuple(v.numpy() for v in self.optimizer.variables))
        self.reset()
        return result

    @property
    def baseline(self) -> RunResult:
        """k steps of the plain ``tf.function`` step (computed once)."""
        if self._baseline is None:
            self._baseline = self.run(tf.function(self.step_fn()))
        return self._baseline


def _optimizer() -> object:
    return keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)


def build_mlp() -> Case:
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((12,)),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(32, activation="tanh"),
        keras.layers.Dense(4),
    ], name="mlp")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 12)).astype("float32")
    y = rng.standard_normal((6, 4)).astype("float32")
    return Case("mlp", model, keras.losses.MeanSquaredError(), _optimizer(), x, y)


def build_cnn_bn() -> Case:
    keras.utils.set_random_seed(2)
    inp = keras.Input((12, 12, 3))
    h = keras.layers.Conv2D(8, 3, padding="same")(inp)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.ReLU()(h)
    h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.Conv2D(12, 3, padding="same", activation="relu")(h)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    out = keras.layers.Dense(5)(h)
    model = keras.Model(inp, out, name="cnn_bn")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 12, 12, 3)).astype("float32")
    y = rng.integers(0, 5, (4,)).astype("int32")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return Case("cnn_bn", model, loss, _optimizer(), x, y)


def build_residual() -> Case:
    """Two residual blocks (conv-BN-relu-conv-BN + skip) and a 1x1 projection shortcut."""
    keras.utils.set_random_seed(3)
    inp = keras.Input((10, 10, 4))
    h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inp)
    for i, filters in enumerate((8, 12)):
        shortcut = h if i == 0 else keras.layers.Conv2D(filters, 1)(h)
        r = keras.layers.Conv2D(filters, 3, padding="same")(h)
        r = keras.layers.BatchNormalization()(r)
        r = keras.layers.ReLU()(r)
        r = keras.layers.Conv2D(filters, 3, padding="same")(r)
        r = keras.layers.BatchNormalization()(r)
        h = keras.layers.ReLU()(keras.layers.Add()([shortcut, r]))
    h = keras.layers.GlobalAveragePooling2D()(h)
    out = keras.layers.Dense(3)(h)
    model = keras.Model(inp, out, name="residual")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 10, 10, 4)).astype("float32")
    y = rng.integers(0, 3, (4,)).astype("int32")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return Case("residual", model, loss, _optimizer(), x, y)


def build_resnet50() -> Case:
    keras.utils.set_random_seed(4)
    model = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, (2,)).astype("int32")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=False)
    return Case("resnet50", model, loss, _optimizer(), x, y)


BUILDERS = {"mlp": build_mlp, "cnn_bn": build_cnn_bn, "residual": build_residual, "resnet50": build_resnet50}


class _LazyCases(dict):
    def __missing__(self, key: str) -> Case:
        self[key] = BUILDERS[key]()
        return self[key]


@pytest.fixture(scope="module")
def cases() -> Iterator[dict[str, Case]]:
    """Cases by name, built on first use and shared by the tests of one module.

    Freed at the end of the module (Keras models hold reference cycles): later
    tests that measure the allocator must not see these weights.
    """
    built = _LazyCases()
    yield built
    built.clear()
    gc.collect()
