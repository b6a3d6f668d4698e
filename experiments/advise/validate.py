"""Validate ``cconv advise`` against full runs on six tasks whose learning curves differ in shape.

For every task, each of 8 candidates is trained for the config's full step budget with 3 seeds
(vmapped, as the advisor trains them) and a metric line at every step: the ground truth, cached
under ``--out``.  Each candidate's seconds per step on the target cluster come from the advisor's
own timing (``cconv.advisor.timing``), measured once and cached with the runs.

The advisor's race (``cconv.advisor.race``) is then replayed on those runs: a race's probe *is*
the first steps of the full run (the same config, seeds and batches; the advisor pauses and
resumes it), so ``observe`` reads the full run's curve up to the step asked, at the metric-line
interval the advisor would use.  Its predictions (``cconv.advisor.api.predictions``) are scored
against the full runs:

* Kendall tau between predicted and actual time to target (steps x seconds per step) over all 8
  candidates (flagged or never reaching: last, tied);
* top-1 regret: actual time of the advisor's recommendation / the best actual time;
* coverage: the share of ranked candidates whose actual steps to target lie in the interval, and
  the median interval width hi/lo -- over all ranked rows and over the predicted (not observed)
  ones alone;
* wall time (``--wall``): ``cconv advise`` vs ``cconv run`` of one dense run, each in a fresh
  process, interleaved, compilation included.

Tasks used to set the extrapolation's constants (``--calibrate``: z and kappa of
``cconv.advisor.extrapolate.Settings``) are ``TUNE``; the others (``HELD_OUT``) are in no choice
and are reported separately.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SEEDS, WORKERS, CLUSTER = 3, 8, "1x8"
GOALS = {"tau": 0.7, "regret": 1.10, "coverage": 0.70, "width": 3.0, "wall_ratio": 1.5}
COMMON = dict(workers=WORKERS, optimizer={"name": "sgd"}, seed=0, launcher="vmap", checkpoint_every=100000)

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
}
TUNE = ("digits", "mnist1d", "noniid", "lsq")
HELD_OUT = ("text", "bn")

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
    return api.prepare(config, CLUSTER, seeds=SEEDS, out=os.path.join(out, task, "_plan"))


def ground_truth(task: str, out: str, only: list | None = None) -> dict:
    """{candidate: {"steps", "values" (seeds x steps), "diverged", "step_s"}}: every candidate's full
    run (metric line every step), resumed when present, and its seconds per step on the cluster."""
    from cconv.advisor import api, probes, timing

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
        profile = profile or timing.profile_of(pr.problem)
        st = timing.step_times(pr.problem, plan.cluster, plan.space.schedules, profile)
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


def replay(task: str, truth: dict, target, steps: int, budget: float = 1.0, settings=None):
    """The advisor's race and predictions on the full runs (module docstring)."""
    from cconv.advisor import api, race
    from cconv.advisor.extrapolate import Curve, Settings

    arms = [race.Arm(n, d["step_s"]) for n, d in truth.items()]
    every = api.log_every(int(budget * steps), steps, arms)

    def observe(name: str, upto: int) -> race.Observation:
        c = _curve(truth[name])
        keep = (c.steps <= upto) & ((c.steps % every == 0) | (c.steps == steps))
        cut = Curve(c.steps[keep], c.values[:, keep])
        why = diverged_by(truth[name], upto)
        trained = int(min(upto, np.nanmax(c.steps[np.isfinite(c.values).all(0)], initial=0) if why else upto))
        return race.Observation(cut, trained, why)

    result = race.race(arms, observe, target, steps, int(budget * steps))
    return result, api.predictions(result, target, settings or Settings())


def actual_steps(d: dict, target) -> float:
    from cconv.advisor.extrapolate import first_crossing

    c = _curve(d)
    if not np.all(np.isfinite(c.values)):
        return math.inf
    hit = first_crossing(c.steps, c.values.mean(0), target)
    return hit[0] if hit else math.inf


def score(task: str, truth: dict, target, steps: int, budget: float = 1.0, settings=None) -> dict:
    """Kendall tau, regret, coverage and width of the replayed advice (module docstring)."""
    from scipy.stats import kendalltau

    result, preds = replay(task, truth, target, steps, budget, settings)
    rows, big = [], 1e12
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
                lo=p.lo,
                hi=p.hi,
                actual=act,
                step_s=d["step_s"],
                observed=p.observed,
            )
        )
    pt = np.array([r["predicted"] * r["step_s"] if math.isfinite(r["predicted"]) else big for r in rows])
    at = np.array([r["actual"] * r["step_s"] if math.isfinite(r["actual"]) else big for r in rows])
    tau = float(kendalltau(pt, at).statistic)
    pick = int(np.argmin(pt))
    if pt[pick] >= big:
        regret, pick_name = math.nan, "no recommendation"
    else:
        regret = float(at[pick] / at.min()) if at[pick] < big else math.inf
        pick_name = rows[pick]["candidate"]
    checked = [r for r in rows if math.isfinite(r["predicted"]) and math.isfinite(r["actual"])]
    inside = [r["lo"] <= r["actual"] <= r["hi"] for r in checked]
    widths = [r["hi"] / max(r["lo"], 1e-12) for r in checked]
    pred_only = [r for r in checked if not r["observed"]]
    return dict(
        budget=budget,
        spent=result.spent / steps,
        rungs=len(result.rungs),
        tau=tau,
        regret=regret,
        pick=pick_name,
        coverage=float(np.mean(inside)) if inside else math.nan,
        width=float(np.median(widths)) if widths else math.nan,
        checked=len(checked),
        observed=sum(r["observed"] for r in checked),
        coverage_predicted=float(np.mean([r["lo"] <= r["actual"] <= r["hi"] for r in pred_only]))
        if pred_only
        else math.nan,
        width_predicted=float(np.median([r["hi"] / max(r["lo"], 1e-12) for r in pred_only])) if pred_only else math.nan,
        ranked=sum(math.isfinite(r["predicted"]) for r in rows),
        rows=rows,
    )


def main_truth(tasks: list, out: str, only: list | None) -> int:
    for task in tasks:
        t = time.perf_counter()
        ground_truth(task, out, only)
        print(f"{task}: ground truth in {time.perf_counter() - t:.0f} s", flush=True)
    return 0


if __name__ == "__main__" and "--truth" in sys.argv:
    ap = argparse.ArgumentParser()
    ap.add_argument("--truth", action="store_true")
    ap.add_argument("--tasks", nargs="+", default=list(TASKS))
    ap.add_argument("--out", default=os.path.join("results", "advise-validation"))
    ap.add_argument("--candidates")
    a = ap.parse_args()
    sys.exit(main_truth(a.tasks, a.out, [int(i) for i in a.candidates.split(",")] if a.candidates else None))
