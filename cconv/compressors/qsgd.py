"""QSGD (Alistarh et al., NeurIPS 2017): unbiased stochastic quantisation to s levels.

For each bucket v (the whole tensor, or consecutive chunks of ``bucket`` entries):
C(v)_i = ||v|| * sign(v_i) * xi_i / s,  l = floor(s |v_i| / ||v||),
xi_i = l + 1 with probability p_i = s|v_i|/||v|| - l, else l.
Unbiased, with exact variance E||C(v) - v||^2 = sum_i (||v||/s)^2 p_i (1 - p_i), bounded by
min(d/s^2, sqrt(d)/s) ||v||^2 (d = bucket size).

Wire formats (``coding``; the values are the same, bit for bit, whichever is chosen):

``"fixed"`` (default): each signed level sign*xi in [-s, s] is stored as the code sign*xi + s in
ceil(log2(2s + 1)) bits, bit-packed, plus one float32 norm per bucket:
ceil(d * bits / 8) + 4 * ceil(d / bucket) bytes.

``"elias"``: the paper's Section 3.2 code (``cconv.compressors.elias``): the float32 norms, then
for every nonzero level of the tensor in order Elias-omega(gap to the previous nonzero position),
a sign bit and Elias-omega(|level|), in a ``bitstream.BitStream``, plus the count of nonzeros
(int32).  Capacity policy: the buffer has the fixed format's size, ceil(d * bits / 8) bytes
(rounded up to 32-bit words), and the encoder picks the shorter message: the Elias stream when
its encoded size (ceil(nbits / 8), its 4-byte bit count and 4 bytes per 256 nonzeros of chunk
index) is at most the fixed format's ceil(d * bits / 8) bytes, else the fixed-format codes,
stored in the same words (little-endian bytes), with count = -1 as the flag.  So

    moved    4 * ceil(d / bucket) + 4 + 4 * (ceil(ceil(d * bits / 8) / 4) + 2 + ceil(d / 256))
             (~ fixed + 1/8 bit per element for the chunk index)
    encoded  4 * ceil(d / bucket) + 4 + min(elias stream, ceil(d * bits / 8))  (<= fixed + 4)

A worst-case capacity that always holds the Elias message would move
d * (3 + max_{l <= s} omega_len(l)) bits (9 per element at s = 8 against 5), for messages that
Gaussian gradients at small s keep far below the fixed size; hence the fixed-size buffer with
a fallback.  Theory.encoded_bytes is Theorem 3.2's bound per bucket of n entries,
(3 + (3/2) log2(2 (s^2 + n) / (s (s + sqrt n)))) s (s + sqrt n) + 32 bits, o(1) taken as 0.

Gathered payloads (coding="fixed") are summed in the packed domain (``gathered_sum``): each
worker's codes are unpacked inside one accumulation over the P workers (``packing.sum_rows``),
each level times its own worker's bucket norm / s: the same products, summed in worker order,
without the P x d float32 intermediate.  The norms differ per worker, so the levels cannot be summed as
integers before one multiply (that needs a scale shared by all workers, as TernGrad's
``shared_scale``).

``levels`` in [1, 127] (8-bit codes at most).  A zero bucket has norm 0 and decompresses to zero.
Non-finite input: the bucket's norm is NaN/inf and the bucket decompresses to non-finite values.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax

from cconv.compressors import bitstream, elias, fastrng
from cconv.compressors.base import Array, Compressor, check_float, like_info, safe_div, size_of, stateless_init
from cconv.compressors.oracle import alternating, flat64
from cconv.compressors.packing import pack_bits, packed_size, row, sum_rows, unpack_bits
from cconv.compressors.registry import Bench, Bound, Cost, Entry, Knob, Param, Schema, Theory, register

CODINGS = ("fixed", "elias")
CHUNK = bitstream.CHUNK  # entries per chunk-index offset of the Elias stream


class QSGDPayload(NamedTuple):
    """coding="fixed": bit-packed codes sign*xi + s and the bucket norms."""

    codes: Array  # uint8[ceil(d*bits/8)]
    norms: Array  # float32 (n_buckets,)


class QSGDEliasPayload(NamedTuple):
    """coding="elias": the Elias-omega stream of the nonzero levels (count >= 0), or the
    fixed-format codes in the same words (count = -1), and the bucket norms."""

    stream: bitstream.BitStream  # capacity: 8 * ceil(d*bits/8) bits
    count: Array  # int32 scalar: nonzero levels coded, or -1 (the words hold the fixed codes)
    norms: Array  # float32 (n_buckets,)


def code_bits(levels: int) -> int:
    """Bits per element: ceil(log2(2s + 1))."""
    return max(1, math.ceil(math.log2(2 * levels + 1)))


def _words_of_bytes(b: Array, n_words: int) -> Array:
    """uint8 bytes into n_words little-endian uint32 words (zero padded)."""
    b = jnp.pad(b, (0, 4 * n_words - b.shape[0])).reshape(n_words, 4).astype(jnp.uint32)
    return b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16) | (b[:, 3] << 24)


def _bytes_of_words(w: Array, n_bytes: int) -> Array:
    """The first n_bytes bytes of little-endian uint32 words."""
    b = jnp.stack([(w >> sh) & 0xFF for sh in (0, 8, 16, 24)], 1).astype(jnp.uint8)
    return b.reshape(-1)[:n_bytes]


def _buckets(d: int, bucket: int | None) -> tuple[int, int]:
    """(bucket size b, number of buckets)."""
    b = max(1, d if bucket is None else min(bucket, d))
    return b, -(-d // b)


def _capacity(d: int, nbits: int) -> int:
    """Bits of the Elias buffer: the fixed format's bytes (see the module docstring)."""
    return 8 * packed_size(d, nbits)


