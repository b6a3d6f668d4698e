"""The communication interface the training step is written against, and its back-ends.

A ``Comm`` is created per trace of the step; its high-level operations record what they move
in ``comm.ledger`` (a list of ``Collective``) from the payloads' static shapes, so the logged
bytes are exactly the bytes of the arrays handed to the collectives.

Back-ends implement five primitives (``rank``, ``_psum``, ``_pmax``, ``_all_gather``,
``_ppermute``):

* ``MeshComm(axis, P)``: ``jax.lax`` collectives over a named axis -- used under
  ``jax.shard_map`` (the main launcher), ``jax.pmap`` and ``jax.vmap`` (every worker on one
  device; partial permutations are completed there, see ``MeshComm``).
* ``DryComm(P)``: shape-only stand-in (no communication); used with ``jax.eval_shape`` to list
  a step's collectives without compiling it.
* ``cconv.comm.mpi.MPIComm``: mpi4jax collectives between processes launched by ``mpirun``.

High-level operations (all record their traffic):

``allreduce(tree)``   sum over workers of the floating leaves; integer leaves (e.g. a PRNG key
                      shared by all workers) are identical everywhere and do not travel
                      (``integers=True``: integer leaves are summed too, in their own dtype).
``allmax(tree)``      maximum over workers of every leaf (a max-reduction all-reduce; control
                      traffic by default: a statistic the workers agree on).
``allgather(tree)``   every leaf gains a leading axis of size P (worker w's payload at [w]).
``exchange(tree, r)`` recursive-doubling round r: swap with partner rank ^ 2**r.
``permute(tree, perm)`` point-to-point transfers along (source, target) pairs; ranks that
                      are no target receive zeros (gTop-k's rounds, fold and unfold).
``push(tree)``        parameter-server uplink: rank 0 (the server) receives every payload,
                      stacked on a leading axis (other ranks get zeros there).
``pull(tree)``        parameter-server downlink: every rank receives rank 0's tree.

``control=True`` records an operation as control traffic (``Collective.control``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from cconv.comm.accounting import Collective, tree_bytes


def _is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.floating)


def _is_int(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.integer)


class Comm:
    """Base class: recorded high-level operations on top of five primitives."""

    def __init__(self, size: int):
        self.size = int(size)
        self.ledger: list[Collective] = []
        # variable-length payloads: (kind, moved bytes, this worker's encoded bytes (traced))
        self.encoded: list[tuple[str, float, object]] = []

    # --- primitives (back-ends override) -------------------------------------------------
    def rank(self):
        raise TypeError(f"{type(self).__name__} does not implement rank()")

    def _psum(self, tree):
        raise TypeError(f"{type(self).__name__} does not implement _psum()")

    def _pmax(self, tree):
        raise TypeError(f"{type(self).__name__} does not implement _pmax()")

    def _all_gather(self, tree):
        raise TypeError(f"{type(self).__name__} does not implement _all_gather()")

    def _ppermute(self, tree, perm):
        raise TypeError(f"{type(self).__name__} does not implement _ppermute()")

    # --- recorded operations ---------------------------------------------------------------
    def record(self, kind: str, nbytes: float, count: int = 1, control: bool = False) -> None:
        self.ledger.append(Collective(kind, float(nbytes), int(count), bool(control)))

    def note_encoded(self, kind: str, moved: float, nbytes) -> None:
        """The call of ``kind`` just recorded moved ``moved`` bytes per worker, of which this
        worker's encoded message is ``nbytes`` (traced): ``cconv.comm.accounting.encoded_traffic``."""
        self.encoded.append((kind, float(moved), nbytes))

    def allreduce(self, tree, control: bool = False, integers: bool = False):
        """Sum over workers of the floating leaves (integer leaves kept as they are); with
        ``integers`` the integer leaves are summed too, in their own dtype (the caller picks one
        wide enough: an int8 sum of P values in [-1, 1] is exact for P <= 127)."""
        leaves, treedef = jax.tree.flatten(tree)
        summed_leaf = (lambda x: _is_float(x) or _is_int(x)) if integers else _is_float
        floats = [x for x in leaves if summed_leaf(x)]
        if not floats:
            return tree
        wide = [x.astype(self.sum_dtype(x.dtype)) for x in floats]
        self.record("allreduce", tree_bytes(wide), control=control)
        summed = iter(s.astype(x.dtype) for s, x in zip(self._psum(wide), floats))
        return jax.tree.unflatten(treedef, [next(summed) if summed_leaf(x) else x for x in leaves])

    def allmax(self, tree, control: bool = True):
        """Maximum over workers of every leaf: one max-reduction all-reduce (ring: 2(P-1)/P * D
        bytes, like a sum), recorded as control traffic unless ``control=False``."""
        if not jax.tree.leaves(tree):
            return tree
        self.record("allreduce", tree_bytes(tree), control=control)
        return self._pmax(tree)

    def sum_dtype(self, dtype):
        """The dtype a sum of ``dtype`` travels in (back-ends without a native one widen it)."""
        return dtype

    def allmean(self, tree, control: bool = False):
        return jax.tree.map(lambda x: x / self.size if _is_float(x) else x, self.allreduce(tree, control))

    def allgather(self, tree):
        """Each leaf gains a leading axis of size P: worker w's leaf at index w."""
        self.record("allgather", tree_bytes(tree))
        return self._all_gather(tree)

    def exchange(self, tree, round_: int):
        """Recursive doubling round: swap ``tree`` with rank ^ 2**round_ (caller records)."""
        bit = 1 << round_
        return self._ppermute(tree, [(i, i ^ bit) for i in range(self.size)])

    def permute(self, tree, perm):
        """Send ``tree`` along the (source, target) pairs ``perm`` (a partial permutation);
        ranks that are no target get zeros (caller records)."""
        return self._ppermute(tree, list(perm))

    def push(self, tree, control: bool = False):
        """PS uplink: on rank 0, every worker's tree stacked on a leading axis."""
        self.record("ps_push", tree_bytes(tree), control=control)
        parts = [tree] + [self._ppermute(tree, [(w, 0)]) for w in range(1, self.size)]
        return jax.tree.map(lambda *xs: jnp.stack(xs), *parts)

    def pull(self, tree, control: bool = False):
        """PS downlink: rank 0's tree on every rank."""
        self.record("ps_pull", tree_bytes(tree), control=control)
        rank = self.rank()
        out = tree
        for w in range(1, self.size):
            got = self._ppermute(tree, [(0, w)])
            out = jax.tree.map(lambda o, g: jnp.where(rank == w, g, o), out, got)
        return out


