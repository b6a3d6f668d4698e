"""Probes: each candidate's full-length run, trained a piece at a time as the race asks.

A probe is an ordinary run of ``cconv.experiments.runner`` (``execute``: metrics.jsonl,
checkpoints, resume) whose config is the *full* run's -- ``steps`` = the config's steps -- trained
to the step the race asks for and paused there (``execute(pause_at=...)``: checkpointed, status
``paused``).  A survivor continues from its checkpoint; nothing is retrained, an interrupted
``cconv advise`` resumes its probes, and a probe's curve is exactly the first steps of the run the
user would start.  Its config is the user's with the candidate's keys set and:

* ``workers`` = the target cluster's workers (the global ``batch_size`` kept), ``launcher: vmap``:
  every worker on one device, the seeds vmapped on top (``build(seeds=S)``), so one compiled
  program trains all of a candidate's workers and seeds;
* ``seed`` = ``[seed, seed + 1, ...]`` (``seeds`` of them), ``log_every`` from the race's first
  rung (enough points to fit a curve there);
* a sweep file's ``rules:`` applied (``cconv.experiments.sweep.apply_rules``), and ``ef_scale: auto``
  where error feedback runs around an unbiased compressor and the config sets no scale (plain EF
  can diverge there: ``cconv.experiments.build.ErrorFeedbackWarning``);
* no network, wandb, TensorBoard: the advisor's timing model is ``cconv.advisor.steptime``.

Candidates differ in compressor and synchronization, i.e. in program structure: each is built
once (``build.problem``; the same Problem serves timing and every piece of training).  On CPU its
programs are built without LLVM's optimisation passes and with XLA's elemental emitters
(``FAST_BUILD``): a probe trains a few hundred steps at most, and XLA:CPU spends most of a small
model's build there, so the quicker build costs less than the slower steps it runs (measured in
docs/advise.md, with the case where it is closer: expensive steps).  The
computation is the same, up to floating-point rounding: a probe's curve is the user's run's, not
its bits.  Elsewhere (GPU, TPU) the default build: there the program's speed matters more.
"""

from __future__ import annotations

import math
import os
import re
from typing import NamedTuple

import jax
import numpy as np

from cconv.advisor.extrapolate import Curve
from cconv.advisor.space import Candidate
from cconv.experiments.build import Problem
from cconv.experiments.config import RunConfig

# XLA:CPU options: LLVM at -O0 without its expensive passes, and XLA's older elemental emitters for
# fusions (quicker to build than the fusion emitters); measured in docs/advise.md
FAST_BUILD = {
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
    "xla_cpu_use_fusion_emitters": False,
}


_ACCEPTED: dict[tuple, dict] = {}  # FAST_BUILD's items -> those this jaxlib accepts (asked once)


def compiler_options() -> dict | None:
    """XLA options for a probe's programs on this process's backend (module docstring): those of
    ``FAST_BUILD`` this jaxlib's XLA accepts (an option another XLA no longer knows is left out,
    never an error: the build is then only slower)."""
    if jax.default_backend() != "cpu":
        return None
    items = tuple(FAST_BUILD.items())
    if items not in _ACCEPTED:
        _ACCEPTED[items] = _accepted(dict(items))
    return _ACCEPTED[items] or None


def _accepted(options: dict) -> dict:
    def builds(opts: dict) -> bool:
        try:
            jax.jit(lambda x: x + 1, compiler_options=opts).lower(np.float32(0)).compile()
        except Exception:  # noqa: BLE001 - XLA's error for an unknown option has no type of its own
            return False
        return True

    return options if builds(options) else {k: v for k, v in options.items() if builds({k: v})}


class Probe(NamedTuple):
    """A candidate's run: its config, built problem and run directory."""

    candidate: Candidate
    cfg: RunConfig
    problem: Problem
    run_dir: str


