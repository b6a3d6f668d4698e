"""The drop-in API: ``cconv.Exchange`` / ``cconv.as_optax`` inside a user's own shard_map or pmap
give the engine's averages and bytes for the same configuration; the loop of docs/dropin.md runs as printed;
the shard_map traps are handled or reported."""

import os
import re
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from engine_util import make_batch, make_params
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import cconv
from cconv import compressors as C
from cconv.comm import hlo
from cconv.engine import EngineConfig, build

W = 4
PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "dropin.md")


def loss(params, batch):
    h = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
    return jnp.mean(((h @ params["w2"])[:, 0] - batch["y"]) ** 2)


def engine_loss(params, model_state, batch, key):
    return loss(params, batch), (model_state, {})  # no model state: only the exchange moves bytes


def mesh(axis_type=AxisType.Auto, workers=W):
    return Mesh(np.array(jax.devices()[:workers]), ("data",), axis_types=(axis_type,))


def engine_step(kw, step_key=0):
    """One engine step with plain SGD(1): (new params (worker 0), metrics)."""
    tr = build(engine_loss, make_params(), optax.sgd(1.0), EngineConfig(workers=W, axis_name="data", **kw), {})
    state, m = tr.step(tr.init(), make_batch(0), jax.random.PRNGKey(step_key))
    return tr.params(state), {k: float(v) for k, v in m.items()}


def comm_key(step_key=0):
    return jax.random.split(jax.random.PRNGKey(step_key))[1]  # the engine's exchange key


def sgd1(params, avg):
    tx = optax.sgd(1.0)
    return optax.apply_updates(params, tx.update(avg, tx.init(params))[0])


def dropin_step(ex, m, check_vma=False):
    """One drop-in SGD(1) step in a user's shard_map: (new params, traffic)."""
    params, batch = make_params(), jax.device_put(make_batch(0), NamedSharding(m, P("data")))
    out_p = P() if not check_vma else P("data")

    @jax.jit
    @partial(jax.shard_map, mesh=m, in_specs=(P(), P("data"), P()), out_specs=(out_p, P()), check_vma=check_vma)
    def step(params, batch, key):
        p = lax.pcast(params, "data", to="varying") if check_vma else params
        grads = jax.grad(loss)(p, batch)
        avg, state, traffic = ex(grads, ex.init(grads), key)
        new = sgd1(p, avg)
        return (jax.tree.map(lambda x: x[None], new) if check_vma else new), traffic

    new, traffic = step(params, batch, comm_key())
    if check_vma:
        new = jax.tree.map(lambda x: np.asarray(x)[0], new)  # worker 0's (host-side: Explicit meshes)
    return new, {k: float(v) for k, v in traffic.items()}


def assert_same(engine, dropin):
    (p_e, m_e), (p_d, t_d) = engine, dropin
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7), p_e, p_d)
    for k, v in t_d.items():
        if k != "bytes_control":
            assert m_e[k] == pytest.approx(v), k
    # the engine's control all-reduce also carries its one logged metric (the loss): 4 bytes more
    assert m_e["bytes_control"] - t_d["bytes_control"] == pytest.approx(2 * (W - 1) / W * 4)


