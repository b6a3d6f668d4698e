"""Half-precision casts (``fp16``, ``bf16``): 16 bits/element, round-to-nearest.

C(x) = cast(x) (then back to x's dtype).  Deterministic rounding is *not* unbiased (the error
is a fixed function of x), but it is a contraction: ||x - C(x)||^2 <= u^2 ||x||^2 with unit
round-off u = 2^-11 (fp16) or 2^-8 (bf16), as long as every entry is in the format's normal
range (fp16: 6.1e-5 <= |x_i| <= 65504).  Below it fp16 rounds to subnormals with absolute error
at most 2^-25 per entry (tiny gradients lose relative precision, down to 0).  fp16 overflows to
+-inf above 65504 (no clipping, as in Horovod's fp16 compression): the engine then records the
run as diverged.  Payloads are summable (all-reduce in half precision).  Non-finite input
passes through.

Worst case: |x - fl(x)| <= u/(1+u) |x| for round-to-nearest (Higham, Accuracy and Stability of
Numerical Algorithms, Thm 2.2), attained at the rounding tie x = 1 + u, so
delta = 1 - (u/(1+u))^2, tight.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from cconv.compressors.base import Array, Compressor, check_float, like_info, size_of, stateless_init
from cconv.compressors.oracle import flat64, spike
from cconv.compressors.registry import Bench, Bound, Entry, Theory, register

UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}  # u of the wire format


class CastPayload(NamedTuple):
    values: Array


def _cast(name: str, wire_dtype) -> Compressor:
    def compress(x, state, key):
        check_float(name, x)
        return CastPayload(x.astype(wire_dtype)), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        return payload.values.reshape(shape).astype(dtype)

    def wire_bytes(shape, dtype="float32"):
        return size_of(shape) * 2

    return Compressor(stateless_init, compress, decompress, wire_bytes, lambda shape: 1.0, name=name, unbiased=False)


def _fp16() -> Compressor:
    """Cast to IEEE half precision (16 bits/element)."""
    return _cast("fp16", jnp.float16)


def _bf16() -> Compressor:
    """Cast to bfloat16 (16 bits/element, fp32's exponent range)."""
    return _cast("bf16", jnp.bfloat16)


def _cast_theory(name: str, wire_dtype) -> Theory:
    u = UNIT_ROUNDOFF[name]

    def error_sq(c, x, state):
        # the rounding itself (float32 -> wire format -> float32), as the compressor does it
        x = flat64(x)
        y = np.asarray(jnp.asarray(x, jnp.float32).astype(wire_dtype).astype(jnp.float32), np.float64)
        return float(np.sum((x - y) ** 2))

    return Theory(
        wire_bytes=lambda c, shape, isz: 2 * size_of(shape),
        bound=lambda c, shape: Bound("contractive", delta=1.0 - (u / (1.0 + u)) ** 2),
        error_sq=error_sq,
        worst_case=lambda c, shape: spike(shape, 1.0 + u),
    )


fp16 = register(
    "fp16",
    Entry(
        _fp16,
        aggregation="allreduce",
        theory=_cast_theory("fp16", jnp.float16),
        label="fp16",
        bench=Bench(target_x=4.0),
    ),
)
bf16 = register(
    "bf16",
    Entry(
        _bf16,
        aggregation="allreduce",
        theory=_cast_theory("bf16", jnp.bfloat16),
        label="bf16",
        bench=Bench(target_x=4.0),
    ),
)