class Progress(NamedTuple):
    """A probe's state after a piece of training: its metric lines, status and steps trained."""

    lines: list
    status: str  # paused | completed | diverged
    steps: int
    diverged: str | None = None  # the divergence rule's reason (``cconv.experiments.divergence``)

    def curve(self, seeds: list, metric: str) -> Curve:
        """The learning curve of ``metric`` (seeds x logged steps; NaN after a seed diverged)."""
        steps = sorted({ln["step"] for ln in self.lines})
        vals = np.full((len(seeds), len(steps)), np.nan)
        col = {s: j for j, s in enumerate(steps)}
        for ln in self.lines:
            v = ln.get(metric)
            if ln.get("seed") in seeds and isinstance(v, (int, float)):
                vals[seeds.index(ln["seed"]), col[ln["step"]]] = v
        return Curve(np.asarray(steps, np.float64), vals)

    def bytes_per_step(self, seed: int) -> float:
        """Bytes sent + received per worker per step (mean so far, one seed)."""
        mine = [ln for ln in self.lines if ln.get("seed") == seed and "cum_bytes" in ln]
        if not mine:
            return math.nan
        end = max(mine, key=lambda ln: ln["step"])
        return end["cum_bytes"] / max(end["step"], 1)


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=-]+", "_", name).strip("_")[:80] or "run"


def probe_config(
    base: RunConfig, cand: Candidate, seeds: int, workers: int, log_every: int, rules: tuple = ()
) -> RunConfig:
    """The RunConfig of one candidate's run (module docstring); a one-line ValueError when the
    loader or the engine refuses the combination."""
    from cconv.experiments.build import check_names
    from cconv.experiments.config import from_dict
    from cconv.experiments.sweep import apply_rules

    raw = base.to_dict()
    raw.update(cand.overrides)
    s0 = base.seeds()[0]
    raw.update(
        workers=workers,
        launcher="vmap",
        seed=list(range(s0, s0 + seeds)) if seeds > 1 else s0,
        log_every=log_every,
        checkpoint_every=base.steps,
        network=None,
        schedule=None,
        servers=None,
        wandb=False,
        tensorboard=False,
        advise=None,
    )
    apply_rules(raw, list(rules))
    if raw.get("memory") == "ef" and raw.get("ef_scale") is None:
        raw["ef_scale"] = "auto"  # 1/(1 + omega) around an unbiased compressor, 1 around the others
    cfg = from_dict(raw, source=f"candidate {cand.name}")
    check_names(cfg)
    return cfg


def new_problem(cfg: RunConfig, like: Problem | None = None) -> Problem:
    """A probe's Problem (``build.problem``): its programs built as ``compiler_options`` says, on
    the launcher's default devices in one process; across the processes of a measured run
    (``cconv.advisor.steptime.leads``) on this process's first device, so that process 0 races alone."""
    from cconv.experiments.build import problem

    devices = jax.local_devices()[:1] if jax.process_count() > 1 else None
    return problem(cfg, compiler_options(), like=like, devices=devices)


def build(
    cfg: RunConfig, cand: Candidate, run_dir: str, problem: Problem | None = None, like: Problem | None = None
) -> Probe:
    """The candidate's Problem, built once (data, model, compiled trainer on first use); ``like``:
    another candidate's, whose data set and initial models it shares (``build.problem``)."""
    return Probe(cand, cfg, problem if problem is not None else new_problem(cfg, like), run_dir)


def train_to(probe: Probe, steps: int) -> Progress:
    """Train (or resume) ``probe`` to ``steps`` and pause there (the run ends instead at its
    last step, or when every seed diverged)."""
    from cconv.experiments import io, runner

    steps = min(int(steps), probe.cfg.steps)
    prior = io.read_summary(probe.run_dir) if io.check_entry(probe.run_dir, want_dir=True) else None
    if prior and prior.get("status") == "paused" and prior.get("step", 0) >= steps:  # an earlier advise got there
        res = runner.RunResult("paused", prior, trained=False)
        return _progress(probe, res)
    res = runner.execute(
        probe.cfg,
        probe.run_dir,
        problem=probe.problem,
        desc=probe.candidate.name,
        nested=True,
        pause_at=steps if steps < probe.cfg.steps else None,
    )
    return _progress(probe, res)


def _progress(probe: Probe, res) -> Progress:
    """The probe's lines and status after ``res`` (a ``runner.RunResult``)."""
    from cconv.experiments import io

    lines = io.read_jsonl(os.path.join(probe.run_dir, io.METRICS))
    s = res.summary or {}
    done = max((ln["step"] for ln in lines), default=0)
    if res.status == "paused":
        whys = s.get("diverged_why") or []
    else:
        per_seed = (s.get("per_seed") or {}).values()
        whys = [v.get("diverged_why") or (v.get("status") == "diverged" and "non-finite loss") for v in per_seed]
    why = "; ".join(f"seed {probe.problem.seeds[i]}: {w}" for i, w in enumerate(whys) if w) or None
    return Progress(lines, res.status, int(s.get("step", done) or done), why)