CASES = {
    "topk-ef": dict(compressor=C.topk(ratio=0.1), memory="ef"),
    "qsgd": dict(compressor=C.qsgd(levels=4)),
    "stc-golomb": dict(compressor=C.stc(ratio=0.1, positions="golomb"), memory="ef"),
    "topk-ps": dict(compressor=C.topk(ratio=0.1), memory="ef", architecture="parameter-server"),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.slow
def test_exchange_equals_the_engine(name):
    kw = CASES[name]
    engine = engine_step(kw)
    dropin = dropin_step(cconv.Exchange(axis_name="data", **kw), mesh())
    assert_same(engine, dropin)
    if name == "stc-golomb":  # entropy-coded positions: encoded < moved, from the workers' own sizes
        assert dropin[1]["bytes_encoded_sent"] < dropin[1]["bytes_sent"]
        assert dropin[1]["bytes_control"] > 0  # the table of encoded sizes: one control all-reduce
    else:
        assert dropin[1]["bytes_control"] == 0  # fixed-size payloads: no extra collective
    if name == "topk-ps":
        assert dropin[1]["server_bytes_received"] == pytest.approx((W - 1) * dropin[1]["bytes_sent"])


@pytest.mark.parametrize("name", ["stc-golomb", "topk-ps"])
def test_the_compiled_dropin_moves_what_traffic_says(name):
    ex, m = cconv.Exchange(axis_name="data", **CASES[name]), mesh()
    batch = jax.device_put(make_batch(0), NamedSharding(m, P("data")))

    @jax.jit
    @partial(jax.shard_map, mesh=m, in_specs=(P(), P("data"), P()), out_specs=(P(), P()), check_vma=False)
    def step(params, batch, key):
        grads = jax.grad(loss)(params, batch)
        avg, _, traffic = ex(grads, ex.init(grads), key)
        return avg, traffic

    args = (make_params(), batch, comm_key())
    sent, recv = hlo.per_device_traffic(step.lower(*args).compile().as_text(), W)
    t = {k: float(v) for k, v in step(*args)[1].items()}
    r = ex.report_rank(W)  # every collective, control included, as the compiled program moves them
    assert sent[r] == pytest.approx(t["bytes_sent"] + t["bytes_control"])
    assert recv[r] == pytest.approx(t["bytes_received"] + t["bytes_control"])


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
@pytest.mark.slow
def test_auto_and_explicit_meshes_with_and_without_check_vma(axis_type):
    kw = CASES["topk-ef"]
    engine = engine_step(kw)
    ex = cconv.Exchange(axis_name="data", **kw)
    assert_same(engine, dropin_step(ex, mesh(axis_type)))
    assert_same(engine, dropin_step(ex, mesh(axis_type), check_vma=True))  # pcast params, per-worker out


def test_pmap():
    kw = CASES["topk-ef"]
    p_e, m_e = engine_step(kw)
    ex, params, b = cconv.Exchange(axis_name="data", **kw), make_params(), make_batch(0)
    batch = jax.tree.map(lambda x: x.reshape(W, -1, *x.shape[1:]), b)

    def step(batch, key):
        grads = jax.grad(loss)(params, batch)
        avg, state, traffic = ex(grads, ex.init(grads), key)
        return sgd1(params, avg), state, traffic

    new, state, traffic = jax.pmap(step, axis_name="data", in_axes=(0, None), devices=jax.devices()[:W])(
        batch, comm_key()
    )
    assert all(x.shape[:2] == (W, 1) for x in jax.tree.leaves(state))  # leading worker axis of 1 inside
    assert_same((p_e, m_e), (jax.tree.map(lambda x: x[0], new), {k: float(v[0]) for k, v in traffic.items()}))


@pytest.mark.slow
def test_replicated_gradients_under_check_vma_raise_one_line():
    ex, m = cconv.Exchange(C.topk(ratio=0.1), memory="ef", axis_name="data"), mesh()

    @partial(jax.shard_map, mesh=m, in_specs=(P(), P("data")), out_specs=P())
    def step(params, batch):
        grads = jax.grad(loss)(params, batch)  # summed over 'data' by jax.grad already
        return ex(grads, ex.init(grads), jax.random.PRNGKey(0))[0]

    with pytest.raises(ValueError, match=r"pcast\(params, 'data', to=\"varying\"\)") as e:
        step(make_params(), jax.device_put(make_batch(0), NamedSharding(m, P("data"))))
    assert "\n" not in str(e.value)


def test_bad_input():
    with pytest.raises(ValueError, match="EngineConfig.memory"):
        cconv.Exchange(C.topk(ratio=0.1), memory="nope")
    with pytest.raises(ValueError, match="not bound"):
        ex = cconv.Exchange(axis_name="batch")
        jax.pmap(lambda g: ex(g, ex.init(g), jax.random.PRNGKey(0))[0], axis_name="data")(jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="workers=3 but axis 'data' has size 2"):
        ex = cconv.Exchange(axis_name="data", workers=3)
        jax.pmap(lambda g: ex(g, ex.init(g), jax.random.PRNGKey(0))[0], axis_name="data")(jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="seed"):
        cconv.as_optax(C.topk(ratio=0.1), seed="0")


@pytest.mark.slow
def test_as_optax_averages_with_its_own_key_and_counts_steps():
    ex = cconv.Exchange(C.randomk(ratio=0.25), axis_name="data")  # the key picks the coordinates
    tx = cconv.as_optax(C.randomk(ratio=0.25), axis_name="data", seed=7)
    m = mesh()
    batch = jax.device_put(make_batch(0), NamedSharding(m, P("data")))

    @jax.jit
    @partial(jax.shard_map, mesh=m, in_specs=(P(), P("data")), out_specs=(P(), P(), P("data")), check_vma=False)
    def two_steps(params, batch):
        grads = jax.grad(loss)(params, batch)
        state = tx.init(params)
        outs = []
        for t in range(2):
            upd, state = tx.update(grads, state, params)
            want, _, traffic = ex(grads, ex.init(grads), jax.random.fold_in(jax.random.PRNGKey(7), t))
            outs.append((upd, want))
        return outs, traffic, state

    outs, traffic, state = two_steps(make_params(), batch)
    for upd, want in outs:
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), upd, want)
    assert not np.array_equal(np.asarray(outs[0][0]["w1"]), np.asarray(outs[1][0]["w1"]))  # a fresh key per step
    assert state.count.shape == (W,) and (np.asarray(state.count) == 2).all()
    assert all(x.ndim >= 1 and x.shape[0] == W for x in jax.tree.leaves(state))  # shards as P("data")
    assert float(state.traffic["bytes_sent"][0]) == float(traffic["bytes_sent"]) > 0


