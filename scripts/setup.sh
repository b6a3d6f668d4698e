#!/usr/bin/env bash
# One-time, idempotent set-up on a fresh Debian/Ubuntu machine: a virtual environment in .venv with
# cconv and what the chosen job needs, nothing more.  Safe to run again: it only installs what is missing.
#
#   bash scripts/setup.sh          the main job (cconv run/sweep/plot/advise): cconv + plots
#   bash scripts/setup.sh tests    the test suite: + dev, wandb, tensorboard; OpenMPI (apt) and the mpi extra
#   bash scripts/setup.sh ci       .ci/run: the tests' set + the docs toolchain and chromium (the site's check)
#
# Each set includes the one before it; .venv/.cconv-installed records the extras installed.
# CCONV_SETUP_DRY_RUN=1 prints what a target would install and installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

target=${1:-main}
case "$target" in
  main) extras="plots" ;;
  tests) extras="plots,dev,wandb,tensorboard" ;;
  ci) extras="plots,dev,wandb,tensorboard,docs" ;;
  *)
    echo "setup: unknown target '$target' (choose: main, tests, ci)" >&2
    exit 2
    ;;
esac

apt_install() {  # apt_install WHAT PACKAGE...: as root, or through sudo; otherwise say what is skipped
  local what=$1
  shift
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing $what (apt-get)" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  elif command -v sudo >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing $what (sudo apt-get)" >&2
    sudo apt-get update -qq >/dev/null
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    echo "setup: $what not found and cannot be installed here; its tests are skipped" >&2
  fi
}

if [ -n "${CCONV_SETUP_DRY_RUN:-}" ]; then  # say what this target installs, install nothing (tests/test_docs.py)
  system=""
  [ "$target" != main ] && system="openmpi"
  [ "$target" = ci ] && system="$system chromium"
  echo "extras: $extras${system:+; system: $system}"
  exit 0
fi

if [ "$target" != main ]; then
  # OpenMPI: the mpi launcher's tests (tests/test_multiprocess.py)
  if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicc >/dev/null 2>&1; then
    apt_install OpenMPI openmpi-bin libopenmpi-dev
  fi
  command -v mpicc >/dev/null 2>&1 && extras="$extras,mpi"
fi
if [ "$target" = ci ] && ! command -v chromium >/dev/null 2>&1; then
  # chromium: the documentation site's browser check (scripts/check_docs_site.py drives it with Playwright)
  apt_install chromium chromium
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.cconv-installed
missing=""
if [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ]; then
  for e in ${extras//,/ }; do
    grep -qx "$e" "$stamp" || missing="$missing $e"
  done
else
  missing="all"
fi
if [ -n "$missing" ]; then
  # mpi4jax's build looks for CUDA when the image carries a partial one; point it at it.
  if [ -d /usr/local/cuda ]; then export CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}; fi
  # --no-compile, then compileall on every core: pip byte-compiles what it installs on one core
  # (73 s of the main set's 35 + 38 s on 2 cores; compileall -j 0: 24 s).  Byte-compiled here,
  # once, because a shell with PYTHONDONTWRITEBYTECODE set would otherwise compile jax, scipy and
  # matplotlib again in every process.
  .venv/bin/python -m pip install -q --no-compile --disable-pip-version-check -e ".[$extras]"
  .venv/bin/python -m compileall -q -j 0 .venv/lib/python*/site-packages cconv >/dev/null
  tr ',' '\n' <<<"$extras" >"$stamp"
fi
