"""The step's input path (issue 16, section 2): a batch placed ahead with ``Trainer.shard`` gives
the same step, bit for bit, as the host batch; the dense exchange (leaves in one tuple
all-reduce, not a concatenated buffer) logs the bytes of one buffer in the leaves' common dtype."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from engine_util import loss_fn, make_batch, make_model_state, make_params

from cconv.engine import EngineConfig, build


@pytest.fixture(scope="module")
def trainer():
    cfg = EngineConfig(workers=2)
    return build(loss_fn, make_params(), optax.sgd(0.1), cfg, model_state=make_model_state())


def test_sharded_batch_equals_host_batch(trainer):
    batch, key = make_batch(0), jax.random.PRNGKey(3)
    placed = trainer.shard(batch)
    assert placed["x"].sharding.is_equivalent_to(trainer.launcher.sharded, placed["x"].ndim)
    s1, m1 = trainer.step(trainer.init(), batch, key)
    s2, m2 = trainer.step(trainer.init(), placed, key)
    for a, b in zip(jax.tree.leaves((s1.params, m1)), jax.tree.leaves((s2.params, m2))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_shard_checks_the_batch(trainer):
    with pytest.raises(ValueError, match="not divisible by workers=2"):
        trainer.shard({"x": jnp.zeros((3, 6)), "y": jnp.zeros((3,))})


def test_dense_bytes_are_one_buffer_of_the_common_dtype(trainer):
    """The gradient's leaves and the model state: all-reduces of their sizes in float32."""
    n = sum(x.size for x in jax.tree.leaves(make_params())) + make_model_state()["mean"].size
    assert sum(c.bytes * c.count for c in trainer.collectives(0) if c.kind == "allreduce") == 4 * n
