"""Validate ``cconv advise`` against full runs on eight tasks whose learning curves differ in shape.

For every task, each of 8 candidates is trained for the config's full step budget with 3 seeds
(vmapped, as the advisor trains them) and a metric line at every step: the ground truth, cached
under ``--out``.  Each candidate's seconds per step on the target cluster come from the advisor's
own timing (``cconv.advisor.steptime``), measured once and cached with the runs.

The advisor's race (``cconv.advisor.race``) is then replayed on those runs: a race's probe *is*
the first steps of the full run (the same config, seeds and batches; the advisor pauses and
resumes it), so ``observe`` reads the full run's curve up to the step asked, at the metric-line
interval the advisor would use.  Its predictions (``cconv.advisor.api.predictions``) are scored
against the full runs:

* Kendall tau between the advisor's order (``ranking.seen_time``: observed times, predicted
  intervals' slow ends) and the actual times to target (steps x seconds per step) over all 8
  candidates (flagged or never reaching: last, tied);
* top-1 regret: actual time of the advisor's recommendation / the best actual time;
* coverage: the share of the candidates given an interval (ranked, or predicted past the step
  budget) whose actual steps to target lie in it, and the median interval width hi/lo -- over all
  of them and over the predicted (not observed) ones alone; a row whose full run never reaches the
  target is a miss when its interval ends inside the step budget (``never``), and is left out when
  the interval runs past it (the run stopped there: inside or not is unknown:
  ``scored_interval``);
* the speedup over dense of each ranked row where either time is predicted, with its interval, as
  the table prints it (``speedups``), against the full runs' speedup;
* wall time (``--wall``): ``cconv advise`` vs ``cconv run`` of one dense run, each in a fresh
  process, interleaved, compilation included.

With ``--independent DIR`` (full runs of the same candidates with other seeds, made by ``--truth
--first-seed 3 --out DIR``) the advice is scored against those too, and the scored runs' own times
to target against theirs: how well three seeds' order carries over to three others, the most any
advice that sees three seeds can be expected to reach (a reference, not a bound).

Tasks used to set the extrapolation's constants (``--calibrate``: z, kappa and kappa_slow of
``cconv.advisor.extrapolate.Settings``) are ``TUNE``; the others (``HELD_OUT``) are in no choice
and are reported separately.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SEEDS, WORKERS = 3, 8
TUNED_ON = ("1x8", None)  # the cluster (and network: the default) the constants were chosen on
CLUSTER, NETWORK = TUNED_ON  # the cluster scored (--cluster/--network: another)
BIG = 1e12  # the time of a candidate that never reaches the target (or is not ranked): last, tied
GOALS = {"tau": 0.7, "regret": 1.10, "coverage": 0.70, "width": 3.0, "wall_ratio": 1.5}
# compress_vectors pinned: the validation's tasks (and the constants chosen on them) were set when 1-D
# tensors (biases, norm scales) were compressed too, the default until 2026-11-27; today's default
# (dense) is validated apart: --dense-vectors (docs/advise_validation.md, studies/advise/dense_vectors/)
COMMON = dict(
    workers=WORKERS, optimizer={"name": "sgd"}, seed=0, launcher="vmap", checkpoint_every=100000, compress_vectors=True
)

TASKS = {
    "digits": dict(  # plain SGD, MLP: a power law after a short transient
        base=dict(COMMON, model={"name": "mlp", "hidden": [64]}, data="digits", batch_size=128, lr=0.1, steps=300),
        target="test_accuracy=0.92",
    ),
    "mnist1d": dict(  # momentum SGD, CNN: an S-shaped start
        base=dict(
            COMMON,
            model={"name": "cnn", "channels": [8], "hidden": 32},
            data={"name": "mnist1d", "num_samples": 4000},
            batch_size=128,
            lr=0.05,
            optimizer={"name": "sgd", "momentum": 0.9},
            steps=300,
        ),
        target="test_accuracy=0.5",
    ),
    "noniid": dict(  # momentum SGD, CNN, label-skewed Dirichlet(0.3) partition over the workers
        base=dict(
            COMMON,
            model={"name": "cnn", "channels": [8], "hidden": 32},
            data={"name": "digits", "partition": "dirichlet", "alpha": 0.3},
            batch_size=128,
            lr=0.05,
            optimizer={"name": "sgd", "momentum": 0.9},
            steps=300,
        ),
        target="test_accuracy=0.95",
    ),
    "lsq": dict(  # convex least squares: a sum of exponentials, a loss target
        base=dict(
            COMMON,
            model={"name": "linear"},
            data={"name": "least_squares", "dim": 64, "cond": 30.0, "noise": 0.05},
            batch_size=64,
            lr=0.05,
            steps=200,
        ),
        target="test_loss=0.07",
    ),
    "text": dict(  # Adam, a byte-level transformer
        base=dict(
            COMMON,
            model={"name": "transformer", "d_model": 32, "layers": 1, "heads": 2},
            data={"name": "text", "seq_len": 32, "max_bytes": 65536},
            batch_size=32,
            lr=0.003,
            optimizer={"name": "adam"},
            steps=160,
        ),
        target="test_loss=2.4",
    ),
    "bn": dict(  # BatchNorm ResNet, momentum, linear warm-up then cosine decay
        base=dict(
            COMMON,
            model={"name": "resnet", "depth": 8, "width": 8},
            data="digits",
            batch_size=128,
            lr=0.2,
            optimizer={"name": "sgd", "momentum": 0.9},
            lr_warmup=40,
            lr_schedule="cosine",
            steps=200,
        ),
        target="test_accuracy=0.975",
    ),
    # added on 2026-11-28, after every choice above was made: in none of them (a fresh held-out task)
    "adam": dict(  # Adam, CNN, MNIST-1D split Dirichlet(0.5) over the workers: slow, noisy accuracy
        base=dict(
            COMMON,
            model={"name": "cnn", "channels": [8], "hidden": 32},
            data={"name": "mnist1d", "num_samples": 4000, "partition": "dirichlet", "alpha": 0.5},
            batch_size=128,
            lr=0.003,
            optimizer={"name": "adam"},
            steps=200,
        ),
        target="test_accuracy=0.42",
    ),
    # added on 2026-11-29, after every choice above was made: in none of them (a fresh held-out task)
    "step": dict(  # momentum SGD, MLP, step decay (x0.1 at step 60): a noisy plateau, then a drop
        base=dict(
            COMMON,
            model={"name": "mlp", "hidden": [64]},
            data="digits",
            batch_size=128,
            lr=0.3,
            optimizer={"name": "sgd", "momentum": 0.9},
            lr_schedule={"name": "exponential_decay", "transition_steps": 60, "decay_rate": 0.1, "staircase": True},
            steps=160,
        ),
        target="test_loss=0.18",
    ),
}
TUNE = ("digits", "mnist1d", "noniid", "lsq")
HELD_OUT = ("text", "bn", "adam", "step")

SPACE = {  # 8 candidates: compressors, ratios, error feedback on and off, and local SGD (non-BSP)
    "compressors": ["none"],
    "memory": ["none"],
    "sync": ["bsp"],
    "include": [
        {"compressor": {"name": "topk", "ratio": 0.1}, "memory": "ef"},
        {"compressor": {"name": "topk", "ratio": 0.01}, "memory": "ef"},
        {"compressor": {"name": "randomk", "ratio": 0.1, "scaled": False}, "memory": "ef"},
        {"compressor": "signsgd", "memory": "ef"},
        {"compressor": "signsgd"},
        {"compressor": {"name": "qsgd", "levels": 4}},
        {"local_steps": 4},
    ],
}


def plan_of(task: str, out: str):
    """The advisor's own Plan for the task (its validated candidates, target, cluster)."""
    from cconv.advisor import api

    spec = TASKS[task]
    config = dict(spec["base"], advise=dict(SPACE, target=spec["target"]))
    return api.prepare(config, cluster(), seeds=SEEDS, out=os.path.join(out, task, "_plan"))


