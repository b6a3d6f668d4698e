"""TernGrad (Wen et al., NeurIPS 2017): stochastic ternarisation.

C(x) = s * sign(x) * b,  s = max_i |x_i| (per tensor),  b_i ~ Bernoulli(|x_i| / s).
Unbiased: E[C(x)] = x, and E||C(x)||^2 = s ||x||_1, so the variance is s||x||_1 - ||x||^2
(omega(x) = s||x||_1/||x||^2 - 1; its worst case over x is (sqrt(d) - 1)/2, attained at
x = (1, a, ..., a) with a = 1/(sqrt(d) + 1): ``THEORY`` below, checked in
tests/test_theory_constants.py).

Optional gradient clipping (``clip=c``, the paper uses c = 2.5): x is first clipped to
[-c*sigma, c*sigma] with sigma the standard deviation of x, and s = max|clip(x)| (= c*sigma when
clipping is active).  The result is unbiased for clip(x), biased for x.  A constant tensor
(sigma = 0, e.g. a single element) is not clipped, as c*sigma = 0 would zero it.

Wire format: 2 bits per element packed 4 per byte (code 0 -> 0, 1 -> +1, 2 -> -1) plus one
float32 scaler: ceil(d/4) + 4 bytes.  The paper shares the max scaler across workers; here each
worker sends its own (so payloads are gathered, not summed).  A zero vector gives s = 0 and an
all-zero output.  Non-finite input: s becomes NaN/inf and the whole output is non-finite.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from cconv.compressors import fastrng
from cconv.compressors.base import Array, Compressor, check_float, like_info, safe_div, size_of, stateless_init
from cconv.compressors.oracle import flat64
from cconv.compressors.packing import pack_bits, packed_size, unpack_bits
from cconv.compressors.registry import Bench, Bound, Entry, Knob, Param, Schema, Theory, register


class TernPayload(NamedTuple):
    codes: Array  # uint8[ceil(d/4)], 2-bit codes
    scale: Array  # float32 scalar s


def _terngrad(clip: float | None = None) -> Compressor:
    def compress(x, state, key):
        check_float("terngrad", x)
        flat = x.reshape(-1).astype(jnp.float32)
        if clip is not None:
            sigma = jnp.std(flat)
            # sigma = 0 (a constant tensor, e.g. one element) would clip everything to 0: skip.
            bound = jnp.where(sigma > 0, clip * sigma, jnp.inf)
            flat = jnp.clip(flat, -bound, bound)
        mag = jnp.abs(flat)
        s = jnp.max(mag) if flat.size else jnp.zeros((), jnp.float32)
        p = safe_div(mag, s)
        b = fastrng.uniform(key, flat.shape) < p  # = jax.random.uniform, bit for bit
        # sign(0) = +1 never matters: b = 0 when x_i = 0.
        codes = jnp.where(b, jnp.where(flat >= 0, 1, 2), 0).astype(jnp.uint8)
        return TernPayload(pack_bits(codes, 2), s.astype(jnp.float32)), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        codes = unpack_bits(payload.codes, 2, size_of(shape))
        tern = jnp.where(codes == 1, 1.0, jnp.where(codes == 2, -1.0, 0.0))
        return (payload.scale * tern).astype(dtype).reshape(shape)

    def wire_bytes(shape, dtype="float32"):
        return packed_size(size_of(shape), 2) + 4

    return Compressor(
        stateless_init, compress, decompress, wire_bytes, lambda shape: 1.0, name="terngrad", unbiased=clip is None
    )


def _bound(c, shape):
    """Without clipping: omega = (sqrt(d) - 1)/2, attained; with clipping biased, no constant."""
    if c.hparams["clip"] is not None:
        return Bound("biased")
    return Bound("unbiased", omega=(math.sqrt(size_of(shape)) - 1.0) / 2.0)


def _error_sq(c, x, state):
    """s ||clip(x)||_1 - ||clip(x)||^2 (the variance) + ||clip(x) - x||^2 (the clipping bias)."""
    x = flat64(x)
    xc = x
    if c.hparams["clip"] is not None:
        sigma = float(np.std(x.astype(np.float32)))
        xc = np.clip(x, -c.hparams["clip"] * sigma, c.hparams["clip"] * sigma)
    s = float(np.max(np.abs(xc)))
    return s * float(np.sum(np.abs(xc))) - float(np.sum(xc * xc)) + float(np.sum((xc - x) ** 2))


def _variance(c, x):
    """Var[C(x)_i] = s |x_i| - x_i^2 (without clipping; with it C is biased: None)."""
    if c.hparams["clip"] is not None:
        return None
    x = flat64(x)
    return float(np.max(np.abs(x))) * np.abs(x) - x * x


def _worst_case(c, shape):
    x = np.full(size_of(shape), 1.0 / (math.sqrt(size_of(shape)) + 1.0))
    x[0] = 1.0
    return x.reshape(shape)


THEORY = Theory(
    wire_bytes=lambda c, shape, isz: packed_size(size_of(shape), 2) + 4,
    bound=_bound,
    error_sq=_error_sq,
    variance=_variance,
    worst_case=_worst_case,
)

terngrad = register(
    "terngrad",
    Entry(
        _terngrad,
        Schema(
            (
                Param(
                    "clip",
                    "float",
                    None,
                    low=0.0,
                    low_open=True,
                    optional=True,
                    help="clip at clip * std(x); the paper uses 2.5",
                ),
            )
        ),
        theory=THEORY,
        knob=Knob("clip"),
        label="TernGrad",
        cases=({}, {"clip": 2.5}),
        bench=Bench(target_x=4.0),
    ),
)
