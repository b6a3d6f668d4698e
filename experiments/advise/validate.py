"""Validation of ``cconv advise`` against full runs (issue 23, item 3): does the ranking the
advisor predicts from short probes hold when every candidate is trained to the target?

For each task (``TASKS``: the digits MLP, MNIST-1D with a small 1-D CNN, a byte-level
transformer on CPython's standard library) and each candidate of ``SPACE`` (compressors, ratios,
error feedback on and off, local SGD):

1. ground truth: the full run (``steps``, 3 seeds vmapped in one program, ``launcher: vmap``,
   8 workers), its steps to the target = the first logged step at which the seed-mean metric
   reaches it (interpolated; ``extrapolate.first_crossing``), "not reached" within the budget
   otherwise;
2. predictions at probe budgets 5 %, 10 %, 20 %: ``extrapolate.predict`` on the full run's
   first f x steps.  With a constant learning rate the probe ``cconv advise`` trains IS that
   prefix (same keys per step, same batches), so no second training is needed;
3. metrics: Kendall tau (``scipy.stats.kendalltau``, tau-b) between predicted and actual steps
   (a candidate the advisor does not rank, or that never reaches the target, is placed after all
   others, tied), top-1 regret = actual steps of the advisor's pick / the best actual steps, and
   coverage = the share of ranked candidates that reach the target whose actual steps lie in the
   predicted interval;
4. the advisor's own wall time: ``cconv.advise`` at 10 % on the task (probes, timing, report),
   against one full dense run of the task's config (1 seed), measured in this process one after
   the other.

    PYTHONPATH=. python experiments/advise/validate.py [--tasks digits mnist1d text] [--out DIR]

writes ``experiments/advise/results.json``, ``results.md`` and ``validation.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
BUDGETS = (0.05, 0.1, 0.2)
SEEDS = 3
WORKERS = 8
GOALS = {"tau": 0.7, "regret": 1.10, "coverage": 0.70, "wall_ratio": 2.0}
COMMON = dict(workers=WORKERS, optimizer={"name": "sgd"}, seed=0, launcher="vmap", checkpoint_every=100000)

TASKS = {
    "digits": dict(
        base=dict(COMMON, model={"name": "mlp", "hidden": [64]}, data="digits", batch_size=128, lr=0.1, steps=300),
        target="test_accuracy=0.92",
        log_every=2,
    ),
    "mnist1d": dict(
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
        log_every=2,
    ),
    "text": dict(
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
        log_every=2,
    ),
}

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


def candidates(cfg):
    from cconv.advisor import space as SP

    return SP.candidates(SP.parse(SPACE, cfg))


def full_runs(task: str, spec: dict, out: str, only: list | None = None, finished_only: bool = False) -> tuple:
    """(target, [(candidate, curve)]) of every candidate's full run (resumed when present)."""
    from cconv.advisor import api, probes
    from cconv.advisor import target as T
    from cconv.experiments import build, io

    cfg, _ = api.load_config(dict(spec["base"]))
    cands = candidates(cfg)
    tgt = None
    res = []
    for i, c in enumerate(cands):
        if only is not None and i not in only:
            continue
        run_dir = os.path.join(out, task, probes.slug(c.name))
        if finished_only and not io.is_finished(run_dir):
            print(f"  {task} {c.name}: not finished, left out", flush=True)
            continue
        rc = probes.probe_config(cfg, c, cfg.steps, SEEDS, WORKERS, log_every=spec["log_every"])
        if tgt is None:
            tgt = T.parse(spec["target"], api.task_metrics(build.problem(rc)))
        t = time.perf_counter()
        pr = probes.run(rc, c, run_dir, nested=False)
        print(f"  {task} {c.name}: {pr.status} ({time.perf_counter() - t:.0f} s)", flush=True)
        res.append((c, pr.curve(tgt.metric)))
    return tgt, res


def truth(curve, tgt) -> float:
    from cconv.advisor.extrapolate import first_crossing

    if not np.all(np.isfinite(curve.values)):
        return math.inf
    hit = first_crossing(curve.steps, curve.values.mean(0), tgt)
    return hit[0] if hit else math.inf


