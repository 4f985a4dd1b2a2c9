"""Keras 3 ``model.fit`` with LMS (`lms.LMSModel`, `lms.enable_lms`) trains bitwise identically."""

from __future__ import annotations

import gc
import logging

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import lms  # noqa: E402
from tests.tf.conftest import RunResult, assert_bitwise  # noqa: E402
from lms import LMSConfig  # noqa: E402

pytestmark = pytest.mark.tf

BATCH = 4
N = 12  # three steps per epoch


def _graph(seed: int = 7):
    """Layers of a small residual CNN with BatchNorm: (inputs, outputs)."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(6, 3, padding="same", activation="relu")(inputs)
    r = keras.layers.Conv2D(6, 3, padding="same")(h)
    r = keras.layers.BatchNormalization()(r)
    h = keras.layers.ReLU()(keras.layers.Add()([h, r]))
    h = keras.layers.GlobalAveragePooling2D()(h)
    return inputs, keras.layers.Dense(3)(h)


@pytest.fixture(scope="module", autouse=True)
def _collect_models_at_the_end():
    """Keras models hold reference cycles: free them here, not while a later test measures the allocator."""
    yield
    gc.collect()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    return rng.standard_normal((N, 8, 8, 3)).astype("float32"), rng.integers(0, 3, (N,)).astype("int32")


def _fit(model, data, initial) -> RunResult:
    for v, value in zip(model.weights, initial):
        v.assign(value)
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(*data, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    return RunResult(tuple(np.float32(v) for v in history.history["loss"]),
                     tuple(v.numpy() for v in model.weights),
                     tuple(v.numpy() for v in model.optimizer.variables))


@pytest.fixture(scope="module")
def baseline(data):
    inputs, outputs = _graph()
    plain = keras.Model(inputs, outputs)
    initial = [v.numpy() for v in plain.weights]
    return inputs, outputs, initial, _fit(plain, data, initial)


def test_lms_model_fit_is_bitwise_identical(baseline, data):
    inputs, outputs, initial, expected = baseline
    model = lms.LMSModel(inputs, outputs, lms_config=LMSConfig(lb=2, swap_branches=True, branch_threshold=1))
    assert isinstance(model, keras.Model) and hasattr(model, "lms")
    assert_bitwise(expected, _fit(model, data, initial))
    summary = model.lms.summary
    assert summary.n_swapped > 0 and summary.swap_ops == "emulated"
    assert model.jit_compile is False


PINNED_FIT_CONFIGS = {
    "memory-no-swaps": LMSConfig(n_tensors=0, schedule="memory"),
    "memory-sync3-branches": LMSConfig(lb=2, schedule="memory", sync_mode=3, swap_branches=True, branch_threshold=1),
    "memory-prefetch-recompute": LMSConfig(lb=2, schedule="memory", prefetch="headroom", recompute="cheap"),
    "tf-serialization": LMSConfig(serialization=["1:"], sync_mode=1),
}


@pytest.mark.parametrize("emulate", [True, False])
@pytest.mark.parametrize("config_name", list(PINNED_FIT_CONFIGS))
def test_pinned_orders_fit_bitwise_identically(baseline, data, config_name, emulate):
    inputs, outputs, initial, expected = baseline
    model = lms.enable_lms(keras.Model(inputs, outputs), PINNED_FIT_CONFIGS[config_name], emulate=emulate)
    assert_bitwise(expected, _fit(model, data, initial))
    assert model.lms.plan.config.pins_order


def test_enable_lms_on_an_existing_model(baseline, data):
    inputs, outputs, initial, expected = baseline
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="sgd", loss="mse")  # compiled before: the LMS compile replaces it
    assert lms.enable_lms(model, LMSConfig(ctrld_strategy="direct_order", fuse_swapins=True)) is model
    assert_bitwise(expected, _fit(model, data, initial))
    assert model.lms.summary.n_swapped > 0
    assert model.lms.plan.config.ctrld_strategy == "direct_order"
    # Enabling again replaces the config and does not wrap the step twice.
    lms.enable_lms(model, {"n_tensors": 1})
    assert_bitwise(expected, _fit(model, data, initial))
    assert model.lms.summary.n_swapped == 1


def test_fit_on_a_tf_data_pipeline_reports_the_bytes_at_the_batch_that_ran(baseline, data, caplog):
    """The batch is unknown when the step is traced (``batch`` without ``drop_remainder``)."""
    inputs, outputs, initial, _ = baseline

    def fit(model):
        for v, value in zip(model.weights, initial):
            v.assign(value)
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(tf.data.Dataset.from_tensor_slices(data).batch(BATCH), epochs=2, verbose=0)
        return RunResult(tuple(np.float32(v) for v in history.history["loss"]),
                         tuple(v.numpy() for v in model.weights),
                         tuple(v.numpy() for v in model.optimizer.variables))

    expected = fit(keras.Model(inputs, outputs))
    model = lms.enable_lms(keras.Model(inputs, outputs), LMSConfig())
    with caplog.at_level(logging.INFO, logger="lms.tf.rewriter"):
        assert_bitwise(expected, fit(model))
    summary, graph = model.lms.summary, model.lms.graph
    assert all(graph.tensors[s.tensor].shape[0] is None for s in summary.swapped)  # unknown when traced
    assert summary.batch_size == BATCH
    assert [s.bytes for s in summary.swapped] == [graph.tensors[s.tensor].per_sample_bytes * BATCH
                                                  for s in summary.swapped]
    assert summary.swapped_bytes == sum(s.bytes for s in summary.swapped) > 0
    ran = [r.getMessage() for r in caplog.records if "the batch of the first step that ran" in r.getMessage()]
    assert ran == [f"LMS: {model.name}.fit swaps {summary.swapped_bytes / 2**20:.1f} MiB at batch {BATCH} "
                   "(the batch of the first step that ran)"]
    assert not any("at batch 1 " in r.getMessage() for r in caplog.records)


def test_enable_lms_before_compile_on_a_model_with_its_own_compile(baseline):
    """keras-io's GAN pattern: ``compile(d_optimizer, g_optimizer)`` takes no ``jit_compile``."""
    inputs, outputs, _, _ = baseline

    class OwnCompile(keras.Model):
        def compile(self, d_optimizer, g_optimizer):
            super().compile(loss="mse")
            self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer

    model = lms.enable_lms(OwnCompile(inputs, outputs), LMSConfig())
    model.compile(keras.optimizers.SGD(0.1), g_optimizer=keras.optimizers.Adam())
    assert isinstance(model.g_optimizer, keras.optimizers.Adam) and model.jit_compile is False
    with pytest.raises(ValueError, match="jit_compile"):
        model.compile(keras.optimizers.SGD(0.1), keras.optimizers.Adam(), jit_compile=True)


