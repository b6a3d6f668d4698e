"""``jax.random.uniform`` / ``jax.random.bits``, bit for bit, without XLA:CPU's rolled Threefry loop.

The stochastic compressors (TernGrad, QSGD) draw one uniform per coordinate.  JAX lowers the
Threefry-2x32 hash on CPU as a rolled ``fori_loop`` of 5 iterations (to keep compile times
short), and every iteration materialises two d-sized uint32 arrays: at d = 10^7 drawing the
uniforms costs about 50-60x a read of the gradient.  Written out as its 20 rounds of add /
rotate / xor, the same hash fuses into one elementwise loop: about 10x (measured in
``studies/benchmarks``), with the same bits.  The written-out hash is a jitted function of the
shape, so a step that draws for many tensors of one shape traces its ~120 operations once.

``bits(key, shape)`` and ``uniform(key, shape)`` return exactly what ``jax.random.bits`` (uint32)
and ``jax.random.uniform`` (float32 in [0, 1)) return for the same key, for Threefry keys (raw
``uint32[2]`` under the default PRNG implementation, or typed ``threefry2x32`` keys) with the
default ``jax_threefry_partitionable=True`` counter layout (element i of the flattened shape
hashes the 64-bit counter i, and the two output words are xor-ed).  Tests check bit equality.
For any other key type or configuration, and on non-CPU backends (whose Threefry lowering is
already unrolled), they call ``jax.random`` itself.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["bits", "uniform"]

_ROT = ((13, 15, 26, 6), (17, 29, 16, 24))


def _rotl(v, r: int):
    return (v << np.uint32(r)) | (v >> np.uint32(32 - r))


def _threefry2x32(k1, k2, x0, x1):
    """Threefry-2x32 with 20 rounds (Salmon et al. 2011), as in jax's unrolled lowering."""
    ks = (k1, k2, k1 ^ k2 ^ np.uint32(0x1BD11BDA))
    x0 = x0 + ks[0]
    x1 = x1 + ks[1]
    for i in range(5):
        for r in _ROT[i % 2]:
            x0 = x0 + x1
            x1 = _rotl(x1, r) ^ x0
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def _raw_threefry_key(key):
    """uint32[2] key data if key is a Threefry key (typed or raw under the default impl), else None."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if "threefry" not in str(jax.random.key_impl(key)):
            return None
        return jax.random.key_data(key)
    if key.dtype != jnp.uint32 or key.shape != (2,):
        return None
    if jax.config.jax_default_prng_impl != "threefry2x32":
        return None
    return key


@partial(jax.jit, static_argnums=1)
def _fast_bits(raw, shape):
    n = math.prod(shape)
    lo = lax.iota(jnp.uint32, n).reshape(shape)
    hi = jnp.zeros(shape, jnp.uint32)
    b0, b1 = _threefry2x32(raw[0], raw[1], hi, lo)
    return b0 ^ b1


@partial(jax.jit, static_argnums=1)
def _fast_uniform(raw, shape):
    b = _fast_bits(raw, shape)
    f = lax.bitcast_convert_type((b >> np.uint32(9)) | np.uint32(0x3F800000), jnp.float32) - 1.0
    return jnp.maximum(0.0, f)


def _supported(key, shape) -> bool:
    return _raw_threefry_key(key) is not None and jax.config.jax_threefry_partitionable and math.prod(shape) < 2**32


def bits(key, shape):
    """uint32 random bits, identical to ``jax.random.bits(key, shape)`` (module docstring)."""
    shape = tuple(int(s) for s in shape)
    if not _supported(key, shape):
        return jax.random.bits(key, shape, jnp.uint32)
    raw = _raw_threefry_key(key)
    return lax.platform_dependent(
        raw, cpu=lambda r: _fast_bits(r, shape), default=lambda r: jax.random.bits(key, shape, jnp.uint32)
    )


def uniform(key, shape):
    """float32 uniforms in [0, 1), identical to ``jax.random.uniform(key, shape)``."""
    shape = tuple(int(s) for s in shape)
    if not _supported(key, shape):
        return jax.random.uniform(key, shape, jnp.float32)
    raw = _raw_threefry_key(key)

    return lax.platform_dependent(
        raw, cpu=lambda r: _fast_uniform(r, shape), default=lambda r: jax.random.uniform(key, shape, jnp.float32)
    )
