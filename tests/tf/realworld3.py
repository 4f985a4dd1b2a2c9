"""Real-world training patterns, round three (issue 55): the patterns the held-out check found bitwise, kept.

Each is a program a user writes, at tiny sizes: mixed precision under ``fit``
(``mixed_float16`` policy, Keras' automatic ``LossScaleOptimizer``), ``fit`` with
``steps_per_execution=4`` on a ``tf.data`` pipeline, gradient accumulation over
micro-batches in a custom loop (accumulator variables, ``assign_add``, one
apply), a functional model with two inputs and two outputs and loss weights, a
text transformer with a padding mask (``Embedding(mask_zero=True)`` into
``MultiHeadAttention``), and ConvNeXt's block as ``keras.applications.convnext``
writes it (a grouped ``Conv2D(dim, 7, groups=dim)``, not a depthwise one). keras.io's
CycleGAN is here too (`NOT_YET_BITWISE`), for the issue that keeps it open.
Each runs under every configuration class of `tests.tf.realworld2.CONFIGS`.
"""

from __future__ import annotations

import numpy as np

from tests.tf.realworld import K_STEPS, Fit, Loop
from tests.tf.realworld2 import _opt_vars, _tf, adamw_classifier_loop


# ---- custom training loops --------------------------------------------------------------

def gradient_accumulation() -> Loop:
    """Two micro-batches per step, gradients summed into accumulator variables, one Adam apply."""
    tf, keras = _tf()
    keras.utils.set_random_seed(41)
    model = keras.Sequential([keras.Input((6, 6, 2)), keras.layers.Conv2D(4, 3, padding="same", activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(3)], name="accum")
    opt = keras.optimizers.Adam(1e-2)
    opt.build(model.trainable_variables)
    accumulators = [tf.Variable(tf.zeros_like(v), trainable=False) for v in model.trainable_variables]
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(41)
    x = rng.standard_normal((4, 6, 6, 2)).astype("float32")
    y = rng.integers(0, 3, (4,)).astype("int32")

    def step(x, y):
        total = 0.0
        for i in range(2):  # micro-batches of 2
            xs, ys = x[2 * i: 2 * i + 2], y[2 * i: 2 * i + 2]
            with tf.GradientTape() as tape:
                loss = loss_fn(ys, model(xs, training=True))
            for acc, g in zip(accumulators, tape.gradient(loss, model.trainable_variables)):
                acc.assign_add(g)
            total += loss
        opt.apply_gradients(zip([a / 2.0 for a in accumulators], model.trainable_variables))
        for acc in accumulators:
            acc.assign(tf.zeros_like(acc))
        return total / 2.0

    return Loop("gradient_accumulation", step, (x, y), model.weights + _opt_vars(opt) + accumulators)


def convnext_grouped() -> Loop:
    """ConvNeXt's block as `keras.applications.convnext` builds it: a grouped 7x7 ``Conv2D``, LayerNorm, GELU
    MLP, residual; AdamW."""
    tf, keras = _tf()
    keras.utils.set_random_seed(42)
    dim = 8
    inp = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(dim, 4, strides=4)(inp)
    h = keras.layers.Conv2D(dim, 7, padding="same", groups=dim)(x)
    h = keras.layers.LayerNormalization(epsilon=1e-6)(h)
    h = keras.layers.Dense(dim)(keras.layers.Dense(4 * dim, activation="gelu")(h))
    x = keras.layers.Add()([x, h])
    model = keras.Model(inp, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(x)), name="convnext_g")
    return adamw_classifier_loop("convnext_grouped", model, seed=42)