@pytest.mark.slow
def test_docs_dropin_example_runs_and_moves_the_engines_bytes(capsys):
    text = open(PAGE).read()
    section = text[text.index("<!-- BEGIN dropin -->") : text.index("<!-- END dropin -->")]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2 and "range(200)" in blocks[0]
    blocks += re.findall(r"```python\n(.*?)```", text[text.index("<!-- END dropin -->") :], re.S)  # the rest
    ns = {"__name__": "readme"}
    exec(compile("\n".join(blocks).replace("range(200)", "range(64)"), "docs/dropin.md", "exec"), ns)
    out = capsys.readouterr().out
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", out)]
    assert len(losses) == 4 and np.isfinite(losses).all() and losses[-1] < losses[0] / 2
    # the engine, same model and configuration: same bytes per worker
    params = jax.tree.map(jnp.zeros_like, ns["params"])
    cfg = EngineConfig(workers=8, compressor=C.topk(ratio=0.01), memory="ef", axis_name="data")
    tr = build(lambda p, s, b, k: (ns["loss_fn"](p, b["x"], b["y"]), (s, {})), params, optax.sgd(0.1), cfg, {})
    x = jax.random.normal(jax.random.PRNGKey(0), (256, 32))
    _, m = tr.step(tr.init(), {"x": x, "y": x[:, :1]}, jax.random.PRNGKey(0))
    sent = jax.device_get(ns["opt_state"][0].traffic["bytes_sent"])
    assert (sent == float(m["bytes_sent"])).all()
    for k, v in ns["traffic"].items():
        if k != "bytes_control":
            assert float(v) == float(m[k]), k


# ----------------------------------------------------------------------------- first-contact errors and DDP helpers


@pytest.mark.parametrize(
    "make", [lambda: cconv.as_optax("topk", ratio=0.01), lambda: cconv.Exchange("topk", ratio=0.01)]
)
def test_compressor_knobs_given_to_the_exchange_are_a_one_line_error_naming_them(make):
    with pytest.raises(ValueError) as e:  # was: TypeError: unexpected keyword argument 'ratio'
        make()
    msg = str(e.value)
    assert "\n" not in msg and "cconv.compressors.get('topk', ratio=0.01)" in msg
    assert "ratio, k, positions" in msg and "memory" in msg  # the compressor's knobs and the valid options


