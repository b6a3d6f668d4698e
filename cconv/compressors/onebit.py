"""1-bit SGD (Seide et al., Interspeech 2014): one bit per element plus the mean of each sign group.

C(x)_i = mean{x_j : x_j >= 0} if x_i >= 0, else mean{x_j : x_j < 0}  (sign(0) = +1).
The reconstruction values minimise the squared error given the sign bits.  Biased; the paper
uses it with error feedback ("error compensation").

``columns=False`` (default): two float32 means per tensor.  ``columns=True``: as in the paper,
per column of the matrix view (prod(shape[:-1]) x shape[-1]): two float32 means per column.
Wire format: ceil(d/8) bytes of packed sign bits + 8 bytes (or 8 * n_columns).  An empty group
has mean 0; a zero vector decompresses to zero.  Non-finite input: NaN fails x >= 0, so it
joins the negative group; the mean of a group (per column with ``columns``) that holds a NaN or
+-inf is non-finite, and so is every entry of that group; the other group stays finite.

Gathered payloads are summed in the packed domain (``gathered_sum``): each worker's bits are
unpacked inside one accumulation over the P workers (``packing.sum_rows``) that picks the
worker's own mean (per column with ``columns``): the same values, summed in worker order, without
the P x d float32 intermediate (the means differ per worker: no integer shortcut).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from cconv.compressors.base import Array, Compressor, check_float, like_info, safe_div, size_of, stateless_init
from cconv.compressors.oracle import flat64, spike
from cconv.compressors.packing import pack_signs, packed_size, row, sum_rows, unpack_bits
from cconv.compressors.registry import Bench, Bound, Entry, Param, Schema, Theory, register


class OneBitPayload(NamedTuple):
    signs: Array  # uint8[ceil(d/8)], bit = x >= 0
    means: Array  # float32 (2,) or (2, n_columns): [mean of x>=0, mean of x<0]


def _ncols(shape, columns):
    return shape[-1] if (columns and len(shape) >= 2) else 1


def _onebit(columns: bool = False) -> Compressor:
    def compress(x, state, key):
        check_float("onebit", x)
        n = _ncols(x.shape, columns)
        m = x.astype(jnp.float32).reshape(-1, n)
        pos = m >= 0
        pos_mean = safe_div(jnp.sum(jnp.where(pos, m, 0), axis=0), jnp.sum(pos, axis=0).astype(jnp.float32))
        neg_mean = safe_div(jnp.sum(jnp.where(pos, 0, m), axis=0), jnp.sum(~pos, axis=0).astype(jnp.float32))
        means = jnp.stack([pos_mean, neg_mean])
        if not (columns and x.ndim >= 2):
            means = means.reshape(2)
        return OneBitPayload(pack_signs(x), means), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        n = _ncols(shape, columns)
        bits = unpack_bits(payload.signs, 1, size_of(shape)).reshape(-1, n)
        means = payload.means.reshape(2, -1)
        out = jnp.where(bits == 1, means[0], means[1])
        return out.astype(dtype).reshape(shape)

    def wire_bytes(shape, dtype="float32"):
        return packed_size(size_of(shape), 1) + 8 * _ncols(tuple(shape), columns)

    def gathered_sum(stacked, like):
        return sum_rows(lambda w: decompress(row(stacked, w), like), stacked.signs.shape[0])

    return Compressor(
        stateless_init,
        compress,
        decompress,
        wire_bytes,
        lambda shape: 1.0,
        name="onebit",
        unbiased=False,
        gathered_sum=gathered_sum,
    )


def _groups(c, shape) -> int:
    """Columns with their own pair of means (1 unless ``columns`` and a matrix)."""
    return int(shape[-1]) if (c.hparams["columns"] and len(shape) >= 2) else 1


def _bound(c, shape):
    """delta = 1/n with n the entries per column (a spike in one column), attained."""
    return Bound("contractive", delta=1.0 / (size_of(shape) // _groups(c, shape)))


def _error_sq(c, x, state):
    """||x||^2 minus, per column and sign group G, (sum_G x_i)^2 / |G| (projection onto the means)."""
    shape = np.shape(x)
    x = flat64(x)
    kept = 0.0
    for col in x.reshape(-1, _groups(c, shape)).T:
        for grp in (col[col >= 0], col[col < 0]):
            if grp.size:
                kept += float(np.sum(grp)) ** 2 / grp.size
    return float(np.sum(x * x)) - kept


THEORY = Theory(
    wire_bytes=lambda c, shape, isz: packed_size(size_of(shape), 1) + 8 * _groups(c, shape),
    bound=_bound,
    error_sq=_error_sq,
    worst_case=lambda c, shape: spike(shape),
)

onebit = register(
    "onebit",
    Entry(
        _onebit,
        Schema((Param("columns", "bool", False),)),
        theory=THEORY,
        label="1-bit SGD",
        bench=Bench(target_x=4.0),
    ),
)
