"""Flax NNX users' traps around the drop-in API (issue 35): a stale model after ``cconv.nnx_split``
fails loudly, an optimizer state replicated to every worker is refused (``check_specs`` and
``as_optax``), ``cconv.nnx_shard`` keeps the model live, ``cconv.traffic`` reads a step's bytes."""

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import AxisType, Mesh
from jax.sharding import PartitionSpec as P

import cconv
from cconv import compressors as C

W = 4


def mesh(workers=W):
    return Mesh(np.array(jax.devices()[:workers]), ("data",), axis_types=(AxisType.Auto,))


class Net(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(6, 8, rngs=rngs)
        self.bn = nnx.BatchNorm(8, rngs=rngs)
        self.l2 = nnx.Linear(8, 1, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.bn(self.l1(x))))[:, 0]


def model_and_optimizer(ratio=0.5):
    """The pair as a user builds it, outside any map (built in one program: eager init compiles op by op)."""

    def build():
        model = Net(nnx.Rngs(0))
        tx = optax.chain(cconv.as_optax(C.topk(ratio=ratio), memory="ef"), optax.adam(1e-2))
        return model, nnx.Optimizer(model, tx, wrt=nnx.Param)

    return nnx.jit(build)()


def batch(workers=W):
    x = jax.random.normal(jax.random.PRNGKey(1), (8 * workers, 6))
    return x, jnp.sin(x[:, 0])


