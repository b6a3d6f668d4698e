"""What ending the process costs a ``cconv`` command: the same command with and without the
interpreter's teardown, interleaved.

``cconv`` (``python -m cconv``, ``cconv.cli.main`` as the process's command) ends with
``cconv.cli._end_process``: every ``atexit`` handler, stdout and stderr flushed, then ``os._exit``.
The reference runs the same command body (``cconv.cli._command``) and returns through Python's own
exit (its teardown frees jax's, XLA's and every library's objects one by one).  Each round runs
both, in alternating order, each in a fresh process; the table gives each command's median wall
time over the rounds and the median per-round saving.

    .venv/bin/python studies/benchmarks/cli_exit.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEARDOWN = "import sys; from cconv.cli import _command; sys.exit(_command(sys.argv[1:]))"
PLAN = ["plan", "--workload", "resnet50", "--cluster", "8x1", "--network", "10GbE", "--device", "v100"]
RUN_CONFIG = "model: {name: mlp, hidden: [64]}\ndata: digits\nworkers: 8\nbatch_size: 128\nlr: 0.1\nsteps: 100\n"


def _wall(argv: list[str], env: dict) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp, "run.yaml")
        cfg.write_text(RUN_CONFIG)
        commands = {"cconv plan (resnet50, 8x1)": PLAN, "cconv run (MLP, digits, 100 steps)": ["run", str(cfg)]}
        print("| command | with teardown (s) | cconv's exit (s) | saved per round (s) |")
        print("|---|---|---|---|")
        for label, cmd in commands.items():
            times: dict = {"teardown": [], "fast": []}
            for r in range(args.rounds):
                order = ("teardown", "fast") if r % 2 == 0 else ("fast", "teardown")
                for kind in order:
                    extra = ["--out", str(Path(tmp, f"{kind}-{r}"))] if cmd[0] == "run" else []
                    head = [sys.executable, "-c", TEARDOWN] if kind == "teardown" else [sys.executable, "-m", "cconv"]
                    times[kind].append(_wall([*head, *cmd, *extra], env))
            saved = statistics.median(a - b for a, b in zip(times["teardown"], times["fast"], strict=True))
            print(
                f"| {label} | {statistics.median(times['teardown']):.2f} | {statistics.median(times['fast']):.2f} "
                f"| {saved:.2f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
