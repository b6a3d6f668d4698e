"""TernGrad with a shared scaler (``terngrad(shared_scale=True)``, Wen et al. 2017).

* wire format: once the workers agree on s, a payload is the ceil(d/4) bytes of codes
  (``wire_bytes`` = payload bytes = theory); standalone (P = 1) the scaler travels as by default;
* ``IntSum.sum_dtype``: int8 for P <= 127, int16 up to 32767, chosen only when the ring
  all-reduce moves fewer bytes than the gather (P > 8 for ternary codes);
* on the engine path (P = 4 workers holding tensors of very different magnitudes): the
  average is unbiased and its per-coordinate variance is (1/P^2) sum_w (s|x_w| - x_w^2) with the
  *shared* s (Monte Carlo, fixed keys, Bonferroni bounds), and not the local-scaler variance;
* the int8-sum path equals the gather path (same keys, within float rounding), all-to-all
  equals the parameter server, error feedback conserves what was not sent;
* the compiled program's collectives (the max all-reduce included) are the logged bytes, and
  at P = 16 (a subprocess with 16 simulated devices) the int8 sum is chosen by itself.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import registry_cases as R
from engine_util import loss_fn, make_batch, make_model_state, make_params
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from cconv import compressors as C
from cconv.comm import MeshComm, hlo
from cconv.comm.aggregation import AGGREGATIONS, IntSum, method_of
from cconv.compressors.terngrad import THEORY, shared_variance
from cconv.engine import EngineConfig, build
from cconv.engine.exchange import exchange, init_state, make_plan

W = 4
SHAPES = [(3, 4), (2, 3)]
ROOT = Path(__file__).resolve().parents[1]


def _trees(seed=0):
    """Worker w's tensors, scaled by 4**w: the shared scaler is worker 3's max."""
    rng = np.random.default_rng(seed)
    return [[jnp.asarray(rng.normal(size=s) * 4.0**w, jnp.float32) for s in SHAPES] for w in range(W)]


def _exchange(cfg, trees, keys, memory="none"):
    """exchange() on a W-device mesh, vmapped over ``keys``; returns (outputs [key][unit] of
    worker 0, all workers' outputs for the first key, ledger, plan)."""
    plan = make_plan(cfg, cfg.compressor, SHAPES, memory=memory)
    mesh = Mesh(np.array(jax.devices()[:W]), ("w",), axis_types=(jax.sharding.AxisType.Auto,))
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *trees)
    state = jax.tree.map(lambda x: jnp.broadcast_to(x, (W, *x.shape)), init_state(plan, trees[0]))
    ledgers = []

    def f(tree, st):
        comm = MeshComm("w", W)
        tree, st = jax.tree.map(lambda a: a[0], (tree, st))
        out = jax.vmap(lambda k: exchange(comm, plan, tree, st, k))(keys)
        ledgers.append(list(comm.ledger))
        return jax.tree.map(lambda a: a[None], out)

    out, new = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("w"), P("w")), out_specs=P("w")))(stacked, state)
    return out, new, ledgers[0], plan


# ----------------------------------------------------------------------------- wire format


