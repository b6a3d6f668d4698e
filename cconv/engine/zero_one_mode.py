"""0/1 Adam in the engine's step (Lu, Li, Zhang, De Sa & He, ICLR 2023, "Maximizing Communication
Efficiency for Large-scale Training via 0/1 Adam"; DeepSpeed's ``ZeroOneAdam``): the run-config
optimizer ``zero_one_adam`` (``optimizer: {name: zero_one_adam, var_freeze_step, ...}`` in
``cconv run`` / ``sweep``) and the synchronization mode ``zero_one`` it runs under.

The rules are the drop-in's (``cconv.engine.zero_one_adam``, whose docstring has them in full).
Steps are counted k = 1, 2, ...; C is the compressor with error feedback (default: sign with one
scale per tensor, 1 bit per coordinate), averaged over the P workers; no bias correction:

    k in T_v (k <= var_freeze_step + 1):   g = 1/P sum_i g_i (dense all-reduce),
        m <- b1 m + (1 - b1) g,  v <- b2 v + (1 - b2) g^2,  x <- x - lr m / (sqrt(v) + eps)
    other k <= var_freeze_step + 1:       g = 1/P sum_i C(g_i) (1 bit),  m <- b1 m + (1 - b1) g, v kept
    k > var_freeze_step + 1 (v frozen):   local steps on the worker's own gradient,
        m_i <- b1 m_i + (1 - b1) g_i,  d = -lr m_i / (sqrt(v) + eps),  x_i <- x_i + d,
        u_i <- u_i + d,  L <- L + lr                          (nothing travels)
    and at k in T_u, after that local step, the 1-bit sync:
        w = 1/P sum_i C(u_i (sqrt(v) + eps)),  m <- -w / L,
        x_i <- x_i - u_i + w / (sqrt(v) + eps),  u <- 0,  L <- 0

T_v: the interval I_v starts at 1 and doubles after every ``var_update_scaler`` (kappa) variance
updates; T_u: I_u starts at 1 and doubles every ``local_step_scaler`` steps after the freeze, up
to H = ``local_step_clipper`` (``zero_one_adam.variance_steps`` / ``sync_steps``).  The paper's
claims this makes measurable: v changes only on T_v and never after the freeze; the momentum
travels as 1 bit with error feedback; the skipped syncs cost no bytes (a local step's traffic is
0, a sync's is the 1-bit payload of u).

How it fits the engine: the kinds of step are host-decided phases (``ZeroOneHost``, from the
schedule the optimizer carries, ``MessageTransformation.schedule``): ``dense`` and ``onebit`` are
the BSP gradient step (``gradient_step``: the phase's exchange is dense, resp. the compressor with
error feedback), ``local`` takes an optimizer step on the worker's own gradient without
communicating, ``sync`` adds the 1-bit exchange of u (``first_sync``, the first step after the
freeze, starts the error feedback afresh, as DeepSpeed resets its buffer at the freeze; before it
the residual is the 1-bit gradients').  The mode writes the step's kind into the optimizer's
state (``ZeroOneAdamEngineState.kind``) before each update, so ``update`` applies the rule of
that kind.  Between syncs the workers' parameters differ: the evaluated model is their average
(``average_view``).  The engine keeps one error-feedback state for both 1-bit exchanges (the
dense steps leave it untouched); the drop-in keeps two, with the same effect.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from cconv.compressors.base import Compressor
from cconv.engine.config import Phase
from cconv.engine.onebit_adam import EVERY_TENSOR, compressor_of
from cconv.engine.optimizers import MessageTransformation, register
from cconv.engine.step import apply_update, local_grad, reduce_metrics
from cconv.engine.sync import SYNC_MODES, SyncMode, gradient_step
from cconv.engine.zero_one_adam import _check

DENSE, ONE_BIT, LOCAL, SYNC, FIRST_SYNC = "dense", "one_bit", "local", "sync", "first_sync"  # phase kinds
CODE = {DENSE: 0, ONE_BIT: 1, LOCAL: 2, SYNC: 3, FIRST_SYNC: 3}  # what ``update`` does (the state's ``kind``)


class Schedule(NamedTuple):
    """0/1 Adam's policies (module docstring), the fact its mode reads off the optimizer."""

    var_freeze_step: int
    var_update_scaler: int
    local_step_scaler: int
    local_step_clipper: int


