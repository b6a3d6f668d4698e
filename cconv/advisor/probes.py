"""Probes: each candidate trained for a fraction of the step budget, several seeds as one program.

A probe is an ordinary run of ``cconv.experiments.runner`` (``execute``: metrics.jsonl,
checkpoints, resume), so an interrupted ``cconv advise`` resumes its probes and a finished probe is
never trained twice.  Its config is the user's with the candidate's keys set and:

* ``workers`` = the target cluster's workers (the global ``batch_size`` kept), ``launcher: vmap``:
  every worker on one device, the seeds vmapped on top (``build(seeds=S)``), so one compiled
  program trains all of a candidate's workers and seeds;
* ``seed`` = ``[seed, seed + 1, ...]`` (``seeds`` of them), ``steps`` = the probe's steps,
  ``log_every`` so the probe logs ``POINTS`` metric lines (the test set evaluated at each);
* the learning-rate schedule keeps the full run's length (its ``decay_steps`` / ``transition_steps``
  set from the config's ``steps``), so a probe is the first steps of the full run, not a
  compressed copy of it;
* no network, wandb, TensorBoard: the advisor's timing model is ``cconv.advisor.timing``.

Candidates differ in compressor and synchronization, i.e. in program structure, so they run one
after another (one compilation each); within a candidate everything runs at once.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, NamedTuple

import numpy as np

from cconv.advisor.extrapolate import Curve
from cconv.advisor.space import Candidate

POINTS = 12  # metric lines per probe


class Probe(NamedTuple):
    """A finished probe: its config, run directory, metric lines and status per seed."""

    candidate: Candidate
    cfg: Any
    run_dir: str
    lines: list
    status: str  # completed | diverged
    problem: Any  # the runner's Problem (trainer, model spec): timing reads it

    def curve(self, metric: str) -> Curve:
        """The learning curve of ``metric`` (seeds x logged steps; NaN after a seed diverged)."""
        seeds = self.cfg.seeds()
        steps = sorted({ln["step"] for ln in self.lines})
        vals = np.full((len(seeds), len(steps)), np.nan)
        col = {s: j for j, s in enumerate(steps)}
        for ln in self.lines:
            v = ln.get(metric)
            if ln.get("seed") in seeds and isinstance(v, (int, float)):
                vals[seeds.index(ln["seed"]), col[ln["step"]]] = v
        return Curve(np.asarray(steps, np.float64), vals)

    def bytes_per_step(self) -> float:
        """Bytes sent + received per worker per step (mean over the probe, first seed)."""
        last = [ln for ln in self.lines if ln.get("seed") == self.cfg.seeds()[0] and "cum_bytes" in ln]
        if not last:
            return math.nan
        end = max(last, key=lambda ln: ln["step"])
        return end["cum_bytes"] / max(end["step"], 1)


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=-]+", "_", name).strip("_") or "run"


def _schedule_length(raw: dict, full_steps: int) -> None:
    """Pin the learning-rate schedule's length to the full run's (module docstring)."""
    from cconv.experiments.build import SCHEDULE_LENGTH_ARGS
    from cconv.experiments.optax_names import SCHEDULE_ALIASES, parameters, schedule_function

    spec = raw.get("lr_schedule", "constant")
    spec = {"name": spec} if isinstance(spec, str) else dict(spec)
    spec["name"] = SCHEDULE_ALIASES.get(spec["name"], spec["name"])
    params = parameters(schedule_function(spec["name"]))
    for n in SCHEDULE_LENGTH_ARGS:
        if n in params:
            spec.setdefault(n, max(full_steps - int(raw.get("lr_warmup", 0)), 1))
            break
    raw["lr_schedule"] = spec


def probe_config(
    base: Any,
    cand: Candidate,
    steps: int,
    seeds: int,
    workers: int,
    full_steps: int | None = None,
    log_every: int | None = None,
):
    """The RunConfig of one probe (or, with ``steps = full_steps``, of one full run)."""
    from cconv.experiments.build import check_names
    from cconv.experiments.config import from_dict

    raw = base.to_dict()
    raw.update(cand.overrides)
    s0 = base.seeds()[0]
    raw.update(
        workers=workers,
        launcher="vmap",
        steps=steps,
        seed=list(range(s0, s0 + seeds)) if seeds > 1 else s0,
        log_every=log_every or max(1, steps // POINTS),
        checkpoint_every=steps,
        network=None,
        schedule=None,
        servers=None,
        wandb=False,
        tensorboard=False,
        advise=None,
    )
    if raw.get("lr_schedule", "constant") != "constant":
        _schedule_length(raw, full_steps or base.steps)
    cfg = from_dict(raw, source=f"candidate {cand.name}")
    check_names(cfg)
    return cfg


def run(cfg: Any, cand: Candidate, run_dir: str, nested: bool = True) -> Probe:
    """Train (or resume, or reuse) one probe into ``run_dir``."""
    from cconv.experiments import build, io, runner

    problem = build.problem(cfg)
    res = runner.execute(cfg, run_dir, problem=problem, desc=cand.name, nested=nested)
    lines = io.read_jsonl(os.path.join(run_dir, io.METRICS))
    return Probe(cand, cfg, run_dir, lines, res.status, problem)


def run_all(configs: list, cands: list[Candidate], out: str) -> list[Probe]:
    """Every candidate's probe, one after another under one progress bar (tqdm, on a terminal)."""
    from cconv.experiments.loggers import progress

    done = []
    with progress(len(cands), "probes", position=0, leave=True) as bar:
        for cfg, cand in zip(configs, cands):
            bar.set_postfix_str(cand.name[:40])
            done.append(run(cfg, cand, os.path.join(out, slug(cand.name))))
            bar.update(1)
    return done