def cluster():
    """The target cluster of the advice scored (``--cluster``/``--network``; default 1x8)."""
    from cconv.theory import cluster as CL

    return CL.parse(CLUSTER, network=NETWORK or CL.DEFAULT_NETWORK)


def set_cluster(spec: str, network: str | None = None) -> None:
    """Score the advice for another cluster of ``WORKERS`` GPUs: the same full runs (a step's
    computation does not depend on the cluster), each candidate's seconds per step on it."""
    global CLUSTER, NETWORK
    CLUSTER, NETWORK = spec, network
    if cluster().workers != WORKERS:
        raise SystemExit(f"--cluster {spec}: the full runs train {WORKERS} workers, not {cluster().workers}")


def _on_cluster(name: str) -> str:
    """``name.json`` on the default cluster, ``name-<cluster>-<network>.json`` on another: the
    step times and wall times depend on the cluster, the full runs do not."""
    return f"{name}.json" if (CLUSTER, NETWORK) == TUNED_ON else f"{name}-{CLUSTER}-{NETWORK or 'default'}.json"


def ground_truth(task: str, out: str, only: list | None = None) -> dict:
    """{candidate: {"steps", "values" (seeds x steps), "diverged", "step_s"}}: every candidate's full
    run (metric line every step), resumed when present, and its seconds per step on the cluster."""
    from cconv.advisor import api, probes, steptime

    cache = os.path.join(out, task, "truth.json")
    if os.path.exists(cache) and only is None:
        with open(cache) as fh:
            return json.load(fh)
    plan = plan_of(task, out)
    res, profile = {}, None
    for i, c in enumerate(plan.candidates):
        if only is not None and i not in only:
            continue
        cfg = probes.probe_config(plan.base, c, SEEDS, WORKERS, 1, plan.rules)
        pr = probes.build(cfg, c, os.path.join(out, task, probes.slug(c.name)))
        t = time.perf_counter()
        prog = probes.train_to(pr, cfg.steps)
        profile = profile or steptime.profile_of(pr.problem)
        st = steptime.step_times(pr.problem, plan.cluster, plan.space.schedules, profile)
        curve = prog.curve(pr.problem.seeds, plan.target.metric)
        res[c.name] = dict(
            steps=curve.steps.tolist(),
            values=np.where(np.isfinite(curve.values), curve.values, np.nan).tolist(),
            diverged=prog.diverged,
            step_s=min(s.step_s for s in st),
        )
        print(f"  {task} {c.name}: {prog.status} ({time.perf_counter() - t:.0f} s)", flush=True)
    if only is None:
        with open(cache, "w") as fh:
            json.dump(res, fh)
    del api
    return res


