"""Worker timing model and the event schedules of SSP and ASP (pure numpy, deterministic).

Worker i's compute time at its k-th step, in units of the measured compute time of one step
(``cconv.experiments.clock.Measured``)::

    d[i, k] = speed_i * slowdown_i * exp(jitter * z[i, k]),   z[i, k] ~ N(0, 1)

``speed_i`` is ``worker_speeds[i]`` (1 when not given), ``slowdown_i`` is ``stragglers.slowdown``
for a fixed subset of ``round(fraction * P)`` workers drawn from ``timing_seed`` (1 otherwise),
and ``z[:, k]`` is drawn from a generator seeded by ``(timing_seed, k)``: the time of step k is
a function of (seed, config, k) only, so a resumed run replays its schedule exactly.

Schedules (communication is not part of them: a version exists when its last gradient has
been computed; the simulated clock adds communication on top):

* **BSP / SSP** (Ho et al. 2013, staleness s).  Version v = the parameters after clocks < v;
  V[v] = max_i F[i, v-1] is when it exists (V[0] = 0).  Worker i starts clock t at
  S[i, t] = max(F[i, t-1], V[t-s]) (it may run at most s clocks ahead of the slowest) and reads
  the newest version existing then, v(i, t) = max{v <= t : V[v] <= S[i, t]} >= t - s;
  F[i, t] = S[i, t] + d[i, t].  s = 0 gives v(i, t) = t (BSP).  Clock t takes
  V[t+1] - V[t]; BSP's max_i d[i, t].
* **ASP** (Downpour / Hogwild parameter server).  Each worker computes, pushes, pulls, forever:
  its k-th gradient finishes at F[i, k] = F[i, k-1] + d[i, k].  Arrivals are applied in the
  order of (finish time, worker); arrival n produces version n+1.  A worker pulls right after
  its push, so its next gradient is computed on version (its last arrival's index) + 1, and
  arrival n has staleness tau_n = n - base_n.  With equal speeds the arrivals cycle through the
  workers 0..P-1: arrival n = kP + i (k >= 1) is based on version (k-1)P + i + 1, so
  tau_n = P - 1 in steady state (tau_n = i in the first round).  ``max_staleness`` M caps it
  (base_n >= n - M, the versions kept).  One logged step = P arrivals.
"""

from __future__ import annotations

import heapq
import math
import numbers
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from cconv._text import shown_names


class Stragglers(NamedTuple):
    """A fixed subset of ``round(fraction * P)`` workers computes ``slowdown`` times slower."""

    fraction: float
    slowdown: float


def _num(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) and math.isfinite(v)


def check(engine_cfg) -> None:
    """Validate (and normalize, on the frozen ``engine_cfg``) the timing fields of an ``EngineConfig``
    (``jitter`` and each of ``worker_speeds``: their fields' rules)."""
    st = engine_cfg.stragglers
    if isinstance(st, dict):
        bad = set(st) - {"fraction", "slowdown"}
        if bad:
            raise ValueError(
                f"stragglers: unknown key(s) {shown_names(sorted(map(str, bad)))}; valid: fraction, slowdown"
            )
        st = Stragglers(st.get("fraction", 0.0), st.get("slowdown", 1.0))
    if st is not None:
        if not isinstance(st, Sequence) or len(st) != 2:
            raise ValueError(f"stragglers must be {{fraction, slowdown}} or None, got {st!r}")
        f, s = st
        if not _num(f) or not 0 <= f < 1:
            raise ValueError(f"stragglers.fraction must be a number in [0, 1), got {f!r}")
        if not _num(s) or s < 1:
            raise ValueError(f"stragglers.slowdown must be a number >= 1, got {s!r}")
        object.__setattr__(engine_cfg, "stragglers", Stragglers(float(f), float(s)))
    ws = engine_cfg.worker_speeds
    if ws is not None:
        if len(ws) != engine_cfg.workers:  # each a number > 0: the field's rule
            raise ValueError(
                f"worker_speeds must be a list of {engine_cfg.workers} numbers (one per worker), got {ws!r}"
            )
        object.__setattr__(engine_cfg, "worker_speeds", tuple(float(x) for x in ws))


def heterogeneous(engine_cfg) -> bool:
    """Do the workers' compute times differ at all?"""
    st = engine_cfg.stragglers
    slow = st is not None and round(st.fraction * engine_cfg.workers) > 0 and st.slowdown != 1
    return (
        slow
        or engine_cfg.jitter > 0
        or (engine_cfg.worker_speeds is not None and len(set(engine_cfg.worker_speeds)) > 1)
    )


