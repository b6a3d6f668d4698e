"""0/1 Adam from the run config (``cconv.engine.zero_one_mode``, Lu et al., ICLR 2023): the
mode's phases are the paper's policies T_v and T_u; the engine's steps are the drop-in's
(``cconv.engine.zero_one_adam``) step for step, with the variance frozen after the warm-up, the
momentum's 1-bit payloads under error feedback and no bytes on the skipped syncs; refusals;
``cconv run`` end to end."""

import contextlib
import io
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cconv import cli
from cconv.compressors.packing import packed_size
from cconv.engine import EngineConfig, build, zero_one_adam
from cconv.engine.zero_one_adam import sync_steps, variance_steps
from cconv.engine.zero_one_mode import Schedule, ZeroOneHost, zero_one_adam_engine

P, D, N = 4, 12, 20
KNOBS = dict(var_freeze_step=9, var_update_scaler=2, local_step_scaler=3, local_step_clipper=4)


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    A = jnp.asarray(rng.standard_normal((P, N, D)) / math.sqrt(N), jnp.float32)
    b = jnp.asarray(rng.standard_normal((P, N)), jnp.float32)
    return A, b


def _kinds(freeze, kappa, scaler, clip, steps):
    """The kind of each step k = 1..steps, from the drop-in's policy functions."""
    tv, tu = set(variance_steps(freeze, kappa)), sync_steps(freeze, scaler, clip, steps)
    out = []
    for k in range(1, steps + 1):
        if k <= freeze + 1:
            out.append("dense" if k in tv else "one_bit")
        else:
            out.append(("first_sync" if k == tu[0] else "sync") if k in tu else "local")
    return out


@pytest.mark.parametrize("knobs", [(9, 2, 3, 4), (2, 1, 2, 2), (0, 16, 32_678, 16), (30, 4, 5, 8)])
def test_phases_are_the_papers_policies(knobs):
    """The host's kind of each step: dense on T_v, 1 bit before the freeze otherwise; after it a
    1-bit sync on T_u (the first one restarts the error feedback), local steps between."""
    host = ZeroOneHost(Schedule(*knobs))
    steps = knobs[0] + 60
    assert [host.phase(t).kind for t in range(steps)] == _kinds(*knobs, steps)
    assert host.phase(3).density is None


def _ls_loss(params, model_state, batch, key):
    return 0.5 * jnp.sum((batch["a"] @ params["w"] - batch["b"]) ** 2), (model_state, {})


def _dropin(A, b, steps, **knobs):
    """The drop-in's per-worker parameters (P, D) after each step (vmapped workers)."""
    tx = zero_one_adam(0.01, axis_name="data", **knobs)
    loss = lambda w, a, bb: 0.5 * jnp.sum((a @ w - bb) ** 2)
    W, state = jnp.zeros((P, D)), jax.vmap(lambda a: tx.init(jnp.zeros(D)), axis_name="data")(A)
    step = jax.jit(
        lambda W, st: jax.vmap(lambda w, a, bb, s: tx.update(jax.grad(loss)(w, a, bb), s), axis_name="data")(
            W, A, b, st
        )
    )
    out = []
    for _ in range(steps):
        u, state = step(W, state)
        W = W + u
        out.append(np.asarray(W))
    return out


