"""Aggregation methods and transports as registry objects, and the Memory hooks they call.

* the registries (``AGGREGATIONS``, ``TRANSPORTS``, ``MEMORIES``) and how a plan picks a method;
* every method x architecture: the averaged update equals a reference computed from the
  compressor itself on each worker's tensors (same keys), and the parameter server equals
  all-to-all;
* the Memory hooks: ``wrap`` == the public wrappers, ``give_back`` returns values to the residual;
* a compressor registered at test time (a test-local ``Entry``) trains through ``build`` with
  error feedback, with no engine edit.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from engine_util import loss_fn, make_batch, make_model_state, make_params, run, worker_grad
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from cconv import compressors as C
from cconv import memory as M
from cconv.comm import MeshComm
from cconv.comm.aggregation import AGGREGATIONS, COLLECTIVES, TRANSPORTS, method_of, supporting
from cconv.compressors.base import Compressor, DensePayload, EmptyState, itemsize, like_info, size_of
from cconv.engine import EngineConfig, build
from cconv.engine.exchange import exchange, init_state, make_plan

# compiles every aggregation method x architecture: not in the fast subset (-m 'not slow')
pytestmark = pytest.mark.slow

W = 4
SHAPES = [(6, 16), (16,), (16, 1)]


def test_registries():
    assert set(AGGREGATIONS) == {"allreduce", "allgather", "vote", "gtopk", "powersgd", "intsum"}
    assert all(m.name == n for n, m in AGGREGATIONS.items())
    assert set(TRANSPORTS) == {"all-to-all", "parameter-server"}
    assert COLLECTIVES == ("auto", "allgather", "gtopk")
    assert set(M.MEMORIES) == {"none", "ef", "dgc", "ef21", "ef21_sgdm"}
    assert set(supporting("gtopk")) == {n for n in C.names() if "gtopk" in C.entry(n).collectives}
    assert {"topk", "dgc"} <= set(supporting("gtopk"))


@pytest.mark.parametrize(
    "c, collective, vote, want",
    [
        (C.topk(ratio=0.1), "auto", False, "allgather"),
        (C.topk(ratio=0.1), "gtopk", False, "gtopk"),
        (M.error_feedback(C.dgc(ratio=0.1)), "gtopk", False, "gtopk"),
        (C.qsgd(), "gtopk", False, "allgather"),  # not supported: its own aggregation
        (C.randomk(ratio=0.1), "auto", False, "allreduce"),
        (C.randomk(ratio=0.1), "allgather", False, "allgather"),
        (C.signsgd(), "auto", True, "vote"),
        (C.powersgd(rank=2), "auto", False, "powersgd"),
        (C.fp16(), "auto", True, "allreduce"),
    ],
)
def test_method_of(c, collective, vote, want):
    assert method_of(c, collective, vote) == want


def test_unknown_memory_is_a_one_line_value_error():
    with pytest.raises(ValueError, match="unknown memory 'ema'; valid: none, ef, dgc"):
        M.get("ema", C.topk(ratio=0.1))


# ----------------------------------------------------------------------------- exchange


def _run_exchange(cfg, base, memory, trees, key):
    """exchange() of each worker's tree over a 4-device mesh; returns (averages, plan)."""
    plan = make_plan(cfg, base, SHAPES, memory=memory)
    mesh = Mesh(np.array(jax.devices()[:W]), ("w",), axis_types=(jax.sharding.AxisType.Auto,))
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *trees)
    state = jax.tree.map(lambda x: jnp.broadcast_to(x, (W, *x.shape)), init_state(plan, trees[0]))

    def f(tree, st):
        comm = MeshComm("w", W)
        out, _ = exchange(comm, plan, jax.tree.map(lambda a: a[0], tree), jax.tree.map(lambda a: a[0], st), key)
        return jax.tree.map(lambda a: a[None], out)

    out = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("w"), P("w")), out_specs=P("w")))(stacked, state)
    return out, plan


