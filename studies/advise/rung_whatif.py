"""What if the race compared its first rung at equal time even where the minimum of steps binds?

The race (``cconv.advisor.race``) orders the candidates still running by the gap to the target at
the time every one of them has trained, read on each curve at that time / its own seconds per step
-- but never before ``MIN_STEPS`` (8).  When the budget is small for the number of candidates, the
first rung gives every candidate those 8 steps, and the candidates whose steps are dear have then
trained longer than the others: they are read at 8 steps, at more time on the cluster than the
cheap ones, so the first rung compares at equal *steps*.  It is the rung where a communication-
bound cluster's dense baseline (its step the dearest) is pruned.

The variant (``forward``): compare at a later time, the longest any running candidate has trained
but at most 3x the shortest, and read a candidate that has not trained that long from its curve's
best-fitting family (``cconv.advisor.extrapolate.metric_at``: at most a 3x extrapolation), so
every candidate is compared at the same time on the cluster.  Scored like ``clusters.py``: the
validation's full runs on its four clusters, both sets (the tasks' setting and cconv's defaults),
7 tasks each, with the constants the advisor ships::

    PYTHONPATH=. python studies/advise/rung_whatif.py   (needs validate.py's full runs; ~1 min)

Printed 2026-11-28 (docs/advise_validation.md, "What was measured and tried"); not kept.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clusters  # noqa: E402  (the study's own modules, beside this file)
import validate  # noqa: E402

from cconv.advisor import race  # noqa: E402
from cconv.advisor.extrapolate import metric_at  # noqa: E402

CAP = 3.0  # the comparison time is at most this multiple of the shortest time trained


def forward_score(standings: list, target):
    """The rung's order key at one time for every running candidate (module docstring)."""
    times = [s.steps * s.arm.step_s for s in standings if s.status == "running"]
    t = min(max(times), CAP * min(times)) if times else 0.0

    def key(s) -> float:
        n = max(t / s.arm.step_s, race.MIN_STEPS)
        if n <= s.curve.steps[-1] + 1e-9:
            return race.gap_at(s.curve, n, target)
        m = metric_at(s.curve, target, n)
        if not math.isfinite(m):
            return race.gap_at(s.curve, s.curve.steps[-1], target)
        return float(np.log(max(target.gap(np.asarray([m]))[0], 1e-12)))

    return key


def scored(score) -> list:
    """clusters.collect()'s rows with the race's order key ``score``."""
    race.equal_time_score, shipped = score, race.equal_time_score
    try:
        return clusters.collect_afresh()
    finally:
        race.equal_time_score = shipped
        validate._RACES.clear()


def summary(rows: list) -> str:
    b = [r["score"] for r in rows]
    taus = [x["tau"] for x in b]
    met = [validate._met(x) for x in b]
    held = [x["tau"] for x, r in zip(b, rows, strict=True) if r["task"] in validate.HELD_OUT]
    return (
        f"tau >= 0.7 in {sum(t >= 0.7 for t in taus)} of {len(b)}, median tau {np.median(taus):.2f}, "
        f"regret <= 1.10 in {sum(x['regret'] <= 1.1 for x in b)}, "
        f"never reaching {sum(math.isinf(x['regret']) for x in b)}, "
        f"coverage/width goal in {sum(m[2] for m in met)}, every goal in {sum(all(m) for m in met)}; "
        f"held-out tasks tau >= 0.7 in {sum(t >= 0.7 for t in held)} of {len(held)}"
    )


def main() -> None:
    shipped, forward = scored(race.equal_time_score), scored(forward_score)
    print(f"shipped:  {summary(shipped)}")
    print(f"forward:  {summary(forward)}")
    for a, b in zip(shipped, forward, strict=True):
        x, y = a["score"], b["score"]
        if validate._met(x) != validate._met(y) or abs(x["tau"] - y["tau"]) > 0.05:
            where = f"{a['set']}, {a['cluster']} {a['network'] or ''}".strip()
            tau, regret = f"{x['tau']:.2f} -> {y['tau']:.2f}", f"{x['regret']:.2f} -> {y['regret']:.2f}"
            print(f"  {where}, {a['task']}: tau {tau}, regret {regret}")


if __name__ == "__main__":
    main()
