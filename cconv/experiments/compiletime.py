"""Seconds spent tracing, lowering and compiling JAX programs, as JAX itself reports them.

JAX records three durations for every program it builds (``jax.monitoring``): tracing to a jaxpr,
lowering to an MLIR module, and XLA's backend compilation.  ``CompileMeter`` sums them over a
block, so that a command that builds many programs (``cconv advise`` builds one per candidate)
can say how much of its wall time was building programs rather than running them::

    with CompileMeter() as m:
        ...
    m.seconds, m.programs        # build time, backend compilations

One listener is registered on first use (``jax.monitoring`` has no public way to remove one) and
meters read the running totals, so meters nest and cost nothing when no program is built.
Persistent-cache hits (``JAX_COMPILATION_CACHE_DIR``) record no backend compilation.
"""

from __future__ import annotations

import threading

EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
_BACKEND = EVENTS[2]
_totals = {"seconds": 0.0, "programs": 0}
_lock = threading.Lock()
_registered = False


def _listen(event: str, duration: float, **_kw) -> None:
    if event in EVENTS:
        with _lock:
            _totals["seconds"] += float(duration)
            _totals["programs"] += event == _BACKEND


def _register() -> None:
    global _registered
    if not _registered:
        import jax

        jax.monitoring.register_event_duration_secs_listener(_listen)
        _registered = True


class CompileMeter:
    """Build time (trace + lower + compile, seconds) and backend compilations inside a block."""

    def __init__(self) -> None:
        self.seconds, self.programs = 0.0, 0
        self._start = (0.0, 0)

    def __enter__(self) -> CompileMeter:
        _register()
        self._start = (_totals["seconds"], _totals["programs"])
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = _totals["seconds"] - self._start[0]
        self.programs = _totals["programs"] - self._start[1]


__all__ = ["CompileMeter", "EVENTS"]
