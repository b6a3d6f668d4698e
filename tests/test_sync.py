"""Synchronization modes (cconv.engine.sync): SSP and ASP against the BSP anchor and plain NumPy
references of (stale-synchronous / delayed) SGD, the timing model's schedules against their
bounds (cconv.theory.staleness), bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from engine_util import loss_fn, make_model_state, make_params, run

from cconv import compressors as C
from cconv.engine import EngineConfig, build, worker_clock
from cconv.engine.sync import SYNC_MODES, public_names
from cconv.theory import staleness as TS

P4 = 4
ETA = 0.05
D = 5


def linear_loss(params, model_state, batch, key):
    r = batch["x"] @ params["w"] - batch["y"]
    return 0.5 * jnp.mean(r**2), (model_state, {})


def linear_batch(step, n=16):
    rng = np.random.default_rng(77 + step)
    x = rng.normal(size=(n, D)).astype(np.float32)
    return {"x": x, "y": (x @ np.arange(1.0, D + 1) + 0.1 * rng.normal(size=n)).astype(np.float32)}


def linear_grad(w, rows):
    x, y = rows["x"].astype(np.float64), rows["y"].astype(np.float64)
    return x.T @ (x @ w - y) / len(y)


def shard(batch, j, p):
    n = len(batch["y"]) // p
    return {k: v[j * n : (j + 1) * n] for k, v in batch.items()}


def linear_trainer(**kw):
    # w is one 1-D tensor: compressed only with compress_vectors=True (1-D tensors travel dense by default)
    cfg = EngineConfig(workers=P4, **{"compress_vectors": True, **kw})
    return build(linear_loss, {"w": jnp.zeros(D)}, optax.sgd(ETA), cfg)


def train_linear(trainer, steps):
    state, hist = trainer.init(), []
    for t in range(steps):
        state, m = trainer.step(state, linear_batch(t), jax.random.PRNGKey(t))
        hist.append({k: float(v) for k, v in m.items()})
    return np.asarray(trainer.params(state)["w"]), hist


STRAGGLY = dict(stragglers=(0.25, 3.0), jitter=0.5, timing_seed=3)


@pytest.mark.slow
def test_ssp_with_staleness_0_is_bsp_bit_for_bit():
    params, mstate, kw = make_params(), make_model_state(), dict(compressor=C.topk(ratio=0.2), memory="ef")

    def mk(**k):
        return build(loss_fn, params, optax.sgd(0.1, momentum=0.9), EngineConfig(workers=P4, **kw, **k), mstate)

    s_bsp, h_bsp = run(mk(), 3)
    s_ssp, h_ssp = run(mk(sync="ssp", staleness=0, **STRAGGLY), 3)
    a, b = (s_bsp.params, s_bsp.comp_state), (s_ssp.params, s_ssp.comp_state)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert [h["loss"] for h in h_bsp] == [h["loss"] for h in h_ssp]
    assert h_bsp[-1]["bytes_sent"] == h_ssp[-1]["bytes_sent"]
    assert all(h["staleness_max"] == 0 for h in h_ssp)


def test_ssp_replays_the_schedule_against_a_numpy_reference():
    steps, s = 6, 2
    cfg_kw = dict(sync="ssp", staleness=s, **STRAGGLY)
    tr = linear_trainer(**cfg_kw)
    w, hist = train_linear(tr, steps)
    sched = worker_clock.SSPSchedule(tr.engine_cfg, s)
    xs = [np.zeros(D)]
    for t in range(steps):
        v = sched.version(t)
        g = np.mean([linear_grad(xs[v[i]], shard(linear_batch(t), i, P4)) for i in range(P4)], axis=0)
        xs.append(xs[-1] - ETA * g)
    np.testing.assert_allclose(w, xs[-1], rtol=2e-5, atol=1e-6)
    stale = [t - sched.version(t) for t in range(steps)]
    assert max(x.max() for x in stale) > 0  # the stragglers make it stale for real
    assert [h["staleness_max"] for h in hist] == [float(x.max()) for x in stale]


def test_asp_replays_delayed_sgd_exactly():
    """x_{n+1} = x_n - eta g_n(x_{n - tau_n}), the delays from the event schedule (stragglers and
    jitter: some base versions are produced inside the logged step)."""
    steps = 5
    tr = linear_trainer(sync="asp", architecture="parameter-server", **STRAGGLY)
    w, hist = train_linear(tr, steps)
    w2, _ = train_linear(tr, steps)
    np.testing.assert_array_equal(w, w2)  # same schedule, same result
    sched = worker_clock.ASPSchedule(tr.engine_cfg, 2 * P4)
    xs = [np.zeros(D)]
    inside = False
    for t in range(steps):
        _, base = sched.arrivals(t, P4)
        inside |= bool((base > t * P4).any())
        for j in range(P4):
            xs.append(xs[-1] - ETA * linear_grad(xs[base[j]], shard(linear_batch(t), j, P4)))
    assert inside  # the sequential path was needed
    np.testing.assert_allclose(w, xs[-1], rtol=2e-5, atol=1e-6)
    n = np.arange(steps * P4)
    tau = n - np.asarray(sched.base[: steps * P4])
    assert [h["staleness_max"] for h in hist] == [float(tau[t * P4 : (t + 1) * P4].max()) for t in range(steps)]


def test_asp_error_feedback_memory_belongs_to_the_simulated_worker():
    """With stragglers a fast worker arrives twice in a logged step and a straggler not at all;
    each arrival uses its worker's memory: p = g + e_w, e_w <- p - topk(p), x <- x - eta topk(p)."""
    steps, k = 5, 2  # top-k 40 % of D = 5
    tr = linear_trainer(
        sync="asp", architecture="parameter-server", compressor=C.topk(ratio=0.4), memory="ef", **STRAGGLY
    )
    w, _ = train_linear(tr, steps)
    sched = worker_clock.ASPSchedule(tr.engine_cfg, 2 * P4)
    xs, e, repeats = [np.zeros(D)], np.zeros((P4, D)), False
    for t in range(steps):
        who, base = sched.arrivals(t, P4)
        repeats |= len(set(who.tolist())) < P4
        for j in range(P4):
            p = linear_grad(xs[base[j]], shard(linear_batch(t), j, P4)) + e[who[j]]
            q = np.zeros(D)
            top = np.argsort(-np.abs(p))[:k]
            q[top] = p[top]
            e[who[j]] = p - q
            xs.append(xs[-1] - ETA * q)
    assert repeats  # the memory of a slot and of a worker differ here
    np.testing.assert_allclose(w, xs[-1], rtol=2e-5, atol=1e-6)