def _reference(plan, trees, key):
    """What the method promises, computed from the compressor on each worker's tensors: summable
    payloads (the compressor's algebra, also when gathered) compressed with one key, summed in
    worker order and decoded once; others decoded each and summed."""
    c, outs = plan.comp, []
    summable = c.summable and plan.mode in ("allreduce", "allgather")
    for j in range(len(SHAPES)):
        xs = [t[j] for t in trees]
        if summable:
            ks = [jax.random.fold_in(key, j)] * W
        else:
            ks = [jax.random.fold_in(jax.random.fold_in(key, w), j) for w in range(W)]
        if summable:
            payloads = [c.compress(x, c.init(x), k)[0] for x, k in zip(xs, ks)]
            stacked = jax.tree.map(lambda *p: jnp.stack(p), *payloads)
            total = np.asarray(c.decompress(c.sum_payloads(stacked), xs[0]), np.float64)
        else:
            total = sum(np.asarray(c.roundtrip(x, c.init(x), k)[0], np.float64) for x, k in zip(xs, ks))
        outs.append(np.where(total >= 0, 1.0, -1.0) if plan.mode == "vote" else total / W)
    return outs


CASES = [
    ("allreduce", dict(), C.randomk(ratio=0.3)),
    ("allgather", dict(), C.qsgd(levels=4)),
    # a summable compressor forced to gather (randomk compiles for ~30 s under shard_map; its shared
    # key under PS is covered by the allreduce case above)
    ("allgather", dict(collective="allgather"), C.fp16()),
    ("vote", dict(vote=True), C.signsgd()),
]


@pytest.mark.parametrize("arch", ["all-to-all", "parameter-server"])
@pytest.mark.parametrize("method, kw, c", CASES, ids=[f"{m}-{c.name}" for m, _, c in CASES])
def test_every_method_and_architecture_gives_the_promised_average(method, kw, c, arch):
    cfg = EngineConfig(workers=W, compressor=c, architecture=arch, compress_vectors=True, **kw)  # every tensor
    rng = np.random.default_rng(0)
    trees = [[jnp.asarray(rng.normal(size=s), jnp.float32) for s in SHAPES] for _ in range(W)]
    key = jax.random.PRNGKey(3)
    out, plan = _run_exchange(cfg, c, "none", trees, key)
    assert plan.mode == method and plan.transport is TRANSPORTS[arch]
    for got, want in zip(out, _reference(plan, trees, key)):
        for w in range(W):  # identical on every worker
            np.testing.assert_allclose(np.asarray(got[w]), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "kw",
    [
        dict(compressor=C.topk(ratio=0.2), memory="ef"),
        dict(compressor=C.powersgd(rank=2), memory="ef"),
        dict(compressor="signsgd", vote=True),
        dict(compressor=C.randomk(ratio=0.25), memory="ef"),
        dict(compressor=C.dgc(ratio=0.2), memory="dgc"),
    ],
    ids=["allgather", "powersgd", "vote", "allreduce", "allgather-dgc"],
)
def test_parameter_server_equals_all_to_all(kw):
    mk = lambda arch: build(
        loss_fn,
        make_params(),
        optax.sgd(0.1),
        EngineConfig(workers=W, architecture=arch, **kw),
        model_state=make_model_state(),
    )
    sa, ha = run(mk("all-to-all"), 3)
    sp, hp = run(mk("parameter-server"), 3)
    np.testing.assert_allclose([h["loss"] for h in hp], [h["loss"] for h in ha], rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
        sp.comp_state["units"],
        sa.comp_state["units"],
    )


