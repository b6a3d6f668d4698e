"""Gossip theory: spectral gaps, CHOCO-SGD's consensus step size, and per-step gossip cost.

* **Spectral gap** delta_W = 1 - |lambda_2(W)| of each topology's mixing matrix
  (``cconv.comm.topology``; ring with Metropolis-Hastings weights 1/3 in closed form:
  2/3 (1 - cos(2 pi / P)) for P >= 4).  Exact gossip contracts the disagreement
  ||X - X_bar||_F by (1 - delta_W) per step.
* **CHOCO step size** (Koloskova, Stich & Jaggi 2019, Theorem 2, CHOCO-Gossip): with the
  eigengap rho = delta_W, beta = ||I - W||_2 (in [0, 2]) and a compressor of contraction
  omega (their notation; cconv's delta: E||Q(x) - x||^2 <= (1 - omega) ||x||^2),

      gamma* = rho^2 omega / (16 rho + rho^2 + 4 beta^2 + 2 rho beta^2 - 8 rho omega)

  gives linear consensus, e_t <= (1 - rho^2 omega / 82)^t e_0 (the same gamma is used in their
  Theorem 4 for CHOCO-SGD).  The bound is conservative: the paper's experiments tune gamma
  (often 10-100x larger).  An unbiased compressor with variance factor w enters after scaling by
  1/(1 + w), which makes it contractive with omega = 1/(1 + w) (their Remark); a compressor
  without a contraction (e.g. an unscaled sign) has no guarantee (ValueError).
* **Default consensus step** (``safe_gamma``, what ``gossip_gamma: null`` stands for): gamma = delta,
  the contraction of the compressor *as the engine applies it* (unscaled):
  delta for a delta-contraction, 1 - w for an unbiased compressor with variance factor w < 1
  (E||Q(x) - x||^2 = w ||x||^2), 1 uncompressed.  Why: gamma* above is proportional to delta
  for small delta (gamma* ~ delta rho^2 / (16 rho + rho^2 + 4 beta^2 + 2 rho beta^2)); its graph
  factor is the conservative part (gamma* = 0.004 for exact gossip on a ring of 8, where gamma =
  1 is plain D-PSGD).  gamma = delta keeps the proportionality, is 1 without compression, and
  measured on ``studies/quickstart.yaml``'s task (ring of 8, top-k 10 %, delta = 0.1, 150
  steps; ``tests/test_trust_config.py``): gamma = 1 diverges (loss 1491), 0.5 / 0.3 / 0.1 reach
  0.150 / 0.146 / 0.131.  Without a contraction (unbiased with w >= 1 unscaled: x_hat's error
  grows by w per step whatever gamma is; signSGD, DGC, threshold, PowerSGD) there is no safe
  default: ValueError (give gamma explicitly).
* **Cost per step** in the alpha-beta model (``cconv.theory.network``): a worker sends its
  payload of n bytes once per neighbour permutation (ring 2, torus 4, exponential ~2 log2 P,
  complete P - 1 messages), one after the other through its link:
  t = m (alpha + n beta), next to the ring all-reduce's 2(P-1) alpha + 2(P-1)/P n beta.  Gossip
  is not an average: its per-step time is not comparable to an all-reduce's without the extra
  steps a small spectral gap costs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from cconv.comm import topology as topo
from cconv.compressors.base import Compressor
from cconv.theory import constants as K
from cconv.theory import network as N

EXACT_GAP_MAX_WORKERS = 4096  # eigendecomposition of the P x P matrix up to this size


class GossipTheory(NamedTuple):
    """The constants CHOCO-SGD's rate depends on, for one topology and compressor."""

    topology: str
    workers: int
    messages: int  # per worker per step
    gap: float  # rho = 1 - |lambda_2(W)|
    beta: float  # ||I - W||_2
    omega: float  # compression quality (cconv's delta; 1: no compression)
    gamma: float  # gamma* (Theorem 2)
    rate: float  # linear consensus rate rho^2 omega / 82


def choco_gamma(gap: float, beta: float, omega: float) -> float:
    """gamma* = rho^2 omega / (16 rho + rho^2 + 4 beta^2 + 2 rho beta^2 - 8 rho omega) (module doc)."""
    rho, b, w = float(gap), float(beta), float(omega)
    if not 0 < rho <= 1:
        raise ValueError(f"spectral gap must be in (0, 1], got {gap!r}")
    if not 0 < w <= 1:
        raise ValueError(f"compression quality omega must be in (0, 1], got {omega!r}")
    if not 0 <= b <= 2:
        raise ValueError(f"beta = ||I - W||_2 must be in [0, 2], got {beta!r}")
    return rho * rho * w / (16 * rho + rho * rho + 4 * b * b + 2 * rho * b * b - 8 * rho * w)


