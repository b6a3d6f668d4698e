#!/usr/bin/env bash
# One-time, idempotent set-up on a fresh machine: OpenMPI and chromium (system), a virtual environment in
# .venv with cconv and every extra (dev, plots, wandb, tensorboard, docs, mpi).  Safe to run again: it only
# does what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicc >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing OpenMPI (apt-get)" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
  elif command -v sudo >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    sudo apt-get update -qq >/dev/null
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
  else
    echo "setup: OpenMPI not found and cannot be installed here; the MPI extra and its tests are skipped" >&2
  fi
fi

# chromium: the documentation site's browser check (scripts/check_docs_site.py drives it with Playwright)
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing chromium (apt-get)" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  elif command -v sudo >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    sudo apt-get update -qq >/dev/null
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "setup: chromium not found and cannot be installed here; the docs' browser check is skipped" >&2
  fi
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.cconv-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  extras="dev,plots,wandb,tensorboard,docs"
  command -v mpicc >/dev/null 2>&1 && extras="$extras,mpi"
  # mpi4jax's build looks for CUDA when the image carries a partial one; point it at it.
  if [ -d /usr/local/cuda ]; then export CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}; fi
  .venv/bin/python -m pip install -q -e ".[$extras]"
  touch "$stamp"
fi
