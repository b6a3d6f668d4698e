"""MPI back-end: the same ``Comm`` interface over mpi4jax, for clusters launched by ``mpirun``.

One process per worker, each with its own (single) device; the step is ``jax.jit``-compiled
per process and its collectives are mpi4jax calls (``allreduce`` with ``MPI.SUM`` or ``MPI.MAX``,
``allgather``, ``sendrecv``, ``send``/``recv``) that run inside the compiled program.  Because the rank is a Python int
here, ``ppermute`` resolves statically which peer this rank sends to and receives from.

    mpirun -np 4 python -m my_training_script        # cconv.engine launcher="mpi"

Install: ``pip install 'cconv[mpi]'`` (mpi4py, mpi4jax; see DEVELOPERS.md for the CUDA_PATH trap).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cconv.comm.backend import Comm


def _mpi():
    try:
        import mpi4jax  # noqa: F401
        from mpi4py import MPI
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ValueError("launcher='mpi' needs mpi4py and mpi4jax: pip install 'cconv[mpi]'") from e
    return MPI


class MPIComm(Comm):
    """``Comm`` over an MPI communicator (default ``MPI.COMM_WORLD``)."""

    def __init__(self, comm=None):
        MPI = _mpi()
        self.mpi_comm = comm if comm is not None else MPI.COMM_WORLD
        self._rank = self.mpi_comm.Get_rank()
        super().__init__(self.mpi_comm.Get_size())

    def rank(self):
        return self._rank

    def _psum(self, tree):
        import mpi4jax
        from mpi4py import MPI

        return jax.tree.map(lambda x: mpi4jax.allreduce(x, op=MPI.SUM, comm=self.mpi_comm), tree)

    def _pmax(self, tree):
        import mpi4jax
        from mpi4py import MPI

        return jax.tree.map(lambda x: mpi4jax.allreduce(x, op=MPI.MAX, comm=self.mpi_comm), tree)

    def _all_gather(self, tree):
        import mpi4jax

        return jax.tree.map(lambda x: mpi4jax.allgather(x, comm=self.mpi_comm), tree)

    def _ppermute(self, tree, perm):
        import mpi4jax

        dest = [t for s, t in perm if s == self._rank]
        source = [s for s, t in perm if t == self._rank]

        def one(x):
            if dest and source:
                return mpi4jax.sendrecv(x, x, source=source[0], dest=dest[0], comm=self.mpi_comm)
            if dest:
                mpi4jax.send(x, dest=dest[0], comm=self.mpi_comm)
                return jnp.zeros_like(x)
            if source:
                return mpi4jax.recv(x, source=source[0], comm=self.mpi_comm)
            return jnp.zeros_like(x)

        return jax.tree.map(one, tree)
