"""``launcher="vmap"``: every worker on one device trains like ``shard_map`` on P devices.

For every registered compressor (its first test case; error feedback for the biased ones) x
architecture (all-to-all, parameter-server, and gTop-k where the entry lists it) at P = 2 and 8,
two steps of the tiny engine problem: the losses, parameters and every logged byte metric equal
``shard_map``'s, and so does the trace-time ledger (the list of ``Collective`` records each
launcher's step recorded; the HLO byte proof of tests/test_hlo_bytes.py does not apply to vmap,
whose program has no collectives: this is its proof).  Bytes are equal exactly; losses and
parameters within float rounding, not bit for bit: vmap turns the all-reduce into a reduction over
the worker axis (another summation order than the CPU all-reduce for P > 2) and batches the
per-worker matmuls, scatters and sorts, which XLA may compile with another accumulation order.
Measured over all 68 (case, P) pairs after 2 steps: 10 bit-identical (e.g. bf16 and signSGD at
P = 2, dense with a server at P = 8); the others differ by at most 2.4e-7 in the loss (1-2 float32
ulps) and 1.2e-7 in a parameter; even dense at P = 2 differs (6e-8), so the batched per-worker
gradient, not only the reduction, rounds differently.  CI runs a representative subset:
all-gather at P = 8 here, a parameter server's partial permutations in the seeds (P = 2) and drop-in (P = 3) tests,
P = 64; the rest (every entry x architecture x P, gTop-k's fold at P = 6 and in the drop-in test
at P = 3, a CLI run in a subprocess) is ``extended``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from engine_util import loss_fn, make_batch, make_model_state, make_params
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from runs_helpers import subprocess_env

from cconv import compressors as C
from cconv.comm.accounting import merge
from cconv.comm.backend import MeshComm, complete_permutation, vmapped_axis
from cconv.engine import EngineConfig, Exchange, as_optax, build
from cconv.engine.launchers import LAUNCHERS, Vmap

PARAMS, MSTATE = make_params(), make_model_state()
STEPS = 2
EXT = pytest.mark.extended


def _configs():
    """(id, EngineConfig kwargs) for every entry x architecture (x gTop-k), valid ones only."""
    out = []
    for e in C.entries():
        c = e.build(**e.example)
        base = dict(compressor=c, memory="none" if c.unbiased else "ef")
        variants = {"a2a": {}, "ps": dict(architecture="parameter-server")}
        if "gtopk" in e.collectives:
            variants["gtopk"] = dict(collective="gtopk")
        for arch, kw in variants.items():
            try:
                EngineConfig(workers=8, **base, **kw)
            except ValueError:  # e.g. an aggregation a parameter server cannot run
                continue
            out.append((f"{e.name}-{arch}", {**base, **kw}))
    return out


CONFIGS = dict(_configs())
# CI: one case per transport path (ids above); every other (case, P) is extended
CI = {("topk-a2a", 8)}  # a parameter server in CI: the seeds (P = 2) and drop-in (P = 3) tests
CASES = [
    pytest.param(name, p, id=f"{name}-P{p}", marks=() if (name, p) in CI else (pytest.mark.extended,))
    for name in CONFIGS
    for p in (2, 8)
] + [pytest.param("topk-gtopk", 6, id="topk-gtopk-P6", marks=pytest.mark.extended)]  # the fold


def _run(launcher: str, workers: int, kw: dict):
    """(losses, byte metrics per step, final worker-0 params, the step's traced ledger)."""
    t = build(loss_fn, PARAMS, optax.sgd(0.1, momentum=0.9), EngineConfig(workers, launcher=launcher, **kw), MSTATE)
    comms = []
    make = t.launcher.comm
    t.launcher.comm = lambda: comms.append(make()) or comms[-1]  # keep each trace's comm
    s, losses, nbytes = t.init(), [], []
    for i in range(STEPS):
        s, m = t.step(s, make_batch(i, n=8 * workers), jax.random.PRNGKey(i))
        losses.append(float(m["loss"]))
        nbytes.append({k: float(v) for k, v in m.items() if k.startswith(("bytes", "server_bytes"))})
    return losses, nbytes, jax.device_get(t.params(s)), merge(comms[0].ledger), t


@pytest.mark.slow
@pytest.mark.parametrize("name,workers", CASES)
def test_vmap_equals_shard_map(name, workers):
    lv, bv, pv, ledger_v, tv = _run("vmap", workers, CONFIGS[name])
    ls, bs, ps, ledger_s, ts = _run("shard_map", workers, CONFIGS[name])
    assert ledger_v == ledger_s  # the algorithm's bytes, recorded by the same calls
    assert bv == bs  # every logged byte metric, exactly
    assert tv.traffic(0, control=True)[0].tolist() == ts.traffic(0, control=True)[0].tolist()
    np.testing.assert_allclose(lv, ls, rtol=2e-6, atol=1e-7)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), pv, ps)


