"""Tiny user programs for the tests of `Workload(fit_model=...)` and `Workload(train_step=...)` (issue 51).

``tiny_fit``: a functional conv net compiled with two metrics, under ``model.fit``; ``tiny_gan``: a model
overriding ``train_step`` with two tapes and two optimizers, under ``model.fit``; ``tiny_loop``: a custom
step owning a model and an optimizer, under ``lms.function``. Images 16x16: a trial runs in seconds.
"""

from __future__ import annotations


import numpy as np

from tuner.models import Workload

SIDE = 16


def _convnet(name: str, outputs: int) -> object:
    import keras
    from keras import layers

    inputs = keras.Input((SIDE, SIDE, 3))
    x = layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
    x = layers.Conv2D(8, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    return keras.Model(inputs, layers.Dense(outputs)(layers.GlobalAveragePooling2D()(x)), name=name)


def _fit_model() -> object:
    import keras

    keras.utils.set_random_seed(0)
    model = _convnet("tiny_fit", 5)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def _xy(batch_size: int, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    return (rng.random((batch_size, SIDE, SIDE, 3), dtype=np.float32),
            rng.integers(0, 5, size=(batch_size,), dtype=np.int32))


def _images(batch_size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((batch_size, SIDE, SIDE, 3), dtype=np.float32)


def tiny_fit() -> Workload:
    return Workload(name="tiny_fit", description="a conv net under model.fit", fit_model=_fit_model,
                    make_batch=_xy, default_batch=4)


def _gan_model() -> object:
    import keras
    import tensorflow as tf

    class TwoTapes(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.critic = _convnet("critic", 1)
            self.maker = keras.Sequential([keras.Input((SIDE, SIDE, 3)),
                                           keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
                                           keras.layers.Conv2D(3, 3, padding="same")], name="maker")

        def compile(self, c_opt, m_opt):
            super().compile()
            self.c_opt, self.m_opt = c_opt, m_opt

        def train_step(self, images):
            with tf.GradientTape() as tape:
                c_loss = tf.reduce_mean(self.critic(self.maker(images))) - tf.reduce_mean(self.critic(images))
            grads = tape.gradient(c_loss, self.critic.trainable_weights)
            self.c_opt.apply_gradients(zip(grads, self.critic.trainable_weights))
            with tf.GradientTape() as tape:
                m_loss = -tf.reduce_mean(self.critic(self.maker(images)))
            grads = tape.gradient(m_loss, self.maker.trainable_weights)
            self.m_opt.apply_gradients(zip(grads, self.maker.trainable_weights))
            return {"c_loss": c_loss, "m_loss": m_loss}

    keras.utils.set_random_seed(0)
    model = TwoTapes()
    model.compile(keras.optimizers.Adam(1e-3), keras.optimizers.Adam(1e-3))
    return model


def tiny_gan() -> Workload:
    return Workload(name="tiny_gan", description="train_step overridden, two tapes, under model.fit",
                    fit_model=_gan_model, make_batch=_images, default_batch=4)


def _loop_step() -> object:
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = _convnet("tiny_loop", 5)
    opt = keras.optimizers.SGD(0.01)
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return step


def tiny_loop() -> Workload:
    return Workload(name="tiny_loop", description="a custom step under lms.function", train_step=_loop_step,
                    make_batch=_xy, default_batch=4)


def bad_batch() -> Workload:
    """A program whose batch does not have the batch size as its first dimension."""
    return Workload(name="bad_batch", description="x", train_step=_loop_step,
                    make_batch=lambda b, seed=0: _xy(b + 1, seed), default_batch=4)


