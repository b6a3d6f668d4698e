"""A step's communication time: the sum of its collectives, or the exposed time under wait-free
backpropagation (WFBP; Zhang et al. 2017) with tensor fusion."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from cconv.theory.network.cost import COLLECTIVES, _check_args, _check_network, collective_time
from cconv.theory.network.links import Hierarchical, Network


class Overlap(NamedTuple):
    """Wait-free backpropagation (WFBP; Zhang et al. 2017) with optional tensor fusion.

    ``backward``: seconds of backpropagation that communication can hide behind.
    ``fusion_bytes``: merge consecutive calls of the same kind into one message while the merged
    payload stays <= fusion_bytes (Horovod's fusion buffer, 64 MiB by default there; MG-WFBP,
    Shi et al. 2019, chooses merges optimally); 0 disables fusion.
    ``ready``: seconds into the backward pass at which each call (after expanding ``count``,
    in the given order) can start; default: the calls are listed in forward order, gradients
    appear in reverse order, each after a share of ``backward`` proportional to its bytes.
    """

    backward: float
    fusion_bytes: float = 0
    ready: Sequence[float] | None = None


def _as_call(c: Any) -> tuple[str, float, int, bool]:
    control = False
    if isinstance(c, Mapping):
        kind, nbytes, count = c.get("kind"), c.get("bytes"), c.get("count", 1)
        control = bool(c.get("control", False))
    elif hasattr(c, "kind") and hasattr(c, "bytes"):
        kind, nbytes, count = c.kind, c.bytes, getattr(c, "count", 1)
        control = bool(getattr(c, "control", False))
    elif isinstance(c, (tuple, list)) and len(c) in (2, 3):
        kind, nbytes, count = c[0], c[1], (c[2] if len(c) == 3 else 1)
    else:
        raise ValueError(f"a collective must have kind, bytes (and count); got {c!r}")
    if kind not in COLLECTIVES:
        raise ValueError(f"unknown collective kind {kind!r}; valid: {', '.join(COLLECTIVES)}")
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
        raise ValueError(f"collective count must be an integer >= 0, got {count!r}")
    _check_args(nbytes, 1)
    return str(kind), float(nbytes), int(count), control


def _fuse(calls: list[tuple[str, float, float]], limit: float) -> list[tuple[str, float, float]]:
    """Greedy fusion of consecutive (kind, bytes, ready) calls of one kind up to ``limit`` bytes."""
    out: list[tuple[str, float, float]] = []
    for kind, n, r in calls:
        if out and out[-1][0] == kind and out[-1][1] + n <= limit:
            out[-1] = (kind, out[-1][1] + n, max(out[-1][2], r))
        else:
            out.append((kind, n, r))
    return out


def wfbp_finish(times: Sequence[float], ready: Sequence[float]) -> float:
    """When the last of a sequence of calls ends on one link: start_j = max(ready_j, end_{j-1})."""
    end = 0.0
    for t, r in zip(times, ready):
        end = max(end, r) + t
    return end


def step_comm_time(
    collectives: Iterable[Any],
    workers: int,
    net: Network | Hierarchical,
    overlap: Overlap | None = None,
    *,
    servers: int = 1,
    include_control: bool = False,
) -> float:
    """Communication seconds of one step.

    ``collectives``: the engine's ``trainer.collectives(step)`` (objects with kind, bytes, count
    and optionally ``control``), or (kind, bytes[, count]) tuples or dicts.  Control traffic
    (``control=True``: the engine's all-reduce of logged metrics, not part of the training
    algorithm) is left out unless ``include_control``.  Without ``overlap``: the sum of count x
    collective_time.  With ``overlap`` (an ``Overlap``): the *exposed* communication time,
    max(0, end of the last call - backward), under WFBP scheduling on one link, after fusion.
    """
    if not isinstance(net, Hierarchical):
        net = _check_network(net)
    _check_args(0, workers)
    calls = []
    for c in collectives:
        kind, n, count, control = _as_call(c)
        if control and not include_control:
            continue
        calls.extend([(kind, n)] * count)
    if overlap is None:
        return float(sum(collective_time(k, n, workers, net, servers=servers) for k, n in calls))
    if not isinstance(overlap, Overlap):
        raise ValueError(f"overlap must be None or a cconv.theory.network.Overlap, got {overlap!r}")
    if overlap.backward < 0 or overlap.fusion_bytes < 0:
        raise ValueError("overlap: backward and fusion_bytes must be >= 0")
    if overlap.ready is not None:
        if len(overlap.ready) != len(calls):
            raise ValueError(f"overlap.ready has {len(overlap.ready)} entries for {len(calls)} calls")
        timed = [(k, n, float(r)) for (k, n), r in zip(calls, overlap.ready)]
    else:
        total = sum(n for _, n in calls) or 1.0
        timed, acc = [], 0.0
        for k, n in reversed(calls):
            acc += n
            timed.append((k, n, overlap.backward * acc / total))
    timed.sort(key=lambda c: c[2])
    if overlap.fusion_bytes > 0:
        timed = _fuse(timed, overlap.fusion_bytes)
    times = [collective_time(k, n, workers, net, servers=servers) for k, n, _ in timed]
    end = wfbp_finish(times, [r for _, _, r in timed])
    return max(0.0, end - overlap.backward)