SYNC = {  # synchronization modes (cconv.engine.sync) under vmap: stale versions, arrivals, gossip
    "ssp": dict(
        sync="ssp", staleness=2, stragglers={"fraction": 0.25, "slowdown": 4}, compressor=C.topk(ratio=0.2), memory="ef"
    ),
    "asp": dict(sync="asp", architecture="parameter-server", compressor="qsgd"),
    "choco": dict(sync="gossip", gossip="choco", topology="ring", gossip_gamma=0.5, compressor=C.topk(ratio=0.2)),
    "dpsgd-exponential": dict(sync="gossip", topology="exponential"),
}


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(SYNC))
def test_sync_modes_under_vmap_equal_shard_map(mode):
    """SSP's version slots, ASP's arrival scan (its lax.cond becomes a select under vmap: the same
    result at P x the compute) and gossip's permutations run on one device like on P devices."""
    lv, bv, pv, ledger_v, _ = _run("vmap", 4, SYNC[mode])
    ls, bs, ps, ledger_s, _ = _run("shard_map", 4, SYNC[mode])
    assert ledger_v == ledger_s and bv == bs
    np.testing.assert_allclose(lv, ls, rtol=2e-6, atol=1e-7)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), pv, ps)


@pytest.mark.slow
def test_seeds_vmap_over_workers_vmap():
    """build(seeds=2): a vmap over seeds of the vmap over workers, as shard_map's seeds."""
    kw = dict(compressor=C.topk(ratio=0.25), memory="ef", architecture="parameter-server")
    p2 = jax.tree.map(lambda x: jnp.stack([x, 0.5 * x]), PARAMS)
    keys = jnp.stack([jax.random.key_data(jax.random.PRNGKey(i)) for i in (7, 8)])
    out = {}
    for launcher in ("vmap", "shard_map"):
        t = build(loss_fn, PARAMS, optax.sgd(0.1), EngineConfig(workers=2, launcher=launcher, **kw), MSTATE, seeds=2)
        s = t.init(params=p2)
        for i in range(STEPS):
            s, m = t.step(s, jax.tree.map(lambda x: jnp.stack([x, x[::-1]]), make_batch(i)), keys)
        out[launcher] = (np.asarray(m["loss"]), float(m["bytes_sent"][0]), jax.device_get(t.params(s)))
    (lv, bv, pv), (ls, bs, ps) = out["vmap"], out["shard_map"]
    assert lv.shape == (2,) and lv[0] != lv[1] and bv == bs
    np.testing.assert_allclose(lv, ls, rtol=2e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), pv, ps)


@pytest.mark.slow
def test_p64_on_one_device():
    """64 workers on one CPU device (the mesh launchers would need 64 devices), top-k + EF
    rounds of recursive doubling, 2 steps."""
    cfg = EngineConfig(workers=64, compressor=C.topk(ratio=0.2), memory="ef", launcher="vmap")
    t = build(loss_fn, PARAMS, optax.sgd(0.1), cfg, MSTATE, devices=jax.devices()[:1])
    s = t.init()
    assert jax.tree.leaves(s.params)[0].shape[0] == 64
    assert {d for x in jax.tree.leaves(s.params) for d in x.devices()} == {jax.devices()[0]}
    for i in range(STEPS):
        s, m = t.step(s, make_batch(i, n=128), jax.random.PRNGKey(i))
    assert np.isfinite(float(m["loss"]))
    assert float(m["bytes_sent"]) == t.traffic(1)[0][0] > 0  # 63 workers' payloads
    with pytest.raises(ValueError, match="only 8 devices"):  # the mesh launcher needs 64
        build(loss_fn, PARAMS, optax.sgd(0.1), EngineConfig(workers=64), MSTATE)


def test_registry_entry():
    assert LAUNCHERS["vmap"] is Vmap and Vmap.one_device and Vmap.supports_seeds
    assert not any(cls.one_device for n, cls in LAUNCHERS.items() if n != "vmap")


def test_complete_permutation():
    full, targets = complete_permutation([(5, 0), (4, 1)], 6)
    assert sorted(s for s, _ in full) == sorted(t for _, t in full) == list(range(6))
    assert (5, 0) in full and (4, 1) in full and targets == [0, 1]
    assert complete_permutation([(0, 3)], 4)[0] == [(0, 3), (1, 0), (2, 1), (3, 2)]


