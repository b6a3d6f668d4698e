"""The per-worker training step, written once against a ``Comm`` (named mesh axis or MPI).

It sees one worker's replica of the state and that worker's rows of the global batch.  The
gradient is this worker's own (parameters are per-worker, "varying" along the mesh axis, so
``jax.grad`` does not sum it over workers -- the shard_map trap of DEVELOPERS.md); compression,
memory and aggregation happen in ``exchange``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from cconv.comm.accounting import total_traffic
from cconv.engine.config import Phase
from cconv.engine.exchange import Plan, average, exchange


class WorkerState(NamedTuple):
    params: Any
    model_state: Any
    opt_state: Any
    comp_state: Any
    anchor: Any  # the last averaged model under local SGD (None otherwise)


class StepContext(NamedTuple):
    loss_fn: Callable
    optimizer: optax.GradientTransformation
    plans: dict  # Phase -> Plan used by that phase's exchange
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
    k_loss, k_comm = jax.random.split(key)
    grad_fn = jax.value_and_grad(ctx.loss_fn, has_aux=True)
    (loss, (model_state, aux)), grads = grad_fn(s.params, s.model_state, batch, jax.random.fold_in(k_loss, comm.rank()))
    grads = clip_local(grads, ctx.clip)
    plan: Plan = ctx.plans[phase]
    comp_state, anchor = s.comp_state, s.anchor
    if phase.kind == "bsp":  # average gradients, then update
        grads, comp_state = exchange(comm, plan, grads, comp_state, k_comm)
    updates, opt_state = ctx.optimizer.update(grads, s.opt_state, s.params)
    params = optax.apply_updates(s.params, updates)
    if phase.kind == "sync":  # local SGD: average the models
        delta = jax.tree.map(jnp.subtract, params, anchor)
        delta, comp_state = exchange(comm, plan, delta, comp_state, k_comm)
        params = anchor = jax.tree.map(jnp.add, anchor, delta)
    if phase.kind != "local":
        model_state = average(comm, plan, model_state)  # e.g. BatchNorm running statistics
    names, values = zip(*{"loss": loss, **aux}.items())  # one buffer: one control all-reduce
    values = comm.allmean(jnp.stack([jnp.asarray(v, jnp.float32) for v in values]), control=True)
    metrics = dict(zip(names, values))
    metrics.update(traffic_metrics(comm, ctx.report_rank), density=jnp.float32(plan.density))
    return WorkerState(params, model_state, opt_state, comp_state, anchor), metrics


def traffic_metrics(comm, rank: int) -> dict:
    """This step's bytes (from the trace's ledger) as metrics, for worker ``rank``."""
    sent, recv = total_traffic(comm.ledger, comm.size, control=False)
    ctl, _ = total_traffic(comm.ledger, comm.size, control=True)
    out = {"bytes_sent": sent[rank], "bytes_received": recv[rank], "bytes_control": ctl[rank]}
    if any(c.kind.startswith("ps_") for c in comm.ledger):
        out.update(server_bytes_sent=sent[0], server_bytes_received=recv[0])
    return {k: jnp.float32(v) for k, v in out.items()}
