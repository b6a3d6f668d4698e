"""Gossip topologies: symmetric doubly-stochastic mixing matrices and their neighbour exchange.

Decentralized training (D-PSGD, Lian et al. 2017; CHOCO-SGD, Koloskova et al. 2019) replaces
the all-reduce by one gossip step ``x_i <- sum_j W_ij x_j`` with a mixing matrix W that is

* symmetric and doubly stochastic (rows and columns sum to 1, W_ij >= 0), and
* connected and aperiodic: the second-largest eigenvalue modulus |lambda_2| < 1, so the
  spectral gap ``delta = 1 - |lambda_2(W)|`` is positive and repeated gossip converges to the
  average at the linear rate (1 - delta)^t.

``TOPOLOGIES`` maps a name to a ``Topology`` object (``graph(P, **options)`` -> the neighbours of
every rank, and the full permutations along which they are reached); weights are
Metropolis-Hastings by default, ``W_ij = 1 / (1 + max(deg_i, deg_j))`` on every edge and
``W_ii = 1 - sum_{j != i} W_ij`` (Xiao & Boyd 2004), which is symmetric and doubly stochastic
for any undirected graph:

  ring         i ~ i +- 1 (mod P).  MH weights 1/3 (P >= 3): W is circulant with eigenvalues
               1/3 + 2/3 cos(2 pi k / P), so delta = 2/3 (1 - cos(2 pi / P)) for P >= 4
               (~ 4 pi^2 / (3 P^2)), delta = 1 for P <= 3 (the ring is then complete).
  torus        an r x c grid with wrap-around (rank = row * c + col), ``torus: [r, c]`` or
               auto-factored into the most square r <= c; r * c must equal P.
  exponential  i ~ i +- 2^k (mod P) for 2^k < P: the static, undirected all-peers version of
               the exponential graph (Lian et al. 2017's experiments; Assran et al. 2019 use the
               time-varying one-peer directed version, which is not symmetric) -- every rank
               talks to all its ~2 log2 P peers every step.
  complete     every pair: MH gives W = 1/P everywhere (exact averaging, delta = 1).
  matrix       an explicit W (``mixing: [[...], ...]``), validated as above.

**Exchange.**  ``Mixing.perms`` decomposes the off-diagonal support of W into *full*
permutations: perm k sends rank src_k[i]'s tree to rank i, for every i at once (a cyclic shift
``i <- i + s mod P`` for ring, exponential, complete and explicit matrices; the four grid
neighbours for the torus).  ``mix(comm, mixing, tree)`` then computes
``W_ii x_i + sum_k W[i, src_k[i]] * recv_k`` with one ``comm.permute`` per permutation; full
permutations work under ``jax.shard_map``, ``jax.pmap`` and ``jax.vmap`` (whose ``ppermute``
needs every rank to be a target).  Each permutation is recorded in the ledger as one
``permute`` collective: every worker sends and receives its payload once (ring, P >= 3: two
messages per worker per step, whatever P).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from cconv.compressors.base import payload_bytes

TOL = 1e-9  # tolerance of the doubly-stochastic / symmetry checks (float64 matrices)


class Mixing(NamedTuple):
    """A validated gossip matrix and its exchange plan.

    name     the topology's name
    W        (P, P) float64, symmetric, doubly stochastic, |lambda_2| < 1
    perms    tuple of full permutations ``src`` (tuples of length P): rank i receives from src[i]
    weights  (len(perms), P) float64: weights[k, i] = W[i, perms[k][i]] (0 where an earlier
             permutation already carries that edge)
    """

    name: str
    W: np.ndarray
    perms: tuple[tuple[int, ...], ...]
    weights: np.ndarray

    @property
    def workers(self) -> int:
        return self.W.shape[0]

    @property
    def messages(self) -> int:
        """Messages each worker sends (and receives) per gossip step."""
        return len(self.perms)

    @property
    def gap(self) -> float:
        """Spectral gap delta = 1 - |lambda_2(W)|."""
        return spectral_gap(self.W)

    @property
    def beta(self) -> float:
        """||I - W||_2 = max_i |1 - lambda_i(W)| (Koloskova et al. 2019's beta, in [0, 2])."""
        return float(np.max(np.abs(1.0 - np.linalg.eigvalsh(self.W))))


def eigenvalues(W: np.ndarray) -> np.ndarray:
    """Eigenvalues of a symmetric W, by decreasing modulus."""
    lam = np.linalg.eigvalsh(np.asarray(W, np.float64))
    return lam[np.argsort(-np.abs(lam), kind="stable")]


def spectral_gap(W: np.ndarray) -> float:
    """delta = 1 - |lambda_2(W)| for a symmetric doubly-stochastic W (lambda_1 = 1); 1 for P = 1."""
    lam = eigenvalues(W)
    return 1.0 if lam.size < 2 else float(1.0 - abs(lam[1]))


def ring_gap(workers: int) -> float:
    """Closed form of the ring's spectral gap with Metropolis-Hastings weights (module docstring):
    max_k != 0 |1/3 + 2/3 cos(2 pi k / P)| = 1/3 + 2/3 cos(2 pi / P) for P >= 4; 1 for P <= 3."""
    p = int(workers)
    if p <= 3:
        return 1.0
    return 2.0 / 3.0 * (1.0 - math.cos(2.0 * math.pi / p))


def metropolis_hastings(neighbours: Sequence[Sequence[int]]) -> np.ndarray:
    """W_ij = 1 / (1 + max(deg_i, deg_j)) on edges, W_ii = 1 - sum_j W_ij (Xiao & Boyd 2004)."""
    p = len(neighbours)
    nb = [sorted(set(int(j) for j in n if int(j) != i)) for i, n in enumerate(neighbours)]
    deg = [len(n) for n in nb]
    W = np.zeros((p, p))
    for i, n in enumerate(nb):
        for j in n:
            W[i, j] = 1.0 / (1.0 + max(deg[i], deg[j]))
    W[np.diag_indices(p)] = 1.0 - W.sum(1)
    return W


def check_matrix(W: Any, workers: int) -> np.ndarray:
    """``W`` as a float64 (P, P) array after the checks (one-line ValueError): square of size P,
    finite, non-negative, symmetric, doubly stochastic, and mixing (|lambda_2| < 1)."""
    try:
        W = np.asarray(W, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("mixing matrix must be a P x P list of numbers") from None
    p = int(workers)
    if W.shape != (p, p):
        raise ValueError(f"mixing matrix must be {p} x {p} (workers), got shape {W.shape}")
    if not np.all(np.isfinite(W)) or np.any(W < -TOL):
        raise ValueError("mixing matrix entries must be finite and >= 0")
    if not np.allclose(W, W.T, atol=TOL, rtol=0):
        raise ValueError("mixing matrix must be symmetric (directed gossip graphs are not supported)")
    rows, cols = W.sum(1), W.sum(0)
    if not (np.allclose(rows, 1, atol=1e-6, rtol=0) and np.allclose(cols, 1, atol=1e-6, rtol=0)):
        raise ValueError(f"mixing matrix must be doubly stochastic: row sums {np.round(rows, 6).tolist()}")
    if p > 1 and not spectral_gap(W) > 1e-9:
        lam2 = abs(eigenvalues(W)[1])
        raise ValueError(
            f"mixing matrix does not mix: |lambda_2| = {lam2:.6g} (the graph is disconnected or periodic; need < 1)"
        )
    return W


def cyclic_perms(workers: int, shifts: Sequence[int]) -> list[tuple[int, ...]]:
    """Full permutations i <- i + s (mod P) for each shift s."""
    p = int(workers)
    return [tuple((i + s) % p for i in range(p)) for s in shifts]


def _support_shifts(W: np.ndarray) -> list[int]:
    p = W.shape[0]
    return [s for s in range(1, p) if any(W[i, (i + s) % p] > 0 for i in range(p))]


def decompose(name: str, W: np.ndarray, perms: Sequence[Sequence[int]]) -> Mixing:
    """The ``Mixing`` of ``W`` exchanged along ``perms`` (identity and repeated permutations are
    dropped; each off-diagonal edge is carried by the first permutation that reaches it; every
    nonzero W_ij, i != j, must be reached)."""
    p = W.shape[0]
    kept: list[tuple[int, ...]] = []
    for src in perms:
        src = tuple(int(j) % p for j in src)
        if sorted(src) != list(range(p)):
            raise ValueError(f"{name}: {src} is not a permutation of the {p} ranks")
        if src != tuple(range(p)) and src not in kept:
            kept.append(src)
    covered = np.eye(p, dtype=bool)
    rows = []
    for src in kept:
        w = np.array([0.0 if covered[i, src[i]] else W[i, src[i]] for i in range(p)])
        for i in range(p):
            covered[i, src[i]] = True
        rows.append(w)
    if np.any((W > 0) & ~covered):
        raise ValueError(f"{name}: the exchange does not reach every neighbour of the mixing matrix")
    keep = [k for k, w in enumerate(rows) if np.any(w > 0)]  # a permutation with no weight sends nothing
    return Mixing(name, W, tuple(kept[k] for k in keep), np.array([rows[k] for k in keep]).reshape(len(keep), p))


# --------------------------------------------------------------------------- topologies


class Topology(Protocol):
    """A named graph family: ``mixing(P, **options)`` -> the validated ``Mixing``."""

    name: str

    def mixing(self, workers: int, **options) -> Mixing: ...


def _no_options(name: str, options: dict) -> None:
    given = [k for k, v in options.items() if v is not None]
    if given:
        raise ValueError(f"topology {name!r} takes no {', '.join(given)} (torus: torus=[r, c]; matrix: mixing=W)")


class _Circulant(abc.ABC):
    """Graphs whose neighbours are fixed shifts i +- s: exchanged along cyclic permutations."""

    name = ""

    @abc.abstractmethod
    def shifts(self, workers: int) -> list[int]:
        """The shifts s > 0 of the neighbours i +- s of worker i among ``workers``."""

    def mixing(self, workers: int, **options) -> Mixing:
        _no_options(self.name, options)
        p = int(workers)
        shifts = sorted({s % p for s in self.shifts(p)} - {0})
        nb = [[(i + s) % p for s in shifts] for i in range(p)]
        W = check_matrix(metropolis_hastings(nb), p)
        return decompose(self.name, W, cyclic_perms(p, shifts))


class Ring(_Circulant):
    name = "ring"

    def shifts(self, workers):
        return [1, -1]


class Exponential(_Circulant):
    name = "exponential"

    def shifts(self, workers):
        return [s for k in range(max(workers - 1, 1).bit_length()) for s in (1 << k, -(1 << k)) if (1 << k) < workers]


class Complete(_Circulant):
    name = "complete"

    def shifts(self, workers):
        return list(range(1, workers))


def torus_shape(workers: int, torus: Any = None) -> tuple[int, int]:
    """(r, c) of a torus of ``workers`` ranks: ``torus`` as given (r * c must be P) or the most
    square factorisation r <= c."""
    p = int(workers)
    if torus is None:
        r = max(d for d in range(1, math.isqrt(p) + 1) if p % d == 0)
        return r, p // r
    if (
        not isinstance(torus, (list, tuple))
        or len(torus) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in torus)
    ):
        raise ValueError(f"torus must be a pair [rows, cols] of integers >= 1, got {torus!r}")
    r, c = int(torus[0]), int(torus[1])
    if r * c != p:
        raise ValueError(f"torus {r} x {c} = {r * c} ranks does not factor workers={p}")
    return r, c


class Torus:
    """An r x c grid with wrap-around; rank = row * c + col; four neighbour permutations."""

    name = "torus"

    def mixing(self, workers: int, torus: Any = None, mixing: Any = None) -> Mixing:
        _no_options(self.name, {"mixing": mixing})
        p = int(workers)
        r, c = torus_shape(p, torus)
        rank = lambda i, j: (i % r) * c + (j % c)  # noqa: E731
        moves = ((0, 1), (0, -1), (1, 0), (-1, 0))
        perms = [tuple(rank(i + di, j + dj) for i in range(r) for j in range(c)) for di, dj in moves]
        nb = [[perm[i] for perm in perms] for i in range(p)]
        W = check_matrix(metropolis_hastings(nb), p)
        return decompose(f"torus{r}x{c}", W, perms)


class Matrix:
    """An explicit mixing matrix (``mixing``), exchanged along the cyclic shifts of its support."""

    name = "matrix"

    def mixing(self, workers: int, mixing: Any = None, torus: Any = None) -> Mixing:
        _no_options(self.name, {"torus": torus})
        if mixing is None:
            raise ValueError("topology 'matrix' needs mixing: a P x P symmetric doubly-stochastic matrix")
        p = int(workers)
        W = check_matrix(mixing, p)
        return decompose(self.name, W, cyclic_perms(p, _support_shifts(W)))


TOPOLOGIES: dict[str, Topology] = {t.name: t for t in (Ring(), Torus(), Exponential(), Complete(), Matrix())}


def get(name: str, workers: int, torus: Any = None, mixing: Any = None) -> Mixing:
    """The ``Mixing`` of topology ``name`` on ``workers`` ranks (one-line ValueError otherwise)."""
    if name not in TOPOLOGIES:
        raise ValueError(f"unknown topology {name!r}; valid: {', '.join(TOPOLOGIES)}")
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 2:
        raise ValueError(f"gossip needs at least 2 workers, got workers={workers!r}")
    opts = {k: v for k, v in (("torus", torus), ("mixing", mixing)) if v is not None}
    return TOPOLOGIES[name].mixing(int(workers), **opts)


# --------------------------------------------------------------------------- exchange


def neighbours(comm, mixing: Mixing, tree) -> list:
    """The trees of this rank's neighbours, one per permutation (``comm.permute`` along each; one
    ``permute`` record per permutation in the ledger: each worker sends ``tree`` once)."""
    out = []
    p = mixing.workers
    for src in mixing.perms:
        comm.record("permute", payload_bytes(tree))
        out.append(comm.permute(tree, [(src[i], i) for i in range(p)]))
    return out


def row_weights(comm, mixing: Mixing):
    """(W_ii, [W[i, src_k[i]] for each permutation k]) of this rank i, float32 traced scalars."""
    rank = comm.rank()
    diag = jnp.asarray(np.diag(mixing.W), jnp.float32)[rank]
    return diag, [jnp.asarray(w, jnp.float32)[rank] for w in mixing.weights]


def combine(comm, mixing: Mixing, own, received: Sequence) -> Any:
    """W_ii * own + sum_k W[i, src_k[i]] * received[k] (leaf-wise, in each leaf's dtype)."""
    diag, ws = row_weights(comm, mixing)

    def leaf(x, *rs):
        acc = diag.astype(x.dtype) * x
        for w, r in zip(ws, rs):
            acc = acc + w.astype(x.dtype) * r
        return acc

    return jax.tree.map(leaf, own, *received)


def mix(comm, mixing: Mixing, tree):
    """One gossip step x_i <- sum_j W_ij x_j over the neighbours (``neighbours`` + ``combine``)."""
    return combine(comm, mixing, tree, neighbours(comm, mixing, tree))


__all__ = [
    "TOPOLOGIES",
    "Topology",
    "Mixing",
    "get",
    "mix",
    "neighbours",
    "combine",
    "row_weights",
    "spectral_gap",
    "ring_gap",
    "eigenvalues",
    "metropolis_hastings",
    "check_matrix",
    "torus_shape",
    "decompose",
]
