"""DGC's sampled-threshold top-k selection with its threshold adjustment (Lin et al., ICLR 2018).

DGC avoids a full top-k over d entries: it estimates the k-th largest magnitude from a sample,
keeps the entries above that threshold, and adjusts the threshold when it selects too many or
too few (the reference implementation, github.com/synxlin/deep-gradient-compression,
``dgc/compression.py``, ``_sparsify``).  Here, with defaults upper_bound = 1.3, lower_bound = 0.8,
adapt_iters = 10 (the reference's compress_upper/lower_bound, max_adaptation_iters):

1. threshold: from a strided sample of n_s = max(ceil(sample_ratio * d), min(d, 256)) entries,
   thr = the ceil(k * n_s / d)-th largest sampled |x_i|; n = #{i : |x_i| >= thr};
2. adjustment (only when the sample is not the whole vector), at most adapt_iters times: if
   n < lower_bound * k, thr <- lower_bound * thr (float32) and n is recounted; otherwise stop;
3. selection:
   - n > upper_bound * k (and the loop stopped before running out): the k largest candidates
     ("resample": a top-k over the selected entries; equals the exact top-k);
   - otherwise the candidates in index order, cut at k (the reference's ``indices[:k]``): all of
     them when n <= k (the remaining slots are padding, value 0 at index 0), the k with the
     lowest indices when k < n (k < n <= upper_bound * k, or n > k after the last lowering).
   When the sample is the whole vector (d <= 256), thr is the exact k-th largest magnitude and
   the k largest entries are sent (the exact top-k; the reference's index-order cut differs from
   it only on ties at the threshold).

Computed as: one counting pass per adjustment (a bounded ``lax.while_loop``), then either the
exact top-k (``cconv.compressors.select.topk_indices``) or the first k candidates in index order
(when n <= upper_bound * k, the usual case: the candidates are among the upper_bound * k largest
magnitudes, so one top-k of that size and a prefix sum; otherwise a top-k of the score d - i over
the candidates), chosen by ``lax.cond``.  Slots are in ascending index order.

The message has a fixed capacity of k (value, int32 index) pairs: k * (itemsize + 4) bytes, at
most k nonzeros.  ``positions="golomb"``: the positions of the sent entries (a prefix of
the k slots) travel Golomb-Rice coded (``cconv.compressors.golomb``) with their int32 count;
the buffer keeps the capacity of k positions, the encoded message only the sent ones.
Biased.  Guarantee: exact coordinates of x are sent, so ||x - C(x)|| <= ||x||
(non-expansive); the exact top-k (delta = k/d) when the sample is the whole vector, otherwise no
delta > 0 holds for every x (the index-order cut may skip the largest candidates: if they are at
high indices, the sent mass can be an arbitrarily small fraction), although on gradients the
sent set is close to the top-k.  Momentum correction and momentum-factor masking are in
``cconv.memory.dgc``.

Non-finite input: NaN counts as an infinite magnitude, so NaN and +-inf entries are selected
first and propagate; if the sample contains one, the threshold is inf and the non-finite
entries (and, after adjustment, no others: inf * 0.8 = inf) are the candidates.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax

from cconv.compressors import golomb
from cconv.compressors.base import Array, Compressor, SparsifierSize, check_float, size_of, stateless_init
from cconv.compressors.oracle import flat64, sparsifier_k, top_idx
from cconv.compressors.registry import Bound, Cost, Entry, Knob, Param, Schema, Theory, register, with_ratio
from cconv.compressors.select import topk_indices
from cconv.compressors.sparse import (
    SIZE,
    SPARSE_BENCH,
    SPARSE_RATIOS,
    DensePayload,
    SparsePayload,
    decompress_sparse,
    gathered_sum,
    sparse_bytes,
    subtract_sparse,
)


class CodedPayload(NamedTuple):
    """``positions="golomb"``: at most k entries; the first ``count`` slots are the sent ones
    (values, Golomb-Rice coded ascending positions, ``cconv.compressors.golomb``), the rest padding
    that takes no bits.  The int32 count travels (4 bytes) so that the values' part of the
    message is known without decoding the positions."""

    values: Array
    positions: golomb.BitStream
    count: Array  # int32 scalar


def sample_layout(d: int, k: int, sample_ratio: float) -> tuple[int, int, int]:
    """(stride, n_s, k_s) of DGC's strided sample of a d-vector: n_s = len(range(0, d, stride))
    sampled entries, the threshold is the k_s-th largest of them."""
    n_s = max(math.ceil(sample_ratio * d), min(d, 256))
    stride = max(d // n_s, 1)
    n_s = len(range(0, d, stride))
    return stride, n_s, max(1, min(n_s, math.ceil(k * n_s / d)))


def sampled_threshold(mag, k: int, sample_ratio: float):
    """DGC's estimate of the k-th largest magnitude from a strided sample (mag: flat |x|)."""
    stride, _, k_s = sample_layout(mag.shape[0], k, sample_ratio)
    sample = mag[::stride]
    return jnp.min(sample[topk_indices(sample, k_s)])