def slowdowns(engine_cfg) -> np.ndarray:
    """speed_i * slowdown_i per worker (P,), without jitter."""
    p = engine_cfg.workers
    base = np.ones(p) if engine_cfg.worker_speeds is None else np.asarray(engine_cfg.worker_speeds, np.float64)
    st = engine_cfg.stragglers
    if st is not None:
        n = int(round(st.fraction * p))
        idx = np.random.default_rng([int(engine_cfg.timing_seed) % 2**63, 0]).choice(p, n, replace=False)
        base = base.copy()
        base[idx] *= st.slowdown
    return base


def compute_times(engine_cfg, k: int) -> np.ndarray:
    """d[:, k]: every worker's compute time at its k-th step (units of the measured step)."""
    d = slowdowns(engine_cfg)
    if engine_cfg.jitter > 0:
        z = np.random.default_rng([int(engine_cfg.timing_seed) % 2**63, 1, int(k)]).standard_normal(engine_cfg.workers)
        d = d * np.exp(engine_cfg.jitter * z)
    return d


class SSPSchedule:
    """The SSP event schedule (module docstring), extended lazily and memoized.

    ``version(t)`` -> v(:, t) (P,), ``span(t)`` -> V[t+1] - V[t] (the clock's duration)."""

    def __init__(self, engine_cfg, staleness: int):
        self.engine_cfg, self.s = engine_cfg, int(staleness)
        self.V = [0.0]  # V[v]: when version v exists
        self.F = np.zeros(engine_cfg.workers)  # F[:, t-1] of the last clock computed
        self.versions: list[np.ndarray] = []

    def _extend(self, t: int) -> None:
        while len(self.versions) <= t:
            c = len(self.versions)
            start = np.maximum(self.F, self.V[max(c - self.s, 0)])
            v = np.array([max(u for u in range(max(c - self.s, 0), c + 1) if self.V[u] <= x) for x in start])
            self.F = start + compute_times(self.engine_cfg, c)
            self.V.append(float(self.F.max()))
            self.versions.append(v)

    def version(self, t: int) -> np.ndarray:
        self._extend(t)
        return self.versions[t]

    def span(self, t: int) -> float:
        self._extend(t)
        return self.V[t + 1] - self.V[t]


class ASPSchedule:
    """The ASP event schedule (module docstring): arrival n's worker, base version and finish
    time, extended lazily (a heap of the workers' next finish times)."""

    def __init__(self, engine_cfg, max_staleness: int):
        self.engine_cfg, self.cap = engine_cfg, int(max_staleness)
        p = engine_cfg.workers
        d0 = compute_times(engine_cfg, 0)
        self._heap = [(float(d0[i]), i) for i in range(p)]
        heapq.heapify(self._heap)
        self._k = np.zeros(p, np.int64)  # steps each worker has finished
        self._pulled = np.zeros(p, np.int64)  # the version each worker computes on
        self.worker: list[int] = []
        self.base: list[int] = []
        self.time: list[float] = []

    def _extend(self, n: int) -> None:
        while len(self.worker) <= n:
            t, i = heapq.heappop(self._heap)
            a = len(self.worker)
            self.worker.append(i)
            self.base.append(int(max(self._pulled[i], a - self.cap)))
            self.time.append(t)
            self._pulled[i] = a + 1  # push, then pull the version this arrival produced
            self._k[i] += 1
            d = compute_times(self.engine_cfg, int(self._k[i]))[i]
            heapq.heappush(self._heap, (t + float(d), i))

    def arrivals(self, step: int, p: int) -> tuple[np.ndarray, np.ndarray]:
        """(workers, base versions) of the P arrivals of logged step ``step``."""
        self._extend((step + 1) * p - 1)
        sl = slice(step * p, (step + 1) * p)
        return np.asarray(self.worker[sl]), np.asarray(self.base[sl])

    def span(self, step: int, p: int) -> float:
        """Duration of logged step ``step``: from its previous step's last arrival to its last."""
        self._extend((step + 1) * p - 1)
        return self.time[(step + 1) * p - 1] - (self.time[step * p - 1] if step else 0.0)


__all__ = ["Stragglers", "check", "heterogeneous", "slowdowns", "compute_times", "SSPSchedule", "ASPSchedule"]
