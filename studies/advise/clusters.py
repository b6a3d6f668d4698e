"""The advice on clusters it was not tuned on: the validation's full runs, scored for other clusters.

``validate.py`` scores ``cconv advise`` on one cluster, 1x8 (eight GPUs in one node), where the
extrapolation's constants were chosen; there a step's time is mostly compute and compression
changes it little.  A step's computation does not depend on the cluster, so the same full runs are
the ground truth on any cluster of 8 GPUs: only each candidate's seconds per step change (the
advisor's model of the cluster, ``cconv.advisor.steptime``), and with them the race (rungs of
equal time on the cluster give each candidate other steps), the times to target and their order.
This scores the advice, with the constants the advisor ships and nothing re-chosen, on clusters
from compute-bound to communication-bound, for the tasks' setting and for cconv's defaults (1-D
tensors dense), against the seeds it saw and against three it never saw::

    PYTHONPATH=. python studies/advise/clusters.py

It reads the full runs of ``validate.py --truth`` (four sets: ``--out`` below, ``--first-seed 3``
for the ``-seeds3`` ones) and writes ``studies/advise/clusters/results.{md,json}``; each
candidate's step times on a cluster are cached beside its runs (``validate._on_cluster``).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import validate as V  # noqa: E402  (the validation's tasks, runs and scoring)

from cconv.advisor.curves import FAMILIES  # noqa: E402

CLUSTERS = (  # (NODESxGPUS, network): compute-bound first
    ("1x8", None),
    ("8x1", "100GbIB"),
    ("2x4", "10GbE"),
    ("8x1", "1GbE"),
)
SETS = (  # (name, full runs, 1-D tensors compressed)
    ("the tasks' setting", os.path.join("results", "advise-validation"), True),
    ("cconv's defaults", os.path.join("results", "advise-validation-dense-vectors"), False),
)


def _score(task: str, out: str) -> dict:
    truth = V.timed_truth(task, out)
    other_dir = out + "-seeds3"
    other = V.ground_truth(task, other_dir) if os.path.exists(os.path.join(other_dir, task, "truth.json")) else None
    b = V.score(task, truth, V._target(task, out), V.TASKS[task]["base"]["steps"], independent=other)
    b["pick_reaches"] = not math.isinf(b["regret"])  # JSON keeps inf as null, like NaN
    b["pick_reaches_other"] = not math.isinf(b.get("regret_other", math.nan))
    baseline, compressed = _kinds(task, out)
    b["dense_over_fastest_compressed"] = truth[baseline]["step_s"] / min(truth[n]["step_s"] for n in compressed)
    return b


_KINDS: dict = {}


def collect_afresh() -> list:
    """``collect()`` raced again (the replayed races cleared: a study that patches the race or the
    curve families) and without its progress lines."""
    V._RACES.clear()
    with contextlib.redirect_stdout(io.StringIO()):
        return collect()


def what_if_line(name: str, rows: list) -> str:
    """One line of a what-if study (``collect_afresh`` under a patch): goals met over the cases, the
    median tau, and the tuning and held-out tasks at 1x8 at the tasks' setting apart."""
    bs = [r["score"] for r in rows]
    met = [V._met(b) for b in bs]
    at1x8 = [r for r in rows if r["cluster"] == "1x8" and r["set"] == SETS[0][0]]
    tune = [r["score"] for r in at1x8 if r["task"] in V.TUNE]
    held = [r["score"] for r in at1x8 if r["task"] in V.HELD_OUT]
    listed = lambda scores, key: " ".join(f"{b[key]:.2f}" for b in scores)  # noqa: E731
    return (
        f"{name:11s} all {len(bs)}: tau {sum(m[0] for m in met)}, regret {sum(m[1] for m in met)}, "
        f"coverage/width {sum(m[2] for m in met)}, every goal {sum(all(m) for m in met)}, median tau "
        f"{np.median([b['tau'] for b in bs]):.2f} | tuning at 1x8: tau {listed(tune, 'tau')}, coverage "
        f"{listed(tune, 'coverage')} | held out at 1x8: tau {listed(held, 'tau')}, "
        f"coverage {listed(held, 'coverage')}"
    )


