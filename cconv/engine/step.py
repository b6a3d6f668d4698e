"""The per-worker training step, written once against a ``Comm`` (named mesh axis or MPI).

It sees one worker's replica of the state and that worker's rows of the global batch.  The
gradient is this worker's own (parameters are per-worker, "varying" along the mesh axis, so
``jax.grad`` does not sum it over workers -- the shard_map trap of DEVELOPERS.md); compression,
memory and aggregation happen in the phase's ``Exchange`` (``cconv.engine.dropin``: the same
object a user calls inside their own shard_map).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from cconv.engine.config import Phase
from cconv.engine.dropin import Exchange, encoded_sizes, traffic_metrics


class WorkerState(NamedTuple):
    params: Any
    model_state: Any
    opt_state: Any
    comp_state: Any
    anchor: Any  # the last averaged model under local SGD (None otherwise)


class StepContext(NamedTuple):
    loss_fn: Callable
    optimizer: optax.GradientTransformation
    exchanges: dict  # Phase -> that phase's Exchange (cconv.engine.dropin)
    clip: float | None  # per-worker threshold, already scaled by P^(-1/2)
    report_rank: int  # whose bytes the metrics report (a non-server worker under PS)


def clip_local(grads, threshold):
    """Clip the global norm of one worker's gradient to ``threshold`` (DGC's local clipping)."""
    if threshold is None:
        return grads
    norm = optax.tree.norm(grads)
    scale = jnp.minimum(1.0, threshold / jnp.maximum(norm, 1e-30))
    return jax.tree.map(lambda g: (g * scale).astype(g.dtype), grads)


def worker_step(comm, ctx: StepContext, phase: Phase, s: WorkerState, batch, key):
    """One step of one worker: own gradient -> local clip -> exchange (compress, communicate,
    decompress, average) -> optax update; under local SGD, local updates and model averaging.
    ``key`` is the same on every worker (shared-key compressors rely on it); the loss key is
    folded with the worker's rank."""
    if phase.kind == "gossip":  # decentralized: cconv.engine.gossip
        from cconv.engine import gossip

        return gossip.worker_step(comm, ctx, gossip.step_of(ctx.exchanges[phase].config), s, batch, key)
    k_loss, k_comm = jax.random.split(key)
    grad_fn = jax.value_and_grad(ctx.loss_fn, has_aux=True)
    (loss, (model_state, aux)), grads = grad_fn(s.params, s.model_state, batch, jax.random.fold_in(k_loss, comm.rank()))
    grads = clip_local(grads, ctx.clip)
    ex: Exchange = ctx.exchanges[phase]
    comp_state, anchor = s.comp_state, s.anchor
    if phase.kind == "bsp":  # average gradients, then update
        grads, comp_state = ex.exchange(comm, grads, comp_state, k_comm)
    updates, opt_state = ctx.optimizer.update(grads, s.opt_state, s.params)
    params = optax.apply_updates(s.params, updates)
    if phase.kind == "sync":  # local SGD: average the models
        delta = jax.tree.map(jnp.subtract, params, anchor)
        delta, comp_state = ex.exchange(comm, delta, comp_state, k_comm)
        params = anchor = jax.tree.map(jnp.add, anchor, delta)
    if phase.kind != "local":
        model_state = ex.average(comm, model_state)  # e.g. BatchNorm running statistics
    names, values = zip(*{"loss": loss, **aux}.items())  # one buffer: one control all-reduce
    kinds, own = encoded_sizes(comm)  # + every worker's encoded bytes (variable-length payloads)
    summed = comm.allreduce(jnp.concatenate([jnp.stack([jnp.asarray(v, jnp.float32) for v in values]), own]), True)
    metrics = dict(zip(names, summed[: len(names)] / comm.size))
    table = summed[len(names) :].reshape(comm.size, len(kinds))
    metrics.update(traffic_metrics(comm, ctx.report_rank, kinds, table), density=jnp.float32(ex.plan_of(grads).density))
    return WorkerState(params, model_state, opt_state, comp_state, anchor), metrics
