"""Build a run's programs ahead of its first step, so that several runs can build theirs at once.

A run compiles its programs lazily: the trainer's initial state, one step program per distinct
phase (``Trainer.phase``), the test evaluator per chunk shape.  ``warm(problem, steps)`` builds
exactly those a run of ``steps`` steps starts with -- ahead-of-time (``jax.jit(...).lower(...)
.compile()``), from abstract arguments shaped as the run's, so no batch is drawn and no random
state advances -- and the run's own calls then find them built (JAX caches a jitted function's
executable per argument signature, for AOT and ordinary calls alike).

Why: ``cconv advise`` builds one program per candidate, and XLA's backend compilation (most of
the build time) runs without Python's global interpreter lock, so candidates warmed in a thread
pool build on every core while the race trains the ones already built (``cconv.advisor.api``);
``cconv sweep`` builds its next run while one trains (``cconv.experiments.sweep.Ahead``).
Nothing here changes what a run computes: the same programs, built earlier.  JAX's configuration
contexts (``jax.default_device``, ``jax.numpy_rank_promotion``, ...) are per thread: a run inside
one that the building thread does not share builds its programs again (warming wasted, never wrong).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from cconv.experiments.build import Problem, seed_keys
from cconv.experiments.evaluation import EVAL_CHUNK, evaluator_of
from cconv.experiments.runstate import initial_state


def _batch_like(problem: Problem) -> dict:
    """Zeros shaped as one step's batch (a leading seed axis with several seeds)."""
    train, S = problem.ds.train, len(problem.seeds)
    lead = (S, problem.cfg.batch_size) if S > 1 else (problem.cfg.batch_size,)
    return {k: np.zeros(lead + np.shape(v)[1:], np.asarray(v).dtype) for k, v in train.items()}


def _key_like(problem: Problem) -> Any:
    keys = [jax.random.fold_in(seed_keys(s)["steps"], 0) for s in problem.seeds]
    return keys[0] if len(keys) == 1 else jax.numpy.stack(keys)


def _eval_chunks(problem: Problem) -> list[dict]:
    """One test chunk of each size ``evaluate`` feeds (full chunks, and the last partial one)."""
    test = problem.ds.test
    n = len(test["y"])
    sizes = sorted({min(EVAL_CHUNK, n), n % EVAL_CHUNK or min(EVAL_CHUNK, n)})
    return [{k: np.asarray(v)[:m] for k, v in test.items()} for m in sizes]


def warm(problem: Problem, steps: int) -> int:
    """Compile the programs the first ``steps`` steps of ``problem``'s run call (initial state,
    each distinct phase's step, the evaluator); the number of step programs built.  A mode whose
    phases the host decides from observed losses (AdaComm) is warmed for its first step only:
    asking its later phases ahead would decide them before the losses exist."""
    trainer = problem.trainer
    state = initial_state(problem)
    batch, key = _batch_like(problem), _key_like(problem)
    phases: dict = {}
    if trainer.host_state() is not None:  # phases decided on the host from observed losses: the first only
        steps = 1
    for s in range(max(int(steps), 1)):
        phases.setdefault(trainer.phase(s), s)
    for s in phases.values():
        trainer.lower(state.replace(step=s), batch, key).compile()
    ev, st = evaluator_of(problem), state.replace(step=0)
    for chunk in _eval_chunks(problem):
        ev.lower(st, chunk).compile()
    return len(phases)


__all__ = ["warm"]
