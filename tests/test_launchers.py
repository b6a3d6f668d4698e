"""Launchers as registry objects: the registry, seeds support, and a fourth launcher added at
test time (one class + one dict entry: ``jax.vmap`` over the workers on one device) that trains
exactly like ``shard_map``."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from engine_util import loss_fn, make_model_state, make_params, run

from cconv import compressors as C
from cconv.comm.backend import MeshComm
from cconv.engine import LAUNCHERS, EngineConfig, build
from cconv.engine.launchers import Launcher

# every launcher compiles a training step: not in the fast subset (-m 'not slow')
pytestmark = pytest.mark.slow

W = 4


class VmapLauncher(Launcher):
    """Every worker on one device: the step is vmapped over a named worker axis.  (Partial
    permutations -- the parameter server's push / pull -- need a full one under vmap.)"""

    name = "test_vmap"

    def __init__(self, cfg, devices=None, mpi_comm=None, seeds=None):
        super().__init__(cfg, devices, mpi_comm, seeds)
        self.platform = jax.devices()[0].platform

    def comm(self):
        return MeshComm(self.cfg.axis_name, self.workers, self.platform)

    def init(self, worker_init, params, mstate, like_params=None, like_mstate=None):
        return jax.jit(
            lambda p, m: jax.tree.map(lambda x: jnp.broadcast_to(x, (self.workers, *jnp.shape(x))), worker_init(p, m))
        )(params, mstate)

    def compile(self, trace):
        step = jax.vmap(
            lambda ws, b, k: trace(self.comm(), ws, b, k), in_axes=(0, 0, None), axis_name=self.cfg.axis_name
        )

        @jax.jit
        def fn(ws, batch, key):
            batch = jax.tree.map(lambda x: x.reshape(self.workers, -1, *x.shape[1:]), batch)
            new, metrics = step(ws, batch, key)
            return new, jax.tree.map(lambda m: m[0], metrics)

        return fn

    def view(self, tree, average):
        return jax.tree.map(lambda x: x.mean(0).astype(x.dtype) if average else x[0], tree)


def test_registry():
    assert set(LAUNCHERS) == {"shard_map", "pmap", "vmap", "mpi"}
    assert all(cls.name == n and issubclass(cls, Launcher) for n, cls in LAUNCHERS.items())
    assert [n for n, cls in LAUNCHERS.items() if cls.supports_seeds] == ["shard_map", "vmap"]


def test_seeds_need_a_launcher_that_supports_them():
    with pytest.raises(ValueError, match="needs launcher='shard_map' or 'vmap'"):
        build(
            loss_fn,
            make_params(),
            optax.sgd(0.1),
            EngineConfig(workers=W, launcher="pmap"),
            model_state=make_model_state(),
            seeds=2,
        )


def test_unknown_launcher_is_a_one_line_value_error():
    with pytest.raises(ValueError, match="launcher='threads'; valid: shard_map, pmap, vmap, mpi"):
        EngineConfig(workers=W, launcher="threads")


@pytest.mark.parametrize(
    "kw",
    [
        dict(compressor=C.topk(ratio=0.2), memory="ef"),
        dict(compressor=C.qsgd(levels=4)),
        dict(compressor=C.topk(ratio=0.2), memory="ef", local_steps=2),
    ],
    ids=["topk-ef", "qsgd", "local-sgd"],
)
def test_a_launcher_added_at_test_time_equals_shard_map(monkeypatch, kw):
    monkeypatch.setitem(LAUNCHERS, VmapLauncher.name, VmapLauncher)
    mk = lambda launcher: build(
        loss_fn,
        make_params(),
        optax.sgd(0.1, momentum=0.9),
        EngineConfig(workers=W, launcher=launcher, **kw),
        model_state=make_model_state(),
    )
    tv = mk("test_vmap")
    sv, hv = run(tv, 4)
    ts = mk("shard_map")
    ss, hs = run(ts, 4)
    np.testing.assert_allclose([h["loss"] for h in hv], [h["loss"] for h in hs], rtol=1e-6)
    assert [h["bytes_sent"] for h in hv] == [h["bytes_sent"] for h in hs]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), tv.params(sv), ts.params(ss))
    assert tv.traffic(0)[0].tolist() == ts.traffic(0)[0].tolist()
