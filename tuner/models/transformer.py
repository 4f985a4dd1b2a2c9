"""``gpt2_small``: a GPT-2-small-like decoder language model built from Keras layers.

Architecture (Radford et al. 2019, the 124M model): token + learned position
embeddings, ``n_layers`` pre-LayerNorm blocks ::

    h = h + MultiHeadAttention(LN(h), causal)      # 4*d^2 + 4*d weights
    h = h + Dense(d)(gelu_tanh(Dense(4d)(LN(h))))  # 8*d^2 + 5*d weights

a final LayerNorm, and logits from the token embedding matrix (tied). With the
defaults (12 layers, d_model 768, 12 heads, vocab 50257, 1024 positions) the
model has 124,439,808 parameters, the published GPT-2 small count:
wte 38,597,376 + wpe 786,432 + 12 x 7,087,872 + final LN 1,536.
See `gpt2_param_count`.

Inputs are int32 token ids ``(seq_len,)``; labels the next token at each
position (the same stream shifted by one). Loss: token-mean softmax
cross-entropy; optimizer Adam. Dropout defaults to 0 so runs are
deterministic. Nothing is downloaded; weights are random (normal, std 0.02).
"""

from __future__ import annotations

import functools
from functools import partial
from typing import Any

import numpy as np

from .base import Workload, adam, check_batch_size, float_option, int_option, sparse_softmax_cross_entropy

__all__ = ["gpt2_small", "gpt2_param_count", "GPT2_SMALL_PARAMS"]

GPT2_SMALL_PARAMS = 124_439_808  # GPT-2 small (HF "gpt2"), tied input/output embedding


def gpt2_small(*, seq_len: int = 1024, n_layers: int = 12, d_model: int = 768, n_heads: int = 12,
               vocab_size: int = 50257, n_positions: int = 1024, dropout: float = 0.0,
               learning_rate: float = 2.5e-4) -> Workload:
    """GPT-2-small-like causal LM (12 layers, 768 dims, 12 heads, vocab 50257), tied embeddings."""
    seq_len = int_option("gpt2_small", "seq_len", seq_len)
    n_layers = int_option("gpt2_small", "n_layers", n_layers)
    d_model = int_option("gpt2_small", "d_model", d_model)
    n_heads = int_option("gpt2_small", "n_heads", n_heads)
    vocab_size = int_option("gpt2_small", "vocab_size", vocab_size, minimum=2)
    n_positions = int_option("gpt2_small", "n_positions", n_positions)
    dropout = float_option("gpt2_small", "dropout", dropout, inclusive=True)
    learning_rate = float_option("gpt2_small", "learning_rate", learning_rate)
    if d_model % n_heads:
        raise ValueError(f"gpt2_small: option d_model={d_model} does not fit n_heads={n_heads}; "
                         f"allowed: d_model a multiple of n_heads")
    if seq_len > n_positions:
        raise ValueError(f"gpt2_small: option seq_len={seq_len} does not fit the model; allowed: "
                         f"seq_len <= n_positions={n_positions} (raise n_positions for longer sequences)")
    if dropout >= 1.0:
        raise ValueError(f"gpt2_small: option dropout={dropout!r} out of range; allowed: 0 <= dropout < 1")
    return Workload(
        name="gpt2_small",
        description=f"GPT-2-like decoder LM, {n_layers} layers, d_model {d_model}, {n_heads} heads, "
                    f"vocab {vocab_size}, seq_len {seq_len}, tied embeddings, Adam",
        build_model=partial(_build_gpt2, seq_len=seq_len, n_layers=n_layers, d_model=d_model,
                            n_heads=n_heads, vocab_size=vocab_size, n_positions=n_positions, dropout=dropout),
        loss_fn=sparse_softmax_cross_entropy,
        make_optimizer=partial(adam, learning_rate=learning_rate),
        x_shape=(seq_len,), y_shape=(seq_len,), x_dtype="int32", y_dtype="int32",
        make_batch=partial(_token_batch, seq_len=seq_len, vocab_size=vocab_size),
        default_batch=1,
        options={"seq_len": seq_len, "n_layers": n_layers, "d_model": d_model, "n_heads": n_heads,
                 "vocab_size": vocab_size, "n_positions": n_positions, "dropout": dropout,
                 "learning_rate": learning_rate},
        growable={"seq_len": 128},  # up to n_positions (a longer sequence is refused)
    )