def test_asp_equal_speeds_staleness_is_p_minus_1():
    tr = linear_trainer(sync="asp", architecture="parameter-server", compressor=C.topk(ratio=0.4), memory="ef")
    _, hist = train_linear(tr, 3)
    assert hist[0]["staleness_mean"] == (P4 - 1) / 2 and hist[0]["staleness_max"] == P4 - 1  # first round: i
    assert all(h["staleness_mean"] == h["staleness_max"] == P4 - 1 for h in hist[1:])
    assert hist[-1]["bytes_sent"] > 0 and hist[-1]["bytes_received"] > hist[-1]["bytes_sent"]  # push C(g), pull x


@pytest.mark.parametrize("p", [2, 5, 8])
def test_asp_schedule_equal_speeds_matches_the_derivation(p):
    cfg = EngineConfig(workers=1)
    object.__setattr__(cfg, "workers", p)  # the schedule only (no devices needed)
    sched = worker_clock.ASPSchedule(cfg, 10 * p)
    workers, base = sched.arrivals(6, p)
    assert list(workers) == list(range(p))
    sched.arrivals(0, p)
    tau = [n - sched.base[n] for n in range(7 * p)]
    assert tau == [TS.asp_equal_speed_staleness(p, n) for n in range(7 * p)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_schedules_never_exceed_the_staleness_bounds(seed):
    p = 8
    cfg = EngineConfig(workers=1, stragglers=(0.25, 4.0), jitter=0.4, timing_seed=seed)
    object.__setattr__(cfg, "workers", p)
    steps = 60
    for s in (0, 1, 3):
        sched = worker_clock.SSPSchedule(cfg, s)
        for t in range(steps):
            v = sched.version(t)
            assert (v <= t).all() and (t - v <= TS.ssp_bound(s)).all()
    d = np.stack([worker_clock.compute_times(cfg, k) for k in range(steps * p + 1)], axis=1)
    for cap in (3, 100):
        sched = worker_clock.ASPSchedule(cfg, cap)
        sched.arrivals(steps - 1, p)
        tau = np.arange(len(sched.base)) - np.asarray(sched.base)
        # compute times a worker used so far: its first ks[i] steps
        ks = np.bincount(sched.worker, minlength=p) + 1
        hi = np.array([d[i, : ks[i]].max() for i in range(p)])
        lo = np.array([d[i, : ks[i]].min() for i in range(p)])
        assert tau.max() <= TS.asp_bound(hi, lo, cap)
        assert tau.min() >= 0
    assert tau.max() > p - 1  # stragglers: fast workers' gradients lag more than P - 1


def test_timing_model_is_a_function_of_seed_config_and_step():
    cfg = EngineConfig(workers=P4, stragglers=(0.5, 4.0), jitter=0.2, timing_seed=5)
    assert (worker_clock.slowdowns(cfg) == 4.0).sum() == 2
    np.testing.assert_array_equal(worker_clock.compute_times(cfg, 17), worker_clock.compute_times(cfg, 17))
    assert not np.array_equal(worker_clock.compute_times(cfg, 17), worker_clock.compute_times(cfg, 18))
    fresh = worker_clock.SSPSchedule(cfg, 2)
    late = worker_clock.SSPSchedule(cfg, 2)
    late.version(30)
    np.testing.assert_array_equal(fresh.version(12), late.version(12))
    speeds = EngineConfig(workers=P4, worker_speeds=[1, 1, 2, 1])
    np.testing.assert_array_equal(worker_clock.slowdowns(speeds), [1, 1, 2, 1])


def test_span_bsp_waits_for_the_straggler_asp_does_not():
    kw = dict(workers=P4, stragglers=(0.25, 4.0))
    bsp = SYNC_MODES["bsp"]
    cfg_b = EngineConfig(**kw)
    assert bsp.span(cfg_b, 3) == 4.0 and bsp.span(EngineConfig(workers=P4), 3) == 1.0
    cfg_a = EngineConfig(sync="asp", architecture="parameter-server", **kw)
    total = sum(SYNC_MODES["asp"].span(cfg_a, t) for t in range(40))
    assert total < 0.5 * 4.0 * 40  # the fast workers keep the server busy
    cfg_s = EngineConfig(sync="ssp", staleness=3, **kw)
    ssp = sum(SYNC_MODES["ssp"].span(cfg_s, t) for t in range(40))
    assert 3.5 * 40 < ssp <= 4.0 * 40 + 1e-9  # a persistent straggler bounds SSP's clock rate


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(sync="ssp", staleness=-1), "staleness"),
        (dict(sync="gossipy"), "sync"),
        (dict(sync="ssp", staleness=1, local_steps=4), "local SGD"),
        (dict(sync="asp"), "parameter-server"),
        (dict(stragglers=(1.0, 4.0)), "fraction"),
        (dict(stragglers=(0.25, 0.5)), "slowdown"),
        (dict(stragglers={"fraction": 0.25, "speed": 2}), "unknown key"),
        (dict(jitter=-0.1), "jitter"),
        (dict(worker_speeds=[1, 2]), "worker_speeds"),
        (dict(worker_speeds=[1, 2, 0, 1]), r"EngineConfig.worker_speeds\[\] must be > 0.0, got 0"),
        (dict(sync="asp", architecture="parameter-server", max_staleness=0), "max_staleness"),
    ],
)
def test_bad_sync_config_is_a_one_line_value_error(kw, match):
    with pytest.raises(ValueError, match=match) as e:
        EngineConfig(workers=P4, **kw)
    assert "\n" not in str(e.value)


