"""The compressor API: registry, static properties, determinism, jit / vmap / shard_map."""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import registry_cases as R
from compressor_cases import FURTHER
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from registry_cases import CASES, SUMMABLE

import cconv.compressors as cc

REQUIRED = {
    "none",
    "fp16",
    "bf16",
    "randomk",
    "topk",
    "threshold",
    "dgc",
    "terngrad",
    "signsgd",
    "scaled_sign",
    "onebit",
    "qsgd",
    "stc",
    "powersgd",
}
KEY = jax.random.PRNGKey(0)
ids = functools.partial(str)


def test_registry():
    assert REQUIRED <= set(cc.names())  # the built-ins (others may be added)
    for name in REQUIRED:
        assert callable(getattr(cc, name))  # each built-in also has a factory
    assert cc.none is cc.identity
    assert cc.hparams_of("randomk") == ["ratio", "k", "scaled", "shared", "positions"]
    assert cc.hparams_of("qsgd") == ["levels", "bucket", "coding"]
    assert cc.randomk(ratio=0.1).hparams["scaled"] is True  # scaled (unbiased) by default
    # helpers named in the cross-layer contract, reachable by import from their modules
    import cconv
    from cconv.compressors.powersgd import (
        PowerSGDState,
        compute_p,
        compute_q,
        is_compressed,
        matrix_shape,
        orthogonalize,
    )
    from cconv.compressors.sparse import DensePayload, SparsePayload
    from cconv.compressors.topk import topk_indices

    assert callable(compute_p) and callable(compute_q) and callable(orthogonalize) and PowerSGDState._fields
    assert matrix_shape((3, 4, 5)) == (12, 5) and is_compressed((3, 4, 5), 2) and not is_compressed((9,), 1)
    assert cconv.compressors.sparse.SparsePayload is SparsePayload and cc.DensePayload is DensePayload
    np.testing.assert_array_equal(np.sort(np.asarray(topk_indices(jnp.array([0.1, -3.0, 2.0, 0.5]), 2))), [1, 2])


def test_every_compressor_builds_with_its_example_and_further_cases():
    """Every registered compressor runs with its entry's example ({}: its defaults), so one with a
    required hyper-parameter and no example fails here; the further cases name registered ones."""
    assert set(FURTHER) <= set(cc.names())
    for e in cc.entries():
        for hp in (dict(e.example), *FURTHER.get(e.name, ())):
            c = cc.get(e.name, **hp)
            assert c.hparams == e.build(**hp).hparams
            for key, value in hp.items():
                assert c.hparams[key] == value


@pytest.mark.parametrize("name,hp", CASES)
def test_static_properties(name, hp):
    R.check_static(R.subject(name, hp))


@pytest.mark.parametrize(
    "name,hp,aggregation",
    [
        ("none", {}, "allreduce"),
        ("fp16", {}, "allreduce"),
        ("bf16", {}, "allreduce"),
        ("randomk", {"ratio": 0.2}, "allreduce"),
        ("randomk", {"ratio": 0.2, "shared": False}, "allgather"),
        ("topk", {"ratio": 0.2}, "allgather"),
        ("qsgd", {}, "allgather"),
        ("powersgd", {}, "powersgd"),
    ],
    ids=ids,
)
def test_aggregation_spot_checks(name, hp, aggregation):
    assert cc.get(name, **hp).aggregation == aggregation


@pytest.mark.parametrize("name,hp", CASES)
def test_contract(name, hp):
    """Shapes 0-d, (1,), odd, 2-D, 3-D; float32 and the half-precision dtypes it accepts:
    C(x) has x's shape and dtype, zero compresses to exactly zero, payload layouts are static."""
    R.check_contract(R.subject(name, hp))


@pytest.mark.parametrize("name,hp", CASES)
def test_same_key_same_payload(name, hp):
    R.check_determinism(R.subject(name, hp))


@pytest.mark.parametrize(
    "name,hp,random",
    [
        ("randomk", {"ratio": 0.2}, True),
        ("terngrad", {}, True),
        ("qsgd", {"levels": 4}, True),
        ("topk", {"ratio": 0.2}, False),
        ("signsgd", {}, False),
        ("powersgd", {"rank": 2}, False),
    ],
    ids=ids,
)
def test_randomness_is_detected(name, hp, random):
    """The generic tests detect random compressors (two keys, different payloads); spot checks."""
    assert R.subject(name, hp).is_random == random


@pytest.mark.slow
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
    typed = rt(x1, jax.random.key(3))  # new-style typed keys work too
    np.testing.assert_array_equal(np.flatnonzero(np.asarray(typed)), s1)


@pytest.mark.parametrize("name,hp", CASES)
def test_vmap_over_examples_matches_a_loop(name, hp):
    R.check_vmap(R.subject(name, hp))


@pytest.mark.parametrize("name,hp", SUMMABLE)
def test_summable_payloads_add_up(name, hp):
    R.check_summable(R.subject(name, hp))


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