def _kinds(task: str, out: str) -> tuple[str, list]:
    """(the dense baseline's name, the compressed candidates' names), from the advisor's own plan
    of the task (its candidates' overrides, not their names)."""
    if (task, out) not in _KINDS:
        plan = V.plan_of(task, out)
        _KINDS[task, out] = plan.candidates[0].name, [c.name for c in plan.candidates if not c.dense]
    return _KINDS[task, out]


def collect() -> list:
    rows = []
    for set_name, out, vectors in SETS:
        for spec in V.TASKS.values():
            spec["base"]["compress_vectors"] = vectors
        for cl, net in CLUSTERS:
            V.set_cluster(cl, net)
            for task in V.TASKS:
                b = _score(task, out)
                rows.append(dict(set=set_name, cluster=cl, network=net, task=task, score=b))
                print(
                    f"{set_name} {cl} {net or ''} {task}: tau {V._f(b['tau'])} regret {V._f(b['regret'])} "
                    f"cov {V._f(b['coverage'])} width {V._f(b['width'])} "
                    f"tau_other {V._f(b.get('tau_other', math.nan))}",
                    flush=True,
                )
    return rows


def _regret(b: dict, key: str, reaches: str) -> str:
    """A regret, or ``inf`` where the recommendation never reaches the target (JSON's null)."""
    return V._f(b.get(key, math.nan)) if b.get(reaches, True) else "inf (never reaches)"


def _worst(bs: list) -> str:
    return "inf" if not all(b.get("pick_reaches", True) for b in bs) else f"{max(b['regret'] for b in bs):.2f}"


def _goals(b: dict) -> str:
    met = V._met(b)
    miss = [g for g, m in zip(("tau", "regret", "coverage/width"), met) if not m]
    return "met" if not miss else "missed: " + ", ".join(miss)


