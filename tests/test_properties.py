"""Hypothesis property tests across shapes (0-d, 1, odd, multi-dim), dtypes, input scales and
hyper-parameters: every registered case (tests/registry_cases.py) and a few more variants.

Compilation dominates, so each (compressor, hparams) has one cached jitted function that
returns everything a property needs, and shapes come from a small pool (jit caches per shape).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import registry_cases as R
from hypothesis import given, settings
from hypothesis import strategies as st
from registry_cases import hp_key

import cconv.compressors as cc
import cconv.memory as mem
from cconv.compressors.randomk import sample_indices
from cconv.compressors.sparse import SparsePayload

SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 4), (33, 3)]
DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
RATIOS = [0.01, 0.1, 0.3, 0.5, 1.0]
EPS = {jnp.dtype(jnp.float32): 2.0**-23, jnp.dtype(jnp.bfloat16): 2.0**-7, jnp.dtype(jnp.float16): 2.0**-10}


# Every registered case, plus a few variants of the built-ins beyond their cases (spot checks).
VARIANTS = [(p.values[0], hp_key(p.values[1])) for p in R.CASES] + [
    ("topk", (("ratio", 0.01),)),
    ("topk", (("ratio", 1.0),)),
    ("threshold", (("ratio", 0.5), ("tau", 0.0))),
    ("qsgd", (("bucket", 4), ("levels", 1))),
    ("qsgd", (("levels", 8),)),
    ("randomk", (("ratio", 0.5), ("scaled", False), ("shared", True))),
]


@st.composite
def compressor(draw):
    return draw(st.sampled_from(VARIANTS))


def data(seed, shape, dtype):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * rng.choice([0.01, 1.0, 30.0])
    if rng.random() < 0.2 and x.size:
        x.reshape(-1)[rng.integers(0, x.size, size=max(1, x.size // 3))] = 0.0  # exact zeros
    return jnp.asarray(x, dtype)


@functools.cache
def program(name, hp):
    """One jitted function: payload, C(x), and one error-feedback step from residual e."""
    c = cc.get(name, **dict(hp))
    ef = mem.error_feedback(c)

    @jax.jit
    def run(x, e, key):
        payload, _ = c.compress(x, c.init(x), key)
        y = c.decompress(payload, jax.ShapeDtypeStruct(x.shape, x.dtype))
        ef_payload, ef_state = ef.compress(x, ef.init(x)._replace(residual=e), key)
        return payload, y, ef.decompress(ef_payload, x), ef_state.residual

    return c, run


@functools.cache
def roundtrip(name, hp):
    """Payload and C(x) only (a smaller program to compile)."""
    c = cc.get(name, **dict(hp))

    @jax.jit
    def run(x, key):
        payload, _ = c.compress(x, c.init(x), key)
        return payload, c.decompress(payload, x)

    return c, run


def f64(a):
    return np.asarray(a, np.float64)


@pytest.mark.extended  # CI: the registry cases' contract in tests/test_compressors.py
@settings(max_examples=25, deadline=None, derandomize=True)
@given(comp=compressor(), shape=st.sampled_from(SHAPES), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
def test_contract(comp, shape, dtype, seed):
    name, hp = comp
    if not R.subject(name, dict(hp)).accepts(dtype):
        return  # a dtype this compressor rejects (ValueError)
    c, run = program(name, hp)
    x = data(seed, shape, dtype)
    e = data(seed + 1, shape, dtype)
    payload, y, sent, e_new = run(x, e, jax.random.PRNGKey(seed % 1000))
    # decompress: x's shape and dtype (also with a ShapeDtypeStruct), finite for finite input
    assert y.shape == x.shape and y.dtype == x.dtype
    assert np.all(np.isfinite(f64(y)))
    # bytes: the real payload equals the static formula
    assert cc.payload_bytes(payload) == c.wire_bytes(shape, dtype)
    # error feedback: C(x + e) + e_new == x + e, to the rounding of the dtype
    p = f64(x) + f64(e)
    tol = 4 * EPS[jnp.dtype(dtype)] * (np.abs(p).max(initial=0) + np.abs(f64(sent)).max(initial=0)) + 1e-30
    assert np.all(np.abs(f64(sent) + f64(e_new) - p) <= tol)
    if name == "topk":
        d = max(x.size, 1)
        k = c.density(shape) * d
        bound = (1 - k / d) * np.sum(f64(x) ** 2)
        assert np.sum((f64(x) - f64(y)) ** 2) <= bound * (1 + 1e-6) + 1e-30


def _sparse_indices(name, hp, c, payload, shape):
    if isinstance(payload, SparsePayload):
        return np.asarray(payload.indices)
    return np.asarray(_sample(payload.key, max(int(np.prod(shape)), 1), payload.values.shape[0]))


_sample = jax.jit(sample_indices, static_argnums=(1, 2))


@pytest.mark.extended  # CI: tests/test_select.py and the registry contract (test_compressors.py)
@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    name=st.sampled_from(["topk", "randomk"]),
    ratio=st.sampled_from([0.01, 0.1, 0.3, 0.5]),
    scaled=st.booleans(),
    shared=st.booleans(),
    shape=st.sampled_from(SHAPES[2:]),
    dtype=st.sampled_from(DTYPES[:2]),
    seed=st.integers(0, 2**31 - 1),
)
def test_exactly_k_distinct(name, ratio, scaled, shared, shape, dtype, seed):
    hp = (("ratio", ratio),) if name == "topk" else (("ratio", ratio), ("scaled", scaled), ("shared", shared))
    c, run = roundtrip(name, hp)
    x = data(seed, shape, dtype)
    payload, y = run(x, jax.random.PRNGKey(seed % 1000))
    d = x.size
    k = int(np.ceil(round(ratio * d, 9)))
    if k >= d:
        np.testing.assert_array_equal(f64(y), f64(x))
        return
    idx = _sparse_indices(name, hp, c, payload, shape)
    assert idx.dtype == np.int32 and idx.shape == (k,)
    assert len(set(idx.tolist())) == k and idx.min() >= 0 and idx.max() < d  # k distinct
    flat_x, flat_y = f64(x).reshape(-1), f64(y).reshape(-1)
    assert set(np.flatnonzero(flat_y).tolist()) <= set(idx.tolist())
    scale = d / k if (name == "randomk" and scaled) else 1.0
    np.testing.assert_array_equal(f64(payload.values), f64(jnp.asarray(x.reshape(-1)[idx] * jnp.asarray(scale, dtype))))
    if name == "topk":
        mag = np.abs(flat_x)
        assert mag[idx].min() >= np.delete(mag, idx).max(initial=0)
        np.testing.assert_array_equal(flat_y[idx], flat_x[idx])