def adjust_threshold(mag, thr, k: int, lower_bound: float, iters: int):
    """DGC's threshold adjustment: while n = #{|x_i| >= thr} < lower_bound * k, at most ``iters``
    times, thr <- lower_bound * thr.  Returns (thr, n, rounds run); a bounded ``lax.while_loop``."""
    low = math.ceil(lower_bound * k)  # n < lower_bound * k  <=>  n < low (n an integer)
    count = lambda t: jnp.sum(mag >= t, dtype=jnp.int32)  # noqa: E731

    def cond(c):
        _, n, i = c
        return (i < iters) & (n < low)

    def body(c):
        t, _, i = c
        t = t * jnp.float32(lower_bound)
        return t, count(t), i + 1

    return lax.while_loop(cond, body, (thr, count(thr), jnp.zeros((), jnp.int32)))


def magnitudes(flat):
    """|x_i| in float32, NaN as an infinite magnitude (selected first, module doc)."""
    mag = jnp.abs(flat).astype(jnp.float32)
    return jnp.where(jnp.isnan(mag), jnp.inf, mag)


def first_k_of_top(mag, thr, n, k: int, high: int):
    """The first k candidates (|x_i| >= thr) in index order when there are n <= ``high`` of them: they
    are among the ``high`` largest magnitudes, so one top-k of that size and a prefix sum.  Fewer
    than k candidates: the other slots are padding.  Returns (indices, valid)."""
    top = topk_indices(mag, min(high, mag.shape[0]))  # ascending indices
    cand = mag[top] >= thr
    rank = jnp.cumsum(cand, dtype=jnp.int32) - 1  # index order among the candidates
    slot = jnp.where(cand & (rank < k), rank, k)
    idx = jnp.zeros((k,), jnp.int32).at[slot].set(top, mode="drop")
    return idx, jnp.arange(k) < n


def first_k_by_index(mag, thr, n, k: int):
    """The first k candidates in index order when there are more than upper_bound * k of them (after
    the last lowering; rare): every candidate ranked by index.  Returns (indices, valid)."""
    d = mag.shape[0]
    cand = mag >= thr
    if d < 1 << 24:  # d - i is exact in float32: one top-k pass ranks candidates by index
        idx = topk_indices(jnp.where(cand, jnp.arange(d, 0, -1, dtype=jnp.float32), 0.0), k)
        return idx, cand[idx]
    idx = jnp.nonzero(cand, size=k, fill_value=0)[0].astype(jnp.int32)
    return idx, jnp.arange(k) < n


