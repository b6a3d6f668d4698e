"""A training run's simulated step time under a communication schedule (``schedule:`` in a run
config; ``cconv.experiments.clock``).

Today's formula (no ``schedule``) is ``t_compute + t_exchange + sum of the step's collective
times``.  With a schedule, the step is one iteration of the event simulator
(``schedules.run``) over the run's own model profile (``profiles.from_spec``: FLOPs and gradient
bytes per top-level parameter group, backprop order):

* forward and backward of layer l take the measured ``t_compute`` (forward, backward and update
  of the local batch) times the layer's share of the profile's forward + backward FLOPs;
* the measured ``t_exchange`` (compression with the run's memory, and decompression of every
  received payload) is spread over the layers by their share of the gradient bytes, half as
  compress (before the layer's message) and half as decompress (after it);
* the step's collectives (``trainer.collectives(step)``, control traffic left out) are summed per
  kind and split over the layers by the same shares: each layer sends one message per kind (a
  layer's second and further kinds ride on zero-compute companion layers right after it, so the
  schedule sees every message; the layer's decompress waits for its last kind's message);
* the architecture: ``servers`` (or an engine with ``architecture: parameter-server``, one
  server) -> the co-located parameter server (``arch.get("ps")``: push and pull on the two
  directions of the links; a step's ``ps_push`` bytes are the pushed message, its ``ps_pull``
  bytes the server's reply: the dense sum of a gathered payload, or its downlink-compressed
  form); else the all-to-all ``hierarchical`` algorithm, which is the ring of
  ``cconv.theory.network`` on a flat link.  No GPU interference (``interference=0``): the
  measured compute already ran next to nothing.

With ``bsp`` on a flat link and one collective per kind (``granularity: fused``) this equals
today's formula (``tests/test_theory_profiles.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from cconv.theory import network as N
from cconv.theory.profiles import Profile
from cconv.theory.schedule import arch as A
from cconv.theory.schedule import schedules as S

PS_KINDS = ("ps_push", "ps_pull")


def _totals(collectives: Iterable[Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for c in collectives:
        if getattr(c, "control", False):
            continue
        kind, nbytes, count = c.kind, float(c.bytes), int(getattr(c, "count", 1))
        out[kind] = out.get(kind, 0.0) + nbytes * count
    return out


def architecture(
    net: N.Network | N.Hierarchical, workers: int, servers: int | None = None, ps: bool = False
) -> A.Architecture:
    """The architecture a run's messages travel on (module docstring)."""
    if servers is not None or ps:
        return A.get("ps", net, workers, 1 if servers is None else servers)
    return A.get("hierarchical", net, workers)


def step_layers(
    profile: Profile, collectives: Iterable[Any], compute_s: float, exchange_s: float, ps: bool = False
) -> list[S.LayerCost]:
    """The ``LayerCost``s of one step (module docstring); ``ps``: the messages go through servers."""
    totals = _totals(collectives)
    reply = None
    if ps:
        bad = [k for k in totals if k not in (*PS_KINDS, "allreduce")]
        if bad:
            raise ValueError(f"a parameter-server schedule cannot carry {', '.join(bad)} collectives")
        dense = totals.get("allreduce", 0.0)
        reply = totals.get("ps_pull", 0.0) + dense
        totals = {"allgather": totals.get("ps_push", 0.0) + dense}
    flops = profile.fwd_flops + profile.bwd_flops
    size = sum(lay.grad_bytes for lay in profile.layers)
    L = len(profile.layers)
    out = []
    for lay in profile.layers:
        fw = lay.fwd_flops / flops if flops > 0 else 0.5 / L
        bw = lay.bwd_flops / flops if flops > 0 else 0.5 / L
        share = lay.grad_bytes / size if size > 0 else 1.0 / L
        half = 0.5 * exchange_s * share
        kinds = list(totals) or ["allreduce"]
        for i, kind in enumerate(kinds):
            first, last = i == 0, i == len(kinds) - 1
            out.append(
                S.LayerCost(
                    lay.name if first else f"{lay.name}/{kind}",
                    compute_s * fw if first else 0.0,
                    compute_s * bw if first else 0.0,
                    totals.get(kind, 0.0) * share,
                    half if first else 0.0,
                    half if last else 0.0,
                    kind,
                    None if reply is None else reply * share,
                )
            )
    return out


def step_time(
    profile: Profile,
    collectives: Sequence[Any],
    workers: int,
    net: N.Network | N.Hierarchical,
    schedule: str,
    compute_s: float,
    exchange_s: float,
    *,
    servers: int | None = None,
    ps: bool = False,
) -> float:
    """Simulated seconds of one training step under ``schedule`` (module docstring)."""
    use_ps = servers is not None or ps
    layers = step_layers(profile, collectives, compute_s, exchange_s, use_ps)
    return S.run(layers, schedule, architecture(net, workers, servers, ps)).iter_s


__all__ = ["step_layers", "step_time", "architecture"]
