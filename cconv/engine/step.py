"""The per-worker training step, written once against a ``Comm`` (named mesh axis or MPI).

It sees one worker's replica of the state and that worker's rows of the global batch.  The
gradient is this worker's own (parameters are per-worker, "varying" along the mesh axis, so
``jax.grad`` does not sum it over workers -- the shard_map trap of DEVELOPERS.md); compression,
memory and aggregation happen in the phase's ``Exchange`` (``cconv.engine.dropin``: the same
object a user calls inside their own shard_map).  What a step does with them (BSP, local SGD,
SSP, ASP, ...) is its synchronization mode's ``step`` (``cconv.engine.sync.SyncMode.step``; the
trainer traces it), built from the helpers here: ``local_grad``, ``apply_update``,
``reduce_metrics``.  BSP's, ``cconv.engine.sync.gradient_step``, is the training step on one
screen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from cconv.engine.dropin import Exchange, encoded_sizes, traffic_metrics


class WorkerState(NamedTuple):
    params: Any
    model_state: Any
    opt_state: Any
    comp_state: Any
    anchor: Any  # the last averaged model under local SGD (None otherwise)
    sync: Any = None  # the synchronization mode's extra state (``SyncMode.init``; None: none)


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


def local_grad(comm, ctx: StepContext, params, model_state, batch, key):
    """(loss, new model state, aux, this worker's clipped gradient) at ``params``; the loss key
    is folded with the worker's rank."""
    grad_fn = jax.value_and_grad(ctx.loss_fn, has_aux=True)
    (loss, (model_state, aux)), grads = grad_fn(params, model_state, batch, jax.random.fold_in(key, comm.rank()))
    return loss, model_state, aux, clip_local(grads, ctx.clip)


def apply_update(ctx: StepContext, grads, opt_state, params):
    """(new params, new optimizer state): one optax update with ``grads``."""
    updates, opt_state = ctx.optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def reduce_metrics(comm, ctx: StepContext, ex: Exchange, grads, values: dict, local: dict | None = None) -> dict:
    """The step's metrics: ``values`` averaged over workers and every worker's encoded bytes in
    one control all-reduce, this trace's traffic for ``ctx.report_rank``, the density, and
    ``local`` (already identical on every worker) as is."""
    names, vals = zip(*values.items())  # one buffer: one control all-reduce
    kinds, own = encoded_sizes(comm)  # + every worker's encoded bytes (variable-length payloads)
    summed = comm.allreduce(jnp.concatenate([jnp.stack([jnp.asarray(v, jnp.float32) for v in vals]), own]), True)
    metrics = dict(zip(names, summed[: len(names)] / comm.size))
    table = summed[len(names) :].reshape(comm.size, len(kinds))
    metrics.update(traffic_metrics(comm, ctx.report_rank, kinds, table), density=jnp.float32(ex.plan_of(grads).density))
    metrics.update(local or {})
    return metrics
