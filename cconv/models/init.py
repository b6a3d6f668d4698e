"""Weight initialisers that compile once per size class instead of once per tensor shape.

``variance_scaling(scale, mode)`` is the usual scheme (Glorot and Bengio 2010; He et al. 2015;
LeCun et al. 1998): ``w ~ TruncNormal(-2, 2) * sqrt(scale / fan) / 0.8796...`` with
``fan_in = prod(shape[:-1])`` (dense ``[in, out]`` and conv ``HWIO`` kernels), ``fan_out =
prod(shape[:-2]) * shape[-1]``; the constant 0.87962566 is the standard deviation of a standard
normal truncated to [-2, 2], so the weights have variance exactly ``scale / fan``.  This matches
``jax.nn.initializers.variance_scaling(scale, mode, "truncated_normal")`` in distribution.

Why not use that directly: every distinct shape makes XLA compile a new threefry sampler
(about 0.4 s of CPU each, measured on the 2-core CI machine), which dominated the start-up of
small models.  Here the samples are drawn as a vector whose length is the next power of two of
``prod(shape)`` (at least 4096) and then cut and reshaped, so all tensors of one size class share
one compiled sampler.  With JAX's default partitionable threefry, sample i of a draw depends only
on (key, i), so the values equal those of ``jax.random.truncated_normal(key, -2, 2, shape)``
exactly; inside ``jit``/``vmap`` (``cconv.models.initializer``) the cost is a few unused samples.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

TRUNC_STD = 0.87962566103423978  # std of N(0, 1) truncated to [-2, 2]


MIN_DRAW = 4096


def _pow2(n: int) -> int:
    """Size class of an n-element draw: the next power of two, at least ``MIN_DRAW``."""
    return max(MIN_DRAW, 1 << max(n - 1, 0).bit_length())


def truncated_normal_flat(key, shape, dtype=jnp.float32) -> jax.Array:
    """``TruncNormal(-2, 2)`` samples of ``shape``, cut from a power-of-two length draw."""
    size = math.prod(shape)
    flat = jax.random.truncated_normal(key, -2.0, 2.0, (_pow2(size),), jnp.float32)
    return flat[:size].reshape(shape).astype(dtype)


def variance_scaling(scale: float, mode: str = "fan_in"):
    """Initialiser with ``Var(w) = scale / fan`` (module docstring); mode fan_in | fan_out | fan_avg."""
    if mode not in ("fan_in", "fan_out", "fan_avg"):
        raise ValueError(f"unknown mode {mode!r}; valid: fan_in, fan_out, fan_avg")

    def init(key, shape, dtype=jnp.float32):
        if len(shape) < 2:
            raise ValueError(f"variance_scaling needs a kernel of rank >= 2, got shape {shape}")
        receptive = math.prod(shape[:-2])
        fan_in, fan_out = shape[-2] * receptive, shape[-1] * receptive
        fan = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2}[mode]
        std = math.sqrt(scale / fan) / TRUNC_STD
        return truncated_normal_flat(key, shape, dtype) * jnp.asarray(std, dtype)

    return init


def normal(stddev: float):
    """``w ~ N(0, stddev^2)`` (e.g. GPT-2's 0.02 for embeddings), power-of-two length draw."""

    def init(key, shape, dtype=jnp.float32):
        size = math.prod(shape)
        flat = jax.random.normal(key, (_pow2(size),), jnp.float32)
        return (flat[:size].reshape(shape) * stddev).astype(dtype)

    return init


lecun_normal = variance_scaling(1.0, "fan_in")  # dense layers (flax's default)
he_normal = variance_scaling(2.0, "fan_in")  # ReLU conv layers (He et al. 2015)
