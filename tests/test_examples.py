"""The drop-in recipes in examples/ (plain optax, Flax Linen, Flax NNX) train on 2 simulated devices,
move exactly the bytes their compressor's payloads have, keep cconv's state per worker, and keep
BatchNorm statistics equal on every worker (or warn when they are left to drift)."""

import math
import os
import socket
import subprocess
import sys
import warnings

import jax
import numpy as np
import pytest

import cconv
from cconv.engine.ddp import ModelStateDivergenceWarning

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # examples/ is not installed: import it from the checkout
from examples import flax_linen, flax_nnx, flax_nnx_mnist, optax_plain  # noqa: E402

W, STEPS = 2, 48
quiet = lambda *a: None


def expected_traffic(params, compressor, workers=W):
    """(payload, sent) per worker: the matrices' payloads in a ring all-gather, (P - 1) payloads sent;
    the 1-D tensors (biases, norm scales: dense by default) in a ring all-reduce, 2 (P - 1) / P of
    their float32 bytes."""
    shapes = [np.shape(p) for p in jax.tree.leaves(params)]
    wire = sum(compressor.wire_bytes(s) for s in shapes if len(s) > 1)
    dense = sum(4 * math.prod(s) for s in shapes if len(s) <= 1)
    return wire + dense, (workers - 1) * wire + 2 * (workers - 1) / workers * dense


def expected_sent(params, compressor, workers=W):
    return expected_traffic(params, compressor, workers)[1]


def rows_differ(x) -> bool:
    x = np.asarray(jax.device_get(x))
    return x.shape[0] == W and not np.array_equal(x[0], x[1])


def per_worker(residuals) -> bool:
    """Every residual that is not identically zero (tensors sent whole have none) differs between
    the two workers: each worker kept its own, none was overwritten by worker 0's."""
    live = [r for r in residuals if np.abs(np.asarray(jax.device_get(r))).sum() > 0]
    return bool(live) and all(rows_differ(r) for r in live)


def residual_rows(tree):
    return [x for p, x in jax.tree_util.tree_leaves_with_path(tree) if "residual" in jax.tree_util.keystr(p)]


@pytest.mark.slow  # compiles and trains the recipe (seconds of CPU); the fast tier checks the drop-in's
# bytes and per-worker state in test_dropin.py (test_the_compiled_dropin_moves_what_traffic_says,
# test_state_specs_put_cconvs_state_per_worker_and_the_rest_replicated)
def test_optax_recipe_trains_moves_the_payload_bytes_and_keeps_residuals_per_worker():
    c = cconv.compressors.topk(ratio=0.01)
    out = optax_plain.main(steps=STEPS, workers=W, compressor=c, log=quiet)
    assert np.isfinite(out["losses"]).all() and out["losses"][-1] < 0.7 * out["losses"][0]
    assert out["bytes_sent"] == expected_sent(out["params"], c)
    res = residual_rows(out["opt_state"][0].exchange)
    assert per_worker(res)  # one residual per worker, not worker 0's copied


@pytest.mark.slow
def test_linen_recipe_trains_with_batchnorm_dropout_and_per_worker_residuals():
    c = cconv.compressors.topk(ratio=0.05)
    out = flax_linen.main(steps=STEPS, workers=W, compressor=c, log=quiet)
    assert np.isfinite(out["losses"]).all() and out["losses"][-1] < out["losses"][0]
    assert out["bytes_sent"] == expected_sent(out["params"], c)
    assert per_worker(residual_rows(out["opt_state"][0].exchange))
    mean = np.asarray(out["batch_stats"]["BatchNorm_0"]["mean"])
    assert mean.shape == (64,) and np.abs(mean).sum() > 0  # the running mean moved


@pytest.mark.slow  # compiles the recipe (seconds of CPU); the fast tier checks the warning itself in
# test_dropin.py (test_sync_model_state_averages_and_check_mode_warns_once)
def test_linen_recipe_warns_once_when_batch_statistics_drift_apart():
    cconv.engine.ddp._WARNED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flax_linen.main(steps=2, workers=W, stats="check", log=quiet)
        jax.effects_barrier()
    divergence_warnings = [w for w in caught if issubclass(w.category, ModelStateDivergenceWarning)]
    assert len(divergence_warnings) == 1 and "BatchNorm" in str(divergence_warnings[0].message)


