"""cconv.compressors.fastrng returns jax.random's bits exactly (it only lowers them faster on CPU)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cconv.compressors import fastrng

KEYS = [jax.random.PRNGKey(3), jax.random.PRNGKey(2**31 + 7), jax.random.key(5)]


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5, 17), (100_003,)])
@pytest.mark.slow
def test_bits_and_uniform_are_jax_random_bit_for_bit(shape):
    for key in KEYS:
        want = np.asarray(jax.random.bits(key, shape, jnp.uint32))
        np.testing.assert_array_equal(np.asarray(jax.jit(fastrng.bits, static_argnums=1)(key, shape)), want)
        want = np.asarray(jax.random.uniform(key, shape)).view(np.uint32)
        got = np.asarray(jax.jit(fastrng.uniform, static_argnums=1)(key, shape)).view(np.uint32)
        np.testing.assert_array_equal(got, want)


def test_under_vmap_and_other_key_types():
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    got = jax.jit(jax.vmap(lambda k: fastrng.uniform(k, (33,))))(keys)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.vmap(lambda k: jax.random.uniform(k, (33,)))(keys)))
    rbg = jax.random.key(1, impl="unsafe_rbg")  # not Threefry: delegated to jax.random
    np.testing.assert_array_equal(np.asarray(fastrng.uniform(rbg, (10,))), np.asarray(jax.random.uniform(rbg, (10,))))
    jaxpr = str(jax.make_jaxpr(lambda k: fastrng.uniform(k, (10,)))(KEYS[0]))
    assert "platform_index" in jaxpr and "random_bits" in jaxpr  # CPU: unrolled; others: jax.random


def test_gpu_lowering_is_jax_random():
    exp = jax.export.export(jax.jit(lambda k: fastrng.uniform(k, (64,))), platforms=["cuda"])(
        jax.ShapeDtypeStruct((2,), jnp.uint32)
    )
    assert "threefry" in exp.mlir_module().lower()