class ZeroOneHost:
    """The kind of each step (``phase``), from the policies' counters as DeepSpeed advances them:
    before the freeze ``dense`` when k mod I_v = 0 (then I_v doubles after kappa such steps), else
    ``one_bit``; after it ``sync`` when k mod I_u = 0 (``first_sync`` for the first), else
    ``local``, I_u doubling every ``local_step_scaler`` steps up to H.  Deterministic: the
    checkpoint needs nothing of it."""

    def __init__(self, schedule: Schedule):
        self.s = schedule
        self.kinds: list[str] = []
        self._iv, self._cv, self._iu, self._cu, self._frozen, self._synced = 1, 0, 1, 0, False, False

    def _advance(self) -> None:
        k, s = len(self.kinds) + 1, self.s
        if not self._frozen:
            kind = DENSE if k % self._iv == 0 else ONE_BIT
            if kind == DENSE:
                self._cv += 1
                if self._cv == s.var_update_scaler:
                    self._cv, self._iv = 0, self._iv * 2
        else:
            kind = LOCAL if k % self._iu else (SYNC if self._synced else FIRST_SYNC)
            self._synced = self._synced or kind != LOCAL
            self._cu += 1
            if self._cu == s.local_step_scaler:
                self._cu, self._iu = 0, min(s.local_step_clipper, self._iu * 2)
        self._frozen = self._frozen or k > s.var_freeze_step
        self.kinds.append(kind)

    def phase(self, step: int) -> Phase:
        while len(self.kinds) <= step:
            self._advance()
        return Phase(None, self.kinds[step])

    def observe(self, step: int, metrics: dict) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, d: dict) -> None:
        pass


class ZeroOne(SyncMode):
    """0/1 Adam's steps (module docstring): dense / 1-bit gradient steps before the variance
    freezes, local steps and 1-bit syncs of the accumulated update after it; it runs the
    ``zero_one_adam`` optimizer only (that optimizer sets ``sync="zero_one"`` itself)."""

    name = "zero_one"

    def check(self, engine_cfg):
        if engine_cfg.model_averaging:
            raise ValueError("sync='zero_one' decides its own local steps: no local_steps or post_local_switch")
        if engine_cfg.warmup is not None:
            raise ValueError("sync='zero_one' (optimizer zero_one_adam) decides which steps travel dense: no warmup")

    def check_optimizer(self, optimizer) -> None:
        if not isinstance(getattr(optimizer, "schedule", None), Schedule):
            raise ValueError(
                "sync='zero_one' runs 0/1 Adam's rules: it needs the optimizer zero_one_adam, which sets it"
            )

    def host(self, engine_cfg, optimizer=None):
        self.check_optimizer(optimizer)
        return ZeroOneHost(optimizer.schedule)

    def phase(self, engine_cfg, step):
        raise ValueError("0/1 Adam's phases come from its optimizer's schedule: ask Trainer.phase")

    def compresses(self, engine_cfg, phase):
        return phase.kind in (ONE_BIT, SYNC, FIRST_SYNC)

    def communicates(self, phase):
        return phase.kind != LOCAL

    def average_view(self, engine_cfg):
        return True

    def step(self, comm, ctx, phase, s, batch, key, host=None):
        as_kind = lambda st, kind: st._replace(
            kind=jnp.asarray(comm.rank()) * 0 + CODE[kind]
        )  # varying, like the state
        if phase.kind in (DENSE, ONE_BIT):
            return gradient_step(comm, ctx, phase, s._replace(opt_state=as_kind(s.opt_state, phase.kind)), batch, key)
        k_loss, k_comm = jax.random.split(key)
        loss, model_state, aux, grads = local_grad(comm, ctx, s.params, s.model_state, batch, k_loss)
        ex = ctx.exchanges[phase]
        params, opt_state = apply_update(ctx, grads, as_kind(s.opt_state, LOCAL), s.params)
        comp_state = s.comp_state
        if phase.kind != LOCAL:
            if phase.kind == FIRST_SYNC:  # the error feedback starts afresh at the freeze (DeepSpeed)
                comp_state = jax.tree.map(jnp.zeros_like, comp_state)
            opt_state = as_kind(opt_state, SYNC)
            sent, comp_state = ex.exchange(comm, ctx.optimizer.message(grads, opt_state), comp_state, k_comm)
            params, opt_state = apply_update(ctx, sent, opt_state, params)
            model_state = ex.average(comm, model_state)
        metrics = reduce_metrics(comm, ctx, ex, grads, {"loss": loss, **aux})
        return s._replace(params=params, model_state=model_state, opt_state=opt_state, comp_state=comp_state), metrics


