#!/bin/bash
# Launch with OpenMPI on the hosts in a hostfile (default: this machine), N processes.
#   bash studies/cluster/mpirun.sh 4 [hostfile] [mpi|shard_map]
# mpi:       one worker per rank, collectives by mpi4jax (needs pip install 'cconv[mpi]').
# shard_map: jax.distributed picks up OpenMPI's environment (gloo on CPU, NCCL on GPU).
# As root, OpenMPI needs --allow-run-as-root; beyond the core count, --oversubscribe.
set -euo pipefail
N=${1:-2}
HOSTS=${2:-}
LAUNCHER=${3:-mpi}
cd "$(dirname "$0")/../.."
ARGS=(-np "$N" --oversubscribe)
[ "$(id -u)" = 0 ] && ARGS+=(--allow-run-as-root)
[ -n "$HOSTS" ] && ARGS+=(--hostfile "$HOSTS")
for v in JAX_PLATFORMS XLA_FLAGS; do [ -n "${!v:-}" ] && ARGS+=(-x "$v"); done
exec mpirun "${ARGS[@]}" \
  .venv/bin/python studies/cluster/train_example.py --launcher "$LAUNCHER" --steps "${STEPS:-64}"
