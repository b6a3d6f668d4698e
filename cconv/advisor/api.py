"""``advise``: which candidate reaches the target soonest on the cluster, predicted from probes.

    probe every candidate (``probes``) -> steps to target (``extrapolate``)
    -> seconds per step on the cluster (``timing``) -> rank, table, JSON, figure (``report``,
    ``figure``) -> optionally train the top N to the target and compare (``verify``).

Everything that can be wrong with the input (config, cluster, target, options, every candidate's
config) is checked by ``prepare`` before anything is written.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, NamedTuple

from cconv.advisor import extrapolate as X
from cconv.advisor import probes as PR
from cconv.advisor import report as R
from cconv.advisor import space as SP
from cconv.advisor import target as T
from cconv.advisor import timing as TM

DEFAULT_PROBE, DEFAULT_SEEDS, MIN_PROBE_STEPS = 0.1, 3, 8
JSON_NAME, FIGURE_NAME = "advice.json", "advice.png"


class Plan(NamedTuple):
    """Everything resolved and validated before anything is written."""

    base: Any  # RunConfig
    source: str
    cluster: Any  # cconv.theory.cluster.Cluster
    space: SP.Space
    target: T.Target
    probe: float
    probe_steps: int
    seeds: int
    candidates: list
    configs: list
    skipped: list  # (candidate name, reason)
    out: str


class VerifyRow(NamedTuple):
    candidate: str
    predicted: float
    lo: float
    hi: float
    actual: float  # steps to target of the full run's seed mean (NaN: not reached in the budget)
    inside: bool
    run_dir: str


class Advice(NamedTuple):
    """The result of ``advise`` (``report`` explains the rows' fields)."""

    config: str
    cluster: str
    target: str
    workers: int
    budget: int
    probe_steps: int
    seeds: int
    rows: list
    supported: bool
    recommendation: str
    skipped: list
    verify: list
    probe_wall_s: float
    wall_s: float
    outputs: dict


def load_config(config: Any, overrides: list | None = None):
    """(RunConfig, source) from a run config file, a sweep file (its ``base``), a mapping or a RunConfig."""
    from cconv.experiments import config as CF
    from cconv.experiments.build import check_names

    if isinstance(config, CF.RunConfig):
        return config, config.name or "config"
    if isinstance(config, dict):
        raw, src = config, "config"
    else:
        raw, src = CF.load_yaml(config), str(config)
        if isinstance(raw, dict) and "grid" in raw:  # a sweep file: advise on its base config
            raw = raw.get("base") or {}
            if isinstance(raw, str):
                raw = CF.load_yaml(os.path.join(os.path.dirname(os.path.abspath(src)), raw)) or {}
    cfg = CF.from_dict(CF.apply_overrides(raw or {}, overrides or []), source=src)
    check_names(cfg)
    return cfg, src


def task_metrics(problem: Any) -> list[str]:
    """The metrics a run of this task logs that a target can name (training loss, test metrics)."""
    import jax

    chunk = {k: v[:2] for k, v in problem.ds.test.items()}
    spec = problem.specs[0]
    out = jax.eval_shape(problem.eval_fn, spec.params, spec.model_state, chunk)
    return ["loss", *(f"test_{k}" for k in out)]


def _target_text(target: str | None, space: SP.Space, cfg: Any) -> str:
    text = target or space.target or (f"loss={cfg.target_loss}" if cfg.target_loss is not None else None)
    if text is None:
        raise ValueError("no target: pass --target METRIC=VALUE (e.g. test_accuracy=0.9), or set advise.target")
    return text


def _cluster(cluster: Any):
    from cconv.theory import cluster as CL

    return CL.parse(cluster) if isinstance(cluster, str) else cluster


def prepare(config, cluster, *, target=None, probe=None, seeds=None, out=None, overrides=None) -> Plan:
    """Validate everything (one-line ValueError) and build every probe's config; writes nothing."""
    from cconv.experiments import build, io

    cfg, src = load_config(config, overrides)
    cl = _cluster(cluster)
    space = SP.parse(cfg.advise, cfg)
    frac = probe if probe is not None else (space.probe or DEFAULT_PROBE)
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1:
        raise ValueError(f"--probe must be a fraction in (0, 1], got {frac!r}")
    n_seeds = seeds if seeds is not None else (space.seeds or DEFAULT_SEEDS)
    if isinstance(n_seeds, bool) or not isinstance(n_seeds, int) or n_seeds < 1:
        raise ValueError(f"--seeds must be an integer >= 1, got {n_seeds!r}")
    if cfg.batch_size % cl.workers:
        raise ValueError(
            f"batch_size {cfg.batch_size} is not divisible by the cluster's {cl.workers} workers "
            f"(set batch_size to a multiple of {cl.workers})"
        )
    steps = int(round(frac * cfg.steps))
    if steps < MIN_PROBE_STEPS:
        raise ValueError(f"a probe of {steps} steps ({frac:g} x {cfg.steps}) is too short; it needs {MIN_PROBE_STEPS}")
    cands, configs, skipped = [], [], []
    for c in SP.candidates(space):
        try:
            configs.append(PR.probe_config(cfg, c, steps, n_seeds, cl.workers))
            cands.append(c)
        except ValueError as e:
            if c.dense:
                raise
            skipped.append((c.name, str(e).splitlines()[0]))
    tgt = T.parse(_target_text(target, space, cfg), task_metrics(build.problem(configs[0])))
    name = os.path.splitext(os.path.basename(src))[0] if src != "config" else "config"
    out = out or os.path.join("results", "advise", name)
    io.check_creatable(out)
    return Plan(cfg, src, cl, space, tgt, float(frac), steps, n_seeds, cands, configs, skipped, out)


def evaluate(plan: Plan, probes: list, settings: X.Settings = X.Settings()) -> list:
    """Ranked rows (``report.rank``) from the finished probes."""
    profile = TM.profile_of(probes[0].problem)
    rows = []
    for pr in probes:
        curve = pr.curve(plan.target.metric)
        pred = X.predict(curve, plan.target, settings)
        final = X.metric_at(curve, plan.target, plan.base.steps, settings)
        for st in TM.step_times(pr.problem, plan.cluster, plan.space.schedules, profile):
            rows.append(
                R.Row(pr.candidate.name, pr.candidate.overrides, st.schedule, pred, st, pr.bytes_per_step(), final)
            )
    return R.rank(rows, plan.base.steps, plan.candidates[0].name)


def verify(plan: Plan, rows: list, n: int) -> list:
    """Train the top ``n`` ranked candidates for the full budget; predicted vs actual steps."""
    top, seen = [], set()
    for r in rows:
        if r.rank and r.candidate not in seen:
            seen.add(r.candidate)
            top.append(r)
    out = []
    for r in top[:n]:
        cand = next(c for c in plan.candidates if c.name == r.candidate)
        log_every = plan.configs[plan.candidates.index(cand)].log_every
        cfg = PR.probe_config(plan.base, cand, plan.base.steps, plan.seeds, plan.cluster.workers, log_every=log_every)
        pr = PR.run(cfg, cand, os.path.join(plan.out, "verify", PR.slug(cand.name)))
        curve = pr.curve(plan.target.metric)
        hit = X.first_crossing(curve.steps, curve.values.mean(0), plan.target)
        actual = hit[0] if hit is not None else math.nan
        p = r.prediction
        out.append(VerifyRow(r.candidate, p.steps, p.lo, p.hi, actual, bool(p.lo <= actual <= p.hi), pr.run_dir))
    return out


def advise(
    config: Any,
    cluster: Any,
    *,
    target: str | None = None,
    probe: float | None = None,
    seeds: int | None = None,
    verify_top: int = 0,
    out: str | None = None,
    overrides: list | None = None,
    figure: bool = True,
) -> Advice:
    """Probe, predict, rank (module docstring).  ``cluster``: a ``cconv.theory.cluster.Cluster`` or
    ``"NODESxGPUS"``.  Writes ``<out>/probes/``, ``advice.json`` and ``advice.png``."""
    t0 = time.perf_counter()
    plan = prepare(config, cluster, target=target, probe=probe, seeds=seeds, out=out, overrides=overrides)
    probes = PR.run_all(plan.configs, plan.candidates, os.path.join(plan.out, "probes"))
    probe_wall = time.perf_counter() - t0
    rows = evaluate(plan, probes)
    ok, line = R.recommendation(rows, str(plan.target), plan.cluster.name, plan.candidates[0].name)
    outputs = {"json": os.path.join(plan.out, JSON_NAME)}
    if figure and any(r.rank for r in rows):
        from cconv.advisor import figure as F

        src = os.path.basename(plan.source)
        title = f"{src}: {plan.target} on {plan.cluster.name} (probes {plan.probe:g} of {plan.base.steps} steps)"
        outputs["figure"] = F.plot(
            rows, plan.target.metric, plan.target.kind.higher, title, os.path.join(plan.out, FIGURE_NAME)
        )
    checks = verify(plan, rows, verify_top) if verify_top else []
    advice = Advice(
        plan.source,
        plan.cluster.name,
        str(plan.target),
        plan.cluster.workers,
        plan.base.steps,
        plan.probe_steps,
        plan.seeds,
        rows,
        ok,
        line,
        plan.skipped,
        checks,
        probe_wall,
        time.perf_counter() - t0,
        outputs,
    )
    from cconv.experiments import io

    io.atomic_write_text(outputs["json"], R.dumps(advice))
    return advice
