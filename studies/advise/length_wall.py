"""Does the advisor's wall time approach one dense run's as the run gets longer?

The validation tasks train 160-300 steps, where building the candidates' programs is most of
``cconv advise``'s time.  Here the digits validation task (8 candidates, 3 seeds, 1x8) runs with
its step budget multiplied (the budget, one dense run of steps, grows with it; the target stays),
each command a fresh process, one after the other:

* ``dense``: ``cconv run`` of the dense config;
* ``advise``: ``cconv advise`` as shipped (on CPU its probes use the fast build,
  ``cconv.advisor.probes.FAST_BUILD``);
* ``XLA defaults``: the same, its probes built with XLA's default options;
* ``1 seed``: the same as shipped with ``--seeds 1``.

    PYTHONPATH=. python studies/advise/length_wall.py [STEPS ...]     (default 300 1200 3000; ~3 min)

Needs ``results/advise-validation/digits/_wall/config.yaml`` (``validate.py --wall`` writes it).
Printed 2026-11-29 (docs/advise_validation.md, "Where the wall time goes").
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIG = os.path.join(ROOT, "results", "advise-validation", "digits", "_wall", "config.yaml")
ENV = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
DEFAULTS = (  # cconv's command line, the probes built with XLA's default options
    "import sys; from cconv.advisor import probes; probes.FAST_BUILD = {}; "
    "from cconv.cli import main; sys.exit(main(sys.argv[1:]))"
)
ADVISE = ["--cluster", "1x8"]


def _timed(argv: list) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True, env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def row(steps: int, tmp: str) -> str:
    with open(CONFIG) as fh:
        cfg = dict(yaml.safe_load(fh), steps=steps)
    adv, dense = os.path.join(tmp, f"advise-{steps}.yaml"), os.path.join(tmp, f"dense-{steps}.yaml")
    with open(adv, "w") as fh:
        yaml.safe_dump(cfg, fh)
    with open(dense, "w") as fh:
        yaml.safe_dump({k: v for k, v in cfg.items() if k != "advise"}, fh)
    out = lambda name: os.path.join(tmp, f"{name}-{steps}")  # noqa: E731
    py = sys.executable
    t = {
        "dense": _timed([py, "-m", "cconv", "run", dense, "--out", out("dense")]),
        "advise": _timed([py, "-m", "cconv", "advise", adv, *ADVISE, "--seeds", "3", "--out", out("advise")]),
        "defaults": _timed([py, "-c", DEFAULTS, "advise", adv, *ADVISE, "--seeds", "3", "--out", out("defaults")]),
        "one seed": _timed([py, "-m", "cconv", "advise", adv, *ADVISE, "--seeds", "1", "--out", out("one")]),
    }
    d = t["dense"]
    cells = " | ".join(f"{t[k]:.1f} ({t[k] / d:.1f}x)" for k in ("advise", "defaults", "one seed"))
    return f"| {steps} | {d:.1f} | {cells} |"


def main(argv: list) -> int:
    steps = [int(a) for a in argv] or [300, 1200, 3000]
    print("| steps | dense run (s) | advise (s, / dense) | probes at XLA's defaults | 1 seed |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for n in steps:
            print(row(n, tmp), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
