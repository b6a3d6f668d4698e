"""Multi-process set-up: ``jax.distributed`` (NCCL on GPUs, gloo on CPUs) and MPI detection.

Two ways to run cconv on several hosts:

1. ``jax.distributed`` + the ``shard_map`` launcher (recommended).  Call ``initialize()`` first
   thing in every process; then ``jax.devices()`` lists every device of every process and
   ``EngineConfig(workers=len(jax.devices()))`` trains over all of them.  Under SLURM
   (``srun``) or OpenMPI (``mpirun``) the coordinator, process count and process id are read
   from the environment; elsewhere pass them (or set ``CCONV_COORDINATOR``,
   ``CCONV_NUM_PROCESSES``, ``CCONV_PROCESS_ID``).  GPU collectives go through NCCL; CPU
   collectives through gloo (set here, before the back-end starts).
2. ``launcher="mpi"``: one process per worker under ``mpirun``, collectives by mpi4jax
   (``cconv.comm.mpi``); no ``jax.distributed`` needed.

Every process must feed the same global batch and key to ``trainer.step`` (same seeds); the
engine turns host arrays into global arrays and each process computes only its own workers.
"""

from __future__ import annotations

import os

import jax

ENV = ("CCONV_COORDINATOR", "CCONV_NUM_PROCESSES", "CCONV_PROCESS_ID")


def detect() -> str:
    """Which launcher started this process: "slurm", "mpi" (OpenMPI/PMIx), "env" or "single"."""
    if "SLURM_JOB_ID" in os.environ and "SLURM_PROCID" in os.environ:
        return "slurm"
    if "OMPI_COMM_WORLD_SIZE" in os.environ or "PMIX_RANK" in os.environ:
        return "mpi"
    if all(k in os.environ for k in ENV):
        return "env"
    return "single"


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids=None,
    cpu_collectives: str = "gloo",
    **kwargs,
) -> dict:
    """Start ``jax.distributed`` (a no-op for a single process); returns a description.

    Explicit arguments win, then ``CCONV_*`` variables, then JAX's own cluster detection
    (SLURM, OpenMPI).  ``cpu_collectives``: "gloo" (default) or "mpi" for CPU devices.
    """
    if cpu_collectives not in ("gloo", "mpi"):
        raise ValueError(f"cpu_collectives must be 'gloo' or 'mpi', got {cpu_collectives!r}")
    how = detect()
    if how == "env" and coordinator_address is None:
        coordinator_address = os.environ["CCONV_COORDINATOR"]
        num_processes = int(os.environ["CCONV_NUM_PROCESSES"])
        process_id = int(os.environ["CCONV_PROCESS_ID"])
    explicit = coordinator_address is not None
    if how == "single" and not explicit:
        return {"launcher": "single", "process_id": 0, "num_processes": 1}
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=local_device_ids,
        **kwargs,
    )
    return {
        "launcher": "explicit" if explicit else how,
        "process_id": jax.process_index(),
        "num_processes": jax.process_count(),
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
    }


def shutdown() -> None:
    if jax.process_count() > 1:
        jax.distributed.shutdown()
