"""The GPU check (issues 25, 33): one command, run unchanged on a machine with one GPU.

    bash scripts/gpu_check.sh              # on the GPU machine: ~15-30 min
    bash scripts/gpu_check.sh --lease      # the same steps sized to one 15-minute lease (~8 min)
    bash scripts/gpu_check.sh --dry-run    # anywhere (CPU): tiny sizes, checks that the script runs

1. ``cconv calibrate``: the device's profile (sustained FLOP/s, memory bandwidth, launch cost, each
   compressor's compress/decompress cost at 1e4 to 3e7 elements), ``gpu-<device>-profile.json``;
2. ``cconv plan --cluster 1x1 --measure gpu_measured.yaml``: each method's real training step on the
   GPU beside the model's iteration time, once modelled with that profile and once with the
   ``h100`` preset, ``gpu-<device>-plan.md`` (one worker: compute and compression, no exchange);
3. the compressor-throughput table against the device's memory-read floor (benchmark part (a),
   ``studies/benchmarks/run.py``), and the engine-overhead benchmark (part (b): every step
   configuration against a hand-written ``shard_map`` + ``pmean`` step on the machine's devices),
   written as ``studies/benchmarks/results/gpu-<device>.{json,md}``;
4. the quickstart sweep (``studies/quickstart.yaml``, 8 workers) on one GPU with the vmap
   launcher (set explicitly, every worker on the one device), its report copied to
   ``studies/benchmarks/results/gpu-<device>-quickstart.csv`` (runs under
   ``results/gpu-<device>-quickstart/``);
5. ``gpu-<device>-check.json``: the device, the commands, their exit codes and wall times.

Each step runs as its own process with a time limit (``--lease``: limits that add up to 8 minutes,
part (a) at 1e6 and 2.5e7 elements), so a step that fails or overruns leaves the others' files.
``<device>`` is the GPU's kind as jax names it, lower-cased with dashes (``nvidia-h100-80gb-hbm3``).
Without ``--dry-run`` it refuses, in one line and with exit 2, to run on a machine without a GPU,
so a CPU table is never filed under a GPU's name.  ``--dry-run`` runs every step on the default
backend at tiny sizes (part (a) at 4096 elements, part (b) on the small MLP, one top-k point of the
sweep for 2 steps) into ``--out`` and names the files ``dry-<backend>``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
QUICKSTART = ROOT / "studies" / "quickstart.yaml"
ONE_DEVICE_LAUNCHER = "vmap"

MEASURED = HERE / "gpu_measured.yaml"  # the run config of step 2
METHODS = "topk,randomk,signsgd,qsgd,powersgd,terngrad,dgc"  # calibrated (step 1) and planned (step 2)
CALIBRATE = ["--methods", METHODS, "--sizes", "10000,100000,1000000,10000000,30000000", "--repeats", "10"]
PLAN = [
    "--methods",
    f"none,{METHODS}",
    "--ratios",
    "0.01",
    "--ranks",
    "4",
    "--schedule",
    "bsp",
    "--measure-steps",
    "20",
]
BENCH_FULL = ["--parts", "a,b", "--sizes", "1e5,1e6,1e7,2.5e7", "--models", "mlp1m,mlp,cnn"]
BENCH_DRY = ["--parts", "a,b", "--sizes", "4096", "--names", "topk", "--repeats", "1"]
BENCH_DRY += ["--models", "mlp", "--batch", "8", "--steps", "1", "--b-repeats", "1", "--configs", "topk 1% + EF"]


class Mode(NamedTuple):
    """One sizing of the check: each step's arguments and its time limit in seconds."""

    calibrate: list
    plan: list
    bench: list
    limits: dict


MODES = {
    "full": Mode(CALIBRATE, PLAN, BENCH_FULL, {}),
    "lease": Mode(
        CALIBRATE,
        PLAN,
        ["--parts", "a,b", "--sizes", "1e6,2.5e7", "--models", "mlp1m,mlp,cnn", "--b-repeats", "5"],
        {"calibrate": 90, "plan": 60, "bench": 150, "sweep": 120},
    ),
    "dry": Mode(
        ["--methods", "topk", "--sizes", "1000", "--repeats", "1"],
        ["--methods", "none,topk", "--ratios", "0.01", "--schedule", "bsp", "--measure-steps", "2"],
        BENCH_DRY,
        {},
    ),
}


def slug(name: str) -> str:
    """A device name as a file-name stem: ``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def device() -> tuple[str, str, int]:
    """(backend, device kind, device count) of this machine, asked of jax in a child process (so
    that this process never holds the GPU the benchmarks need)."""
    code = "import jax, json; d = jax.devices(); print(json.dumps([jax.default_backend(), d[0].device_kind, len(d)]))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=_env())
    backend, kind, n = json.loads(out.stdout.strip().splitlines()[-1])
    return backend, kind, n


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def sweep_config(dry: bool) -> dict:
    """The quickstart sweep with every worker on one device (``launcher: vmap``); for a dry run,
    2 steps of one top-k point."""
    cfg = yaml.safe_load(QUICKSTART.read_text())
    cfg["base"]["launcher"] = ONE_DEVICE_LAUNCHER
    if dry:
        cfg["base"].update(steps=2, log_every=1, checkpoint_every=2)
        cfg["grid"] = {"compressor": [{"name": "topk", "ratio": [0.1]}], "memory": ["ef"]}
        for key in ("rules", "include"):
            cfg.pop(key, None)
    return cfg


def measured_config(dry: bool) -> dict:
    """Step 2's run config; for a dry run, a small MLP on a small batch."""
    cfg = yaml.safe_load(MEASURED.read_text())
    if dry:
        cfg.update(model={"name": "mlp", "hidden": [32]}, batch_size=64)
    return cfg