def test_state_specs_put_cconvs_state_per_worker_and_the_rest_replicated():
    tx = optax.chain(cconv.as_optax(C.topk(ratio=0.5), memory="ef"), optax.adam(1e-3))
    params = make_params()
    specs = cconv.state_specs(jax.eval_shape(tx.init, params))
    assert set(jax.tree.leaves(specs[0], is_leaf=lambda x: isinstance(x, P))) == {P("data")}
    assert set(jax.tree.leaves(specs[1], is_leaf=lambda x: isinstance(x, P))) == {P()}
    opt_state, got = cconv.init_state(tx, params, mesh())
    assert got == specs and opt_state[0].count.shape == (W,)
    cconv.check_specs(opt_state, got, workers=W)


def test_check_specs_names_the_leaf_of_a_wrong_layout():
    tx = optax.chain(cconv.as_optax(C.topk(ratio=0.5), memory="ef"), optax.adam(1e-3))
    opt_state, specs = cconv.init_state(tx, make_params(), mesh())
    with pytest.raises(ValueError, match=r"opt_state\[0\]\.exchange.*needs spec P\('data'\)"):
        cconv.check_specs(opt_state, (P(), P()))
    with pytest.raises(ValueError, match=r"opt_state\[1\].*replicated optimizer state"):
        cconv.check_specs(opt_state, (specs[0], P("data")))
    with pytest.raises(ValueError, match="not one row per worker"):
        cconv.check_specs(opt_state, specs, workers=2 * W)


def test_as_optax_refuses_a_state_that_reached_every_worker_whole():
    tx = cconv.as_optax(C.topk(ratio=0.5), memory="ef")
    params = make_params()
    opt_state, _ = cconv.init_state(tx, params, mesh())
    step = jax.shard_map(  # the per-worker state given as replicated: each worker sees all W rows
        lambda g, s: tx.update(g, s)[0], mesh=mesh(), in_specs=(P(), P()), out_specs=P(), check_vma=False
    )
    with pytest.raises(ValueError, match=r"4 rows inside the map.*P\('data'\)"):
        jax.jit(step)(params, opt_state)


def test_worker_key_differs_per_worker_and_is_deterministic():
    f = jax.jit(
        jax.shard_map(
            lambda k: jax.random.key_data(cconv.worker_key(k))[None], mesh=mesh(), in_specs=P(), out_specs=P("data")
        )
    )
    keys = np.asarray(f(jax.random.PRNGKey(7)))
    assert len({tuple(k) for k in keys}) == W
    np.testing.assert_array_equal(keys, np.asarray(f(jax.random.PRNGKey(7))))
    np.testing.assert_array_equal(keys[1], np.asarray(jax.random.fold_in(jax.random.PRNGKey(7), 1)))


def test_sync_model_state_averages_and_check_mode_warns_once():
    import warnings

    from cconv.engine import ddp

    stats = jnp.arange(W * 3, dtype=jnp.float32).reshape(W, 3)  # different on every worker
    avg = jax.jit(
        jax.shard_map(lambda s: cconv.sync_model_state(s), mesh=mesh(), in_specs=P("data"), out_specs=P("data"))
    )
    np.testing.assert_allclose(np.asarray(avg(stats)), np.broadcast_to(np.asarray(stats).mean(0), (W, 3)))
    check = jax.jit(
        jax.shard_map(
            lambda s: cconv.sync_model_state(s, mode="check"), mesh=mesh(), in_specs=P("data"), out_specs=P("data")
        )
    )
    ddp._WARNED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        np.testing.assert_array_equal(np.asarray(check(stats)), np.asarray(stats))  # unchanged
        check(stats + 1)
        jax.effects_barrier()
        check(jnp.ones((W, 3)))  # equal on every worker: nothing to say
        jax.effects_barrier()
    drift = [w for w in caught if issubclass(w.category, ddp.ModelStateDivergenceWarning)]
    assert len(drift) == 1 and "differs across the workers" in str(drift[0].message)
    with pytest.raises(ValueError, match="mode must be one of mean, check"):
        cconv.sync_model_state(stats, mode="max")