@pytest.mark.parametrize(
    "name,hp", [pytest.param("randomk", {"ratio": 0.25}, marks=pytest.mark.slow), ("fp16", {}), ("none", {})], ids=ids
)
def test_shard_map_allreduce(mesh, name, hp):
    """Summable payloads: psum the floating leaves (the shared key is not communicated)."""
    c = cc.get(name, **hp)
    xs = _workers((4, 5))

    def worker(x, key):
        payload, _ = c.compress(x[0], c.init(x[0]), key)
        summed = jax.tree.map(lambda a: jax.lax.psum(a, "w") if jnp.issubdtype(a.dtype, jnp.floating) else a, payload)
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


@pytest.mark.slow
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


# --------------------------------------------------------------------------- a new compressor
# The generic checks are plain functions (tests/registry_cases.py); here they run on compressors
# defined in the tests and never registered globally, and on broken variants of them.

DEMO_CASES = ((R.SHRINK, ({}, {"scale": 0.5})), (R.DROPOUT, ({},)))
DEMOS = [pytest.param(entry, hp, id=f"{entry.label}-{hp}") for entry, hps in DEMO_CASES for hp in hps]


def _all_checks(s):
    """Every generic check, and every check of a claim ``s`` makes (``R.claims``); returns their names."""
    ran = []
    for check in R.GENERIC_CHECKS:
        check(s)
        ran.append(check.__name__)
    R.check_bad_hparams(s.entry, {})
    ran.append("check_bad_hparams")
    for check in R.claims(s).values():
        check(s)
        ran.append(check.__name__)
    return ran


@pytest.mark.slow
@pytest.mark.parametrize("entry,hp", DEMOS)
def test_generic_checks_run_on_a_new_compressor(entry, hp):
    s = R.local_subject(entry, hp, name="demo")
    ran = _all_checks(s)
    if entry is R.SHRINK:
        assert not s.is_random and {"check_contraction", "check_summable", "check_theory_error"} <= set(ran)
    else:
        assert s.is_random and {"check_unbiased", "check_theory_error"} <= set(ran)


def test_registering_a_compressor_adds_its_cases(monkeypatch):
    """A registered entry appears in every generic parametrization (a copy of the registry is
    patched in, so the compressor is gone after the test)."""
    monkeypatch.setattr(cc.registry, "_REGISTRY", dict(cc.registry._REGISTRY))
    cc.register("tests-demo-shrink", R.SHRINK)
    cc.register("tests-demo-dropout", R.DROPOUT)
    ids = {p.id for p in R.cases(further={"tests-demo-shrink": ({"scale": 0.5},)})}
    assert {"tests-demo-shrink", "tests-demo-shrink-scale=0.5", "tests-demo-dropout"} <= ids
    assert "tests-demo-shrink" in {p.id for p in R.cases(R._contractive)}
    assert "tests-demo-shrink" in {p.id for p in R.cases(lambda s: s.c.summable)}
    assert "tests-demo-dropout" in {p.id for p in R.cases(lambda s: s.c.unbiased)}
    s = R.subject("tests-demo-shrink", {"scale": 0.5})
    assert s.c.name == "tests-demo-shrink" and s.theory is R.SHRINK.theory
    R.check_static(s)
    R.check_contract(s)


def test_a_required_hyper_parameter_without_an_example_fails_the_generic_tests(monkeypatch):
    """A compressor registered without the example its required hyper-parameter needs is still
    collected (with {}), and every generic test of it fails with the build's one-line error."""
    monkeypatch.setattr(cc.registry, "_REGISTRY", dict(cc.registry._REGISTRY))
    required = cc.Schema((cc.Param("scale", "float", None, low=0.0, high=1.0, low_open=True),))
    cc.register("tests-demo-required", R.SHRINK._replace(schema=required))
    assert [p.values for p in R.cases(names=["tests-demo-required"])] == [("tests-demo-required", {})]
    with pytest.raises(ValueError, match="tests-demo-required: scale must be in"):
        R.subject("tests-demo-required", {})
    cc.register("tests-demo-given", R.SHRINK._replace(schema=required, example={"scale": 0.5}))
    assert R.subject("tests-demo-given", {"scale": 0.5}).c.hparams["scale"] == 0.5


def test_import_path_factories(monkeypatch):
    """get("package.module:attr") with a plain factory (permissive schema, no theory) and with
    an Entry (its schema and theory)."""
    monkeypatch.setattr(cc.registry, "_REGISTRY", dict(cc.registry._REGISTRY))
    path = "tests.registry_cases:scaled_identity"
    c = cc.get(path, scale=0.25)
    assert c.name == path and c.hparams == {"scale": 0.25} and cc.hparams_of(path) == ["scale"]
    x = jnp.arange(6.0)
    np.testing.assert_array_equal(np.asarray(c.roundtrip(x, c.init(x), KEY)[0]), 0.25 * np.arange(6.0))
    s = R.Subject(c, R.theory_of(cc.entry(path)), cc.entry(path))
    assert s.theory is None
    for check in R.GENERIC_CHECKS:
        check(s)
    e = cc.entry("tests.registry_cases:SHRINK")  # (a second import of the helper module)
    assert e.label == R.SHRINK.label and e.theory is not None and e.schema == R.SHRINK.schema
    with pytest.raises(ValueError, match=r"scale must be in \(0, 1\]"):
        cc.get("tests.registry_cases:SHRINK", scale=2.0)
    with pytest.raises(ValueError, match="cannot import"):
        cc.get("tests.registry_cases:no_such_factory")


