"""The GPU check (issue 25): one command, run unchanged on a machine with one GPU.

    bash scripts/gpu_check.sh              # on the GPU machine: ~15-30 min
    bash scripts/gpu_check.sh --dry-run    # anywhere (CPU): tiny sizes, checks that the script runs

1. the compressor-throughput table against the device's memory-read floor (benchmark part (a),
   ``studies/benchmarks/run.py``), and the engine-overhead benchmark (part (b): every step
   configuration against a hand-written ``shard_map`` + ``pmean`` step on the machine's devices),
   written as ``studies/benchmarks/results/gpu-<device>.{json,md}``;
2. the quickstart sweep (``studies/quickstart.yaml``, 8 workers) on one GPU with the vmap
   launcher (set explicitly, every worker on the one device), its report copied to
   ``studies/benchmarks/results/gpu-<device>-quickstart.csv`` (runs under
   ``results/gpu-<device>-quickstart/``);
3. ``gpu-<device>-check.json``: the device, the commands, their exit codes and wall times.

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
import subprocess
import sys
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
QUICKSTART = ROOT / "studies" / "quickstart.yaml"
ONE_DEVICE_LAUNCHER = "vmap"

BENCH_FULL = ["--parts", "a,b", "--sizes", "1e5,1e6,1e7,2.5e7", "--models", "mlp1m,mlp,cnn"]
BENCH_DRY = ["--parts", "a,b", "--sizes", "4096", "--names", "topk", "--repeats", "1"]
BENCH_DRY += ["--models", "mlp", "--batch", "8", "--steps", "1", "--b-repeats", "1", "--configs", "topk 1% + EF"]


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


def _run(cmd: list[str], log) -> dict:
    log("$ " + " ".join(cmd))
    t0 = time.perf_counter()
    rc = subprocess.run(cmd, cwd=ROOT, env=_env()).returncode
    return {"command": " ".join(cmd), "returncode": rc, "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv=None, log=print) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on the default backend (CPU is fine)")
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
    tag = f"dry-{backend}" if args.dry_run else f"gpu-{slug(kind)}"
    out, runs = Path(args.out), Path(args.runs)
    out.mkdir(parents=True, exist_ok=True)
    log(f"gpu_check: {kind} ({backend}, {n} device(s)) -> {out}/{tag}.*")
    bench = BENCH_DRY if args.dry_run else BENCH_FULL
    steps = [
        _run([sys.executable, str(HERE / "run.py"), *bench, "--workers", str(n), "--out", str(out), "--tag", tag], log)
    ]
    sweep_dir = runs / f"{tag}-quickstart"
    # the sweep file lives beside its directory: `cconv sweep --out` takes only its own directories
    sweep_file = runs / f"{tag}-quickstart.yaml"
    runs.mkdir(parents=True, exist_ok=True)
    sweep_file.write_text(yaml.safe_dump(sweep_config(args.dry_run), sort_keys=False))
    cmd = [sys.executable, "-m", "cconv", "sweep", str(sweep_file), "--out", str(sweep_dir)]
    steps.append(_run(cmd + ["--no-figure"] * args.dry_run, log))
    report = sweep_dir / "report.csv"
    if report.exists():
        (out / f"{tag}-quickstart.csv").write_text(report.read_text())
    summary = {"device": kind, "backend": backend, "device_count": n, "dry_run": args.dry_run, "steps": steps}
    (out / f"{tag}-check.json").write_text(json.dumps(summary, indent=1))
    log(f"gpu_check: wrote {out}/{tag}.json, .md, -quickstart.csv, -check.json")
    return max(s["returncode"] for s in steps)


if __name__ == "__main__":
    sys.exit(main())
