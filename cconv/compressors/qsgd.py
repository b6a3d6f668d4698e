"""QSGD (Alistarh et al., NeurIPS 2017): unbiased stochastic quantisation to s levels.

For each bucket v (the whole tensor, or consecutive chunks of ``bucket`` entries):
C(v)_i = ||v|| * sign(v_i) * xi_i / s,  l = floor(s |v_i| / ||v||),
xi_i = l + 1 with probability p_i = s|v_i|/||v|| - l, else l.
Unbiased, with exact variance E||C(v) - v||^2 = sum_i (||v||/s)^2 p_i (1 - p_i), bounded by
min(d/s^2, sqrt(d)/s) ||v||^2 (d = bucket size).

Wire format: each signed level sign*xi in [-s, s] is stored as the code sign*xi + s in
ceil(log2(2s + 1)) bits, bit-packed (no Elias coding), plus one float32 norm per bucket:
ceil(d * bits / 8) + 4 * ceil(d / bucket) bytes.  ``levels`` in [1, 127] (8-bit codes at most).
A zero bucket has norm 0 and decompresses to zero.  Non-finite input: the bucket's norm is
NaN/inf and the bucket decompresses to non-finite values.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from cconv.compressors import fastrng
from cconv.compressors.base import Array, Compressor, check_float, like_info, safe_div, size_of, stateless_init
from cconv.compressors.oracle import alternating, flat64
from cconv.compressors.packing import pack_bits, packed_size, unpack_bits
from cconv.compressors.registry import Bench, Bound, Entry, Knob, Param, Schema, Theory, register


class QSGDPayload(NamedTuple):
    codes: Array  # uint8[ceil(d*bits/8)]
    norms: Array  # float32 (n_buckets,)


def code_bits(levels: int) -> int:
    """Bits per element: ceil(log2(2s + 1))."""
    return max(1, math.ceil(math.log2(2 * levels + 1)))


def _qsgd(levels: int = 8, bucket: int | None = None) -> Compressor:
    s = levels
    nbits = code_bits(s)

    def layout(d):
        b = d if bucket is None else min(bucket, d)
        b = max(b, 1)
        return b, -(-d // b)

    def compress(x, state, key):
        check_float("qsgd", x)
        d = x.size
        b, nb = layout(d)
        flat = x.reshape(-1).astype(jnp.float32)
        v = jnp.pad(flat, (0, nb * b - d)).reshape(nb, b)
        norms = jnp.sqrt(jnp.sum(v * v, axis=1))
        r = s * safe_div(jnp.abs(v), norms[:, None])
        l = jnp.floor(r)
        p = r - l
        xi = jnp.minimum(l + (fastrng.uniform(key, v.shape) < p), s)  # = jax.random.uniform, bit for bit
        level = jnp.where(v >= 0, xi, -xi)
        codes = (level + s).astype(jnp.uint8).reshape(-1)[:d]
        return QSGDPayload(pack_bits(codes, nbits), norms), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        d = size_of(shape)
        b, nb = layout(d)
        level = unpack_bits(payload.codes, nbits, d).astype(jnp.float32) - s
        level = jnp.pad(level, (0, nb * b - d)).reshape(nb, b)
        out = payload.norms[:, None] * level / s
        return out.reshape(-1)[:d].astype(dtype).reshape(shape)

    def wire_bytes(shape, dtype="float32"):
        d = size_of(shape)
        return packed_size(d, nbits) + 4 * layout(d)[1]

    return Compressor(stateless_init, compress, decompress, wire_bytes, lambda shape: 1.0, name="qsgd", unbiased=True)


# ---------------------------------------------------------------- theory (float64 NumPy)


def _buckets(d: int, bucket: int | None) -> tuple[int, int]:
    """(bucket size b, number of buckets)."""
    b = max(1, d if bucket is None else min(bucket, d))
    return b, -(-d // b)


def _wire_bytes(c, shape, isz):
    d, s = size_of(shape), c.hparams["levels"]
    nbits = max(1, math.ceil(math.log2(2 * s + 1)))
    return -(-d * nbits // 8) + 4 * _buckets(d, c.hparams["bucket"])[1]


def _bound(c, shape):
    """s = 1: omega = sqrt(b) - 1, attained when all magnitudes are equal; else the paper's
    min(b/s^2, sqrt(b)/s) (a valid bound, not tight)."""
    s = c.hparams["levels"]
    b, _ = _buckets(size_of(shape), c.hparams["bucket"])
    if s == 1:
        return Bound("unbiased", omega=math.sqrt(b) - 1.0)
    return Bound("unbiased", omega=min(b / s**2, math.sqrt(b) / s), tight=False)


def _bucket_variances(c, x):
    """Per bucket v: (its slice, (||v|| / s)^2, p) with p_i = frac(s |v_i| / ||v||), so that
    Var[C(v)_i] = (||v|| / s)^2 p_i (1 - p_i); zero buckets (decompressed exactly) are skipped."""
    x = flat64(x)
    s = c.hparams["levels"]
    b, nb = _buckets(x.size, c.hparams["bucket"])
    for i in range(nb):
        v = x[i * b : (i + 1) * b]
        nv = math.sqrt(float(np.sum(v * v)))
        if nv > 0:
            r = s * np.abs(v) / nv
            p = r - np.floor(r)
            yield slice(i * b, (i + 1) * b), (nv / s) ** 2, p


def _error_sq(c, x, state):
    return float(sum(scale * float(np.sum(p * (1 - p))) for _, scale, p in _bucket_variances(c, x)))


def _variance(c, x):
    out = np.zeros(np.size(x))
    for sl, scale, p in _bucket_variances(c, x):
        out[sl] = scale * p * (1 - p)
    return out


def _worst_case(c, shape):
    if c.hparams["levels"] != 1:
        return None
    return alternating(shape)


THEORY = Theory(wire_bytes=_wire_bytes, bound=_bound, error_sq=_error_sq, variance=_variance, worst_case=_worst_case)

qsgd = register(
    "qsgd",
    Entry(
        _qsgd,
        Schema(
            (
                Param("levels", "int", 8, low=1, high=127, help="s, quantisation levels"),
                Param("bucket", "int", None, low=1, optional=True),
            )
        ),
        theory=THEORY,
        knob=Knob("levels", (4, 16)),
        label="QSGD",
        cases=({"levels": 4}, {"levels": 2, "bucket": 6}),
        bench=Bench(lambda r: {"levels": 2}, 4.0),
    ),
)  # 3-bit codes: the generic bit-stream packing path
