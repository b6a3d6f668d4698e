"""Top-k sparsification (Aji & Heafield 2017; Stich, Cordonnier & Jaggi 2018).

C(x)_i = x_i if |x_i| is among the k largest magnitudes, else 0;  k = ceil(ratio * d).
Biased, delta-contractive: ||x - C(x)||^2 <= (1 - k/d) ||x||^2, with equality iff all |x_i| are
equal.  Payload: k values + k int32 indices = k * (itemsize + 4) bytes (8k for fp32); must be
all-gathered (indices differ across workers).  Selection: ``cconv.compressors.select.topk_indices``
(a native one-pass kernel on CPU, ``lax.top_k`` elsewhere): exactly the set ``lax.top_k(|x|, k)``
selects, ties to the lowest index; the k (value, index) pairs travel in ascending index order.
``positions="golomb"``: the indices travel as Golomb-Rice coded gaps (``cconv.compressors.golomb``,
Sattler et al. 2019): k values + a worst-case buffer of k (1 + b*) + ((d - k) >> b*) bits (with its
bit count and chunk index) moved; ``c.encoded_bytes(payload)`` is the used part, on average
b* + 1/(1 - (1-p)^(2^b*)) bits per position for p = k/d.  Same selection, bit-identical output.
Under ``collective="gtopk"`` the exchange is gTop-k's own (value, int32 index) rounds: use the
default positions there.
Non-finite input: NaN compares as the largest magnitude, so NaN entries are selected and
propagate; +-inf likewise.
"""

from __future__ import annotations

import numpy as np

from cconv.compressors import golomb
from cconv.compressors.base import Compressor, SparsifierSize, check_float, size_of, stateless_init
from cconv.compressors.oracle import alternating, flat64, sparsifier_k, top_idx
from cconv.compressors.registry import Bound, Cost, Entry, Knob, Schema, Theory, register, with_ratio
from cconv.compressors.select import topk_indices as _select_topk_indices
from cconv.compressors.sparse import (
    SIZE,
    SPARSE_BENCH,
    SPARSE_RATIOS,
    DensePayload,
    decompress_sparse,
    gather_sparse,
    gathered_sum,
    sparse_bytes,
    subtract_sparse,
)


def topk_indices(flat, k):
    """Indices of the k largest |flat| (exact; int32, ascending): ``select.topk_indices``."""
    return _select_topk_indices(flat, k)


def _topk(ratio: float | None = None, k: int | None = None, positions: str = "int32") -> Compressor:
    size = SparsifierSize(ratio, k)
    coded = positions == "golomb"

    def compress(x, state, key):
        check_float("topk", x)
        d = x.size
        kk = size.k(x.shape)
        if kk >= d:
            return DensePayload(x.reshape(-1)), state
        flat = x.reshape(-1)
        idx = topk_indices(flat, kk)
        return (golomb.gather(flat, idx) if coded else gather_sparse(flat, idx)), state

    def decompress(payload, like):
        if isinstance(payload, golomb.GolombPayload):
            return golomb.decompress(payload, like)
        return decompress_sparse(payload, like)

    def wire_bytes(shape, dtype="float32"):
        kk, d = size.k(shape), size_of(shape)
        return golomb.moved_bytes(kk, d, dtype) if coded and kk < d else sparse_bytes(kk, d, dtype)

    return Compressor(
        stateless_init,
        compress,
        decompress if coded else decompress_sparse,
        wire_bytes,
        size.density,
        name="topk",
        unbiased=False,
        encoded=golomb.payload_encoded_bytes if coded else None,
        sparse=golomb.to_sparse if coded else None,
        subtract=None if coded else subtract_sparse,
        gathered_sum=gathered_sum(decompress if coded else decompress_sparse, golomb.to_sparse if coded else None),
    )


def _wire_bytes(c, shape, isz):
    d = size_of(shape)
    k = sparsifier_k(c, d)
    if k >= d:
        return d * isz
    return k * isz + (golomb.closed_form_stream_bytes(k, d) if c.hparams["positions"] == "golomb" else 4 * k)


def _encoded_bytes(c, shape, isz):
    """Expected encoded bytes: the k values plus Golomb positions at b* + 1/(1 - (1-p)^(2^b*))
    bits each for Bernoulli(p = k/d) positions (Sattler et al. 2019), with the bit count and the
    chunk index; the wire bytes for the fixed int32 format."""
    d = size_of(shape)
    k = sparsifier_k(c, d)
    if k >= d or c.hparams["positions"] != "golomb":
        return float(_wire_bytes(c, shape, isz))
    return k * isz + golomb.expected_stream_bytes(k, d)


def _error_sq(c, x, state):
    x = flat64(x)
    k = sparsifier_k(c, x.size)
    return float(np.sum(x * x)) - float(np.sum(x[top_idx(np.abs(x), k)] ** 2))


THEORY = Theory(
    wire_bytes=_wire_bytes,
    bound=lambda c, shape: Bound("contractive", delta=sparsifier_k(c, size_of(shape)) / size_of(shape)),
    error_sq=_error_sq,
    worst_case=lambda c, shape: alternating(shape),
    encoded_bytes=_encoded_bytes,
)

topk = register(
    "topk",
    Entry(
        _topk,
        Schema((*SIZE.params, golomb.POSITIONS), rule=SIZE.rule),
        collectives=("gtopk",),
        theory=THEORY,
        knob=Knob("ratio", SPARSE_RATIOS),
        at_density=with_ratio,  # warm-up: ratio = the density
        label="top-k",
        known_as=("grace:TopKCompressor",),  # GRACE (Xu et al. 2021), its data release
        # a framework top-k (tf.math.top_k / torch.topk) per tensor: reshape, abs, top_k, gather, concat;
        # decode: split, scatter_nd into zeros, reshape (grace_dl/tensorflow/compressor/topk.py)
        cost=Cost(compress_ops=5, compress_passes=2.0, select="sort", decompress_ops=3, decompress_passes=1.0),
        example={"ratio": 0.2},
        bench=SPARSE_BENCH,
    ),
)