def select_slots(flat, k: int, sample_ratio: float, upper_bound: float, lower_bound: float, adapt_iters: int):
    """DGC's k slots of a flat vector (module doc, steps 1-3): (indices ascending, valid)."""
    d = flat.shape[0]
    mag = magnitudes(flat)
    thr = sampled_threshold(mag, k, sample_ratio)
    stride, n_s, _ = sample_layout(d, k, sample_ratio)
    if stride == 1 and n_s == d:  # the sample is everything: thr is the k-th largest |x_i|
        idx = topk_indices(flat, k)
        return idx, mag[idx] >= thr  # all of them (exact top-k)
    thr, n, rounds = adjust_threshold(mag, thr, k, lower_bound, adapt_iters)
    high = math.floor(upper_bound * k)  # n > upper_bound * k  <=>  n > high
    resample = (n > high) & (rounds < adapt_iters)

    def first_k(_):
        return lax.cond(
            n <= high, lambda _: first_k_of_top(mag, thr, n, k, high), lambda _: first_k_by_index(mag, thr, n, k), None
        )

    def top_k(_):
        idx = topk_indices(flat, k)
        return idx, idx >= 0  # all valid (derived from idx: same shard_map variance as first_k)

    return lax.cond(resample, top_k, first_k, None)


def _payload(flat, idx, valid, coded: bool):
    """The k slots (valid ones first, ascending; padding: value 0 at index 0)."""
    values = jnp.where(valid, flat[idx], jnp.zeros((), flat.dtype))
    idx = jnp.where(valid, idx, 0).astype(jnp.int32)
    if coded:  # only the valid prefix is coded
        n = jnp.sum(valid, dtype=jnp.int32)
        return CodedPayload(values, golomb.encode(idx, flat.shape[0], n), n)
    return SparsePayload(values, idx)


def _coded_sparse(p: CodedPayload, like):
    """A Golomb-coded payload as a sparse one: the count says how many values the message holds."""
    sent = jnp.arange(p.values.shape[0]) < p.count
    values = jnp.where(sent, p.values, jnp.zeros((), p.values.dtype))
    return golomb.to_sparse(golomb.GolombPayload(values, p.positions), like)


def _decompress(payload, like):
    return decompress_sparse(_coded_sparse(payload, like) if isinstance(payload, CodedPayload) else payload, like)


def _encoded(p):
    """The count, the valid values and the used part of the position stream (int32 positions: the wire bytes)."""
    if not isinstance(p, CodedPayload):
        return golomb.payload_encoded_bytes(p)
    return 4 + golomb.payload_encoded_bytes(golomb.GolombPayload(p.values, p.positions), count=p.count)


def _dgc(
    ratio: float | None = None,
    k: int | None = None,
    sample_ratio: float = 0.01,
    upper_bound: float = 1.3,
    lower_bound: float = 0.8,
    adapt_iters: int = 10,
    positions: str = "int32",
) -> Compressor:
    size = SparsifierSize(ratio, k)
    kof = size.k
    coded = positions == "golomb"

    def compress(x, state, key):
        check_float("dgc", x)
        flat = x.reshape(-1)
        kk = kof(x.shape)
        if kk >= flat.shape[0]:
            return DensePayload(flat), state
        idx, valid = select_slots(flat, kk, sample_ratio, upper_bound, lower_bound, adapt_iters)
        return _payload(flat, idx, valid, coded), state

    def wire_bytes(shape, dtype="float32"):
        kk, d = kof(shape), size_of(shape)
        return golomb.moved_bytes(kk, d, dtype) + 4 if coded and kk < d else sparse_bytes(kk, d, dtype)

    return Compressor(
        stateless_init,
        compress,
        _decompress,
        wire_bytes,
        size.density,
        name="dgc",
        unbiased=False,
        encoded=_encoded if coded else None,
        sparse=_coded_sparse if coded else None,
        subtract=None if coded else subtract_sparse,
        gathered_sum=gathered_sum(_decompress, _coded_sparse if coded else None),
    )