def _as_bits(tree):
    """16-bit floats travel as uint16 bit patterns in collectives that do not reduce: XLA's CPU
    back-end would otherwise widen bfloat16 to float32 on the wire (lossless either way)."""

    def enc(x):
        return lax.bitcast_convert_type(x, jnp.uint16) if x.dtype == jnp.bfloat16 else x

    return jax.tree.map(enc, tree)


def _from_bits(tree, like):
    return jax.tree.map(lambda x, l: lax.bitcast_convert_type(x, l.dtype) if l.dtype == jnp.bfloat16 else x, tree, like)


def _byte_concat(leaves) -> jax.Array:
    """The leaves' bytes, one after the other, as one uint8 vector: several payload arrays travel
    in ONE all-gather (XLA:CPU does not combine all-gathers; a rendezvous per array of a step's
    payloads cost more than moving them).  Same bytes on the wire, in the same order."""
    return jnp.concatenate([lax.bitcast_convert_type(x, jnp.uint8).reshape(-1) for x in leaves])


def _byte_split(gathered: jax.Array, leaves) -> list:
    """Inverse of ``_byte_concat`` for a gathered (P, bytes) array: the leaves stacked (P, ...)."""
    out, start = [], 0
    for x in leaves:
        size = x.dtype.itemsize
        n = int(np.prod(x.shape, dtype=np.int64)) * size
        part = gathered[:, start : start + n].reshape(gathered.shape[0], *x.shape, *((size,) if size > 1 else ()))
        out.append(lax.bitcast_convert_type(part, x.dtype))
        start += n
    return out


def vmapped_axis(axis_name: str) -> bool:
    """Whether ``axis_name`` is bound by ``jax.vmap`` (its index is a batched iota) rather than by
    an SPMD map (``jax.shard_map`` / ``jax.pmap``, one device per rank).  jax has no public test:
    this reads the batch tracer of ``lax.axis_index`` (False where that internal is missing)."""
    try:
        from jax._src.interpreters.batching import BatchTracer
    except ImportError:  # pragma: no cover - a jax without it: assume an SPMD map
        return False
    x = lax.axis_index(axis_name)
    while isinstance(x, BatchTracer):  # vmaps over other axes (e.g. seeds) leave it unbatched
        if x.batch_dim is not None:
            return True
        x = x.val
    return False


