"""Real-world training patterns for the bitwise-equality corpus (`tests/tf/test_realworld.py`).

Each pattern is a training program as users write it, at tiny sizes: custom
``GradientTape`` loops (two-tape GAN, VAE, transformer encoder, GPT-style
decoder with ``clip_by_global_norm`` and AdamW, mixed precision with
``LossScaleOptimizer``) and Keras ``fit`` (WGAN-GP overriding ``train_step``
with its own ``compile`` signature and a nested gradient-penalty tape, U-Net
segmentation with a metric, ``steps_per_execution > 1``), plus
``MirroredStrategy`` on two logical CPUs (a custom loop and ``fit``), which
needs its own process: logical devices must be configured before TensorFlow
starts (``python -m tests.tf.realworld mirrored`` prints JSON).

A run trains `K_STEPS` steps from the same initial state (weights, optimizer
and metric variables restored or rebuilt from the same seed) and returns every
step's losses and every model, optimizer and metric variable, to compare bit
for bit with the same program under ``tf.function``.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

K_STEPS = 3

# name -> (config fields, emulate): emulated and device swap ops, both trigger strategies.
CONFIGS: dict[str, tuple[dict, bool]] = {
    "all-emulated": ({}, True),
    "chain_rule-lb3-fused-branches-device": (
        {"lb": 3, "fuse_swapins": True, "swap_branches": True, "branch_threshold": 2}, False),
    "direct_order-lb2-emulated": ({"ctrld_strategy": "direct_order", "lb": 2}, True),
    "direct_order-fused-device": ({"ctrld_strategy": "direct_order", "fuse_swapins": True}, False),
    # the order pinned by the memory schedule, with cheap tensors recomputed instead of swapped
    "memory-recompute-emulated": ({"schedule": "memory", "recompute": "cheap"}, True),
    "recompute-lb2-device": ({"recompute": "cheap", "lb": 2}, False),
    "memory-sync1-fused-device": ({"schedule": "memory", "sync_mode": 1, "fuse_swapins": True}, False),
}


@dataclass(frozen=True)
class Outcome:
    """Losses of every step and the values of every variable after the run."""

    losses: tuple[np.ndarray, ...]
    variables: tuple[np.ndarray, ...]

    def differences(self, other: "Outcome") -> list[str]:
        """What differs, bit for bit (empty: identical)."""
        out = []
        if len(self.losses) != len(other.losses):
            out.append(f"{len(self.losses)} vs {len(other.losses)} losses")
        for i, (a, b) in enumerate(zip(self.losses, other.losses)):
            if not np.array_equal(a, b):
                out.append(f"loss of step {i}: {a!r} != {b!r}")
        if len(self.variables) != len(other.variables):
            out.append(f"{len(self.variables)} vs {len(other.variables)} variables")
        for i, (a, b) in enumerate(zip(self.variables, other.variables)):
            if a.dtype != b.dtype or not np.array_equal(a, b):
                out.append(f"variable {i} differs in {np.sum(a != b)} of {a.size} values")
        return out


def _tf():
    import keras
    import tensorflow as tf

    return tf, keras


# ---- custom training loops --------------------------------------------------------------

@dataclass
class Loop:
    """A custom training loop: ``step(*batch)``, wrapped by ``tf.function`` or ``lms.function``."""

    name: str
    step: Callable
    batch: tuple
    variables: list
    initial: list | None = None

    def __post_init__(self) -> None:
        self.initial = [v.numpy() for v in self.variables]

    def run(self, wrap: Callable[[Callable], Any]) -> tuple[Outcome, Any]:
        """`K_STEPS` steps of ``wrap(step)`` from the initial state; returns the outcome and the wrapped step."""
        tf, _ = _tf()
        for v, value in zip(self.variables, self.initial):
            v.assign(value)
        fn = wrap(self.step)
        losses = tuple(np.asarray([np.asarray(t) for t in tf.nest.flatten(fn(*self.batch))]) for _ in range(K_STEPS))
        outcome = Outcome(losses, tuple(v.numpy() for v in self.variables))
        for v, value in zip(self.variables, self.initial):
            v.assign(value)
        return outcome, fn


def _optimizer_variables(*optimizers: Any) -> list:
    return [v for o in optimizers for v in o.variables]


def gan_two_tapes() -> Loop:
    """DCGAN-style step: generator and discriminator, one tape each, two Adam optimizers, a loss tracker."""
    tf, keras = _tf()
    keras.utils.set_random_seed(11)
    gen = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"),
                            keras.layers.Dense(8, activation="tanh")], name="generator")
    disc = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.LeakyReLU(0.2),
                             keras.layers.Dense(1)], name="discriminator")
    g_opt, d_opt = keras.optimizers.Adam(1e-2), keras.optimizers.Adam(1e-2)
    g_opt.build(gen.trainable_variables)
    d_opt.build(disc.trainable_variables)
    bce = keras.losses.BinaryCrossentropy(from_logits=True)
    tracker = keras.metrics.Mean(name="d_loss")
    rng = np.random.default_rng(11)
    real = rng.standard_normal((6, 8)).astype("float32")
    noise = rng.standard_normal((6, 4)).astype("float32")

    def step(real, noise):
        with tf.GradientTape() as g_tape, tf.GradientTape() as d_tape:
            fake = gen(noise, training=True)
            real_out = disc(real, training=True)
            fake_out = disc(fake, training=True)
            g_loss = bce(tf.ones_like(fake_out), fake_out)
            d_loss = bce(tf.ones_like(real_out), real_out) + bce(tf.zeros_like(fake_out), fake_out)
        g_opt.apply_gradients(zip(g_tape.gradient(g_loss, gen.trainable_variables), gen.trainable_variables))
        d_opt.apply_gradients(zip(d_tape.gradient(d_loss, disc.trainable_variables), disc.trainable_variables))
        tracker.update_state(d_loss)
        return g_loss, d_loss

    variables = gen.weights + disc.weights + _optimizer_variables(g_opt, d_opt) + tracker.variables
    return Loop("gan_two_tapes", step, (real, noise), variables)


def vae() -> Loop:
    """VAE: reparameterisation ``z_mean + exp(0.5 * z_log_var) * eps`` and a KL term with ``exp(z_log_var)``, Adam."""
    tf, keras = _tf()
    keras.utils.set_random_seed(5)
    inp = keras.Input((6,))
    h = keras.layers.Dense(8, activation="relu")(inp)
    encoder = keras.Model(inp, [keras.layers.Dense(4)(h), keras.layers.Dense(4)(h)], name="encoder")
    decoder = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(6)],
                               name="decoder")
    opt = keras.optimizers.Adam(1e-2)
    trainable = encoder.trainable_variables + decoder.trainable_variables
    opt.build(trainable)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((5, 6)).astype("float32")
    eps = rng.standard_normal((5, 4)).astype("float32")

    def step(x, eps):
        with tf.GradientTape() as tape:
            z_mean, z_log_var = encoder(x, training=True)
            z = z_mean + tf.exp(0.5 * z_log_var) * eps
            reconstruction = tf.reduce_mean(tf.square(decoder(z, training=True) - x))
            kl = -0.5 * tf.reduce_mean(1 + z_log_var - tf.square(z_mean) - tf.exp(z_log_var))
            loss = reconstruction + kl
        opt.apply_gradients(zip(tape.gradient(loss, trainable), trainable))
        return loss

    return Loop("vae", step, (x, eps), encoder.weights + decoder.weights + opt.variables)


def mha_block() -> Loop:
    """``MultiHeadAttention(num_heads=2, key_dim=8)`` on (4, 16, 8) inputs, SGD 0.1, squared loss (issue 11)."""
    tf, keras = _tf()
    keras.utils.set_random_seed(9)
    inp = keras.Input((16, 8))
    # Keras' default name "functional": its ops sort before "gradient_tape/..." and an
    # "lms/..." swap-in would sort after (the name-order mechanism; see lms.plan.swap_op_name).
    model = keras.Model(inp, keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(inp, inp))
    opt = keras.optimizers.SGD(0.1)
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.MeanSquaredError()
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 16, 8)).astype("float32")
    y = rng.standard_normal((4, 16, 8)).astype("float32")

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return Loop("mha_block", step, (x, y), model.weights + opt.variables)


def transformer_encoder() -> Loop:
    """Keras-3 text classifier: embedding, a post-norm encoder block (MHA, FFN), pooling, SGD with momentum."""
    tf, keras = _tf()
    keras.utils.set_random_seed(7)
    tokens = keras.Input((12,), dtype="int32")
    h = keras.layers.Embedding(40, 16)(tokens)
    a = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(h, h)
    h = keras.layers.LayerNormalization(epsilon=1e-6)(h + a)
    f = keras.layers.Dense(32, activation="relu")(h)
    h = keras.layers.LayerNormalization(epsilon=1e-6)(h + keras.layers.Dense(16)(f))
    out = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(h))
    model = keras.Model(tokens, out, name="text_transformer")
    opt = keras.optimizers.SGD(0.05, momentum=0.9)
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(7)
    x = rng.integers(0, 40, (4, 12)).astype("int32")
    y = rng.integers(0, 2, (4,)).astype("int32")

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return Loop("transformer_encoder", step, (x, y), model.weights + opt.variables)


def gpt_decoder() -> Loop:
    """minGPT port: token + position embeddings, causal self-attention, GELU MLP, ``clip_by_global_norm``, AdamW."""
    tf, keras = _tf()
    keras.utils.set_random_seed(8)
    vocab, seq = 32, 10
    tokens = keras.Input((seq,), dtype="int32")
    h = keras.layers.Embedding(vocab, 16)(tokens)
    h = h + keras.layers.Embedding(seq, 16)(tf.range(seq)[None, :])
    n = keras.layers.LayerNormalization()(h)
    h = h + keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(n, n, use_causal_mask=True)
    n = keras.layers.LayerNormalization()(h)
    h = h + keras.layers.Dense(16)(keras.layers.Dense(64, activation="gelu")(n))
    logits = keras.layers.Dense(vocab)(keras.layers.LayerNormalization()(h))
    model = keras.Model(tokens, logits, name="mingpt")
    opt = keras.optimizers.AdamW(1e-3, weight_decay=0.1)
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(8)
    data = rng.integers(0, vocab, (3, seq + 1)).astype("int32")

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads, _ = tf.clip_by_global_norm(tape.gradient(loss, model.trainable_variables), 1.0)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return Loop("gpt_decoder", step, (data[:, :-1], data[:, 1:]), model.weights + opt.variables)


def mixed_precision() -> Loop:
    """``mixed_float16`` layers and a float32 head, ``LossScaleOptimizer`` (scale_loss, unscaled apply)."""
    tf, keras = _tf()
    keras.utils.set_random_seed(6)
    model = keras.Sequential([
        keras.Input((10,)),
        keras.layers.Dense(16, activation="relu", dtype="mixed_float16"),
        keras.layers.Dense(16, activation="tanh", dtype="mixed_float16"),
        keras.layers.Dense(3, dtype="float32"),
    ], name="mixed")
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.05, momentum=0.9))
    opt.build(model.trainable_variables)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((6, 10)).astype("float32")
    y = rng.standard_normal((6, 3)).astype("float32")

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            scaled = opt.scale_loss(loss)
        opt.apply_gradients(zip(tape.gradient(scaled, model.trainable_variables), model.trainable_variables))
        return loss

    return Loop("mixed_precision", step, (x, y), model.weights + opt.variables)


LOOPS = {f.__name__: f for f in (gan_two_tapes, vae, transformer_encoder, gpt_decoder, mixed_precision)}


# ---- Keras fit ----------------------------------------------------------------------------

@dataclass
class Fit:
    """``model.fit`` on fixed data; ``build()`` makes the model from a fixed seed, ``compile(model)`` compiles it."""

    name: str
    build: Callable[[], Any]
    compile: Callable[[Any], None]
    data: tuple
    fit_kwargs: dict

    def run(self, enable: Callable[[Any], Any] | None = None) -> tuple[Outcome, Any]:
        """Build, ``enable(model)`` before compile (LMS), compile, fit; returns the outcome and the model."""
        model = self.build()
        if enable is not None:
            model = enable(model)
        self.compile(model)
        history = model.fit(*self.data, shuffle=False, verbose=0, **self.fit_kwargs)
        losses = tuple(np.asarray([history.history[k][i] for k in sorted(history.history)], dtype=np.float64)
                       for i in range(len(history.history["loss" if "loss" in history.history else
                                                           sorted(history.history)[0]])))
        variables = list(model.weights) + _fit_optimizer_variables(model) + list(model.metrics_variables)
        return Outcome(losses, tuple(np.asarray(v.numpy()) for v in variables)), model


def _fit_optimizer_variables(model: Any) -> list:
    optimizers = [o for o in (getattr(model, "optimizer", None), getattr(model, "d_optimizer", None),
                              getattr(model, "g_optimizer", None)) if o is not None]
    return [v for o in optimizers for v in o.variables]


def _wgan_class():
    tf, keras = _tf()

    class WGANGP(keras.Model):
        """keras-io WGAN-GP: own ``compile(d_optimizer, g_optimizer)``, ``train_step`` with a nested GP tape."""

        def __init__(self, critic, generator, latent_dim):
            super().__init__()
            self.critic, self.generator, self.latent_dim = critic, generator, latent_dim

        def compile(self, d_optimizer, g_optimizer):
            super().compile()
            self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer

        def gradient_penalty(self, real, fake):
            alpha = tf.linspace(0.1, 0.9, tf.shape(real)[0])[:, None]  # fixed, for a reproducible run
            interpolated = real + alpha * (fake - real)
            with tf.GradientTape() as gp_tape:
                gp_tape.watch(interpolated)
                pred = self.critic(interpolated, training=True)
            grads = gp_tape.gradient(pred, [interpolated])[0]
            norm = tf.sqrt(tf.reduce_sum(tf.square(grads), axis=1) + 1e-12)
            return tf.reduce_mean((norm - 1.0) ** 2)

        def train_step(self, data):
            real = data[0] if isinstance(data, tuple) else data
            noise = real[:, : self.latent_dim] * 0.5
            with tf.GradientTape() as tape:
                fake = self.generator(noise, training=True)
                d_cost = tf.reduce_mean(self.critic(fake, training=True)) - tf.reduce_mean(
                    self.critic(real, training=True))
                d_loss = d_cost + 10.0 * self.gradient_penalty(real, fake)
            d_grads = tape.gradient(d_loss, self.critic.trainable_variables)
            self.d_optimizer.apply_gradients(zip(d_grads, self.critic.trainable_variables))
            with tf.GradientTape() as tape:
                g_loss = -tf.reduce_mean(self.critic(self.generator(noise, training=True), training=True))
            g_grads = tape.gradient(g_loss, self.generator.trainable_variables)
            self.g_optimizer.apply_gradients(zip(g_grads, self.generator.trainable_variables))
            return {"d_loss": d_loss, "g_loss": g_loss}

    return WGANGP


def wgan_gp() -> Fit:
    tf, keras = _tf()
    cls = _wgan_class()

    def build():
        keras.utils.set_random_seed(12)
        critic = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.LeakyReLU(0.2),
                                   keras.layers.Dense(16), keras.layers.LeakyReLU(0.2), keras.layers.Dense(1)])
        generator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"),
                                      keras.layers.Dense(8)])
        return cls(critic, generator, latent_dim=4)

    def compile_(model):
        model.compile(d_optimizer=keras.optimizers.Adam(1e-3, beta_1=0.5),
                      g_optimizer=keras.optimizers.Adam(1e-3, beta_1=0.5))

    x = np.random.default_rng(12).standard_normal((6, 8)).astype("float32")
    return Fit("wgan_gp", build, compile_, (x,), {"batch_size": 6, "epochs": K_STEPS})


def unet_fit() -> Fit:
    """U-Net segmentation (skip connection, up-sampling), sparse CE and an accuracy metric."""
    tf, keras = _tf()

    def build():
        keras.utils.set_random_seed(13)
        inp = keras.Input((8, 8, 1))
        c1 = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inp)
        p1 = keras.layers.MaxPooling2D()(c1)
        c2 = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(p1)
        u1 = keras.layers.UpSampling2D()(c2)
        m1 = keras.layers.Concatenate()([u1, c1])
        c3 = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(m1)
        return keras.Model(inp, keras.layers.Conv2D(2, 1)(c3), name="unet")

    def compile_(model):
        model.compile(optimizer=keras.optimizers.Adam(1e-2),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])

    rng = np.random.default_rng(13)
    x = rng.standard_normal((4, 8, 8, 1)).astype("float32")
    y = (x[..., 0] > 0).astype("int32")
    return Fit("unet_fit", build, compile_, (x, y), {"batch_size": 4, "epochs": K_STEPS})


def steps_per_execution() -> Fit:
    """``compile(steps_per_execution=2)``: two steps per call of the train function, BatchNorm, a metric."""
    tf, keras = _tf()

    def build():
        keras.utils.set_random_seed(14)
        return keras.Sequential([keras.Input((6, 6, 2)), keras.layers.Conv2D(4, 3, padding="same"),
                                 keras.layers.BatchNormalization(), keras.layers.ReLU(),
                                 keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)], name="spe")

    def compile_(model):
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), steps_per_execution=2,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])

    rng = np.random.default_rng(14)
    x = rng.standard_normal((8, 6, 6, 2)).astype("float32")
    y = rng.integers(0, 3, (8,)).astype("int32")
    return Fit("steps_per_execution", build, compile_, (x, y), {"batch_size": 2, "epochs": K_STEPS})


FITS = {f.__name__: f for f in (wgan_gp, unet_fit, steps_per_execution)}


def lms_config(name: str):
    import lms

    fields, emulate = CONFIGS[name]
    return lms.LMSConfig(**fields), emulate


# ---- MirroredStrategy on two logical CPUs (own process) --------------------------------------

def mirrored_worker() -> dict[str, Any]:
    """Custom loop (``strategy.run``) and ``fit`` under MirroredStrategy on 2 logical CPUs, every config.

    Returns, per program and config: the differences to ``tf.function`` / plain
    ``fit`` (empty: bitwise equal), tensors swapped, and on which replicas' devices.
    """
    tf, keras = _tf()
    import lms

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    global_batch = 8
    rng = np.random.default_rng(21)
    x = rng.standard_normal((global_batch, 6)).astype("float32")
    y = rng.standard_normal((global_batch, 3)).astype("float32")

    def make_model():
        keras.utils.set_random_seed(21)
        # four layers: with lb=3, a live backward op lies far enough before the first layers' gradients (the
        # pruned gradient ops of the loss's division, which three layers needed, are no triggers)
        return keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                                 keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(16, activation="relu"),
                                 keras.layers.Dense(3)])

    with strategy.scope():
        model = make_model()
        opt = keras.optimizers.SGD(0.1, momentum=0.9)
        opt.build(model.trainable_variables)
    dist = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch))
    batch = next(iter(dist))

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            per_example = tf.reduce_mean(tf.square(model(x, training=True) - y), axis=-1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    def train_step(x, y):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step_fn, args=(x, y)), axis=None)

    loop = Loop("mirrored_loop", train_step, batch, model.weights + opt.variables)
    fit = Fit("mirrored_fit", make_model,
              lambda m: m.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse"),
              (x, y), {"batch_size": global_batch, "epochs": K_STEPS})

    def fit_run(enable):
        with strategy.scope():
            return fit.run(enable)

    import logging

    class Moved(logging.Handler):  # lms.tf.apply's warnings that an inserted op sorts to another position
        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.seen: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            if "another position" in record.getMessage():
                self.seen.append(record.getMessage())

    moved = Moved()
    logging.getLogger("lms.tf.apply").addHandler(moved)

    def replica(name: str) -> str:
        return "replica_1" if name.startswith("replica_1/") else "replica_0"

    out: dict[str, Any] = {}
    loop_base, _ = loop.run(tf.function)
    fit_base, _ = fit_run(None)
    for name in CONFIGS:
        config, emulate = lms_config(name)
        moved.seen = []
        got, step = loop.run(lambda f: lms.function(f, config=config, emulate=emulate))
        out[f"mirrored_loop/{name}"] = {
            "differences": loop_base.differences(got), "n_swapped": step.summary.n_swapped,
            "recomputed": list(step.summary.recomputed), "moved_inputs": moved.seen,
            "batch_size": step.summary.batch_size,
            "devices": sorted({replica(s.tensor) for s in step.summary.swapped}),
            "recomputed_devices": sorted({replica(t) for t in step.summary.recomputed}),
            # swap-ins with a trigger (a pinned memory schedule drops them: its pins order the swap-ins)
            "cross_replica_triggers": sum(("replica_1/" in si.trigger) != ("replica_1/" in si.consumers[0])
                                          for s in step.plan.swaps for si in s.swap_ins if si.trigger)}
        moved.seen = []
        got, model_ = fit_run(lambda m: lms.enable_lms(m, config, emulate=emulate))
        out[f"mirrored_fit/{name}"] = {"differences": fit_base.differences(got),
                                       "n_swapped": model_.lms.summary.n_swapped,
                                       "recomputed": list(model_.lms.summary.recomputed), "moved_inputs": moved.seen}
    return out


if __name__ == "__main__":  # python -m tests.tf.realworld mirrored
    from tuner.trial import exit_now

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if sys.argv[1:] == ["mirrored"]:
        print(json.dumps(mirrored_worker()))
        exit_now(0)  # without TF's teardown (about 2 s)
    else:
        sys.exit("usage: python -m tests.tf.realworld mirrored")
