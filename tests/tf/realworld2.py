"""Real-world training patterns, round two (issue 33): what bitwise equality broke on, at tiny sizes.

Programs from the keras-io examples and TF tutorials a new user would run,
each reduced to the pattern that mattered: knowledge distillation's
``compute_loss`` (a frozen teacher, cross-entropy plus the KL divergence of
softened softmaxes), SimCLR's NT-Xent (a transposed projection in a
``MatMul``) with a second tape and optimizer for a linear probe,
MobileNetV3's ``hard_swish``, a ViT block and ConvNeXt's block (GELU MLPs),
transfer learning with a frozen layer under ``fit`` on a ``tf.data``
pipeline, and an LSTM encoder-decoder. `CONFIG_CLASSES` are the four
configurations the issue ran, each with emulated and with device swap ops.

`BATCH_PROGRAMS` are steps whose first computed tensor's leading dimension is
not the batch (a masked autoencoder's patch rows, a conditional GAN's fake and
real images concatenated, an actor-critic's state vector): the summary must
report the batch the step ran at.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.tf.realworld import K_STEPS, Fit, Loop

# The configuration classes of issue 33, each with emulated and device swap ops.
CONFIG_CLASSES: dict[str, dict[str, Any]] = {
    "all": {"n_tensors": -1},
    "all-lb1-memory": {"n_tensors": -1, "lb": 1, "schedule": "memory"},
    "recompute-fused": {"recompute": "cheap", "fuse_swapins": True},
    "branches-memory-headroom": {"swap_branches": True, "schedule": "memory", "prefetch": "headroom"},
}
CONFIGS: dict[str, tuple[dict, bool]] = {
    f"{name}-{'emulated' if emulate else 'device'}": (fields, emulate)
    for name, fields in CONFIG_CLASSES.items() for emulate in (True, False)
}


def _tf():
    import keras
    import tensorflow as tf

    return tf, keras


def _opt_vars(*optimizers: Any) -> list:
    return [v for o in optimizers for v in o.variables]


# ---- custom training loops --------------------------------------------------------------

def simclr_two_tapes() -> Loop:
    """SimCLR: NT-Xent of two views' normalized projections (``p1 @ transpose(p2)``), one tape and Adam for
    the encoder and head, a second tape and SGD for a linear probe on the stopped features."""
    tf, keras = _tf()
    keras.utils.set_random_seed(31)
    encoder = keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, activation="relu")], name="encoder")
    head = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8)], name="projection")
    probe = keras.Sequential([keras.Input((16,)), keras.layers.Dense(3)], name="probe")
    c_opt, p_opt = keras.optimizers.Adam(1e-2), keras.optimizers.SGD(0.1)
    trainable = encoder.trainable_variables + head.trainable_variables
    c_opt.build(trainable)
    p_opt.build(probe.trainable_variables)
    ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(31)
    x = rng.standard_normal((6, 10)).astype("float32")
    noise = (0.1 * rng.standard_normal((2, 6, 10))).astype("float32")
    labels = rng.integers(0, 3, (6,)).astype("int32")

    def step(x, noise, labels):
        with tf.GradientTape() as tape:
            h1, h2 = encoder(x + noise[0], training=True), encoder(x + noise[1], training=True)
            p1 = tf.math.l2_normalize(head(h1, training=True), axis=1)
            p2 = tf.math.l2_normalize(head(h2, training=True), axis=1)
            sim = tf.matmul(p1, tf.transpose(p2)) / 0.1
            targets = tf.range(tf.shape(x)[0])
            c_loss = (ce(targets, sim) + ce(targets, tf.transpose(sim))) / 2
        c_opt.apply_gradients(zip(tape.gradient(c_loss, trainable), trainable))
        with tf.GradientTape() as tape:
            p_loss = ce(labels, probe(tf.stop_gradient(h1), training=True))
        p_opt.apply_gradients(zip(tape.gradient(p_loss, probe.trainable_variables), probe.trainable_variables))
        return c_loss, p_loss

    variables = encoder.weights + head.weights + probe.weights + _opt_vars(c_opt, p_opt)
    return Loop("simclr_two_tapes", step, (x, noise, labels), variables)


def vit_block() -> Loop:
    """ViT: patches by a strided Conv2D, position embedding, pre-norm MHA and a GELU MLP, Adam."""
    tf, keras = _tf()
    keras.utils.set_random_seed(32)
    inp = keras.Input((8, 8, 2))
    patches = keras.layers.Reshape((4, 8))(keras.layers.Conv2D(8, 4, strides=4)(inp))
    h = patches + keras.layers.Embedding(4, 8)(tf.range(4)[None, :])
    n = keras.layers.LayerNormalization(epsilon=1e-6)(h)
    h = h + keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)(n, n)
    n = keras.layers.LayerNormalization(epsilon=1e-6)(h)
    h = h + keras.layers.Dense(8)(keras.layers.Dense(16, activation="gelu")(n))
    out = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling1D()(h))
    model = keras.Model(inp, out, name="vit")
    opt = keras.optimizers.Adam(1e-3)
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(32)
    x = rng.standard_normal((4, 8, 8, 2)).astype("float32")
    y = rng.integers(0, 3, (4,)).astype("int32")

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return Loop("vit_block", step, (x, y), model.weights + opt.variables)


def convnext_block() -> Loop:
    """ConvNeXt: 7x7 depthwise conv, LayerNorm, pointwise GELU MLP, layer scale, residual; AdamW."""
    tf, keras = _tf()
    keras.utils.set_random_seed(33)
    inp = keras.Input((8, 8, 4))
    h = keras.layers.DepthwiseConv2D(7, padding="same")(inp)
    h = keras.layers.LayerNormalization(epsilon=1e-6)(h)
    h = keras.layers.Dense(4)(keras.layers.Dense(16, activation="gelu")(h))
    h = inp + 0.1 * h
    out = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(h))
    return adamw_classifier_loop("convnext_block", keras.Model(inp, out, name="convnext"), seed=33)


def adamw_classifier_loop(name: str, model: Any, *, seed: int, batch: int = 3, classes: int = 3) -> Loop:
    """A custom loop training `model` (a classifier of `classes` logits) with AdamW on one random batch."""
    tf, keras = _tf()
    opt = keras.optimizers.AdamW(1e-3, weight_decay=0.05)
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, *model.input_shape[1:])).astype("float32")
    y = rng.integers(0, classes, (batch,)).astype("int32")

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return Loop(name, step, (x, y), model.weights + opt.variables)


def lstm_seq2seq() -> Loop:
    """LSTM encoder-decoder (teacher forcing): the decoder starts from the encoder's states; Adam."""
    tf, keras = _tf()
    keras.utils.set_random_seed(34)
    enc_in, dec_in = keras.Input((5, 4)), keras.Input((4, 4))
    _, h, c = keras.layers.LSTM(6, return_state=True)(enc_in)
    dec = keras.layers.LSTM(6, return_sequences=True)(dec_in, initial_state=[h, c])
    model = keras.Model([enc_in, dec_in], keras.layers.Dense(4)(dec), name="seq2seq")
    opt = keras.optimizers.Adam(1e-2)
    opt.build(model.trainable_variables)
    rng = np.random.default_rng(34)
    a = rng.standard_normal((3, 5, 4)).astype("float32")
    b = rng.standard_normal((3, 4, 4)).astype("float32")
    y = rng.standard_normal((3, 4, 4)).astype("float32")

    def step(a, b, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model([a, b], training=True) - y))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return Loop("lstm_seq2seq", step, (a, b, y), model.weights + opt.variables)


