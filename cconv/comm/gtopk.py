"""gTop-k sparse allreduce by recursive doubling (Shi et al., ICDCS 2019).

Each worker starts from its local top-k ``(values, indices)`` (k distinct int32 indices).  In
round r = 0 .. log2(P)-1 it swaps its current k pairs with partner ``rank ^ 2**r``
(one ``ppermute`` of 8k bytes for fp32), adds the values at shared indices, and keeps the k
largest magnitudes of the union.  Both partners compute the merge from the same multiset in a
canonical order (sorted by index; a + b == b + a in IEEE arithmetic; ties broken by the lowest
index), so after log2(P) rounds every worker holds bit-identical k entries: the global top-k
estimate G.  Traffic per worker: log2(P) * k * (itemsize + 4) bytes each way, against
2(P-1) * k * (itemsize + 4) for gathering every worker's top-k.

Mass conservation.  A worker's contribution at index j is part of its group's running sum only
while j keeps surviving; once j is dropped in some round, a later re-entry of j (from another
subtree) does not carry it.  Each worker therefore keeps an ``alive`` mask over its own k
entries, cleared in every round in which the index does not survive (the "mask after every
round" fix of the tree variant).  At the end

    sum over G of the merged values  ==  sum_w sum_{j alive on w} values_w[j],

so returning ``values_w * (1 - alive_w)`` to worker w's residual loses nothing and counts
nothing twice: applied + sum of residual changes == sum of the inputs (tested).

P must be a power of two (``check_workers`` raises otherwise).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from cconv.comm.accounting import tree_bytes


def check_workers(p: int) -> None:
    if p < 1 or p & (p - 1):
        raise ValueError(f"gTop-k needs a power-of-two number of workers (recursive doubling), got {p}")


def merge_topk(va, ia, vb, ib, k: int):
    """Top-k (by magnitude) of the sum of two sparse vectors (values added at shared indices).

    Indices may repeat (e.g. DGC's zero-valued padding slots at index 0): equal indices are
    summed into one entry.  Sorting by index makes the result canonical: swapping a and b gives
    bit-identical output (a run mixes at most one real value from each side, a + b == b + a,
    plus exact zeros).  The result is sorted by index.
    """
    idx = jnp.concatenate([ia, ib])
    val = jnp.concatenate([va, vb])
    order = jnp.argsort(idx, stable=True)
    idx, val = idx[order], val[order]
    first = jnp.concatenate([jnp.ones((1,), bool), idx[1:] != idx[:-1]])  # first of a run
    seg = jnp.cumsum(first) - 1
    merged = jax.ops.segment_sum(val, seg, num_segments=idx.shape[0])[seg]
    score = jnp.where(first, jnp.abs(merged).astype(jnp.float32), -1.0)
    _, pos = lax.top_k(score, k)
    pos = jnp.sort(pos)  # keep the result sorted by index
    return merged[pos], idx[pos]


def contains(sorted_set, query):
    """Boolean mask: query[i] in sorted_set (both int32)."""
    pos = jnp.clip(jnp.searchsorted(sorted_set, query), 0, sorted_set.shape[0] - 1)
    return sorted_set[pos] == query


def gtopk(comm, values, indices):
    """Recursive-doubling gTop-k over ``comm``.

    Returns (g_values, g_indices, alive): the global top-k sparse *sum* (identical on every
    worker, indices sorted) and the mask of this worker's own entries that are included in it.
    Records one ``recursive_doubling`` collective of ``(values, indices)``'s bytes.
    """
    check_workers(comm.size)
    k = values.shape[0]
    rounds = comm.size.bit_length() - 1
    comm.record("recursive_doubling", tree_bytes((values, indices)))
    order = jnp.argsort(indices)
    cur_v, cur_i = values[order], indices[order]
    alive = jnp.ones((k,), bool)
    for r in range(rounds):
        pv, pi = comm.exchange((cur_v, cur_i), r)
        cur_v, cur_i = merge_topk(cur_v, cur_i, pv, pi, k)
        alive = alive & contains(cur_i, indices)
    return cur_v, cur_i, alive
