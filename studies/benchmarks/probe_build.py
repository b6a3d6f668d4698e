"""What the probes' quick build costs per step: a candidate of the README's advise command built
with ``cconv.advisor.probes.FAST_BUILD``, with each half of it, and with XLA's defaults.

For each candidate and option set, in a fresh process each (XLA's caches start empty): the probe's
first 8 steps, its programs' build included, then 40 more steps (their metric lines and the
checkpoint at the pause included), as ``cconv advise`` trains them (32 workers x 3 seeds in one
program, ``studies/quickstart.yaml`` on 4x8).  The table gives seconds for the first piece and
milliseconds per step for the second.  One run each: compare within one run of this script.

    .venv/bin/python studies/benchmarks/probe_build.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = {  # the option sets compared (None: XLA's defaults)
    "FAST_BUILD": "fast",
    "LLVM -O0 only": {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True},
    "elemental emitters only": {"xla_cpu_use_fusion_emitters": False},
    "XLA's defaults": None,
}
CANDIDATES = ("THC bits=2", "EDEN bits=1 + EF", "QSGD 4 levels", "top-k 10 % + EF", "dense")
CHILD = """
import json, sys, time
from cconv.advisor import api, probes
name, opts, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
opts = probes.FAST_BUILD if opts == "fast" else opts
probes.compiler_options = lambda: opts
plan = api.prepare("studies/quickstart.yaml", "4x8", seeds=3, out=out + "/_plan")
c = next(c for c in plan.candidates if c.name == name)
pr = probes.build(probes.probe_config(plan.base, c, 3, 32, 1, plan.rules), c, out + "/probe")
t0 = time.perf_counter(); probes.train_to(pr, 8); t1 = time.perf_counter(); probes.train_to(pr, 48)
print(json.dumps([t1 - t0, (time.perf_counter() - t1) / 40]))
"""


def measure(name: str, options) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as out:
        r = subprocess.run(
            [sys.executable, "-c", CHILD, name, json.dumps(options), out],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    first, per_step = json.loads(r.stdout.strip().splitlines()[-1])
    return first, per_step


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", nargs="+", default=list(CANDIDATES))
    args = ap.parse_args(argv)
    print("| candidate | " + " | ".join(OPTIONS) + " |")
    print("|---|" + "---|" * len(OPTIONS))
    for name in args.candidates:
        cells = [measure(name, opts) for opts in OPTIONS.values()]
        print(f"| {name} | " + " | ".join(f"{a:.2f} s, {1e3 * b:.1f} ms/step" for a, b in cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
