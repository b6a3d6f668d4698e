"""What if a pruned candidate ranked no faster than the candidates that outlasted its rung?

The race (``cconv.advisor.race``) prunes a candidate when, at equal time on the cluster, its curve
is behind the ones it keeps; the table then ranks the pruned candidate from its curve's
extrapolation (``ranking.seen_time``), which can put it ahead of those that outlasted it.  If
curves never crossed, a pruned candidate could not reach the target before them.  The variant
floors a pruned row's time at the slowest seen time of the ranked rows that ran past its last
rung (``time``), or at its own step time x the most seen steps of those rows (``steps``, the
recommendation rule's bound, ``ranking.pick``), and scores Kendall tau on the validation's full
runs (the tasks' setting, cluster 1x8), with the constants the advisor ships::

    PYTHONPATH=. python studies/advise/floor_whatif.py   (needs validate.py's full runs; ~10 s)

Printed 2026-11-29 (docs/advise_validation.md, "What was measured and tried"); not kept.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import sys

import numpy as np
from scipy.stats import kendalltau

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import validate  # noqa: E402  (the study's own module, beside this file)

OUT = os.path.join("results", "advise-validation")


def floored(rows: list, standings: dict, mode: str) -> list:
    """Each row's seen time, a pruned one's floored (module docstring); inf where not ranked."""
    seen = validate.seen_steps(rows)
    times = [x * r["step_s"] for x, r in zip(seen, rows, strict=True)]
    out = list(times)
    for i, r in enumerate(rows):
        if r["race"] != "pruned" or not math.isfinite(times[i]):
            continue
        rung = standings[r["candidate"]].rung
        beat = [
            j
            for j, q in enumerate(rows)
            if j != i and math.isfinite(times[j]) and (standings[q["candidate"]].rung > rung or q["race"] != "pruned")
        ]
        if beat:
            bound = max(times[j] for j in beat) if mode == "time" else max(seen[j] for j in beat) * r["step_s"]
            out[i] = max(times[i], bound)
    return out


def tau(task: str, mode: str | None) -> float:
    truth, target = validate.ground_truth(task, OUT), validate._target(task, OUT)
    steps = validate.TASKS[task]["base"]["steps"]
    with contextlib.redirect_stdout(io.StringIO()):
        b = validate.score(task, truth, target, steps)
    if mode is None:
        return b["tau"]
    result, _ = validate.replay(task, truth, target, steps)
    rows = b["rows"]
    times = floored(rows, {s.arm.name: s for s in result.standings}, mode)
    pt = np.array([t if math.isfinite(t) else validate.BIG for t in times])
    return float(kendalltau(pt, validate._times([r["actual"] for r in rows], rows)).statistic)


def main() -> int:
    print("task      tau: shipped  floored (time)  floored (steps)")
    for task in validate.TASKS:
        print(f"{task:9s} {tau(task, None):13.2f} {tau(task, 'time'):15.2f} {tau(task, 'steps'):16.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
