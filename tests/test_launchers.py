"""Launchers as registry objects: the registry, seeds support, and a launcher added at test time
(one class + one dict entry) that ``build`` finds by name and that trains like ``shard_map``.

The launcher added here is a subclass of the real ``vmap`` launcher (``cconv.engine.launchers.Vmap``)
under another name: a second, test-only vmap launcher would duplicate it, and ``vmap`` against
``shard_map`` is tests/test_vmap_launcher.py's subject (CI: top-k + EF at P = 8, QSGD with a
parameter server under ASP, the sync modes, seeds, P = 64).  CI runs the local-SGD case (top-k + EF
with two local steps, a path test_vmap_launcher.py does not run); top-k + EF alone and QSGD are
extended."""

import jax
import numpy as np
import optax
import pytest
from engine_util import loss_fn, make_model_state, make_params, run

from cconv import compressors as C
from cconv.engine import LAUNCHERS, EngineConfig, build
from cconv.engine.launchers import Launcher, Vmap

# every launcher compiles a training step: not in the fast subset (-m 'not slow')
pytestmark = pytest.mark.slow

W = 4


class AddedLauncher(Vmap):
    """A launcher registered at test time (here: the vmap launcher's behaviour under a new name)."""

    name = "test_vmap"


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
        # extended: covered by test_vmap_launcher.py::test_vmap_equals_shard_map[topk-a2a-P8] and
        # ::test_sync_modes_under_vmap_equal_shard_map[asp] (QSGD), and by local-sgd below
        pytest.param(dict(compressor=C.topk(ratio=0.2), memory="ef"), marks=pytest.mark.extended, id="topk-ef"),
        pytest.param(dict(compressor=C.qsgd(levels=4)), marks=pytest.mark.extended, id="qsgd"),
        pytest.param(dict(compressor=C.topk(ratio=0.2), memory="ef", local_steps=2), id="local-sgd"),
    ],
)
def test_a_launcher_added_at_test_time_equals_shard_map(monkeypatch, kw):
    monkeypatch.setitem(LAUNCHERS, AddedLauncher.name, AddedLauncher)
    mk = lambda launcher: build(
        loss_fn,
        make_params(),
        optax.sgd(0.1, momentum=0.9),
        EngineConfig(workers=W, launcher=launcher, **kw),
        model_state=make_model_state(),
    )
    tv = mk("test_vmap")
    assert type(tv.launcher) is AddedLauncher  # build found the added launcher by its name
    sv, hv = run(tv, 4)
    ts = mk("shard_map")
    ss, hs = run(ts, 4)
    np.testing.assert_allclose([h["loss"] for h in hv], [h["loss"] for h in hs], rtol=1e-6)
    assert [h["bytes_sent"] for h in hv] == [h["bytes_sent"] for h in hs]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), tv.params(sv), ts.params(ss))
    assert tv.traffic(0)[0].tolist() == ts.traffic(0)[0].tolist()
