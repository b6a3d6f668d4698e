"""What if the race never left the dense baseline behind?

Every speedup the advisor prints is over the dense baseline, and on a communication-bound cluster
dense has the dearest step: at the first rung's equal time it trains its minimum of 8 steps, is
pruned, and is ranked from an extrapolation of those 8 points (on 8x1 over 1 GbE an exponential
fit puts it at 26 steps on digits, actual 87).  The variant runs the baseline on beside the
survivors after every halving rung in which it was pruned (through the race's ``revive``, beside
the candidate ``cconv.advisor.api.revived`` names), and scores the 64 cases of ``clusters.py``
(four clusters, both sets, eight tasks) with the constants the advisor ships::

    PYTHONPATH=. python studies/advise/baseline_whatif.py   (needs validate.py's full runs; ~1 min)

Printed 2026-11-29 (docs/advise_validation.md, "What was measured and tried"); not kept.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clusters  # noqa: E402  (the study's own module, beside this file)

from cconv.advisor import race  # noqa: E402

GOALS = ("tau", "regret", "coverage", "width")


def _keeping_baseline(real):
    """``race.race`` with its ``revive`` also naming the baseline (the first arm) when pruned."""

    def run(arms, observe, target, max_steps, budget, **kw):
        base, revive = arms[0].name, kw.get("revive")

        def also_baseline(standings):
            out = list(revive(standings)) if revive else []
            pruned = any(s.arm.name == base and s.status == race.PRUNED for s in standings)
            return out + [base] if pruned and base not in out else out

        return real(arms, observe, target, max_steps, budget, **dict(kw, revive=also_baseline))

    return run


def main() -> int:
    shipped = clusters.collect_afresh()
    real, race.race = race.race, _keeping_baseline(race.race)
    try:
        variant = clusters.collect_afresh()
    finally:
        race.race = real
    f = clusters.V._f
    for a, b in zip(shipped, variant, strict=True):
        moved = [f"{k} {f(a['score'][k])} -> {f(b['score'][k])}" for k in GOALS if f(a["score"][k]) != f(b["score"][k])]
        if moved:
            print(f"{a['set'][:18]:18s} {a['cluster']} {a['network'] or '':7s} {a['task']:8s} " + "; ".join(moved))
    for name, rows in (("shipped", shipped), ("baseline kept", variant)):
        met = [clusters.V._met(r["score"]) for r in rows]
        print(
            f"{name}: tau >= 0.7 in {sum(m[0] for m in met)}, regret <= 1.1 in {sum(m[1] for m in met)}, "
            f"coverage and width in {sum(m[2] for m in met)} of {len(rows)} cases"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