def loss_fn(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


@pytest.mark.slow  # the fast tier keeps check_specs' refusal
def test_nnx_split_leaves_no_stale_model_to_evaluate():
    """Before: the original ``model`` kept its initial weights while the split state trained, and
    evaluating it measured them silently.  Now using it raises; ``nnx.update`` brings it back."""
    model, optimizer = model_and_optimizer()
    x, _ = batch()
    before = np.asarray(model(x))
    graphdef, state, specs = cconv.nnx_split(model, optimizer, mesh())
    for use in (lambda: model(x), lambda: nnx.jit(lambda m: m(x))(model), lambda: optimizer.update(model, None)):
        with pytest.raises(ValueError, match=r"moved into the state cconv.nnx_split returned.*nnx.merge"):
            use()
    model.eval()  # the tutorial's evaluation view: still the moved model
    with pytest.raises(ValueError, match="nnx.update"):
        model(x)
    trained, _ = nnx.merge(graphdef, state)  # the handle to use
    trained.train()
    model.train()
    forward = nnx.jit(lambda m: m(x))  # one program (eager layers on mesh-placed weights compile op by op)
    np.testing.assert_allclose(np.asarray(forward(trained)), before, rtol=1e-6, atol=1e-6)
    nnx.update((model, optimizer), state)  # the originals back, with the state's values
    np.testing.assert_allclose(np.asarray(forward(model)), before, rtol=1e-6, atol=1e-6)


def test_check_specs_refuses_an_nnx_optimizer_state_left_replicated():
    """``nnx.split((model, optimizer))`` without cconv's layout, and all-``P()`` specs: before, the
    check passed (cconv's state is a dict in NNX's State, not a CompressedState)."""
    model, optimizer = model_and_optimizer()
    _, state = nnx.split((model, optimizer))
    replicated = jax.tree.map(lambda _: P(), state)
    with pytest.raises(ValueError, match=r"created outside the map.*nnx_shard / cconv.nnx_split"):
        cconv.check_specs(state, replicated)
    _, laid_out, specs = cconv.nnx_split(*model_and_optimizer(), mesh())
    cconv.check_specs(laid_out, specs, workers=W)  # the derived specs pass
    with pytest.raises(ValueError, match=r"\['opt_state'\]\[0\]\['count'\].*needs spec P\('data'\)"):
        cconv.check_specs(laid_out, jax.tree.map(lambda _: P(), laid_out))
    with pytest.raises(ValueError, match="not one row per worker"):
        cconv.check_specs(laid_out, specs, workers=2 * W)


@pytest.mark.slow  # the fast tier keeps check_specs' refusal
def test_as_optax_refuses_an_nnx_state_that_reached_every_worker_as_made():
    """The optimizer's state has leaves (1, ...) when ``tx.init`` ran outside the map; given as
    ``P()`` every worker saw a well-shaped state and trained worker 0's residuals (no error)."""
    model, optimizer = model_and_optimizer()
    graphdef, state = nnx.split((model, optimizer))
    m = mesh()

    @jax.jit
    @partial(jax.shard_map, mesh=m, in_specs=(P(), P("data"), P("data")), out_specs=P(), check_vma=False)
    def step(state, x, y):
        model, optimizer = nnx.merge(graphdef, state)
        optimizer.update(model, nnx.grad(loss_fn)(model, x, y))
        return nnx.state((model, optimizer))

    with pytest.raises(ValueError, match=r"created outside the map \(tx.init, nnx.Optimizer\)"):
        step(state, *batch())


@pytest.mark.slow  # the fast tier keeps check_specs' refusal
def test_nnx_shard_trains_the_model_in_place_and_traffic_reads_its_bytes():
    """``nnx_shard`` lays the pair out in place: ``nnx.jit`` + ``nnx.shard_map`` train ``model``
    itself (no stale copy); ``cconv.traffic`` gives the payload and the bytes the all-gather moved:
    (P - 1) x the payload, the compressor's wire bytes over the model's parameters."""
    model, optimizer = model_and_optimizer(ratio=0.25)
    m = mesh()
    specs = cconv.nnx_shard(model, optimizer, m)

    @nnx.jit
    @nnx.shard_map(
        mesh=m, in_specs=(specs.model, specs.optimizer, P("data"), P("data")), out_specs=P(), check_vma=False
    )
    def step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        optimizer.update(model, grads)
        return jax.lax.pmean(loss, "data")

    x, y = batch()
    kernel = np.asarray(model.l1.kernel[...])
    losses = [float(step(model, optimizer, x, y)) for _ in range(3)]
    assert not np.array_equal(np.asarray(model.l1.kernel[...]), kernel) and losses[-1] < losses[0]
    count = jax.tree.leaves(optimizer.opt_state[0].count)[0]
    assert count.shape == (W,) and (np.asarray(count) == 3).all()  # one row per worker, each stepped
    tr = cconv.traffic(optimizer)
    shapes = [p.shape for p in jax.tree.leaves(nnx.state(model, nnx.Param))]
    wire = sum(C.topk(ratio=0.25).wire_bytes(s) for s in shapes if len(s) > 1)
    dense = sum(4 * math.prod(s) for s in shapes if len(s) <= 1)  # biases, norm scales: dense by default
    assert tr.workers == W and tr.payload == wire + dense and wire > 0 and dense > 0
    assert tr.sent == tr.received == (W - 1) * wire + 2 * (W - 1) / W * dense  # all-gather + all-reduce rings
    assert cconv.traffic((model, optimizer)) == tr == cconv.traffic(nnx.state(optimizer))


@pytest.mark.slow  # the fast tier keeps check_specs' refusal
def test_traffic_of_an_optax_state_over_eight_workers_is_seven_payloads():
    """docs/dropin.md: the bytes moved are 7x the payload for an all-gather over 8 workers (top-k's),
    2 (P - 1) / P x for an all-reduce ring (the bias's, dense by default)."""
    m = mesh(8)
    tx = optax.chain(cconv.as_optax(C.topk(ratio=0.1), memory="ef"), optax.sgd(0.1))
    params = {"w": jnp.ones((32, 4)), "b": jnp.ones((4,))}
    opt_state, specs = cconv.init_state(tx, params, m)

    @jax.jit
    @partial(jax.shard_map, mesh=m, in_specs=(P(), specs, P("data")), out_specs=specs, check_vma=False)
    def step(params, opt_state, x):
        grads = jax.grad(lambda p: jnp.mean((x @ p["w"] + p["b"]) ** 2))(params)
        return tx.update(grads, opt_state, params)[1]

    tr = cconv.traffic(step(params, opt_state, jax.random.normal(jax.random.PRNGKey(0), (64, 32))))
    wire, dense = C.topk(ratio=0.1).wire_bytes((32, 4)), 4 * 4  # the bias travels dense (by default)
    assert (tr.workers, tr.payload, tr.sent) == (8, wire + dense, 7 * wire + 2 * 7 / 8 * dense)
    with pytest.raises(ValueError, match="found 0 cconv.as_optax states"):
        cconv.traffic(optax.sgd(0.1).init(params))


@pytest.mark.slow  # the eager forward and backward passes before the exchange compile op by op
def test_an_eager_shard_map_step_is_a_one_line_error_not_a_collective_abort():
    """A step mapped by ``nnx.shard_map`` but not jitted ran op by op: one collective program per
    operation on every device (about 4 minutes for the first step of the MNIST recipe at 8 workers on
    this loaded 2-core machine, and XLA:CPU aborts when dozens are in flight).  The exchange refuses
    it before its first collective."""
    model, optimizer = model_and_optimizer()
    m = mesh()
    specs = cconv.nnx_shard(model, optimizer, m)

    @nnx.shard_map(
        mesh=m, in_specs=(specs.model, specs.optimizer, P("data"), P("data")), out_specs=P(), check_vma=False
    )
    def step(model, optimizer, x, y):  # no nnx.jit around it
        optimizer.update(model, nnx.grad(loss_fn)(model, x, y))
        return jnp.zeros(())

    with pytest.raises(ValueError, match=r"outside jax.jit / nnx.jit.*jit the step"):
        step(model, optimizer, *batch())
