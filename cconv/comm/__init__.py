"""Collectives and byte accounting (layer 3: compressors -> memory -> comm -> engine).

* ``accounting``: ``Collective(kind, bytes, count, control)`` and the per-rank traffic of each
  algorithm (ring allreduce, ring allgather, recursive doubling, PS push / pull).
* ``backend``: the ``Comm`` interface the training step is written against; ``MeshComm``
  (``jax.shard_map`` / ``jax.pmap``), ``DryComm`` (shape-only, for ``jax.eval_shape``).
* ``mpi``: ``MPIComm`` over mpi4jax (imported lazily).
* ``gtopk``: recursive-doubling global top-k with exact mass conservation.
* ``hlo``: parse a compiled program's collectives and count the bytes they move.
"""

from cconv.comm import accounting, gtopk, hlo
from cconv.comm.accounting import KINDS, Collective, merge, total_traffic, traffic, tree_bytes
from cconv.comm.backend import Comm, DryComm, MeshComm

__all__ = [
    "accounting",
    "gtopk",
    "hlo",
    "KINDS",
    "Collective",
    "merge",
    "total_traffic",
    "traffic",
    "tree_bytes",
    "Comm",
    "DryComm",
    "MeshComm",
]