def step_seconds(task: str, out: str) -> dict:
    """{candidate: seconds per step on the cluster} from the advisor's timing model (each candidate
    built, not trained), cached in ``<out>/<task>/timing.json`` (``_on_cluster``); replaces the full
    runs' step_s."""
    from cconv.advisor import probes, steptime

    cache = os.path.join(out, task, _on_cluster("timing"))
    if os.path.exists(cache):
        with open(cache) as fh:
            return json.load(fh)
    plan = plan_of(task, out)
    res, profile = {}, None
    for c in plan.candidates:
        cfg = probes.probe_config(plan.base, c, SEEDS, WORKERS, 1, plan.rules)
        pr = probes.build(cfg, c, os.path.join(out, task, probes.slug(c.name)))
        profile = profile or steptime.profile_of(pr.problem)
        times = steptime.step_times(pr.problem, plan.cluster, plan.space.schedules, profile)
        res[c.name] = min(s.step_s for s in times)
    with open(cache, "w") as fh:
        json.dump(res, fh)
    return res


def timed_truth(task: str, out: str) -> dict:
    """The task's full runs (``ground_truth``) with each candidate's seconds per step on the
    cluster scored (``step_seconds``)."""
    truth = ground_truth(task, out)
    for name, step_s in step_seconds(task, out).items():
        truth[name]["step_s"] = step_s
    return truth


def _curve(d: dict):
    from cconv.advisor.extrapolate import Curve

    return Curve(np.asarray(d["steps"], float), np.asarray(d["values"], float))


def diverged_by(d: dict, steps: int) -> str | None:
    """The divergence rule's reason if a seed of this full run had diverged by ``steps``."""
    if not d["diverged"]:
        return None
    v = np.asarray(d["values"], float)
    cut = np.asarray(d["steps"], float) <= steps
    return d["diverged"] if np.any(np.isnan(v[:, cut]) | ~np.isfinite(v[:, cut])) or cut.all() else None


_RACES: dict = {}  # (task, budget, seeds, logged) -> (truth, its race): the race is not the extrapolation's


def replay(task: str, truth: dict, target, steps: int, budget: float = 1.0, settings=None, seeds: int = SEEDS):
    """The advisor's race and predictions on the full runs (module docstring); ``seeds`` < SEEDS:
    the race sees only the first ``seeds`` seeds' curves (the truth stays the mean of all)."""
    from cconv.advisor import api
    from cconv.advisor.extrapolate import Settings

    key = (task, budget, seeds, logged)  # the logging rule: a study may replace it (logging_whatif.py)
    if key not in _RACES or _RACES[key][0] is not truth:
        _RACES[key] = (truth, _race(truth, target, steps, budget, seeds))
    result = _RACES[key][1]
    return result, api.predictions(result, target, settings or Settings())


def logged(at: np.ndarray, every: int, steps: int) -> np.ndarray:
    """Which of the steps ``at`` a probe logging every ``every`` steps (``cconv.experiments``'s
    ``log_every``) writes a metric line at: the multiples of ``every`` and the last step."""
    return (at % every == 0) | (at == steps)


def _race(truth: dict, target, steps: int, budget: float, seeds: int):
    from cconv.advisor import api, race
    from cconv.advisor.extrapolate import Curve

    arms = [race.Arm(n, d["step_s"]) for n, d in truth.items()]
    if len(arms) * race.MIN_STEPS > budget * steps:  # what ``cconv advise`` refuses (``api.prepare``)
        raise ValueError(f"{len(arms)} candidates need {len(arms) * race.MIN_STEPS} steps, budget {budget * steps:.0f}")
    every = api.log_every(int(budget * steps), steps, arms)

    def observe(name: str, upto: int) -> race.Observation:
        c = _curve(truth[name])
        keep = (c.steps <= upto) & logged(c.steps, every, steps)
        cut = Curve(c.steps[keep], c.values[:seeds][:, keep])
        why = diverged_by(truth[name], upto)
        trained = int(min(upto, np.nanmax(c.steps[np.isfinite(c.values).all(0)], initial=0) if why else upto))
        return race.Observation(cut, trained, why)

    return api.race_all(arms, observe, target, steps, int(budget * steps))  # as ``cconv advise``


