"""What if the exponential family's predictions were stretched by its measured bias?

``clusters.py``'s family table finds the ``exp`` family optimistic from short curves: the actual
steps to target are 1.84x its prediction in the median over every case (2.20x over the 8 on the
tuning tasks at 1x8).  The variant multiplies every ``exp`` fit's steps to target by a factor c
(its fitted curve and held-out error unchanged, so the family is chosen as before) and scores the
advice, with the constants the advisor ships, on the 64 cases of ``clusters.py`` (8 tasks x 4
clusters x 2 sets), the tuning tasks at 1x8 and the held-out tasks apart::

    PYTHONPATH=. python studies/advise/exp_stretch_whatif.py   (needs validate.py's full runs; ~3 min)

Printed 2026-11-29 (docs/advise_validation.md, "On clusters it was not tuned on"); not kept.
"""

from __future__ import annotations

import os
import statistics
import sys
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clusters  # noqa: E402  (the study's own modules, beside this file)
import validate  # noqa: E402

from cconv.advisor import curves  # noqa: E402

FIT_EXP = curves.fit_exp
FACTORS = (1.0, 1.5, 1.8, 2.0, 2.2, 2.5)


def stretched(c: float):
    def fit_exp(t, le):
        f = FIT_EXP(t, le)
        return None if f is None else f._replace(steps_to=lambda level, s=f.steps_to: c * s(level))

    return fit_exp


def _meets(b: dict) -> dict:
    tau, regret, cov = validate._met(b)
    return {"tau": tau, "cov": cov, "all": tau and regret and cov}


def line(c: float) -> str:
    with mock.patch.object(curves, "fit_exp", stretched(c)):  # the race's refinement reads the predictions
        rows = clusters.collect_afresh()
    bs = [r["score"] for r in rows]
    met = [_meets(b) for b in bs]
    first = clusters.SETS[0][0]  # the tasks' setting
    tune = [r["score"] for r in rows if r["task"] in validate.TUNE and r["cluster"] == "1x8" and r["set"] == first]
    held = [_meets(r["score"]) for r in rows if r["task"] in validate.HELD_OUT]
    taus = " ".join(f"{b['tau']:.2f}" for b in tune)
    covs = " ".join(f"{b['coverage']:.2f}" for b in tune)
    return (
        f"c = {c:<4g} all {len(bs)}: tau {sum(m['tau'] for m in met)}, coverage/width {sum(m['cov'] for m in met)}, "
        f"every goal {sum(m['all'] for m in met)}, median tau {statistics.median(b['tau'] for b in bs):.2f} | "
        f"tuning at 1x8: tau {taus}, coverage {covs} | "
        f"held out ({len(held)}): tau {sum(m['tau'] for m in held)}, every goal {sum(m['all'] for m in held)}"
    )


def main() -> int:
    for c in FACTORS:
        print(line(c), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
