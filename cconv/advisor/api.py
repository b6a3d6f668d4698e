"""``advise``: which candidate reaches the target soonest on the cluster, raced and observed.

    validate everything (``prepare``) -> build each candidate once and time its step on the
    cluster (``steptime``) -> race them at equal simulated time (``race``: successive halving, the
    finalists to the target) within ``budget`` full dense runs of training steps -> every
    candidate's time to target, observed or predicted from its curve (``extrapolate``) -> rank,
    table, JSON, figure (``ranking``, ``figure``) -> optionally continue the top N to the config's
    full step budget and compare (``verify``).

Everything that can be wrong with the input (config, cluster, target, options, every candidate's
config, the budget) is checked by ``prepare`` before anything is written.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from cconv.advisor import extrapolate, probes, race, ranking, space, steptime
from cconv.advisor.space import Candidate, Space
from cconv.advisor.target import Target
from cconv.experiments import build
from cconv.experiments.build import Problem
from cconv.experiments.config import RunConfig
from cconv.theory.cluster import Cluster

DEFAULT_BUDGET, DEFAULT_SEEDS, POINTS = 1.0, 3, 8  # POINTS: metric lines in the race's first rung
JSON_NAME, FIGURE_NAME = "advice.json", "advice.png"
KIND = "advise"  # the kind of output directory (``io.claim_dir``)


class Plan(NamedTuple):
    """Everything resolved and validated before anything is written."""

    base: RunConfig
    source: str
    rules: tuple
    cluster: Cluster
    space: Space
    target: Target
    budget: float
    seeds: int
    candidates: list[Candidate]
    configs: list[RunConfig]  # each candidate's probe config (``probes.probe_config``), checked once
    skipped: list[tuple[str, str]]  # (candidate name, reason)
    out: str
    first: Problem  # the first (dense) candidate's built Problem: read for the target's metrics, then raced
    timing: str = "modelled"  # how a step is timed (``steptime.TIMINGS``)
    repeats: int = 0  # measured: timed real steps per phase


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
    steps: int  # the config's step budget (every candidate's longest run)
    budget: float  # the race's budget, in full dense runs of training steps
    spent: float  # what the race spent, in the same unit
    seeds: int
    rows: list
    supported: bool
    recommendation: str
    skipped: list
    rungs: list
    verify: list
    race_wall_s: float
    wall_s: float
    compile_s: float  # tracing, lowering and compiling programs, summed over the threads building them
    programs: int  # programs compiled
    outputs: dict
    build_wait_s: float = 0.0  # of wall_s: building programs, or waiting for those built ahead
    build_threads: int = 1  # threads that built programs ahead of the race
    programs_reused: int = 0  # of programs: loaded from the compilation cache, already built
    timing: str = "modelled"  # modelled | measured (``cconv.advisor.steptime``)


ConfigSource = str | os.PathLike | dict | RunConfig  # a run or sweep file, a mapping or a RunConfig


def load_config(config: ConfigSource, overrides: list | None = None) -> tuple[RunConfig, str, tuple]:
    """(RunConfig, source, sweep rules) from a run config file, a sweep file (its ``base`` and
    ``rules``), a mapping or a RunConfig."""
    from cconv.experiments.build import check_names
    from cconv.experiments.config import apply_overrides, from_dict, load_yaml

    if isinstance(config, RunConfig):
        return config, config.name or "config", ()
    rules: tuple = ()
    if isinstance(config, dict):
        raw, src = config, "config"
    else:
        raw, src = load_yaml(config), str(config)
        if isinstance(raw, dict) and "grid" in raw:  # a sweep file: advise on its base config, with its rules
            rules = tuple(raw.get("rules") or ())
            raw = raw.get("base") or {}
            if isinstance(raw, str):
                raw = load_yaml(os.path.join(os.path.dirname(os.path.abspath(src)), raw)) or {}
    cfg = from_dict(apply_overrides(raw or {}, overrides or []), source=src)
    check_names(cfg)
    return cfg, src, rules


def task_metrics(problem: Problem) -> list[str]:
    """The metrics a run of this task logs that a target can name (training loss, test metrics)."""
    import jax

    chunk = {k: v[:2] for k, v in problem.ds.test.items()}
    spec = problem.specs[0]
    out = jax.eval_shape(problem.eval_fn, spec.params, spec.model_state, chunk)
    return ["loss", *(f"test_{k}" for k in out)]


def _target_text(target: str | None, sp: Space, cfg: RunConfig) -> str:
    text = target or sp.target or (f"loss={cfg.target_loss}" if cfg.target_loss is not None else None)
    if text is None:
        raise ValueError("no target: pass --target METRIC=VALUE (e.g. test_accuracy=0.9), or set advise.target")
    return text


def _options(sp: Space, budget: float | None, seeds: int | None) -> tuple[float, int]:
    """--budget and --seeds (else the block's, else the defaults), checked by the block's rules."""
    b = budget if budget is not None else (sp.budget or DEFAULT_BUDGET)
    n = seeds if seeds is not None else (sp.seeds or DEFAULT_SEEDS)
    for key, v in (("budget", b), ("seeds", n)):
        if not space.valid_number(key, v):
            raise ValueError(f"--{key} must be {space.NUMBERS[key][1]}, got {v!r}")
    return float(b), n


def prepare(
    config: ConfigSource,
    cluster: Cluster | str,
    *,
    target: str | None = None,
    budget: float | None = None,
    seeds: int | None = None,
    out: str | None = None,
    overrides: list | None = None,
    timing: str = "modelled",
    repeats: int | None = None,
) -> Plan:
    """Validate everything (one-line ValueError) and each candidate's config; writes nothing."""
    from cconv.experiments import io
    from cconv.theory.cluster import parse as parse_cluster

    cfg, src, rules = load_config(config, overrides)
    cl = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    sp = space.parse(cfg.advise, cfg)
    repeats = steptime.check_timing(timing, repeats, sp.schedules, cl.workers)
    b, n_seeds = _options(sp, budget, seeds)
    if cfg.batch_size % cl.workers:
        raise ValueError(
            f"batch_size {cfg.batch_size} is not divisible by the cluster's {cl.workers} workers "
            f"(set batch_size to a multiple of {cl.workers})"
        )
    cands, configs, skipped = _probe_configs(cfg, sp, n_seeds, cl.workers, rules)
    need = len(cands) * race.MIN_STEPS
    if need > b * cfg.steps:
        raise ValueError(
            f"{len(cands)} candidates need at least {need} training steps ({race.MIN_STEPS} each) and --budget "
            f"{b:g} allows {b * cfg.steps:.0f} ({b:g} x {cfg.steps} steps): raise --budget to "
            f"{math.ceil(100 * need / cfg.steps) / 100:g} or fewer candidates (advise:)"
        )
    first = probes.new_problem(configs[0])  # the target's metrics now, the dense probe later
    tgt = _parse_target(_target_text(target, sp, cfg), first)
    name = os.path.splitext(os.path.basename(src))[0] if src != "config" else "config"
    out = out or os.path.join("results", "advise", name)
    io.check_creatable(out)
    check_out(out)
    return Plan(
        base=cfg,
        source=src,
        rules=rules,
        cluster=cl,
        space=sp,
        target=tgt,
        budget=b,
        seeds=n_seeds,
        candidates=cands,
        configs=configs,
        skipped=skipped,
        out=out,
        first=first,
        timing=timing,
        repeats=repeats,
    )


def _probe_configs(cfg: RunConfig, sp: Space, seeds: int, workers: int, rules: tuple) -> tuple[list, list, list]:
    """(candidates, their probe configs, (name, why) of those skipped): a candidate whose config
    the run's checks refuse is skipped, but the baseline (``space.candidates`` puts it first)."""
    cands, configs, skipped = [], [], []
    for i, c in enumerate(space.candidates(sp)):
        try:
            configs.append(probes.probe_config(cfg, c, seeds, workers, 1, rules))
        except ValueError as e:
            if i == 0:  # the baseline; another dense one (local SGD) is skipped
                raise
            skipped.append((c.name, str(e).splitlines()[0][:200]))
            continue
        cands.append(c)
    return cands, configs, skipped


def _parse_target(text: str, problem: Problem) -> Target:
    """The target against the metrics this task logs (read from the model's evaluation function
    on the data's shapes, abstractly)."""
    from cconv.advisor.target import parse

    return parse(text, task_metrics(problem))


OWN = {JSON_NAME: False, FIGURE_NAME: False, "probes": True, "verify": True}  # name -> is a directory


def check_out(out: str) -> None:
    """Refuse (one line) an output directory that holds anything but an earlier advice's files
    (a sweep's or a run's directory, a link, a foreign file): the advice's probes would otherwise
    mix with another command's results.  Reads only; follows no link."""
    from cconv.experiments import io

    if not io.check_entry(out, want_dir=True):
        return
    foreign = sorted(n for n in os.listdir(out) if n not in OWN)
    if foreign:
        shown = ", ".join(f[:40] for f in foreign[:3]) + (" ..." if len(foreign) > 3 else "")
        raise io.OutputError(
            f"--out {out} holds {shown}: not an advice directory (cconv advise writes only {', '.join(OWN)}); "
            "choose an empty or new directory"
        )
    for name, is_dir in OWN.items():
        io.check_entry(os.path.join(out, name), is_dir)


def _probe_dir(out: str, cand: Candidate) -> str:
    """``<out>/probes/<slug>``, every level a real directory cconv made (no link followed)."""
    from cconv.experiments import io

    d = io.ensure_dir(os.path.join(io.ensure_dir(out), "probes"))
    path = os.path.join(d, probes.slug(cand.name))
    io.check_entry(path, want_dir=True)
    return path


class Entrant(NamedTuple):
    """A raced candidate: its probe (built once) and its step time under each schedule."""

    probe: probes.Probe
    times: list  # steptime.StepTime per schedule

    @property
    def name(self) -> str:
        return self.probe.candidate.name

    @property
    def step_s(self) -> float:
        return min(t.step_s for t in self.times)


def _entrants(plan: Plan) -> tuple[list, list]:
    """Each candidate built once and timed on the cluster; (entrants, merged): a compressed
    candidate whose step performs exactly the dense baseline's collectives (PowerSGD on a model
    without matrices) is the same algorithm here: reported, not raced."""
    entrants, merged, profile, dense_colls = [], [], None, None
    for c, cfg in zip(plan.candidates, plan.configs, strict=True):
        first = c is plan.candidates[0]
        where = _probe_dir(plan.out, c) if steptime.leads() else ""  # another process of a measured run writes nothing
        pr = probes.build(cfg, c, where, plan.first if first else None, like=plan.first)
        profile = profile or steptime.profile_of(pr.problem)
        colls = [(k.kind, k.bytes, k.count) for k in pr.problem.trainer.collectives(0)]
        if c.dense and dense_colls is None:
            dense_colls = colls
        elif colls == dense_colls and c.overrides["compressor"]["name"] != space.DENSE and _plain_sync(c, plan):
            merged.append((c.name, "the same traffic as dense on this model (it compresses none of its tensors)"))
            continue
        times = steptime.step_times(pr.problem, plan.cluster, plan.space.schedules, profile)
        if plan.timing == "measured":  # the real step on this machine, the model beside it
            times = steptime.measured(times, steptime.measure(cfg, plan.base.launcher, plan.repeats))
        entrants.append(Entrant(pr, times))
    return entrants, merged


def _plain_sync(c: Candidate, plan: Plan) -> bool:
    """Does ``c`` run under the dense baseline's synchronization and architecture?"""
    dense = plan.candidates[0].overrides
    return all(c.overrides.get(k) == v for k, v in dense.items() if k not in ("compressor", "memory"))


def log_every(budget_steps: int, max_steps: int, arms: list) -> int:
    """Metric lines every k steps, so that the race's first rung logs ``POINTS`` lines for the
    candidate that trains the fewest steps in it."""
    t0 = race.first_time(arms, int(budget_steps * race.HALVING_SHARE), max_steps)
    fewest = min(race.steps_at(a, t0, max_steps) for a in arms)
    return max(1, fewest // POINTS)


def _with_log_every(e: Entrant, every: int) -> Entrant:
    """The entrant logging every ``every`` steps (logging only: its training is unchanged)."""
    import dataclasses

    cfg = dataclasses.replace(e.probe.cfg, log_every=every)
    return e._replace(probe=e.probe._replace(cfg=cfg, problem=e.probe.problem._replace(cfg=cfg)))


def build_threads() -> int:
    """Threads that build candidates' programs ahead of the race (one per core)."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def _warm_all(byname: dict, arms: list, plan: Plan, pool) -> dict:
    """Every entrant's first-rung programs built ahead in ``pool`` (``cconv.experiments.warm``),
    in the race's order, so the race trains one candidate while the next ones build."""
    from cconv.experiments.warm import warm

    budget, n = int(plan.budget * plan.base.steps), plan.base.steps
    t0 = race.first_time(arms, int(budget * race.HALVING_SHARE), n)
    return {a.name: pool.submit(warm, byname[a.name].probe.problem, race.steps_at(a, t0, n)) for a in arms}


TRAIN_THREADS = "cconv-train"  # the names of the threads that train a rung's candidates side by side


def side_by_side(pool) -> Callable:
    """``race.race``'s ``train``: a rung's candidates trained at once in ``pool``'s threads.  Each
    candidate's program runs single-threaded on XLA:CPU, so on a machine with several cores one
    candidate at a time leaves the others idle; the candidates are independent runs (their own
    directories, programs and keys), so the rung's results are the same in any order.  A signal
    reaches every thread's loop (``cconv.experiments.signals``: the main thread records it)."""

    def train(observe: Callable, wants: dict) -> list:
        futures = [pool.submit(observe, name, steps) for name, steps in wants.items()]
        return [f.result() for f in futures]

    return train


def run_race(plan: Plan) -> tuple[dict, list, race.Race, dict]:
    """Build, time and race every candidate: (entrants by name, merged, the race, progress by name).
    Programs are built ahead in a thread pool (XLA compiles without the interpreter lock) and each
    rung's candidates train side by side in another (``side_by_side``); a candidate whose
    ahead-of-time build fails builds in its run as usual (and fails there)."""
    from concurrent.futures import ThreadPoolExecutor

    from cconv.experiments import signals
    from cconv.experiments.compiletime import waiting

    entrants, merged = _entrants(plan)
    arms = [race.Arm(e.name, e.step_s) for e in entrants]
    every = log_every(int(plan.budget * plan.base.steps), plan.base.steps, arms)
    byname = {e.name: _with_log_every(e, every) for e in entrants}
    seen: dict = {}
    pool = ThreadPoolExecutor(max_workers=build_threads(), thread_name_prefix="cconv-build")
    built = _warm_all(byname, arms, plan, pool)

    def observe(name: str, steps: int) -> race.Observation:
        e, ahead = byname[name], built.pop(name, None)
        if ahead is not None:
            with waiting():
                ahead.exception()  # wait; an error shows again (and is reported) when the run builds
        seen[name] = prog = probes.train_to(e.probe, steps)
        return race.Observation(prog.curve(e.probe.problem.seeds, plan.target.metric), prog.steps, prog.diverged)

    trainers = ThreadPoolExecutor(max_workers=build_threads(), thread_name_prefix=TRAIN_THREADS)
    try:
        with signals.deferred():
            budget = int(plan.budget * plan.base.steps)
            result = race_all(arms, observe, plan.target, plan.base.steps, budget, train=side_by_side(trainers))
    finally:
        trainers.shutdown(wait=True, cancel_futures=True)
        pool.shutdown(wait=True, cancel_futures=True)
    return byname, merged, result, seen


def _prediction(s: race.Standing, target: Target, refs: tuple, settings) -> extrapolate.Prediction:
    """A standing's steps to target: observed, or predicted from its curve (``refs``: the curves
    that ran further), or why not."""
    if s.status == "diverged":
        return extrapolate.Prediction("diverged", math.nan, math.nan, math.nan, s.diverged or "diverged")
    p = extrapolate.predict(s.curve, target, settings, refs)
    if s.status == "missed" and not p.observed:
        return extrapolate.Prediction(
            "missed", math.nan, math.nan, math.nan, f"ran all {s.steps} steps without reaching {target}"
        )
    return p


def predictions(result: race.Race, target: Target, settings=extrapolate.Settings(), only=None) -> dict:
    """Every raced candidate's steps to target (``extrapolate.Prediction``) by name (``only``:
    those named): observed when the race saw it reach the target, else predicted from its curve,
    borrowing the shapes of the curves that ran further (``extrapolate.reference``)."""
    out = {}
    for s in result.standings:
        if only is not None and s.arm.name not in only:
            continue
        refs = tuple(
            extrapolate.reference(o.curve, target)
            for o in result.standings
            if o.curve is not None and o.status != "diverged" and o.steps > s.steps
        )
        out[s.arm.name] = _prediction(s, target, refs, settings)
    return out


def revived(standings: list, target: Target, max_steps: int, settings=extrapolate.Settings()) -> list[str]:
    """``race.race``'s ``revive``: the pruned candidate the step-time test of ``ranking.leapfrog``
    puts ahead of the fastest candidate the race kept, read from every standing's curve so far
    (seen steps: observed, or the interval's slow end; ranked within ``max_steps``) -- at most one.
    Only a pruned candidate whose step is cheaper than some kept one's can pass, so only those
    curves are fitted beside the kept ones."""
    kept = {s.arm.name: s.arm.step_s for s in standings if s.curve is not None and s.status != race.PRUNED}
    dearest = max(kept.values(), default=0.0)
    cheaper = {s.arm.name for s in standings if s.status == race.PRUNED and s.arm.step_s < dearest}
    asked = set(kept) | cheaper
    preds = predictions(race.Race(standings, [], 0, 0), target, settings, only=asked)
    ok = [s for s in standings if s.arm.name in preds and preds[s.arm.name].ok and preds[s.arm.name].steps <= max_steps]
    steps = [ranking.seen_steps(preds[s.arm.name]) for s in ok]
    i = ranking.leapfrog(
        [n * s.arm.step_s for n, s in zip(steps, ok, strict=True)],
        steps,
        [s.arm.step_s for s in ok],
        [s.status == race.PRUNED for s in ok],
    )
    return [] if i is None else [ok[i].arm.name]


def race_all(
    arms: list,
    observe: Callable[[str, int], race.Observation],
    target: Target,
    max_steps: int,
    budget: int,
    train: Callable = race.one_by_one,
) -> race.Race:
    """The whole race of ``cconv advise`` (and of its validation's replays): successive halving,
    each rung's survivors joined by the candidate ``revived`` beside them, then the finalists, then
    what the budget leaves (``spend_left``)."""
    revive = lambda standings: revived(standings, target, max_steps)  # noqa: E731
    result = race.race(arms, observe, target, max_steps, budget, train=train, revive=revive)
    return spend_left(result, observe, target, max_steps, train=train)


def spend_left(
    result: race.Race,
    observe: Callable[[str, int], race.Observation],
    target: Target,
    max_steps: int,
    train: Callable = race.one_by_one,
) -> race.Race:
    """What the race left of its budget (``race.refine``): first to the pruned candidates it
    cannot rank yet (``unranked``), then what is still left to every pruned candidate, so the
    ones ranked from the shortest curves are read from longer ones (a short curve's fast start
    can hide that it rises or stalls later).  Never past the budget."""
    for names in (lambda r: unranked(r, target, max_steps), pruned):
        if result.spent >= result.budget:  # else no curve need be fitted to choose whom to refine
            break
        result = race.refine(result, names(result), observe, target, max_steps, train=train)
    return result


def pruned(result: race.Race) -> list[str]:
    """The candidates the race pruned (in the race's order)."""
    return [s.arm.name for s in result.standings if s.status == race.PRUNED]


def unranked(result: race.Race, target: Target, max_steps: int, settings=extrapolate.Settings()) -> list[str]:
    """The pruned candidates whose curves give no time to target within ``max_steps`` steps yet
    (no prediction, or one past the step budget): those ``race.refine`` trains on."""
    pruned = {s.arm.name for s in result.standings if s.status == race.PRUNED}
    preds = predictions(result, target, settings, only=pruned)
    return [n for n, p in preds.items() if not (p.ok and p.steps <= max_steps)]


def evaluate(plan: Plan, byname: dict, result: race.Race, seen: dict, settings=extrapolate.Settings()) -> list:
    """Ranked rows (``report.rank``): one per raced candidate and schedule."""
    preds = predictions(result, plan.target, settings)
    rows = []
    for s in result.standings:
        e, p = byname[s.arm.name], preds[s.arm.name]
        final = math.nan
        if s.curve is not None:
            final = extrapolate.metric_at(s.curve, plan.target, plan.base.steps, settings)
        bps = seen[s.arm.name].bytes_per_step(e.probe.problem.seeds[0]) if s.arm.name in seen else math.nan
        lr = lr_factor(e.probe.cfg, s.steps, p.hi) if p.ok and not p.observed else 1.0  # once per candidate
        for st in e.times:
            rows.append(
                ranking.Row(
                    candidate=e.name,
                    overrides=e.probe.candidate.overrides,
                    schedule=st.schedule,
                    prediction=p,
                    step=st,
                    bytes_per_step=bps,
                    final_metric=final,
                    race=s.status,
                    steps_trained=s.steps,
                    lr_factor=lr,
                )
            )
    return ranking.rank(rows, plan.base.steps, plan.candidates[0].name)


def lr_factor(cfg: RunConfig, trained: int, until: float) -> float:
    """How far the learning rate moves past a curve's end: the largest ratio, either way, between
    the rate of the curve's last step (``trained``) and the rate of a step ahead, up to ``until``
    (a prediction's slow end, at most the step budget): 10.0 for a decay by 10 (or a warm-up to 10x)
    ahead, 1.0 when it stays, NaN for a schedule that cannot be vmapped.  A curve shows nothing of
    a change it has not reached (``ranking``'s ``lr-change`` flag)."""
    end = int(min(math.ceil(until), cfg.steps))
    if trained < 1 or end <= trained:
        return 1.0
    every = _rates(cfg)
    if every is None:  # a schedule that cannot be vmapped: no flag rather than no advice
        return math.nan
    rates = every[trained - 1 : end]
    now, lo, hi = rates[0], rates[1:].min(), rates[1:].max()
    if not now > 0:
        return math.inf if hi > 0 else 1.0
    return max(hi / now, now / lo if lo > 0 else math.inf)


_RATES: dict[str, np.ndarray | None] = {}  # a schedule's spec -> its rate at every step (``_rates``)


def _rates(cfg: RunConfig) -> np.ndarray | None:
    """The learning rate of every step 0..steps of ``cfg``'s schedule (``lr_factor``), computed
    once per schedule: the candidates of one advice share it.  Vmapped: an optax schedule is
    written for one step (some mis-broadcast over an array).  None when it cannot be vmapped."""
    import jax

    key = repr((cfg.lr, cfg.lr_schedule, cfg.lr_warmup, cfg.steps))
    if key not in _RATES:
        try:
            steps = np.arange(cfg.steps + 1, dtype=np.int32)
            _RATES[key] = np.asarray(jax.vmap(build.make_schedule(cfg))(steps), np.float64)
        except Exception:  # noqa: BLE001 - optax raises many types for a schedule it cannot vectorise
            _RATES[key] = None
    return _RATES[key]


def verify(plan: Plan, byname: dict, rows: list, n: int) -> list:
    """Continue the top ``n`` ranked candidates to the config's full step budget; predicted vs
    actual steps to target (an observed row is its own check)."""
    from cconv.advisor.extrapolate import first_crossing

    top, done = [], set()
    for r in rows:
        if r.rank and r.candidate not in done:
            done.add(r.candidate)
            top.append(r)
    out = []
    for r in top[:n]:
        e = byname[r.candidate]
        prog = probes.train_to(e.probe, plan.base.steps)
        curve = prog.curve(e.probe.problem.seeds, plan.target.metric)
        hit = first_crossing(curve.steps, curve.values.mean(0), plan.target)
        actual = hit[0] if hit is not None else math.nan
        p = r.prediction
        inside, where = bool(p.lo <= actual <= p.hi), e.probe.run_dir
        out.append(
            VerifyRow(
                candidate=r.candidate, predicted=p.steps, lo=p.lo, hi=p.hi, actual=actual, inside=inside, run_dir=where
            )
        )
    return out


def _figure(plan: Plan, rows: list, outputs: dict) -> None:
    """advice.png (written atomically, no link followed); a stale one is removed when nothing is
    ranked, so the directory never pairs a new advice.json with an old figure."""
    from cconv.advisor import figure
    from cconv.experiments import io

    path = os.path.join(plan.out, FIGURE_NAME)
    if any(r.rank for r in rows):
        title = f"{os.path.basename(plan.source)}: {plan.target} on {plan.cluster.name} (raced, budget {plan.budget:g})"
        png = figure.png(rows, plan.target.metric, plan.target.kind.higher, title, plan.candidates[0].name)
        io.atomic_write_bytes(path, png)
        outputs["figure"] = path
    elif io.check_entry(path):
        os.unlink(path)


def _where(plan: Plan) -> str:
    """The cluster, and for measured timing the machine the steps ran on."""
    return plan.cluster.name + (f" ({steptime.measured_on()})" if plan.timing == "measured" else "")


def _advice(
    plan: Plan, result, rows: list, said: tuple, merged: list, checks: list, outputs: dict, built, walls
) -> Advice:
    """The record of a finished race (``advise``); ``walls``: the race's and the whole command's seconds."""
    ok, line = said
    return Advice(
        config=plan.source,
        cluster=_where(plan),
        target=str(plan.target),
        workers=plan.cluster.workers,
        steps=plan.base.steps,
        budget=plan.budget,
        spent=result.spent / plan.base.steps,
        seeds=plan.seeds,
        rows=rows,
        supported=ok,
        recommendation=line,
        skipped=plan.skipped + merged,
        rungs=[r._asdict() for r in result.rungs],
        verify=checks,
        race_wall_s=walls[0],
        wall_s=walls[1],
        compile_s=built.seconds,
        programs=built.programs,
        build_wait_s=built.blocked,
        build_threads=build_threads(),
        programs_reused=built.shared,
        outputs=outputs,
        timing=plan.timing,
    )


# imported by the race's first checkpoint (in a thread that trains) and its first curve fit (scipy's
# least squares: cconv.advisor.curves, on the race's thread, between two rungs)
AHEAD = ("orbax.checkpoint", "scipy.optimize")
AHEAD_FIGURE = ("matplotlib.figure", "matplotlib.backends.backend_agg", "matplotlib.ticker", "matplotlib.lines")


def _import_ahead(figure: bool) -> None:
    """Import in a daemon thread what the race's first checkpoint, its first curve fit and the
    figure import later: on the critical path they cost about 0.8 s (orbax), 0.3 s (scipy.optimize)
    and 0.4 s (matplotlib) of interpreter time, several times that while programs build beside them;
    ahead, they overlap the data set's loading and the programs' builds.  Python's import lock
    makes a module imported once, by whichever thread comes first; an import that fails here fails
    again, with its error, where it is needed."""
    import importlib
    import threading

    def run() -> None:
        for name in AHEAD + (AHEAD_FIGURE if figure else ()):
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - reported where the module is needed
                return

    threading.Thread(target=run, name="cconv-import-ahead", daemon=True).start()


def advise(
    config: ConfigSource,
    cluster: Cluster | str,
    *,
    target: str | None = None,
    budget: float | None = None,
    seeds: int | None = None,
    verify_top: int = 0,
    out: str | None = None,
    overrides: list | None = None,
    figure: bool = True,
    timing: str = "modelled",
    repeats: int | None = None,
) -> Advice | None:
    """Race, predict, rank (module docstring).  ``cluster``: a ``cconv.theory.cluster.Cluster`` or
    ``"NODESxGPUS"``; ``timing``: modelled on the cluster or measured here (``repeats`` steps per
    phase; ``cconv.advisor.steptime``).  Writes ``<out>/probes/``, ``advice.json`` and ``advice.png``.
    Measured across the processes of ``jax.distributed`` (``cconv.distributed.initialize`` before
    jax starts: the command started by srun or mpirun), every process times each candidate's step
    with the others, process 0 alone races, writes and returns the advice, the others None."""
    from cconv.experiments import io
    from cconv.experiments.compiletime import CompileMeter, shared_programs

    t0 = time.perf_counter()
    _import_ahead(figure)
    kw = dict(target=target, budget=budget, seeds=seeds, out=out, overrides=overrides, timing=timing)
    with shared_programs(), CompileMeter(also=TRAIN_THREADS) as built:
        plan = prepare(config, cluster, repeats=repeats, **kw)
        if not steptime.leads():  # a measured run across processes: this one helps time the steps, no more
            _entrants(plan)
            return None
        byname, merged, result, seen = run_race(plan)
        race_wall = time.perf_counter() - t0
        rows = evaluate(plan, byname, result, seen)
        where = _where(plan)
        ok, line = ranking.recommendation(rows, str(plan.target), where, plan.base.steps)
        outputs = {"json": os.path.join(plan.out, JSON_NAME)}
        if figure:
            _figure(plan, rows, outputs)
        checks = verify(plan, byname, rows, verify_top) if verify_top else []
    advice = _advice(
        plan, result, rows, (ok, line), merged, checks, outputs, built, (race_wall, time.perf_counter() - t0)
    )
    io.atomic_write_text(outputs["json"], ranking.dumps(advice))
    return advice
