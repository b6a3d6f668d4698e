"""0/1 Adam (Lu, Li, Zhang, De Sa & He, ICLR 2023, "Maximizing Communication Efficiency for
Large-scale Training via 0/1 Adam"; DeepSpeed's ``ZeroOneAdam``) as an
``optax.GradientTransformation`` that does its own communication, for use inside a shard_map /
pmap / vmap over ``axis_name`` (the drop-in API's setting, like ``cconv.engine.onebit_adam``).

Where 1-bit Adam needs a full-precision warm-up of fixed length, 0/1 Adam updates the variance
ever more rarely (adaptive variance freezing) and, once it is frozen, replaces communication by
local steps whose accumulated update travels as 1 bit (1-bit sync).  Steps are counted k = 1, 2,
... (DeepSpeed's ``state['step']``); C is the 1-bit compressor with error feedback (default: sign
with one scale per tensor), averaged over the P workers; no bias correction (as DeepSpeed).

Variance update policy (T_v): while k <= ``var_freeze_step`` + 1 (DeepSpeed freezes after the
step that passes ``var_freeze_step``), the variance is updated at the steps k with k mod I_v = 0,
where the interval I_v starts at 1 and doubles after every ``kappa`` (``var_update_scaler``)
updates: T_v = {1..kappa} U {kappa + 2, kappa + 4, ..} U ...  At those
steps the gradients travel in full precision, g = 1/P sum_i g_i:

    v <- b2 v + (1 - b2) g^2,   m <- b1 m + (1 - b1) g

and at the other steps before the freeze the gradients travel as 1 bit, m <- b1 m + (1 - b1)
C(g_i) (v unchanged).  Both update x <- x - lr m / (sqrt(v) + eps).

Local step policy (T_u): after the freeze (k > ``var_freeze_step`` + 1) each worker takes local
steps on its own gradient, accumulating u (and the learning rates, L = sum lr):

    m <- b1 m + (1 - b1) g_i,   d = -lr m / (sqrt(v) + eps),   x <- x + d,   u <- u + d

and at the steps k with k mod I_u = 0 (1-bit sync) it undoes them and applies the workers'
average instead: w = C(u (sqrt(v) + eps)) averaged, m <- -w / L, x <- x - u + w / (sqrt(v) + eps),
u <- 0, L <- 0.  I_u starts at 1 and doubles every ``local_step_scaler`` steps after the freeze,
up to H = ``local_step_clipper``.  The error-feedback residuals of the two 1-bit exchanges are
separate states (DeepSpeed resets its one buffer at the freeze).

Between syncs the workers' parameters differ (local steps): keep one copy per worker (partition
spec ``P(axis_name)``) and evaluate the average or worker 0's.  The branch of a step is a
``lax.switch`` on the state (one branch's collectives run; under ``jax.vmap`` all are evaluated
and the reported traffic is the taken branch's).  In a run config (``optimizer: {name:
zero_one_adam}``) the same rules run in the engine under their own synchronization mode
(``cconv.engine.zero_one_mode``), whose steps equal these (``tests/test_zero_one_mode.py``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from cconv.compressors.base import Compressor
from cconv.engine.dropin import SERVER_KEYS, TRAFFIC_KEYS, Exchange
from cconv.engine.onebit_adam import EVERY_TENSOR, compressor_of

DENSE, ONE_BIT, LOCAL, SYNC = 0, 1, 2, 3  # a step's branch


class ZeroOneAdamState(NamedTuple):
    """Every leaf has a leading worker axis of size 1 (shards as ``P(axis_name)``)."""

    count: jax.Array  # (1,) int32: steps taken (k - 1)
    mu: Any  # m
    nu: Any  # v
    u: Any  # the local steps' accumulated update since the last sync
    lrs: jax.Array  # (1,) float32: L, the learning rates summed since the last sync
    policy: jax.Array  # (1, 5) int32: I_v, its update counter, I_u, its step counter, frozen
    dense: dict  # the full-precision exchange's state
    grads: dict  # the 1-bit gradient exchange's state (EF residuals) before the freeze
    sync: dict  # the 1-bit sync's state (EF residuals of u) after it
    key: jax.Array  # (1, 2) uint32
    traffic: dict  # the last update's bytes, each (1,) float32


def _check(b1, b2, eps, var_freeze_step, var_update_scaler, local_step_scaler, local_step_clipper, seed) -> None:
    """One-line ValueErrors for bad hyper-parameters."""
    for name, v in (("b1", b1), ("b2", b2)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
            raise ValueError(f"zero_one_adam: {name} must be in [0, 1), got {v!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"zero_one_adam: eps must be a number > 0 (the sync divides by sqrt(v) + eps), got {eps!r}")
    ints = (
        ("var_freeze_step", var_freeze_step, 0),
        ("var_update_scaler", var_update_scaler, 1),
        ("local_step_scaler", local_step_scaler, 1),
        ("local_step_clipper", local_step_clipper, 1),
    )
    for name, v, lo in ints:
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"zero_one_adam: {name} must be an integer >= {lo}, got {v!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"zero_one_adam: seed must be an integer, got {seed!r}")


def variance_steps(var_freeze_step: int, var_update_scaler: int) -> list[int]:
    """T_v: the steps k (from 1) at which the variance is updated (module docstring)."""
    out, interval, counter = [], 1, 0
    for k in range(1, var_freeze_step + 2):  # the step after var_freeze_step still runs unfrozen
        if k % interval == 0:
            out.append(k)
            counter += 1
            if counter == var_update_scaler:
                counter, interval = 0, interval * 2
    return out


def sync_steps(var_freeze_step: int, local_step_scaler: int, local_step_clipper: int, last: int) -> list[int]:
    """T_u after the freeze: the steps k <= ``last`` that end with a 1-bit sync."""
    out, interval, counter = [], 1, 0
    for k in range(var_freeze_step + 2, last + 1):
        if k % interval == 0:
            out.append(k)
        counter += 1
        if counter == local_step_scaler:
            counter, interval = 0, min(local_step_clipper, interval * 2)
    return out


def _policy_next(policy, k, kappa, scaler, clipper, freeze):
    """The counters after step k (module docstring): I_v doubles every kappa variance updates
    before the freeze; I_u doubles every ``scaler`` steps after it, up to ``clipper``."""
    iv, cv, iu, cu, frozen = (policy[i] for i in range(5))
    upd = (frozen == 0) & (k % iv == 0)
    cv = jnp.where(upd, cv + 1, cv)
    iv, cv = jnp.where(cv == kappa, iv * 2, iv), jnp.where(cv == kappa, 0, cv)
    cu = jnp.where(frozen == 1, cu + 1, cu)
    iu, cu = jnp.where(cu == scaler, jnp.minimum(clipper, iu * 2), iu), jnp.where(cu == scaler, 0, cu)
    frozen = jnp.where(k > freeze, 1, frozen)
    return jnp.stack([iv, cv, iu, cu, frozen]).astype(jnp.int32)


def _branches(ex: dict, b1: float, b2: float, eps: float, keys: tuple):
    """The four kinds of step, each (grads, state, lr, key) -> (updates, m, v, u, L, the three
    exchange states, traffic)."""

    def traffic(tr):
        return {k: jnp.asarray(tr.get(k, 0.0), jnp.float32)[None] for k in keys}

    tm = jax.tree.map
    first = lambda tree: tm(lambda x: x[0], tree)
    step = lambda m, v, lr: tm(lambda mi, vi: -lr * mi / (jnp.sqrt(vi) + eps), m, v)

    def dense(grads, s, lr, key):
        g, new, tr = ex["dense"](grads, s.dense, key)
        m = tm(lambda mi, gi: b1 * mi + (1 - b1) * gi, first(s.mu), g)
        v = tm(lambda vi, gi: b2 * vi + (1 - b2) * jnp.square(gi), first(s.nu), g)
        return step(m, v, lr), m, v, first(s.u), s.lrs[0], new, s.grads, s.sync, traffic(tr)

    def one_bit(grads, s, lr, key):
        g, new, tr = ex["grads"](grads, s.grads, key)
        m = tm(lambda mi, gi: b1 * mi + (1 - b1) * gi, first(s.mu), g)
        v = first(s.nu)
        return step(m, v, lr), m, v, first(s.u), s.lrs[0], s.dense, new, s.sync, traffic(tr)

    def local(grads, s, lr, key):
        m = tm(lambda mi, gi: b1 * mi + (1 - b1) * gi, first(s.mu), grads)
        v = first(s.nu)
        d = step(m, v, lr)
        u = tm(jnp.add, first(s.u), d)
        return d, m, v, u, s.lrs[0] + lr, s.dense, s.grads, s.sync, traffic({})

    def sync(grads, s, lr, key):
        d, m, v, u, lrs, *_ = local(grads, s, lr, key)
        w, new, tr = ex["sync"](tm(lambda ui, vi: ui * (jnp.sqrt(vi) + eps), u, v), s.sync, key)
        m = tm(lambda wi, mi: jnp.where(lrs > 0, -wi / jnp.where(lrs > 0, lrs, 1), mi), w, m)  # lr 0: m kept
        out = tm(lambda di, ui, wi, vi: di - ui + wi / (jnp.sqrt(vi) + eps), d, u, w, v)
        return out, m, v, tm(jnp.zeros_like, u), jnp.zeros_like(lrs), s.dense, s.grads, new, traffic(tr)

    return [dense, one_bit, local, sync]


def zero_one_adam(
    learning_rate: float | optax.Schedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    var_freeze_step: int = 100_000,
    var_update_scaler: int = 16,
    local_step_scaler: int = 32_678,
    local_step_clipper: int = 16,
    compressor: Compressor | str | dict | None = None,
    axis_name: str = "data",
    seed: int = 0,
    **options,
) -> optax.GradientTransformation:
    """0/1 Adam (module docstring; defaults are DeepSpeed's); ``options`` go to the 1-bit
    ``Exchange``s (``architecture``, ``granularity``, ...).  Bad values: one-line ValueError."""
    _check(b1, b2, eps, var_freeze_step, var_update_scaler, local_step_scaler, local_step_clipper, seed)
    comp = compressor_of(compressor)
    options = {"compress_vectors": EVERY_TENSOR, **options}  # as DeepSpeed: biases too
    arch = {k: v for k, v in options.items() if k == "architecture"}
    ex = {
        "dense": Exchange(None, axis_name=axis_name, **arch),
        "grads": Exchange(comp, memory="ef", axis_name=axis_name, **options),
        "sync": Exchange(comp, memory="ef", axis_name=axis_name, **options),
    }
    keys = TRAFFIC_KEYS + (SERVER_KEYS if ex["grads"].config.architecture != "all-to-all" else ())
    lr = learning_rate if callable(learning_rate) else (lambda count: learning_rate)
    branches = _branches(ex, b1, b2, eps, keys)
    rows = lambda tree: jax.tree.map(lambda x: x[None], tree)

    def update_fn(updates, state, params=None):
        del params
        if state.count.shape != (1,):
            raise ValueError(
                f"zero_one_adam: its state has {state.count.shape[0]} rows inside the map, one per worker expected: "
                f"its partition spec must be P({axis_name!r})"
            )
        t, pol = state.count[0], state.policy[0]
        k = t + 1
        frozen = pol[4] == 1
        branch = jnp.where(frozen, jnp.where(k % pol[2] == 0, SYNC, LOCAL), jnp.where(k % pol[0] == 0, DENSE, ONE_BIT))
        key = jax.random.fold_in(state.key[0], t)
        out = lax.switch(branch, branches, updates, state, jnp.asarray(lr(t), jnp.float32), key)
        d, m, v, u, lrs, dense, grads, sync, traffic = out
        d = jax.tree.map(lambda x, g: x.astype(g.dtype), d, updates)
        policy = _policy_next(pol, k, var_update_scaler, local_step_scaler, local_step_clipper, var_freeze_step)
        new = ZeroOneAdamState(
            state.count + 1, rows(m), rows(v), rows(u), lrs[None], policy[None], dense, grads, sync, state.key, traffic
        )
        return d, new

    return optax.GradientTransformation(_init(ex, keys, seed), update_fn)


def _init(ex: dict, keys: tuple, seed: int):
    """``init``: zero moments and accumulator, the policies' counters (I_v = 1, I_u = 1, not
    frozen), the three exchanges' states, the key and zero traffic; leaves (1, ...)."""

    def init_fn(params):
        zeros = jax.tree.map(lambda p: jnp.zeros((1, *p.shape), p.dtype), params)
        return ZeroOneAdamState(
            jnp.zeros((1,), jnp.int32),
            zeros,
            zeros,
            zeros,
            jnp.zeros((1,), jnp.float32),
            jnp.array([[1, 0, 1, 0, 0]], jnp.int32),
            ex["dense"].init(params),
            ex["grads"].init(params),
            ex["sync"].init(params),
            jax.random.key_data(jax.random.PRNGKey(seed))[None],
            {k: jnp.zeros((1,), jnp.float32) for k in keys},
        )

    return init_fn


__all__ = ["zero_one_adam", "ZeroOneAdamState", "variance_steps", "sync_steps"]
