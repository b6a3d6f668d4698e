"""``cconv.compressors.keyed``: what a payload regenerates from a shared key is traced once per
exchange (random-k's indices: by compress, error feedback and the aggregation), reused only for
the same key array in the same trace, and the step's result is the same bit for bit."""

import contextlib
import importlib
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cconv
from cconv import compressors as C
from cconv.compressors import keyed

randomk_module = importlib.import_module("cconv.compressors.randomk")


def counter():
    calls = []

    def fn(value):
        def make():
            calls.append(value)
            return value

        return make

    return calls, fn


def test_outside_a_scope_every_call_computes():
    calls, fn = counter()
    key = jnp.zeros(2, jnp.uint32)
    assert keyed.derived(key, "s", fn(1)) == 1
    assert keyed.derived(key, "s", fn(2)) == 2
    assert calls == [1, 2]


def test_in_a_scope_the_same_key_array_and_static_compute_once():
    calls, fn = counter()
    a, b = jnp.zeros(2, jnp.uint32), jnp.zeros(2, jnp.uint32)  # equal values, different arrays
    with keyed.once_per_key():
        assert keyed.derived(a, "s", fn(1)) == 1
        assert keyed.derived(a, "s", fn(2)) == 1  # reused
        assert keyed.derived(a, "t", fn(3)) == 3  # other static values
        assert keyed.derived(b, "s", fn(4)) == 4  # another array: computed (identity, not value)
        with keyed.once_per_key():  # nested: the outer scope's table
            assert keyed.derived(a, "s", fn(5)) == 1
        assert keyed.derived(a, "s", fn(6)) == 1
    assert keyed._TABLE.entries is None  # closed: nothing held
    assert calls == [1, 3, 4]


def test_a_result_is_reused_only_in_the_trace_that_made_it():
    """Drawn inside a cond branch (its own trace) from a key of the outer trace: not reused
    outside it, where the branch's tracer would have leaked."""
    calls = []

    def draw(key):
        calls.append(1)
        return jax.random.uniform(jax.random.wrap_key_data(key), (3,))

    def step(key):
        with keyed.once_per_key():
            inner = jax.lax.cond(True, lambda: keyed.derived(key, "u", lambda: draw(key)), lambda: jnp.zeros(3))
            outer = keyed.derived(key, "u", lambda: draw(key))
            again = keyed.derived(key, "u", lambda: draw(key))
        return inner + outer + again

    key = jax.random.key_data(jax.random.key(0))
    out = jax.jit(step)(key)
    assert len(calls) == 2  # the branch, and once in the outer trace
    np.testing.assert_array_equal(out, 3 * jax.random.uniform(jax.random.key(0), (3,)))


def test_the_table_is_per_thread():
    seen = []
    with keyed.once_per_key():

        def other():
            seen.append(keyed._TABLE.entries)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert keyed._TABLE.entries == {}
    assert seen == [None]


def _randomk_ef_step(monkeypatch, scoped: bool):
    """One drop-in exchange (random-k 25 %, unscaled, error feedback) over 4 vmapped workers:
    (averages, new state, how many times the sampler was traced)."""
    traced = []
    real = randomk_module.sample_k_distinct

    def spy(key, d, k):
        traced.append((d, k))
        return real(key, d, k)

    monkeypatch.setattr(randomk_module, "sample_k_distinct", spy)
    if not scoped:
        monkeypatch.setattr(keyed, "once_per_key", contextlib.nullcontext)
    ex = cconv.Exchange(C.randomk(ratio=0.25, scaled=False), memory="ef", axis_name="data", compress_vectors=True)
    rng = np.random.default_rng(0)
    grads = {
        "w": jnp.asarray(rng.normal(size=(4, 6, 16)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=(4, 16)), jnp.float32),
        "v": jnp.asarray(rng.normal(size=(4, 40)), jnp.float32),
    }
    one = jax.tree.map(lambda g: g[0], grads)

    def worker(g):
        state = jax.tree.map(lambda x: x[0], ex.init(one))
        avg, new, _ = ex(g, jax.tree.map(lambda x: x[None], state), jax.random.key(3))
        return avg, new

    avg, new = jax.jit(jax.vmap(worker, axis_name="data"))(grads)
    return avg, new, traced


def test_random_k_traces_its_sampler_once_per_tensor_and_computes_the_same(monkeypatch):
    avg, new, traced = _randomk_ef_step(monkeypatch, scoped=True)
    assert sorted(traced) == sorted([(96, 24), (16, 4), (40, 10)])  # was 3 per tensor
    with pytest.MonkeyPatch.context() as mp:
        avg0, new0, traced0 = _randomk_ef_step(mp, scoped=False)
    assert len(traced0) == 9  # compress, error feedback's residual, the aggregation's decoding
    for x, y in zip(jax.tree.leaves((avg, new)), jax.tree.leaves((avg0, new0))):
        np.testing.assert_array_equal(x, y)


def test_no_tracer_outlives_the_step(monkeypatch):
    with jax.checking_leaks():
        _randomk_ef_step(monkeypatch, scoped=True)
    assert keyed._TABLE.entries is None
