"""Seconds per training step of a probed candidate on the target cluster (the systems simulator).

The one clock (``cconv.experiments.clock``) times a step from what the trainer states it does
(``Trainer.step_work``), with one worker's costs either

* **modelled** (default) on the cluster's device (``clock.Modelled``): compute = the model's
  forward + backward FLOPs on the local batch (``cconv.theory.profiles.from_spec``) / the
  device's sustained FLOP/s, times the synchronization mode's span of the step, plus
  ``3 x layers x Device.launch_s``; compression and decompression = cconv's fused program's cost
  model per compressed tensor (x_c(n) F(n) + memory passes + m x_d(n) F(n) + launches, m the
  payloads a worker decodes: P after an all-gather).  A model, not a measurement on this machine:
  the advice is the same on every machine and every run;

and the communication = the step's own collectives (kind, bytes and count as the engine performs
them, the list the byte ledger records) on the cluster's two-level network
(``Cluster.network()``), through a parameter server when the candidate's transport goes through
one; overlap and fusion = one iteration of the event simulator
(``cconv.theory.schedule.runs.step_time``) under the schedule (``wfbp``, ``mg-wfbp``,
``bytescheduler``, ``bsp``, ...).  The step time is averaged over the first ``STEPS`` steps
(local SGD and AdaComm alternate steps with and without communication).

* **measured** (``timing="measured"``): the candidate's real training step on this machine
  (``clock.measure_step``: its own launcher, one device per worker, the median of ``repeats``
  timed steps per phase after compilation), shown beside the modelled time of the same step
  (``StepTime.modelled_s``); the race then runs on the measured seconds.  A measured step is of
  the machine it ran on, not of the cluster named.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # types only: the modules load when a function runs
    from cconv.experiments.build import Problem
    from cconv.experiments.config import RunConfig
    from cconv.theory.cluster import Cluster

STEPS = 64  # steps averaged (covers the usual local-SGD periods)
TIMINGS = ("modelled", "measured")
MEASURE_REPEATS, MAX_REPEATS = 10, 1000  # timed real steps per phase (--measure-steps)


class StepTime(NamedTuple):
    """Mean seconds per step on the cluster, and its parts (no overlap in the parts; modelled)."""

    schedule: str
    step_s: float  # the step time the race uses: modelled_s, or measured_s when measured
    compute_s: float
    comm_s: float  # the collectives' time alone (no overlap)
    compress_s: float  # compression + decompression on the device
    modelled_s: float = math.nan  # the clock's model of the step on the cluster
    measured_s: float = math.nan  # the real step on this machine (``timing="measured"``)


def profile_of(problem: Problem):
    """The run's model as layers on its local batch (``cconv.experiments.clock.profile_of``)."""
    from cconv.experiments import clock

    return clock.profile_of(problem)


def step_times(problem: Problem, cluster: Cluster, schedules: tuple, profile: Any = None) -> list[StepTime]:
    """Modelled ``StepTime`` of the probe's ``problem`` on ``cluster`` under each schedule."""
    from cconv.experiments import clock

    costs = clock.Modelled(problem, cluster.device, cluster.workers, profile)
    net = cluster.network()
    ck = clock.Clock(problem.trainer, costs, [net], cluster.workers, profile=costs.profile)
    steps = range(min(STEPS, problem.cfg.steps))
    out = []
    for sched in schedules:
        c = ck.mean(steps, net, sched)
        out.append(StepTime(sched, c.step_s, c.compute_s, c.comm_s, c.compress_s, c.step_s))
    return out


def measured(times: list[StepTime], seconds: float) -> list[StepTime]:
    """``times`` with the race's step time the measured ``seconds`` (the model kept beside it)."""
    return [t._replace(step_s=seconds, measured_s=seconds) for t in times]


def check_timing(timing: str, repeats: Any, schedules: tuple, workers: int) -> int:
    """Validate the timing options (one-line ValueError, nothing measured yet); the repeats."""
    if timing not in TIMINGS:
        raise ValueError(f"--timing must be one of {', '.join(TIMINGS)}, got {str(timing)[:40]!r}")
    n = MEASURE_REPEATS if repeats is None else repeats
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_REPEATS:
        raise ValueError(f"--measure-steps must be an integer in [1, {MAX_REPEATS}], got {n!r}")
    if timing != "measured":
        if repeats is not None:
            raise ValueError("--measure-steps needs --timing measured")
        return n
    if len(schedules) > 1:
        raise ValueError(
            f"--timing measured times the real step (its own overlap), beside one schedule's model: give one "
            f"of advise.schedules ({', '.join(schedules)}), or --timing modelled"
        )
    check_devices("--timing measured", "candidate", workers)
    return n


def check_devices(option: str, unit: str, workers: int) -> None:
    """Refuse (one line) to measure a ``unit``'s step for a cluster of ``workers`` on devices that
    cannot hold one worker each: fewer devices here, or across processes (``jax.distributed``)
    other than exactly one per worker."""
    import jax

    n, kind = jax.device_count(), jax.default_backend()
    if jax.process_count() > 1 and n != workers:
        raise ValueError(
            f"{option} across {jax.process_count()} processes runs one worker per device of all of them: the "
            f"cluster has {workers} workers, the processes {n} {kind} device(s)"
        )
    if n < workers:
        raise ValueError(
            f"{option} runs each {unit}'s step with one device per worker: the cluster has {workers} workers, "
            f"this machine {n} {kind} device(s)"
        )


def measure(cfg: RunConfig, launcher: str, repeats: int) -> float:
    """Seconds of the real step of the candidate whose probe config is ``cfg``: one seed, the
    user's launcher ``launcher`` (one device per worker), ``clock.measure_step``."""
    import warnings

    from cconv.experiments import build, clock
    from cconv.experiments.config import from_dict

    raw = {**cfg.to_dict(), "launcher": launcher, "seed": cfg.seeds()[0]}
    with warnings.catch_warnings():  # the probe's build gave the config's warnings already
        warnings.simplefilter("ignore")
        problem = build.problem(from_dict(raw, source="measured candidate"))
    return clock.measure_step(problem, repeats, steps=min(STEPS, cfg.steps))


def leads() -> bool:
    """Is this the process that races and writes (process 0; the only one, unless a measured run
    spans the processes of ``jax.distributed``)?"""
    import jax

    return jax.process_index() == 0


def measured_on() -> str:
    """What a measured step ran on, for the cluster line: ``measured on 8 x cpu``."""
    from cconv.experiments import clock

    return f"measured on {clock.device_label()}"