def markdown(rows: list) -> str:
    from cconv.advisor.extrapolate import Settings

    s = Settings()
    lines = [
        "# `cconv advise` on clusters it was not tuned on (generated by studies/advise/clusters.py)",
        "",
        f"The full runs of `validate.py` scored for four clusters of 8 GPUs (the advisor's step-time model of "
        f"each), with the constants the advisor ships (z = {s.z}, kappa = {s.kappa}, kappa_slow = "
        f"{s.kappa_slow}, chosen on 1x8 at the tasks' setting). `dense / fastest`: dense's seconds per step "
        "over the cheapest compressed candidate's (how much compression changes a step on that cluster). "
        "`other seeds`: the same advice against full runs of seeds 3-5.",
        "",
    ]
    for set_name, _, _ in SETS:
        lines += [
            f"**At {set_name}**",
            "",
            "| cluster | task | dense / fastest | Kendall tau | regret (pick) | coverage | width | "
            "tau, other seeds | regret, other seeds | goals |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in (r for r in rows if r["set"] == set_name):
            b = r["score"]
            where = r["cluster"] + (f" {r['network']}" if r["network"] else " (NVLink)")
            lines.append(
                f"| {where} | {r['task']} | {b['dense_over_fastest_compressed']:.2f} | {V._f(b['tau'])} | "
                f"{_regret(b, 'regret', 'pick_reaches')} ({b['pick']}) | {V._f(b['coverage'], '{:.0%}')} "
                f"({b['checked']}) | {V._f(b['width'])} | {V._f(b.get('tau_other', math.nan))} | "
                f"{_regret(b, 'regret_other', 'pick_reaches_other')} | {_goals(b)} |"
            )
        lines.append("")
        lines += _summary(rows, set_name)
    return "\n".join(lines + _speedups(rows) + _families(rows))


def _speedups(rows: list) -> list:
    """The speedup over dense of every ranked row where either time is predicted (what the table
    prints beside it), pooled over the tasks of each cluster and set: how often the actual speedup
    lies in the interval, and the median actual / predicted (below 1: the advice promised more)."""
    out = [
        "**The speedup over dense against the full runs**",
        "",
        "The speedup over dense that each ranked row prints where either time is predicted (dense's time / "
        "the row's, its interval dense's fast end over the row's slow end and the other way), against the "
        "full runs', pooled over the eight tasks (rows where either run never reaches the target left out).",
        "",
        "| set | cluster | speedups checked | actual in the interval | median actual / predicted |",
        "|---|---|---|---|---|",
    ]
    for set_name, _, _ in SETS:
        for cl, net in CLUSTERS:
            sp = [
                x
                for r in rows
                if r["set"] == set_name and r["cluster"] == cl and r["network"] == net
                for x in r["score"]["speedups"]
                if math.isfinite(x["actual"])
            ]
            hi = [x["hi"] if math.isfinite(x["hi"]) else math.inf for x in sp]  # JSON keeps an infinite end as null
            inside = np.mean([x["lo"] <= x["actual"] <= h for x, h in zip(sp, hi, strict=True)]) if sp else math.nan
            ratio = np.median([x["actual"] / x["predicted"] for x in sp]) if sp else math.nan
            where = cl + (f" {net}" if net else " (NVLink)")
            lines = f"| {set_name} | {where} | {len(sp)} | {V._f(float(inside), '{:.0%}')} | {V._f(float(ratio))} |"
            out.append(lines)
    return [*out, ""]


def _tuning_at_1x8(r: dict) -> bool:
    return r["cluster"] == "1x8" and r["set"] == SETS[0][0] and r["task"] in V.TUNE


def _nan(x):
    """A score as read back from JSON: null (a non-finite float, ``validate._clean``) -> NaN."""
    if isinstance(x, dict):
        return {k: _nan(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nan(v) for v in x]
    return math.nan if x is None else x


def load(path: str) -> list:
    """The rows of a results.json, their scores' nulls NaN again."""
    with open(path) as fh:
        rows = json.load(fh)["rows"]
    return [dict(r, score=_nan(r["score"])) for r in rows]


def _ratios(rows: list, family: str) -> list:
    """actual / predicted steps of each distinct prediction by ``family`` in ``rows`` (predicted,
    not observed, and reached in the full runs)."""
    distinct: dict = {}  # the first of each (set, task, candidate, prediction)
    for r in rows:
        for x in r["score"]["rows"]:
            if x["family"] == family and not x["observed"] and math.isfinite(x["predicted"] + x["actual"]):
                key = (r["set"], r["task"], x["candidate"], round(x["predicted"], 1))
                distinct.setdefault(key, x["actual"] / x["predicted"])
    return list(distinct.values())


def _families(rows: list) -> list:
    """How each curve family's predictions (not observed rows) compare with the full runs: all
    distinct predictions of the tables above, and those of the tuning tasks at 1x8 alone."""
    out = [
        "**The families' predictions against the full runs**",
        "",
        "Each distinct prediction of a ranked, predicted row (one that the race did not see reach the "
        "target) in the tables above, by the curve family that made it: actual steps to target / "
        "predicted (above 1: the prediction was optimistic).",
        "",
        "| family | predictions: all | median actual / predicted | optimistic | tuning tasks at 1x8 | "
        "median actual / predicted | optimistic |",
        "|---|---|---|---|---|---|---|",
    ]
    for fam in FAMILIES:
        cells = []
        for keep in (lambda r: True, _tuning_at_1x8):
            ratios = _ratios([r for r in rows if keep(r)], fam)
            med = f"{np.median(ratios):.2f}" if ratios else "-"
            share = f"{np.mean(np.asarray(ratios) > 1):.0%}" if ratios else "-"
            cells += [str(len(ratios)), med, share]
        out.append(f"| {fam} | " + " | ".join(cells) + " |")
    return [*out, ""]


def _summary(rows: list, set_name: str) -> list:
    out = ["| cluster | tasks meeting tau | regret <= 1.10 | coverage/width | median tau | worst regret |"]
    out.append("|---|---|---|---|---|---|")
    for cl, net in CLUSTERS:
        bs = [r["score"] for r in rows if r["set"] == set_name and (r["cluster"], r["network"]) == (cl, net)]
        met = np.array([V._met(b) for b in bs])
        out.append(
            f"| {cl}{f' {net}' if net else ' (NVLink)'} | {met[:, 0].sum()} of {len(bs)} | {met[:, 1].sum()} of "
            f"{len(bs)} | {met[:, 2].sum()} of {len(bs)} | {np.median([b['tau'] for b in bs]):.2f} | "
            f"{_worst(bs)} |"
        )
    return [*out, ""]


def main() -> int:
    rows = collect()
    d = os.path.join(HERE, "clusters")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "results.json"), "w") as fh:
        json.dump(V._clean(dict(clusters=CLUSTERS, rows=rows)), fh, indent=1)
    with open(os.path.join(d, "results.md"), "w") as fh:  # from the data as written (a test checks it)
        fh.write(markdown(load(os.path.join(d, "results.json"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