def test_vmapped_axis_is_detected_at_trace_time():
    """True under a vmap over the axis (also with seed vmaps inside or outside it), False
    under shard_map (also with a seed vmap inside)."""
    seen = []
    probe = lambda x: seen.append(vmapped_axis("w")) or x
    x = jnp.zeros((2, 4))
    jax.make_jaxpr(jax.vmap(probe, axis_name="w"))(x[0])
    jax.make_jaxpr(jax.vmap(jax.vmap(probe, axis_name="w"), axis_name="s"))(x)
    jax.make_jaxpr(jax.vmap(jax.vmap(probe, axis_name="s"), axis_name="w"))(x)
    mesh = Mesh(np.array(jax.devices()[:2]), ("w",))
    jax.make_jaxpr(jax.shard_map(probe, mesh=mesh, in_specs=P("w"), out_specs=P("w")))(x)
    jax.make_jaxpr(jax.shard_map(jax.vmap(probe), mesh=mesh, in_specs=P(None, "w"), out_specs=P(None, "w")))(x)
    assert seen == [True, True, True, False, False]


def test_partial_permutation_under_vmap_gives_zeros_off_target():
    """permute's contract under vmap: targets receive their source's value, others zeros."""
    comm = MeshComm("w", 5, vmapped=None)  # detected
    f = jax.vmap(lambda x: comm.permute(x, [(4, 0), (3, 1)]), axis_name="w")
    got = np.asarray(f(jnp.arange(1.0, 6.0)))
    assert got.tolist() == [5.0, 4.0, 0.0, 0.0, 0.0]


def _dropin_loop(map_kind: str, api: str, workers: int, ex_kw: dict, steps: int = STEPS):
    """A hand-written data-parallel loop around ``Exchange`` (api="exchange", then SGD by hand)
    or ``as_optax`` (api="optax", chained with optax.sgd): the README's drop-in API, mapped by the
    user's own ``jax.vmap`` or ``jax.shard_map`` over "w"."""
    ex = Exchange(**ex_kw, axis_name="w")
    opt = optax.chain(as_optax(**ex_kw, axis_name="w", seed=3), optax.sgd(0.1))
    grad = lambda p, b: jax.grad(lambda p: loss_fn(p, MSTATE, b, None)[0])(p)

    def init(params, batch):  # per worker: leaves of the state get a leading axis of size 1
        return ex.init(grad(params, batch)) if api == "exchange" else opt.init(params)

    def step(params, state, batch, key):
        g = grad(params, batch)
        if api == "exchange":
            avg, state, traffic = ex(g, state, key)
            return jax.tree.map(lambda p, a: p - 0.1 * a, params, avg), state, traffic
        upd, state = opt.update(g, state, params)
        return optax.apply_updates(params, upd), state, state[0].traffic

    if map_kind == "vmap":
        split = lambda b: jax.tree.map(lambda x: x.reshape(workers, -1, *x.shape[1:]), b)
        init_m = jax.jit(lambda p, b: jax.vmap(init, in_axes=(None, 0), axis_name="w")(p, split(b)))
        step_m = jax.jit(lambda p, s, b, k: jax.vmap(step, in_axes=(0, 0, 0, None), axis_name="w")(p, s, split(b), k))
    else:
        mesh = Mesh(np.array(jax.devices()[:workers]), ("w",))
        lead = lambda t: jax.tree.map(lambda x: x[None], t)
        first = lambda t: jax.tree.map(lambda x: x[0], t)
        step_m = jax.jit(
            jax.shard_map(
                lambda p, s, b, k: lead(step(first(p), first(s), b, k)),
                mesh=mesh,
                in_specs=(P("w"), P("w"), P("w"), P()),
                out_specs=P("w"),
                check_vma=False,
            )
        )
        spec = dict(mesh=mesh, in_specs=(P(), P("w")), out_specs=P("w"), check_vma=False)
        init_m = jax.jit(jax.shard_map(lambda p, b: lead(init(p, b)), **spec))
    params = jax.tree.map(lambda x: jnp.broadcast_to(x, (workers, *x.shape)), PARAMS)
    states = init_m(PARAMS, make_batch(0, n=8 * workers))
    for i in range(steps):
        params, states, traffic = step_m(params, states, make_batch(i, n=8 * workers), jax.random.PRNGKey(i))
    return jax.device_get((params, traffic))


