"""signSGD (Bernstein et al., ICML 2018): C(x) = sign(x), 1 bit per element.

Wire format: sign bits packed 8 per byte, bit = (x >= 0), so sign(0) = +1: ceil(d/8) bytes.
Biased and not scaled (the learning rate carries the magnitude).  Aggregation: payloads are
gathered; the engine averages the signs, or applies the paper's majority vote
sign(sum_w sign(x_w)) (``cconv`` engine option ``vote``; its entry declares ``votes=True``, the
only compressors ``vote`` is allowed with).  A tie (sum_w sign(x_w)_i = 0, possible with an even
number of workers) resolves to +1, as sign(0) = +1 on the wire.  The gathered sum is computed in the
packed domain (``gathered_sum``): sum_w sign(x_w)_i = 2 c_i - P with c_i the number of set bits
at position i over the P payloads, counted by a bit-sliced popcount (``packing.bit_counts``);
exact, so the sum and the vote equal the unpacked path's bit for bit.  Non-finite input: NaN fails x >= 0
and is sent as -1 (NaN does not propagate through signSGD; the loss reveals divergence).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from cconv.compressors.base import Array, Compressor, check_float, like_info, size_of, stateless_init
from cconv.compressors.oracle import flat64
from cconv.compressors.packing import bit_counts, pack_signs, packed_size, unpack_signs
from cconv.compressors.registry import Bench, Bound, Cost, Entry, Theory, register


class SignPayload(NamedTuple):
    signs: Array  # uint8[ceil(d/8)]


def _signsgd() -> Compressor:
    def compress(x, state, key):
        check_float("signsgd", x)
        return SignPayload(pack_signs(x)), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        return unpack_signs(payload.signs, size_of(shape), dtype).reshape(shape)

    def wire_bytes(shape, dtype="float32"):
        return packed_size(size_of(shape), 1)

    def gathered_sum(stacked, like):
        """sum_w (+-1) = 2 * (set bits) - P, counted in the packed domain (exact)."""
        shape, dtype = like_info(like)
        counts = bit_counts(stacked.signs, size_of(shape))
        return (2 * counts - stacked.signs.shape[0]).astype(dtype).reshape(shape)

    return Compressor(
        stateless_init,
        compress,
        decompress,
        wire_bytes,
        lambda shape: 1.0,
        name="signsgd",
        unbiased=False,
        gathered_sum=gathered_sum,
    )


def _error_sq(c, x, state):
    x = flat64(x)
    return float(np.sum((x - np.where(x >= 0, 1.0, -1.0)) ** 2))


# Neither unbiased nor a contraction (||x - sign(x)||^2 >> ||x||^2 for small x): no constant.
THEORY = Theory(
    wire_bytes=lambda c, shape, isz: packed_size(size_of(shape), 1),
    bound=lambda c, shape: Bound("biased"),
    error_sq=_error_sq,
)

# votes: its payloads are signs, so the engine's ``vote=True`` is the paper's majority vote
signsgd = register(
    "signsgd",
    Entry(
        _signsgd,
        theory=THEORY,
        label="signSGD",
        bench=Bench(target_x=4.0),
        votes=True,
        known_as=("grace:SignSGDCompressor",),  # GRACE (Xu et al. 2021), its data release
        # reshape, greater_equal (read 4n, write n bytes); decode: cast, scale, shift, reshape
        cost=Cost(
            compress_ops=2, compress_passes=1.25, decompress_ops=4, decompress_passes=2.5, code_bytes=1.0
        ),  # bool
    ),
)