def _run(cmd: list[str], log, limit: float | None = None, cwd: Path = ROOT, stdout=None) -> dict:
    """Run ``cmd`` as its own process group, killed (the group) after ``limit`` seconds."""
    log("$ " + " ".join(cmd))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=_env(), start_new_session=True, stdout=stdout)
    try:
        rc = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
        log(f"gpu_check: stopped after its limit of {limit:.0f} s")
    return {"command": " ".join(cmd), "returncode": rc, "wall_s": round(time.perf_counter() - t0, 1)}


def _plan(mode: Mode, profile: Path, out: Path, tag: str, dry: bool, log) -> list[dict]:
    """Step 2: the measured plan twice (modelled with the profile, then with the h100 preset), the
    commands and their output verbatim in ``<tag>-plan.md``."""
    steps, text = [], []
    with tempfile.TemporaryDirectory() as tmp:  # the plan reads its config from there
        (Path(tmp) / MEASURED.name).write_text(yaml.safe_dump(measured_config(dry), sort_keys=False))
        for device in (["--device-profile", str(profile)], ["--device", "h100"]):
            args = ["plan", "--cluster", "1x1", "--measure", MEASURED.name, *mode.plan, *device]
            log_file = Path(tmp) / "plan.out"
            with open(log_file, "w") as f:
                steps.append(_run([sys.executable, "-m", "cconv", *args], log, mode.limits.get("plan"), Path(tmp), f))
            shown = " ".join(a if a != str(profile) else profile.name for a in args)
            text.append(f"```console\n$ cconv {shown}\n{log_file.read_text().rstrip()}\n```\n")
    (out / f"{tag}-plan.md").write_text("\n".join(text))
    return steps


def _sweep(mode: Mode, runs: Path, out: Path, tag: str, dry: bool, log) -> dict:
    """Step 4: the quickstart sweep on the one device; its report copied beside the tables."""
    sweep_dir = runs / f"{tag}-quickstart"
    # the sweep file lives beside its directory: `cconv sweep --out` takes only its own directories
    sweep_file = runs / f"{tag}-quickstart.yaml"
    runs.mkdir(parents=True, exist_ok=True)
    sweep_file.write_text(yaml.safe_dump(sweep_config(dry), sort_keys=False))
    cmd = [sys.executable, "-m", "cconv", "sweep", str(sweep_file), "--out", str(sweep_dir)]
    step = _run(cmd + ["--no-figure"] * dry, log, mode.limits.get("sweep"))
    report = sweep_dir / "report.csv"
    if report.exists():
        (out / f"{tag}-quickstart.csv").write_text(report.read_text())
    return step


def main(argv=None, log=print) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on the default backend (CPU is fine)")
    p.add_argument("--lease", action="store_true", help="sizes and time limits that fit one 15-minute GPU lease")
    p.add_argument("--out", default=str(HERE / "results"), help="where the tables go")
    p.add_argument("--runs", default=str(ROOT / "results"), help="where the sweep's run directories go")
    args = p.parse_args(argv)
    backend, kind, n = device()
    if backend != "gpu" and not args.dry_run:
        print(
            f"gpu_check: error: no GPU here (jax backend {backend!r}); --dry-run tests the script",
            file=sys.stderr,
        )
        return 2
    mode = MODES["dry" if args.dry_run else "lease" if args.lease else "full"]
    tag = f"dry-{backend}" if args.dry_run else f"gpu-{slug(kind)}"
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    log(f"gpu_check: {kind} ({backend}, {n} device(s)) -> {out}/{tag}*")
    profile = out / f"{tag}-profile.json"
    cal = [sys.executable, "-m", "cconv", "calibrate", "--out", str(profile), *mode.calibrate]
    steps = [_run(cal, log, mode.limits.get("calibrate"))]
    steps += _plan(mode, profile, out, tag, args.dry_run, log)
    bench = [sys.executable, str(HERE / "run.py"), *mode.bench, "--workers", str(n), "--out", str(out), "--tag", tag]
    steps.append(_run(bench, log, mode.limits.get("bench")))
    steps.append(_sweep(mode, Path(args.runs).resolve(), out, tag, args.dry_run, log))
    summary = {"device": kind, "backend": backend, "device_count": n, "dry_run": args.dry_run, "steps": steps}
    (out / f"{tag}-check.json").write_text(json.dumps(summary, indent=1))
    log(f"gpu_check: wrote {out}/{tag}-profile.json, -plan.md, .json, .md, -quickstart.csv, -check.json")
    return max(s["returncode"] for s in steps)


if __name__ == "__main__":
    sys.exit(main())
