"""The compressor API: registry, static properties, determinism, jit / vmap / shard_map."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import cconv.compressors as cc
from cconv.compressors.base import AGGREGATIONS

REQUIRED = {"none", "fp16", "bf16", "randomk", "topk", "threshold", "dgc", "terngrad", "signsgd",
            "scaled_sign", "onebit", "qsgd", "stc", "powersgd"}
CASES = [
    ("none", {}), ("fp16", {}), ("bf16", {}), ("randomk", {"ratio": 0.2}),
    ("randomk", {"ratio": 0.2, "scaled": False, "shared": False}), ("topk", {"ratio": 0.2}),
    ("threshold", {"tau": 0.5, "ratio": 0.2}), ("dgc", {"ratio": 0.2}), ("terngrad", {}),
    ("signsgd", {}), ("scaled_sign", {}), ("onebit", {"columns": True}), ("qsgd", {"levels": 4}),
    ("qsgd", {"levels": 2, "bucket": 6}), ("stc", {"ratio": 0.2}), ("powersgd", {"rank": 2}),
    ("natural", {}),
]
RANDOM = {"randomk", "terngrad", "qsgd", "natural"}
ALLREDUCE = {"none", "fp16", "bf16"}
KEY = jax.random.PRNGKey(0)
ids = functools.partial(str)


@functools.lru_cache(maxsize=None)
def compiled(name, hp):
    c = cc.get(name, **dict(hp))
    return (c, jax.jit(lambda x, k: c.compress(x, c.init(x), k)[0]),
            jax.jit(lambda x, k: c.roundtrip(x, c.init(x), k)[0]))


def compress(name, hp, x, key=KEY):
    return compiled(name, tuple(sorted(hp.items())))[1](x, key)


def leaves_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(u), np.asarray(v)) for u, v in zip(la, lb))


def test_registry():
    assert REQUIRED <= set(cc.names())
    assert {n for n, _ in CASES} == set(cc.names())
    for name in cc.names():
        assert callable(getattr(cc, name))                 # each name also has a factory
    assert cc.none is cc.identity
    assert cc.hparams_of("randomk") == ["ratio", "k", "scaled", "shared"]
    assert cc.hparams_of("qsgd") == ["levels", "bucket"]
    assert cc.randomk(ratio=0.1).hparams["scaled"] is True     # scaled (unbiased) by default
    # helpers named in the cross-layer contract, reachable by import from their modules
    import cconv
    from cconv.compressors.powersgd import PowerSGDState, compute_p, compute_q, is_compressed, matrix_shape, orthogonalize
    from cconv.compressors.sparse import DensePayload, SparsePayload
    from cconv.compressors.topk import topk_indices
    assert callable(compute_p) and callable(compute_q) and callable(orthogonalize) and PowerSGDState._fields
    assert matrix_shape((3, 4, 5)) == (12, 5) and is_compressed((3, 4, 5), 2) and not is_compressed((9,), 1)
    assert cconv.compressors.sparse.SparsePayload is SparsePayload and cc.DensePayload is DensePayload
    np.testing.assert_array_equal(np.sort(np.asarray(topk_indices(jnp.array([0.1, -3.0, 2.0, 0.5]), 2))), [1, 2])


@pytest.mark.parametrize("name,hp", CASES, ids=ids)
def test_static_properties(name, hp):
    c = cc.get(name, **hp)
    assert c.name == name
    assert c.aggregation in AGGREGATIONS
    assert c.summable == (c.aggregation == "allreduce")
    expected = ("powersgd" if name == "powersgd" else "allreduce"
                if name in ALLREDUCE or (name == "randomk" and hp.get("shared", True)) else "allgather")
    assert c.aggregation == expected
    assert 0 < c.density((10, 10)) <= 1
    for key, value in hp.items():
        assert c.hparams[key] == value
    factory = getattr(cc, name)(**hp)
    assert factory.name == c.name and factory.hparams == c.hparams


@pytest.mark.parametrize("name,hp", CASES, ids=ids)
def test_same_key_same_payload(name, hp):
    x = jax.random.normal(jax.random.PRNGKey(1), (6, 9))
    a, b = compress(name, hp, x, jax.random.PRNGKey(7)), compress(name, hp, x, jax.random.PRNGKey(7))
    assert leaves_equal(a, b)
    other = compress(name, hp, x, jax.random.PRNGKey(8))
    if name in RANDOM:
        # the random choices differ: the kept coordinates (random-k) or the stochastic codes
        c = compiled(name, tuple(sorted(hp.items())))[0]
        choice = (lambda p: np.flatnonzero(np.asarray(c.decompress(p, x)))) if name == "randomk" \
            else (lambda p: np.asarray(p.exponents if name == "natural" else p.codes))
        assert not np.array_equal(choice(a), choice(other))
    else:
        assert leaves_equal(a, other)                # deterministic compressors ignore the key


def test_shared_randomk_indices_depend_only_on_the_key():
    c = cc.randomk(ratio=0.2)
    rt = jax.jit(lambda x, k: c.roundtrip(x, None, k)[0])
    x1 = jax.random.normal(jax.random.PRNGKey(1), (50,))
    x2 = jax.random.normal(jax.random.PRNGKey(2), (50,))
    key = jax.random.PRNGKey(3)
    s1 = np.flatnonzero(np.asarray(rt(x1, key)))
    s2 = np.flatnonzero(np.asarray(rt(x2, key)))
    np.testing.assert_array_equal(s1, s2)
    assert s1.size == 10
    typed = rt(x1, jax.random.key(3))                               # new-style typed keys work too
    np.testing.assert_array_equal(np.flatnonzero(np.asarray(typed)), s1)


@pytest.mark.parametrize("name,hp", CASES, ids=ids)
def test_vmap_over_examples_matches_a_loop(name, hp):
    c, _, single = compiled(name, tuple(sorted(hp.items())))
    xs = jax.random.normal(jax.random.PRNGKey(4), (3, 6, 9))
    keys = jax.random.split(jax.random.PRNGKey(5), 3)
    batched = jax.jit(jax.vmap(lambda x, k: c.roundtrip(x, c.init(x), k)[0]))(xs, keys)
    for i in range(3):
        np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(single(xs[i], keys[i])),
                                   rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((8,), ("w",))


def _workers(shape, seed=11):
    return jax.random.normal(jax.random.PRNGKey(seed), (8, *shape))


def _run(mesh, fn, args, in_specs, out_specs):
    """shard_map over the 8 simulated devices (default check_vma=True; the mesh from
    jax.make_mesh has explicit axes, so inputs are placed with their sharding first)."""
    args = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, in_specs)]
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs))(*args)


@pytest.mark.parametrize("name,hp", [("randomk", {"ratio": 0.25}), ("fp16", {}), ("none", {})], ids=ids)
def test_shard_map_allreduce(mesh, name, hp):
    """Summable payloads: psum the floating leaves (the shared key is not communicated)."""
    c = cc.get(name, **hp)
    xs = _workers((4, 5))

    def worker(x, key):
        payload, _ = c.compress(x[0], c.init(x[0]), key)
        summed = jax.tree.map(
            lambda a: jax.lax.psum(a, "w") if jnp.issubdtype(a.dtype, jnp.floating) else a, payload)
        return c.decompress(summed, x[0])

    out = _run(mesh, worker, (xs, KEY), (P("w"), P()), P())
    terms = [np.asarray(c.roundtrip(xs[w], None, KEY)[0], np.float64) for w in range(8)]
    expected = sum(terms)
    # fp16 payloads are summed in half precision: 8 roundings of at most 2^-11 of the partial sums
    tol = 8 * 2.0**-11 * sum(np.abs(t) for t in terms) if name == "fp16" else 1e-5 * (1 + np.abs(expected))
    assert np.all(np.abs(np.asarray(out, np.float64) - expected) <= tol)


@pytest.mark.parametrize("name,hp", [("topk", {"ratio": 0.25}), ("qsgd", {"levels": 4})], ids=ids)
def test_shard_map_allgather(mesh, name, hp):
    """Gathered payloads: every worker decompresses all P payloads and sums them."""
    c = cc.get(name, **hp)
    xs = _workers((4, 5))
    keys = jax.random.split(KEY, 8)

    def worker(x, key):
        payload, _ = c.compress(x[0], c.init(x[0]), key[0])
        gathered = jax.tree.map(lambda a: jax.lax.all_gather(a, "w"), payload)
        outs = jax.vmap(lambda p: c.decompress(p, x[0]))(gathered)
        return jnp.sum(outs, axis=0)[None]

    out = _run(mesh, worker, (xs, keys), (P("w"), P("w")), P("w"))
    expected = sum(np.asarray(c.roundtrip(xs[w], None, keys[w])[0], np.float64) for w in range(8))
    out = np.asarray(out)
    for w in range(8):
        np.testing.assert_allclose(out[w], expected, rtol=1e-5, atol=1e-5)


def test_shard_map_powersgd_equals_compressing_the_mean(mesh):
    """P = mean_w M_w Q and Q = mean_w M_w^T P are linear, so the distributed result is the
    single-worker compression of the mean matrix."""
    from cconv.compressors.powersgd import compute_p, compute_q, orthogonalize
    c = cc.powersgd(rank=2)
    xs = _workers((6, 5))
    q0 = c.init(xs[0]).q

    def worker(x, q):
        m = x[0]
        p = orthogonalize(jax.lax.pmean(compute_p(m, q), "w"))
        q_new = jax.lax.pmean(compute_q(m, p), "w")
        return p @ q_new.T

    out = _run(mesh, worker, (xs, q0), (P("w"), P()), P())
    mean = jnp.mean(xs, axis=0)
    expected = c.roundtrip(mean, c.init(mean), KEY)[0]
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-4, atol=1e-5)