@pytest.mark.slow  # five compiled engine phases and the drop-in's program (~15 s)
def test_engine_steps_equal_the_dropin_variance_frozen_bytes_per_kind():
    """``build(..., zero_one_adam_engine, EngineConfig(**tx.engine))``: every worker's parameters
    follow the drop-in's step for step (dense and 1-bit gradient steps, local steps, 1-bit syncs
    of the accumulated update); v changes exactly on T_v and never after the freeze; the logged
    bytes are a dense all-reduce on T_v, 1 bit per coordinate + a float32 scale from each of the
    P - 1 others on the other steps before the freeze and on T_u, and 0 on the skipped syncs."""
    A, b = _problem()
    steps = 30
    tx = zero_one_adam_engine(0.01, **KNOBS)
    trainer = build(_ls_loss, {"w": jnp.zeros(D)}, tx, EngineConfig(workers=P, **tx.engine))
    state, batch = trainer.init(), {"a": A.reshape(P * N, D), "b": b.reshape(-1)}
    ref = _dropin(A, b, steps, **KNOBS)
    nu, sent = [np.zeros((P, D))], []
    for t in range(steps):
        state, m = trainer.step(state, batch, jax.random.PRNGKey(t))
        np.testing.assert_allclose(np.asarray(state.params["w"]), ref[t], rtol=2e-4, atol=2e-6, err_msg=f"step {t}")
        nu.append(np.asarray(state.opt_state.nu["w"]))
        sent.append(float(m["bytes_sent"]))
    changed = [k for k in range(1, steps + 1) if not np.array_equal(nu[k], nu[k - 1])]
    assert changed == variance_steps(KNOBS["var_freeze_step"], KNOBS["var_update_scaler"]) == [1, 2, 4, 6, 8]
    dense, one_bit = 2 * (P - 1) / P * 4 * D, (P - 1) * (packed_size(D, 1) + 4)
    per_kind = {"dense": dense, "one_bit": one_bit, "sync": one_bit, "first_sync": one_bit, "local": 0.0}
    kinds = _kinds(*KNOBS.values(), steps)
    assert sent == [pytest.approx(per_kind[k]) for k in kinds]
    assert kinds.count("local") == 12 and not np.allclose(ref[-1][0], ref[-1][1])  # local steps: workers differ
    avg = np.asarray(trainer.params(state)["w"])
    np.testing.assert_allclose(avg, ref[-1].mean(0), rtol=1e-4, atol=1e-6)  # the evaluated model: the average


BASE = "model: {name: mlp, hidden: [8]}\ndata: digits\nworkers: 2\nbatch_size: 16\nsteps: 2\nlr: 0.01\nlog_every: 1\n"
OPT = "optimizer: {name: zero_one_adam, var_freeze_step: 1}\n"