@pytest.mark.slow
@pytest.mark.parametrize(
    "api,ex_kw,workers",
    [
        ("exchange", dict(compressor=C.topk(ratio=0.2), memory="ef", architecture="parameter-server"), 3),
        pytest.param("optax", dict(compressor=C.topk(ratio=0.2), memory="ef", collective="gtopk"), 3, marks=EXT),
    ],
    ids=["exchange-topk-ps-P3", "optax-gtopk-P3"],
)
def test_dropin_inside_a_users_vmap(api, ex_kw, workers):
    """Exchange / as_optax inside a hand-written ``jax.vmap(axis_name="w")`` loop equal the same
    loop under ``jax.shard_map`` (parameters, and the traffic they report); the partial
    permutations (server push / pull, gTop-k's fold at P = 3) are detected as vmapped."""
    pv, tv = _dropin_loop("vmap", api, workers, ex_kw)
    ps, ts = _dropin_loop("shard_map", api, workers, ex_kw)
    assert {k: np.asarray(v).tolist() for k, v in tv.items()} == {k: np.asarray(v).tolist() for k, v in ts.items()}
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), pv, ps)


# --------------------------------------------------------------------------- CLI


def test_cli_chooses_vmap_on_a_gpu_with_too_few_devices(monkeypatch, capsys):
    """On GPU/TPU, more workers than devices: launcher vmap, one line (once); on CPU the CLI
    keeps simulated devices unless ``launcher: vmap`` is set, and refuses too few of them."""
    from cconv import cli
    from cconv.experiments import build
    from cconv.experiments.config import ConfigError, from_dict

    big, explicit = from_dict({"workers": 64}), from_dict({"workers": 64, "launcher": "vmap"})
    assert build.launcher_for(big) == "shard_map" and build.launcher_for(explicit) == "vmap"  # CPU
    with pytest.raises(ConfigError, match="workers=64 but only 8 cpu device"):
        build.check_devices(64, "shard_map")
    build.check_devices(64, "vmap")
    assert cli.simulated_devices([big]) == 64 and cli.simulated_devices([explicit]) == 1
    assert cli.simulated_devices([explicit, from_dict({"workers": 4})]) == 4
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(jax, "device_count", lambda: 1)
    monkeypatch.setattr(build, "_ANNOUNCED", set())
    build.check_devices(64, "shard_map")  # no error: it will run on one device
    assert build.launcher_for(big) == "vmap" and build.launcher_for(big) == "vmap"
    assert build.launcher_for(from_dict({"workers": 1})) == "shard_map"
    out = capsys.readouterr().out.splitlines()
    assert out == ["cconv: workers=64 > 1 gpu device(s): launcher vmap (all workers on one device)"]


@pytest.mark.slow
@pytest.mark.extended
def test_cli_run_with_launcher_vmap_needs_no_simulated_devices(tmp_path):
    """``cconv run`` with ``launcher: vmap``: 16 workers in a process with one CPU device."""
    import os
    import subprocess
    import sys

    cfg = tmp_path / "v.yaml"
    cfg.write_text(
        "model: {name: linear}\nworkers: 16\nbatch_size: 64\nsteps: 4\nlog_every: 2\nlauncher: vmap\n"
        "compressor: {name: topk, ratio: 0.1}\nmemory: ef\n"
    )
    env = subprocess_env()
    env.update(JAX_PLATFORMS="cpu", CCONV_PROGRESS="0")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run(
        [sys.executable, "-m", "cconv", "run", str(cfg), "--out", str(tmp_path / "out")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0 and "completed" in r.stdout, r.stderr


def _two_steps(compiler_options, launcher="vmap"):
    engine_cfg = EngineConfig(workers=4, compressor=C.topk(ratio=0.25), memory="ef", launcher=launcher)
    tr = build(loss_fn, PARAMS, optax.sgd(0.1), engine_cfg, model_state=MSTATE, compiler_options=compiler_options)
    state = tr.init()
    for s in range(2):
        state, metrics = tr.step(state, make_batch(s), jax.random.key(s))
    return tr, state, metrics


@pytest.mark.slow
def test_compiler_options_reach_xla_and_build_the_same_computation():
    """``build(compiler_options=...)``: every program of the trainer is built with XLA's options
    (an option XLA does not know fails the first build, naming it: they reach the compiler), and an
    unoptimised build (what ``cconv advise`` uses for its probes on CPU) computes the same step up
    to float rounding."""
    fast_build = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
    _, ref, m_ref = _two_steps(None)
    tr, fast, m_fast = _two_steps(fast_build)
    assert tr.launcher.compiler_options == fast_build
    for a, b in zip(jax.tree.leaves(tr.params(ref)), jax.tree.leaves(tr.params(fast)), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(m_ref["loss"]), float(m_fast["loss"]), rtol=1e-5)
    with pytest.raises(Exception, match="xla_no_such_option"):
        _two_steps({"xla_no_such_option": 1})


def test_pmap_refuses_compiler_options_in_one_line():
    with pytest.raises(ValueError, match="compiler_options need a jitted launcher"):
        _two_steps({"xla_backend_optimization_level": 0}, launcher="pmap")
