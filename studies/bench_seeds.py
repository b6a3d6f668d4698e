"""Seeds in one program: a 5-seed vmapped run against 5 separate runs of the same config.

    .venv/bin/python studies/bench_seeds.py [--steps 300] [--seeds 5] [--set key=value ...]

Both sides go through ``cconv.experiments.runner.execute`` in this one process (results in a
temporary directory, after a 1-step warm-up run that pays the one-time import costs) and include
everything a user waits for: building, compiling, training, test evaluation every ``log_every``
steps, metric files and checkpoints.  Prints the two wall
times and their ratio, and checks that every seed's final loss agrees between the two (the
vmapped program computes the same runs).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds_bench.yaml"))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)

    from cconv.cli import configure_devices
    from cconv.experiments.config import load_run

    cfg = load_run(args.config, args.set)
    configure_devices(cfg.workers)
    import jax

    from cconv.experiments import io
    from cconv.experiments.config import from_dict
    from cconv.experiments.runner import execute

    seeds = list(range(args.seeds))
    base = {**cfg.to_dict(), "network": None}
    with tempfile.TemporaryDirectory() as tmp:
        # one-time costs (imports, the dataset's first load) are paid before either side is timed
        execute(from_dict({**base, "steps": 1, "seed": 0}), os.path.join(tmp, "warm-up"))
        t = time.perf_counter()
        multi = execute(from_dict({**base, "seed": seeds}), os.path.join(tmp, "vmapped"))
        t_multi = time.perf_counter() - t
        t = time.perf_counter()
        singles = [execute(from_dict({**base, "seed": s}), os.path.join(tmp, f"seed{s}")) for s in seeds]
        t_single = time.perf_counter() - t
        vm = io.read_jsonl(os.path.join(tmp, "vmapped", io.METRICS))
        worst = 0.0
        for s, r in zip(seeds, singles):
            a = [l["loss"] for l in vm if l["seed"] == s][-1]
            b = r.summary["final"]["loss"]
            worst = max(worst, abs(a - b) / abs(b))
    print(
        f"{jax.device_count()} {jax.default_backend()} devices, {cfg.workers} workers, {cfg.steps} steps, "
        f"model {cfg.model}, compressor {cfg.compressor}, memory {cfg.memory}"
    )
    print(f"{len(seeds)} seeds as one vmapped program: {t_multi:7.2f} s  ({multi.status})")
    print(f"{len(seeds)} separate runs:                {t_single:7.2f} s")
    print(f"speedup of the vmapped program:      {t_single / t_multi:7.2f}x")
    print(f"largest relative difference of a seed's final loss: {worst:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
