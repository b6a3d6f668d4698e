"""gTop-k for any number of workers: the extra ranks fold into partners, then recursive doubling
among 2^floor(log2 P), then the result unfolds (MPICH's scheme).  Conservation, bit-identical
results, the power-of-two behaviour unchanged, and the bytes per rank (ledger == compiled HLO)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from engine_util import _grad, loss_fn, make_batch, make_model_state, make_params
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from cconv import compressors as C
from cconv.comm import Collective, DryComm, MeshComm, hlo, traffic
from cconv.comm import gtopk as G
from cconv.engine import EngineConfig, build

D, K = 64, 6


def run_gtopk(x, vals=None, idx=None):
    """x: (P, D) local vectors; local top-K (or the given (vals, idx)), then gTop-k."""
    p = x.shape[0]
    mesh = Mesh(np.array(jax.devices()[:p]), ("w",), axis_types=(jax.sharding.AxisType.Auto,))
    if vals is None:
        _, idx = jax.lax.top_k(jnp.abs(x), K)
        vals = jnp.take_along_axis(x, idx, 1)

    def f(v, i):
        gv, gi, alive = G.gtopk(MeshComm("w", p), v[0], i[0].astype(jnp.int32))
        return gv[None], gi[None], alive[None]

    out = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("w"), P("w")), out_specs=P("w")))(vals, idx)
    return (*map(np.asarray, out), np.asarray(vals), np.asarray(idx))


def dense(vals, idx):
    return np.bincount(idx, weights=vals.astype(np.float64), minlength=D)


def heavy(p, seed):
    """Overlapping supports (heavy coordinates shared by many workers): indices are dropped in
    one merge and re-enter from another subtree (or from a folded rank)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(p, D)).astype(np.float32)
    x[:, :10] += rng.normal(size=(p, 10)).astype(np.float32) * 3
    return jnp.asarray(x)