LOOPS = {f.__name__: f for f in (simclr_two_tapes, vit_block, convnext_block, lstm_seq2seq)}


# ---- Keras fit ----------------------------------------------------------------------------

def _distiller_class():
    tf, keras = _tf()

    class Distiller(keras.Model):
        """keras-io knowledge distillation: a frozen teacher, ``compute_loss`` = alpha CE + (1 - alpha) KLD * T^2."""

        def __init__(self, student, teacher):
            super().__init__()
            self.student, self.teacher = student, teacher
            self.kld = keras.losses.KLDivergence()
            self.ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        def call(self, x):
            return self.student(x)

        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
            teacher = self.teacher(x, training=False)
            t = 10.0
            distill = self.kld(tf.nn.softmax(teacher / t, axis=1), tf.nn.softmax(y_pred / t, axis=1)) * t ** 2
            return 0.1 * self.ce(y, y_pred) + 0.9 * distill

    return Distiller


def distillation_fit() -> Fit:
    tf, keras = _tf()
    cls = _distiller_class()

    def build():
        keras.utils.set_random_seed(35)
        teacher = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, padding="same"),
                                    keras.layers.Flatten(), keras.layers.Dense(5)], name="teacher")
        teacher.trainable = False
        student = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, strides=2, padding="same"),
                                    keras.layers.Flatten(), keras.layers.Dense(5)], name="student")
        return cls(student, teacher)

    def compile_(model):
        model.compile(optimizer=keras.optimizers.Adam(1e-2))

    rng = np.random.default_rng(35)
    x = rng.uniform(size=(8, 8, 8, 1)).astype("float32")
    y = (np.arange(8) % 5).astype("int32")
    return Fit("distillation_fit", build, compile_, (x, y), {"batch_size": 8, "epochs": K_STEPS})