def cyclegan() -> Loop:
    """keras.io's CycleGAN at tiny sizes: two ResNet generators (reflection padding, instance norm as
    ``GroupNormalization(groups=-1)``, ``Conv2DTranspose``), two PatchGAN discriminators, one persistent tape,
    four Adams (beta_1 0.5), adversarial + cycle + identity losses, batch 1."""
    tf, keras = _tf()
    layers = keras.layers
    keras.utils.set_random_seed(43)
    size, f0 = 16, 4
    init = keras.initializers.RandomNormal(mean=0.0, stddev=0.02)

    def reflect(x, p):  # noqa: ANN001, ANN202
        return layers.Lambda(lambda t: tf.pad(t, [[0, 0], [p, p], [p, p], [0, 0]], mode="REFLECT"))(x)

    def norm(x):  # noqa: ANN001, ANN202
        return layers.GroupNormalization(groups=-1, gamma_initializer=init)(x)

    def generator(name: str):  # noqa: ANN202
        inp = layers.Input((size, size, 3))
        x = layers.ReLU()(norm(layers.Conv2D(f0, 7, kernel_initializer=init, use_bias=False)(reflect(inp, 3))))
        x = layers.ReLU()(norm(layers.Conv2D(2 * f0, 3, strides=2, padding="same", kernel_initializer=init,
                                             use_bias=False)(x)))
        h = layers.ReLU()(norm(layers.Conv2D(2 * f0, 3, kernel_initializer=init, use_bias=False)(reflect(x, 1))))
        h = norm(layers.Conv2D(2 * f0, 3, kernel_initializer=init, use_bias=False)(reflect(h, 1)))
        x = layers.add([x, h])  # one residual block
        x = layers.ReLU()(norm(layers.Conv2DTranspose(f0, 3, strides=2, padding="same", kernel_initializer=init,
                                                      use_bias=False)(x)))
        x = layers.Conv2D(3, 7)(reflect(x, 3))
        return keras.Model(inp, layers.Activation("tanh")(x), name=name)

    def discriminator(name: str):  # noqa: ANN202
        inp = layers.Input((size, size, 3))
        x = layers.LeakyReLU(0.2)(layers.Conv2D(f0, 4, strides=2, padding="same", kernel_initializer=init)(inp))
        x = layers.LeakyReLU(0.2)(norm(layers.Conv2D(2 * f0, 4, strides=2, padding="same", kernel_initializer=init,
                                                     use_bias=False)(x)))
        return keras.Model(inp, layers.Conv2D(1, 4, padding="same", kernel_initializer=init)(x), name=name)

    gen_g, gen_f, disc_x, disc_y = generator("gen_G"), generator("gen_F"), discriminator("disc_X"), discriminator(
        "disc_Y")
    models = (gen_g, gen_f, disc_x, disc_y)
    opts = [keras.optimizers.Adam(2e-4, beta_1=0.5) for _ in models]
    for o, m in zip(opts, models):
        o.build(m.trainable_variables)
    mse, mae = keras.losses.MeanSquaredError(), keras.losses.MeanAbsoluteError()
    rng = np.random.default_rng(43)
    real_x, real_y = (rng.uniform(-1, 1, (1, size, size, 3)).astype("float32") for _ in range(2))

    def step(real_x, real_y):
        with tf.GradientTape(persistent=True) as tape:
            fake_y, fake_x = gen_g(real_x, training=True), gen_f(real_y, training=True)
            cycled_x, cycled_y = gen_f(fake_y, training=True), gen_g(fake_x, training=True)
            same_x, same_y = gen_f(real_x, training=True), gen_g(real_y, training=True)
            dx_real, dx_fake = disc_x(real_x, training=True), disc_x(fake_x, training=True)
            dy_real, dy_fake = disc_y(real_y, training=True), disc_y(fake_y, training=True)
            cycle = (mae(real_y, cycled_y) + mae(real_x, cycled_x)) * 10.0
            g_loss = mse(tf.ones_like(dy_fake), dy_fake) + cycle + mae(real_y, same_y) * 5.0
            f_loss = mse(tf.ones_like(dx_fake), dx_fake) + cycle + mae(real_x, same_x) * 5.0
            dx_loss = (mse(tf.ones_like(dx_real), dx_real) + mse(tf.zeros_like(dx_fake), dx_fake)) * 0.5
            dy_loss = (mse(tf.ones_like(dy_real), dy_real) + mse(tf.zeros_like(dy_fake), dy_fake)) * 0.5
        for loss, model, opt in zip((g_loss, f_loss, dx_loss, dy_loss), models, opts):
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return g_loss, f_loss, dx_loss, dy_loss

    variables = [v for m in models for v in m.weights] + _opt_vars(*opts)
    return Loop("cyclegan", step, (real_x, real_y), variables)


LOOPS = {f.__name__: f for f in (gradient_accumulation, convnext_grouped)}
#: Open in issue 55, not run by the corpus test: bitwise in fresh single-threaded processes at small sizes,
#: but in full-suite runs (xdist workers) it differed under "all" (25 variables) and "recompute-fused" (1 value).
NOT_YET_BITWISE = {"cyclegan": cyclegan}


# ---- Keras fit ----------------------------------------------------------------------------