def actual_steps(d: dict, target) -> float:
    from cconv.advisor.extrapolate import first_crossing

    c = _curve(d)
    if not np.all(np.isfinite(c.values)):
        return math.inf
    hit = first_crossing(c.steps, c.values.mean(0), target)
    return hit[0] if hit else math.inf


def score(
    task: str,
    truth: dict,
    target,
    steps: int,
    budget: float = 1.0,
    settings=None,
    seeds: int = SEEDS,
    independent: dict | None = None,
) -> dict:
    """Kendall tau, regret, coverage and width of the replayed advice (module docstring);
    ``independent``: the same candidates' full runs with other seeds (``--first-seed``), which
    the advice is scored against too, and which say how well the runs order themselves."""
    from scipy.stats import kendalltau

    result, preds = replay(task, truth, target, steps, budget, settings, seeds)
    raced = {s.arm.name: s.status for s in result.standings}
    rows = []
    for name, d in truth.items():
        p, act = preds[name], actual_steps(d, target)
        ranked = p.ok and p.steps <= steps
        rows.append(
            dict(
                candidate=name,
                status=p.status,
                reason=p.reason,
                family=p.family,
                predicted=p.steps if ranked else math.nan,
                point=p.steps if p.ok else math.nan,  # ranked or not (past the step budget: not ranked)
                lo=p.lo,
                hi=p.hi,
                actual=act,
                step_s=d["step_s"],
                observed=p.observed,
                race=raced[name],
            )
        )
    seen = seen_steps(rows)
    pt = _times(seen, rows)
    at = _times([r["actual"] for r in rows], rows)
    tau = float(kendalltau(pt, at).statistic)
    pick = _pick(seen, rows)
    if pt[pick] >= BIG:
        regret, pick_name = math.nan, "no recommendation"
    else:
        regret = float(at[pick] / at.min()) if at[pick] < BIG else math.inf
        pick_name = rows[pick]["candidate"]
    extra = _against(independent, rows, pt, at, pick, target) if independent is not None else {}
    checked = [r for r in rows if scored_interval(r, steps)]  # a run that never reaches: past every such hi
    pred_only = [r for r in checked if not r["observed"]]
    sp = speedups(rows)
    sp_checked = [x for x in sp if math.isfinite(x["actual"])]
    return dict(
        budget=budget,
        spent=result.spent / steps,
        rungs=len(result.rungs),
        tau=tau,
        regret=regret,
        pick=pick_name,
        coverage=_covered(checked),
        width=_width(checked),
        checked=len(checked),
        never=sum(math.isinf(r["actual"]) for r in checked),
        observed=sum(r["observed"] for r in checked),
        coverage_predicted=_covered(pred_only),
        width_predicted=_width(pred_only),
        ranked=sum(math.isfinite(r["predicted"]) for r in rows),
        speedups=sp,
        speedup_checked=len(sp_checked),
        speedup_coverage=_covered(sp_checked),
        speedup_ratio=float(np.median([x["actual"] / x["predicted"] for x in sp_checked])) if sp_checked else math.nan,
        rows=rows,
        **extra,
    )


def _covered(xs: list) -> float:
    """The share of ``xs`` whose ``actual`` lies in [``lo``, ``hi``] (NaN for none)."""
    return float(np.mean([x["lo"] <= x["actual"] <= x["hi"] for x in xs])) if xs else math.nan


def _width(xs: list) -> float:
    """The median interval width hi / lo of ``xs`` (NaN for none)."""
    return float(np.median([x["hi"] / max(x["lo"], 1e-12) for x in xs])) if xs else math.nan


def scored_interval(r: dict, steps: int) -> bool:
    """Is a row's interval scored (coverage, width)?  Every row the advice gives an interval --
    ranked, or predicted past the step budget (``misses the budget``, not ranked) -- whose full run
    reaches the target, or never does while its interval ends inside the step budget (a miss); one
    whose run never reaches it and whose interval runs past the budget is censored: inside or not
    is unknown."""
    return math.isfinite(r["point"]) and (math.isfinite(r["actual"]) or r["hi"] < steps)


def speedups(rows: list) -> list:
    """Each ranked row's speedup over the dense baseline (the first row: the plan's first candidate,
    as ``space.candidates`` orders them) as the advisor prints it
    (``ranking.rank``: dense's time / the row's, with ``ranking.speedup_bounds``) where either time
    is predicted, beside the actual one (NaN where either full run never reaches the target)."""
    from cconv.advisor.ranking import speedup_bounds

    d = rows[0]
    if not math.isfinite(d["predicted"]):
        return []
    out = []
    for r in rows[1:]:
        if not math.isfinite(r["predicted"]) or (r["observed"] and d["observed"]):
            continue
        ds, rs = d["step_s"], r["step_s"]
        reach = math.isfinite(d["actual"]) and math.isfinite(r["actual"])
        lo, hi = speedup_bounds(d["lo"] * ds, d["hi"] * ds, r["lo"] * rs, r["hi"] * rs)
        predicted, actual = d["predicted"] * ds / (r["predicted"] * rs), d["actual"] * ds / (r["actual"] * rs)
        out.append(
            dict(candidate=r["candidate"], predicted=predicted, lo=lo, hi=hi, actual=actual if reach else math.nan)
        )
    return out


