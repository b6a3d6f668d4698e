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
float32 scaler: ceil(d/4) + 4 bytes.  By default each worker sends its own scaler (payloads are
gathered, not summed).  A zero vector gives s = 0 and an all-zero output.  Non-finite input: s
becomes NaN/inf and the whole output is non-finite.

Shared scaler (``shared_scale=True``, the paper's "scaler sharing", Wen et al. 2017 Sec. 3.2):
the workers first agree on ONE scaler per tensor, s = max_w max_i |x_{w,i}| (after each
worker's own clipping), by one max-allreduce of all tensors' local maxima (the ``Agreement``
hook, ``cconv.compressors.base``; control traffic).  Each worker then ternarises with the shared
s: b_i ~ Bernoulli(|x_i| / s) is valid because s >= |x_i|, so C(x) is still unbiased and
Var[C(x)_i] = s |x_i| - x_i^2 with the *shared* s (larger than the local max: more variance).
Every payload is s * {-1, 0, +1}: the scaler is known to all and does not travel (the bound
payload is the ceil(d/4) bytes of codes), and the payloads can be summed as small integers
(aggregation "intsum": int8 sums in [-P, P] for P <= 127, int16 up to 32767, then one multiply
by s) when a ring all-reduce of d integers moves fewer bytes than gathering the packed codes
(P > 8 for int8), else the codes are gathered.  Standalone (one worker, no aggregation) the
agreed scaler is the local one and the payload carries it: ceil(d/4) + 4 bytes, as by default.

Gathered payloads are summed in the packed domain (``gathered_sum``).  Own scalers:
sum_w s_w * t_w, each worker's 2-bit codes unpacked and scaled inside one accumulation over the
P workers (``packing.sum_rows``; each code times its own worker's scaler: no integer shortcut;
the same products, summed in worker order, without the P x d float32 intermediate).  Shared
scaler (the bound compressor, when its codes are gathered): s * sum_w t_w, the ternary codes
summed exactly as small integers (int8 for P <= 127, int16 up to 32767) and multiplied once:
equal to the sum of decompressed payloads within float rounding.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from cconv.compressors import fastrng
from cconv.compressors.base import (
    Agreement,
    Array,
    Compressor,
    check_float,
    like_info,
    safe_div,
    size_of,
    stateless_init,
)
from cconv.compressors.oracle import flat64
from cconv.compressors.packing import pack_bits, packed_size, row, sum_rows, unpack_bits
from cconv.compressors.registry import Bench, Bound, Cost, Entry, Knob, Param, Schema, Theory, register


class TernPayload(NamedTuple):
    codes: Array  # uint8[ceil(d/4)], 2-bit codes
    scale: Array  # float32 scalar s


class TernCodes(NamedTuple):
    """The payload of a worker whose scaler is shared (known to all): codes only."""

    codes: Array  # uint8[ceil(d/4)], 2-bit codes


def _clipped(x: Array, clip: float | None) -> Array:
    """x flattened to float32, clipped to [-clip*sigma, clip*sigma] when ``clip`` is given."""
    check_float("terngrad", x)
    flat = x.reshape(-1).astype(jnp.float32)
    if clip is not None:
        sigma = jnp.std(flat)
        # sigma = 0 (a constant tensor, e.g. one element) would clip everything to 0: skip.
        bound = jnp.where(sigma > 0, clip * sigma, jnp.inf)
        flat = jnp.clip(flat, -bound, bound)
    return flat


def _max_abs(flat: Array) -> Array:
    return jnp.max(jnp.abs(flat)) if flat.size else jnp.zeros((), jnp.float32)


def _codes(flat: Array, s: Array, key: Array) -> Array:
    """Packed 2-bit codes of s * sign(x) * b, b_i ~ Bernoulli(|x_i| / s) (needs s >= |x_i|)."""
    p = safe_div(jnp.abs(flat), s)
    b = fastrng.uniform(key, flat.shape) < p  # = jax.random.uniform, bit for bit
    # sign(0) = +1 never matters: b = 0 when x_i = 0.
    return pack_bits(jnp.where(b, jnp.where(flat >= 0, 1, 2), 0).astype(jnp.uint8), 2)


def _ternary(codes: Array, d: int, dtype) -> Array:
    """Unpacked codes as {-1, 0, +1} in ``dtype``."""
    c = unpack_bits(codes, 2, d)
    return jnp.where(c == 1, 1, jnp.where(c == 2, -1, 0)).astype(dtype)


def _int_sum_dtype(workers: int):
    """The narrowest integer that holds a sum of ``workers`` values in [-1, 1]."""
    return jnp.int8 if workers <= 127 else jnp.int16 if workers <= 32767 else jnp.int32


def _terngrad(clip: float | None = None, shared_scale: bool = False) -> Compressor:
    hparams = {"clip": clip, "shared_scale": shared_scale}

    def compress(x, state, key):
        flat = _clipped(x, clip)
        s = _max_abs(flat)
        return TernPayload(_codes(flat, s, key), s.astype(jnp.float32)), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        return (payload.scale * _ternary(payload.codes, size_of(shape), jnp.float32)).astype(dtype).reshape(shape)

    def wire_bytes(shape, dtype="float32"):
        return packed_size(size_of(shape), 2) + 4

    def gathered_sum(stacked, like):
        """sum_w s_w * t_w, one accumulation over the workers."""
        return sum_rows(lambda w: decompress(row(stacked, w), like), stacked.codes.shape[0])

    c = Compressor(
        stateless_init,
        compress,
        decompress,
        wire_bytes,
        lambda shape: 1.0,
        name="terngrad",
        unbiased=clip is None,
        gathered_sum=gathered_sum,
    )
    if not shared_scale:
        return c
    return c._replace(
        aggregation="intsum",
        hparams=hparams,
        agree=Agreement(
            statistic=lambda x: _max_abs(_clipped(x, clip)),
            reduce="max",
            bind=lambda s: _shared(c._replace(aggregation="intsum", hparams=hparams), clip, s),
            levels=lambda payload, like: _ternary(payload.codes, size_of(like_info(like)[0]), jnp.int8),
            level_max=1,
            level_value=lambda s: jnp.asarray(s, jnp.float32),
        ),
    )


def _shared(c: Compressor, clip: float | None, s: Array) -> Compressor:
    """``c`` bound to the agreed scaler ``s`` (>= every worker's max |clip(x)|): its payload is
    the codes only (``TernCodes``, ceil(d/4) bytes); decompress multiplies by ``s``."""
    s = jnp.asarray(s, jnp.float32)

    def compress(x, state, key):
        return TernCodes(_codes(_clipped(x, clip), s, key)), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        return (s * _ternary(payload.codes, size_of(shape), jnp.float32)).astype(dtype).reshape(shape)

    def wire_bytes(shape, dtype="float32"):
        return packed_size(size_of(shape), 2)

    def gathered_sum(stacked, like):
        """s * sum_w t_w: the codes summed exactly as small integers, one multiply."""
        shape, dtype = like_info(like)
        workers, d = stacked.codes.shape[0], size_of(shape)
        total = sum_rows(lambda w: _ternary(stacked.codes[w], d, _int_sum_dtype(workers)), workers)
        return (s * total.astype(jnp.float32)).astype(dtype).reshape(shape)

    return c._replace(
        compress=compress, decompress=decompress, wire_bytes=wire_bytes, agree=None, gathered_sum=gathered_sum
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


def _wire_bytes(c, shape, isz):
    """ceil(d/4) bytes of 2-bit codes, plus the float32 scaler unless the compressor is bound to
    a shared scaler the workers agreed on (``shared_scale`` with its agreement done: the scaler
    is known to all and does not travel with the payload)."""
    bound = c.hparams.get("shared_scale", False) and c.agree is None
    return packed_size(size_of(shape), 2) + (0 if bound else 4)


def shared_variance(xs: np.ndarray) -> np.ndarray:
    """Var[C(x_w)_i] = s |x_{w,i}| - x_{w,i}^2 for every worker w, with the shared scaler
    s = max over workers and entries of |x_{w,i}| (``xs``: one row per worker; unclipped)."""
    xs = np.asarray(xs, np.float64).reshape(len(xs), -1)
    return float(np.max(np.abs(xs), initial=0.0)) * np.abs(xs) - xs * xs


THEORY = Theory(
    wire_bytes=_wire_bytes,
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
                Param(
                    "shared_scale",
                    "bool",
                    False,
                    help="one max-allreduced scaler per tensor shared by all workers (the paper's)",
                ),
            )
        ),
        aggregation=lambda hp: "intsum" if hp["shared_scale"] else "allgather",
        theory=THEORY,
        knob=Knob("clip"),
        label="TernGrad",
        known_as=("grace:TernGradCompressor",),  # GRACE (Xu et al. 2021), its data release
        # mean, std, clip, max, uniform draws, compare, sign, cast (Wen et al. 2017; GRACE's terngrad.py)
        cost=Cost(
            compress_ops=10, compress_passes=7.0, decompress_ops=3, decompress_passes=2.5, code_bytes=1.0
        ),  # int8
        bench=Bench(target_x=4.0),
    ),
)