def test_registry_names():
    assert {"bsp", "ssp", "asp"} <= set(public_names()) and "local" not in public_names()


def test_adacomm_period_follows_the_loss_and_survives_a_host_state_round_trip():
    cfg = dict(local_steps="adaptive", local_steps_init=4, adapt_every=4)
    tr = linear_trainer(**cfg)
    state = tr.init()
    for t in range(16):
        state, _ = tr.step(state, linear_batch(t), jax.random.PRNGKey(t))
    kinds = "".join(tr.phase(t).kind[0] for t in range(16))
    assert kinds[:4] == "llls"  # H_0 = 4
    h = tr.host_state()
    assert h["h"] < 4 and len(h["history"]) > 1  # the loss fell: averaging got more frequent
    again = linear_trainer(**cfg)
    again.load_host_state(h)
    assert [again.phase(t) for t in range(16)] == [tr.phase(t) for t in range(16)]
    assert tr.sync.average_view(tr.engine_cfg)
    with pytest.raises(ValueError, match="post_local_switch"):
        EngineConfig(workers=P4, post_local_switch=2, **cfg)


@pytest.mark.parametrize("kw", [dict(sync="ssp", staleness=2), dict(sync="asp", architecture="parameter-server")])
def test_pmap_equals_shard_map(kw):
    a, ha = train_linear(linear_trainer(**kw, **STRAGGLY), 3)
    b, hb = train_linear(linear_trainer(launcher="pmap", **kw, **STRAGGLY), 3)
    np.testing.assert_allclose(a, b, rtol=1e-6)
    assert [h["staleness_mean"] for h in ha] == [h["staleness_mean"] for h in hb]


