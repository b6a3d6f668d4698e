"""Natural compression (Horváth, Ho, Horváth, Sahu, Canini & Richtárik 2019, "Natural Compression
for Distributed Deep Learning", arXiv:1905.10988): stochastic rounding to a power of two.

For 2^a <= |x_i| < 2^(a+1):

    C_nat(x)_i = sign(x_i) * 2^(a+1)  with probability p_i = (|x_i| - 2^a) / 2^a,
                 sign(x_i) * 2^a      otherwise;          C_nat(0) = 0.

Unbiased: E[C_nat(x)_i] = 2^a (1 + p_i) = |x_i| sign(x_i).  Per entry
Var[C_nat(x)_i] = (|x_i| - 2^a)(2^(a+1) - |x_i|), so E||C_nat(x) - x||^2 <= omega ||x||^2 with
omega = max_{1 <= r <= 2} (r - 1)(2 - r) / r^2 = 1/8, attained at |x_i| = 4/3 * 2^a (tight).
Since omega < 1 it is also a contraction with delta = 1 - omega = 7/8.

Wire format (9 bits per element): a power of two needs no mantissa, so an entry travels as its
sign bit, packed 8 per byte (``packing.pack_bits``; bit = 1 for a clear IEEE sign bit), and the
8-bit biased float32 exponent of the rounded value as a uint8: ceil(d/8) + d bytes.  Exponent 0
encodes zero.  Computed on float32 bits: with mantissa m of x_i (23 bits), p_i = m / 2^23 and the
rounded exponent is the exponent plus 1 when a uniform u (``fastrng.uniform``: k / 2^23 for an
integer k, so P(u < p_i) = p_i exactly) is below p_i.  bfloat16 and float16 inputs are computed
in float32 and the result is returned in the input dtype.

Edge cases:

* subnormal float32 |x_i| < 2^-126 (exponent field 0): the same rule with 2^a replaced by 0 and
  2^(a+1) by 2^-126, i.e. rounded to 0 or sign * 2^-126 with P(2^-126) = |x_i| / 2^-126.  This
  keeps C_nat unbiased; the variance |x_i| (2^-126 - |x_i|) is at most 2^-254 per entry but is
  not within 1/8 |x_i|^2, so omega = 1/8 holds for inputs whose nonzero entries are normal floats
  (XLA's CPU arithmetic flushes subnormals to zero, so gradients computed there have none).
* 2^127 <= |x_i| < 2^128 (the largest finite binade) rounding up would be 2^128, which float32
  cannot hold: it is sent as exponent 255 and decodes to +-inf, as fp16 overflows in the
  ``fp16`` compressor; the engine then records the run as diverged.  Likewise float16 input in
  [2^15, 65504] rounding up to 2^16 becomes +-inf in float16.
* Non-finite input: +-inf is sent as +-inf; NaN (no mantissa travels) is sent as an infinity
  with the NaN's sign bit.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax

from cconv.compressors import fastrng
from cconv.compressors.base import Array, Compressor, check_float, like_info, size_of, stateless_init
from cconv.compressors.oracle import flat64
from cconv.compressors.packing import pack_bits, packed_size, unpack_bits
from cconv.compressors.registry import Bench, Bound, Entry, Theory, register

_MIN_NORMAL = 2.0**-126  # smallest normal float32; exponent field 0 holds zero and subnormals
_OVERFLOW = 2.0**127  # largest finite float32 power of two


class NaturalPayload(NamedTuple):
    signs: Array  # uint8[ceil(d/8)], bit = 1 for a clear sign bit
    exponents: Array  # uint8[d], biased float32 exponent of the rounded value (0: zero, 255: inf)


def _natural() -> Compressor:
    def compress(x, state, key):
        check_float("natural", x)
        bits = lax.bitcast_convert_type(x.reshape(-1).astype(jnp.float32), jnp.uint32)
        exponent = (bits >> 23) & 0xFF
        p = (bits & 0x7FFFFF).astype(jnp.float32) * 2.0**-23  # (|x| - 2^a) / 2^a, exact
        up = (fastrng.uniform(key, p.shape) < p) & (exponent < 255)  # inf / NaN keep exponent 255
        exponents = (exponent + up.astype(jnp.uint32)).astype(jnp.uint8)
        return NaturalPayload(pack_bits((bits >> 31) == 0, 1), exponents), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        negative = 1 - unpack_bits(payload.signs, 1, size_of(shape)).astype(jnp.uint32)
        bits = (negative << 31) | (payload.exponents.astype(jnp.uint32) << 23)
        return lax.bitcast_convert_type(bits, jnp.float32).astype(dtype).reshape(shape)

    def wire_bytes(shape, dtype="float32"):
        d = size_of(shape)
        return packed_size(d, 1) + d

    return Compressor(
        stateless_init, compress, decompress, wire_bytes, lambda shape: 1.0, name="natural", unbiased=True
    )


# ---------------------------------------------------------------- theory (float64 NumPy)


def _neighbours(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi): the two values |x_i| rounds to, 2^a <= |x_i| < 2^(a+1); 0 and 2^-126 for a
    subnormal, 0 and 0 for zero."""
    t = np.abs(x)
    lo = np.ldexp(1.0, np.frexp(t)[1] - 1)  # t = m 2^e with m in [0.5, 1): 2^a = 2^(e-1)
    sub = t < _MIN_NORMAL
    return np.where(sub, 0.0, lo), np.where(sub, np.where(t > 0, _MIN_NORMAL, 0.0), 2.0 * lo)


def _variance(c, x):
    """Var[C_nat(x)_i] = (|x_i| - lo)(hi - |x_i|); inf where rounding up passes 2^127, NaN for
    non-finite x_i."""
    x = flat64(x)
    lo, hi = _neighbours(x)
    t = np.abs(x)
    with np.errstate(invalid="ignore"):
        var = np.where((lo >= _OVERFLOW) & (t > lo), np.inf, (t - lo) * (hi - t))
    return np.where(np.isfinite(t), var, np.nan)


def _worst_case(c, shape):
    """|x_i| = 4/3 (the maximiser of (r - 1)(2 - r) / r^2), alternating signs."""
    d = size_of(shape)
    return (np.where(np.arange(d) % 2 == 0, 1.0, -1.0) * (4.0 / 3.0)).reshape(shape)


THEORY = Theory(
    wire_bytes=lambda c, shape, isz: -(-size_of(shape) // 8) + size_of(shape),
    bound=lambda c, shape: Bound("unbiased", omega=1.0 / 8.0, delta=7.0 / 8.0),
    error_sq=lambda c, x, state: float(np.sum(_variance(c, x))),
    variance=_variance,
    worst_case=_worst_case,
)

natural = register(
    "natural",
    Entry(_natural, aggregation="allgather", theory=THEORY, label="natural compression", bench=Bench(target_x=4.0)),
)
