"""Seconds per training step of a probed candidate on the target cluster (the systems simulator).

For a probe (its trainer, built with the cluster's P workers) and a cluster
(``cconv.theory.cluster.Cluster``: device, intra-node link, inter-node network):

* compute: the model's forward + backward FLOPs on the local batch (``cconv.theory.profiles
  .from_spec``, read from the model's jaxpr) / the device's sustained FLOP/s (``Device.flops``),
  times the synchronization mode's span of the step (``SyncMode.span``: 1 without a worker
  timing model), plus ``3 x layers x Device.launch_s`` (a forward and two backward kernels per
  layer, each paying the device's launch cost: small models are launch bound);
* communication: the step's own collectives (``trainer.collectives(step)``: kind, bytes and count
  as the engine performs them, the same list that the byte ledger records), on the cluster's
  two-level network (``Cluster.network()``), through a parameter server when the candidate's
  transport goes through one (``Transport.via_server``);
* compression and decompression: the candidate's ``exchange`` (memory, compress, aggregate,
  decompress of every received payload, as ``cconv.experiments.runner.Calibration`` times it)
  measured on this machine with the collectives stubbed out (``exchange_seconds``: the fastest of
  5 calls on a standard-normal stand-in gradient), then scaled to the device by memory
  bandwidth, the rule of ``cconv.theory.schedule.compress`` (compression kernels are memory
  bound, so a kernel's time is the same multiple of its read floor on both machines), plus one
  launch per layer for compression and one for decompression, as ``compress.layer_cost`` charges:

      t_device = t_host x B_host / B_device + 2 x layers x Device.launch_s,

  with B_host measured here (``host_bandwidth``: the fastest read of a 64 MiB fp32 array) and
  B_device the datasheet's (``Device.mem_bw``);
* overlap and fusion: one iteration of the event simulator (``cconv.theory.schedule.runs
  .step_time``) under the schedule (``wfbp``, ``mg-wfbp``, ``bytescheduler``, ``bsp``, ...).

The step time is averaged over the first ``STEPS`` steps (local SGD and AdaComm alternate steps
with and without communication).
"""

from __future__ import annotations

import functools
import time
from typing import Any, NamedTuple

import numpy as np

STEPS = 64  # steps averaged (covers the usual local-SGD periods)
KERNELS_PER_LAYER = 3  # forward, backward to the input, backward to the weights


class StepTime(NamedTuple):
    """Mean seconds per step on the cluster, and its parts (no overlap in the parts)."""

    schedule: str
    step_s: float
    compute_s: float
    comm_s: float  # the collectives' time alone (no overlap)
    compress_s: float  # compression + decompression on the device


@functools.cache
def host_bandwidth() -> float:
    """Bytes/s of this machine's memory read floor: the fastest of 5 jitted sums of 64 MiB."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones(1 << 24, jnp.float32)
    f = jax.jit(jnp.sum)
    f(x).block_until_ready()
    best = np.inf
    for _ in range(5):
        t = time.perf_counter()
        f(x).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return float(x.nbytes / best)


def profile_of(problem: Any):
    """The run's model as layers on its local batch (as ``runner.SimClock.profile``)."""
    import jax

    from cconv.theory import profiles

    cfg = problem.cfg
    x = np.asarray(problem.ds.train["x"][:1])
    b = jax.ShapeDtypeStruct((cfg.batch_size // cfg.workers, *x.shape[1:]), x.dtype)
    return profiles.from_spec(cfg.model["name"], problem.specs[0], b)


def _fastest(fn, *args, repeats: int = 5) -> float:
    """Fastest of ``repeats`` timed calls after a warm-up (compiling) call: interference from other
    processes only ever adds time, so the minimum is the least disturbed estimate."""
    import jax

    jax.block_until_ready(fn(*args))
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t)
    return float(best)


@functools.cache
def _gradient(params_shapes: tuple, seed: int = 0):
    """A stand-in gradient (standard normal) of the given leaf shapes: what compression costs does
    not depend on the values' history, and one is shared by every candidate of a model."""
    import jax

    keys = jax.random.split(jax.random.key(seed), len(params_shapes))
    return [jax.random.normal(k, shape, dtype) for k, (shape, dtype) in zip(keys, params_shapes)]


def exchange_seconds(problem: Any, phase: Any) -> float:
    """One worker's ``exchange`` of ``phase`` on this machine (``SyncMode.exchange_work``, the
    engine's memory + compress + decompress with the collectives stubbed out by ``DryComm``)."""
    import jax

    trainer = problem.trainer
    params = problem.specs[0].params
    leaves, tree = jax.tree.flatten(params)
    grads = jax.tree.unflatten(tree, _gradient(tuple((x.shape, x.dtype) for x in leaves)))
    fn, args = trainer.sync.exchange_work(trainer.cfg, trainer.plan(phase), grads)
    return _fastest(fn, *args, jax.random.key(0))


def step_times(problem: Any, cluster: Any, schedules: tuple, profile: Any = None) -> list[StepTime]:
    """``StepTime`` of the probe's ``problem`` on ``cluster`` under each schedule (module docstring)."""
    from cconv.comm.aggregation import TRANSPORTS
    from cconv.theory import network as N
    from cconv.theory.schedule import runs

    profile = profile if profile is not None else profile_of(problem)
    trainer, dev, net, P = problem.trainer, cluster.device, cluster.network(), cluster.workers
    layers = len(profile.layers)
    compute = (profile.fwd_flops + profile.bwd_flops) / dev.flops + KERNELS_PER_LAYER * layers * dev.launch_s
    scale = host_bandwidth() / dev.mem_bw
    sync, ps = trainer.sync, TRANSPORTS[trainer.cfg.architecture].via_server
    steps = range(min(STEPS, problem.cfg.steps))
    per_phase: dict = {}
    for s in steps:
        ph = trainer.phase(s)
        if ph not in per_phase:
            colls = [c for c in trainer.collectives(s) if not getattr(c, "control", False)]
            talks = sync.communicates(ph) and colls
            ex = exchange_seconds(problem, ph) * scale + 2 * layers * dev.launch_s if talks else 0.0
            per_phase[ph] = (colls, ex, N.step_comm_time(colls, P, net) if colls else 0.0)
    out = []
    for sched in schedules:
        tot = np.zeros(4)
        for s in steps:
            colls, ex, comm = per_phase[trainer.phase(s)]
            c = compute * sync.span(trainer.cfg, s)
            t = runs.step_time(profile, colls, P, net, sched, c, ex, ps=ps) if colls else c
            tot += (t, c, comm, ex)
        tot /= len(steps)
        out.append(StepTime(sched, *map(float, tot)))
    return out