def complete_permutation(perm, size: int) -> tuple[list[tuple[int, int]], list[int]]:
    """A full permutation of ``range(size)`` extending the partial one ``perm`` (the ranks that
    send nothing send to the ranks that receive nothing, in order), and the ranks ``perm``
    targets (only they keep what they receive)."""
    perm = [(int(s), int(t)) for s, t in perm]
    sources, targets = {s for s, _ in perm}, {t for _, t in perm}
    idle = [s for s in range(size) if s not in sources]
    free = [t for t in range(size) if t not in targets]
    return perm + list(zip(idle, free)), sorted(targets)


class MeshComm(Comm):
    """``jax.lax`` collectives over a named axis (``jax.shard_map``, ``jax.pmap`` or ``jax.vmap``).

    ``platform="cpu"``: XLA's CPU back-end has no bfloat16 all-reduce and widens it to float32,
    so bf16 sums are done (and counted) in float32 there; other platforms sum bf16 natively.

    ``vmapped``: the axis is a ``jax.vmap`` axis (all workers on one device; None: detected at
    trace time, ``vmapped_axis``).  ``lax.ppermute`` under vmap takes only full permutations, so
    a partial one (the parameter server's push / pull, gTop-k's fold and unfold) is completed
    (``complete_permutation``) and the ranks that are no target get zeros, as ``permute``
    documents.  The ledger records what the algorithm moves either way, never what vmap does.
    """

    def __init__(self, axis_name: str, size: int, platform: str = "cpu", vmapped: bool | None = None):
        super().__init__(size)
        self.axis_name, self.platform, self.vmapped = axis_name, platform, vmapped

    def rank(self):
        return lax.axis_index(self.axis_name)

    def sum_dtype(self, dtype):
        return jnp.float32 if self.platform == "cpu" and dtype == jnp.bfloat16 else dtype

    def _psum(self, tree):
        return lax.psum(tree, self.axis_name)

    def _pmax(self, tree):
        return lax.pmax(tree, self.axis_name)

    def _all_gather(self, tree):
        leaves, treedef = jax.tree.flatten(tree)
        if len(leaves) < 2 or any(x.dtype == jnp.bool_ for x in leaves):
            return _from_bits(lax.all_gather(_as_bits(tree), self.axis_name), tree)
        gathered = lax.all_gather(_byte_concat(leaves), self.axis_name)
        return jax.tree.unflatten(treedef, _byte_split(gathered, leaves))

    def _ppermute(self, tree, perm):
        perm = list(perm)
        partial = len(perm) < self.size
        if not (partial and (vmapped_axis(self.axis_name) if self.vmapped is None else self.vmapped)):
            return _from_bits(lax.ppermute(_as_bits(tree), self.axis_name, perm), tree)
        full, targets = complete_permutation(perm, self.size)
        got = _from_bits(lax.ppermute(_as_bits(tree), self.axis_name, full), tree)
        keep = jnp.isin(self.rank(), jnp.asarray(targets, jnp.int32))
        return jax.tree.map(lambda x: jnp.where(keep, x, jnp.zeros((), x.dtype)), got)


class DryComm(Comm):
    """Shape-only comm (acts as if every worker held the same values); for ``jax.eval_shape``.

    ``like``: the real back-end whose wire dtypes (``sum_dtype``) it mirrors.
    """

    def __init__(self, size: int, like: Comm | None = None):
        super().__init__(size)
        self._like = like

    def sum_dtype(self, dtype):
        return self._like.sum_dtype(dtype) if self._like is not None else dtype

    def rank(self):
        return jnp.zeros((), jnp.int32)

    def _psum(self, tree):
        return jax.tree.map(lambda x: x * self.size, tree)

    def _pmax(self, tree):
        return tree

    def _all_gather(self, tree):
        return jax.tree.map(lambda x: jnp.broadcast_to(x, (self.size, *x.shape)), tree)

    def _ppermute(self, tree, perm):
        return tree
