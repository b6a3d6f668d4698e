"""Sparse Ternary Compression (Sattler et al., IEEE TNNLS 2019).

C(x)_i = mu * sign(x_i) on the top-k entries, 0 elsewhere; mu = mean of the top-k |x_i|.
Biased (combine with error feedback, as the paper does).
Wire format (uncoded positions, as counted here): k int32 indices + k sign bits packed 8 per
byte + one float32 mu: 4k + ceil(k/8) + 4 bytes.  The paper Golomb-codes the positions, which
is smaller; cconv counts the positions it actually sends.  With k >= d every entry is sent and
the positions are omitted (an empty index array): ceil(d/8) + 4 bytes.  A zero vector gives
mu = 0.  Non-finite input: NaN is selected first and mu becomes NaN.  The top-k set is
``cconv.compressors.select.topk_indices``'s (exactly lax.top_k's set; indices ascending).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from cconv.compressors.base import Array, Compressor, SparsifierSize, check_float, like_info, size_of, stateless_init
from cconv.compressors.oracle import flat64, sparsifier_k, top_idx
from cconv.compressors.packing import pack_signs, packed_size, unpack_signs
from cconv.compressors.registry import Bound, Entry, Knob, Theory, register
from cconv.compressors.select import topk_indices
from cconv.compressors.sparse import SIZE, SPARSE_BENCH, SPARSE_RATIOS


class STCPayload(NamedTuple):
    indices: Array  # int32 (k,), or (0,) when every entry is sent
    signs: Array  # uint8[ceil(k/8)]
    mu: Array  # float32 scalar


def _stc(ratio: float | None = None, k: int | None = None) -> Compressor:
    size = SparsifierSize(ratio, k)
    kof = size.k

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
        return STCPayload(idx, pack_signs(sel), mu), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        d = size_of(shape)
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
        return 4 * kk + packed_size(kk, 1) + 4

    return Compressor(stateless_init, compress, decompress, wire_bytes, size.density, name="stc", unbiased=False)


def _wire_bytes(c, shape, isz):
    d = size_of(shape)
    k = sparsifier_k(c, d)
    return packed_size(d, 1) + 4 if k >= d else 4 * k + packed_size(k, 1) + 4


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


THEORY = Theory(wire_bytes=_wire_bytes, bound=_bound, error_sq=_error_sq, worst_case=_worst_case)

stc = register(
    "stc",
    Entry(
        _stc,
        SIZE,
        theory=THEORY,
        knob=Knob("ratio", SPARSE_RATIOS),
        label="STC",
        cases=({"ratio": 0.2}, {"k": 3}),
        bench=SPARSE_BENCH,
    ),
)