def test_gtopk_gives_back_through_the_memory_hook():
    """With EF, gTop-k's dropped entries reach the residual: update + sum of residuals == sum of
    gradients (nothing lost); without memory they are dropped."""
    cfg = EngineConfig(workers=W, compressor=C.topk(ratio=0.2), memory="ef", collective="gtopk", compress_vectors=True)
    rng = np.random.default_rng(1)
    trees = [[jnp.asarray(rng.normal(size=s), jnp.float32) for s in SHAPES] for _ in range(W)]
    plan = make_plan(cfg, cfg.compressor, SHAPES, memory="ef")
    assert plan.mode == "gtopk"
    mesh = Mesh(np.array(jax.devices()[:W]), ("w",), axis_types=(jax.sharding.AxisType.Auto,))
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *trees)
    state = jax.tree.map(lambda x: jnp.broadcast_to(x, (W, *x.shape)), init_state(plan, trees[0]))

    def f(tree, st):
        out, new = exchange(
            MeshComm("w", W),
            plan,
            jax.tree.map(lambda a: a[0], tree),
            jax.tree.map(lambda a: a[0], st),
            jax.random.PRNGKey(0),
        )
        return jax.tree.map(lambda a: a[None], (out, new))

    out, new = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("w"), P("w")), out_specs=P("w")))(stacked, state)
    for j in range(len(SHAPES)):
        total = sum(np.asarray(t[j], np.float64) for t in trees)
        kept = W * np.asarray(out[j][0], np.float64) + np.asarray(new["units"][j].residual, np.float64).sum(0)
        np.testing.assert_allclose(kept, total, rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------- memory hooks


@pytest.mark.parametrize("name", ["none", "ef", "dgc"])
def test_memory_registry_wraps_like_the_public_wrappers(name):
    c = C.topk(ratio=0.25)
    wrapped = M.wrap(c, M.get(name, c, momentum=0.5, masking=True))
    ref = {"none": c, "ef": M.error_feedback(c), "dgc": M.dgc(c, momentum=0.5)}[name]
    assert wrapped.name == ref.name and wrapped.hparams == ref.hparams
    x = jax.random.normal(jax.random.PRNGKey(0), (5, 8))
    s1, s2 = wrapped.init(x), ref.init(x)
    for t in range(3):
        (p1, s1), (p2, s2) = (w.compress(x * (t + 1), s, jax.random.PRNGKey(t)) for w, s in ((wrapped, s1), (ref, s2)))
        jax.tree.map(np.testing.assert_array_equal, (p1, s1), (p2, s2))


def test_give_back_adds_to_what_is_owed():
    c, x, back = C.topk(ratio=0.25), jnp.ones((4,)), jnp.arange(4.0)
    ef, dgc, none = (M.get(n, c) for n in ("ef", "dgc", "none"))
    np.testing.assert_array_equal(ef.give_back(ef.init(x, c.init), back).residual, back)
    np.testing.assert_array_equal(dgc.give_back(dgc.init(x, c.init), back).v, back)
    assert none.give_back(none.init(x, c.init), back) == c.init(x)


# ----------------------------------------------------------------------------- a new compressor


def _grid(step: float = 0.125) -> Compressor:
    """Round to a grid of ``step`` (deterministic, biased): a test-local compressor."""

    def compress(x, state, key):
        return DensePayload(jnp.round(x / step) * step), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        return payload.values.reshape(shape).astype(dtype)

    return Compressor(
        lambda x: EmptyState(),
        compress,
        decompress,
        lambda shape, dtype="float32": size_of(shape) * itemsize(dtype),
        lambda shape: 1.0,
        name="grid",
        unbiased=False,
        aggregation="allgather",
        hparams={"step": step},
    )


def test_a_compressor_registered_at_test_time_trains_with_error_feedback():
    grid = C.register(
        "test_grid",
        C.Entry(
            _grid,
            C.Schema((C.Param("step", "float", 0.125, low=0.0, low_open=True),)),
            aggregation="allgather",
            label="grid rounding (test)",
        ),
    )
    assert "test_grid" in C.names()
    c = grid(step=0.25)
    tr = build(
        loss_fn,
        make_params(),
        optax.sgd(0.1),
        EngineConfig(workers=W, compressor=c, memory="ef", compress_vectors=True),  # b1 too
        model_state=make_model_state(),
    )
    assert tr.plan(tr.phase(0)).mode == "allgather"
    s0 = tr.init()
    s1, m = tr.step(s0, make_batch(0), jax.random.PRNGKey(0))
    g = [worker_grad(make_params(), 0, w, W) for w in range(W)]
    rnd = lambda v: np.round(np.asarray(v) / 0.25) * 0.25
    for name in ("w1", "b1", "w2"):
        want = sum(rnd(x[name]) for x in g) / W
        np.testing.assert_allclose(-(tr.params(s1)[name] - make_params()[name]) / 0.1, want, rtol=1e-5, atol=1e-6)
        st = s1.comp_state["units"][sorted(make_params()).index(name)]
        np.testing.assert_allclose(st.residual, [np.asarray(x[name]) - rnd(x[name]) for x in g], atol=1e-6)
    _, hist = run(tr, 15)
    assert np.isfinite(hist[-1]["loss"]) and hist[-1]["loss"] < hist[0]["loss"]
    # by name too, and the gtopk error lists what the registry supports
    EngineConfig(workers=W, compressor="test_grid", memory="ef")
    with pytest.raises(ValueError, match=r"top-k selection compressor \(.*topk.*\), got 'test_grid'"):
        EngineConfig(workers=W, compressor="test_grid", collective="gtopk")


# ----------------------------------------------------------------------------- the declared algebra


def _signed_square(step: float = 1.0) -> Compressor:
    """Summable payloads with a nonlinear decode: the payload is x (dense), its decode
    p |p| / step.  Sum-then-decode and decode-then-sum differ, so the architecture must follow
    the declaration ("allreduce": sum, then decode once)."""

    def compress(x, state, key):
        return DensePayload(x), state

    def decompress(payload, like):
        shape, dtype = like_info(like)
        v = payload.values.reshape(shape).astype(jnp.float32)
        return (v * jnp.abs(v) / step).astype(dtype)

    return Compressor(
        lambda x: EmptyState(),
        compress,
        decompress,
        lambda shape, dtype="float32": size_of(shape) * itemsize(dtype),
        lambda shape: 1.0,
        name="signed_square",
        unbiased=False,
        aggregation="allreduce",
        hparams={"step": step},
    )


@pytest.mark.parametrize(
    "arch, collective",
    [
        ("all-to-all", "auto"),
        ("parameter-server", "auto"),
        ("all-to-all", "allgather"),
        ("parameter-server", "allgather"),
    ],
)
def test_every_architecture_follows_the_declared_algebra(arch, collective):
    """A summable compressor with a nonlinear decode: all-reduce, the server's sum and gathered
    payloads all compute decode(sum_w payload_w) / P (before, the server and the all-gather
    computed sum_w decode(payload_w) / P: another algorithm, picked by the architecture)."""
    c = _signed_square()
    cfg = EngineConfig(workers=W, compressor=c, architecture=arch, collective=collective, compress_vectors=True)
    rng = np.random.default_rng(2)
    trees = [[jnp.asarray(rng.normal(size=s), jnp.float32) for s in SHAPES] for _ in range(W)]
    out, plan = _run_exchange(cfg, c, "none", trees, jax.random.PRNGKey(0))
    for j, got in enumerate(out):
        total = sum(np.asarray(t[j], np.float64) for t in trees)
        np.testing.assert_allclose(np.asarray(got[0]), total * np.abs(total) / W, rtol=1e-5, atol=1e-6)
        wrong = sum(np.asarray(t[j], np.float64) * np.abs(np.asarray(t[j], np.float64)) for t in trees) / W
        assert np.abs(np.asarray(got[0]) - wrong).max() > 0.1  # the two algorithms do differ here


def test_gossip_refuses_an_aggregation_that_is_its_own_reducer():
    with pytest.raises(ValueError, match="its own reducer") as e:
        EngineConfig(workers=W, sync="gossip", compressor=C.powersgd(rank=2))
    assert len(str(e.value).splitlines()) == 1
