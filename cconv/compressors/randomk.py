"""Random-k sparsification (Wangni et al. 2018; Stich, Cordonnier & Jaggi 2018).

S is a uniformly random set of exactly k distinct coordinates (k = ceil(ratio * d)).

* ``scaled=True`` (default): C(x) = (d/k) x on S.  Unbiased, E||C(x) - x||^2 = (d/k - 1)||x||^2,
  i.e. omega = d/k - 1.  Not a contraction when k < d/2: do not use it under error feedback.
* ``scaled=False``: C(x) = x on S.  Biased, E||x - C(x)||^2 = (1 - k/d)||x||^2 (contraction in
  expectation, delta = k/d); this is the variant for error feedback.

Wire format:
* ``shared=True`` (default): every worker draws S from the same key, so indices need not travel:
  the payload is the k values plus the 8-byte key they were drawn with (the receiver regenerates
  S).  Payloads are summable (all-reduce of the values); the engine must give all workers the
  same key.  Bytes: k * itemsize + 8.
* ``shared=False``: independent keys per worker; payload k values + k int32 indices, all-gathered.
  With ``positions="golomb"`` the (ascending) indices travel as Golomb-Rice coded gaps
  (``cconv.compressors.golomb``, Sattler et al. 2019): k values + a worst-case buffer of
  k (1 + b*) + ((d - k) >> b*) bits with its bit count and chunk index moved; the encoded
  message (``c.encoded_bytes``) averages b* + 1/(1 - (1-p)^(2^b*)) bits per position, p = k/d.
  Same sample, bit-identical output.  Only where indices travel: ``shared=True`` with
  ``positions="golomb"`` is refused (there is nothing to code).

Non-finite input: only the sampled entries travel; NaN/inf there propagate.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cconv.compressors import golomb, keyed
from cconv.compressors.base import (
    Array,
    Compressor,
    DensePayload,
    SparsifierSize,
    check_float,
    itemsize,
    like_info,
    size_of,
    stateless_init,
)
from cconv.compressors.oracle import alternating, flat64, sparsifier_k
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
from cconv.compressors.select import sample_k_distinct
from cconv.compressors.sparse import (
    SIZE,
    SPARSE_RATIOS,
    SparsePayload,
    decompress_sparse,
    gathered_sum,
    scatter,
    sparse_bytes,
    subtract_sparse,
)


class SharedKeyPayload(NamedTuple):
    values: Array  # (k,) input dtype, already scaled if scaled=True
    key: Array  # raw key data (uint32); identical on all workers, regenerates the indices


def _raw(key: Array) -> Array:
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(key)
    return key


def sample_indices(key: Array, d: int, k: int) -> Array:
    """k distinct indices drawn uniformly from range(d) (int32, ascending), in O(k):
    ``cconv.compressors.select.sample_k_distinct`` (not a permutation of range(d))."""
    return sample_k_distinct(jax.random.wrap_key_data(_raw(key)), d, k)


def _drawn(raw: Array, d: int, k: int) -> Array:
    """``sample_indices``, traced once per key array in an exchange (``cconv.compressors.keyed``):
    compress, error feedback's residual and the aggregation's decoding read the same key."""
    return keyed.derived(raw, (sample_indices, d, k), lambda: sample_indices(raw, d, k))


def _randomk(
    ratio: float | None = None, k: int | None = None, scaled: bool = True, shared: bool = True, positions: str = "int32"
) -> Compressor:
    size = SparsifierSize(ratio, k)
    kof = size.k
    coded = positions == "golomb"

    def compress(x, state, key):
        check_float("randomk", x)
        d = x.size
        kk = kof(x.shape)
        flat = x.reshape(-1)
        if kk >= d:
            return DensePayload(flat), state
        raw = _raw(key)
        idx = _drawn(raw, d, kk)
        values = flat[idx]
        if scaled:
            values = values * jnp.asarray(d / kk, x.dtype)
        if shared:
            return SharedKeyPayload(values, raw), state
        if coded:  # idx is ascending (sample_k_distinct), as gap coding needs
            return golomb.GolombPayload(values, golomb.encode(idx, d)), state
        return SparsePayload(values, idx), state

    def decompress(payload, like):
        if isinstance(payload, SharedKeyPayload):
            shape, _ = like_info(like)
            d = size_of(shape)
            idx = _drawn(payload.key, d, payload.values.shape[0])
            return scatter(payload.values, idx, like)
        if isinstance(payload, golomb.GolombPayload):
            return golomb.decompress(payload, like)
        return decompress_sparse(payload, like)

    def wire_bytes(shape, dtype="float32"):
        d, kk = size_of(shape), kof(shape)
        if kk >= d:
            return d * itemsize(dtype)
        if shared:
            return kk * itemsize(dtype) + 8
        if coded:
            return golomb.moved_bytes(kk, d, dtype)
        return sparse_bytes(kk, d, dtype)

    return Compressor(
        stateless_init,
        compress,
        decompress,
        wire_bytes,
        size.density,
        name="randomk",
        unbiased=bool(scaled),
        encoded=golomb.payload_encoded_bytes if coded else None,
        sparse=golomb.to_sparse if coded else None,
        subtract=None if coded or shared else subtract_sparse,
        gathered_sum=None if shared else gathered_sum(decompress, golomb.to_sparse if coded else None),
    )


def _wire_bytes(c, shape, isz):
    d = size_of(shape)
    k = sparsifier_k(c, d)
    if k >= d:
        return d * isz
    if c.hparams["shared"]:
        return k * isz + 8
    return k * isz + (golomb.closed_form_stream_bytes(k, d) if c.hparams["positions"] == "golomb" else 4 * k)


def _encoded_bytes(c, shape, isz):
    """Expected encoded bytes: k values plus Golomb positions of a uniform k-subset at
    b* + 1/(1 - (1-p)^(2^b*)) bits each (Sattler et al. 2019's Bernoulli(p = k/d) model), the bit
    count and chunk index; the wire bytes for fixed formats."""
    d = size_of(shape)
    k = sparsifier_k(c, d)
    if k >= d or c.hparams["positions"] != "golomb":
        return float(_wire_bytes(c, shape, isz))
    return k * isz + golomb.expected_stream_bytes(k, d)


def _bound(c, shape):
    d = size_of(shape)
    k = sparsifier_k(c, d)
    if c.hparams["scaled"]:
        return Bound("unbiased", omega=d / k - 1.0, delta=1.0 if k >= d else None)
    return Bound("contractive", delta=k / d)


def _error_sq(c, x, state):
    x = flat64(x)
    d, sq = x.size, float(np.sum(x * x))
    k = sparsifier_k(c, d)
    if k >= d:
        return 0.0
    return (d / k - 1.0) * sq if c.hparams["scaled"] else (1.0 - k / d) * sq


def _variance(c, x):
    """Var[C(x)_i] = (d/k - 1) x_i^2 (scaled: each entry is kept with probability k/d)."""
    if not c.hparams["scaled"]:
        return None
    x = flat64(x)
    k = sparsifier_k(c, x.size)
    return np.zeros_like(x) if k >= x.size else (x.size / k - 1.0) * x * x


THEORY = Theory(
    wire_bytes=_wire_bytes,
    bound=_bound,
    error_sq=_error_sq,
    variance=_variance,
    worst_case=lambda c, shape: alternating(shape),
    encoded_bytes=_encoded_bytes,
)


def _rule(owner: str, values: dict) -> dict:
    """ratio or k (``ratio_or_k``); Golomb positions only where the indices travel (shared=False)."""
    values = ratio_or_k(owner, values)
    if values["positions"] == "golomb" and values["shared"]:
        raise ValueError(
            f"{owner}: positions='golomb' needs shared=False (with a shared key the indices do not travel)"
        )
    return values


randomk = register(
    "randomk",
    Entry(
        _randomk,
        Schema(
            (*SIZE.params, Param("scaled", "bool", True), Param("shared", "bool", True), golomb.POSITIONS), rule=_rule
        ),
        aggregation=lambda hp: "allreduce" if hp["shared"] else "allgather",
        theory=THEORY,
        knob=Knob("ratio", SPARSE_RATIOS),
        at_density=with_ratio,  # warm-up: ratio = the density
        label="random-k",
        known_as=("grace:RandomKCompressor",),  # GRACE (Xu et al. 2021), its data release
        # random indices, gather (k elements, no pass over the tensor); decode: scatter_nd, reshape
        cost=Cost(compress_ops=3, compress_passes=0.0, decompress_ops=3, decompress_passes=1.0),
        example={"ratio": 0.2},
        bench=Bench(lambda r: {"ratio": r}, 4.0),
    ),
)
