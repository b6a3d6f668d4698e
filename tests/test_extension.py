"""Extending cconv from outside the package: ``tests/ext_countsketch.py`` registers a count-sketch
compressor (summable sketches, nonlinear decode) and a SketchSGD aggregation method from user
code, with no edit inside ``cconv/``.  Here they run through

* the generic compressor checks, for the claims the entry makes (``registry_cases.claims``);
* the exchange on all-to-all, the parameter server and gathered payloads: every architecture
  follows the declared algebra (sum the sketches, decode once), and so does gossip;
* the custom aggregation (``collective="sketch_topk"``) on all-to-all and the parameter server,
  refused by gossip in one line;
* the bytes the engine logs against the compiled program (HLO), like the built-ins;
* a run configuration that names the compressor by import path (as in a YAML config).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import registry_cases as R
from engine_util import loss_fn, make_batch, make_model_state, make_params, run
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from test_hlo_bytes import check_hlo_bytes

from cconv import compressors as C
from cconv.comm import MeshComm, hlo
from cconv.comm.aggregation import COLLECTIVES
from cconv.engine import EngineConfig, build
from cconv.engine.exchange import exchange, init_state, make_plan

W = 4
SHAPES = [(6, 16), (16,)]
NAME = "count_sketch"
with R.registries_restored():  # registered for collection, then only while this module's tests run
    import ext_countsketch as X

    CASES = R.cases(names=[NAME], further={NAME: X.FURTHER})


@pytest.fixture(autouse=True, scope="module")
def _registered():
    """The count sketch and its aggregation are registered while this module's tests run, and the
    registries are put back afterwards (other modules enumerate them)."""
    with R.registries_restored():
        C.register(NAME, X.COUNT_SKETCH)
        C.register_aggregation(X.SketchTopK())
        yield


# ----------------------------------------------------------------------------- the entry


@pytest.mark.parametrize("name,hp", CASES)
@pytest.mark.slow
def test_generic_checks_and_declared_claims(name, hp):
    """Every generic check, and a check for every claim the entry makes: summable payloads
    (rows = 1 also unbiased); it claims no bound and no exact error term, so those are not run."""
    s = R.subject(name, hp)
    for check in R.GENERIC_CHECKS:
        check(s)
    R.check_bad_hparams(s.entry, hp)
    made = R.claims(s)
    assert "summable payloads (algebra SUM)" in made and ("unbiased" in made) == (hp.get("rows") == 1)
    assert not any("Theory" in claim for claim in made)  # only a wire-bytes formula is claimed
    for check in made.values():
        check(s)


def test_required_hyper_parameter_and_theory_parts():
    with pytest.raises(ValueError, match="count_sketch: ratio") as e:
        C.get(NAME)
    assert len(str(e.value).splitlines()) == 1
    ids = [p.id for p in R.cases()]
    assert f"{NAME}-ratio=0.5,rows=1" in ids  # collected with the other compressors' cases
    # the subsets as they are now (the module's constants were drawn when registry_cases was first
    # imported, which under xdist may be before this module registered the count sketch)
    claims = {
        part: {p.values[0] for p in R.cases(R._claims_part(part))} for part in ("wire_bytes", "bound", "error_sq")
    }
    assert NAME not in claims["bound"] | claims["error_sq"]  # no claim, no test
    assert NAME in claims["wire_bytes"]
    from cconv.theory import constants as K

    c = X.count_sketch(ratio=0.5)
    assert K.wire_bytes(c, (40,)) == c.wire_bytes((40,)) == 3 * 20 * 4 + 8
    with pytest.raises(ValueError, match="no constants"):
        K.omega(c, (40,))


# ----------------------------------------------------------------------------- the algebra


def _exchange(cfg, trees, key):
    plan = make_plan(cfg, cfg.compressor, SHAPES, memory="none")
    mesh = Mesh(np.array(jax.devices()[:W]), ("w",), axis_types=(jax.sharding.AxisType.Auto,))
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *trees)
    state = jax.tree.map(lambda x: jnp.broadcast_to(x, (W, *x.shape)), init_state(plan, trees[0]))

    def f(tree, st):
        out, _ = exchange(
            MeshComm("w", W), plan, jax.tree.map(lambda a: a[0], tree), jax.tree.map(lambda a: a[0], st), key
        )
        return jax.tree.map(lambda a: a[None], out)

    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("w"), P("w")), out_specs=P("w")))(stacked, state), plan


def _sketch_reference(c, xs, key):
    """decode(sum_w sketch(x_w)) / P with one key, and the decode-then-sum alternative."""
    payloads = [c.compress(x, None, key)[0] for x in xs]
    summed = X.SketchPayload(sum(p.table for p in payloads), payloads[0].key)
    once = np.asarray(c.decompress(summed, xs[0]), np.float64) / W
    each = sum(np.asarray(c.decompress(p, xs[0]), np.float64) for p in payloads) / W
    return once, each


@pytest.fixture(scope="module")
def trees():
    rng = np.random.default_rng(0)
    return [[jnp.asarray(rng.normal(size=s), jnp.float32) for s in SHAPES] for _ in range(W)]


@pytest.mark.parametrize(
    "arch, collective",
    [
        ("all-to-all", "auto"),
        pytest.param("parameter-server", "auto", marks=pytest.mark.slow),
        pytest.param("all-to-all", "allgather", marks=pytest.mark.slow),
    ],
)
@pytest.mark.slow
def test_every_architecture_sums_the_sketches_then_decodes_once(trees, arch, collective):
    c = X.count_sketch(ratio=0.5)
    # every leaf sketched, the 1-D ones too (by default they travel dense)
    cfg = EngineConfig(workers=W, compressor=c, architecture=arch, collective=collective, compress_vectors=True)
    key = jax.random.PRNGKey(3)
    out, plan = _exchange(cfg, trees, key)
    assert plan.mode == ("allgather" if collective == "allgather" else "allreduce")
    for j, got in enumerate(out):
        once, each = _sketch_reference(c, [t[j] for t in trees], jax.random.fold_in(key, j))
        for w in range(W):
            np.testing.assert_allclose(np.asarray(got[w]), once, rtol=1e-5, atol=1e-5)
        assert np.abs(once - each).max() > 1e-2  # the median is not linear: the order matters


# The fast tier (-m "not slow") keeps one architecture of each of these two tests.
@pytest.mark.parametrize("arch", ["all-to-all", pytest.param("parameter-server", marks=pytest.mark.slow)])
@pytest.mark.slow
def test_a_custom_aggregation_selected_by_collective(trees, arch):
    """``sketch_topk`` (registered by the user module) is a selectable collective: the heavy
    hitters of the once-decoded sum, the same on every worker and on both architectures."""
    assert "sketch_topk" in COLLECTIVES
    c = X.count_sketch(ratio=0.5, heavy=0.25)
    cfg = EngineConfig(workers=W, compressor=c, architecture=arch, collective="sketch_topk", compress_vectors=True)
    key = jax.random.PRNGKey(5)
    out, plan = _exchange(cfg, trees, key)
    assert plan.mode == "sketch_topk"
    for j, got in enumerate(out):
        once, _ = _sketch_reference(c, [t[j] for t in trees], jax.random.fold_in(key, j))
        keep = np.argsort(-np.abs(once.reshape(-1)))[: int(np.ceil(0.25 * once.size))]
        want = np.zeros(once.size)
        want[keep] = once.reshape(-1)[keep]
        np.testing.assert_allclose(np.asarray(got[0]).reshape(-1), want, rtol=1e-5, atol=1e-5)


def test_gossip_refuses_the_custom_aggregation_in_one_line():
    c = X.count_sketch(ratio=0.5)
    with pytest.raises(ValueError, match="gossip") as e:
        EngineConfig(workers=W, compressor=c, sync="gossip", collective="sketch_topk")
    assert len(str(e.value).splitlines()) == 1


# ----------------------------------------------------------------------------- the engine


def _train(**kw):
    tr = build(loss_fn, make_params(), optax.sgd(0.1), EngineConfig(workers=W, **kw), model_state=make_model_state())
    return run(tr, 3)[1]


@pytest.mark.parametrize(
    "kw",
    [
        pytest.param(dict(memory="ef"), id="all-reduce"),
        pytest.param(dict(memory="ef", architecture="parameter-server"), id="parameter-server", marks=pytest.mark.slow),
        pytest.param(
            dict(sync="gossip", gossip="choco", gossip_gamma=0.5, topology="ring"), id="gossip", marks=pytest.mark.slow
        ),
    ],
)
@pytest.mark.slow
def test_trains_under_every_architecture(kw):
    hist = _train(compressor=X.count_sketch(ratio=0.5), **kw)
    assert all(np.isfinite(h["loss"]) for h in hist) and hist[-1]["loss"] < hist[0]["loss"]


@pytest.mark.slow
def test_gossip_mixes_the_sketches_then_decodes_once():
    """The gossip step under a summable compressor: sum_j W_ij sketch_j decoded once (one key on
    every worker); naive compressed D-PSGD with gamma = 1 makes the model exactly that."""
    from cconv.comm import topology as T
    from cconv.engine import gossip as G

    c = X.count_sketch(ratio=0.5)
    mixing = T.get("complete", W)
    step = G.GossipStep("dpsgd", mixing, c, 1.0)
    rng = np.random.default_rng(1)
    xs = [jnp.asarray(rng.normal(size=(16,)), jnp.float32) for _ in range(W)]
    key = jax.random.PRNGKey(9)
    mesh = Mesh(np.array(jax.devices()[:W]), ("w",), axis_types=(jax.sharding.AxisType.Auto,))

    def f(x):
        new, _ = G.gossip(MeshComm("w", W), step, [x[0]], G.init(step, [x[0]]), key)
        return new[0][None]

    got = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("w"), out_specs=P("w")))(jnp.stack(xs))
    k = jax.random.split(key, 1)[0]
    once, each = _sketch_reference(c, xs, k)  # complete graph: W_ij = 1 / P
    for w in range(W):
        want = np.asarray(xs[w], np.float64) + once - _own(c, xs[w], k)  # x + (mixed - own)
        np.testing.assert_allclose(np.asarray(got[w]), want, rtol=1e-5, atol=1e-5)
    assert np.abs(once - each).max() > 1e-2


def _own(c, x, key):
    return np.asarray(c.decompress(c.compress(x, None, key)[0], x), np.float64)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kw",
    [
        dict(memory="ef"),
        dict(architecture="parameter-server"),
        dict(collective="sketch_topk"),
        dict(collective="sketch_topk", architecture="parameter-server"),
    ],
    ids=["all-reduce", "parameter-server", "sketch_topk", "sketch_topk-ps"],
)
def test_hlo_bytes_equal_logged_bytes(kw):
    check_hlo_bytes(dict(compressor=X.count_sketch(ratio=0.5), **kw))


@pytest.mark.slow
def test_gossip_hlo_bytes_equal_logged_bytes():
    cfg = EngineConfig(
        workers=W,
        sync="gossip",
        gossip="choco",
        compressor=X.count_sketch(ratio=0.5),
        gossip_gamma=0.5,
        topology="ring",
    )
    tr = build(loss_fn, make_params(), optax.sgd(0.1), cfg, model_state=make_model_state())
    state, _ = tr.step(tr.init(), make_batch(0), jax.random.PRNGKey(0))  # traces: metric sizes known
    text = tr.lower(state, make_batch(1), jax.random.PRNGKey(1)).compile().as_text()
    h_sent, h_recv = hlo.per_device_traffic(text, W)
    sent, recv = tr.traffic(1, control=True)
    np.testing.assert_allclose(h_sent, sent)
    np.testing.assert_allclose(h_recv, recv)
    payload = sum(X.count_sketch(ratio=0.5).wire_bytes(x.shape) - 8 for x in jax.tree.leaves(make_params()))
    assert np.all(h_sent > 2 * payload)  # two neighbours' sketches (keys travel too: 8 bytes each)


# ----------------------------------------------------------------------------- configs


def test_a_run_config_names_it_by_import_path():
    """``compressor: {name: "ext_countsketch:count_sketch", ratio: 0.5}`` in a YAML config: the
    registered entry (schema, algebra) is used, bad values are refused in one line."""
    from cconv.experiments import build as B
    from cconv.experiments import config as EC

    raw = {
        "model": {"name": "mlp", "hidden": [8]},
        "data": "digits",
        "workers": 2,
        "steps": 2,
        "compressor": {"name": "ext_countsketch:count_sketch", "ratio": 0.5},
        "collective": "sketch_topk",
    }
    cfg = EC.from_dict(raw)
    B.check_names(cfg)
    c = B.make_compressor(cfg.compressor)
    assert c.summable and c.hparams["rows"] == 3
    assert B.make_engine_config(cfg).collective == "sketch_topk"
    with pytest.raises(ValueError, match="ratio"):
        B.check_names(EC.from_dict({**raw, "compressor": {"name": "ext_countsketch:count_sketch"}}))