def gpt2_param_count(*, n_layers: int = 12, d_model: int = 768, vocab_size: int = 50257,
                     n_positions: int = 1024) -> int:
    """Weights of the model `gpt2_small` builds (4*d_model MLP, tied output)."""
    per_block = (2 * d_model                            # ln_1
                 + 4 * d_model * d_model + 4 * d_model  # q, k, v, output projections
                 + 2 * d_model                          # ln_2
                 + 8 * d_model * d_model + 5 * d_model)  # fc (d->4d) + proj (4d->d)
    return vocab_size * d_model + n_positions * d_model + n_layers * per_block + 2 * d_model


# ----------------------------------------------------------------- builder

def _gelu_tanh(x: Any) -> Any:
    import keras

    return keras.activations.gelu(x, approximate=True)


@functools.cache
def _layer_classes() -> tuple[type, type]:
    """The two custom layers, defined on first use so this module imports without Keras."""
    import keras
    from keras import ops

    class TiedEmbedding(keras.layers.Embedding):
        """Token embedding; ``reverse=True`` maps hidden states to vocabulary logits with
        the same matrix (weight tying, as GPT-2)."""

        def call(self, inputs: Any, reverse: bool = False) -> Any:
            if reverse:
                return ops.matmul(inputs, ops.transpose(self.embeddings))
            return super().call(inputs)

        def compute_output_spec(self, inputs: Any, reverse: bool = False) -> Any:
            if reverse:
                return keras.KerasTensor((*inputs.shape[:-1], self.input_dim), dtype=self.compute_dtype)
            return super().compute_output_spec(inputs)

    class PositionEmbedding(keras.layers.Layer):
        """Adds a learned embedding of each position ``0..seq_len-1``."""

        def __init__(self, n_positions: int, initializer: Any, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.n_positions = n_positions
            self.initializer = initializer

        def build(self, input_shape: Any) -> None:
            self.embeddings = self.add_weight(shape=(self.n_positions, input_shape[-1]),
                                              initializer=self.initializer, name="embeddings")

        def call(self, inputs: Any) -> Any:
            seq_len, width = inputs.shape[-2], inputs.shape[-1]
            return inputs + ops.slice(self.embeddings, (0, 0), (seq_len, width))

    return TiedEmbedding, PositionEmbedding


def _build_gpt2(*, seq_len: int, n_layers: int, d_model: int, n_heads: int, vocab_size: int,
                n_positions: int, dropout: float) -> Any:
    import keras

    tied_embedding_cls, position_embedding_cls = _layer_classes()
    init = keras.initializers.RandomNormal(stddev=0.02)
    layers = keras.layers

    tokens = keras.Input((seq_len,), dtype="int32", name="x")
    wte = tied_embedding_cls(vocab_size, d_model, embeddings_initializer=init, name="wte")
    h = wte(tokens)
    h = position_embedding_cls(n_positions, init, name="wpe")(h)
    if dropout:
        h = layers.Dropout(dropout, name="embd_dropout")(h)
    for i in range(n_layers):
        a = layers.LayerNormalization(epsilon=1e-5, name=f"h{i}_ln_1")(h)
        a = layers.MultiHeadAttention(n_heads, d_model // n_heads, dropout=dropout, kernel_initializer=init,
                                      name=f"h{i}_attn")(a, a, use_causal_mask=True)
        if dropout:
            a = layers.Dropout(dropout, name=f"h{i}_attn_dropout")(a)
        h = layers.Add(name=f"h{i}_add_1")([h, a])
        m = layers.LayerNormalization(epsilon=1e-5, name=f"h{i}_ln_2")(h)
        m = layers.Dense(4 * d_model, activation=_gelu_tanh, kernel_initializer=init, name=f"h{i}_mlp_fc")(m)
        m = layers.Dense(d_model, kernel_initializer=init, name=f"h{i}_mlp_proj")(m)
        if dropout:
            m = layers.Dropout(dropout, name=f"h{i}_mlp_dropout")(m)
        h = layers.Add(name=f"h{i}_add_2")([h, m])
    h = layers.LayerNormalization(epsilon=1e-5, name="ln_f")(h)
    logits = wte(h, reverse=True)
    return keras.Model(tokens, logits, name="gpt2_small")


def _token_batch(batch_size: int, seed: int = 0, *, seq_len: int, vocab_size: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Random token streams; ``y[:, t]`` is the token after ``x[:, t]``."""
    batch_size = check_batch_size("gpt2_small", batch_size)
    stream = np.random.default_rng(seed).integers(0, vocab_size, size=(batch_size, seq_len + 1), dtype=np.int32)
    return np.ascontiguousarray(stream[:, :-1]), np.ascontiguousarray(stream[:, 1:])