def _quantize(x, key, s: int, bucket: int | None):
    """The codes sign*xi + s (uint8, one per entry of x) and the bucket norms (module docstring)."""
    d = x.size
    b, nb = _buckets(d, bucket)
    flat = x.reshape(-1).astype(jnp.float32)
    v = jnp.pad(flat, (0, nb * b - d)).reshape(nb, b)
    norms = jnp.sqrt(jnp.sum(v * v, axis=1))
    r = s * safe_div(jnp.abs(v), norms[:, None])
    l = jnp.floor(r)
    p = r - l
    xi = jnp.minimum(l + (fastrng.uniform(key, v.shape) < p), s)  # = jax.random.uniform, bit for bit
    level = jnp.where(v >= 0, xi, -xi)
    return (level + s).astype(jnp.uint8).reshape(-1)[:d], norms


def _elias_payload(codes, packed, norms, s: int, nbits: int) -> QSGDEliasPayload:
    """coding="elias": the Elias stream of the levels when its encoded size is at most the fixed
    format's, else the fixed codes ``packed`` in the same words with count = -1 (module docstring)."""
    d = codes.shape[0]
    cap = _capacity(d, nbits)
    stream, count = elias.encode(codes.astype(jnp.int32) - s, cap, CHUNK)
    use = bitstream.encoded_bytes(stream, count, CHUNK) <= packed_size(d, nbits)
    fixed_words = _words_of_bytes(packed, bitstream.capacity_words(cap))
    stream = bitstream.BitStream(
        jnp.where(use, stream.words, fixed_words),
        jnp.where(use, stream.nbits, cap).astype(jnp.int32),
        jnp.where(use, stream.offsets, 0),
    )
    return QSGDEliasPayload(stream, jnp.where(use, count, -1).astype(jnp.int32), norms)


def _levels(payload, d: int, s: int, nbits: int, coding: str):
    """The d signed levels sign*xi in float32, from the payload of either ``coding``."""
    if coding == "fixed":
        return unpack_bits(payload.codes, nbits, d).astype(jnp.float32) - s
    words = payload.stream.words

    def fixed(_):
        return unpack_bits(_bytes_of_words(words, packed_size(d, nbits)), nbits, d).astype(jnp.int32) - s

    def coded(_):
        return elias.decode(payload.stream, payload.count, d, CHUNK)

    return lax.cond(payload.count >= 0, coded, fixed, None).astype(jnp.float32)