@pytest.mark.slow
def test_linen_recipe_with_synchronized_batchnorm_does_not_drift():
    cconv.engine.ddp._WARNED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flax_linen.main(steps=2, workers=W, sync_bn=True, stats="check", log=quiet)
        jax.effects_barrier()
    drift = [w for w in caught if issubclass(w.category, ModelStateDivergenceWarning)]
    assert not drift, [str(w.message) for w in drift]


@pytest.mark.slow
def test_nnx_recipe_trains_with_an_optimizer_created_outside_the_map():
    c = cconv.compressors.topk(ratio=0.05)
    out = flax_nnx.main(steps=STEPS, workers=W, compressor=c, log=quiet)
    assert np.isfinite(out["losses"]).all() and out["losses"][-1] < out["losses"][0]
    params = jax.tree.leaves(out["state"][0])  # the model: Params and BatchStats
    n_params = sum(math.prod(np.shape(p)) for p in params)
    assert n_params > 0
    from flax import nnx

    model_params = nnx.state(out["model"], nnx.Param)
    assert out["bytes_sent"] == expected_sent(model_params, c)
    opt = out["state"][1]["opt_state"][0]
    res = [v.get_value() for v in jax.tree.leaves(opt["exchange"], is_leaf=lambda x: hasattr(x, "get_value"))]
    assert per_worker(res)


@pytest.mark.slow
def test_nnx_mnist_tutorial_recipe_trains_in_place_with_metrics_dropout_and_batchnorm():
    """Flax's NNX MNIST tutorial structure (nnx.Rngs, nnx.MultiMetric, BatchNorm, dropout,
    nnx.Optimizer, nnx.jit steps) made data-parallel by cconv.nnx_shard + nnx.shard_map, on digits:
    the model trained is the one evaluated, the metrics cover the whole batch, the bytes are the
    payload's, BatchNorm's running statistics moved and agree on every worker."""
    c = cconv.compressors.topk(ratio=0.05)
    out = flax_nnx_mnist.main(train_steps=60, eval_every=30, batch_size=64, workers=W, compressor=c, log=quiet)
    h = out["history"]
    assert len(h["train_loss"]) == len(h["test_accuracy"]) == 2 and np.isfinite(h["train_loss"]).all()
    assert h["train_loss"][-1] < h["train_loss"][0] < np.log(10) + 0.5  # learning from the first window
    assert h["test_accuracy"][-1] > 0.5  # 10 classes: chance is 0.1
    from flax import nnx

    model, tr = out["model"], out["traffic"]
    params = nnx.state(model, nnx.Param)
    assert tr.workers == W and (tr.payload, tr.sent) == expected_traffic(params, c)
    mean = model.batch_norm1.mean.get_value()
    assert np.abs(np.asarray(mean)).sum() > 0 and mean.sharding.is_fully_replicated
    residuals = [
        v.get_value()
        for v in jax.tree.leaves(out["optimizer"].opt_state[0].exchange, is_leaf=lambda x: isinstance(x, nnx.Variable))
    ]
    assert per_worker(residuals)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_optax_recipe_two_process_launch_of_its_docs_page():
    """The console commands of docs/dropin.md: two processes (jax.distributed, gloo), one simulated
    device each; both finish and report the same losses (one program over both processes)."""
    root = ROOT
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(XLA_FLAGS="--xla_force_host_platform_device_count=1", PYTHONPATH=root, JAX_PLATFORMS="cpu")
    env.update(CCONV_COORDINATOR=f"127.0.0.1:{port}", CCONV_NUM_PROCESSES="2")
    procs = [
        subprocess.Popen(
            [sys.executable, "examples/optax_plain.py"],
            cwd=root,
            env={**env, "CCONV_PROCESS_ID": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=540)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    losses = [[line for line in out.splitlines() if line.startswith("step ")] for out in outs]
    assert len(losses[0]) == 13 and losses[0] == losses[1]  # steps 15, 31, ..., 191 and 199
    assert "over 2 workers" in outs[0]