def seen_steps(rows: list) -> list:
    """Each scored row's steps as the advisor ranks them (``ranking.seen_time``): observed, or the
    predicted interval's slow end; inf where not ranked."""
    return [(r["predicted"] if r["observed"] else r["hi"]) if math.isfinite(r["predicted"]) else math.inf for r in rows]


def _pick(seen: list, rows: list) -> int:
    """The advisor's recommendation (``ranking.pick``) from each row's seen steps (inf: not
    ranked); the first row when nothing is ranked (``score`` says "no recommendation")."""
    from cconv.advisor.race import PRUNED
    from cconv.advisor.ranking import pick

    step_s = [r["step_s"] for r in rows]
    i = pick([t * s for t, s in zip(seen, step_s, strict=True)], [r["race"] == PRUNED for r in rows])
    return 0 if i is None else i


def _times(steps: list, rows: list) -> np.ndarray:
    """Times to target on the cluster: steps x each row's seconds per step, ``BIG`` where none."""
    return np.array([t * r["step_s"] if math.isfinite(t) else BIG for t, r in zip(steps, rows, strict=True)])


def _against(independent: dict, rows: list, pt, at, pick: int, target) -> dict:
    """The advice scored against full runs of other seeds (``tau_other``, ``regret_other``), and
    those runs against the scored ones (``tau_runs``: how well the seeds the advice saw order the
    candidates for other seeds; ``regret_runs``: the other seeds' time of the scored runs' best);
    ``actual_other``: the other seeds' steps to target per candidate."""
    from scipy.stats import kendalltau

    other = [actual_steps(independent[r["candidate"]], target) for r in rows]
    ao = _times(other, rows)
    best = int(np.argmin(at))
    return dict(
        tau_other=float(kendalltau(pt, ao).statistic),
        regret_other=float(ao[pick] / ao.min()) if pt[pick] < BIG and ao[pick] < BIG else math.inf,
        tau_runs=float(kendalltau(at, ao).statistic),
        regret_runs=float(ao[best] / ao.min()) if ao[best] < BIG else math.inf,
        actual_other={r["candidate"]: t for r, t in zip(rows, other, strict=True)},
    )


ZS = (0.5, 0.75, 1.0, 1.25, 1.5)
KAPPAS = tuple(round(0.1 * i, 1) for i in range(11))
KAPPAS_SLOW = (0.0, 0.1, 0.2, 0.3)


def _target(task: str, out: str):
    from cconv.advisor import target as T

    return T.parse(TASKS[task]["target"])


def _met(b: dict) -> tuple:
    """(tau, regret, intervals) goals met by one task's score (the interval goal: coverage and width)."""
    return (
        b["tau"] >= GOALS["tau"],
        b["regret"] <= GOALS["regret"],
        b["coverage"] >= GOALS["coverage"] and b["width"] <= GOALS["width"],
    )


def calibrate(truths: dict, out: str, seeds: int = SEEDS):
    """The (z, kappa, kappa_slow) that meets all the goals (Kendall tau, regret, and the interval
    goal: coverage >= 70 % with median width <= 3) on the most tuning tasks; ties: the most goals
    met over the tuning tasks, the larger worst coverage, then the narrower median width.  The slow
    side's widening moves the interval's slow end, by which predicted rows are ranked, so the
    ranking's goals are in the choice too."""
    from cconv.advisor.extrapolate import Settings

    best = None
    for z, k, ks in itertools.product(ZS, KAPPAS, KAPPAS_SLOW):
        st = Settings(z=z, kappa=k, kappa_slow=ks)
        scores = [
            score(t, truths[t], _target(t, out), TASKS[t]["base"]["steps"], settings=st, seeds=seeds)
            for t in TUNE
            if t in truths
        ]
        covs = [b["coverage"] if math.isfinite(b["coverage"]) else 0.0 for b in scores]
        widths = [b["width"] if math.isfinite(b["width"]) else math.inf for b in scores]
        met = [_met(b) for b in scores]
        key = (sum(all(m) for m in met), sum(map(sum, met)), min(covs), -float(np.median(widths)))
        if best is None or key > best[0]:
            best = (key, st)
    return best[1] if best else Settings()


_METERED = (
    "import json, sys\n"
    "from cconv.experiments.compiletime import CompileMeter\n"
    "from cconv.cli import main\n"
    "with CompileMeter() as m:\n"
    "    rc = main(sys.argv[2:])\n"
    "json.dump({'compile_s': m.seconds, 'programs': m.programs, 'blocked_s': m.blocked}, open(sys.argv[1], 'w'))\n"
    "sys.exit(rc)\n"
)


