"""What if the exponential family were fitted to the curve's tail, or left out?  The validation's
race replayed on its full runs (1x8, the tasks' setting) with three variants of the ``exp`` family
(``cconv.advisor.curves``), each with z, kappa and kappa_slow chosen again by validate.py's own
rule on the tuning tasks, beside the shipped families and constants.

Why: predicted from short curves the ``exp`` family is optimistic (``clusters.py``'s family table:
on the tuning tasks every one of its predictions was short of the actual steps); a sum of
exponentials' rate falls as its fast modes die out, so a line through all of log e's points
overstates the rate at the end.  The variants:

* ``tail``: fitted to the last 60 % of the points (as ``power`` is), the rate at the curve's end;
* ``from 12``: fitted only to curves of at least 12 logged points;
* ``off``: left out (power, log-logistic and warp only).

    PYTHONPATH=. python studies/advise/exp_family_whatif.py   (needs validate.py's full runs; ~7 min)

Printed 2026-11-28 (docs/advise_validation.md, "On clusters it was not tuned on"); none kept.
"""

from __future__ import annotations

import math
import os
import sys
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import validate  # noqa: E402  (the study's own module, beside this file)

from cconv.advisor import curves  # noqa: E402

FIT_EXP, FITTERS = curves.fit_exp, curves.fitters


def _tail(t, le):
    n = min(len(t), max(3, math.ceil(curves.POWER_TAIL * len(t))))
    return FIT_EXP(t[-n:], le[-n:])


def _from12(t, le):
    return FIT_EXP(t, le) if len(t) >= 12 else None


def _off(refs=()):
    return [f for f in FITTERS(refs) if f is not curves.fit_exp]


VARIANTS = {
    "shipped": {},
    "tail": {"fit_exp": _tail},
    "from 12": {"fit_exp": _from12},
    "off": {"fitters": _off},
}


def _patched(name: str):
    patch = VARIANTS[name]
    if "fitters" in patch:
        return mock.patch.object(curves, "fitters", patch["fitters"])
    if "fit_exp" in patch:  # ``fitters`` reads the module's name when it is called
        return mock.patch.object(curves, "fit_exp", patch["fit_exp"])
    return mock.patch.object(curves, "fit_exp", FIT_EXP)


def main() -> int:
    from cconv.advisor.extrapolate import Settings

    out = os.path.join("results", "advise-validation")
    truths = {task: validate.timed_truth(task, out) for task in validate.TASKS}
    print("| variant | z, kappa, kappa_slow | task | Kendall tau | regret | coverage | width | goals |")
    print("|---|---|---|---|---|---|---|---|")
    for name in VARIANTS:
        with _patched(name):
            validate._RACES.clear()  # the race's refinement reads the predictions: raced again per variant
            st = Settings() if name == "shipped" else validate.calibrate(truths, out)
            for task, truth in truths.items():
                steps = validate.TASKS[task]["base"]["steps"]
                b = validate.score(task, truth, validate._target(task, out), steps, 1.0, st)
                met = "all but wall" if all(validate._met(b)) else "missed"
                print(
                    f"| {name} | {st.z}, {st.kappa}, {st.kappa_slow} | {task} | {b['tau']:.2f} | {b['regret']:.2f} | "
                    f"{b['coverage']:.0%} | {b['width']:.2f} | {met} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