def hard_swish_fit() -> Fit:
    """MobileNetV3's blocks: conv, BatchNorm, ``hard_swish`` (``x * relu6(x + 3) / 6``), depthwise conv."""
    tf, keras = _tf()

    def build():
        keras.utils.set_random_seed(36)
        return keras.Sequential([
            keras.Input((8, 8, 2)), keras.layers.Conv2D(4, 3, padding="same"), keras.layers.BatchNormalization(),
            keras.layers.Activation("hard_swish"), keras.layers.DepthwiseConv2D(3, padding="same"),
            keras.layers.Activation("hard_swish"), keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3),
        ], name="hard_swish")

    def compile_(model):
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])

    rng = np.random.default_rng(36)
    x = rng.standard_normal((4, 8, 8, 2)).astype("float32")
    y = rng.integers(0, 3, (4,)).astype("int32")
    return Fit("hard_swish_fit", build, compile_, (x, y), {"batch_size": 4, "epochs": K_STEPS})


def frozen_fit_tf_data() -> Fit:
    """Transfer learning: a frozen layer between trainable ones (its filter gradient is computed and pruned),
    ``fit`` on a ``tf.data`` pipeline of batch 8 (the batch dimension is unknown when the step is traced)."""
    tf, keras = _tf()

    def build():
        keras.utils.set_random_seed(37)
        frozen = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="frozen")
        frozen.trainable = False  # between trainable layers: its input gradient is needed, its filter gradient not
        return keras.Sequential([keras.Input((6, 6, 2)), keras.layers.Conv2D(4, 3, padding="same"), frozen,
                                 keras.layers.Conv2D(4, 3, padding="same"), keras.layers.ReLU(),
                                 keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)], name="transfer")

    def compile_(model):
        model.compile(optimizer=keras.optimizers.SGD(0.05),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    rng = np.random.default_rng(37)
    x = rng.standard_normal((8, 6, 6, 2)).astype("float32")
    y = rng.integers(0, 2, (8,)).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    return Fit("frozen_fit_tf_data", build, compile_, (data,), {"epochs": K_STEPS})


FITS = {f.__name__: f for f in (distillation_fit, hard_swish_fit, frozen_fit_tf_data)}


# ---- steps whose first computed tensor does not lead with the batch ---------------------------

def _mae_class():
    tf, keras = _tf()

    class MaskedAutoencoder(keras.Model):
        """keras-io MAE's training step: image rows become patch rows (B * 16, 4), masked, encoded, decoded."""

        def __init__(self):
            super().__init__()
            self.encoder, self.decoder = keras.layers.Dense(8, activation="relu"), keras.layers.Dense(4)

        def call(self, patches):
            return self.decoder(self.encoder(patches))

        def train_step(self, data):
            x, mask = data
            patches, mask = tf.reshape(x, (-1, 4)), tf.reshape(mask, (-1, 1))  # (B * 16, 4), (B * 16, 1)
            with tf.GradientTape() as tape:
                recon = self(patches * (1.0 - mask), training=True)
                loss = tf.reduce_sum(tf.square(recon - patches) * mask) / (tf.reduce_sum(mask) + 1.0)
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            return {"loss": loss}

    return MaskedAutoencoder


def masked_autoencoder() -> Fit:
    """``fit`` on ``tf.data`` (batch 4): the first tensor swapped leads with B * 16 patch rows."""
    tf, keras = _tf()
    cls = _mae_class()

    def build():
        keras.utils.set_random_seed(38)
        model = cls()
        model.build((None, 4))
        return model

    rng = np.random.default_rng(38)
    x = rng.standard_normal((8, 64)).astype("float32")
    mask = (rng.uniform(size=(8, 16, 1)) > 0.75).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, mask)).batch(4)
    return Fit("masked_autoencoder", build, lambda m: m.compile(optimizer=keras.optimizers.SGD(0.1)), (data,),
               {"epochs": 2})