SYNC_MODES[ZeroOne.name] = ZeroOne()  # registered here (cconv.engine imports this module)


class ZeroOneAdamEngineState(NamedTuple):
    """``zero_one_adam_engine``'s state (one worker's; the engine lays it out per worker)."""

    count: jax.Array  # () int32: steps taken
    mu: Any  # m (the worker's own during local steps)
    nu: Any  # v (frozen after var_freeze_step + 1)
    u: Any  # the local steps' accumulated update since the last sync
    lrs: jax.Array  # () float32: L, the learning rates summed since the last sync
    kind: jax.Array  # () int32: the rule of this update (CODE), written by the mode


def _rules(b1: float, b2: float, eps: float, lr):
    """(message, update) of the engine optimizer (module docstring), by the state's ``kind``."""
    tm = jax.tree.map
    scale = lambda v: jnp.sqrt(v) + eps

    def message(grads, state):
        sync = state.kind == CODE[SYNC]
        return tm(lambda g, u, v: jnp.where(sync, u * scale(v), g).astype(g.dtype), grads, state.u, state.nu)

    def update(avg, state, params=None):
        del params
        k, t, step = state.kind, state.count, jnp.asarray(lr(state.count), jnp.float32)
        sync, local = k == CODE[SYNC], k == CODE[LOCAL]
        L = state.lrs
        synced = lambda m, a: jnp.where(L > 0, -a / jnp.where(L > 0, L, 1.0), m)  # L = 0 (lr 0): m kept
        m = tm(lambda m, a: jnp.where(sync, synced(m, a), b1 * m + (1 - b1) * a).astype(m.dtype), state.mu, avg)
        dense = k == CODE[DENSE]
        v = tm(lambda v, a: jnp.where(dense, b2 * v + (1 - b2) * jnp.square(a), v).astype(v.dtype), state.nu, avg)
        d = tm(lambda m, v: -step * m / scale(v), m, v)
        out = tm(lambda d, u, a, v: jnp.where(sync, -u + a / scale(v), d).astype(a.dtype), d, state.u, avg, v)
        u = tm(lambda u, d: jnp.where(sync, 0.0, jnp.where(local, u + d, u)).astype(u.dtype), state.u, d)
        lrs = jnp.where(sync, 0.0, jnp.where(local, L + step, L))
        return out, ZeroOneAdamEngineState(jnp.where(sync, t, t + 1), m, v, u, lrs, k)

    return message, update


def zero_one_adam_engine(
    learning_rate: float | optax.Schedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    var_freeze_step: int = 100_000,
    var_update_scaler: int = 16,
    local_step_scaler: int = 32_678,
    local_step_clipper: int = 16,
    compressor: Compressor | str | dict | None = None,
) -> MessageTransformation:
    """0/1 Adam for the engine (module docstring; defaults are DeepSpeed's): ``engine`` sets the
    mode ``zero_one``, the compressor (default: sign with one scale per tensor) and error
    feedback; ``schedule`` carries the policies the mode's phases follow.  Bad values: one-line
    ValueError."""
    _check(b1, b2, eps, var_freeze_step, var_update_scaler, local_step_scaler, local_step_clipper, 0)
    lr = learning_rate if callable(learning_rate) else (lambda count: learning_rate)
    message, update = _rules(b1, b2, eps, lr)

    def init_fn(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return ZeroOneAdamEngineState(
            jnp.zeros((), jnp.int32), zeros, zeros, zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32)
        )

    engine = {
        "sync": ZeroOne.name,
        "compressor": compressor_of(compressor),
        "memory": "ef",
        "compress_vectors": EVERY_TENSOR,  # as DeepSpeed: biases too
    }
    schedule = Schedule(var_freeze_step, var_update_scaler, local_step_scaler, local_step_clipper)
    return MessageTransformation(init_fn, update, message, engine, label="0/1 Adam", schedule=schedule)


register("zero_one_adam", zero_one_adam_engine)

__all__ = ["ZeroOne", "ZeroOneHost", "Schedule", "zero_one_adam_engine", "ZeroOneAdamEngineState"]
