#!/usr/bin/env bash
# The GPU check (issue 25): on a machine with one GPU, from the repository root,
#   bash scripts/gpu_check.sh            # compressor throughput vs the memory floor, engine overhead,
#                                        # quickstart sweep on one GPU (vmap launcher); ~15-30 min
#   bash scripts/gpu_check.sh --dry-run  # the same steps at tiny sizes on any machine (CPU)
# Results: studies/benchmarks/results/gpu-<device>.{json,md}, gpu-<device>-quickstart.csv,
# gpu-<device>-check.json (see studies/benchmarks/gpu_check.py and docs/gpu.md).
# PYTHON picks the interpreter (default: .venv/bin/python, as scripts/setup.sh makes it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
exec "$PY" studies/benchmarks/gpu_check.py "$@"