def test_subclassed_lms_model(data):
    class Small(lms.LMSModel):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.conv = keras.layers.Conv2D(4, 3, padding="same", activation="relu")
            self.pool = keras.layers.GlobalAveragePooling2D()
            self.dense = keras.layers.Dense(3)

        def call(self, x):
            return self.dense(self.pool(self.conv(x)))

    keras.utils.set_random_seed(3)
    model = Small(lms_config=LMSConfig())
    assert isinstance(model, lms.LMSModel)
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(*data, batch_size=BATCH, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert model.lms.summary.n_swapped > 0


def test_jit_compile_true_is_refused(baseline):
    inputs, outputs, _, _ = baseline
    model = lms.LMSModel(inputs, outputs, lms_config=LMSConfig())
    with pytest.raises(ValueError, match="jit_compile"):
        model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    wrapped = lms.enable_lms(keras.Model(inputs, outputs), LMSConfig())
    with pytest.raises(ValueError, match="jit_compile"):
        wrapped.compile(optimizer="sgd", loss="mse", jit_compile=True)
    wrapped.compile(optimizer="sgd", loss="mse")
    assert wrapped.jit_compile is False


def test_bad_arguments(baseline):
    inputs, outputs, _, _ = baseline
    with pytest.raises(ValueError, match="lb"):
        lms.LMSModel(inputs, outputs, lms_config={"lb": 0})
    with pytest.raises(ValueError, match="keras.Model"):
        lms.enable_lms(object(), LMSConfig())
    with pytest.raises(ValueError, match="bandwidth"):
        lms.enable_lms(keras.Model(inputs, outputs), LMSConfig(), bandwidth=-1)