def mixed_precision_fit() -> Fit:
    """``mixed_float16`` as the global policy while the model is built and compiled (Keras wraps the optimizer
    in a ``LossScaleOptimizer``), a float32 head."""
    tf, keras = _tf()

    def build():
        keras.utils.set_random_seed(43)
        keras.mixed_precision.set_global_policy("mixed_float16")
        return keras.Sequential([keras.Input((6, 6, 2)), keras.layers.Conv2D(4, 3, padding="same", activation="relu"),
                                 keras.layers.Flatten(), keras.layers.Dense(8, activation="relu"),
                                 keras.layers.Dense(3, dtype="float32")], name="mixed_fit")

    def compile_(model):
        try:
            model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        finally:
            keras.mixed_precision.set_global_policy("float32")

    rng = np.random.default_rng(43)
    x = rng.standard_normal((4, 6, 6, 2)).astype("float32")
    y = rng.integers(0, 3, (4,)).astype("int32")
    return Fit("mixed_precision_fit", build, compile_, (x, y), {"batch_size": 4, "epochs": K_STEPS})


def steps_per_execution_tf_data() -> Fit:
    """``compile(steps_per_execution=4)`` and ``fit`` on a batched ``tf.data`` pipeline, BatchNorm, a metric."""
    tf, keras = _tf()

    def build():
        keras.utils.set_random_seed(44)
        return keras.Sequential([keras.Input((6, 6, 2)), keras.layers.Conv2D(4, 3, padding="same"),
                                 keras.layers.BatchNormalization(), keras.layers.ReLU(),
                                 keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)], name="spe4")

    def compile_(model):
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), steps_per_execution=4,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])

    rng = np.random.default_rng(44)
    x = rng.standard_normal((16, 6, 6, 2)).astype("float32")
    y = rng.integers(0, 3, (16,)).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(2)
    return Fit("steps_per_execution_tf_data", build, compile_, (data,), {"epochs": K_STEPS})


def two_inputs_two_outputs() -> Fit:
    """A functional model with an image and a vector input, a class and a regression output, a loss per
    output and loss weights, a metric on one output."""
    tf, keras = _tf()

    def build():
        keras.utils.set_random_seed(45)
        image, meta = keras.Input((6, 6, 2), name="image"), keras.Input((4,), name="meta")
        h = keras.layers.Flatten()(keras.layers.Conv2D(4, 3, activation="relu")(image))
        h = keras.layers.Concatenate()([h, keras.layers.Dense(4, activation="relu")(meta)])
        h = keras.layers.Dense(8, activation="relu")(h)
        return keras.Model({"image": image, "meta": meta},
                           {"cls": keras.layers.Dense(3, name="cls")(h), "reg": keras.layers.Dense(1, name="reg")(h)},
                           name="two_in_two_out")

    def compile_(model):
        model.compile(optimizer=keras.optimizers.Adam(1e-2),
                      loss={"cls": keras.losses.SparseCategoricalCrossentropy(from_logits=True), "reg": "mse"},
                      loss_weights={"cls": 1.0, "reg": 0.3}, metrics={"cls": ["accuracy"]})

    rng = np.random.default_rng(45)
    xs = {"image": rng.standard_normal((4, 6, 6, 2)).astype("float32"),
          "meta": rng.standard_normal((4, 4)).astype("float32")}
    ys = {"cls": rng.integers(0, 3, (4,)).astype("int32"), "reg": rng.standard_normal((4, 1)).astype("float32")}
    return Fit("two_inputs_two_outputs", build, compile_, (xs, ys), {"batch_size": 4, "epochs": K_STEPS})


def masked_text_transformer() -> Fit:
    """Token embeddings with ``mask_zero=True`` (padded sequences), a self-attention block that takes the mask,
    a GELU feed-forward, masked pooling, a classifier."""
    tf, keras = _tf()

    def build():
        keras.utils.set_random_seed(46)
        tokens = keras.Input((10,), dtype="int32")
        e = keras.layers.Embedding(20, 8, mask_zero=True)(tokens)
        a = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)(e, e)
        h = keras.layers.LayerNormalization()(keras.layers.Add()([e, a]))
        f = keras.layers.Dense(8)(keras.layers.Dense(16, activation="gelu")(h))
        h = keras.layers.LayerNormalization()(keras.layers.Add()([h, f]))
        return keras.Model(tokens, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(h)), name="masked")

    def compile_(model):
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])

    rng = np.random.default_rng(46)
    x = rng.integers(1, 20, (4, 10)).astype("int32")
    for row, length in enumerate((10, 7, 4, 2)):
        x[row, length:] = 0  # padding
    y = rng.integers(0, 2, (4,)).astype("int32")
    return Fit("masked_text_transformer", build, compile_, (x, y), {"batch_size": 4, "epochs": K_STEPS})


FITS = {f.__name__: f for f in (mixed_precision_fit, steps_per_execution_tf_data, two_inputs_two_outputs,
                                masked_text_transformer)}
