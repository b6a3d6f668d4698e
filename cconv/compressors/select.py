"""Selection primitives of the sparsifiers: exact top-k by magnitude, and k distinct random indices.

``topk_indices(x, k)``
    The indices of the k entries of largest magnitude along the last axis, exact, as int32 in
    ascending index order.  The order on entries is XLA's total order on |x| (the one
    ``lax.top_k(jnp.abs(x), k)`` uses): NaN is the largest magnitude (NaNs with different
    payloads compare by payload), then +-inf, then finite values; -0 == +0; subnormals are
    kept; ties go to the lower index.  So the selected *set* is exactly
    ``topk_indices_reference``'s; only the order of the returned indices differs (ascending
    here, by magnitude there), and tests check the equality of sets across dtypes, shapes, ties
    and non-finite inputs.

    On CPU, for float32/bfloat16/float16/float64, it calls a native XLA FFI kernel
    (``cconv/_native/select.cc``): a threshold estimated from a strided sample, one streaming
    compaction pass (AVX2 where the CPU has it, else SSE2), and a radix select on the ~k
    candidates.  O(d) time with one read of
    x: ~2-3x a jitted ``sum(abs(x))`` at d = 10^7, k = d/100 on a 2-core CPU, where lax.top_k
    (a partial sort) costs 50-65x (docs/performance.md).  On other backends, other dtypes, or where
    the kernel cannot be built (no C++ compiler; a one-time warning says so), it is
    ``lax.top_k`` followed by a sort of the k indices.  The native path is chosen per platform
    at lowering time (``lax.platform_dependent``), so one jitted function runs on CPU and GPU.
    It is jit-able, vmap-able (a batch is one kernel call over the rows) and usable inside
    ``shard_map``.

``sample_k_distinct(key, d, k)``
    A uniformly random k-subset of range(d), as k distinct int32 indices in ascending order,
    in O(k) time and memory (``jax.random.choice(replace=False)`` permutes all of range(d): a
    full sort, ~1000x slower at d = 10^7).  Method: a Bernoulli(p) process on range(d) is
    drawn through its geometric gaps (k' ~ k + 6 sqrt(k) draws, a cumulative sum), with
    p chosen so that the number m of points is >= k with overwhelming probability;
    conditionally on m the points are a uniform m-subset, and dropping a uniform random
    (m - k)-subset of them (drawn with replacement, duplicates redrawn against an owner table)
    leaves a uniform k-subset.  Draws that give m < k, or that do not cover range(d), are
    rejected and redrawn (a ``while_loop``; expected iterations 1 + O(1e-9)).  Exact in law up
    to the float32 resolution of the uniforms behind the geometric gaps (23-bit uniforms, and
    exponentials cut beyond ~16: each gap's law is off by ~1e-7 in total variation).  Pure
    JAX (random numbers via ``fastrng``, i.e. ``jax.random``'s): identical on every backend.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cconv import _native
from cconv.compressors import fastrng

__all__ = ["topk_indices", "topk_indices_reference", "sample_k_distinct", "native_available", "NATIVE_DTYPES"]

NATIVE_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float64))


def _check_k(where: str, k, d: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ValueError(f"{where}: k must be a static integer in [0, {d}], got {k!r}")
    k = int(k)
    if not 0 <= k <= d:
        raise ValueError(f"{where}: k must be in [0, d] = [0, {d}], got {k}")
    return k


def native_available() -> bool:
    """True when the native CPU top-k kernel is built and registered (see ``cconv._native``)."""
    return _native.available()


def topk_indices_reference(x, k: int):
    """``lax.top_k(jnp.abs(x), k)[1]``: the exact reference (indices by decreasing magnitude)."""
    _, idx = lax.top_k(jnp.abs(x), k)
    return idx.astype(jnp.int32)


def _sorted_reference(x, k: int):
    return jnp.sort(topk_indices_reference(x, k), axis=-1)


def _native_topk(x, k: int):
    # Inside shard_map the result varies over the same manual axes as x.
    aval = jax.typeof(x)
    extra = {}
    if not aval.manual_axis_type.empty:
        extra = {"sharding": aval.sharding, "manual_axis_type": aval.manual_axis_type}
    out = jax.ShapeDtypeStruct(x.shape[:-1] + (k,), jnp.int32, **extra)
    return jax.ffi.ffi_call(_native.TOPK_TARGET, out, vmap_method="broadcast_all")(x)


def topk_indices(x, k: int):
    """Exact indices of the k largest |x| along the last axis, int32, ascending (module docstring).

    x: floating array of shape (..., d) (a flat gradient: shape (d,)); k: static, 0 <= k <= d.
    """
    x = jnp.asarray(x)
    if x.ndim == 0:
        raise ValueError("topk_indices: x must have at least one dimension (the last is searched)")
    d = x.shape[-1]
    k = _check_k("topk_indices", k, d)
    batch = x.shape[:-1]
    if k == 0:
        return jnp.zeros(batch + (0,), jnp.int32)
    if k == d:
        return jnp.broadcast_to(jnp.arange(d, dtype=jnp.int32), batch + (d,))
    if jnp.dtype(x.dtype) in NATIVE_DTYPES and _native.load() is not None:
        return lax.platform_dependent(x, cpu=partial(_native_topk, k=k), default=partial(_sorted_reference, k=k))
    return _sorted_reference(x, k)


# ----------------------------------------------------------------------------- random k-subsets


def _sample_plan(d: int, k: int) -> tuple[float, int]:
    """(gap scale 1/-log(1-p), number of gap draws n) for a Bernoulli(p) process with mean >= k."""
    lam = min(float(d), k + 6.0 * math.sqrt(k) + 6.0)  # expected number of points
    p = lam / d
    inv_rate = 0.0 if p >= 1.0 else -1.0 / math.log1p(-p)  # gap = floor(E * inv_rate) + 1
    # Enough gaps to pass d w.h.p.: the count of points in range(d) is <= lam + 6 sqrt(lam) + 6.
    n = int(min(d, math.ceil(lam + 6.0 * math.sqrt(lam) + 6.0))) + 1
    return inv_rate, n


def _cumsum(v):
    # XLA:CPU lowers jnp.cumsum to a reduce-window that is superlinear (1e6 int32: ~95 ms);
    # the parallel-prefix associative scan is ~15x faster there and fine on GPU (it compiles
    # to O(log n) ops, so short vectors keep the cheaper-to-compile cumsum).
    if v.shape[0] <= 4096:
        return jnp.cumsum(v)
    return lax.associative_scan(jnp.add, v)


def _zero_like(key):
    raw = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    return (raw.reshape(-1)[0] & 0).astype(jnp.int32)


def sample_k_distinct(key, d: int, k: int):
    """A uniformly random k-subset of range(d): k distinct int32 indices, ascending.

    key: a PRNG key (typed or raw uint32[2]); d, k: static ints with 0 <= k <= d < 2**30.
    Same key, same subset (on every backend).  Algorithm and exactness: module docstring.
    """
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or not 0 <= int(d) < 2**30:
        raise ValueError(f"sample_k_distinct: d must be a static integer in [0, 2**30), got {d!r}")
    d = int(d)
    k = _check_k("sample_k_distinct", k, d)
    if k == 0:
        return jnp.zeros((0,), jnp.int32)
    if k == d:
        return jnp.arange(d, dtype=jnp.int32)
    return _sample_k_distinct(key, d, k)


@partial(jax.jit, static_argnums=(1, 2))
def _sample_k_distinct(key, d: int, k: int):
    """The sampler proper, jitted per (d, k): called eagerly (op by op) its two while loops cost
    seconds of dispatch; traced inside a caller's program it is inlined as before."""
    inv_rate, n = _sample_plan(d, k)
    r_max = n - 1 - k  # at most this many points are dropped (m <= n - 1 on acceptance)
    slots = jnp.arange(n, dtype=jnp.int32)
    k_gap, k_drop = jax.random.split(key)

    # 1. Bernoulli(p) points through their geometric gaps; redraw until m >= k and the n-th
    #    point lies outside range(d) (so all points in range(d) were drawn).
    def draw(c):
        attempt = c[0]
        # = jax.random.exponential, bit for bit (fastrng: Threefry unrolled on CPU)
        e = -jnp.log1p(-fastrng.uniform(jax.random.fold_in(k_gap, attempt), (n,)))
        gaps = jnp.minimum(jnp.floor(e * inv_rate), d).astype(jnp.int32) + 1  # in [1, d + 1]
        pos = _cumsum(gaps) - 1
        # Points are valid up to the first one outside range(d) (later sums may wrap around).
        outside = (pos >= d) | (pos < 0)
        m = jnp.argmax(outside).astype(jnp.int32)  # number of points in range(d)
        return attempt + 1, pos, m, jnp.any(outside) & (m >= k)

    # Loop carries start from a zero derived from the key, so that inside shard_map they vary
    # over the same mesh axes as the key (a per-worker key makes every carry per-worker).
    z = _zero_like(key)
    init = (z, jnp.zeros((n,), jnp.int32) + z, z, z != 0)
    _, pos, m, _ = lax.while_loop(lambda c: ~c[3], draw, init)

    # 2. Drop a uniform (m - k)-subset of the m points: slots 0..r-1 (r = m - k) of a list of
    #    r_max candidates are live; each live slot draws a uniform point in [0, m) (rejection
    #    from the next power of two: exact) until it finds one no other slot holds.
    r = m - k
    rank = jnp.arange(r_max, dtype=jnp.int32)
    mask = jnp.uint32(0xFFFFFFFF) >> lax.clz(jnp.maximum(m - 1, 1).astype(jnp.uint32))

    def drop_step(c):
        it, cand, pending, owner = c
        bits = fastrng.bits(jax.random.fold_in(k_drop, it), (r_max,)) & mask
        fresh = bits.astype(jnp.int32)
        cand = jnp.where(pending, fresh, cand)
        attempt = pending & (fresh < m) & (owner[jnp.minimum(cand, n - 1)] < 0)
        owner = owner.at[jnp.where(attempt, cand, n)].set(rank, mode="drop")
        won = attempt & (owner[jnp.minimum(cand, n - 1)] == rank)
        return it + 1, cand, pending & ~won, owner

    owner = jnp.full((n,), -1, jnp.int32) + z
    if r_max > 0:
        init = (z, jnp.zeros((r_max,), jnp.int32) + z, rank < r, owner)
        _, _, _, owner = lax.while_loop(lambda c: jnp.any(c[2]), drop_step, init)
    keep = (slots < m) & (owner < 0)
    dest = _cumsum(keep.astype(jnp.int32)) - 1
    dest = jnp.where(keep, dest, k)
    return jnp.zeros((k,), jnp.int32).at[dest].set(pos, mode="drop")