def test_seeds_axis_carries_the_schedule():
    kw = dict(sync="ssp", staleness=2, **STRAGGLY)
    one, two = (
        linear_trainer(**kw),
        build(linear_loss, {"w": jnp.zeros(D)}, optax.sgd(ETA), EngineConfig(workers=P4, **kw), seeds=2),
    )
    s1, s2 = one.init(), two.init()
    for t in range(3):
        b = linear_batch(t)
        s1, _ = one.step(s1, b, jax.random.PRNGKey(t))
        s2, m2 = two.step(s2, {k: np.stack([v, v]) for k, v in b.items()}, jnp.stack([jax.random.PRNGKey(t)] * 2))
    np.testing.assert_array_equal(np.asarray(two.params(s2)["w"])[1], np.asarray(one.params(s1)["w"]))
    assert m2["staleness_mean"].shape == (2,)


def test_simulated_clock_bsp_waits_for_the_straggler_asp_does_not_and_bytes_are_the_ps_ones():
    from types import SimpleNamespace

    from cconv.experiments.clock import SimClock

    run_cfg = SimpleNamespace(networks=lambda: ["10GbE"], workers=P4, schedule=None)
    calib = SimpleNamespace(compute_time=1.0, exchange_time=lambda phase: 0.0)
    kw = dict(architecture="parameter-server", compressor=C.topk(ratio=0.4), stragglers=(0.25, 4.0))
    bsp, asp = linear_trainer(**kw), linear_trainer(sync="asp", **kw)
    t_bsp = [SimClock(run_cfg, bsp, calib).step_times(t)[0] for t in range(8)]
    t_asp = [SimClock(run_cfg, asp, calib).step_times(t)[0] for t in range(8)]
    comm = t_bsp[0] - 4.0  # the same push + pull per logged step on both
    assert comm > 0 and t_bsp == pytest.approx([4.0 + comm] * 8)
    assert sum(t_asp) < 0.6 * sum(t_bsp)
    assert bsp.collectives(0) == asp.collectives(0)
    _, hb = train_linear(bsp, 1)
    _, ha = train_linear(asp, 1)
    for k in ("bytes_sent", "bytes_received", "server_bytes_sent", "server_bytes_received"):
        assert ha[0][k] == hb[0][k] > 0


def _first_cases():
    from cconv.compressors import entries

    return [pytest.param(e.name, dict(e.example), id=e.name) for e in entries()]


@pytest.mark.extended
@pytest.mark.slow
@pytest.mark.parametrize("mode", [dict(sync="ssp", staleness=1), dict(sync="asp", architecture="parameter-server")])
@pytest.mark.parametrize("name, hp", _first_cases())
def test_every_compressor_composes_with_ssp_and_asp(name, hp, mode):
    """Each registered compressor (its first case) trains 2 steps under SSP and ASP (the CI
    tier covers top-k + EF above); an aggregation a mode cannot do is a one-line ValueError."""
    try:
        cfg = EngineConfig(workers=P4, compressor=C.get(name, **hp), **mode, **STRAGGLY)
    except ValueError as e:
        assert "\n" not in str(e)
        pytest.skip(f"{name} under {mode['sync']}: {e}")
    tr = build(loss_fn, make_params(), optax.sgd(0.02), cfg, model_state=make_model_state())
    _, hist = run(tr, 2)
    assert all(np.isfinite(h["loss"]) for h in hist) and hist[-1]["bytes_sent"] > 0
