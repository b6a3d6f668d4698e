"""The step loop of one run (``cconv.experiments.runner``'s protocol, rule 1): steps are
dispatched without waiting; at every metric line, checkpoint, the last step, where the call stops,
or after ``MAX_INFLIGHT`` steps in flight, the finished steps' metrics are fetched, counted
(``cconv.experiments.counters``), written with a test evaluation, and the run is checkpointed
(``cconv.experiments.runstate``).  Its state is one ``Loop``.

A pending SIGTERM/SIGINT (``signals.pending``) ends the loop after the step just dispatched: its
steps are flushed and written, a checkpoint is saved at it and ``signals.Interrupted`` is raised
(at the last step the run simply ends).  Where ``Stop`` says, the loop raises ``Stopped``
(checkpointed first for a pause).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cconv.experiments import runstate, signals, writers
from cconv.experiments.build import Problem, seed_keys
from cconv.experiments.checkpoint import Checkpointer
from cconv.experiments.clock import SimClock
from cconv.experiments.counters import Counters, accumulate, metric_line
from cconv.experiments.evaluation import evaluate

# The deadlock trap (DEVELOPERS.md): never have more than this many steps in flight.
MAX_INFLIGHT = 16


class Stop(NamedTuple):
    """Where a call of ``execute`` ends before ``cfg.steps``: ``after`` (as a kill: no checkpoint)
    or ``pause`` (checkpointed, status ``paused``)."""

    after: int | None = None
    pause: int | None = None

    def due(self, step: int) -> bool:
        return any(x is not None and step >= x for x in self)


class Stopped(Exception):  # noqa: N818 (control flow, as StopIteration: where the loop ended, not an error)
    """The loop ended where ``Stop`` said: ``paused_at`` the checkpointed step of a pause (None:
    ``after``, no checkpoint)."""

    def __init__(self, paused_at: int | None = None):
        super().__init__(paused_at)
        self.paused_at = paused_at


@dataclasses.dataclass
class Loop:
    """Everything the step loop reads and advances.

    problem     the run's objects (``cconv.experiments.build.Problem``)
    state       the trainer's state after ``step`` steps
    step        the steps done
    counters    the running totals (checkpointed with the state)
    clock       the simulated clock (None: no network configured)
    writer      the metric writers (``writers.MultiWriter``)
    bar         the progress bar
    ckpt        the run's checkpoints
    stop        where this call ends early
    t0          ``time.perf_counter()`` at step 0 (resumes included: wall time goes on)
    last_lines  each seed's last metric line written
    """

    problem: Problem
    state: Any
    step: int
    counters: Counters
    clock: SimClock | None
    writer: Any
    bar: Any
    ckpt: Checkpointer
    stop: Stop
    t0: float
    last_lines: list = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.last_lines = self.last_lines or [None] * len(self.problem.seeds)


def train_steps(loop: Loop) -> None:
    """Train from ``loop.step`` to ``cfg.steps`` (or until every seed diverged), advancing
    ``loop`` (module docstring)."""
    cfg, step_fn = loop.problem.cfg, loop.problem.trainer.step
    step_keys = [seed_keys(s)["steps"] for s in loop.problem.seeds]
    if len(step_keys) > 1:
        step_keys = jnp.stack(step_keys)
    pending: list = []
    while loop.step < cfg.steps:
        batch, key = step_inputs(loop.problem, loop.step, step_keys)
        loop.state, m = step_fn(loop.state, batch, key)
        pending.append((loop.step, m))
        loop.step += 1
        signalled = signals.pending() is not None and loop.step < cfg.steps  # stop at this step
        if not signalled and not _must_flush(cfg, loop.step, len(pending), loop.stop):
            continue
        _flush(loop, pending)
        pending = []
        if loop.counters.all_diverged():
            break
        _checkpoint_or_stop(loop, signalled)


@jax.jit
def _fold_in_each(keys, step):
    """``fold_in(k, step)`` of every seed's key, one program (eager, 2 S dispatches a step)."""
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, step)


def step_inputs(problem: Problem, step: int, step_keys: Any) -> tuple[Any, Any]:
    """(batch, key) of one step; several seeds (``step_keys`` stacked): on a leading seed axis."""
    batch = [b.next() for b in problem.batchers]
    if len(problem.seeds) > 1:
        return {k: np.stack([bt[k] for bt in batch]) for k in batch[0]}, _fold_in_each(step_keys, step)
    return batch[0], jax.random.fold_in(step_keys[0], step)


def _must_flush(cfg: Any, step: int, pending: int, stop: Stop) -> bool:
    """Wait for the device here?  At most ``MAX_INFLIGHT`` steps in flight (the deadlock trap),
    and at every metric line, checkpoint, the last step and where the call stops."""
    return (
        pending >= MAX_INFLIGHT
        or step % cfg.log_every == 0
        or step == cfg.steps
        or step % cfg.checkpoint_every == 0
        or stop.due(step)
    )


def _flush(loop: Loop, pending: list[tuple[int, Any]]) -> None:
    """Fetch the metrics of the steps in flight, count them and write the lines due (with the
    test metrics of every seed still training)."""
    problem, counters = loop.problem, loop.counters
    host = jax.device_get([m for _, m in pending])
    records = accumulate(
        counters, loop.clock, [(s, h) for (s, _), h in zip(pending, host)], problem.cfg.log_every, problem.cfg.steps
    )
    elapsed = time.perf_counter() - loop.t0
    if records:
        need_eval = any(counters.diverged[i] is None for i, _, _ in records)
        tests = evaluate(problem, loop.state) if need_eval else None
        lines = []
        for i, done, a in records:
            test = tests[i] if counters.diverged[i] is None else None
            lines.append(metric_line(counters, loop.clock, problem.seeds[i], i, done, a, test, elapsed))
            loop.last_lines[i] = lines[-1]
        writers.write_lines(loop.writer, lines)
    loop.bar.update(len(pending))


def _checkpoint_or_stop(loop: Loop, signalled: bool) -> None:
    """After a flush: checkpoint where due (every ``checkpoint_every`` steps, a pause, a signal),
    then raise ``signals.Interrupted`` / ``Stopped`` where the call ends."""
    step, steps, stop = loop.step, loop.problem.cfg.steps, loop.stop
    pause = stop.pause is not None and step >= stop.pause and step < steps
    if signalled or pause or (step % loop.problem.cfg.checkpoint_every == 0 and step < steps):
        loop.counters.wall = time.perf_counter() - loop.t0
        runstate.save(loop.problem, loop.ckpt, step, loop.state, loop.counters)
    if signalled:
        raise signals.Interrupted(signals.pending(), step)
    if stop.due(step) and step < steps:
        raise Stopped(step if pause else None)
