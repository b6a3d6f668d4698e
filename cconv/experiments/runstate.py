"""A run's state at a step, as its checkpoints keep it: the trainer's state, the running
``Counters``, the batchers' positions, the synchronization mode's host state and the simulated
clock's calibration.  ``save`` writes it, ``restore`` reads the latest checkpoint back (a damaged
one falls back to the previous, with a ``io.RecoveryWarning``), ``initial_state`` starts it."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from cconv.experiments import io
from cconv.experiments.build import Problem
from cconv.experiments.checkpoint import Checkpointer, CheckpointError, decode_host_state, encode_host_state
from cconv.experiments.clock import Measured, SimClock
from cconv.experiments.counters import Counters


def _stack(trees: list) -> Any:
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def initial_state(problem: Problem) -> Any:
    """The trainer's initial state; several seeds: one initial model per seed on the leading axis
    (the engine's ``build(seeds=S)`` program, whose state, batch and keys carry a seed axis)."""
    trainer = problem.trainer
    if len(problem.seeds) > 1:
        return trainer.init(
            params=_stack([sp.params for sp in problem.specs]),
            model_state=_stack([sp.model_state for sp in problem.specs]),
        )
    return trainer.init()


def restore(problem: Problem, ckpt: Checkpointer, state: Any) -> tuple[int, Any, Counters]:
    """(first step, state, counters): from the latest checkpoint (the batchers' positions
    restored), or fresh.  Touches no metric line: the runner cuts metrics.jsonl back to the first
    step once the restart is known to proceed."""
    template = state
    while True:
        latest = ckpt.latest_step()
        if latest is None:
            return 0, template, Counters.fresh(len(problem.seeds))
        try:
            start, state, meta = ckpt.restore(template, latest)
            counters = Counters.from_dict(meta["counters"])
            host = [decode_host_state(st) for st in meta["batchers"]]
        except Exception as e:  # noqa: BLE001 - orbax/tensorstore/json errors of a damaged checkpoint
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip()
            older = [s for s in ckpt.all_steps() if s < latest]
            if not older:
                raise CheckpointError(
                    f"checkpoint {ckpt.path(latest)} cannot be restored ({why}); remove that directory "
                    f"to restart the run from step 0 (metrics.jsonl is cut back to match)"
                ) from e
            import warnings

            moved = ckpt.set_aside(latest)
            warnings.warn(
                f"checkpoint {ckpt.path(latest)} cannot be restored ({why}); moved to {moved}, "
                f"resuming from step {older[-1]}",
                io.RecoveryWarning,
                stacklevel=2,
            )
            continue
        break
    state = state.replace(step=start)  # the step counter is static metadata, not a leaf
    problem.trainer.load_host_state(meta.get("sync_host"))  # e.g. AdaComm's period
    for b, st in zip(problem.batchers, host):
        b.load_state_dict(st)
    return start, state, counters


def save(problem: Problem, ckpt: Checkpointer, step: int, state: Any, counters: Counters) -> None:
    ckpt.save(
        step,
        state,
        {
            "counters": counters.to_dict(),
            "batchers": [encode_host_state(b.state_dict()) for b in problem.batchers],
            **({"sync_host": h} if (h := problem.trainer.host_state()) is not None else {}),
        },
    )


def make_clock(problem: Problem, counters: Counters, start: int) -> SimClock | None:
    """The simulated clock when the config names networks (its calibration is kept in, and on
    resume taken from, ``counters``); measured here, before the wall clock starts."""
    cfg = problem.cfg
    if not cfg.networks():
        return None
    calib = Measured(problem, counters.calibration)
    counters.calibration = calib.data
    clock = SimClock(cfg, problem.trainer, calib)
    if counters.sim is None:
        counters.sim = [[0.0] * len(clock.nets) for _ in problem.seeds]
    clock.step_times(start)
    return clock
