"""Staleness bounds of SSP and ASP (the delays the convergence rates of delayed SGD depend on).

Delayed SGD x_{n+1} = x_n - eta g(x_{n - tau_n}) converges like SGD when eta shrinks with the
maximal delay tau_max (e.g. Stich and Karimireddy 2020: eta <= 1 / (10 L (tau_max + 1)) for
smooth functions; Ho et al. 2013 for SSP: regret O(sqrt((s + 1) P T))); these functions give
tau_max for cconv's schedules (``cconv.engine.worker_clock``) from the configuration alone.

* SSP with staleness s: a clock-t gradient is computed on a version v >= t - s, so its delay in
  clocks is at most s (the bound holds by construction, whatever the speeds).
* ASP: worker i's gradient is computed during an interval of length d_i (from its pull to its
  push); the other workers' arrivals in that closed interval are its staleness.  Worker j
  finishes at most floor(d_i / d_j) + 1 times in it, so

      tau_max <= max_i sum_{j != i} (floor(d_i^max / d_j^min) + 1)

  (d^max, d^min: the extreme compute times of a worker, equal without jitter), and never more
  than the ``max_staleness`` cap.  With equal speeds every delay is exactly P - 1 after the
  first round (``asp_equal_speed_staleness``; derivation in ``cconv.engine.worker_clock``).
"""

from __future__ import annotations

import numpy as np


def ssp_bound(staleness: int) -> int:
    """The largest delay (clocks) of an SSP gradient: s."""
    if isinstance(staleness, bool) or not isinstance(staleness, (int, np.integer)) or staleness < 0:
        raise ValueError(f"staleness must be an integer >= 0, got {staleness!r}")
    return int(staleness)


def asp_bound(d_max, d_min=None, cap: int | None = None) -> int:
    """The largest ASP delay (arrivals) for workers whose compute times lie in
    [d_min_i, d_max_i] (``d_min`` None: = ``d_max``, no jitter), capped by ``cap``."""
    hi = np.asarray(d_max, np.float64)
    lo = hi if d_min is None else np.asarray(d_min, np.float64)
    if hi.ndim != 1 or hi.shape != lo.shape or not (lo > 0).all() or not (hi >= lo).all():
        raise ValueError("asp_bound: d_max and d_min must be positive vectors of equal length with d_max >= d_min")
    p = len(hi)
    per = [sum(int(np.floor(hi[i] / lo[j])) + 1 for j in range(p) if j != i) for i in range(p)]
    bound = max(per) if per else 0
    return bound if cap is None else min(bound, int(cap))


def asp_equal_speed_staleness(workers: int, arrival: int) -> int:
    """The delay of arrival ``arrival`` (0-based) with P equal-speed workers: i = n in the first
    round (worker i's first gradient is on version 0), P - 1 afterwards."""
    return int(arrival) if arrival < workers else int(workers) - 1


__all__ = ["ssp_bound", "asp_bound", "asp_equal_speed_staleness"]
