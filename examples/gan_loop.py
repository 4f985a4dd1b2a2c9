"""keras.io's DCGAN as a custom training loop: ``Workload(train_step=...)``.

The step owns its two models and two optimizers (built before the first trace, so
tracing creates no variables) and is undecorated: the tuner wraps it with
``lms.function``, as the script does. ``step(real_images)`` is called on one batch.

    python -m tuner search --model examples/gan_loop.py:make_workload --budget-from-batch 8 --study gan_loop
    python examples/gan_loop.py studies/gan_loop/recommended.json
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial

from dcgan_fit import LATENT_DIM, check_options, discriminator, generator, make_batch  # beside this file

from tuner.models import Workload


def train_step(image_size: int = 32, width: int = 32):
    """A fresh GAN and its undecorated step ``step(real_images) -> (d_loss, g_loss)``."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    disc, gen = discriminator(image_size, width), generator(image_size, width)
    d_opt, g_opt = keras.optimizers.Adam(1e-4), keras.optimizers.Adam(1e-4)
    d_opt.build(disc.trainable_variables)
    g_opt.build(gen.trainable_variables)
    loss_fn = keras.losses.BinaryCrossentropy()
    seed = keras.random.SeedGenerator(1337)

    def step(real_images):
        batch_size = tf.shape(real_images)[0]
        latent = keras.random.normal(shape=(batch_size, LATENT_DIM), seed=seed)
        combined = tf.concat([gen(latent), real_images], axis=0)
        labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = loss_fn(labels, disc(combined))
        d_opt.apply_gradients(zip(tape.gradient(d_loss, disc.trainable_variables), disc.trainable_variables))
        latent = keras.random.normal(shape=(batch_size, LATENT_DIM), seed=seed)
        with tf.GradientTape() as tape:
            g_loss = loss_fn(tf.zeros((batch_size, 1)), disc(gen(latent)))
        g_opt.apply_gradients(zip(tape.gradient(g_loss, gen.trainable_variables), gen.trainable_variables))
        return d_loss, g_loss

    return step


def make_workload(*, image_size: int = 32, width: int = 32) -> Workload:
    check_options(image_size, width)
    return Workload(
        name="gan_loop", description=f"keras.io DCGAN as a custom loop (lms.function), {image_size}x{image_size}",
        train_step=partial(train_step, image_size, width), make_batch=partial(make_batch, image_size=image_size),
        default_batch=4, options={"image_size": image_size, "width": width})


def main(argv: list[str]) -> int:
    """``python examples/gan_loop.py CONFIG [BATCH] [STEPS]``: the loop under lms.function, each step's peak."""
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    import lms
    from lms.tf.measure import measure_step

    if not argv:
        print("usage: CONFIG [BATCH] [STEPS]  (CONFIG: recommended.json, a config file, auto or off)")
        return 2
    config = lms.LMSConfig(n_tensors=0) if argv[0] == "off" else argv[0] if argv[0] == "auto" \
        else lms.LMSConfig.load(argv[0])
    tuned = getattr(config, "tuned", None) or {}
    workload = make_workload()
    batch = int(argv[1]) if len(argv) > 1 else int(tuned.get("batch_size") or workload.default_batch)
    steps = int(argv[2]) if len(argv) > 2 else 5
    step = lms.function(workload.train_step(), config=config, budget=None if argv[0] != "auto" else None)
    m = measure_step(step, [workload.make_batch(batch, 0)], warmup=1, steps=steps)
    print(json.dumps({"batch": batch, "peaks_bytes": list(m.step_peaks_bytes), "max_bytes": m.peak_device_bytes,
                      "n_swapped": step.summary.n_swapped if step.summary else 0,
                      "usable_bytes": tuned.get("usable_bytes")}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
