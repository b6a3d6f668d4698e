"""Top-k sparsification (Aji & Heafield 2017; Stich, Cordonnier & Jaggi 2018).

C(x)_i = x_i if |x_i| is among the k largest magnitudes, else 0;  k = ceil(ratio * d).
Biased, delta-contractive: ||x - C(x)||^2 <= (1 - k/d) ||x||^2, with equality iff all |x_i| are
equal.  Payload: k values + k int32 indices = k * (itemsize + 4) bytes (8k for fp32); must be
all-gathered (indices differ across workers).  Selection: ``cconv.compressors.select.topk_indices``
(a native one-pass kernel on CPU, ``lax.top_k`` elsewhere): exactly the set ``lax.top_k(|x|, k)``
selects, ties to the lowest index; the k (value, index) pairs travel in ascending index order.
Non-finite input: NaN compares as the largest magnitude, so NaN entries are selected and
propagate; +-inf likewise.
"""

from __future__ import annotations

import numpy as np

from cconv.compressors.base import Compressor, SparsifierSize, check_float, size_of, stateless_init
from cconv.compressors.oracle import alternating, flat64, sparsifier_k, top_idx
from cconv.compressors.registry import Bound, Entry, Knob, Theory, register
from cconv.compressors.select import topk_indices as _select_topk_indices
from cconv.compressors.sparse import (
    SIZE,
    SPARSE_BENCH,
    SPARSE_RATIOS,
    DensePayload,
    decompress_sparse,
    gather_sparse,
    sparse_bytes,
)


def topk_indices(flat, k):
    """Indices of the k largest |flat| (exact; int32, ascending): ``select.topk_indices``."""
    return _select_topk_indices(flat, k)


def _topk(ratio: float | None = None, k: int | None = None) -> Compressor:
    size = SparsifierSize(ratio, k)

    def compress(x, state, key):
        check_float("topk", x)
        d = x.size
        kk = size.k(x.shape)
        if kk >= d:
            return DensePayload(x.reshape(-1)), state
        flat = x.reshape(-1)
        return gather_sparse(flat, topk_indices(flat, kk)), state

    def wire_bytes(shape, dtype="float32"):
        return sparse_bytes(size.k(shape), size_of(shape), dtype)

    return Compressor(
        stateless_init, compress, decompress_sparse, wire_bytes, size.density, name="topk", unbiased=False
    )


def _wire_bytes(c, shape, isz):
    d = size_of(shape)
    k = sparsifier_k(c, d)
    return d * isz if k >= d else k * (isz + 4)


def _error_sq(c, x, state):
    x = flat64(x)
    k = sparsifier_k(c, x.size)
    return float(np.sum(x * x)) - float(np.sum(x[top_idx(np.abs(x), k)] ** 2))


THEORY = Theory(
    wire_bytes=_wire_bytes,
    bound=lambda c, shape: Bound("contractive", delta=sparsifier_k(c, size_of(shape)) / size_of(shape)),
    error_sq=_error_sq,
    worst_case=lambda c, shape: alternating(shape),
)

topk = register(
    "topk",
    Entry(
        _topk,
        SIZE,
        collectives=("gtopk",),
        theory=THEORY,
        knob=Knob("ratio", SPARSE_RATIOS),
        label="top-k",
        cases=({"ratio": 0.2}, {"k": 5}),
        bench=SPARSE_BENCH,
    ),
)