def check_conservation(p, gv, gi, alive, vals, idx):
    for w in range(1, p):
        assert np.array_equal(gv[w], gv[0]) and np.array_equal(gi[w], gi[0])  # bit-identical
    applied = dense(gv[0], gi[0])
    back = sum(dense(vals[w] * ~alive[w], idx[w]) for w in range(p))  # to residuals
    inputs = sum(dense(vals[w], idx[w]) for w in range(p))
    np.testing.assert_allclose(applied + back, inputs, rtol=1e-5, atol=1e-5)
    alive_sum = sum(dense(vals[w] * alive[w], idx[w]) for w in range(p))
    np.testing.assert_allclose(alive_sum, applied, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("p", [3, 5, 6, 7])
@pytest.mark.parametrize(
    "seed", [1, pytest.param(2, marks=pytest.mark.extended), pytest.param(3, marks=pytest.mark.extended)]
)
@pytest.mark.slow
def test_any_p_identical_everywhere_and_mass_conserved(p, seed):
    """Every P (odd, even, prime) in CI with one seed; two more seeds each with ``-m extended``."""
    gv, gi, alive, vals, idx = run_gtopk(heavy(p, seed))
    check_conservation(p, gv, gi, alive, vals, idx)
    assert len(set(gi[0].tolist())) == K
    assert (~alive).any()  # the return-to-residual path is exercised


def test_folded_rank_loses_an_index_that_reenters_from_elsewhere():
    # P = 3: rank 2 folds into rank 0.  Index 5 is in rank 2's and rank 1's sets; rank 0's fold
    # merge drops it (its own entries are larger), round 0 brings it back from rank 1: rank 2's
    # contribution at 5 is not carried (alive False there), rank 1's is.
    vals = np.zeros((3, 2), np.float32)
    idx = np.zeros((3, 2), np.int32)
    vals[0], idx[0] = [10.0, 9.0], [1, 2]
    vals[1], idx[1] = [20.0, 8.5], [5, 3]
    vals[2], idx[2] = [1.0, 0.5], [5, 4]
    mesh_x = jnp.zeros((3, D))
    out = run_gtopk(mesh_x, jnp.asarray(vals), jnp.asarray(idx))
    gv, gi, alive = out[:3]
    assert gi[0].tolist() == [1, 5] and gv[0].tolist() == [10.0, 20.0]
    assert alive[2].tolist() == [False, False] and alive[1].tolist() == [True, False]
    check_conservation(3, *out)


@pytest.mark.slow
def test_dgc_padding_and_repeated_indices_conserve_mass_for_odd_p():
    # DGC pads under-filled payloads with (0, index 0): fewer than k distinct indices in a merge.
    rng = np.random.default_rng(4)
    p, k = 5, 4
    vals = np.zeros((p, k), np.float32)
    idx = np.zeros((p, k), np.int32)
    for w in range(p):
        n = w % 3  # 0, 1 or 2 real entries, the rest padding
        idx[w, :n] = rng.choice(np.arange(1, 9), n, replace=False)
        vals[w, :n] = rng.normal(size=n) + 3
    vals[1, 0], idx[1, 0] = 2.5, 0  # a real value at the padding index
    out = run_gtopk(jnp.zeros((p, D)), jnp.asarray(vals), jnp.asarray(idx))
    check_conservation(p, *out)


@pytest.mark.parametrize("p", [1, 2, 4, 8])
@pytest.mark.slow
def test_power_of_two_equals_plain_recursive_doubling(p):
    """No fold for a power of two: the result equals a NumPy replay of log2(P) merge rounds."""
    gv, gi, alive, vals, idx = run_gtopk(heavy(p, 5))
    order = np.argsort(idx, axis=1)
    sv, si = np.take_along_axis(vals, order, 1), np.take_along_axis(idx, order, 1)
    cur = [(jnp.asarray(sv[w]), jnp.asarray(si[w])) for w in range(p)]
    for r in range(p.bit_length() - 1):
        cur = [G.merge_topk(*cur[w], *cur[w ^ (1 << r)], K) for w in range(p)]
    for w in range(p):
        np.testing.assert_array_equal(gv[w], np.asarray(cur[w][0]))
        np.testing.assert_array_equal(gi[w], np.asarray(cur[w][1]))
    check_conservation(p, gv, gi, alive, vals, idx)


def test_traffic_per_rank():
    d = 80.0
    for p in range(1, 9):
        s, r = traffic(Collective("recursive_doubling", d), p)
        np.testing.assert_array_equal(s, r)
        if p == 1:
            assert not s.any()
            continue
        p2 = 1 << (p.bit_length() - 1)
        want = [(np.log2(p2) + (j < p - p2)) * d if j < p2 else d for j in range(p)]
        np.testing.assert_allclose(s, want)
        assert s.max() == np.ceil(np.log2(p)) * d  # the busiest rank: ceil(log2 P) rounds


def test_fold_layout_and_bad_count():
    assert [G.fold_layout(p) for p in (1, 2, 3, 5, 6, 7, 8)] == [(1, 0), (2, 0), (2, 1), (4, 1), (4, 2), (4, 3), (8, 0)]
    with pytest.raises(ValueError, match="at least one worker"):
        G.check_workers(0)


def test_dry_comm_traces_any_p():
    comm = DryComm(6)
    out = jax.eval_shape(lambda v, i: G.gtopk(comm, v, i), jnp.zeros(K), jnp.zeros(K, jnp.int32))
    assert [o.shape for o in out] == [(K,), (K,), (K,)]
    assert comm.ledger == [Collective("recursive_doubling", 8.0 * K)]


@pytest.mark.parametrize("p", [3, 6])
@pytest.mark.slow
def test_engine_any_p_conserves_residual_mass_and_hlo_bytes_match(p):
    c = C.topk(ratio=0.1)
    tr = build(
        loss_fn,
        make_params(),
        optax.sgd(1.0),
        EngineConfig(workers=p, compressor=c, memory="ef", collective="gtopk", compress_vectors=True),  # b1 too
        model_state=make_model_state(),
    )
    s0 = tr.init()
    batch, key = make_batch(0, n=48), jax.random.PRNGKey(0)
    compiled = tr.lower(s0, batch, key).compile()
    h_sent, h_recv = hlo.per_device_traffic(compiled.as_text(), p)
    sent, recv = tr.traffic(0, control=True)
    np.testing.assert_allclose(h_sent, sent, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(h_recv, recv, rtol=1e-9, atol=1e-9)
    s1, m = tr.step(s0, batch, key)
    assert float(m["bytes_sent"]) + float(m["bytes_control"]) == pytest.approx(h_sent[0], rel=1e-6)
    params = make_params()
    n = 48 // p
    grads = [_grad(params, {a: b[w * n : (w + 1) * n] for a, b in batch.items()}) for w in range(p)]
    for j, name in enumerate(sorted(params)):
        g = sum(gw[name] for gw in grads)
        applied = params[name] - tr.params(s1)[name]  # lr = 1: the averaged update
        res = s1.comp_state["units"][j].residual.sum(0)
        np.testing.assert_allclose(res + p * applied, g, rtol=1e-5, atol=1e-6)


def test_merge_with_fewer_distinct_indices_than_k_counts_each_run_once():
    # Two padded payloads (DGC): 3 distinct indices, k = 4.  The fourth slot is a (0, index)
    # pair; before the fix it repeated index 0's sum (7 applied twice).
    va = jnp.asarray([5.0, 0.0, 0.0, 1.0], jnp.float32)
    ia = jnp.asarray([0, 0, 0, 7], jnp.int32)
    vb = jnp.asarray([2.0, 3.0, 0.0, 0.0], jnp.float32)
    ib = jnp.asarray([0, 9, 0, 0], jnp.int32)
    v, i = G.merge_topk(va, ia, vb, ib, 4)
    assert float(np.bincount(np.asarray(i), weights=np.asarray(v), minlength=10)[0]) == 7.0
    assert float(np.asarray(v).sum()) == 11.0
