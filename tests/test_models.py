"""cconv.models: shapes, training reduces the loss, BatchNorm train/eval semantics, purity under
jit/grad/vmap, exact optima of the linear model on the synthetic problems, causality of the LM."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import cconv.data as D
import cconv.models as M

# Every test here builds and trains a model: not in the fast tier (-m 'not slow').
pytestmark = pytest.mark.slow
TINY = {
    "linear": {},
    "mlp": {"hidden": (32,)},
    "cnn": {"channels": (8, 16), "hidden": 32},
    "resnet8": {"width": 4},
    "transformer": {"d_model": 16, "layers": 1, "heads": 2},
}


@pytest.fixture(scope="module")
def digits():
    return D.load("digits")


@pytest.fixture(scope="module")
def text():
    return D.load("text", seq_len=16, max_bytes=20_000)


_SPECS = {}


def _spec(name, ds):
    """One tiny model per name for the whole module (builds and compiles are the cost here)."""
    if name not in _SPECS:
        _SPECS[name] = M.build(name, ds.input_shape, ds.num_classes, jax.random.key(0), **TINY[name])
    return _SPECS[name]


def _train(spec, task, batch, steps, lr):
    loss_fn = M.make_loss(spec, task)
    opt = optax.sgd(lr, momentum=0.9)

    @jax.jit
    def step(params, state, opt_state, key):
        (loss, (state, aux)), g = jax.value_and_grad(loss_fn, has_aux=True)(params, state, batch, key)
        updates, opt_state = opt.update(g, opt_state, params)
        return optax.apply_updates(params, updates), state, opt_state, loss, aux

    params, state, opt_state = spec.params, spec.model_state, opt.init(spec.params)
    losses = []
    for i in range(steps):
        params, state, opt_state, loss, aux = step(params, state, opt_state, jax.random.key(i))
        losses.append(float(loss))
    return params, state, losses, aux


def _string_keys(tree):
    return all(isinstance(k, str) and _string_keys(v) for k, v in tree.items()) if isinstance(tree, dict) else True


def test_registry_and_bad_input():
    assert M.names() == sorted(["linear", "logistic", "mlp", "cnn", "resnet", "resnet8", "resnet20", "transformer"])
    assert M.hparams_of("resnet8") == ["width", "bn_momentum"]
    assert M.hparams_of("mlp") == ["hidden", "dropout"]
    with pytest.raises(ValueError, match="unknown model 'vgg'; valid names: cnn, linear, logistic"):
        M.build("vgg", (8, 8, 1), 10, 0)
    with pytest.raises(ValueError, match="unknown hyper-parameter.*depth; valid: width, bn_momentum"):
        M.build("resnet8", (8, 8, 1), 10, 0, depth=20)
    with pytest.raises(ValueError, match=r"needs image inputs \(H, W, C\), got input_shape \(64,\)"):
        M.build("cnn", (64,), 10, 0)
    with pytest.raises(ValueError, match="depth must be 6n \\+ 2"):
        M.build("resnet", (8, 8, 1), 10, 0, depth=10)
    with pytest.raises(ValueError, match="heads dividing d_model"):
        M.build("transformer", (16,), 256, 0, d_model=10, heads=4)
    with pytest.raises(ValueError, match="num_classes must be a positive integer"):
        M.build("linear", (4,), 0, 0)
    spec = M.build("linear", (4,), 3, 0)
    with pytest.raises(ValueError, match="unknown task 'ranking'; valid: classification, regression"):
        M.make_loss(spec, "ranking")
    with pytest.raises(ValueError, match="do not match labels"):
        M.make_loss(spec, "classification")(
            spec.params, spec.model_state, {"x": jnp.ones((2, 4)), "y": jnp.zeros((2, 3), int)}
        )


@pytest.mark.parametrize("name", list(TINY))
def test_few_sgd_steps_reduce_the_loss(name, digits, text):
    ds = text if name == "transformer" else digits
    spec = _spec(name, ds)
    assert _string_keys(spec.params) and _string_keys(spec.model_state) and spec.num_params > 0
    batch = {k: jnp.asarray(v[:64]) for k, v in ds.train.items()}
    out = jax.eval_shape(lambda p, s, x: spec.apply(p, s, x, True), spec.params, spec.model_state, batch["x"])[0]
    expect = (64, 16, 256) if name == "transformer" else (64, 10)
    assert out.shape == expect and out.dtype == jnp.float32
    lr = {"transformer": 0.3, "cnn": 0.1}.get(name, 0.05)
    params, state, losses, aux = _train(spec, ds.task, batch, 12, lr)
    assert np.all(np.isfinite(losses)) and "accuracy" in aux
    assert losses[-1] < 0.7 * losses[0], losses
    eval_fn = M.make_eval(spec, ds.task)
    test = {k: v[:64] for k, v in ds.test.items()}
    ev = M.evaluate(eval_fn, params, state, test, batch_size=64)
    assert M.evaluate(eval_fn, params, state, test, batch_size=64) == ev  # deterministic
    assert 0 <= ev["accuracy"] <= 1 and np.isfinite(ev["loss"])
    if name == "transformer":
        assert ev["perplexity"] == pytest.approx(np.exp(ev["loss"]), rel=1e-6)


def test_batchnorm_train_and_eval_modes(digits):
    spec = _spec("resnet8", digits)
    state = spec.model_state
    assert set(state["stem_bn"]) == {"mean", "var"}  # running stats live here
    x = jnp.asarray(digits.train["x"][:16])
    apply = jax.jit(spec.apply, static_argnums=3)
    out_t, new_t = apply(spec.params, state, x, True)
    out_e, new_e = apply(spec.params, state, x, False)
    changed = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), state, new_t)
    assert all(jax.tree.leaves(changed))  # train: every stat moves
    # the update is mean <- m mean + (1 - m) batch_mean with m = 0.9 (stem layer: conv output)
    h = jax.lax.conv_general_dilated(
        x, spec.params["stem"]["kernel"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    np.testing.assert_allclose(new_t["stem_bn"]["mean"], 0.1 * h.mean(axis=(0, 1, 2)), rtol=1e-4, atol=1e-6)
    jax.tree.map(np.testing.assert_array_equal, new_e, state)  # eval: untouched
    # eval normalises with the running statistics: changing them changes the output ...
    shifted = jax.tree.map(lambda a: a, state)
    shifted["stem_bn"]["mean"] = state["stem_bn"]["mean"] + 1.0
    assert not np.allclose(apply(spec.params, shifted, x, False)[0], out_e)
    # ... train mode ignores them (batch statistics) ...
    np.testing.assert_allclose(apply(spec.params, shifted, x, True)[0], out_t, rtol=1e-6)
    # ... and in eval mode a sample's output does not depend on the rest of the batch
    other = x.at[4:].set(jnp.asarray(digits.train["x"][100:112]))
    np.testing.assert_allclose(apply(spec.params, state, other, False)[0][:4], out_e[:4], rtol=1e-5, atol=1e-5)
    assert not np.allclose(apply(spec.params, state, other, True)[0][:4], out_t[:4], atol=1e-3)


def test_loss_is_pure_under_vmap_over_seeds_and_grad(digits):
    init = M.initializer("mlp", (8, 8, 1), 10, hidden=(16,), dropout=0.2)
    keys = jax.random.split(jax.random.key(3), 3)
    params, states = jax.jit(jax.vmap(init))(keys)
    spec = M.build("mlp", (8, 8, 1), 10, keys[1], hidden=(16,), dropout=0.2)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a[1], b, rtol=1e-6), params, spec.params)
    loss_fn = M.make_loss(spec, "classification")
    batches = {k: jnp.asarray(v[:96]).reshape(3, 32, *v.shape[1:]) for k, v in digits.train.items()}
    dkeys = jax.random.split(jax.random.key(4), 3)
    grad = jax.value_and_grad(loss_fn, has_aux=True)
    (losses, (_, aux)), grads = jax.jit(jax.vmap(grad))(params, states, batches, dkeys)
    one = jax.jit(grad)
    for s in range(3):
        p_s = jax.tree.map(lambda a: a[s], params)
        (l_s, _), g_s = one(p_s, {}, jax.tree.map(lambda a: a[s], batches), dkeys[s])
        np.testing.assert_allclose(losses[s], l_s, rtol=1e-5)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a[s], b, rtol=1e-4, atol=1e-6), grads, g_s)
    assert len(set(np.round(np.asarray(losses), 5))) == 3 and aux["accuracy"].shape == (3,)
    # dropout: same key same loss, other key other loss, no key in training is an error
    p0, b0 = spec.params, jax.tree.map(lambda a: a[0], batches)
    l_a = one(p0, {}, b0, dkeys[0])[0][0]
    assert l_a == one(p0, {}, b0, dkeys[0])[0][0] != one(p0, {}, b0, dkeys[1])[0][0]
    with pytest.raises(ValueError, match="needs a PRNG key"):
        jax.eval_shape(loss_fn, p0, {}, b0, None)


def test_linear_model_attains_the_synthetic_optima():
    ls = D.load("least_squares", dim=6, train_size=256, test_size=32)
    spec = M.build("linear", ls.input_shape, 1, 0)
    params = {
        "dense": {
            "kernel": jnp.asarray(ls.info["w_star"], jnp.float32)[:, None],
            "bias": jnp.asarray([ls.info["b_star"]], jnp.float32),
        }
    }
    ev = M.evaluate(M.make_eval(spec, "regression"), params, {}, ls.train, batch_size=100)
    assert ev["loss"] == pytest.approx(ls.info["optimal_loss"], rel=1e-4)
    lg = D.load("logistic", dim=5, train_size=512, test_size=64)
    spec = M.build("logistic", lg.input_shape, 2, 0)
    w = np.stack([np.zeros(5), lg.info["w_opt"]], 1)
    params = {
        "dense": {"kernel": jnp.asarray(w, jnp.float32), "bias": jnp.asarray([0.0, lg.info["b_opt"]], jnp.float32)}
    }
    ev = M.evaluate(M.make_eval(spec, "classification"), params, {}, lg.train)
    assert ev["loss"] == pytest.approx(lg.info["optimal_data_loss"], rel=1e-4)
    assert ev["accuracy"] == pytest.approx(lg.info["optimal_train_accuracy"])
    # any other parameters are worse
    params["dense"]["bias"] = params["dense"]["bias"].at[1].add(0.1)
    assert M.evaluate(M.make_eval(spec, "classification"), params, {}, lg.train)["loss"] > ev["loss"]


def test_transformer_is_causal(text):
    spec = _spec("transformer", text)
    x = jnp.asarray(text.train["x"][:2])
    y = x.at[:, 9:].set((x[:, 9:] + 17) % 256)  # change the future only
    logits, _ = jax.jit(spec.apply, static_argnums=3)(spec.params, spec.model_state, jnp.concatenate([x, y]), False)
    np.testing.assert_allclose(logits[:2, :9], logits[2:, :9], rtol=1e-5, atol=1e-5)
    assert not np.allclose(logits[:2, 9:], logits[2:, 9:], atol=1e-3)
    # at initialisation the logits are ~ N(0, v) and independent of the target, so the next-token
    # cross-entropy E[logsumexp(z) - z_y] is log(256) + v/2 up to O(v^2 / 256)
    loss = M.objective("lm", logits[:2], jnp.asarray(text.train["y"][:2]))[0]
    v = float(jnp.var(logits[:2]))
    assert abs(float(loss) - (np.log(256) + v / 2)) < 0.15


INITIALISERS_EQUAL = """
import jax, numpy as np
from cconv.models import init
key = jax.random.key(5)
for ours, theirs, shape in [
    (init.he_normal, jax.nn.initializers.he_normal(), (3, 3, 4, 8)),
    (init.lecun_normal, jax.nn.initializers.lecun_normal(), (3, 3, 4, 8)),
    (init.normal(0.02), jax.nn.initializers.normal(0.02), (40, 8)),
]:
    np.testing.assert_array_equal(np.asarray(ours(key, shape)), np.asarray(theirs(key, shape)))
"""


def test_size_class_initialisers_equal_jax_initialisers():
    """Bit for bit, in a process built as a user's (the test session's fast build, conftest, may
    round the scaling differently in the two programs)."""
    import subprocess
    import sys

    from runs_helpers import cli_env

    env = cli_env(users_build=True)
    r = subprocess.run([sys.executable, "-c", INITIALISERS_EQUAL], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_input_dtype_and_abstract_spec_come_from_the_model():
    assert M.input_dtype("transformer") == "int32" and M.input_dtype("mlp") == "float32"
    spec = M.abstract("mlp", (8,), 3, hidden=[4])
    assert {tuple(x.shape) for x in jax.tree.leaves(spec.params)} == {(8, 4), (4,), (4, 3), (3,)}