def wall_times(task: str, out: str, repeats: int = 1) -> dict:
    """``cconv advise`` (default budget) vs ``cconv run`` of the dense config (1 seed), each a fresh
    process, alternated, compilation included; and of each, the seconds spent building programs
    (``CompileMeter``: summed over the threads that built them), the programs built, and the time
    the main thread lost to building (``blocked_s``: its own builds and waits; the advisor's race
    trains in other threads, so this is not the race's loss).  Cached in ``<out>/<task>/wall.json``
    (``_on_cluster``)."""
    import yaml

    cache = os.path.join(out, task, _on_cluster("wall"))
    if os.path.exists(cache):
        with open(cache) as fh:
            return json.load(fh)
    spec = TASKS[task]
    d = os.path.join(out, task, "_wall")
    os.makedirs(d, exist_ok=True)
    cfg_path = os.path.join(d, "config.yaml")
    with open(cfg_path, "w") as fh:
        yaml.safe_dump(dict(spec["base"], advise=dict(SPACE, target=spec["target"])), fh)
    res: dict = {f"{k}_{m}": [] for k in ("advise", "dense") for m in ("s", "compile_s", "programs", "blocked_s")}
    for i in range(repeats):
        for kind in ("dense", "advise"):
            run_out = os.path.join(d, f"{kind}-{i}")
            shutil.rmtree(run_out, ignore_errors=True)  # a finished run would be resumed: nothing measured
            meter = os.path.join(d, f"{kind}-{i}.compile.json")
            args = (
                ["run", cfg_path, "--out", run_out]
                if kind == "dense"
                else ["advise", cfg_path, "--cluster", CLUSTER, "--seeds", str(SEEDS), "--out", run_out]
                + (["--network", NETWORK] if NETWORK else [])
            )
            t = time.perf_counter()
            subprocess.run(
                [sys.executable, "-c", _METERED, meter, *args],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            res[f"{kind}_s"].append(time.perf_counter() - t)
            with open(meter) as fh:
                m = json.load(fh)
            res[f"{kind}_compile_s"].append(m["compile_s"])
            res[f"{kind}_programs"].append(m["programs"])
            res[f"{kind}_blocked_s"].append(m["blocked_s"])
    res = {k: float(np.median(v)) for k, v in res.items()}
    res["ratio"] = res["advise_s"] / res["dense_s"]
    with open(cache, "w") as fh:
        json.dump(res, fh)
    return res


def _f(x, fmt: str = "{:.2f}") -> str:
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return fmt.format(x) if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def _goal_marks(b: dict, wall: dict | None) -> str:
    miss = []
    if not b["tau"] >= GOALS["tau"]:
        miss.append("tau")
    if not b["regret"] <= GOALS["regret"]:
        miss.append("regret")
    if not b["coverage"] >= GOALS["coverage"]:
        miss.append("coverage")
    if not b["width"] <= GOALS["width"]:
        miss.append("width")
    if wall and not wall["ratio"] <= GOALS["wall_ratio"]:
        miss.append("wall")
    return "all met" if not miss else "missed: " + ", ".join(miss)


def markdown(results: list, settings, command: str) -> str:
    lines = [
        "# `cconv advise` validation (generated by studies/advise/validate.py)",
        "",
        f"Command: `{command}`",
        "",
        f"Goals at the default budget (one dense run of training steps), on every task: Kendall tau >= "
        f"{GOALS['tau']}, top-1 regret <= {GOALS['regret']}, coverage >= {GOALS['coverage']:.0%} with median "
        f"interval width (hi/lo) <= {GOALS['width']:g}, wall time <= {GOALS['wall_ratio']}x one dense run. "
        f"Extrapolation constants set on the tuning tasks ({', '.join(TUNE)}): z = {settings.z}, "
        f"kappa = {settings.kappa}, kappa_slow = {settings.kappa_slow}; {', '.join(HELD_OUT)} are held out of "
        "every choice.",
        *(
            []
            if (CLUSTER, NETWORK) == TUNED_ON
            else ["", f"Cluster {CLUSTER} over {NETWORK or 'the default network'}: the constants were set on 1x8."]
        ),
        "",
        "| task | set | target | Kendall tau | regret (pick) | coverage | width | predicted rows: coverage, width "
        "| speedup over dense: in interval, actual / predicted | observed | spent | wall (advise / dense) | goals |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        b, w = r["score"], r.get("wall")
        wall = f"{w['ratio']:.1f}x ({w['advise_s']:.0f} s / {w['dense_s']:.0f} s)" if w else "-"
        if w:
            wall += (
                f"; programs built {w['advise_programs']:.0f} (in {w['advise_compile_s']:.0f} s, "
                f"summed over threads) / {w['dense_programs']:.0f} (in {w['dense_compile_s']:.0f} s)"
            )
        lines.append(
            f"| {r['task']} | {'held out' if r['task'] in HELD_OUT else 'tuning'} | {r['target']} | {_f(b['tau'])} | "
            f"{_f(b['regret'])} ({b['pick']}) | {_f(b['coverage'], '{:.0%}')} ({b['checked']}) | {_f(b['width'])} | "
            f"{_f(b['coverage_predicted'], '{:.0%}')}, {_f(b['width_predicted'])} | "
            f"{_f(b['speedup_coverage'], '{:.0%}')} ({b['speedup_checked']}), {_f(b['speedup_ratio'])} | "
            f"{b['observed']} of {b['ranked']} | {b['spent']:.2f} | {wall} | {_goal_marks(b, w)} |"
        )
    lines += _independent_table(results)
    lines += ["", "Per candidate (predicted or observed [interval] vs actual steps to target, family):", ""]
    for r in results:
        lines.append(f"- **{r['task']}**")
        for row in r["score"]["rows"]:
            if math.isfinite(row["predicted"]):
                how = "observed" if row["observed"] else f"{row['family']}"
                pred = f"{row['predicted']:.0f} [{row['lo']:.0f}, {row['hi']:.0f}] ({how})"
            elif row["status"] == "predicted":  # past the step budget: not ranked (ranking.rank)
                pred = (
                    f"misses the budget: ~{row['point']:.0f} [{row['lo']:.0f}, {row['hi']:.0f}] > {r['steps']} "
                    f"({row['reason'][:60]})"
                )
            else:
                pred = f"{row['status']} ({row['reason'][:90]})"
            act = f"{row['actual']:.0f}" if math.isfinite(row["actual"]) else "not reached"
            other = r["score"].get("actual_other", {}).get(row["candidate"])
            if other is not None:
                act += f" (other seeds: {other:.0f})" if math.isfinite(other) else " (other seeds: not reached)"
            lines.append(f"  - {row['candidate']}: {pred}; actual {act}")
    return "\n".join(lines) + "\n"


def _independent_table(results: list) -> list:
    """The advice against full runs of seeds it never saw, beside how well the seen runs order those."""
    scored = [r for r in results if "tau_other" in r["score"]]
    if not scored:
        return []
    out = [
        "",
        "Against full runs of three other seeds (`--independent`: the same configs, seeds the advice never saw). "
        "`runs`: the seeds above as if they were the advice -- each candidate's actual time to target with the "
        "seeds the advice saw, scored against the other seeds' (how far three seeds' order carries over).",
        "",
        "| task | Kendall tau: advice | tau: runs | regret: advice | regret: runs |",
        "|---|---|---|---|---|",
    ]
    for r in scored:
        b = r["score"]
        out.append(
            f"| {r['task']} | {_f(b['tau_other'])} | {_f(b['tau_runs'])} | {_f(b['regret_other'])} | "
            f"{_f(b['regret_runs'])} |"
        )
    return out


def figure(results: list, path: str) -> None:
    """Predicted (or observed) against actual time to target, one panel per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullFormatter

    n = len(results)
    cols = 3
    fig, axes = plt.subplots(
        (n + cols - 1) // cols,
        cols,
        figsize=(5 * cols, 4.4 * ((n + cols - 1) // cols) + 0.8),
        layout="constrained",
        squeeze=False,
    )
    for ax, r in zip(axes.flat, results):
        rows, b = r["score"]["rows"], r["score"]
        acts = [x["actual"] for x in rows if math.isfinite(x["actual"])]
        his = [x["hi"] for x in rows if math.isfinite(x["point"])]
        top = max([r["steps"] * 1.3, *acts, *his]) * 1.2
        lo = max(1.0, min([*acts, *[x["lo"] for x in rows if math.isfinite(x["point"])], top]) / 2)
        for x in rows:
            act = x["actual"] if math.isfinite(x["actual"]) else top
            if not math.isfinite(x["point"]):
                ax.plot([act], [top], "x", color="0.5")
                continue
            inside = x["lo"] <= x["actual"] <= x["hi"]
            unknown = not scored_interval(x, r["steps"])  # censored: left out of coverage
            ax.errorbar(
                act,
                x["point"],
                yerr=[[x["point"] - x["lo"]], [x["hi"] - x["point"]]],
                fmt="s" if x["observed"] else "o",
                color="0.6" if unknown else "C0" if inside else "C3",
                capsize=2,
                ms=5,
            )
            if x["candidate"] == b["pick"]:
                ax.plot([act], [x["point"]], "o", mfc="none", mec="k", ms=12, mew=1.4)
        ax.plot([lo, top], [lo, top], "k--", lw=0.8)
        ax.axvline(r["steps"], color="0.7", lw=0.8)
        ax.axhline(r["steps"], color="0.7", lw=0.8)  # above it: predicted to miss the budget (not ranked)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(lo, top * 1.1)
        ax.set_ylim(lo, top * 1.1)
        ax.set_xlabel("actual steps to target (full runs; right edge: never)")
        ax.set_ylabel("advisor: observed or predicted")
        held = " (held out)" if r["task"] in HELD_OUT else ""
        ax.set_title(
            f"{r['task']}{held} {r['target']}: tau {_f(b['tau'])}, regret {_f(b['regret'])}, "
            f"cov {_f(b['coverage'], '{:.0%}')}",
            fontsize=8,
        )
        ax.grid(alpha=0.3, which="both")
    handles = [
        Line2D([], [], marker="s", ls="", color="C0", label="observed in the race"),
        Line2D([], [], marker="o", ls="", color="C0", label="predicted; interval holds the actual"),
        Line2D([], [], marker="o", ls="", color="C3", label="actual outside the interval"),
        Line2D([], [], marker="o", ls="", color="0.6", label="never reached, interval past the budget (unscored)"),
        Line2D([], [], marker="o", ls="", mfc="none", mec="k", ms=10, label="the recommendation"),
        Line2D([], [], marker="x", ls="", color="0.5", label="no prediction (flagged)"),
        Line2D([], [], ls="--", color="k", lw=0.8, label="predicted = actual"),
        Line2D([], [], color="0.7", lw=0.8, label="step budget (above it: not ranked)"),
    ]
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _clean(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--out", default=os.path.join("results", "advise-validation"), help="full runs (cached)")
    ap.add_argument("--truth", action="store_true", help="only train the full runs (resumable) and stop")
    ap.add_argument("--candidates", help="with --truth: only these candidates (indices), to share the work")
    ap.add_argument("--calibrate", action="store_true", help="set z, kappa and kappa_slow on the tuning tasks")
    ap.add_argument("--wall", action="store_true", help="measure advise vs dense wall times (else cached ones)")
    ap.add_argument("--results", default=HERE, help="where results.json/.md and validation.png go")
    ap.add_argument(
        "--seeds", type=int, default=SEEDS, choices=range(1, SEEDS + 1), help="seeds the replayed race sees"
    )
    ap.add_argument("--budget", type=float, default=1.0, help="the replayed race's budget (dense runs of steps)")
    ap.add_argument(
        "--dense-vectors", action="store_true", help="cconv's default: 1-D tensors dense (use another --out)"
    )
    ap.add_argument(
        "--first-seed", type=int, default=0, help="with --truth: the runs' first seed (another --out: independent runs)"
    )
    ap.add_argument("--independent", help="full runs of other seeds (--first-seed): score against them too")
    ap.add_argument("--cluster", default=CLUSTER, help=f"the advice's cluster, {WORKERS} GPUs (default %(default)s)")
    ap.add_argument("--network", help="its inter-node network (cconv advise's --network)")
    args = ap.parse_args(argv)
    set_cluster(args.cluster, args.network)
    for spec in TASKS.values():
        spec["base"]["seed"] = args.first_seed
        if args.dense_vectors:
            spec["base"]["compress_vectors"] = False
    only = [int(i) for i in args.candidates.split(",")] if args.candidates else None
    if args.truth:
        for task in args.tasks:
            t = time.perf_counter()
            ground_truth(task, args.out, only)
            print(f"{task}: ground truth in {time.perf_counter() - t:.0f} s", flush=True)
        return 0
    from cconv.advisor.extrapolate import Settings

    truths = {t: timed_truth(t, args.out) for t in args.tasks}
    settings = calibrate(truths, args.out, args.seeds) if args.calibrate else Settings()
    print(f"settings: z={settings.z} kappa={settings.kappa} kappa_slow={settings.kappa_slow}", flush=True)
    results = []
    for task in args.tasks:
        tgt = _target(task, args.out)
        other = ground_truth(task, args.independent) if args.independent else None
        try:
            b = score(task, truths[task], tgt, TASKS[task]["base"]["steps"], args.budget, settings, args.seeds, other)
        except ValueError as e:
            print(f"{task}: refused, as cconv advise would: {e}", flush=True)
            continue
        wall = (
            wall_times(task, args.out)
            if args.wall or os.path.exists(os.path.join(args.out, task, _on_cluster("wall")))
            else None
        )
        results.append(dict(task=task, target=str(tgt), steps=TASKS[task]["base"]["steps"], score=b, wall=wall))
        print(
            f"{task}: tau {_f(b['tau'])} regret {_f(b['regret'])} ({b['pick']}) cov {_f(b['coverage'])} "
            f"width {_f(b['width'])} pred-cov {_f(b['coverage_predicted'])} spent {b['spent']:.2f} "
            f"wall {wall and round(wall['ratio'], 2)}",
            flush=True,
        )
    command = "PYTHONPATH=. python studies/advise/validate.py " + " ".join(argv if argv is not None else sys.argv[1:])
    os.makedirs(args.results, exist_ok=True)
    with open(os.path.join(args.results, "results.json"), "w") as fh:
        json.dump(
            _clean(
                dict(
                    command=command,
                    goals=GOALS,
                    settings=settings._asdict(),
                    tune=TUNE,
                    held_out=HELD_OUT,
                    tasks=results,
                )
            ),
            fh,
            indent=1,
        )
    with open(os.path.join(args.results, "results.md"), "w") as fh:
        fh.write(markdown(results, settings, command))
    figure(results, os.path.join(args.results, "validation.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