def score(tgt, runs: list, steps: int, frac: float, settings=None) -> dict:
    """Kendall tau, regret, coverage of the predictions from each run's first ``frac`` of steps."""
    from scipy.stats import kendalltau

    from cconv.advisor.extrapolate import Curve, Settings, predict

    settings = settings or Settings()

    rows = []
    for c, curve in runs:
        keep = curve.steps <= frac * steps + 1e-9
        p = predict(Curve(curve.steps[keep], curve.values[:, keep]), tgt, settings)
        rows.append(
            dict(
                candidate=c.name,
                status=p.status,
                reason=p.reason,
                predicted=p.steps,
                lo=p.lo,
                hi=p.hi,
                actual=truth(curve, tgt),
            )
        )
    big = 1e12
    pred = np.array([r["predicted"] if math.isfinite(r["predicted"]) else big for r in rows])
    act = np.array([r["actual"] if math.isfinite(r["actual"]) else big for r in rows])
    tau = float(kendalltau(pred, act).statistic)
    best = act.min()
    pick = int(np.argmin(pred))
    if pred[pick] >= big:  # nothing ranked: the advisor makes no recommendation
        regret, pick_name = math.nan, "no recommendation"
    else:
        regret = float(act[pick] / best) if best < big and act[pick] < big else math.inf
        pick_name = rows[pick]["candidate"]
    cov = [
        r["lo"] <= r["actual"] <= r["hi"] for r in rows if math.isfinite(r["predicted"]) and math.isfinite(r["actual"])
    ]
    return dict(
        budget=frac,
        tau=tau,
        regret=regret,
        pick=pick_name,
        coverage=float(np.mean(cov)) if cov else math.nan,
        covered=int(sum(cov)),
        checked=len(cov),
        ranked=int(sum(math.isfinite(r["predicted"]) for r in rows)),
        rows=rows,
    )


def wall_times(task: str, spec: dict, out: str, measure: bool = True) -> dict | None:
    """The advisor at 10 % vs one full dense run (1 seed), one after the other in this process."""
    import cconv
    from cconv.advisor import api, probes
    from cconv.advisor.space import Candidate
    from cconv.experiments import runner

    cache = os.path.join(out, task, "wall.json")
    if os.path.exists(cache):
        with open(cache) as fh:
            return json.load(fh)
    if not measure:
        return None
    cfg, _ = api.load_config(dict(spec["base"]))
    dense = probes.probe_config(cfg, Candidate("none", {"compressor": {"name": "none"}}), cfg.steps, 1, WORKERS)
    t = time.perf_counter()
    runner.execute(dense, os.path.join(out, task, "_wall_dense"), desc="dense")
    dense_s = time.perf_counter() - t
    block = dict(SPACE, target=spec["target"])
    base = dict(spec["base"], advise=block)
    t = time.perf_counter()
    adv = cconv.advise(base, f"1x{WORKERS}", probe=0.1, seeds=SEEDS, out=os.path.join(out, task, "_wall_advise"))
    advise_s = time.perf_counter() - t
    n = len({r.candidate for r in adv.rows})
    res = dict(dense_s=dense_s, advise_s=advise_s, ratio=advise_s / dense_s, candidates=n)
    with open(cache, "w") as fh:
        json.dump(res, fh)
    return res


KAPPAS = tuple(round(0.05 * i, 2) for i in range(31))  # the extrapolation term's grid, 0 ... 1.5
CALIBRATION_COVERAGE = 0.8  # the calibration task's coverage at every budget: the 70 % goal plus a margin


def calibrate(tgt, runs: list, steps: int) -> float:
    """The smallest kappa whose coverage on this (the calibration) task is >= 80 % at every probe
    budget of ``BUDGETS`` (a budget with nothing to check counts as met)."""
    from cconv.advisor.extrapolate import Settings

    for k in KAPPAS:
        cs = [score(tgt, runs, steps, f, Settings(kappa=k))["coverage"] for f in BUDGETS]
        if all(not math.isfinite(c) or c >= CALIBRATION_COVERAGE for c in cs):
            return k
    return KAPPAS[-1]