def _wire_bytes(c, shape, isz):
    d = size_of(shape)
    k = sparsifier_k(c, d)
    if k >= d:
        return d * isz
    return k * isz + (golomb.closed_form_stream_bytes(k, d) + 4 if c.hparams["positions"] == "golomb" else 4 * k)


def _encoded_bytes(c, shape, isz):
    """Expected encoded bytes with Golomb positions: about k entries are sent (between
    lower_bound * k and k after the adjustment), counted as k values plus k positions at
    b* + 1/(1 - (1-p)^(2^b*)) bits (Sattler et al. 2019; an upper estimate); the wire bytes
    for int32 positions."""
    d = size_of(shape)
    k = sparsifier_k(c, d)
    if k >= d or c.hparams["positions"] != "golomb":
        return float(_wire_bytes(c, shape, isz))
    return 4 + k * isz + golomb.expected_stream_bytes(k, d)


def _bound(c, shape):
    """Identity for k >= d; the exact top-k (delta = k/d) when the sample is the whole vector;
    otherwise only non-expansive (delta = 0, module doc: the index-order cut)."""
    d = size_of(shape)
    k = sparsifier_k(c, d)
    if k >= d:
        return Bound("contractive", delta=1.0)
    stride, n_s, _ = sample_layout(d, k, c.hparams["sample_ratio"])
    if stride == 1 and n_s == d:
        return Bound("contractive", delta=k / d, tight=False)
    return Bound("biased", delta=0.0, tight=False)


def replay_selection(x: np.ndarray, k: int, hp: dict) -> tuple[np.ndarray, str]:
    """The indices DGC sends for a flat ``x`` (k < d), replayed in NumPy from the module doc
    (float32 threshold), and which rule picked them: ``"exact"`` (the sample is the whole vector),
    ``"resample"`` (more than upper_bound * k candidates: their top k) or ``"first"`` (the candidates
    in index order, cut at k)."""
    mag = np.abs(x.astype(np.float32))
    mag = np.where(np.isnan(mag), np.float32(np.inf), mag)
    stride, n_s, k_s = sample_layout(x.size, k, hp["sample_ratio"])
    if stride == 1 and n_s == x.size:
        return top_idx(mag, k), "exact"
    thr = np.sort(mag[::stride])[::-1][k_s - 1]
    n, rounds = int(np.sum(mag >= thr)), 0
    while rounds < hp["adapt_iters"] and n < hp["lower_bound"] * k:
        thr = np.float32(thr * np.float32(hp["lower_bound"]))
        n, rounds = int(np.sum(mag >= thr)), rounds + 1
    cand = np.flatnonzero(mag >= thr)  # ascending index
    if n > hp["upper_bound"] * k and rounds < hp["adapt_iters"]:
        return cand[top_idx(mag[cand], k)], "resample"
    return cand[:k], "first"


def _error_sq(c, x, state):
    """||x - C(x)||^2 of the set DGC sends (module doc, ``replay_selection``)."""
    x = flat64(x)
    k = sparsifier_k(c, x.size)
    if k >= x.size:
        return 0.0
    sent, _ = replay_selection(x, k, c.hparams)
    return float(np.sum(x * x)) - float(np.sum(x[sent] ** 2))


# GRACE's TensorFlow DGC (grace_dl/tensorflow/compressor/dgc.py, github.com/sands-lab/grace): a 1 % sample drawn
# with replacement, its max(1, int(n ratio / 100)) largest magnitudes' minimum as the threshold, then a
# tf.while_loop (maximum_iterations=20) while the selected count is above 1.25 K (threshold x 1.25) or below 0.8 K
# (x 0.9), K = max(1, int(n ratio)).  Each round reads the loop's predicate on the host (a round trip: the
# implementation's round_s) and makes 5.5 passes over the tensor (abs reads and writes it: 2, greater writes a
# bool: 1.25, cast writes fp32 from the bool: 1.25, reduce_sum reads it: 1).
GRACE_DGC = {"sample": 0.01, "up": 1.25, "down": 0.8, "raise": 1.25, "lower": 0.9, "cap": 20}
GRACE_ROUND_PASSES = 5.5
ROUND_DRAWS = 16  # samples averaged per tensor size (fixed seeds: deterministic)


