"""Randomized Hadamard rotation and Gaussian scalar quantizers: the shared machinery of the
rotation-based compressors (DRIVE, EDEN, THC).

Rotation (Ailon & Chazelle 2006; used by Suresh et al. 2017, DRIVE, EDEN, THC): pad x in R^d with
zeros to D = 2^ceil(log2 d), flip signs by a Rademacher vector s drawn from an explicit PRNG key,
and apply the normalized Walsh-Hadamard transform H_D / sqrt(D):

    R x = H_D (s * pad(x)) / sqrt(D),     R^{-1} y = s * (H_D y) / sqrt(D)   (H_D H_D = D I)

R is orthonormal, so ||R x|| = ||x||, and after it every coordinate of R x is close to
N(0, ||x||^2 / D) for the vectors seen in practice.  ``fwht`` computes H_D in O(D log D): the
log2(D) butterfly stages are grouped four at a time into one contraction with the 16 x 16
Hadamard matrix, so a transform is ceil(log2(D) / 4) passes over the D floats (``passes``).

Quantizers (``lloyd_max``): the 2^b Lloyd-Max centroids of N(0, 1) (Max 1960; the optimal
b-bit scalar quantizer of a Gaussian, EDEN's quantization levels), computed by Lloyd's
iteration from the Gaussian's closed forms (float64, at import); their normalized MSE for
b = 1..4 is 0.3634, 0.1175, 0.03454, 0.009497 (Max 1960, Table I; checked in the tests).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from cconv.compressors.base import Array

RADIX = 16  # butterfly stages per pass: log2(RADIX) = 4


def padded(d: int) -> int:
    """D = the smallest power of two >= max(d, 1)."""
    return 1 << max(0, int(d) - 1).bit_length()


def passes(d: int) -> int:
    """Passes over the D floats one transform makes: ceil(log2(D) / 4)."""
    return -(-(padded(d).bit_length() - 1) // 4)


@functools.cache
def _hadamard(n: int) -> np.ndarray:
    h = np.ones((1, 1), np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def fwht(y: Array) -> Array:
    """H_D y (unnormalized, float32) for a flat y of length D = 2^n: stages of up to 4 butterflies,
    each one contraction of a (D / (r h), r, h) view with the r x r Hadamard matrix."""
    n = y.shape[0]
    h = 1
    while h < n:
        r = min(RADIX, n // h)
        y = jnp.einsum("arh,rs->ash", y.reshape(n // (r * h), r, h), jnp.asarray(_hadamard(r)))
        y = y.reshape(n)
        h *= r
    return y


def raw_key(key: Array) -> Array:
    """Raw uint32 key data (what travels when the receiver must regenerate the rotation)."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(key)
    return key


def signs(key: Array, n: int) -> Array:
    """The Rademacher diagonal s in {-1, +1}^n (float32) of ``key``."""
    return jax.random.rademacher(jax.random.wrap_key_data(raw_key(key)), (n,), jnp.float32)


def rotate(x: Array, key: Array) -> Array:
    """R x for a flat x: pad to D, sign flips, normalized Hadamard transform (float32, length D)."""
    d = x.shape[0]
    n = padded(d)
    v = jnp.pad(x.astype(jnp.float32), (0, n - d))
    return fwht(signs(key, n) * v) * jnp.float32(1.0 / math.sqrt(n))


def unrotate(y: Array, key: Array, d: int) -> Array:
    """R^{-1} y, the first d coordinates (float32)."""
    n = y.shape[0]
    return (signs(key, n) * fwht(y) * jnp.float32(1.0 / math.sqrt(n)))[:d]


# --------------------------------------------------------------------------- quantizers


def _phi(t: float) -> float:
    return math.exp(-0.5 * t * t) / math.sqrt(2 * math.pi) if math.isfinite(t) else 0.0


def _cdf(t: float) -> float:
    return 0.5 * (1.0 + math.erf(t / math.sqrt(2.0)))


@functools.cache
def lloyd_max(bits: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(centroids[2^b], thresholds[2^b - 1], MSE) of the optimal b-bit quantizer of N(0, 1):
    Lloyd's iteration, c_j = E[Z | t_{j-1} < Z <= t_j] = (phi(t_{j-1}) - phi(t_j)) /
    (Phi(t_j) - Phi(t_{j-1})), t_j = (c_j + c_{j+1}) / 2, to convergence (float64)."""
    m = 1 << bits
    c = np.array([-(m - 1) / 2 + j for j in range(m)], np.float64) * (3.0 / m)
    for _ in range(20000):
        t = (c[1:] + c[:-1]) / 2
        edges = [-math.inf, *t, math.inf]
        new = np.array(
            [(_phi(edges[j]) - _phi(edges[j + 1])) / (_cdf(edges[j + 1]) - _cdf(edges[j])) for j in range(m)]
        )
        if np.max(np.abs(new - c)) < 1e-15:
            c = new
            break
        c = new
    t = (c[1:] + c[:-1]) / 2
    edges = [-math.inf, *t, math.inf]
    # MSE = E[Z^2] - sum_j c_j^2 P(cell j) (centroid condition)
    mse = 1.0 - sum(c[j] ** 2 * (_cdf(edges[j + 1]) - _cdf(edges[j])) for j in range(m))
    return c, t, float(mse)


def quantize_nearest(z: Array, thresholds: np.ndarray) -> Array:
    """Index of the nearest centroid (uint8) for each z: the number of thresholds <= z, so a
    tie (and z = 0 between the two middle cells) goes up, as sign(0) = +1."""
    idx = jnp.zeros(z.shape, jnp.uint8)
    for t in thresholds:
        idx = idx + (z >= jnp.float32(t)).astype(jnp.uint8)
    return idx


__all__ = ["padded", "passes", "fwht", "rotate", "unrotate", "signs", "raw_key", "lloyd_max", "quantize_nearest"]
