"""What if a prediction combined the curve families instead of taking the best one alone?

``cconv.advisor.extrapolate`` takes steps to target from the family that predicts a curve's own
held-out last points best; the families nearly as good (within ``family_slack`` of its error) only
widen the interval.  Domhan et al. (2015) combine parametric families instead; and where a short
curve matches a survivor's, the survivor's stretched shape (``warp``) carries more of the task than
a two-parameter extrapolation from 8 points.  The variants (the interval's terms as shipped):

* ``near``: log t* the mean over the families within ``family_slack`` of the best held-out error;
* ``weighted``: log t* the mean over every family that reaches the target, weighted 1 / rmse^2;
* ``warp`` / ``warp2`` / ``warp3``: a ``warp`` fit within 1.5x / 2x / 3x the best held-out error
  is taken before any other family.

Scored with the constants the advisor ships on the 64 cases of ``clusters.py`` (8 tasks x 4
clusters x 2 sets), the tuning and the held-out tasks at 1x8 at the tasks' setting apart::

    PYTHONPATH=. python studies/advise/combine_whatif.py   (needs validate.py's full runs; ~1 min a variant)

Printed 2026-11-29 on the tree of commit e41f73e, before the stretched exponential and the
constants chosen with it (docs/advise_validation.md, "On clusters it was not tuned on"); not kept.
Today's tree prints other numbers.
"""

from __future__ import annotations

import math
import os
import sys
from unittest import mock

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clusters  # noqa: E402  (the study's own modules, beside this file)

from cconv.advisor import curves, extrapolate  # noqa: E402

E = extrapolate
VARIANTS = ("shipped", "near", "weighted", "warp", "warp2", "warp3")


def _chosen(kind: str, good: list, near: list) -> tuple:
    """(the fit whose seeds size the interval, log t*) for one variant."""
    f0, lt0 = good[0]
    if kind == "near":
        return f0, float(np.mean([lt for _, lt in near]))
    if kind == "weighted":
        w = np.array([1.0 / max(f.holdout_rmse, 1e-3) ** 2 for f, _ in good])
        return f0, float(np.sum(w * np.array([lt for _, lt in good])) / w.sum())
    slack = float(kind[4:] or 1.5)
    warps = [(f, lt) for f, lt in good if f.family == "warp" and f.holdout_rmse <= slack * max(f0.holdout_rmse, 1e-3)]
    return warps[0] if warps else (f0, lt0)


def variant(kind: str):
    """``extrapolate._extrapolate`` with the point chosen by ``_chosen``."""

    def _extrapolate(xs, values, mean, target, settings, refs):
        level = math.log(max(target.gap_target, 1e-12))
        fits = curves.scored(xs, E.log_gap(target, mean), refs, settings.holdout)
        good = [(f, lt) for f, lt in ((f, E._log_t(f, level)) for f in fits) if math.isfinite(lt)]
        if not good:
            return E._none("stalled", "no curve family brings the gap to the target")
        best = good[0][0].holdout_rmse
        near = [(f, lt) for f, lt in good if f.holdout_rmse <= settings.family_slack * max(best, 1e-3)]
        f0, lt = _chosen(kind, good, near)
        var_family = float(np.var([x for _, x in near])) if len(near) > 1 else 0.0
        var_seed = E._seed_variance(xs, values, target, f0, refs, level)
        return E._interval(lt, var_seed, var_family, f0.family, float(xs[-1]), settings)

    return _extrapolate


def line(kind: str) -> str:
    if kind == "shipped":
        rows = clusters.collect_afresh()
    else:
        with mock.patch.object(E, "_extrapolate", variant(kind)):  # the race's refinement reads the predictions
            rows = clusters.collect_afresh()
    return clusters.what_if_line(kind, rows)


def main() -> int:
    for kind in sys.argv[1:] or VARIANTS:
        print(line(kind), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
