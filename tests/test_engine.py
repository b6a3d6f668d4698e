"""Engine semantics: equivalences the issue asks for, per-worker gradients, options, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from engine_util import loss_fn, make_batch, make_model_state, make_params, run, worker_grad

from cconv import compressors as C
from cconv.engine import EngineConfig, Warmup, build, dgc_warmup

# Every test here compiles and runs training steps: not in the fast tier (-m 'not slow').
pytestmark = pytest.mark.slow
PARAMS, MSTATE = make_params(), make_model_state()


def trainer(workers=4, opt=None, **kw):
    """The references here compress every leaf, the bias b1 too: ``compress_vectors=True`` unless a
    test says otherwise (the default, b1 dense: ``test_dropin.py::test_vectors_travel_dense_...``)."""
    cfg = EngineConfig(workers=workers, **{"compress_vectors": True, **kw})
    return build(loss_fn, PARAMS, opt or optax.sgd(0.1, momentum=0.9), cfg, model_state=MSTATE)


def close(a, b, rtol):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=rtol * 1e-2)


def test_dense_p8_equals_p1_same_global_batch():
    _, h8 = run(trainer(8), 12)
    s1, h1 = run(trainer(1), 12)
    close([h["loss"] for h in h8], [h["loss"] for h in h1], 1e-5)
    assert h1[-1]["loss"] < 0.8 * h1[0]["loss"]  # it trains
    assert h1[-1]["bytes_sent"] == 0 and h8[-1]["bytes_sent"] > 0


def test_shard_map_equals_pmap():
    kw = dict(compressor=C.topk(ratio=0.2), memory="ef")
    sa, ha = run(trainer(4, **kw), 5)
    tb = trainer(4, launcher="pmap", **kw)
    sb, hb = run(tb, 5)
    close([h["loss"] for h in ha], [h["loss"] for h in hb], 1e-6)
    jax.tree.map(lambda a, b: close(a, b, 1e-6), sa.comp_state, sb.comp_state)
    assert ha[-1]["bytes_sent"] == hb[-1]["bytes_sent"]


@pytest.mark.parametrize("memory", ["ef", "dgc"])
def test_gradients_are_per_worker_and_memory_invariant(memory):
    """The residual each worker keeps is built from ITS OWN gradient (not the summed one):
    EF: e_1 = g_w - C(g_w), e_2 = (g'_w + e_1) - C(g'_w + e_1), checked per worker."""
    P, c = 4, C.topk(ratio=0.1)
    tr = trainer(P, opt=optax.sgd(0.1), compressor=c, memory=memory, momentum=0.5)
    s = tr.init()
    params0 = tr.params(s)
    s, _ = tr.step(s, make_batch(0), jax.random.PRNGKey(0))
    params1 = tr.params(s)
    s, _ = tr.step(s, make_batch(1), jax.random.PRNGKey(1))
    for w in range(P):
        g0, g1 = worker_grad(params0, 0, w, P), worker_grad(params1, 1, w, P)
        for name in PARAMS:
            st = s.comp_state["units"][sorted(PARAMS).index(name)]
            if memory == "ef":
                p1 = g0[name]
                e1 = p1 - c.roundtrip(p1, None, None)[0]
                p2 = g1[name] + e1
                want = p2 - c.roundtrip(p2, None, None)[0]
                close(st.residual[w], want, 1e-5)
            else:  # DGC: u = m u + g, v = v + u, masked at the sent coordinates
                u = g0[name]
                sent = c.roundtrip(u, None, None)[0]
                v, u = u - sent, jnp.where(sent != 0, 0.0, u)
                u = 0.5 * u + g1[name]
                v = v + u
                sent = c.roundtrip(v, None, None)[0]
                close(st.v[w], v - sent, 1e-5)
                close(st.u[w], jnp.where(sent != 0, 0.0, u), 1e-5)
    # The summed gradient would give a different residual: the check above can fail.
    summed = sum(worker_grad(params0, 0, w, P)["w1"] for w in range(P))
    assert not np.allclose(
        summed - c.roundtrip(summed, None, None)[0],
        worker_grad(params0, 0, 0, P)["w1"] - c.roundtrip(worker_grad(params0, 0, 0, P)["w1"], None, None)[0],
        atol=1e-3,
    )


def test_dgc_at_density_one_equals_momentum_sgd():
    _, hd = run(trainer(4, opt=optax.sgd(0.05), compressor=C.topk(ratio=1.0), memory="dgc", momentum=0.9), 10)
    _, hm = run(trainer(4, opt=optax.sgd(0.05, momentum=0.9)), 10)
    close([h["loss"] for h in hd], [h["loss"] for h in hm], 1e-5)


def test_local_sgd_h1_equals_bsp_and_h4_syncs_every_4_steps():
    _, hb = run(trainer(4), 8)
    s1, h1 = run(trainer(4, local_steps=1, post_local_switch=1), 8)  # model averaging from step 1
    close([h["loss"] for h in h1], [h["loss"] for h in hb], 1e-5)
    t4 = trainer(4, local_steps=4)
    s4, h4 = run(t4, 8)
    assert [h["bytes_sent"] > 0 for h in h4] == [False, False, False, True] * 2
    same = lambda s: all(np.allclose(x, x[0]) for x in jax.tree.leaves(s.params))
    assert same(s4)  # step 7 was a sync step
    s5, _ = t4.step(s4, make_batch(8), jax.random.PRNGKey(8))
    assert not same(s5)  # a local step lets workers drift
    avg = jax.tree.map(lambda x: x.mean(0), s5.params)
    jax.tree.map(lambda a, b: close(a, b, 1e-6), t4.params(s5), avg)


def test_local_sgd_compressed_delta_and_post_local_switch():
    t = trainer(4, local_steps=2, post_local_switch=2, compress_delta=True, compressor=C.topk(ratio=0.25), memory="ef")
    _, h = run(t, 6)
    kinds = [t.phase(i).kind for i in range(6)]
    assert kinds == ["bsp", "bsp", "local", "sync", "local", "sync"]
    assert h[2]["bytes_sent"] == 0 and h[3]["bytes_sent"] == h[1]["bytes_sent"] > 0
    assert np.isfinite(h[-1]["loss"])


def test_dgc_warmup_schedule_changes_density_and_bytes():
    w = dgc_warmup(steps_per_epoch=1, dense_steps=1)
    t = trainer(4, compressor=C.topk(ratio=0.001), memory="dgc", opt=optax.sgd(0.1), warmup=w)
    _, h = run(t, 7)
    dens = [t.plan(t.phase(i)).density for i in range(7)]
    assert dens[0] == 1.0 and dens[1] > dens[2] > dens[3] >= dens[4] >= dens[5] == dens[6]
    assert [w.density(i) for i in range(7)] == [1.0, 0.25, 0.0625, 0.015625, 0.004, None, None]
    assert h[1]["bytes_sent"] > h[2]["bytes_sent"] > h[3]["bytes_sent"] >= h[6]["bytes_sent"]
    assert {c.kind for c in t.collectives(0)} == {"allreduce"}  # the dense phase
    assert {c.kind for c in t.collectives(1)} == {"allgather", "allreduce"}  # + model_state
    assert [x["density"] for x in h] == pytest.approx(dens, rel=1e-6)


def test_local_clipping_threshold_scaled_by_inverse_sqrt_workers():
    P, clip, lr = 4, 1e-3, 1.0
    t = trainer(P, opt=optax.sgd(lr), clip=clip)
    s0 = t.init()
    s1, _ = t.step(s0, make_batch(0), jax.random.PRNGKey(0))
    delta = jax.tree.map(lambda a, b: a - b, t.params(s1), t.params(s0))
    norm = float(optax.tree.norm(delta))
    assert norm <= lr * clip / np.sqrt(P) * (1 + 1e-5)
    want = jax.tree.map(
        lambda *g: -lr * sum(x * (clip / np.sqrt(P)) / optax.tree.norm(g_) for x, g_ in zip(g, grads)) / P,
        *(grads := [worker_grad(PARAMS, 0, w, P) for w in range(P)]),
    )
    jax.tree.map(lambda a, b: close(a, b, 1e-4), delta, want)


def test_fused_granularity_and_small_tensor_filter():
    c = C.topk(k=4)
    lay = trainer(4, compressor=c, memory="ef")
    fused = trainer(4, compressor=c, memory="ef", granularity="fused")
    filt = trainer(4, compressor=c, memory="ef", min_compress_size=17, compress_vectors=False)
    data = lambda t: [c for c in t.collectives(0) if (c.kind, c.bytes) != ("allreduce", 6 * 4)]
    (cl,), (cf,), cd = data(lay), data(fused), data(filt)
    assert cl.kind == cf.kind == "allgather" and cl.bytes == 3 * 4 * 8 and cf.bytes == 4 * 8
    n = PARAMS["w1"].size + PARAMS["b1"].size + PARAMS["w2"].size
    assert len(fused.init().comp_state["units"]) == 1
    assert fused.init().comp_state["units"][0].residual.shape == (4, n)
    # b1 (16, a vector) and w2 (16 < 17) go dense by allreduce; only w1 is compressed.
    assert sorted((x.kind, x.bytes) for x in cd) == [("allgather", 32.0), ("allreduce", 32 * 4.0)]
    _, h = run(fused, 3)
    assert np.isfinite(h[-1]["loss"])


def test_model_state_is_averaged_over_workers():
    P = 4
    t = trainer(P)
    s, _ = t.step(t.init(), make_batch(0), jax.random.PRNGKey(0))
    x = make_batch(0)["x"].reshape(P, -1, 6).mean(1)  # each worker's batch mean
    for w in range(P):
        close(s.model_state["mean"][w], 0.1 * x.mean(0), 1e-5)


def test_views_compile_once_per_trainer():
    """trainer.params / model_state are called every eval: they must not recompile each call."""
    t = trainer(4)
    s, _ = t.step(t.init(), make_batch(0), jax.random.PRNGKey(0))
    np.testing.assert_array_equal(t.params(s)["w1"], s.params["w1"][0])  # worker 0's replica
    np.testing.assert_array_equal(t.model_state(s)["mean"], s.model_state["mean"][0])
    compiled = t.launcher._view_fn._cache_size()  # one program per tree structure
    for _ in range(3):
        s, _ = t.step(s, make_batch(1), jax.random.PRNGKey(1))
        t.params(s), t.model_state(s)
    assert t.launcher._view_fn._cache_size() == compiled == 2


def test_seeds_equal_separate_runs():
    kw = dict(compressor=C.randomk(ratio=0.25), memory="ef")
    t = build(loss_fn, PARAMS, optax.sgd(0.1), EngineConfig(workers=4, **kw), model_state=MSTATE, seeds=2)
    p2 = jax.tree.map(lambda x: jnp.stack([x, 0.5 * x]), PARAMS)
    s = t.init(params=p2)
    keys = jnp.stack([jax.random.key_data(jax.random.PRNGKey(i)) for i in (7, 8)])
    for i in range(3):
        b = make_batch(i)
        s, m = t.step(s, jax.tree.map(lambda x: jnp.stack([x, x[::-1]]), b), keys)
    t1 = build(loss_fn, PARAMS, optax.sgd(0.1), EngineConfig(workers=4, **kw), model_state=MSTATE)
    for seed, scale in ((0, 1.0), (1, 0.5)):
        s1 = t1.init(params=jax.tree.map(lambda x: scale * x, PARAMS))
        for i in range(3):
            b = make_batch(i)
            s1, m1 = t1.step(s1, b if seed == 0 else jax.tree.map(lambda x: x[::-1], b), jax.random.PRNGKey(7 + seed))
        close(m["loss"][seed], m1["loss"], 1e-6)
        jax.tree.map(lambda a, b: close(a[seed], b, 1e-6), t.params(s), t1.params(s1))


def test_vmap_over_a_leading_seed_axis():
    t = trainer(4, compressor=C.topk(ratio=0.2), memory="ef")
    s = t.init()
    sv = jax.tree.map(lambda x: jnp.stack([x, x]), s)
    b = make_batch(0)
    bv = jax.tree.map(lambda x, y: jnp.stack([x, y]), b, make_batch(1))
    kv = jnp.stack([jax.random.key_data(jax.random.PRNGKey(0))] * 2)
    sv, mv = jax.vmap(t.step)(sv, bv, kv)
    s1, m1 = t.step(s, b, jax.random.PRNGKey(0))
    close(mv["loss"][0], m1["loss"], 1e-6)
    assert mv["loss"][0] != mv["loss"][1] and sv.step == 1


def test_signsgd_majority_vote_update_is_a_sign():
    t = trainer(4, opt=optax.sgd(0.01), compressor="signsgd", vote=True)
    s0 = t.init()
    s1, m = t.step(s0, make_batch(0), jax.random.PRNGKey(0))
    delta = jax.tree.map(lambda a, b: (b - a) / 0.01, t.params(s1), t.params(s0))
    g = [worker_grad(PARAMS, 0, w, 4) for w in range(4)]
    votes = jax.tree.map(lambda *x: sum(jnp.where(v >= 0, 1.0, -1.0) for v in x), *g)
    jax.tree.map(lambda d, v: close(d, jnp.where(v >= 0, 1.0, -1.0), 1e-4), delta, votes)
    # allgather: (P-1) * ceil(d/8) per tensor; + ring allreduce of model_state 2 (P-1)/P * 24
    assert m["bytes_sent"] == 3 * (16 * 6 // 8 + 2 + 2) + 1.5 * 24


def test_parameter_server_counts_uplink_and_downlink_separately():
    up, down = C.topk(ratio=0.25), C.topk(ratio=0.5)
    t = trainer(4, compressor=up, memory="ef", architecture="parameter-server", ps_downlink=down)
    _, h = run(t, 3)
    shapes = [PARAMS[k].shape for k in sorted(PARAMS)]
    ms = 6 * 4  # model_state: pushed and pulled dense
    assert h[-1]["bytes_sent"] == sum(up.wire_bytes(s) for s in shapes) + ms  # push, worker side
    assert h[-1]["bytes_received"] == sum(down.wire_bytes(s) for s in shapes) + ms  # pull
    assert h[-1]["server_bytes_received"] == 3 * h[-1]["bytes_sent"]
    assert h[-1]["server_bytes_sent"] == 3 * h[-1]["bytes_received"]
    # Without downlink compression, the server replies with the dense average.
    _, hd = run(trainer(4, compressor=up, memory="ef", architecture="ps"), 1)
    assert hd[0]["bytes_received"] == 4 * sum(np.prod(s) for s in shapes) + ms


def test_parameter_server_dense_equals_allreduce():
    _, ha = run(trainer(4), 4)
    _, hp = run(trainer(4, architecture="parameter-server"), 4)
    close([h["loss"] for h in hp], [h["loss"] for h in ha], 1e-5)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(memory="ema"), "memory"),
        (dict(architecture="ring"), "architecture"),
        (dict(compressor="nope"), "unknown compressor"),
        (dict(collective="gtopk", compressor="qsgd"), "top-k"),
        (dict(collective="gtopk", compressor=C.topk(ratio=0.1), architecture="ps"), "all-to-all"),
        (dict(vote=True, compressor="none"), "vote"),
        (dict(compressor="powersgd", granularity="fused"), "layerwise"),
        (dict(warmup=Warmup((0.5,), 2), compressor="signsgd"), "at_density"),
        (dict(ps_downlink="signsgd"), "parameter-server"),
        (dict(local_steps=0), "local_steps"),
        (dict(workers=64), "devices"),
    ],
)
def test_bad_config_is_a_clear_value_error(kw, match):
    with pytest.raises(ValueError, match=match):
        build(loss_fn, PARAMS, optax.sgd(0.1), EngineConfig(**{"workers": 4, **kw}), model_state=MSTATE)


def test_indivisible_batch_is_a_clear_value_error():
    t = trainer(4)
    with pytest.raises(ValueError, match="divisible"):
        t.step(t.init(), make_batch(0, n=30), jax.random.PRNGKey(0))


def test_powersgd_two_allreduces_with_error_feedback_on_the_aggregate():
    """Update == P Q^T with P = orth(mean_w M_w Q0), Q = mean_w M_w^T P; e_w = M_w - P Q^T;
    the bias and the thin matrix stay dense; the warm start is the aggregated Q."""
    from cconv.compressors.powersgd import orthogonalize

    Pw, c = 4, C.powersgd(rank=2)
    t = trainer(Pw, opt=optax.sgd(1.0), compressor=c, memory="ef")
    s0 = t.init()
    s1, m = t.step(s0, make_batch(0), jax.random.PRNGKey(0))
    g = [worker_grad(PARAMS, 0, w, Pw) for w in range(Pw)]
    q0 = c.init(PARAMS["w1"]).q
    p = orthogonalize(sum(x["w1"] @ q0 for x in g) / Pw)
    q = sum(x["w1"].T @ p for x in g) / Pw
    upd = -(t.params(s1)["w1"] - PARAMS["w1"])
    close(upd, p @ q.T, 1e-5)
    st = s1.comp_state["units"][0]  # w1 is the only factorised tensor
    close(st.inner.q[0], q, 1e-5)
    for w in range(Pw):
        # e_w = M_w - P Q^T cancels O(|M|) terms: float32 leaves ~eps * max|M| absolute error
        scale = float(np.max(np.abs(g[w]["w1"])))
        np.testing.assert_allclose(
            np.asarray(st.residual[w]), np.asarray(g[w]["w1"] - p @ q.T), rtol=1e-5, atol=8 * 2.0**-23 * scale
        )
    close(-(t.params(s1)["b1"] - PARAMS["b1"]), sum(x["b1"] for x in g) / Pw, 1e-5)
    assert not np.allclose(p @ q.T, sum(x["w1"] for x in g) / Pw, atol=1e-4)  # really rank 2
    # bytes: one allreduce of P (6x2) and one of Q (16x2), plus the dense b1, w2 and model_state
    assert m["bytes_sent"] == pytest.approx(1.5 * 4 * (12 + 32 + 16 + 16 + 6))