def task_result(task: str, spec: dict, tgt, runs: list, gt_s: float, settings) -> dict:
    steps = spec["base"]["steps"]
    return dict(
        task=task,
        target=str(tgt),
        steps=steps,
        seeds=SEEDS,
        candidates=len(runs),
        settings=settings._asdict(),
        ground_truth_s=gt_s,
        budgets=[score(tgt, runs, steps, f, settings) for f in BUDGETS],
    )


def _f(x: float, fmt: str = "{:.2f}") -> str:
    if isinstance(x, float) and math.isinf(x):
        return "inf (the pick never reaches the target)"
    return fmt.format(x) if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def markdown(results: list, command: str) -> str:
    lines = [
        "# `cconv advise` validation (generated by experiments/advise/validate.py)",
        "",
        f"Command: `{command}`",
        "",
        f"Goals at a 10 % probe: Kendall tau >= {GOALS['tau']}, top-1 regret <= {GOALS['regret']}, "
        f"coverage >= {GOALS['coverage']:.0%}, advisor wall time <= {GOALS['wall_ratio']}x one full dense run.",
        "",
        "| task | target | candidates | probe | Kendall tau | top-1 regret (pick) | coverage | ranked |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for b in r["budgets"]:
            lines.append(
                f"| {r['task']} | {r['target']} | {r['candidates']} | {b['budget']:.0%} | {_f(b['tau'])} | "
                f"{_f(b['regret'])} ({b['pick']}) | {_f(b['coverage'], '{:.0%}')} ({b['covered']}/{b['checked']}) | "
                f"{b['ranked']} |"
            )
    lines += ["", "| task | advisor at 10 % (s) | one full dense run (s) | ratio |", "|---|---|---|---|"]
    for r in results:
        w = r.get("wall")
        if w:
            lines.append(f"| {r['task']} | {w['advise_s']:.0f} | {w['dense_s']:.0f} | {w['ratio']:.1f}x |")
    lines += ["", "Per candidate at 10 % (predicted [interval] vs actual steps to target):", ""]
    for r in results:
        b = next(x for x in r["budgets"] if abs(x["budget"] - 0.1) < 1e-9)
        lines.append(f"- **{r['task']}**")
        for row in b["rows"]:
            pred = (
                f"{row['predicted']:.0f} [{row['lo']:.0f}, {row['hi']:.0f}]"
                if math.isfinite(row["predicted"])
                else f"{row['status']} ({row['reason']})"
            )
            act = f"{row['actual']:.0f}" if math.isfinite(row["actual"]) else "not reached"
            lines.append(f"  - {row['candidate']}: {pred}; actual {act}")
    return "\n".join(lines) + "\n"


def _legend(plt) -> list:
    from matplotlib.lines import Line2D

    return [
        Line2D([], [], marker="o", ls="", color="C0", ms=4, label="predicted [interval] holds the actual"),
        Line2D([], [], marker="o", ls="", color="C3", ms=4, label="actual outside the predicted interval"),
        Line2D([], [], marker="o", ls="", mfc="none", mec="k", ms=9, label="the advisor's pick"),
        Line2D([], [], marker="x", ls="", color="0.5", label="not ranked (flagged)"),
        Line2D([], [], ls="--", color="k", lw=0.8, label="predicted = actual"),
        Line2D([], [], color="0.7", lw=0.8, label="full-run step budget"),
    ]


def figure(results: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4.6), constrained_layout=True, squeeze=False)
    for ax, r in zip(axes[0], results):
        b = next(x for x in r["budgets"] if abs(x["budget"] - 0.1) < 1e-9)
        his = [row["hi"] for row in b["rows"] if math.isfinite(row["hi"])]
        lim = max([r["steps"] * 1.6, *(1.3 * h for h in his)])
        names = [row["candidate"] for row in b["rows"]]
        for row in b["rows"]:
            act = row["actual"] if math.isfinite(row["actual"]) else lim
            if not math.isfinite(row["predicted"]):
                ax.plot([act], [lim], "x", color="0.5")
                continue
            inside = row["lo"] <= row["actual"] <= row["hi"]
            ax.errorbar(
                act,
                row["predicted"],
                yerr=[[row["predicted"] - row["lo"]], [row["hi"] - row["predicted"]]],
                fmt="o",
                color="C0" if inside else "C3",
                capsize=2,
                ms=4,
            )
        if b["pick"] in names:  # the advisor's recommendation: a ring around its point
            row = b["rows"][names.index(b["pick"])]
            act = row["actual"] if math.isfinite(row["actual"]) else lim
            ax.plot([act], [row["predicted"]], "o", mfc="none", mec="k", ms=11, mew=1.4)
        lo = max(1.0, r["steps"] * 0.02)
        ax.plot([lo, lim], [lo, lim], "k--", lw=0.8)
        ax.legend(handles=_legend(plt), fontsize=7, loc="lower right")
        ax.axvline(r["steps"], color="0.7", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, lim * 1.1)
        ax.set_ylim(lo, lim * 1.1)
        ax.set_xlabel("actual steps to target (full runs; right edge: not reached)")
        ax.set_ylabel("predicted from a 10 % probe (top edge x: not ranked)")
        ax.set_title(
            f"{r['task']} ({r['target']}): tau {_f(b['tau'])}, regret {_f(b['regret'])}, "
            f"coverage {_f(b['coverage'], '{:.0%}')}",
            fontsize=9,
        )
        ax.grid(alpha=0.3, which="both")
    fig.savefig(path, dpi=120)
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
    ap.add_argument("--out", default=os.path.join("results", "advise-validation"), help="run directories")
    ap.add_argument("--no-wall", action="store_true", help="measure no new advisor wall time (cached ones used)")
    ap.add_argument(
        "--calibrate", action="store_true", help="set kappa on the first task; the others are checked with it"
    )
    ap.add_argument("--results", default=HERE, help="where results.json/.md and validation.png go")
    ap.add_argument(
        "--candidates", help="train only these candidates (comma-separated indices) and stop: to share the work"
    )
    ap.add_argument("--finished-only", action="store_true", help="score only the full runs that have finished")
    args = ap.parse_args(argv)
    if args.candidates:  # a worker process: train its share of the full runs, score nothing
        for task in args.tasks:
            full_runs(task, TASKS[task], args.out, [int(i) for i in args.candidates.split(",")])
        return 0
    command = "PYTHONPATH=. python experiments/advise/validate.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    from cconv.advisor.extrapolate import Settings

    settings, results = Settings(), []
    for i, task in enumerate(args.tasks):
        t = time.perf_counter()
        tgt, runs = full_runs(task, TASKS[task], args.out, finished_only=args.finished_only)
        gt_s = time.perf_counter() - t
        if i == 0 and args.calibrate:
            settings = Settings(kappa=calibrate(tgt, runs, TASKS[task]["base"]["steps"]))
            print(f"kappa calibrated on {task}: {settings.kappa}", flush=True)
        res = task_result(task, TASKS[task], tgt, runs, gt_s, settings)
        res["calibration_task"] = i == 0 and args.calibrate
        wall = wall_times(task, TASKS[task], args.out, measure=not args.no_wall)  # cached when measured before
        if wall is not None:
            res["wall"] = wall
        results.append(res)
        md = markdown(results, command.strip())
        print(md, flush=True)
        os.makedirs(args.results, exist_ok=True)
        with open(os.path.join(args.results, "results.json"), "w") as fh:
            json.dump(_clean({"command": command.strip(), "goals": GOALS, "tasks": results}), fh, indent=1)
        with open(os.path.join(args.results, "results.md"), "w") as fh:
            fh.write(md)
        figure(results, os.path.join(args.results, "validation.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