def safe_gamma(c: Compressor | str | None, shape: Sequence[int]) -> float:
    """The default consensus step gamma = delta of ``c`` (unscaled) on a tensor of ``shape``
    (module docstring): delta, 1 - w for an unbiased compressor with w < 1, 1 for none.  A
    ValueError (one line) when ``c`` applied unscaled is not a contraction."""
    if c is None:
        return 1.0
    k = K.constants(c, shape)
    if k.kind == "unbiased" and k.omega is not None and k.omega < 1:
        return 1.0 - float(k.omega)
    if k.kind != "unbiased" and k.delta:
        return float(k.delta)
    why = f"variance factor omega = {k.omega:.3g} >= 1, unscaled" if k.kind == "unbiased" else f"kind {k.kind}"
    raise ValueError(f"{k.name} is not a contraction ({why}): no safe consensus step gamma to derive")


def compression_quality(c: Compressor | str | None, shape: Sequence[int]) -> float:
    """Koloskova et al.'s omega of ``c`` for tensors of ``shape``: its contraction delta, or
    1/(1 + w) for an unbiased compressor of variance factor w (after scaling); 1 for none."""
    if c is None:
        return 1.0
    k = K.constants(c, shape)
    if k.kind == "unbiased":
        return 1.0 / (1.0 + k.omega)
    if not k.delta:
        raise ValueError(f"{k.name} is not a contraction (kind {k.kind}): CHOCO-SGD has no guarantee with it")
    return float(k.delta)


def choco(
    topology: str,
    workers: int,
    compressor: Compressor | str | None = None,
    shape: Sequence[int] = (1000,),
    torus: Any = None,
    mixing: Any = None,
) -> GossipTheory:
    """Spectral gap, beta, omega, gamma* and the consensus rate of CHOCO on ``topology``."""
    m = topo.get(topology, workers, torus=torus, mixing=mixing)
    gap, beta, w = m.gap, m.beta, compression_quality(compressor, shape)
    return GossipTheory(m.name, m.workers, m.messages, gap, beta, w, choco_gamma(gap, beta, w), gap * gap * w / 82)


def spectral_gaps(workers: int, topologies: Sequence[str] = ("ring", "torus", "exponential", "complete")) -> dict:
    """Topology name -> spectral gap of its Metropolis-Hastings W on ``workers`` ranks."""
    return {t: topo.get(t, workers).gap for t in topologies}


# --------------------------------------------------------------------------- cost per step


class GossipRow(NamedTuple):
    name: str  # topology (or "allreduce")
    messages: int
    gap: float | None  # None: not computed (P too large)
    sent_bytes: float  # per worker per step
    comm_s: float


def gossip_rows(
    nbytes: float,
    workers: int,
    net: N.Network | N.Hierarchical,
    topologies: Sequence[str] = ("ring", "torus", "exponential", "complete"),
) -> list[GossipRow]:
    """Per-step bytes and time of one exchange of ``nbytes`` per worker: the ring all-reduce,
    then one gossip step on each topology (module docstring)."""
    p = int(workers)
    rows = [
        GossipRow(
            "allreduce",
            2 * (p - 1),
            1.0,
            N.bytes_sent("allreduce", nbytes, p),
            N.collective_time("allreduce", nbytes, p, net),
        )
    ]
    if p < 2:
        return rows
    t_msg = N.collective_time("permute", nbytes, p, net)
    for name in topologies:
        if p > EXACT_GAP_MAX_WORKERS:  # no eigendecomposition: the ring's closed form only
            if name != "ring":
                continue
            msgs, gap = 2, topo.ring_gap(p)
        else:
            m = topo.get(name, p)
            msgs, gap = m.messages, m.gap
        rows.append(GossipRow(name, msgs, gap, msgs * float(nbytes), msgs * t_msg))
    return rows


def format_rows(rows: Sequence[GossipRow], compute_s: float, human_bytes) -> str:
    """The gossip table ``cconv plan`` prints under its compressor table (dense fp32 models)."""
    lines = [
        f"{'exchange':<12} {'messages':>8} {'gap':>8} {'sent/worker':>12} {'comm ms':>9} {'iter ms':>9}",
    ]
    for r in rows:
        gap = "n/a" if r.gap is None else f"{r.gap:.4g}"
        lines.append(
            f"{r.name:<12} {r.messages:>8} {gap:>8} {human_bytes(r.sent_bytes):>12} "
            f"{r.comm_s * 1e3:>9.2f} {(compute_s + r.comm_s) * 1e3:>9.1f}"
        )
    lines.append(
        "gossip (D-PSGD) sends the dense model to each neighbour; CHOCO sends a compressor's payload instead "
        "(scale sent/worker by payload/worker above); a small gap needs more steps (theory: cconv.theory.gossip)"
    )
    return "\n".join(lines)


def ring_gap_formula(workers: int) -> float:
    """Alias of ``cconv.comm.topology.ring_gap`` (closed form, MH weights 1/3)."""
    return topo.ring_gap(workers)


__all__ = [
    "GossipTheory",
    "GossipRow",
    "choco",
    "choco_gamma",
    "compression_quality",
    "safe_gamma",
    "spectral_gaps",
    "gossip_rows",
    "format_rows",
    "ring_gap_formula",
]
