"""Synchronization modes: how the workers' updates meet, one object each (``SYNC_MODES``).

A mode is the *learning-algorithm* axis of the surveys (BSP, local SGD, SSP, ASP, gossip),
orthogonal to compression: every mode moves its messages through the phase's ``Exchange``
(``cconv.engine.dropin``), so every compressor and memory composes with it.  The protocol
(``SyncMode``):

    check(cfg)                      bad input (one-line ValueError), called by ``EngineConfig``
    init(cfg, params)               extra per-worker state (a pytree in ``WorkerState.sync``,
                                    so checkpoints carry it; None: nothing)
    phase(cfg, step)                the static phase of step ``step`` (one compiled program each)
    inputs(cfg, step)               host-decided per-step arrays (e.g. the timing model's version
                                    schedule), replicated to every worker; None: none
    step(comm, ctx, phase, ws, batch, key, host)
                                    one worker's step -> (new ``WorkerState``, metrics)
    compresses(cfg, phase)          does this phase's exchange use the compressor (+ memory)?
    communicates(phase)             does this phase communicate at all?
    dry(comm, ex, ws, phase)        what ``step`` communicates, on shapes (``DryComm``)
    average_view(cfg)               evaluate the workers' average model (True) or worker 0's
    waits_for_all                   does a step wait for every worker (simulated time: the
                                    slowest worker's compute) or not (see ``cconv.engine.timing``)

``sync_mode(cfg)`` picks the mode: ``cfg.sync`` ("bsp" by default), where ``bsp`` with
``local_steps > 1`` or ``post_local_switch > 0`` is local SGD.  Adding a mode is one class and
one ``SYNC_MODES`` entry.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cconv.engine.config import Phase, phase_of
from cconv.engine.step import StepContext, WorkerState, apply_update, local_grad, reduce_metrics


class SyncMode:
    """Base class and protocol (module docstring); defaults are those of BSP."""

    name = ""
    waits_for_all = True

    def check(self, cfg) -> None:
        """Raise a one-line ValueError for what this mode cannot do with ``cfg``."""

    def init(self, cfg, params) -> Any:
        return None

    def phase(self, cfg, step: int) -> Phase:
        return phase_of(cfg, step)

    def inputs(self, cfg, step: int) -> np.ndarray | None:
        return None

    def step(self, comm, ctx: StepContext, phase: Phase, s: WorkerState, batch, key, host=None):
        raise NotImplementedError

    def compresses(self, cfg, phase: Phase) -> bool:
        return True

    def communicates(self, phase: Phase) -> bool:
        return True

    def dry(self, comm, ex, ws: WorkerState, phase: Phase) -> None:
        if self.communicates(phase):
            ex.exchange(comm, ws.params, ws.comp_state, jax.random.PRNGKey(0))
            ex.average(comm, ws.model_state)

    def average_view(self, cfg) -> bool:
        return False


class BSP(SyncMode):
    """Bulk-synchronous SGD: every step averages the workers' (compressed) gradients, then each
    worker applies the same optax update: x <- x - eta * opt(1/P sum_i D(C(g_i)))."""

    name = "bsp"

    def step(self, comm, ctx, phase, s, batch, key, host=None):
        k_loss, k_comm = jax.random.split(key)
        loss, model_state, aux, grads = local_grad(comm, ctx, s.params, s.model_state, batch, k_loss)
        ex = ctx.exchanges[phase]
        grads, comp_state = ex.exchange(comm, grads, s.comp_state, k_comm)
        params, opt_state = apply_update(ctx, grads, s.opt_state, s.params)
        model_state = ex.average(comm, model_state)  # e.g. BatchNorm running statistics
        metrics = reduce_metrics(comm, ctx, ex, grads, {"loss": loss, **aux})
        return s._replace(params=params, model_state=model_state, opt_state=opt_state, comp_state=comp_state), metrics


class LocalSGD(SyncMode):
    """Local SGD (Stich 2019; post-local SGD, Lin et al. 2020): H local optax steps, then the
    models are averaged through the anchor (the last average): x <- a + 1/P sum_i D(C(x_i - a)),
    the delta compressed only with ``compress_delta``.  Phases "local" / "sync" (and "bsp"
    before ``post_local_switch``)."""

    name = "local"

    def init(self, cfg, params):
        return None  # the anchor lives in WorkerState.anchor (checkpoint layout of earlier versions)

    def compresses(self, cfg, phase):
        return phase.kind == "bsp" or cfg.compress_delta

    def communicates(self, phase):
        return phase.kind != "local"

    def average_view(self, cfg):
        return True

    def step(self, comm, ctx, phase, s, batch, key, host=None):
        if phase.kind == "bsp":  # before post_local_switch
            return BSP.step(self, comm, ctx, phase, s, batch, key)
        k_loss, k_comm = jax.random.split(key)
        loss, model_state, aux, grads = local_grad(comm, ctx, s.params, s.model_state, batch, k_loss)
        ex = ctx.exchanges[phase]
        params, opt_state = apply_update(ctx, grads, s.opt_state, s.params)
        comp_state, anchor = s.comp_state, s.anchor
        if phase.kind == "sync":  # average the models
            delta = jax.tree.map(jnp.subtract, params, anchor)
            delta, comp_state = ex.exchange(comm, delta, comp_state, k_comm)
            params = anchor = jax.tree.map(jnp.add, anchor, delta)
            model_state = ex.average(comm, model_state)
        metrics = reduce_metrics(comm, ctx, ex, grads, {"loss": loss, **aux})
        new = s._replace(params=params, model_state=model_state, opt_state=opt_state, comp_state=comp_state)
        return new._replace(anchor=anchor), metrics


SYNC_MODES: dict[str, SyncMode] = {m.name: m for m in (BSP(), LocalSGD())}
PUBLIC = ("bsp",)  # the names ``EngineConfig.sync`` accepts besides those added below ("local" is local_steps)


def public_names() -> tuple[str, ...]:
    """The values of ``EngineConfig.sync`` (every registered mode but the internal "local")."""
    return tuple(n for n in SYNC_MODES if n != LocalSGD.name)


def sync_mode(cfg) -> SyncMode:
    """The mode ``cfg`` runs: ``cfg.sync``; plain ``bsp`` with model averaging is local SGD."""
    mode = SYNC_MODES[cfg.sync]
    return SYNC_MODES[LocalSGD.name] if mode.name == BSP.name and cfg.model_averaging else mode


__all__ = ["SyncMode", "SYNC_MODES", "BSP", "LocalSGD", "sync_mode", "public_names"]