def test_sign_method_under_sgd_with_an_sgd_learning_rate_warns_once():
    """The rule is read from the registry bound (biased, not even non-expansive), not from a name."""
    import warnings

    from cconv.experiments import build as B
    from cconv.experiments import config as EC

    B._WARNED.clear()
    base = {"compressor": "signsgd", "optimizer": {"name": "sgd", "momentum": 0.9}}
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        B.make_compression(EC.from_dict({**base, "lr": 0.1}), [(64, 16)])  # SGD's lr: warns
        B.make_compression(EC.from_dict({**base, "lr": 0.1}), [(64, 16)])  # once per process
        B.make_compression(EC.from_dict({**base, "lr": 1e-3}), [(64, 16)])  # retuned: silent
        B.make_compression(EC.from_dict({**base, "lr": 0.1, "optimizer": {"name": "adam"}}), [(64, 16)])  # adaptive
        B.make_compression(EC.from_dict({**base, "lr": 0.1, "compressor": "scaled_sign"}), [(64, 16)])  # scaled
        B.make_compression(EC.from_dict({**base, "lr": 0.1, "compressor": {"name": "topk", "ratio": 0.1}}), [(64, 16)])
    msgs = [str(x.message) for x in w if issubclass(x.category, B.SignLearningRateWarning)]
    assert len(msgs) == 1 and "\n" not in msgs[0], msgs
    assert msgs[0].startswith("signsgd is not scaled to the gradient") and "lr 0.1" in msgs[0]


# ----------------------------------------------------------------------------- 1-D tensors (biases, norm scales)


def exchanged_traffic(ex, grads):
    """The traffic of one drop-in exchange of ``grads`` (the same tree on every worker)."""

    @jax.jit
    @partial(jax.shard_map, mesh=mesh(), in_specs=(P(), P()), out_specs=P(), check_vma=False)
    def f(g, key):
        return ex(g, ex.init(g), key)[2]

    return {k: float(v) for k, v in f(grads, comm_key()).items()}


@pytest.mark.slow
@pytest.mark.parametrize("setting", [{}, {"compress_vectors": True}], ids=["default", "compress_vectors"])
def test_vectors_travel_dense_by_default_in_the_engine_and_the_dropin_alike(setting):
    """DDP's PowerSGD hook and DGC leave 1-D tensors dense; so does cconv unless told otherwise:
    the bias ``b1`` travels in the dense all-reduce (its bytes its dense bytes) in the engine and
    the drop-in alike, and ``compress_vectors=True`` compresses it again (top-k with k = 2 of 16)."""
    kw = dict(compressor=C.topk(ratio=0.1), memory="ef", **setting)
    ex = cconv.Exchange(axis_name="data", **kw)
    params = make_params()
    shapes = [x.shape for x in jax.tree.leaves(params)]
    dense = not setting.get("compress_vectors", False)
    assert EngineConfig(**kw).compress_vectors == ex.config.compress_vectors == (not dense)
    assert list(ex.plan(shapes).compressed) == [len(s) > 1 or not dense for s in shapes]  # b1, w1, w2
    assert_same(engine_step(kw), dropin_step(ex, mesh()))  # same averages, same bytes
    # the bytes: the matrices' top-k payloads plus the bias, dense (its own exchange without compressor)
    # or compressed (the same top-k)
    bias, matrices = {"b1": params["b1"]}, {k: v for k, v in params.items() if k != "b1"}
    got = exchanged_traffic(ex, params)
    whole = exchanged_traffic(cconv.Exchange(axis_name="data", **kw), matrices)
    part = exchanged_traffic(cconv.Exchange(axis_name="data", **({} if dense else kw)), bias)
    for k in ("bytes_sent", "bytes_received"):
        assert got[k] == whole[k] + part[k], k
    # a ring all-reduce of 16 floats | an all-gather of 2 values and 2 indices
    assert part["bytes_sent"] == (2 * (W - 1) / W * 4 * 16 if dense else (W - 1) * 2 * 8)


def test_the_dropin_reads_the_engines_default_for_vectors():
    import inspect

    default = inspect.signature(cconv.Exchange).parameters["compress_vectors"].default
    assert default is EngineConfig.compress_vectors is False
    assert cconv.Exchange(C.topk(ratio=0.1), axis_name="data").config.compress_vectors is False