@pytest.mark.parametrize(
    "extra,says",
    [
        ("optimizer: {name: zero_one_adam, b1: 1.5}\n", "b1 must be in [0, 1)"),
        ("optimizer: {name: zero_one_adam, local_step_clipper: 0}\n", "local_step_clipper must be an integer >= 1"),
        (OPT + "sync: ssp\n", "sets the engine's sync itself"),
        (OPT + "memory: ef21\n", "sets the engine's memory itself"),
        (OPT + "local_steps: 4\n", "decides its own local steps"),
        (OPT + "warmup: {dense_steps: 2}\n", "no warmup"),
        ("sync: zero_one\n", "needs the optimizer zero_one_adam"),  # only its optimizer sets it
        ("sync: zero_one\noptimizer: {name: onebit_adam}\n", "zero_one_adam"),  # its warm-up is refused first
    ],
)
def test_bad_configs_are_one_line_exit_2_before_anything_is_written(extra, says, tmp_path):
    (tmp_path / "c.yaml").write_text(BASE + extra)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(["run", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run")])
    err = err.getvalue().strip()
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("cconv: error: ") and says in err, err
    assert os.listdir(tmp_path) == ["c.yaml"]


def test_a_config_may_name_the_sync_mode_its_optimizer_sets():
    import yaml

    from cconv.experiments import build
    from cconv.experiments.config import from_dict

    build.check_names(from_dict(yaml.safe_load(BASE + OPT + "sync: zero_one\n"), source="test"))  # accepted
    with pytest.raises(build.ConfigError, match="sets the engine's sync itself"):
        build.check_names(from_dict(yaml.safe_load(BASE + OPT + "sync: ssp\n"), source="test"))


@pytest.mark.slow  # a real cconv process (~20 s)
def test_cconv_run_with_zero_one_adam_logs_each_kind_of_step(tmp_path):
    """``cconv run`` with ``optimizer: {name: zero_one_adam, ...}``: the logged bytes per step are
    the dense all-reduce of the MLP's gradient on T_v, its 1-bit payloads on the other steps before
    the freeze and on T_u, nothing on the local steps; the report names the method 0/1 Adam."""
    from runs_helpers import run_cconv, write_tiny

    from cconv.experiments import report

    knobs = {"var_freeze_step": 2, "var_update_scaler": 1, "local_step_scaler": 2, "local_step_clipper": 2}
    cfg = write_tiny(
        tmp_path / "c.yaml",
        compressor="none",
        memory="none",
        optimizer={"name": "zero_one_adam", "eps": 0.001, **knobs},
        lr=0.01,
        steps=8,
        log_every=1,
    )
    r = run_cconv("run", cfg, "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    sizes = [64 * 8, 8, 8 * 10, 10]  # digits 8x8 -> 8 -> 10 classes: weights and biases
    dense = 2 * (2 - 1) / 2 * 4 * sum(sizes)
    one_bit = (2 - 1) * sum(packed_size(n, 1) + 4 for n in sizes)  # every tensor, biases too (as DeepSpeed)
    kinds = _kinds(*knobs.values(), 8)
    assert kinds == ["dense", "dense", "one_bit", "first_sync", "sync", "sync", "local", "sync"]
    want = {"dense": dense, "one_bit": one_bit, "first_sync": one_bit, "sync": one_bit, "local": 0}
    assert [r["bytes_sent"] for r in rows] == [want[k] for k in kinds]
    assert all(math.isfinite(r["loss"]) for r in rows)
    runs = report.load_runs([str(tmp_path / "run")])
    assert (runs["compressor"].iloc[0], runs["memory"].iloc[0]) == ("0/1 Adam", "ef")


@pytest.mark.extended  # three real cconv processes (~60 s on the shared machine)
def test_sigkill_and_resume_is_bit_identical(tmp_path):
    """A 0/1 Adam run SIGKILLed right after its checkpoint of step 6, between two syncs (its
    optimizer state holds m, v, the accumulated u and L per worker; its phases are recomputed from
    the step), then the same command, gives the uninterrupted run's metric lines bit for bit."""
    from test_sync_cli import KILL_AFTER_CHECKPOINT_8, cconv

    from cconv.experiments import io as cio

    kinds = _kinds(2, 2, 1, 4, 12)
    assert kinds[4:8] == ["local", "local", "local", "sync"]  # the checkpoint of step 6 holds u != 0
    spec = tmp_path / "run.yaml"
    knobs = "var_freeze_step: 2, var_update_scaler: 2, local_step_scaler: 1, local_step_clipper: 4, eps: 0.001"
    spec.write_text(
        "model: {name: mlp, hidden: [8]}\ndata: digits\nworkers: 4\nbatch_size: 32\nsteps: 12\nlr: 0.01\n"
        f"optimizer: {{name: zero_one_adam, {knobs}}}\nlog_every: 3\ncheckpoint_every: 3\n"
    )
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    r = cconv("run", str(spec), "--out", str(ref))
    assert r.returncode == 0, r.stderr
    k = cconv("run", str(spec), "--out", str(killed), code=KILL_AFTER_CHECKPOINT_8.replace("step == 8", "step == 6"))
    assert k.returncode == -9, k.stderr
    assert [line["step"] for line in cio.read_jsonl(str(killed / cio.METRICS))] == [3, 6]
    again = cconv("run", str(spec), "--out", str(killed))
    assert again.returncode == 0, again.stderr
    want, got = cio.read_jsonl(str(ref / cio.METRICS)), cio.read_jsonl(str(killed / cio.METRICS))
    assert [line["step"] for line in got] == [3, 6, 9, 12]
    keep = lambda line: {k: v for k, v in line.items() if k != "wall_time" and not k.startswith("sim_")}
    assert [keep(a) for a in want] == [keep(b) for b in got]
