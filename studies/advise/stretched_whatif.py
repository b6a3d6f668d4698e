"""What if the stretched exponential family (``cconv.advisor.curves.fit_stretched``) were left
out, allowed a beta above 1 (a decay faster than exponential), or fitted only to curves of 12
points or more?  Scored with the constants the advisor ships on the 64 cases of ``clusters.py``
(8 tasks x 4 clusters x 2 sets), the tuning and held-out tasks at 1x8 at the tasks' setting apart::

    PYTHONPATH=. python studies/advise/stretched_whatif.py   (needs validate.py's full runs; ~1 min a variant)

Printed 2026-11-29 (docs/advise_validation.md, "The stretched exponential").
"""

from __future__ import annotations

import os
import sys
from unittest import mock

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clusters  # noqa: E402  (the study's own modules, beside this file)

from cconv.advisor import curves  # noqa: E402

FIT, FITTERS = curves.fit_stretched, curves.fitters


def _without(refs=()):
    return [f for f in FITTERS(refs) if f is not curves.fit_stretched]


def _min_points(n: int):
    return lambda t, le: FIT(t, le) if len(t) >= n else None


VARIANTS = {
    "shipped": {},
    "without": {"fitters": _without},
    "beta<=1.5": {"STRETCH": np.geomspace(0.15, 1.5, 40)},
    ">=12 points": {"fit_stretched": _min_points(12)},
}


def line(name: str) -> str:
    patches = [mock.patch.object(curves, k, v) for k, v in VARIANTS[name].items()]
    for p in patches:
        p.start()
    try:
        rows = clusters.collect_afresh()
    finally:
        for p in patches:
            p.stop()
    return clusters.what_if_line(name, rows)


def main() -> int:
    for name in sys.argv[1:] or VARIANTS:
        print(line(name), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
