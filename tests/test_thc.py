"""THC (``cconv.compressors.thc``, Li et al. NSDI'24): homomorphic aggregation (the workers'
integer levels summed in compressed form equal the gathered decodings, on all-to-all and the
parameter server), unbiasedness of the engine's average with the shared range, bytes per
coordinate, and the lookup table's lower error at 3-4 bits."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import registry_cases as R
from test_terngrad_shared import SHAPES, W, _exchange, _trees

from cconv import compressors as C
from cconv.comm.aggregation import IntSum
from cconv.engine import EngineConfig
from cconv.theory import constants as K

thc_module = importlib.import_module("cconv.compressors.thc")


@pytest.fixture
def force_int8(monkeypatch):
    monkeypatch.setattr(IntSum, "sum_dtype", staticmethod(lambda workers, d, level_max, nbytes: jnp.int8))


@pytest.mark.slow  # three architectures compiled (~9 s)
def test_summed_levels_equal_gathered_decodings_and_the_server(force_int8):
    """int8 sums of the levels (ring all-reduce), gathered payloads decoded each, and the
    parameter server's integer sum all give the same average (same keys)."""
    trees, keys = _trees(1), jax.random.split(jax.random.PRNGKey(2), 2)
    c = C.get("thc", bits=2)
    summed, _, ledger, plan = _exchange(EngineConfig(workers=W, compressor=c), trees, keys)
    gathered, _, _, gplan = _exchange(EngineConfig(workers=W, compressor=c, collective="allgather"), trees, keys)
    ps, _, _, _ = _exchange(EngineConfig(workers=W, compressor=c, architecture="parameter-server"), trees, keys)
    assert (plan.mode, gplan.mode) == ("intsum", "allgather")
    # the int8 levels of the padded (D) coordinates travel: 16 + 8
    assert [(x.kind, x.bytes) for x in ledger if not x.control] == [("allreduce", 16.0 + 8.0)]
    for a, b, p in zip(summed, gathered, ps):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(p), np.asarray(b), rtol=1e-5, atol=1e-6)
        assert np.any(np.asarray(a) != 0)


@pytest.mark.slow
def test_engine_average_is_unbiased_with_the_shared_range():
    """avg = 1/P sum_w C(x_w) with the agreed M = max_w max|R x_w|: E[avg] = mean_w x_w (Monte
    Carlo over 2000 fixed keys, Bonferroni), and its per-coordinate variance is the theory's
    1/P^2 sum_w Var[C(x_w)] with the shared M (not each worker's own)."""
    trees = _trees(0)
    keys = jax.random.split(jax.random.PRNGKey(5), 2000)
    c = C.get("thc", bits=3, table="table")
    out, _, _, plan = _exchange(EngineConfig(workers=W, compressor=c), trees, keys)
    for j in range(len(SHAPES)):
        xs = np.stack([np.asarray(t[j], np.float64).reshape(-1) for t in trees])
        got = np.asarray(out[j][0], np.float64).reshape(len(keys), -1)
        ok, worst = R.mean_ok(got, xs.mean(0))
        assert ok, worst
        m = max(np.abs(thc_module._rotated64(c, x)).max() for x in xs)
        var = sum(_shared_variance(c, x, m) for x in xs) / W**2
        ok, worst = R.mean_ok((got - xs.mean(0)) ** 2, var)
        assert ok, worst


def _shared_variance(c, x, m):
    """Var[C(x)_j] for range m (the module docstring's u_i / D, with M = m)."""
    levels = thc_module.table_of(c.hparams["bits"], c.hparams["table"]).astype(np.float64)
    y, g = thc_module._rotated64(c, x), levels[-1]
    t = g * y / m
    lo = np.clip(np.searchsorted(levels, t, side="right") - 1, 0, levels.size - 2)
    u = (levels[lo + 1] - t) * (t - levels[lo]) * (m / g) ** 2
    return np.full(x.size, u.sum() / u.size)


@pytest.mark.parametrize("bits", [1, 2, 4])
def test_bytes_per_coordinate(bits):
    """b bits per coordinate of the padded vector; standalone + the float32 range; bound to the
    agreed range, the codes only (b bits exactly at d = 2^k)."""
    c = C.get("thc", bits=bits)
    assert K.bits(c, (4096,)) == pytest.approx(bits + 32 / 4096)
    b = c.agree.bind(jnp.float32(1.0))
    x = jax.ShapeDtypeStruct((4096,), jnp.float32)
    payload = jax.eval_shape(lambda x: b.compress(x, (), jax.random.PRNGKey(0))[0], x)
    assert C.payload_bytes(payload) == K.wire_bytes(b, (4096,)) == 4096 * bits // 8


def test_lookup_table_lowers_the_error_at_three_and_four_bits():
    """The exact errors (theory, checked against the compressor by the generic tests) on a
    Gaussian vector: the table's denser inner levels beat uniform levels at b = 3, 4; at b = 2
    the table is the uniform grid scaled."""
    x = np.random.default_rng(0).standard_normal(4096)
    err = {(b, t): K.error_ratio(C.get("thc", bits=b, table=t), x) for b in (2, 3, 4) for t in ("uniform", "table")}
    assert err[(3, "table")] < 0.8 * err[(3, "uniform")] and err[(4, "table")] < 0.7 * err[(4, "uniform")], err
    assert err[(2, "table")] == pytest.approx(err[(2, "uniform")], rel=1e-9)


def test_planner_moves_the_codes_not_one_float_per_tensor():
    """``cconv plan`` plans an ``intsum`` method (THC, TernGrad's shared scaler) as a gather of its
    payload: for a fused 2^20-element gradient, ceil(D b / 8) + 4 bytes per worker (it planned only
    the float32 range, 4 bytes, as an all-reduce before)."""
    from cconv.theory import network as N
    from cconv.theory import planner as PL
    from cconv.theory import workloads as W

    w = W.Workload("toy", 2**20, 1e6, 1, ((2**10, 2**10),))
    p = PL.plan(w, 8, N.Network("t", 0.0, 1e-9), 1e12, sweep={"bits": [4]}, methods=["thc"])
    (row,) = p.rows
    assert row.payload_bytes == 2**20 * 4 // 8 + 4
