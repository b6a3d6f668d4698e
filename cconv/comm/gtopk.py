"""gTop-k sparse allreduce by recursive doubling (Shi et al., ICDCS 2019), for any P.

Each worker starts from its local top-k ``(values, indices)`` (k int32 indices).  In round
r = 0 .. log2(P)-1 it swaps its current k pairs with partner ``rank ^ 2**r`` (one ``ppermute``
of 8k bytes for fp32), adds the values at shared indices, and keeps the k largest magnitudes of
the union (``merge_sorted_topk``: both lists are kept sorted by index, so they are merged, not
sorted).  Both partners compute the merge from the same multiset in a canonical order
(sorted by index; a + b == b + a in IEEE arithmetic; ties broken by the lowest index), so
after log2(P) rounds every worker holds bit-identical k entries: the global top-k estimate G.

P not a power of two (as recursive-doubling allreduce does it: Thakur, Rabenseifner & Gropp,
"Optimization of Collective Communication Operations in MPICH", IJHPCA 2005): with
p' = 2^floor(log2 P) and r = P - p',

1. fold     the r extra ranks p'+j send their k pairs to rank j (j < r), which merges them
            into its own (``merge_sorted_topk``, as in a round);
2. double   recursive doubling among ranks 0 .. p'-1 (log2 p' rounds, as above);
3. unfold   rank j sends G back to rank p'+j.

Traffic per rank, D = k * (itemsize + 4) bytes: ranks j < r send and receive
(log2 p' + 1) D = ceil(log2 P) D, ranks r .. p'-1 log2(p') D, the folded ranks D
(``cconv.comm.accounting``, kind ``recursive_doubling``); against (P-1) D for gathering every
worker's top-k.

Mass conservation.  A worker's contribution at index j is part of its group's running sum only
while j keeps surviving; once j is dropped in some round, a later re-entry of j (from another
subtree) does not carry it.  Each worker therefore keeps an ``alive`` mask over its own k
entries, cleared in every merge in which the index does not survive (the "mask after every
round" fix of the tree variant).  A partner j < r keeps the same mask for the entries its folded
rank sent it, and returns it with G in the unfold without extra bytes: an index of G is sent as
``~index`` (negative; indices are >= 0) when the folded rank's contribution at it is not carried.
At the end

    sum over G of the merged values  ==  sum_w sum_{i alive on w} values_w[i],

so returning ``values_w * (1 - alive_w)`` to worker w's residual loses nothing and counts
nothing twice: applied + sum of residual changes == sum of the inputs (tested for P = 1..8).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from cconv.comm.accounting import tree_bytes


def fold_layout(p: int) -> tuple[int, int]:
    """(p', r): the power-of-two group 2^floor(log2 P) and the number of extra ranks folded in."""
    if p < 1:
        raise ValueError(f"gTop-k needs at least one worker, got {p}")
    p2 = 1 << (p.bit_length() - 1)
    return p2, p - p2


def check_workers(p: int) -> None:
    """One-line ValueError unless ``p`` is a valid worker count (any P >= 1)."""
    fold_layout(p)


def merge_topk(va, ia, vb, ib, k: int):
    """Top-k (by magnitude) of the sum of two sparse vectors (values added at shared indices).

    Indices may repeat (e.g. DGC's zero-valued padding slots at index 0): equal indices are
    summed into one entry; when the union has fewer than k distinct indices, the remaining slots
    are (0, index) pairs, so no mass is counted twice.  Sorting by index makes the result
    canonical: swapping a and b gives bit-identical output (a run mixes at most one real value
    from each side, a + b == b + a, plus exact zeros).  The result is sorted by index.

    Inputs in any order: each side is sorted by index (stably) and the two are merged by
    ``merge_sorted_topk`` -- the same pairs in the same order as a stable sort of the 2k pairs.
    """
    oa, ob = jnp.argsort(ia, stable=True), jnp.argsort(ib, stable=True)
    return merge_sorted_topk(va[oa], ia[oa], vb[ob], ib[ob], k)


def merge_sorted_topk(va, ia, vb, ib, k: int):
    """``merge_topk`` for sides already sorted by index (non-decreasing), as gTop-k keeps them.

    Merge path instead of a sort: in the stable merge of a before b, a[i] lands at
    i + #{j: b[j] < a[i]} and b[j] at j + #{i: a[i] <= b[j]} (two ``searchsorted``, O(k log k)
    compare steps, log k deep; one scatter), the exact order a stable argsort of the
    concatenation gives, so results are bit-identical to sorting.  Runs of equal indices are
    summed, the k largest run sums kept, and those are compacted in index order by a prefix sum
    over the 2k slots (no sort of the k winners either).
    """
    n = ia.shape[0] + ib.shape[0]
    pos = jnp.concatenate(
        [
            jnp.arange(ia.shape[0]) + jnp.searchsorted(ib, ia, side="left"),
            jnp.arange(ib.shape[0]) + jnp.searchsorted(ia, ib, side="right"),
        ]
    )
    idx = jnp.zeros((n,), ia.dtype).at[pos].set(jnp.concatenate([ia, ib]), unique_indices=True)
    val = jnp.zeros((n,), va.dtype).at[pos].set(jnp.concatenate([va, vb]), unique_indices=True)
    first = jnp.concatenate([jnp.ones((1,), bool), idx[1:] != idx[:-1]])  # first of a run
    seg = jnp.cumsum(first) - 1
    merged = jax.ops.segment_sum(val, seg, num_segments=n)[seg]
    merged = jnp.where(first, merged, jnp.zeros((), merged.dtype))  # a run's sum once
    score = jnp.where(first, jnp.abs(merged).astype(jnp.float32), -1.0)
    _, top = lax.top_k(score, k)
    keep = jnp.zeros((n,), bool).at[top].set(True, unique_indices=True)
    slot = jnp.where(keep, jnp.cumsum(keep) - 1, k)  # the winners in index order; others dropped
    out_v = jnp.zeros((k,), merged.dtype).at[slot].set(merged, mode="drop")
    out_i = jnp.zeros((k,), idx.dtype).at[slot].set(idx, mode="drop")
    return out_v, out_i


def merge_topk_by_sort(va, ia, vb, ib, k: int):
    """The merge gTop-k used before the merge path: a stable argsort of the 2k (index, value)
    pairs, a segment sum of equal indices, ``lax.top_k`` of the magnitudes, a sort of the winners.
    Kept as the reference ``merge_sorted_topk`` must equal bit for bit (tests) and as the
    "before" of ``studies/benchmarks/gtopk_merge.py``."""
    idx, val = jnp.concatenate([ia, ib]), jnp.concatenate([va, vb])
    order = jnp.argsort(idx, stable=True)
    idx, val = idx[order], val[order]
    first = jnp.concatenate([jnp.ones((1,), bool), idx[1:] != idx[:-1]])
    seg = jnp.cumsum(first) - 1
    merged = jax.ops.segment_sum(val, seg, num_segments=idx.shape[0])[seg]
    merged = jnp.where(first, merged, jnp.zeros((), merged.dtype))
    score = jnp.where(first, jnp.abs(merged).astype(jnp.float32), -1.0)
    _, pos = lax.top_k(score, k)
    pos = jnp.sort(pos)
    return merged[pos], idx[pos]


def contains(sorted_set, query):
    """Boolean mask: query[i] in sorted_set (both int32)."""
    pos = jnp.clip(jnp.searchsorted(sorted_set, query), 0, sorted_set.shape[0] - 1)
    return sorted_set[pos] == query


def _lookup(sorted_keys, flags, query):
    """flags at the first position of each query in sorted_keys (False where absent)."""
    pos = jnp.clip(jnp.searchsorted(sorted_keys, query), 0, sorted_keys.shape[0] - 1)
    return (sorted_keys[pos] == query) & flags[pos]


def gtopk(comm, values, indices):
    """Recursive-doubling gTop-k over ``comm`` (any number of workers, see the module doc).

    Returns (g_values, g_indices, alive): the global top-k sparse *sum* (identical on every
    worker, indices sorted) and the mask of this worker's own entries that are included in it.
    Records one ``recursive_doubling`` collective of ``(values, indices)``'s bytes.
    """
    p2, extra = fold_layout(comm.size)
    k = values.shape[0]
    comm.record("recursive_doubling", tree_bytes((values, indices)))
    order = jnp.argsort(indices)
    cur_v, cur_i = values[order], indices[order]
    alive = jnp.ones((k,), bool)
    if extra:
        rank = comm.rank()
        partner, folded = rank < extra, rank >= p2
        fv, fi = comm.permute((cur_v, cur_i), [(p2 + j, j) for j in range(extra)])
        mv, mi = merge_sorted_topk(cur_v, cur_i, fv, fi, k)
        cur_v, cur_i = jnp.where(partner, mv, cur_v), jnp.where(partner, mi, cur_i)
        alive = contains(cur_i, indices)  # all True off the partners (cur is their own set)
        alive_f = contains(cur_i, fi)  # the folded rank's entries (meaningful on partners)
    for r in range((p2 - 1).bit_length()):
        bit = 1 << r
        pv, pi = comm.permute((cur_v, cur_i), [(j, j ^ bit) for j in range(p2)])
        cur_v, cur_i = merge_sorted_topk(cur_v, cur_i, pv, pi, k)
        alive = alive & contains(cur_i, indices)
        if extra:
            alive_f = alive_f & contains(cur_i, fi)
    if extra:
        fs = jnp.argsort(fi)  # fi is sorted on the folded rank's side, kept general
        carried = _lookup(fi[fs], alive_f[fs], cur_i)
        wire_i = jnp.where(carried, cur_i, ~cur_i)
        gv, gi = comm.permute((cur_v, wire_i), [(j, p2 + j) for j in range(extra)])
        g_idx = jnp.where(gi < 0, ~gi, gi)
        mine = _lookup(g_idx, gi >= 0, indices)
        cur_v, cur_i = jnp.where(folded, gv, cur_v), jnp.where(folded, g_idx, cur_i)
        alive = jnp.where(folded, mine, alive)
    return cur_v, cur_i, alive
