"""Threshold sparsification (Strom 2015; Dryden et al. 2016): send x_i where |x_i| >= tau.

The number of entries above a fixed threshold varies from step to step, but a compiled
program needs a static message size, so the payload has a fixed *capacity* of k slots
(k = ceil(ratio * d), default ratio 0.01, or ``k``):

* fewer than k entries pass: all of them are sent; the unused slots hold value 0 at index 0
  (harmless under scatter-add) and are still counted on the wire;
* overflow (more than k pass): the k largest magnitudes among them are sent (the rest are lost
  to this step; under error feedback they stay in the residual).

Computed as the exact top-k of |x| (``cconv.compressors.select.topk_indices``, one streaming pass
on CPU) of which the entries with |x_i| >= tau are kept: passing entries rank above the others,
so these are the passing entries, or the k largest of them on overflow.  Slots are in ascending
index order, padding slots among them.

Bytes: k * (itemsize + 4), even when k >= d (the capacity is the message size), so k >= d is
the identity only for tau = 0.  Biased.  ``tau`` has no default (it depends on the gradient
scale); omitting it is a ValueError.  Non-finite: NaN and +-inf compare as the largest
magnitudes, are sent first and propagate.
"""

from __future__ import annotations

from statistics import NormalDist

import jax.numpy as jnp
import numpy as np

from cconv.compressors.base import Compressor, SparsifierSize, check_float, itemsize, size_of, stateless_init
from cconv.compressors.oracle import flat64, sparsifier_k, top_idx
from cconv.compressors.registry import (
    Bench,
    Bound,
    Cost,
    Entry,
    Knob,
    Param,
    Schema,
    Theory,
    ratio_or_k,
    register,
    with_ratio,
)
from cconv.compressors.select import topk_indices
from cconv.compressors.sparse import SIZE, SparsePayload, decompress_sparse, gathered_sum, subtract_sparse


def _threshold(tau: float, ratio: float | None = None, k: int | None = None) -> Compressor:
    size = SparsifierSize(ratio, k)
    kof = size.k

    def compress(x, state, key):
        check_float("threshold", x)
        flat = x.reshape(-1)
        kk = kof(x.shape)
        idx = topk_indices(flat, kk)
        sel = flat[idx]
        sel_mag = jnp.abs(sel).astype(jnp.float32)
        valid = (sel_mag >= tau) | jnp.isnan(sel_mag)
        values = jnp.where(valid, sel, jnp.zeros((), flat.dtype))
        indices = jnp.where(valid, idx, 0).astype(jnp.int32)
        return SparsePayload(values, indices), state

    def wire_bytes(shape, dtype="float32"):
        # A fixed capacity of k slots, always sparse (even when k == d).
        return kof(shape) * (itemsize(dtype) + 4)

    return Compressor(
        stateless_init,
        compress,
        decompress_sparse,
        wire_bytes,
        size.density,
        name="threshold",
        unbiased=False,
        subtract=subtract_sparse,
        gathered_sum=gathered_sum(decompress_sparse),
    )


def _error_sq(c, x, state):
    """What is not sent: the entries below tau, and on overflow those beyond the k largest."""
    x = flat64(x)
    mag = np.abs(x)
    passed = np.flatnonzero(mag >= c.hparams["tau"])
    k = sparsifier_k(c, x.size)
    sent = passed[top_idx(mag[passed], k)] if passed.size > k else passed
    return float(np.sum(x * x)) - float(np.sum(x[sent] ** 2))


# Only non-expansive (delta = 0, attained when nothing reaches tau); no attained worst case.
THEORY = Theory(
    wire_bytes=lambda c, shape, isz: sparsifier_k(c, size_of(shape)) * (isz + 4),
    bound=lambda c, shape: Bound("biased", delta=0.0),
    error_sq=_error_sq,
)

threshold = register(
    "threshold",
    Entry(
        _threshold,
        Schema(
            (Param("tau", "float", None, low=0.0, help="the magnitude threshold", show_help=True), *SIZE.params),
            rule=lambda owner, v: ratio_or_k(owner, v, default_ratio=0.01),
        ),
        theory=THEORY,
        knob=Knob("tau"),
        at_density=with_ratio,  # warm-up: ratio = the density
        label="threshold",
        known_as=("grace:ThresholdCompressor",),  # GRACE (Xu et al. 2021), its data release
        # abs, compare, boolean_mask of values and indices (one comparison pass, then compaction)
        cost=Cost(compress_ops=6, compress_passes=2.0, select="compare", decompress_ops=3, decompress_passes=1.0),
        example={"tau": 0.5, "ratio": 0.2},
        # N(0, 1) input: P(|x| >= tau) = ratio
        bench=Bench(lambda r: {"tau": round(NormalDist().inv_cdf(1 - r / 2), 4), "ratio": r}, 10.0),
    ),
)