def _loop_rounds(n: int, kk: int, thr: float) -> int:
    """Rounds of GRACE's loop on a tensor of n half-normal magnitudes (its quantile grid: the count
    above t is round(n P(|X| > t))), target count kk, from threshold ``thr``."""
    from statistics import NormalDist

    g, tail = GRACE_DGC, lambda t: math.floor(2.0 * n * (1.0 - NormalDist().cdf(t)) + 0.5)
    sel, r = tail(thr), 0
    while (sel > g["up"] * kk or sel < g["down"] * kk) and r < g["cap"]:
        thr *= g["raise"] if sel > g["up"] * kk else g["lower"]
        sel, r = tail(thr), r + 1
    return r


_ROUNDS: dict[tuple[int, float], float] = {}


def grace_rounds(c: Compressor, shape: tuple) -> float:
    """Expected rounds of GRACE's re-threshold loop (``GRACE_DGC``) on a tensor of ``shape``, its
    entries standard normal (the model of a gradient; the loop is scale-free): the sample's
    threshold drawn ``ROUND_DRAWS`` times with fixed seeds, each run of the loop counted on the
    tensor's quantile grid.  More rounds at small ratios: few sampled entries estimate the
    threshold, and K's window [0.8 K, 1.25 K] holds few counts."""
    n = int(math.prod(shape))
    ratio = sparsifier_k(c, n) / n
    key = (n, ratio)
    if key not in _ROUNDS:
        g = GRACE_DGC
        s, ks, kk = max(1, int(n * g["sample"])), max(1, int(n * ratio * g["sample"])), max(1, int(n * ratio))
        rng = np.random.default_rng([n, ks])
        draws = np.sort(np.abs(rng.standard_normal((ROUND_DRAWS, s))), axis=1)[:, s - min(ks, s)]
        _ROUNDS[key] = float(np.mean([_loop_rounds(n, kk, float(t)) for t in draws]))
    return _ROUNDS[key]


THEORY = Theory(wire_bytes=_wire_bytes, bound=_bound, error_sq=_error_sq, encoded_bytes=_encoded_bytes)

dgc = register(
    "dgc",
    Entry(
        _dgc,
        Schema(
            (
                *SIZE.params,
                Param("sample_ratio", "float", 0.01, low=0.0, high=1.0, low_open=True),
                Param("upper_bound", "float", 1.3, low=1.0, help="resample above upper_bound * k candidates"),
                Param("lower_bound", "float", 0.8, low=0.0, high=1.0, low_open=True, help="threshold factor"),
                Param("adapt_iters", "int", 10, low=0, help="threshold adjustments at most"),
                golomb.POSITIONS,
            ),
            rule=SIZE.rule,
        ),
        collectives=("gtopk",),
        theory=THEORY,
        knob=Knob("ratio", SPARSE_RATIOS),
        at_density=with_ratio,  # warm-up: ratio = the density
        label="DGC",
        known_as=("grace:DgcCompressor", "espresso:DGC"),  # GRACE (Xu et al. 2021), Espresso (EuroSys 2023)
        # sample, top-k of the sample, threshold, mask, count (and re-threshold), compact (Lin et al. 2018;
        # grace_dl/tensorflow/compressor/dgc.py: ~12 ops, 3 passes); decode as top-k
        # and the re-threshold loop's expected rounds (``grace_rounds``), each a host round trip and 5.5 passes
        cost=Cost(
            compress_ops=12,
            compress_passes=3.0,
            select="sample",
            decompress_ops=3,
            decompress_passes=1.0,
            rounds=grace_rounds,
            round_passes=GRACE_ROUND_PASSES,
        ),
        example={"ratio": 0.2},
        bench=SPARSE_BENCH,
    ),
)
