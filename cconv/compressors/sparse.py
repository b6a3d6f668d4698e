"""Shared pieces of the sparsifiers: the (values, indices) payload and its decompression.

A sparse payload carries ``k`` values in the input dtype and ``k`` int32 flat indices:
``k * (itemsize + 4)`` bytes, e.g. 8k for fp32 (the size the papers count with int32 indices).
Decompression is a scatter-*add*, so padding slots (value 0 at index 0) are harmless and the
payloads of several workers can be decompressed in one scatter.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from cconv.compressors.base import Array, DensePayload, itemsize, like_info, size_of
from cconv.compressors.registry import RATIO, Bench, K, Schema, ratio_or_k

__all__ = [
    "SparsePayload",
    "DensePayload",
    "scatter",
    "decompress_sparse",
    "subtract_sparse",
    "sparse_bytes",
    "gather_sparse",
    "SIZE",
    "SPARSE_RATIOS",
    "SPARSE_BENCH",
]

SIZE = Schema((RATIO, K), rule=ratio_or_k)  # exactly one of ratio and k
SPARSE_RATIOS = (0.1, 0.01, 0.001)  # the ratios a sweep varies (``Knob``)
SPARSE_BENCH = Bench(lambda r: {"ratio": r}, 10.0)  # benchmarked at each ratio, target 10x the read floor


class SparsePayload(NamedTuple):
    values: Array  # (k,) input dtype
    indices: Array  # (k,) int32 flat indices into x.reshape(-1)


def scatter(values: Array, indices: Array, like) -> Array:
    """Dense array of like's shape/dtype with values added at flat indices."""
    shape, dtype = like_info(like)
    d = size_of(shape)
    out = jnp.zeros((d,), dtype).at[indices.reshape(-1)].add(values.reshape(-1).astype(dtype))
    return out.reshape(shape)


def decompress_sparse(payload, like) -> Array:
    shape, dtype = like_info(like)
    if isinstance(payload, DensePayload):
        return payload.values.reshape(shape).astype(dtype)
    return scatter(payload.values, payload.indices, like)


def subtract_sparse(y: Array, payload) -> Array:
    """``y - decompress_sparse(payload, y)`` as one scatter-add of the negated values into ``y``
    (``Compressor.subtract``): no dense zeros, no dense scatter, no dense subtraction.  For
    distinct indices each entry is y_i + (-v) = y_i - v exactly (IEEE negation is exact); padding
    slots (value 0 at index 0) add zero."""
    if isinstance(payload, DensePayload):
        return y - payload.values.reshape(y.shape).astype(y.dtype)
    flat = y.reshape(-1).at[payload.indices.reshape(-1)].add(-payload.values.reshape(-1).astype(y.dtype))
    return flat.reshape(y.shape)


def gathered_sum(decompress, pairs=None):
    """The ``gathered_sum`` hook of a sparsifier (``Compressor.sum_gathered``): gathered sparse
    payloads are one scatter-add of all P*k (value, index) pairs into one dense array, O(d + Pk)
    (decompressing each into its own dense array and summing costs P dense passes); coded
    positions go through ``pairs(payload, like) -> SparsePayload`` first; dense payloads (k >= d)
    are decoded and summed."""

    def total(stacked, like):
        if isinstance(stacked, SparsePayload):
            return scatter(stacked.values.reshape(-1), stacked.indices.reshape(-1), like)
        if pairs is not None and not isinstance(stacked, DensePayload):
            got = jax.vmap(lambda p: pairs(p, like))(stacked)
            return scatter(got.values.reshape(-1), got.indices.reshape(-1), like)
        return jax.vmap(lambda p: decompress(p, like))(stacked).sum(0)

    return total


def sparse_bytes(k: int, d: int, dtype) -> int:
    """Wire size of a sparse payload with k entries (dense array if k >= d)."""
    if k >= d:
        return d * itemsize(dtype)
    return k * (itemsize(dtype) + 4)


def gather_sparse(flat: Array, idx: Array) -> SparsePayload:
    return SparsePayload(values=flat[idx], indices=idx.astype(jnp.int32))
