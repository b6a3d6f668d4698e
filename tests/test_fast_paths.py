"""Fast paths that must compute exactly what the plain path computes.

* ``Compressor.minus(y, payload)`` (what error feedback keeps) equals ``y - decompress(payload, y)``
  bit for bit, for every registered case (sparse payloads subtract with one scatter-add);
* ``MeshComm``'s all-gather of several payload arrays as one byte buffer returns what one
  all-gather per array returns, for every dtype a payload uses.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import registry_cases as R
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from runs_helpers import XLA_DEFAULTS

import cconv.compressors as cc
import cconv.memory as mem
from cconv.comm.backend import MeshComm


@pytest.mark.parametrize("name,hp", R.CASES)
@pytest.mark.slow
def test_minus_is_y_minus_decompress(name, hp):
    c = cc.get(name, **hp)
    x = jax.random.normal(jax.random.PRNGKey(3), (33, 17), jnp.float32)
    y = x + jax.random.normal(jax.random.PRNGKey(4), x.shape, jnp.float32)
    payload, _ = jax.jit(c.compress)(x, c.init(x), jax.random.PRNGKey(5))
    fast = jax.jit(c.minus)(y, payload)
    plain = jax.jit(lambda y, p: y - c.decompress(p, y))(y, payload)
    np.testing.assert_array_equal(np.asarray(fast), np.asarray(plain))


def _ef_fusions(c) -> list[str]:
    c = mem.error_feedback(c)
    x = jnp.ones((4096,), jnp.float32)
    compiled = jax.jit(c.compress, compiler_options=XLA_DEFAULTS).lower(x, c.init(x), jax.random.PRNGKey(0)).compile()
    hlo = compiled.as_text()  # XLA's own fusions: the build users' runs get
    return [line for line in hlo.splitlines() if "f32[4096]" in line and "fusion(" in line and "ENTRY" not in line]


def test_error_feedback_uses_the_sparse_subtraction():
    """The memory asks the compressor for p - sent: top-k's compiled EF step keeps no dense
    subtraction and no dense zeros for the sent values (its only d-sized fusion: the residual's
    scatter-add into p); the plain path (no ``subtract``) has both, so the check can fail."""
    topk = cc.get("topk", ratio=0.01)
    fast, plain = _ef_fusions(topk), _ef_fusions(topk._replace(subtract=None))
    assert len(fast) < len(plain), (fast, plain)
    assert not any("subtract" in line or "broadcast" in line for line in fast), fast
    assert any("subtract" in line for line in plain), plain


def _gather_both(tree):
    mesh = Mesh(np.array(jax.devices()[:4]), ("w",))

    def f(t):
        comm = MeshComm("w", 4)
        packed = comm._all_gather(t)
        plain = jax.tree.map(lambda a: jax.lax.all_gather(a, "w"), t)
        return packed, plain

    spec = jax.tree.map(lambda _: P("w"), tree)
    out = jax.tree.map(lambda _: P(), (tree, tree))
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(spec,), out_specs=out, check_vma=False))(tree)


@pytest.mark.slow
def test_one_buffer_all_gather_equals_per_array():
    k = jax.random.split(jax.random.PRNGKey(0), 6)
    tree = {
        "values": jax.random.normal(k[0], (4 * 5,), jnp.float32),
        "indices": jax.random.randint(k[1], (4 * 5,), 0, 1000, jnp.int32),
        "half": jax.random.normal(k[2], (4 * 3,), jnp.bfloat16),
        "codes": jax.random.randint(k[3], (4 * 7,), 0, 255, jnp.int32).astype(jnp.uint8),
        "signed": jax.random.randint(k[4], (4 * 2, 3), -100, 100, jnp.int32).astype(jnp.int8),
        "key": jax.random.bits(k[5], (4 * 2,), jnp.uint32),
    }
    packed, plain = _gather_both(tree)
    for name in tree:
        assert packed[name].dtype == plain[name].dtype and packed[name].shape == plain[name].shape, name
        np.testing.assert_array_equal(np.asarray(packed[name]), np.asarray(plain[name]), err_msg=name)


def test_one_buffer_all_gather_is_one_collective():
    tree = [jnp.ones((8,), jnp.float32), jnp.ones((8,), jnp.int32), jnp.ones((8,), jnp.bfloat16)]
    mesh = Mesh(np.array(jax.devices()[:4]), ("w",))
    f = jax.shard_map(
        lambda t: MeshComm("w", 4)._all_gather(t), mesh=mesh, in_specs=(P("w"),), out_specs=P(), check_vma=False
    )
    hlo = jax.jit(f).lower(tree).compile().as_text()
    assert hlo.count("all-gather(") == 1, hlo
