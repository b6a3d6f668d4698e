"""PowerSGD's low-rank factor math (Vogels, Karimireddy & Jaggi, NeurIPS 2019).

A tensor with at least two dimensions is viewed as a matrix M of shape
(prod(shape[:-1]), shape[-1]) = (n, m): Flax keeps the output features last, so this is the
transpose of the paper's (out_channels x rest) view; a rank-r factorisation and its
r(n + m) values are the same either way.  One step of subspace (power) iteration:

    P = M Q          (Q: m x r, warm-started from the previous step, kept in state)
    P = orthogonalize(P)            (Gram-Schmidt on the columns, as in the authors' code)
    Q = M^T P
    C(M) = P Q^T

On several workers the engine all-reduces P (mean) before orthogonalising and Q (mean) after,
using ``compute_p``, ``orthogonalize`` and ``compute_q`` below; this module's ``compress`` is the
single-worker version (its output is exactly the P = 1 result).  Biased; used with error
feedback on M - P Q^T.  Tensors with fewer than two dimensions, or with min(n, m) <= rank (no
saving), stay dense (payload: the array).  Q0 ~ N(0, 1) is drawn from ``PRNGKey(seed)`` in
``init`` so every worker starts from the same Q, as the authors' code seeds it identically.

Wire format: P (n x r) and Q (m x r) in the input dtype: r(n + m) * itemsize bytes.
Non-finite input makes the factors non-finite.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cconv.compressors.base import (
    OWN,
    Aggregation,
    Array,
    Compressor,
    DensePayload,
    check_float,
    itemsize,
    like_info,
    size_of,
)
from cconv.compressors.registry import Bench, Bound, Cost, Entry, Knob, Param, Schema, Theory, register


class PowerSGDPayload(NamedTuple):
    p: Array  # (n, r) orthonormal columns
    q: Array  # (m, r)


class PowerSGDState(NamedTuple):
    q: Array  # (m, r) float32 warm start; shape (0, 0) for tensors that stay dense


def matrix_shape(shape) -> tuple[int, int]:
    shape = tuple(shape)
    return size_of(shape[:-1]), shape[-1]


def is_compressed(shape, rank: int) -> bool:
    """Whether a tensor of this shape is factorised (else it is sent dense)."""
    if len(tuple(shape)) < 2:
        return False
    n, m = matrix_shape(shape)
    return min(n, m) > rank


def orthogonalize(p: Array, eps: float = 1e-8) -> Array:
    """Gram-Schmidt on the columns of p (in float32); zero columns stay zero (no NaN)."""
    cols = []
    for i in range(p.shape[1]):
        c = p[:, i]
        for prev in cols:
            c = c - jnp.dot(prev, c) * prev
        c = c / (jnp.linalg.norm(c) + eps)
        cols.append(c)
    return jnp.stack(cols, axis=1)


def compute_p(m: Array, q: Array) -> Array:
    return m @ q


def compute_q(m: Array, p: Array) -> Array:
    return m.T @ p


def _powersgd(rank: int = 1, seed: int = 0) -> Compressor:
    r = rank

    def init(x):
        if not is_compressed(x.shape, r):
            return PowerSGDState(jnp.zeros((0, 0), jnp.float32))
        _, m = matrix_shape(x.shape)
        return PowerSGDState(jax.random.normal(jax.random.PRNGKey(seed), (m, r), jnp.float32))

    def compress(x, state, key):
        check_float("powersgd", x)
        if not is_compressed(x.shape, r):
            return DensePayload(x), state
        mat = x.astype(jnp.float32).reshape(matrix_shape(x.shape))
        p = orthogonalize(compute_p(mat, state.q))
        q = compute_q(mat, p)
        return PowerSGDPayload(p.astype(x.dtype), q.astype(x.dtype)), PowerSGDState(q)

    def decompress(payload, like):
        shape, dtype = like_info(like)
        if isinstance(payload, DensePayload):
            return payload.values.reshape(shape).astype(dtype)
        out = payload.p.astype(jnp.float32) @ payload.q.astype(jnp.float32).T
        return out.astype(dtype).reshape(shape)

    def wire_bytes(shape, dtype="float32"):
        if not is_compressed(shape, r):
            return size_of(shape) * itemsize(dtype)
        n, m = matrix_shape(shape)
        return r * (n + m) * itemsize(dtype)

    def density(shape):
        if not is_compressed(shape, r):
            return 1.0
        n, m = matrix_shape(shape)
        return min(1.0, r * (n + m) / (n * m))

    return Compressor(init, compress, decompress, wire_bytes, density, name="powersgd", unbiased=False)


# ---------------------------------------------------------------- theory (float64 NumPy)


def _factorised(shape, rank: int) -> tuple[int, int] | None:
    """(n, m) of the matrix view when the tensor is factorised, else None (sent dense)."""
    if len(shape) < 2:
        return None
    n, m = size_of(shape[:-1]), int(shape[-1])
    return (n, m) if min(n, m) > rank else None


def _flops(shape, rank: int) -> tuple[float, float]:
    """FLOPs of (compress, decompress) for one tensor: P = M Q and Q = M^T P (2 n m r each) and
    Gram-Schmidt on P (2 n r^2), then P Q^T (2 n m r) to decode; 0 for a tensor sent dense."""
    nm = _factorised(tuple(shape), rank)
    if nm is None:
        return 0.0, 0.0
    n, m = nm
    return 4.0 * n * m * rank + 2.0 * n * rank * rank, 2.0 * n * m * rank


def framework_matrix(shape) -> tuple[int, ...]:
    """The matrix framework implementations of PowerSGD factorise: (shape[0], the rest), from the
    tensor as the framework lays it out; a vector stays a vector.  GRACE's TensorFlow compressor:
    ``tf.reshape(tensor, [tensor_shape[0], -1])`` (grace_dl/tensorflow/compressor/powersgd.py);
    PyTorch's DDP hook: ``tensor.view(tensor.shape[0], -1)``
    (torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py, ``powerSGD_hook``).  On
    PyTorch's (out, in, kh, kw) kernels that is the paper's (out x rest) view, whose factors have
    the sizes of this module's own; on TensorFlow's (kh, kw, in, out) kernels it is (kernel height
    x rest): Q holds a third of a 3x3 kernel and all of a 1x1 one."""
    shape = tuple(int(v) for v in shape)
    return shape if len(shape) < 2 else (shape[0], size_of(shape[1:]))


def _wire_bytes(c, shape, isz):
    nm = _factorised(shape, c.hparams["rank"])
    return size_of(shape) * isz if nm is None else c.hparams["rank"] * (nm[0] + nm[1]) * isz


def _bound(c, shape):
    """Dense tensors are exact; factorised ones only non-expansive (delta = 0: M Q = 0)."""
    if _factorised(shape, c.hparams["rank"]) is None:
        return Bound("unbiased", omega=0.0, delta=1.0)
    return Bound("biased", delta=0.0)


def _error_sq(c, x, state):
    """||M - P P^T M||^2 for one power step from the warm start Q (``state``, default init(x))."""
    nm = _factorised(np.shape(x), c.hparams["rank"])
    if nm is None:
        return 0.0
    m = np.asarray(x, np.float64).reshape(nm)
    if state is None:
        state = c.init(jnp.asarray(x, jnp.float32))
    q = np.asarray(getattr(state, "q", state), np.float64)
    # P = Gram-Schmidt(M Q) with the compressor's eps (a zero column stays zero), C(M) = P P^T M
    cols = []
    for col in (m @ q).T:
        for prev in cols:
            col = col - (prev @ col) * prev
        cols.append(col / (np.linalg.norm(col) + 1e-8))
    basis = np.stack(cols, axis=1)
    return float(np.sum((m - basis @ (basis.T @ m)) ** 2))


THEORY = Theory(wire_bytes=_wire_bytes, bound=_bound, error_sq=_error_sq)


# ---------------------------------------------------------------- aggregation (its own reducer)


class PowerSGDAggregation(Aggregation):
    """PowerSGD's own reducer (Vogels et al. 2019, Algorithm 1): per matrix M_w on worker w,
    P = mean_w M_w Q, orthogonalise, Q = mean_w M_w^T P; the update is P Q^T.  Two
    mean-reductions per matrix over the plan's transport (``transport.mean``: all-reduce, or a
    parameter server's push + mean + pull); the memory's ``absorb`` / ``settle`` run around the
    *aggregate* (error feedback keeps M - P Q^T).  Gossip has no mean to take: refused."""

    name = "powersgd"
    algebra = OWN
    fusable = False
    MEMORIES = ("none", "ef")  # masking (DGC) needs a sparse "sent"; the aggregate is dense

    def compresses(self, c, shape):
        return is_compressed(shape, c.hparams["rank"])

    def check(self, cfg, c):
        if cfg.collective == "allgather":
            raise ValueError(f"{c.name}'s factors are all-reduced; collective='allgather' does not apply")
        if cfg.memory not in self.MEMORIES:
            raise ValueError(f"{c.name} supports memory='ef' or 'none' (error feedback on the aggregate)")
        if cfg.granularity == "fused":
            raise ValueError(f"{c.name} factorises each matrix: use granularity='layerwise'")
        if cfg.ps_downlink is not None:
            raise ValueError(f"{c.name}'s factors are already compressed: ps_downlink must be None")

    def aggregate(self, comm, plan, units, state, key):
        mem, mean = plan.memory, plan.transport.mean
        absorbed = [mem.absorb(u, s) for u, s in zip(units, state["units"])]
        mats = [p.astype(jnp.float32).reshape(matrix_shape(u.shape)) for (p, _, _), u in zip(absorbed, units)]
        qs = [inner.q for _, inner, _ in absorbed]
        ps = [orthogonalize(p) for p in mean(comm, [compute_p(m, q) for m, q in zip(mats, qs)])]
        qs = mean(comm, [compute_q(m, p) for m, p in zip(mats, ps)])
        approx = [p @ q.T for p, q in zip(ps, qs)]
        out = [a.reshape(u.shape).astype(u.dtype) for a, u in zip(approx, units)]
        new = [
            mem.settle(s, m.reshape(u.shape), PowerSGDState(q), a.reshape(u.shape))
            for (_, _, s), m, q, a, u in zip(absorbed, mats, qs, approx, units)
        ]
        return out, {**state, "units": tuple(new)}


powersgd = register(
    "powersgd",
    Entry(
        _powersgd,
        Schema((Param("rank", "int", 1, low=1), Param("seed", "int", 0))),
        aggregation=PowerSGDAggregation(),
        theory=THEORY,
        knob=Knob("rank", (1, 4)),
        label="PowerSGD",
        known_as=("grace:PowerSGDCompressor", "gqsgd:powerSGD_hook"),  # GRACE (Xu et al. 2021); Global-QSGD release
        # per matrix: reshape, P = M Q, orthogonalise P, Q = M^T P (two all-reduces between), and P Q^T to
        # decode (Vogels et al. 2019, Algorithm 1; grace_dl/tensorflow/compressor/powersgd.py)
        cost=Cost(
            compress_ops=6,
            compress_passes=1.0,
            decompress_ops=3,
            decompress_passes=1.0,
            flops=lambda c, shape: _flops(shape, c.hparams["rank"])[0],
            decompress_flops=lambda c, shape: _flops(shape, c.hparams["rank"])[1],
            view=framework_matrix,
        ),
        example={"rank": 2},
        bench=Bench(lambda r: {"rank": 4}),
    ),
)