@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 5), (64, 64), (33, 17)])
def test_bound_payload_is_the_codes_only(shape):
    c = C.terngrad(shared_scale=True)
    d = int(np.prod(shape, dtype=np.int64))
    x = jax.ShapeDtypeStruct(shape, jnp.float32)
    bound = c.agree.bind(jnp.float32(2.0))
    payload = jax.eval_shape(lambda x, k: bound.compress(x, bound.init(x), k)[0], x, R.KEY1)
    assert C.payload_bytes(payload) == bound.wire_bytes(shape) == THEORY.wire_bytes(bound, shape, 4) == -(-d // 4)
    # standalone the scaler travels with the payload, as by default
    assert c.wire_bytes(shape) == THEORY.wire_bytes(c, shape, 4) == -(-d // 4) + 4 == C.terngrad().wire_bytes(shape)
    assert bound.name == c.name and bound.hparams == c.hparams and bound.agree is None and bound.unbiased


def test_defaults_unchanged():
    c = C.terngrad()
    assert c.aggregation == "allgather" and c.agree is None and c.hparams == {"clip": None, "shared_scale": False}
    s = C.terngrad(shared_scale=True)
    assert s.aggregation == "intsum" and s.agree.reduce == "max" and s.agree.level_max == 1


@pytest.mark.slow
def test_standalone_shared_scale_equals_local_scale():
    """P = 1: the agreed scaler is the local one; same codes as the default compressor."""
    x = jax.random.normal(jax.random.PRNGKey(0), (5, 7))
    a, _ = C.terngrad(shared_scale=True).compress(x, (), R.KEY1)
    b, _ = C.terngrad().compress(x, (), R.KEY1)
    jax.tree.map(np.testing.assert_array_equal, a, b)
    bound = C.terngrad(shared_scale=True).agree.bind(jnp.max(jnp.abs(x)))
    p, _ = bound.compress(x, (), R.KEY1)
    np.testing.assert_array_equal(p.codes, a.codes)
    np.testing.assert_array_equal(bound.decompress(p, x), C.terngrad().decompress(b, x))


def test_sum_dtype_rule():
    codes = lambda d: -(-d // 4)
    for p in range(2, 9):  # the gather moves no more than the ring all-reduce of int8
        assert IntSum.sum_dtype(p, 1000, 1, codes(1000)) is None
    for p in (9, 16, 127):
        assert IntSum.sum_dtype(p, 1000, 1, codes(1000)) == jnp.int8
    for p in (128, 1000, 32767):  # never int8 beyond 127
        assert IntSum.sum_dtype(p, 1000, 1, codes(1000)) == jnp.int16
    assert IntSum.sum_dtype(32768, 1000, 1, codes(1000)) is None
    assert IntSum.sum_dtype(1, 1000, 1, codes(1000)) is None
    # the rule is the byte comparison, d by d
    for p in (9, 12, 200):
        for d in range(1, 40):
            isz = 1 if p <= 127 else 2
            wins = 2 * (p - 1) / p * d * isz < (p - 1) * codes(d)
            assert (IntSum.sum_dtype(p, d, 1, codes(d)) is not None) == wins, (p, d)


def test_options_and_bad_input():
    c = C.terngrad(shared_scale=True)
    assert method_of(c) == "intsum" and method_of(c, "allgather") == "allgather"
    EngineConfig(workers=W, compressor=c, collective="allgather")
    EngineConfig(workers=W, compressor=c, architecture="parameter-server")
    with pytest.raises(ValueError, match="vote=True needs"):
        EngineConfig(workers=W, compressor=c, vote=True)
    with pytest.raises(ValueError, match="shared_scale must be true or false, got 'yes'"):
        C.terngrad(shared_scale="yes")
    with pytest.raises(ValueError, match=r"aggregation 'intsum' needs Compressor.agree") as e:
        AGGREGATIONS["intsum"].check(None, C.terngrad()._replace(aggregation="intsum"))
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- statistics


@pytest.mark.slow
def test_engine_path_is_unbiased_with_the_shared_variance():
    """avg_i = (1/P) sum_w C(x_w)_i: E = mean_w x_{w,i}; Var = (1/P^2) sum_w (s|x_wi| - x_wi^2),
    s the max over workers (the local-scaler variance is rejected: the test has power)."""
    trees = _trees()
    keys = jax.random.split(jax.random.PRNGKey(5), R.N_MC)
    cfg = EngineConfig(workers=W, compressor=C.terngrad(shared_scale=True))
    out, _, ledger, plan = _exchange(cfg, trees, keys)
    assert plan.mode == "intsum"
    assert any(c.control and c.kind == "allreduce" and c.bytes == 4 * len(SHAPES) for c in ledger)  # one allmax
    for j in range(len(SHAPES)):
        xs = np.stack([np.asarray(t[j], np.float64).reshape(-1) for t in trees])
        got = np.asarray(out[j][0], np.float64).reshape(R.N_MC, -1)  # worker 0's copy
        mean = xs.mean(0)
        ok, worst = R.mean_ok(got, mean)
        assert ok, worst
        var = shared_variance(xs).sum(0) / W**2
        ok, worst = R.mean_ok((got - mean) ** 2, var)
        assert ok, worst
        local = (np.abs(xs).max(1, keepdims=True) * np.abs(xs) - xs * xs).sum(0) / W**2
        assert not R.mean_ok((got - mean) ** 2, local)[0]
        # every worker holds the same average
        for w in range(1, W):
            np.testing.assert_array_equal(np.asarray(out[j][w]), np.asarray(out[j][0]))


# ----------------------------------------------------------------------------- paths agree


@pytest.fixture
def force_int8(monkeypatch):
    """Make IntSum sum in int8 at P = 4 (where gathering would move fewer bytes)."""
    monkeypatch.setattr(IntSum, "sum_dtype", staticmethod(lambda workers, d, level_max, nbytes: jnp.int8))


@pytest.mark.slow
def test_int8_sum_equals_gather(force_int8):
    trees, keys = _trees(1), jax.random.split(jax.random.PRNGKey(2), 3)
    c = C.terngrad(shared_scale=True)
    summed, _, ledger, plan = _exchange(EngineConfig(workers=W, compressor=c), trees, keys)
    gathered, _, gledger, gplan = _exchange(EngineConfig(workers=W, compressor=c, collective="allgather"), trees, keys)
    assert (plan.mode, gplan.mode) == ("intsum", "allgather")
    d = [int(np.prod(s)) for s in SHAPES]
    assert [(c.kind, c.bytes) for c in ledger if not c.control] == [("allreduce", float(sum(d)))]  # int8 levels
    assert [(c.kind, c.bytes) for c in gledger if not c.control] == [("allgather", float(-(-n // 4))) for n in d]
    for a, b in zip(summed, gathered):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-7, atol=0)
        assert np.any(np.asarray(a) != 0)


@pytest.mark.slow
def test_parameter_server_equals_all_to_all_and_error_feedback_conserves():
    trees, keys = _trees(2), jax.random.split(jax.random.PRNGKey(3), 2)
    c = C.terngrad(shared_scale=True)
    a2a, new, _, _ = _exchange(EngineConfig(workers=W, compressor=c, memory="ef"), trees, keys, memory="ef")
    ps, _, ledger, _ = _exchange(
        EngineConfig(workers=W, compressor=c, memory="ef", architecture="parameter-server"), trees, keys, memory="ef"
    )
    assert {(c.kind, c.control) for c in ledger} >= {("ps_push", True), ("ps_pull", True)}  # the scalers
    for a, b in zip(a2a, ps):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
    for j in range(len(SHAPES)):  # sent + residual = gradient (nothing lost), per key
        total = sum(np.asarray(t[j], np.float64) for t in trees)
        for k in range(len(keys)):
            kept = W * np.asarray(a2a[j][0][k], np.float64) + np.asarray(
                new["units"][j].residual[:, k], np.float64
            ).sum(0)
            np.testing.assert_allclose(kept, total, rtol=0, atol=1e-4)


# ----------------------------------------------------------------------------- HLO bytes


def _hlo_equals_ledger(kw, workers=W):
    tr = build(
        loss_fn, make_params(), optax.sgd(0.1), EngineConfig(workers=workers, **kw), model_state=make_model_state()
    )
    state = tr.init()
    batch, key = make_batch(0), jax.random.PRNGKey(0)
    compiled = tr.lower(state, batch, key).compile()
    text = compiled.as_text()
    h_sent, h_recv = hlo.per_device_traffic(text, workers)
    sent, recv = tr.traffic(0, control=True)
    np.testing.assert_allclose(h_sent, sent, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(h_recv, recv, rtol=1e-9, atol=1e-9)
    _, metrics = compiled(state.worker(), batch, key)
    r = 1 if kw.get("architecture") == "parameter-server" else 0
    assert float(metrics["bytes_sent"]) + float(metrics["bytes_control"]) == pytest.approx(h_sent[r], rel=1e-6)
    return tr, hlo.collectives(text), metrics


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["all-to-all", "parameter-server"])
def test_hlo_bytes_equal_logged_bytes(arch):
    tr, found, metrics = _hlo_equals_ledger(dict(compressor=C.terngrad(shared_scale=True), architecture=arch))
    if arch == "all-to-all":
        leaves = jax.tree.leaves(make_params())
        n = sum(x.ndim > 1 for x in leaves)  # the bias travels dense (compress_vectors: false)
        assert any(c.op == "all-reduce" and c.shapes == (("f32", (n,)),) for c in found)  # the max all-reduce
        codes = sum((W - 1) * -(-x.size // 4) for x in leaves if x.ndim > 1)
        vectors = sum(x.size for x in leaves if x.ndim <= 1)
        dense = 2 * (W - 1) / W * 4 * (make_model_state()["mean"].size + vectors)  # the model state's mean, the bias
        assert float(metrics["bytes_sent"]) == pytest.approx(codes + dense, rel=1e-6)  # codes only


@pytest.mark.slow
def test_hlo_bytes_with_forced_int8_sums(force_int8):
    _, found, _ = _hlo_equals_ledger(dict(compressor=C.terngrad(shared_scale=True)))
    assert any(c.op == "all-reduce" and any(dt == "s8" for dt, _ in c.shapes) for c in found)


SIXTEEN = textwrap.dedent(
    """
    import jax, numpy as np, optax
    from engine_util import loss_fn, make_batch, make_model_state, make_params
    from test_terngrad_shared import _hlo_equals_ledger
    from cconv import compressors as C
    c = C.terngrad(shared_scale=True)
    tr, found, _ = _hlo_equals_ledger(dict(compressor=c), workers=16)
    assert any(x.op == "all-reduce" and any(dt == "s8" for dt, _ in x.shapes) for x in found), found
    assert not any(x.op == "all-gather" for x in found), found
    d = sum(x.size for x in jax.tree.leaves(make_params()) if x.ndim > 1)  # the matrices' int8 codes (1-D: dense)
    assert ("allreduce", float(d)) in [(x.kind, x.bytes) for x in tr.collectives(0) if not x.control]
    from cconv.engine import EngineConfig, build
    mk = lambda **kw: build(loss_fn, make_params(), optax.sgd(0.1), EngineConfig(workers=16, compressor=c, **kw),
                            model_state=make_model_state())
    outs = []
    for t in (mk(), mk(collective="allgather")):
        s, _ = t.step(t.init(), make_batch(0), jax.random.PRNGKey(1))
        outs.append(t.params(s))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), *outs)
    print("ok")
    """
)


@pytest.mark.slow
def test_sixteen_workers_choose_the_int8_sum(tmp_path):
    env = dict(os.environ)
    env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace(
        "--xla_force_host_platform_device_count=8", "--xla_force_host_platform_device_count=16"
    )
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    script = tmp_path / "sixteen.py"
    script.write_text(SIXTEEN)
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr[-3000:]
