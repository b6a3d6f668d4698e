"""The test metrics of a run's state over the whole test set: one jitted program per problem
(the trainer's model view and the model's eval function, vmapped over seeds when there are
several), applied to chunks of ``EVAL_CHUNK`` examples and weighted by their sizes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from cconv.experiments.build import Problem

EVAL_CHUNK = 1024


def make_evaluator(problem: Problem) -> Callable[[Any, dict], dict]:
    """One jitted program: the trainer's model view (``trainer.params`` / ``model_state``) and the
    test metrics on a chunk, vmapped over seeds when there are several.  Call it with a state
    whose static step is 0 (other steps are other pytree structures).

    Built with XLA's defaults even where the trainer's programs are built otherwise (the advisor's
    probes' fast build, ``cconv.advisor.probes.FAST_BUILD``): it is built once and runs at every
    metric line -- every step of a probe whose first rung is short.  On the advise validation's
    text task one evaluation (3 seeds) took 108-120 ms fast-built, 41-45 ms so, for 0.2 s more
    of building (docs/advise.md)."""
    trainer, eval_fn = problem.trainer, problem.eval_fn
    multi = len(problem.seeds) > 1

    def ev(state, chunk):
        params, mstate = trainer.params(state), trainer.model_state(state)
        if multi:
            return jax.vmap(eval_fn, in_axes=(0, 0, None))(params, mstate, chunk)
        return eval_fn(params, mstate, chunk)

    return trainer.launcher.jit(ev, compiler_options=None)  # XLA's defaults (docstring)


_EVALUATORS: dict[int, tuple] = {}  # id(problem) -> (problem, evaluator): a run resumed in-process compiles once


def evaluator_of(problem: Problem) -> Callable[[Any, dict], dict]:
    """``make_evaluator(problem)``, made once per problem object (the advisor pauses and resumes a
    probe several times in one process; each new jit of the evaluator would compile again)."""
    hit = _EVALUATORS.get(id(problem))
    if hit is None or hit[0] is not problem:
        if len(_EVALUATORS) >= 32:
            _EVALUATORS.pop(next(iter(_EVALUATORS)))
        hit = _EVALUATORS[id(problem)] = (problem, make_evaluator(problem))
    return hit[1]


def evaluate(problem: Problem, state: Any) -> list[dict]:
    """Test metrics (``test_<metric>``) of ``state`` over the whole test set (chunks, weighted by
    size), one dict per seed."""
    evaluator = evaluator_of(problem)
    test = problem.ds.test
    n = len(test["y"])
    S = len(problem.seeds)
    sums: list[dict] = [dict() for _ in range(S)]
    st = state.replace(step=0)
    for i in range(0, n, EVAL_CHUNK):
        chunk = {k: v[i : i + EVAL_CHUNK] for k, v in test.items()}
        m = jax.device_get(evaluator(st, chunk))
        w = len(chunk["y"])
        for k, v in m.items():
            v = np.asarray(v, np.float64).reshape(S)
            for j in range(S):
                sums[j][k] = sums[j].get(k, 0.0) + float(v[j]) * w
    return [{f"test_{k}": v / n for k, v in d.items()} for d in sums]
