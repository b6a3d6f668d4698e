"""A tiny causal transformer language model (decoder-only, pre-LayerNorm; Radford et al. 2019).

``h_0 = E[x_t] + P[t]`` (learned token and position embeddings), then ``layers`` blocks

    h = h + Attn(LN(h))        causal multi-head self-attention, ``heads`` heads of d/heads
    h = h + MLP(LN(h))         dense(mlp_ratio d) -> GELU -> dense(d)

and ``logits = W_out LN(h)`` over the vocabulary (``num_classes``).  Attention is
``softmax(Q K^T / sqrt(d_head) + M) V`` with ``M_ts = -inf`` for ``s > t`` (no position attends to
the future), so ``logits[:, t]`` predicts token t + 1 from tokens 0..t.  Inputs are int tokens
[B, T] with T <= ``input_shape[0]`` (the context length the position table is built for).
Dropout (``dropout`` > 0) is applied to the attention output and the MLP output in training mode.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from cconv.models.base import dropout_key, fraction, positive_int
from cconv.models.init import lecun_normal, normal


class Block(nnx.Module):
    """One pre-LN transformer block: causal self-attention and an MLP, each residual."""

    def __init__(self, d: int, heads: int, mlp_ratio: int, dropout: float, *, rngs: nnx.Rngs):
        self.heads, self.rate = heads, dropout
        self.ln1 = nnx.LayerNorm(d, rngs=rngs)
        self.qkv = nnx.Linear(d, 3 * d, kernel_init=lecun_normal, rngs=rngs)
        self.proj = nnx.Linear(d, d, kernel_init=lecun_normal, rngs=rngs)
        self.ln2 = nnx.LayerNorm(d, rngs=rngs)
        self.fc = nnx.Linear(d, mlp_ratio * d, kernel_init=lecun_normal, rngs=rngs)
        self.out = nnx.Linear(mlp_ratio * d, d, kernel_init=lecun_normal, rngs=rngs)
        self.drop = nnx.Dropout(dropout)

    def attention(self, h: jax.Array) -> jax.Array:
        b, t, d = h.shape
        q, k, v = jnp.split(self.qkv(h).reshape(b, t, 3 * self.heads, d // self.heads), 3, axis=2)
        scores = jnp.einsum("bthd,bshd->bhts", q, k) / jnp.sqrt(d // self.heads).astype(h.dtype)
        causal = jnp.tril(jnp.ones((t, t), bool))
        scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
        weights = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(h.dtype)
        return self.proj(jnp.einsum("bhts,bshd->bthd", weights, v).reshape(b, t, d))

    def __call__(self, h: jax.Array, train: bool, key: jax.Array | None) -> jax.Array:
        a = self.attention(self.ln1(h))
        k = dropout_key(key, 0, self.rate, train)
        h = h + (self.drop(a, deterministic=False, rngs=k) if k is not None else a)
        m = self.out(jax.nn.gelu(self.fc(self.ln2(h))))
        k = dropout_key(key, 1, self.rate, train)
        return h + (self.drop(m, deterministic=False, rngs=k) if k is not None else m)


class TransformerLM(nnx.Module):
    """Token + position embeddings, ``layers`` pre-LN blocks, final LN, untied output layer."""

    input_dtype = "int32"  # token ids (``cconv.models.input_dtype``)

    def __init__(
        self,
        input_shape,
        num_classes: int,
        *,
        rngs: nnx.Rngs,
        d_model: int = 64,
        layers: int = 2,
        heads: int = 4,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
    ):
        if len(input_shape) != 1 or input_shape[0] < 1:
            raise ValueError(
                f"model 'transformer' needs token inputs of shape (T,), got input_shape {tuple(input_shape)}"
            )
        d_model, layers, heads, mlp_ratio = (
            positive_int("transformer", k, v)
            for k, v in (("d_model", d_model), ("layers", layers), ("heads", heads), ("mlp_ratio", mlp_ratio))
        )
        if d_model % heads:
            raise ValueError(
                f"transformer needs positive d_model, layers, heads, mlp_ratio with "
                f"heads dividing d_model, got {d_model}, {layers}, {heads}, {mlp_ratio}"
            )
        dropout = fraction("transformer", "dropout", dropout)
        self.context, self.layers = int(input_shape[0]), int(layers)
        self.embed = nnx.Embed(num_classes, d_model, embedding_init=normal(0.02), rngs=rngs)
        self.pos = nnx.Param(normal(0.02)(rngs.params(), (self.context, d_model)))
        for i in range(self.layers):
            setattr(self, f"block{i}", Block(d_model, heads, mlp_ratio, float(dropout), rngs=rngs))
        self.ln_f = nnx.LayerNorm(d_model, rngs=rngs)
        self.head = nnx.Linear(d_model, num_classes, kernel_init=lecun_normal, rngs=rngs)

    def __call__(self, x: jax.Array, train: bool, key: jax.Array | None = None) -> jax.Array:
        t = x.shape[1]
        if t > self.context:
            raise ValueError(f"sequence length {t} exceeds the model's context {self.context}")
        h = self.embed(x) + self.pos[:t]
        for i in range(self.layers):
            k = None if key is None else jax.random.fold_in(key, i)
            h = getattr(self, f"block{i}")(h, train, k)
        return self.head(self.ln_f(h))