def _omega(c):
    return 1 / c.hparams["p"] - 1


def _theory(entry, **changes):
    return entry._replace(theory=entry.theory._replace(**changes))


class _PartialSum(NamedTuple):
    values: jax.Array
    count: jax.Array


def _mean_not_sum():
    """Declared summable, but summing its payloads gives the mean of the workers' vectors."""
    from cconv.compressors.base import like_info

    c = R.shrink(1.0)

    def compress(x, state, key):
        return _PartialSum(x, jnp.ones((), jnp.float32)), state

    def decompress(p, like):
        shape, dtype = like_info(like)
        return (p.values / p.count).reshape(shape).astype(dtype)

    return c._replace(
        compress=compress,
        decompress=decompress,
        wire_bytes=lambda shape, dtype="float32": R._dense_bytes(shape, dtype) + 4,
    )


def _nan_at_zero():
    from cconv.compressors.base import DensePayload

    c = R.shrink(1.0)
    return c._replace(
        compress=lambda x, st, k: (DensePayload(x * jnp.sqrt(jnp.sum(x * x)) / jnp.sqrt(jnp.sum(x * x))), st)
    )


BROKEN = [
    (
        "wire_bytes off by one",
        lambda: R.local_subject(R.SHRINK._replace(factory=lambda scale: R.shrink(scale, bytes_extra=1)), {}),
        R.check_wire_bytes,
    ),
    (
        "theory wire_bytes off by one",
        lambda: R.local_subject(_theory(R.SHRINK, wire_bytes=lambda c, shape, isz: math.prod(shape) * isz + 1), {}),
        R.check_wire_bytes,
    ),
    (
        "decompress ignores the dtype",
        lambda: R.local_subject(R.SHRINK._replace(factory=lambda scale: R.shrink(scale, out_dtype=jnp.float32)), {}),
        R.check_contract,
    ),
    ("zero gives NaN", lambda: R.Subject(_nan_at_zero(), None), R.check_contract),
    (
        "biased but declared unbiased",
        lambda: R.local_subject(R.DROPOUT._replace(factory=lambda p: R.dropout(p, bias=0.85)), {}),
        R.check_unbiased,
    ),
    (
        "second moment 10% off",
        lambda: R.local_subject(
            _theory(
                R.DROPOUT,
                error_sq=lambda c, x, state=None: 1.1 * _omega(c) * R.sq(x),
                variance=lambda c, x: 1.1 * _omega(c) * R.f64(x) ** 2,
            ),
            {},
        ),
        R.check_unbiased,
    ),
    (
        "variance spread evenly, right total",
        lambda: R.local_subject(
            _theory(R.DROPOUT, variance=lambda c, x: np.full(np.shape(x), _omega(c) * R.sq(x) / np.size(x))), {}
        ),
        R.check_unbiased,
    ),
    (
        "wrong error_sq (deterministic)",
        lambda: R.local_subject(_theory(R.SHRINK, error_sq=lambda c, x, state=None: 0.07 * R.sq(x)), {}),
        R.check_theory_error,
    ),
    (
        "wrong error_sq (random)",
        lambda: R.local_subject(_theory(R.DROPOUT, error_sq=lambda c, x, state=None: 0.9 * _omega(c) * R.sq(x)), {}),
        R.check_theory_error,
    ),
    (
        "delta too large",
        lambda: R.local_subject(_theory(R.SHRINK, bound=lambda c, shape: cc.Bound("contractive", delta=0.99)), {}),
        R.check_contraction,
    ),
    (
        "delta too large (random)",
        lambda: R.local_subject(
            _theory(R.DROPOUT, bound=lambda c, shape: cc.Bound("contractive", delta=0.5, tight=False)), {}
        ),
        R.check_contraction,
    ),
    ("sums to the mean", lambda: R.Subject(_mean_not_sum(), None), R.check_summable),
]


@pytest.mark.parametrize("make,check", [pytest.param(m, c, id=i) for i, m, c in BROKEN])
def test_each_check_can_fail(make, check):
    with pytest.raises(AssertionError):
        check(make())


def test_bad_values_cover_every_kind_of_constraint():
    levels = cc.Param("levels", "int", 8, low=1, high=127)
    bad = R.bad_values(levels)
    assert {0, 128, 2.5, None} <= set(v for v in bad if not isinstance(v, list)) and True in bad
    ratio = cc.registry.RATIO
    assert 0.0 in R.bad_values(ratio) and None not in R.bad_values(ratio)  # open bound; optional
    assert 1 in R.bad_values(cc.Param("flag", "bool", False))
    assert "__not_a_choice__" in R.bad_values(cc.Param("mode", "str", "a", choices=("a", "b")))
    for p in (levels, ratio):  # all really rejected
        for v in R.bad_values(p):
            with pytest.raises(ValueError):
                p.check("x", v)
