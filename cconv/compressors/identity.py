"""Identity (``none``): the uncompressed baseline.  Payload: the array; 32 bits/element for fp32.

Unbiased with omega = 0, summable (dense all-reduce).  Non-finite input passes through unchanged.
Other layers name the baseline by ``cconv.compressors.IDENTITY``, never by its string.
"""

from __future__ import annotations

import numpy as np

from cconv.compressors.base import Compressor, DensePayload, check_float, itemsize, like_info, size_of, stateless_init
from cconv.compressors.oracle import alternating
from cconv.compressors.registry import Bench, Bound, Cost, Entry, Theory, register

IDENTITY = "none"  # the registered name of the uncompressed baseline


def _identity() -> Compressor:
    def compress(x, state, key):
        check_float(IDENTITY, x)
        return DensePayload(x), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        return payload.values.reshape(shape).astype(dtype)

    def wire_bytes(shape, dtype="float32"):
        return size_of(shape) * itemsize(dtype)

    return Compressor(stateless_init, compress, decompress, wire_bytes, lambda shape: 1.0, name=IDENTITY, unbiased=True)


THEORY = Theory(
    wire_bytes=lambda c, shape, isz: size_of(shape) * isz,
    bound=lambda c, shape: Bound("unbiased", omega=0.0, delta=1.0),
    error_sq=lambda c, x, state: 0.0,
    variance=lambda c, x: np.zeros(np.size(x)),
    worst_case=lambda c, shape: alternating(shape),
)

identity = register(
    IDENTITY,
    Entry(
        _identity,
        aggregation="allreduce",
        theory=THEORY,
        label="dense (no compression)",
        bench=Bench(target_x=4.0),
        cost=Cost(compress_ops=0, compress_passes=0.0, decompress_ops=0, decompress_passes=0.0),  # nothing to do
    ),
)
