"""Float64 NumPy helpers shared by the compressors' ``Theory`` oracles.

The oracles (each compressor module's ``THEORY``) compute wire sizes, worst-case constants and
exact errors from the papers' closed forms, independently of the JAX implementations, so the
tests can compare the two.  ``cconv.theory.constants`` dispatches to them.
"""

from __future__ import annotations

import numpy as np

from cconv.compressors.base import Compressor, resolve_k
from cconv.compressors.packing import packed_size

__all__ = ["flat64", "sparsifier_k", "top_idx", "alternating", "spike", "packed_size"]


def flat64(x) -> np.ndarray:
    """x as a flat float64 array."""
    return np.asarray(x).astype(np.float64).reshape(-1)


def sparsifier_k(c: Compressor, d: int) -> int:
    """Entries a sparsifier keeps of d: ceil(ratio * d) or k, clipped to [1, d] (``resolve_k``)."""
    return resolve_k(d, c.hparams.get("ratio"), c.hparams.get("k"))


def top_idx(mag: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest magnitudes; among equal ones the lowest index first (as lax.top_k)."""
    return np.argsort(-mag, kind="stable")[:k]


def alternating(shape) -> np.ndarray:
    """All magnitudes equal, signs alternating (+1, -1, +1, ...): the worst case of top-k and friends."""
    d = int(np.prod(shape, dtype=np.int64))
    return np.where(np.arange(d) % 2 == 0, 1.0, -1.0).reshape(shape)


def spike(shape, value: float = 1.0) -> np.ndarray:
    """value * e_1 (the first coordinate)."""
    x = np.zeros(int(np.prod(shape, dtype=np.int64)))
    if x.size:
        x[0] = value
    return x.reshape(shape)
