"""The docs' samples of measured timing: ``cconv advise --timing measured`` and ``cconv plan
--measure`` run on this machine (simulated CPU devices), their output written as it came.

    python studies/advise/measured.py          # writes measured_advise.md, measured_plan.md here

Each file holds the command, the machine's load when it ran, and the command's output verbatim
(``docs/advise.md`` and ``docs/clusters.md`` include them), so no number in them is typed.  The run
config is ``measured.yaml`` beside this script; the plan's second table uses a device profile that
``cconv calibrate`` measures on the same machine first (so its model describes this CPU).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIG = "measured.yaml"


def _run(args: list[str], cwd: str) -> tuple[str, float]:
    """(stdout, seconds) of ``cconv ARGS`` in a fresh process in ``cwd`` (the CLI sets the devices)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", CCONV_PROGRESS="0", PYTHONPATH=ROOT)
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "cconv", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"cconv {' '.join(args)} failed:\n{r.stderr}")
    return r.stdout, time.perf_counter() - t


def _block(args: list[str], cwd: str) -> str:
    out, secs = _run(args, cwd)
    load = os.getloadavg()[0]
    cmd = "cconv " + " ".join(args)
    return (
        f"On {os.cpu_count()} CPU cores, load average {load:.1f}, {time.strftime('%Y-%m-%d')}; "
        f"the command took {secs:.0f} s:\n\n```console\n$ {cmd}\n{out.rstrip()}\n```\n"
    )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:  # the commands run there, on a copy of the config
        shutil.copy(os.path.join(HERE, CONFIG), tmp)
        adv = ["advise", CONFIG, "--cluster", "1x4", "--target", "test_accuracy=0.85", "--seeds", "2"]
        adv += ["--timing", "measured", "--measure-steps", "20", "--out", "advice"]
        text = _block(adv, tmp)
        with open(os.path.join(HERE, "measured_advise.md"), "w") as f:
            f.write(text)
        _run(["calibrate", "--out", "cpu.json", "--methods", "topk,signsgd,qsgd", "--sizes", "10000,100000"], tmp)
        plan = ["plan", "--cluster", "1x4", "--measure", CONFIG, "--methods", "none,topk,gtopk,signsgd,qsgd,none-ps"]
        plan += ["--ratios", "0.1", "--schedule", "bsp", "--measure-steps", "20"]
        text = _block(plan, tmp) + "\n" + _block([*plan, "--device-profile", "cpu.json"], tmp)
        with open(os.path.join(HERE, "measured_plan.md"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
