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
* compression and decompression: cconv's fused program's cost model, the planner's
  (``cconv.theory.schedule.compress``): per compressed tensor of n elements (the run's own
  ``build.compressed_shapes``), compress = x_c(n) F(n) + launch and decompress =
  m x_d(n) F(n) + launch, with F(n) = 4 n / B_device the device's read floor, x_c and x_d cconv's
  benchmarked multiples of it for this compressor (``experiments/benchmarks/results``), m the
  payloads a worker decodes (P after an all-gather); error feedback or another memory adds two
  passes (read x + e, write e).  A model, not a measurement on this machine: the advice is the same
  on every machine and every run (measured compression on the host, scaled by memory bandwidth,
  varied by the host's load from one run to the next);
* overlap and fusion: one iteration of the event simulator (``cconv.theory.schedule.runs
  .step_time``) under the schedule (``wfbp``, ``mg-wfbp``, ``bytescheduler``, ``bsp``, ...).

The step time is averaged over the first ``STEPS`` steps (local SGD and AdaComm alternate steps
with and without communication).
"""

from __future__ import annotations

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


def profile_of(problem: Any):
    """The run's model as layers on its local batch (as ``runner.SimClock.profile``)."""
    import jax

    from cconv.theory import profiles

    cfg = problem.cfg
    x = np.asarray(problem.ds.train["x"][:1])
    b = jax.ShapeDtypeStruct((cfg.batch_size // cfg.workers, *x.shape[1:]), x.dtype)
    return profiles.from_spec(cfg.model["name"], problem.specs[0], b)


MEMORY_PASSES = 2.0  # error feedback (and DGC's memory): read x + e, write the new e


def exchange_seconds(problem: Any, device: Any, workers: int) -> float:
    """One worker's compression + decompression per communicating step on ``device`` (module
    docstring): 0 for the dense baseline."""
    import warnings

    import jax

    from cconv.experiments import build
    from cconv.theory import implementation as IM
    from cconv.theory import planner as PL
    from cconv.theory.schedule import compress as CP

    cfg = problem.cfg
    c = build.make_compressor(cfg.compressor)
    name = cfg.compressor["name"]
    if name == PL.identity_name():
        return 0.0
    m = IM.decodes(c.aggregation if isinstance(c.aggregation, str) else "allreduce", workers)
    bench = CP.load_bench()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CP.EstimatedCostWarning)
        rows = bench.get(name) or CP.estimated_rows(name, bench)
    shapes = [x.shape for x in jax.tree.leaves(problem.specs[0].params)]
    extra = MEMORY_PASSES if cfg.memory not in (None, "none") else 0.0
    total = 0.0
    for shape in build.compressed_shapes(cfg, shapes):
        n = float(np.prod(shape))
        cx, dx = CP.ratio_at(rows, n)
        floor = device.read_floor(n)
        total += (cx + extra) * floor + m * dx * floor + 2 * device.launch_s
    return total


def step_times(problem: Any, cluster: Any, schedules: tuple, profile: Any = None) -> list[StepTime]:
    """``StepTime`` of the probe's ``problem`` on ``cluster`` under each schedule (module docstring)."""
    from cconv.comm.aggregation import TRANSPORTS
    from cconv.theory import network as N
    from cconv.theory.schedule import runs

    profile = profile if profile is not None else profile_of(problem)
    trainer, dev, net, P = problem.trainer, cluster.device, cluster.network(), cluster.workers
    layers = len(profile.layers)
    compute = (profile.fwd_flops + profile.bwd_flops) / dev.flops + KERNELS_PER_LAYER * layers * dev.launch_s
    ex_s = exchange_seconds(problem, dev, P)
    sync, ps = trainer.sync, TRANSPORTS[trainer.cfg.architecture].via_server
    steps = range(min(STEPS, problem.cfg.steps))
    per_phase: dict = {}
    for s in steps:
        ph = trainer.phase(s)
        if ph not in per_phase:
            colls = [c for c in trainer.collectives(s) if not getattr(c, "control", False)]
            talks = sync.communicates(ph) and colls
            ex = ex_s if talks else 0.0
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