def _encoded(payload: QSGDEliasPayload):
    """Norms, the count word, then the Elias stream or (count = -1) the fixed codes, whose
    bytes the stream's nbits holds (8 * ceil(d * bits / 8))."""
    fixed = (payload.stream.nbits // 8).astype(jnp.float32)
    body = jnp.where(payload.count >= 0, bitstream.encoded_bytes(payload.stream, payload.count, CHUNK), fixed)
    return 4.0 * payload.norms.shape[0] + 4.0 + body


def _qsgd(levels: int = 8, bucket: int | None = None, coding: str = "fixed") -> Compressor:
    s = levels
    nbits = code_bits(s)

    def compress(x, state, key):
        check_float("qsgd", x)
        codes, norms = _quantize(x, key, s, bucket)
        packed = pack_bits(codes, nbits)
        if coding == "fixed":
            return QSGDPayload(packed, norms), state
        return _elias_payload(codes, packed, norms, s, nbits), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        d = size_of(shape)
        b, nb = _buckets(d, bucket)
        level = jnp.pad(_levels(payload, d, s, nbits, coding), (0, nb * b - d)).reshape(nb, b)
        out = payload.norms[:, None] * level / s
        return out.reshape(-1)[:d].astype(dtype).reshape(shape)

    def wire_bytes(shape, dtype="float32"):
        d = size_of(shape)
        if coding == "fixed":
            return packed_size(d, nbits) + 4 * _buckets(d, bucket)[1]
        return bitstream.stream_bytes(_capacity(d, nbits), d, CHUNK) + 4 + 4 * _buckets(d, bucket)[1]

    def gathered_sum(stacked, like):
        """sum_w norms_w * level_w / s (coding="fixed"), one fused reduction over the workers."""
        return sum_rows(lambda w: decompress(row(stacked, w), like), stacked.codes.shape[0])

    return Compressor(
        stateless_init,
        compress,
        decompress,
        wire_bytes,
        lambda shape: 1.0,
        name="qsgd",
        unbiased=True,
        encoded=None if coding == "fixed" else _encoded,
        gathered_sum=gathered_sum if coding == "fixed" else None,
    )


# ---------------------------------------------------------------- theory (float64 NumPy)


def _wire_bytes(c, shape, isz):
    """fixed: packed codes + norms; elias: norms + count word + the fixed-size buffer (its words
    rounded up, a spare word, the bit count) + one int32 chunk offset per 256 entries."""
    d, s = size_of(shape), c.hparams["levels"]
    nbits = max(1, math.ceil(math.log2(2 * s + 1)))
    fixed = -(-d * nbits // 8)
    norms = 4 * _buckets(d, c.hparams["bucket"])[1]
    if c.hparams["coding"] == "fixed":
        return fixed + norms
    return norms + 4 + 4 * (-(-fixed // 4) + 1 + 1 + max(1, -(-d // 256)))


def _encoded_bytes(c, shape, isz):
    """coding="elias": Theorem 3.2's bound (o(1) = 0) summed over the buckets of n entries,
    (3 + (3/2) log2(2 (s^2 + n) / (s (s + sqrt n)))) s (s + sqrt n) + 32 bits each, in bytes;
    "fixed": the wire bytes."""
    if c.hparams["coding"] == "fixed":
        return float(_wire_bytes(c, shape, isz))
    d, s = size_of(shape), c.hparams["levels"]
    b, nb = _buckets(d, c.hparams["bucket"])
    sizes = [b] * (nb - 1) + [d - (nb - 1) * b] if d else []
    return sum(elias.expected_bound_bits(n, s) for n in sizes) / 8.0


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


THEORY = Theory(
    wire_bytes=_wire_bytes,
    bound=_bound,
    error_sq=_error_sq,
    variance=_variance,
    worst_case=_worst_case,
    encoded_bytes=_encoded_bytes,
)

qsgd = register(
    "qsgd",
    Entry(
        _qsgd,
        Schema(
            (
                Param("levels", "int", 8, low=1, high=127, help="s, quantisation levels"),
                Param("bucket", "int", None, low=1, optional=True),
                Param("coding", "str", "fixed", choices=CODINGS, help="wire format: fixed-width codes or Elias-omega"),
            )
        ),
        theory=THEORY,
        knob=Knob("levels", (4, 16)),
        label="QSGD",
        known_as=("grace:QSGDCompressor", "gqsgd:qsgd_hook"),  # GRACE (Xu et al. 2021); Global-QSGD release
        # norm, scale, floor, uniform draws, compare, add, sign, cast (Alistarh et al. 2017; GRACE's qsgd.py)
        cost=Cost(
            compress_ops=10, compress_passes=6.0, decompress_ops=4, decompress_passes=2.5, code_bytes=1.0
        ),  # int8
        example={"levels": 4},
        bench=Bench(lambda r: {"levels": 2}, 4.0),
    ),
)  # 3-bit codes: the generic bit-stream packing path
