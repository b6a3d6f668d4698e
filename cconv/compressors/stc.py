"""Sparse Ternary Compression (Sattler et al., IEEE TNNLS 2019).

C(x)_i = mu * sign(x_i) on the top-k entries, 0 elsewhere; mu = mean of the top-k |x_i|.
Biased (combine with error feedback, as the paper does).
Wire format: k sign bits packed 8 per byte + one float32 mu, plus the positions:

* ``positions="int32"`` (default): k int32 indices: 4k + ceil(k/8) + 4 bytes.
* ``positions="golomb"``: the paper's format, Golomb-Rice coded gaps between the sorted
  positions with b* = 1 + floor(log2(ln(phi - 1) / ln(1 - p))), p = k/d
  (``cconv.compressors.golomb``).  A collective moves the fixed worst-case buffer
  (``golomb.stream_bytes``: k (1 + b*) + ((d - k) >> b*) bits, a bit count and a chunk index),
  ceil(k/8) + 4 + golomb.stream_bytes(k, d) bytes; the encoded message
  (``c.encoded_bytes(payload)``) is ceil(nbits/8) + 4 + 4 * chunks of it, on average
  b* + 1/(1 - (1-p)^(2^b*)) bits per position (Sattler et al. 2019) plus 1/8 bit of chunk
  index.  The decompressed array is bit-identical to the int32 format's.

With k >= d every entry is sent and the positions are omitted (an empty index array; no stream
with "golomb"): ceil(d/8) + 4 bytes.  A zero vector gives
mu = 0.  Non-finite input: NaN is selected first and mu becomes NaN.  The top-k set is
``cconv.compressors.select.topk_indices``'s (exactly lax.top_k's set; indices ascending).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from cconv.compressors import golomb
from cconv.compressors.base import (
    Array,
    Compressor,
    SparsifierSize,
    check_float,
    like_info,
    payload_bytes,
    size_of,
    stateless_init,
)
from cconv.compressors.bitstream import BitStream
from cconv.compressors.oracle import flat64, sparsifier_k, top_idx
from cconv.compressors.packing import pack_signs, packed_size, unpack_signs
from cconv.compressors.registry import Bound, Entry, Knob, Schema, Theory, register, with_ratio
from cconv.compressors.select import topk_indices
from cconv.compressors.sparse import SIZE, SPARSE_BENCH, SPARSE_RATIOS


class STCPayload(NamedTuple):
    indices: Array  # int32 (k,), or (0,) when every entry is sent
    signs: Array  # uint8[ceil(k/8)]
    mu: Array  # float32 scalar


class STCGolombPayload(NamedTuple):
    """``positions="golomb"`` (k < d): the positions are a Golomb-Rice coded stream."""

    positions: BitStream  # gaps of the k ascending indices (``cconv.compressors.golomb``)
    signs: Array  # uint8[ceil(k/8)]
    mu: Array  # float32 scalar


def _stc(ratio: float | None = None, k: int | None = None, positions: str = "int32") -> Compressor:
    size = SparsifierSize(ratio, k)
    kof = size.k
    coded = positions == "golomb"

    def compress(x, state, key):
        check_float("stc", x)
        flat = x.reshape(-1)
        d, kk = flat.shape[0], kof(x.shape)
        if kk >= d:
            idx = jnp.zeros((0,), jnp.int32)
            sel = flat
        else:
            idx = topk_indices(flat, kk)
            sel = flat[idx]
        top = jnp.abs(sel).astype(jnp.float32)
        mu = jnp.mean(top) if top.size else jnp.zeros((), jnp.float32)
        if coded and kk < d:
            return STCGolombPayload(golomb.encode(idx, d), pack_signs(sel), mu), state
        return STCPayload(idx, pack_signs(sel), mu), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        d = size_of(shape)
        if isinstance(payload, STCGolombPayload):
            kk = kof(shape)
            idx, _ = golomb.decode(payload.positions, kk, d)
            vals = payload.mu * unpack_signs(payload.signs, kk, jnp.float32)
            return jnp.zeros((d,), jnp.float32).at[idx].add(vals).astype(dtype).reshape(shape)
        n = payload.indices.shape[0] or d
        vals = payload.mu * unpack_signs(payload.signs, n, jnp.float32)
        if payload.indices.shape[0] == 0:
            return vals.astype(dtype).reshape(shape)
        out = jnp.zeros((d,), jnp.float32).at[payload.indices].add(vals)
        return out.astype(dtype).reshape(shape)

    def wire_bytes(shape, dtype="float32"):
        d, kk = size_of(shape), kof(shape)
        if kk >= d:
            return packed_size(d, 1) + 4
        if coded:
            return golomb.stream_bytes(kk, d) + packed_size(kk, 1) + 4
        return 4 * kk + packed_size(kk, 1) + 4

    def encoded(payload):
        if isinstance(payload, STCGolombPayload):
            return golomb.encoded_bytes(payload.positions) + payload.signs.size + 4
        return jnp.float32(payload_bytes(payload))

    return Compressor(
        stateless_init,
        compress,
        decompress,
        wire_bytes,
        size.density,
        name="stc",
        unbiased=False,
        encoded=encoded if coded else None,
    )


def _wire_bytes(c, shape, isz):
    d = size_of(shape)
    k = sparsifier_k(c, d)
    if k >= d:
        return packed_size(d, 1) + 4
    pos = golomb.closed_form_stream_bytes(k, d) if c.hparams["positions"] == "golomb" else 4 * k
    return pos + packed_size(k, 1) + 4


def _encoded_bytes(c, shape, isz):
    """Expected encoded bytes: Golomb positions at b* + 1/(1 - (1-p)^(2^b*)) bits each for
    Bernoulli(p = k/d) positions (Sattler et al. 2019), the bit count and chunk index words,
    the sign bits and mu; int32 positions (a fixed format): the wire bytes."""
    d = size_of(shape)
    k = sparsifier_k(c, d)
    if k >= d or c.hparams["positions"] != "golomb":
        return float(_wire_bytes(c, shape, isz))
    return golomb.expected_stream_bytes(k, d) + packed_size(k, 1) + 4


def _bound(c, shape):
    """delta = min(k/d, 1/k): all magnitudes equal gives k/d, a spike approaches 1/k."""
    d = size_of(shape)
    k = min(sparsifier_k(c, d), d)
    return Bound("contractive", delta=min(k / d, 1.0 / k))


def _error_sq(c, x, state):
    """||x||^2 - (sum of the top-k |x_i|)^2 / k: the top-k part is projected onto mu * sign."""
    x = flat64(x)
    k = min(sparsifier_k(c, x.size), x.size)
    top = np.abs(x[top_idx(np.abs(x), k)])
    return float(np.sum(x * x)) - float(np.sum(top)) ** 2 / k


def _worst_case(c, shape):
    d = size_of(shape)
    k = min(sparsifier_k(c, d), d)
    if k / d > 1.0 / k:
        raise ValueError("stc: for k/d > 1/k the worst case 1/k is a supremum (a spike), not attained")
    return np.ones(shape)


THEORY = Theory(
    wire_bytes=_wire_bytes, bound=_bound, error_sq=_error_sq, worst_case=_worst_case, encoded_bytes=_encoded_bytes
)

stc = register(
    "stc",
    Entry(
        _stc,
        Schema((*SIZE.params, golomb.POSITIONS), rule=SIZE.rule),
        theory=THEORY,
        knob=Knob("ratio", SPARSE_RATIOS),
        at_density=with_ratio,  # warm-up: ratio = the density
        label="STC",
        example={"ratio": 0.2},
        bench=SPARSE_BENCH,
    ),
)
