"""DGC's sampled-threshold top-k selection (Lin et al., ICLR 2018).

DGC avoids a full top-k over d entries: it estimates the k-th largest magnitude from a sample,
then keeps the entries above that threshold.  Here:

1. threshold: from a strided sample of n_s = max(ceil(sample_ratio * d), min(d, 256)) entries,
   thr = the ceil(k * n_s / d)-th largest sampled |x_i|;
2. candidates: entries with |x_i| >= thr;
3. selection: if there are at least k candidates, the k largest of them (DGC's hierarchical
   top-k on the candidates: this equals the exact top-k); if fewer, all candidates are sent and
   the remaining slots are padding (value 0 at index 0), as DGC sends what passes its threshold.

Computed as: the exact top-k (``cconv.compressors.select.topk_indices``: one streaming pass on
CPU), of which the entries with |x_i| >= thr are kept.  Candidates rank above non-candidates, so
this is the set of steps 2-3 in both cases, without materialising a d-sized score array.  Slots
are in ascending index order; padding slots sit among them (value 0 at index 0).

The message therefore has a fixed capacity of k (value, int32 index) pairs: k * (itemsize + 4)
bytes, at most k nonzeros.  Biased; contraction at least as weak as top-k's (the sent set is a
subset of the top-k set that always contains the largest entry).  Momentum correction and
momentum-factor masking are in ``cconv.memory.dgc``.

Non-finite input: NaN counts as an infinite magnitude, so NaN and +-inf entries are selected
first and propagate; if the sample contains one, the threshold is inf and only the non-finite
entries are sent.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from cconv.compressors.base import Compressor, SparsifierSize, check_float, size_of, stateless_init
from cconv.compressors.oracle import flat64, sparsifier_k, top_idx
from cconv.compressors.registry import RATIO, Bound, Entry, K, Knob, Param, Schema, Theory, ratio_or_k, register
from cconv.compressors.select import topk_indices
from cconv.compressors.sparse import (
    SPARSE_BENCH,
    SPARSE_RATIOS,
    DensePayload,
    SparsePayload,
    decompress_sparse,
    sparse_bytes,
)


def sampled_threshold(mag, k: int, sample_ratio: float):
    """DGC's estimate of the k-th largest magnitude from a strided sample (mag: flat |x|)."""
    d = mag.shape[0]
    n_s = max(math.ceil(sample_ratio * d), min(d, 256))
    stride = max(d // n_s, 1)
    sample = mag[::stride]
    n_s = sample.shape[0]
    k_s = max(1, min(n_s, math.ceil(k * n_s / d)))
    return jnp.min(sample[topk_indices(sample, k_s)])


def _dgc(ratio: float | None = None, k: int | None = None, sample_ratio: float = 0.01) -> Compressor:
    size = SparsifierSize(ratio, k)
    kof = size.k

    def compress(x, state, key):
        check_float("dgc", x)
        flat = x.reshape(-1)
        d, kk = flat.shape[0], kof(x.shape)
        if kk >= d:
            return DensePayload(flat), state
        mag = jnp.abs(flat).astype(jnp.float32)
        mag = jnp.where(jnp.isnan(mag), jnp.inf, mag)
        thr = sampled_threshold(mag, kk, sample_ratio)
        idx = topk_indices(flat, kk)
        sel = flat[idx]
        sel_mag = jnp.abs(sel).astype(jnp.float32)
        valid = jnp.where(jnp.isnan(sel_mag), jnp.inf, sel_mag) >= thr
        values = jnp.where(valid, sel, jnp.zeros((), flat.dtype))
        return SparsePayload(values, jnp.where(valid, idx, 0).astype(jnp.int32)), state

    def wire_bytes(shape, dtype="float32"):
        return sparse_bytes(kof(shape), size_of(shape), dtype)

    return Compressor(stateless_init, compress, decompress_sparse, wire_bytes, size.density, name="dgc", unbiased=False)


def _wire_bytes(c, shape, isz):
    d = size_of(shape)
    k = sparsifier_k(c, d)
    return d * isz if k >= d else k * (isz + 4)


def _sample_k(d: int, k: int, sample_ratio: float) -> int:
    """k_s: how many sampled magnitudes are >= DGC's threshold (the oracle's own count)."""
    n_s = max(math.ceil(sample_ratio * d), min(d, 256))
    stride = max(d // n_s, 1)
    n_s = len(range(0, d, stride))
    return max(1, min(n_s, math.ceil(k * n_s / d)))


def _bound(c, shape):
    """At least the k_s sampled entries above the threshold are sent: delta >= k_s / d (a valid
    bound, not tight); k >= d is the identity."""
    d = size_of(shape)
    k = sparsifier_k(c, d)
    if k >= d:
        return Bound("contractive", delta=1.0)
    return Bound("contractive", delta=_sample_k(d, k, c.hparams["sample_ratio"]) / d, tight=False)


def _error_sq(c, x, state):
    """The entries of the top-k set at or above the sampled threshold are sent (module doc)."""
    x = flat64(x)
    d = x.size
    k = sparsifier_k(c, d)
    if k >= d:
        return 0.0
    mag = np.abs(x.astype(np.float32)).astype(np.float64)
    n_s = max(math.ceil(c.hparams["sample_ratio"] * d), min(d, 256))
    sample = mag[:: max(d // n_s, 1)]
    k_s = max(1, min(sample.size, math.ceil(k * sample.size / d)))
    thr = np.sort(sample)[::-1][k_s - 1]
    cand = np.flatnonzero(mag >= thr)
    sent = cand[top_idx(mag[cand], k)] if cand.size > k else cand
    return float(np.sum(x * x)) - float(np.sum(x[sent] ** 2))


THEORY = Theory(wire_bytes=_wire_bytes, bound=_bound, error_sq=_error_sq)

dgc = register(
    "dgc",
    Entry(
        _dgc,
        Schema((RATIO, K, Param("sample_ratio", "float", 0.01, low=0.0, high=1.0, low_open=True)), rule=ratio_or_k),
        collectives=("gtopk",),
        theory=THEORY,
        knob=Knob("ratio", SPARSE_RATIOS),
        label="DGC",
        cases=({"ratio": 0.2},),
        bench=SPARSE_BENCH,
    ),
)
