"""Scaled sign, the compressor of EF-signSGD (Karimireddy et al., ICML 2019).

C(x) = (||x||_1 / d) * sign(x), sign(0) = +1.  Biased; deterministic contraction with
||x - C(x)||^2 = ||x||^2 - ||x||_1^2 / d  (delta = ||x||_1^2 / (d ||x||^2) >= 1/d).
Wire format: ceil(d/8) bytes of packed signs + one float32 scale.  A zero vector gives scale 0
and a zero output.  Non-finite input: the scale is NaN/inf and so is the whole output.

Gathered payloads are summed in the packed domain (``gathered_sum``): sum_w scale_w * (+-1)_w,
each worker's bits unpacked and scaled inside one accumulation over the P workers
(``packing.sum_rows``; the scales differ per worker, so each bit is multiplied by its own
worker's scale: no integer shortcut; the same products, summed in worker order, without the
P x d float32 intermediate).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from cconv.compressors.base import Array, Compressor, check_float, like_info, size_of, stateless_init
from cconv.compressors.oracle import flat64, spike
from cconv.compressors.packing import pack_signs, packed_size, row, sum_rows, unpack_signs
from cconv.compressors.registry import Bench, Bound, Entry, Theory, register


class ScaledSignPayload(NamedTuple):
    signs: Array  # uint8[ceil(d/8)]
    scale: Array  # float32: ||x||_1 / d


def _scaled_sign() -> Compressor:
    def compress(x, state, key):
        check_float("scaled_sign", x)
        d = max(x.size, 1)
        scale = jnp.sum(jnp.abs(x.astype(jnp.float32))) / d
        return ScaledSignPayload(pack_signs(x), scale), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        signs = unpack_signs(payload.signs, size_of(shape), jnp.float32)
        return (payload.scale * signs).astype(dtype).reshape(shape)

    def wire_bytes(shape, dtype="float32"):
        return packed_size(size_of(shape), 1) + 4

    def gathered_sum(stacked, like):
        return sum_rows(lambda w: decompress(row(stacked, w), like), stacked.signs.shape[0])

    return Compressor(
        stateless_init,
        compress,
        decompress,
        wire_bytes,
        lambda shape: 1.0,
        name="scaled_sign",
        unbiased=False,
        gathered_sum=gathered_sum,
    )


def _error_sq(c, x, state):
    x = flat64(x)
    return float(np.sum(x * x)) - float(np.sum(np.abs(x))) ** 2 / x.size


# delta = 1/d, attained at a spike e_1.
THEORY = Theory(
    wire_bytes=lambda c, shape, isz: packed_size(size_of(shape), 1) + 4,
    bound=lambda c, shape: Bound("contractive", delta=1.0 / size_of(shape)),
    error_sq=_error_sq,
    worst_case=lambda c, shape: spike(shape),
)

scaled_sign = register(
    "scaled_sign",
    Entry(
        _scaled_sign,
        theory=THEORY,
        label="scaled sign (EF-signSGD)",
        bench=Bench(target_x=4.0),
        known_as=("espresso:EFSignSGD",),  # Espresso (EuroSys 2023), Table 1
    ),
)
