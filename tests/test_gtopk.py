"""gTop-k by recursive doubling: exactness at P=2, agreement, conservation, traffic ~ k log P
(any P: tests/test_gtopk_anyp.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from engine_util import loss_fn, make_batch, make_model_state, make_params, worker_grad
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from cconv import compressors as C
from cconv.comm import MeshComm
from cconv.comm import gtopk as G
from cconv.engine import EngineConfig, build

D, K = 64, 6


def run_gtopk(x):
    """x: (P, D) local vectors; local top-K, then gTop-k.  Returns per-worker outputs."""
    p = x.shape[0]
    mesh = Mesh(np.array(jax.devices()[:p]), ("w",), axis_types=(jax.sharding.AxisType.Auto,))

    def f(xw):
        xw = xw[0]
        _, idx = jax.lax.top_k(jnp.abs(xw), K)
        vals = xw[idx]
        gv, gi, alive = G.gtopk(MeshComm("w", p), vals, idx.astype(jnp.int32))
        return gv[None], gi[None], alive[None], vals[None], idx[None]

    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("w"), out_specs=P("w")))(x)


def dense(vals, idx):
    return np.zeros(D, np.float64).__iadd__(np.bincount(idx, weights=vals, minlength=D))


def test_p2_equals_exact_topk_of_sum_of_local_topks():
    x = np.random.default_rng(0).normal(size=(2, D)).astype(np.float32)
    gv, gi, alive, vals, idx = map(np.asarray, run_gtopk(jnp.asarray(x)))
    s = dense(vals[0], idx[0]) + dense(vals[1], idx[1])  # sum of the two local top-k's
    want = np.sort(np.argsort(-np.abs(s), kind="stable")[:K])
    for w in range(2):
        assert np.array_equal(np.sort(gi[w]), want)
        np.testing.assert_allclose(dense(gv[w], gi[w]), np.where(np.isin(np.arange(D), want), s, 0), rtol=1e-6)


@pytest.mark.parametrize("seed", [1, 2])
def test_p8_identical_everywhere_and_mass_conserved(seed):
    # Overlapping supports (a few heavy coordinates shared by many workers) so that indices are
    # dropped in one round and re-enter from another subtree.
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(8, D)).astype(np.float32)
    x[:, :10] += rng.normal(size=(8, 10)).astype(np.float32) * 3
    gv, gi, alive, vals, idx = map(np.asarray, run_gtopk(jnp.asarray(x)))
    for w in range(1, 8):
        assert np.array_equal(gv[w], gv[0]) and np.array_equal(gi[w], gi[0])  # bit-identical
    assert len(set(gi[0].tolist())) == K
    applied = dense(gv[0], gi[0])
    back = sum(dense(vals[w] * ~alive[w], idx[w]) for w in range(8))  # to residuals
    inputs = sum(dense(vals[w], idx[w]) for w in range(8))
    np.testing.assert_allclose(applied + back, inputs, rtol=1e-5, atol=1e-5)
    # Each worker's alive entries are exactly the ones whose mass is in the result.
    alive_sum = sum(dense(vals[w] * alive[w], idx[w]) for w in range(8))
    np.testing.assert_allclose(alive_sum, applied, rtol=1e-5, atol=1e-5)
    assert (~alive).any()  # the test exercises the return-to-residual path


@pytest.mark.slow
def test_merge_is_symmetric():
    rng = np.random.default_rng(3)
    ia = jnp.asarray(np.sort(rng.choice(40, 8, replace=False)), jnp.int32)
    ib = jnp.asarray(np.sort(rng.choice(40, 8, replace=False)), jnp.int32)
    va, vb = jnp.asarray(rng.normal(size=8), jnp.float32), jnp.asarray(rng.normal(size=8), jnp.float32)
    a = G.merge_topk(va, ia, vb, ib, 8)
    b = G.merge_topk(vb, ib, va, ia, 8)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))


@pytest.mark.slow
def test_merge_sums_repeated_indices_without_losing_mass():
    # DGC's selection pads an under-filled payload with zeros at index 0: runs of equal indices.
    va = jnp.asarray([5.0, 0.0, 0.0, 1.0], jnp.float32)
    ia = jnp.asarray([0, 0, 0, 7], jnp.int32)
    vb = jnp.asarray([2.0, 3.0, 0.0, 0.0], jnp.float32)
    ib = jnp.asarray([0, 9, 0, 0], jnp.int32)
    v, i = G.merge_topk(va, ia, vb, ib, 3)
    assert dict(zip(np.asarray(i).tolist(), np.asarray(v).tolist())) == {0: 7.0, 7: 1.0, 9: 3.0}


@pytest.mark.slow
def test_engine_gtopk_conserves_residual_mass():
    P, c = 4, C.topk(ratio=0.1)
    tr = build(
        loss_fn,
        make_params(),
        optax.sgd(1.0),
        EngineConfig(workers=P, compressor=c, memory="ef", collective="gtopk", compress_vectors=True),  # b1 too
        model_state=make_model_state(),
    )
    s0 = tr.init()
    s1, m = tr.step(s0, make_batch(0), jax.random.PRNGKey(0))
    # sum over workers of (residual) + P * applied update == sum of per-worker gradients
    params = make_params()
    for j, name in enumerate(sorted(params)):
        g = sum(worker_grad(params, 0, w, P)[name] for w in range(P))
        applied = params[name] - tr.params(s1)[name]  # lr = 1: the averaged update
        res = s1.comp_state["units"][j].residual.sum(0)
        np.testing.assert_allclose(res + P * applied, g, rtol=1e-5, atol=1e-6)


def test_bytes_grow_like_k_p_for_allgather_and_k_log_p_for_gtopk():
    c = C.topk(k=8)
    params = {"w": jnp.zeros((64, 16))}
    per = {}
    for p in (2, 4, 8):
        for coll in ("allgather", "gtopk"):
            tr = build(
                loss_fn, params, optax.sgd(0.1), EngineConfig(workers=p, compressor=c, memory="ef", collective=coll)
            )
            sent, recv = tr.traffic(0)
            per[coll, p] = sent[0]
            assert np.allclose(sent, sent[0]) and np.allclose(recv, sent)
    k_bytes = 8 * 8
    assert [per["allgather", p] for p in (2, 4, 8)] == [k_bytes * (p - 1) for p in (2, 4, 8)]
    assert [per["gtopk", p] for p in (2, 4, 8)] == [k_bytes * np.log2(p) for p in (2, 4, 8)]


_merge_by_sort = G.merge_topk_by_sort  # the sort-based merge gTop-k used before the merge path


@pytest.mark.parametrize(
    "k", [pytest.param(1, marks=pytest.mark.extended), 6, pytest.param(33, marks=pytest.mark.extended)]
)
@pytest.mark.slow
def test_merge_path_equals_the_sort_based_merge_bit_for_bit(k):
    """Randomized: 300 pairs of lists per k with shared indices, repeated indices on one side
    (DGC's zero padding at index 0), tied magnitudes and signed zeros; sorted sides through
    ``merge_sorted_topk`` (what gTop-k calls) and unsorted ones through ``merge_topk``."""
    rng = np.random.default_rng(100 + k)
    t = 300
    ia, ib = (rng.integers(0, 3 * k + 1, size=(t, k)).astype(np.int32) for _ in range(2))
    va, vb = (rng.normal(size=(t, k)).astype(np.float32) for _ in range(2))
    pad = rng.random((t, k)) < 0.15  # padding slots: (0.0 or -0.0, index 0)
    ia[pad], va[pad] = 0, np.where(rng.random(pad.sum()) < 0.5, 0.0, -0.0)
    ties = rng.random(t) < 0.3  # magnitudes tied across the whole row
    va[ties], vb[ties] = np.sign(va[ties]), np.sign(vb[ties])
    bits = lambda out: [np.asarray(o).view(np.int32) for o in out]
    old = jax.jit(jax.vmap(lambda a, i, b, j: _merge_by_sort(a, i, b, j, k)))
    new = jax.jit(jax.vmap(lambda a, i, b, j: G.merge_topk(a, i, b, j, k)))
    new_sorted = jax.jit(jax.vmap(lambda a, i, b, j: G.merge_sorted_topk(a, i, b, j, k)))
    for x, y in zip(bits(new(va, ia, vb, ib)), bits(old(va, ia, vb, ib))):
        assert np.array_equal(x, y)
    oa, ob = np.argsort(ia, axis=1, kind="stable"), np.argsort(ib, axis=1, kind="stable")
    va_s, ia_s = np.take_along_axis(va, oa, 1), np.take_along_axis(ia, oa, 1)
    vb_s, ib_s = np.take_along_axis(vb, ob, 1), np.take_along_axis(ib, ob, 1)
    for x, y in zip(bits(new_sorted(va_s, ia_s, vb_s, ib_s)), bits(old(va_s, ia_s, vb_s, ib_s))):
        assert np.array_equal(x, y)