def _cgan_class():
    tf, keras = _tf()

    class ConditionalGAN(keras.Model):
        """keras-io conditional GAN's discriminator step: fake and real rows concatenated (2B)."""

        def __init__(self):
            super().__init__()
            self.generator = keras.Sequential([keras.Input((5,)), keras.layers.Dense(12, activation="relu"),
                                               keras.layers.Dense(8)])
            self.discriminator = keras.Sequential([keras.Input((8,)), keras.layers.Dense(12),
                                                   keras.layers.LeakyReLU(0.2), keras.layers.Dense(1)])
            self.bce = keras.losses.BinaryCrossentropy(from_logits=True)

        def call(self, x):
            return self.discriminator(x)

        def train_step(self, data):
            real = data
            fake = self.generator(real[:, :5] * 0.5)  # fixed noise, for a reproducible run
            images = tf.concat([fake, real], axis=0)  # (2B, 8)
            labels = tf.concat([tf.ones((tf.shape(real)[0], 1)), tf.zeros((tf.shape(real)[0], 1))], axis=0)
            with tf.GradientTape() as tape:
                loss = self.bce(labels, self.discriminator(images, training=True))
            variables = self.discriminator.trainable_variables
            self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
            return {"d_loss": loss}

    return ConditionalGAN


def conditional_gan() -> Fit:
    """``fit`` on ``tf.data`` (batch 4): the discriminator reads 2B rows."""
    tf, keras = _tf()
    cls = _cgan_class()

    def build():
        keras.utils.set_random_seed(39)
        return cls()

    real = np.random.default_rng(39).standard_normal((8, 8)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices(real).batch(4)
    return Fit("conditional_gan", build, lambda m: m.compile(optimizer=keras.optimizers.Adam(1e-3)), (data,),
               {"epochs": 2})


def actor_critic() -> Loop:
    """keras-io actor-critic: the model sees one state at a time (``expand_dims``): a batch of 1."""
    tf, keras = _tf()
    keras.utils.set_random_seed(40)
    inp = keras.Input((4,))
    common = keras.layers.Dense(16, activation="relu")(inp)
    model = keras.Model(inp, [keras.layers.Dense(2, activation="softmax")(common), keras.layers.Dense(1)(common)])
    opt = keras.optimizers.Adam(1e-2)
    opt.build(model.trainable_variables)
    state = np.asarray([0.1, -0.2, 0.05, 0.3], dtype="float32")

    def step(state):
        with tf.GradientTape() as tape:
            probs, value = model(tf.expand_dims(state, 0))
            advantage = 1.0 - value[0, 0]
            loss = -tf.math.log(probs[0, 0]) * tf.stop_gradient(advantage) + tf.square(advantage)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return Loop("actor_critic", step, (state,), model.weights + opt.variables)


# name -> (builder, the batch the summary must report)
BATCH_PROGRAMS = {"masked_autoencoder": (masked_autoencoder, 4), "conditional_gan": (conditional_gan, 4),
                  "actor_critic": (actor_critic, 1)}
