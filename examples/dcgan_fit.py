"""A GAN that overrides ``train_step`` (two tapes, two optimizers), trained with ``model.fit``.

Adapted from keras.io's "DCGAN to generate face images" (CelebA 64x64), scaled to a
CPU: ``image_size`` x ``image_size`` RGB images (synthetic, no download), the same
discriminator (three strided convolutions) and generator (a dense projection, three
transposed convolutions), and keras.io's ``GAN(keras.Model)`` with its own
``compile(d_optimizer, g_optimizer, loss_fn)`` and ``train_step``.

Tune it (the tuner runs this ``fit``, the GAN's own ``train_step`` included)::

    python -m tuner search --model examples/dcgan_fit.py:make_workload --budget-from-batch 8 --study dcgan

Run it with the recommendation::

    python examples/dcgan_fit.py studies/dcgan/recommended.json

`examples/gan_loop.py` is the same GAN as a custom training loop (``Workload(train_step=...)``).
"""

from __future__ import annotations

import sys
from functools import partial

import numpy as np

from tuner.models import Workload

LATENT_DIM = 128


def discriminator(image_size: int, width: int) -> object:
    import keras
    from keras import layers

    return keras.Sequential([
        keras.Input(shape=(image_size, image_size, 3)),
        layers.Conv2D(width, 4, strides=2, padding="same"), layers.LeakyReLU(0.2),
        layers.Conv2D(2 * width, 4, strides=2, padding="same"), layers.LeakyReLU(0.2),
        layers.Conv2D(2 * width, 4, strides=2, padding="same"), layers.LeakyReLU(0.2),
        layers.Flatten(), layers.Dropout(0.2), layers.Dense(1, activation="sigmoid"),
    ], name="discriminator")


def generator(image_size: int, width: int) -> object:
    import keras
    from keras import layers

    side = image_size // 8
    return keras.Sequential([
        keras.Input(shape=(LATENT_DIM,)),
        layers.Dense(side * side * 2 * width), layers.Reshape((side, side, 2 * width)),
        layers.Conv2DTranspose(2 * width, 4, strides=2, padding="same"), layers.LeakyReLU(0.2),
        layers.Conv2DTranspose(4 * width, 4, strides=2, padding="same"), layers.LeakyReLU(0.2),
        layers.Conv2DTranspose(8 * width, 4, strides=2, padding="same"), layers.LeakyReLU(0.2),
        layers.Conv2D(3, 5, padding="same", activation="sigmoid"),
    ], name="generator")


def gan_class() -> type:
    """keras.io's ``GAN`` model (defined when Keras is imported)."""
    import keras
    import tensorflow as tf

    class GAN(keras.Model):
        def __init__(self, discriminator, generator, latent_dim):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.latent_dim = latent_dim
            self.seed_generator = keras.random.SeedGenerator(1337)

        def compile(self, d_optimizer, g_optimizer, loss_fn):
            super().compile()
            self.d_optimizer = d_optimizer
            self.g_optimizer = g_optimizer
            self.loss_fn = loss_fn
            self.d_loss_metric = keras.metrics.Mean(name="d_loss")
            self.g_loss_metric = keras.metrics.Mean(name="g_loss")

        @property
        def metrics(self):
            return [self.d_loss_metric, self.g_loss_metric]

        def train_step(self, real_images):
            batch_size = tf.shape(real_images)[0]
            random_latent_vectors = keras.random.normal(shape=(batch_size, self.latent_dim),
                                                        seed=self.seed_generator)
            generated_images = self.generator(random_latent_vectors)
            combined_images = tf.concat([generated_images, real_images], axis=0)
            labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
            labels += 0.05 * tf.random.uniform(tf.shape(labels))
            with tf.GradientTape() as tape:
                predictions = self.discriminator(combined_images)
                d_loss = self.loss_fn(labels, predictions)
            grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
            random_latent_vectors = keras.random.normal(shape=(batch_size, self.latent_dim),
                                                        seed=self.seed_generator)
            misleading_labels = tf.zeros((batch_size, 1))
            with tf.GradientTape() as tape:
                predictions = self.discriminator(self.generator(random_latent_vectors))
                g_loss = self.loss_fn(misleading_labels, predictions)
            grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
            self.d_loss_metric.update_state(d_loss)
            self.g_loss_metric.update_state(g_loss)
            return {"d_loss": self.d_loss_metric.result(), "g_loss": self.g_loss_metric.result()}

    return GAN


def fit_model(image_size: int = 32, width: int = 32) -> object:
    """keras.io's GAN, compiled as its script compiles it (two Adam optimizers, binary cross-entropy)."""
    import keras

    keras.utils.set_random_seed(0)
    gan = gan_class()(discriminator(image_size, width), generator(image_size, width), LATENT_DIM)
    gan.compile(d_optimizer=keras.optimizers.Adam(1e-4), g_optimizer=keras.optimizers.Adam(1e-4),
                loss_fn=keras.losses.BinaryCrossentropy())
    return gan


def make_batch(batch_size: int, seed: int = 0, *, image_size: int = 32) -> np.ndarray:
    """One batch of real images, as ``fit`` receives it (images only: the GAN makes its own labels)."""
    return np.random.default_rng(seed).random((batch_size, image_size, image_size, 3), dtype=np.float32)


def check_options(image_size: int, width: int) -> None:
    if not isinstance(image_size, int) or image_size < 8 or image_size % 8:
        raise ValueError(f"option image_size={image_size!r} must be a multiple of 8 (three 2x upsamplings)")
    if not isinstance(width, int) or width < 1:
        raise ValueError(f"option width={width!r} must be a positive integer")


def make_workload(*, image_size: int = 32, width: int = 32) -> Workload:
    check_options(image_size, width)
    return Workload(
        name="dcgan_fit", description=f"keras.io DCGAN (train_step override) under model.fit, {image_size}x{image_size}",
        fit_model=partial(fit_model, image_size, width), make_batch=partial(make_batch, image_size=image_size),
        default_batch=4, options={"image_size": image_size, "width": width})


if __name__ == "__main__":
    from run_fit import run_fit  # beside this file

    sys.exit(run_fit(make_workload(), sys.argv[1:]))
