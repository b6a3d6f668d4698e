"""What if the probes logged geometrically?  The validation's race replayed on its full runs with
metric lines every k steps for the first 8k steps, then 8 per doubling of the steps (about half
the test evaluations of a long probe), beside today's every k; the same constants.

    PYTHONPATH=. python studies/advise/logging_whatif.py [--calibrate]   (needs validate.py's full runs)

``--calibrate``: the geometric rows with z, kappa and kappa_slow chosen for that schedule by
validate.py's own rule.  Printed 2026-11-28 (docs/advise_validation.md, "Wall time"): text's regret 1.13 ->
1.00, noniid's coverage 83 % -> 67 %, BatchNorm's tau 0.76 -> 0.69; recalibrated (z = 1.0) the
same coverage on noniid, text's 67 %, BatchNorm's tau 0.62; not kept."""

from __future__ import annotations

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import validate  # noqa: E402  (the study's own module, beside this file)

EVERY_LOGGED = validate.logged


def geometric(at: np.ndarray, every: int, steps: int) -> np.ndarray:
    """Every ``every`` steps up to 8 * every, then a spacing that doubles with the step."""
    spacing = [every * 2 ** max(0, math.floor(math.log2(max(int(s), 1) / (8 * every)))) for s in at]
    return (np.asarray(at) % np.asarray(spacing) == 0) | (np.asarray(at) == steps)


def main() -> int:
    from cconv.advisor.extrapolate import Settings

    out = os.path.join("results", "advise-validation")
    truths = {task: validate.timed_truth(task, out) for task in validate.TASKS}
    settings = {"every k": Settings(), "geometric": Settings()}
    if "--calibrate" in sys.argv[1:]:
        validate.logged = geometric
        settings["geometric"] = validate.calibrate(truths, out)
        validate.logged = EVERY_LOGGED
    for label, st in settings.items():
        print(f"{label}: z={st.z} kappa={st.kappa} kappa_slow={st.kappa_slow}")
    print("| task | schedule | Kendall tau | regret | coverage | width |\n|---|---|---|---|---|---|")
    for task, truth in truths.items():
        for label, rule in (("every k", EVERY_LOGGED), ("geometric", geometric)):
            validate.logged = rule
            steps = validate.TASKS[task]["base"]["steps"]
            b = validate.score(task, truth, validate._target(task, out), steps, 1.0, settings[label])
            print(f"| {task} | {label} | {b['tau']:.2f} | {b['regret']:.2f} | {b['coverage']:.0%} | {b['width']:.2f} |")
    validate.logged = EVERY_LOGGED
    return 0


if __name__ == "__main__":
    sys.exit(main())
