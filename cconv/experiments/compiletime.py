"""Seconds spent tracing, lowering and compiling JAX programs, as JAX itself reports them.

JAX records three durations for every program it builds (``jax.monitoring``): tracing to a jaxpr,
lowering to an MLIR module, and XLA's backend compilation.  ``CompileMeter`` sums them over a
block, so that a command that builds many programs (``cconv advise`` builds one per candidate)
can say how much of its wall time was building programs rather than running them::

    with CompileMeter() as m:
        ...
    m.seconds, m.programs        # build time, backend compilations (every thread)
    m.traced                     # the names of the functions traced (JAX's fun_name)
    m.blocked                    # of the block's wall time: this thread building programs, or
                                 # waiting for programs another thread builds (``waiting()``)

Programs built in other threads (``cconv.experiments.warm`` in a pool) count in ``seconds``, which
can then exceed the wall time; ``blocked`` is the wall time the metered thread lost to building.
One listener is registered on first use (``jax.monitoring`` has no public way to remove one) and
meters read the running totals, so meters nest and cost nothing when no program is built.
Persistent-cache hits (``JAX_COMPILATION_CACHE_DIR``) record no backend compilation.
"""

from __future__ import annotations

import contextlib
import threading
import time

EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
_BACKEND = EVENTS[2]
_totals = {"seconds": 0.0, "programs": 0}
_traced: list[str] = []  # the functions traced, in order (JAX's ``fun_name``)
_blocked: dict[int, float] = {}  # thread id -> seconds it built programs or waited for them
_lock = threading.Lock()
_registered = False


def _block(seconds: float) -> None:
    with _lock:
        me = threading.get_ident()
        _blocked[me] = _blocked.get(me, 0.0) + seconds


def _listen(event: str, duration: float, **kw) -> None:
    if event in EVENTS:
        with _lock:
            _totals["seconds"] += float(duration)
            _totals["programs"] += event == _BACKEND
            if event == EVENTS[0]:
                _traced.append(str(kw.get("fun_name", "?")))
        _block(float(duration))


@contextlib.contextmanager
def waiting():
    """Count the block's wall time as this thread's building time (it waits for a program that
    another thread builds)."""
    t = time.perf_counter()
    try:
        yield
    finally:
        _block(time.perf_counter() - t)


def _register() -> None:
    global _registered
    if not _registered:
        import jax

        jax.monitoring.register_event_duration_secs_listener(_listen)
        _registered = True


class CompileMeter:
    """Build time (trace + lower + compile, seconds, every thread), backend compilations, and the
    wall time the metering thread spent building or ``waiting()`` for programs, inside a block."""

    def __init__(self) -> None:
        self.seconds, self.programs, self.blocked = 0.0, 0, 0.0
        self.traced: list[str] = []  # names of the functions traced in the block (every thread)
        self._start = (0.0, 0, 0.0, 0)

    def __enter__(self) -> CompileMeter:
        _register()
        me = threading.get_ident()
        self._start = (_totals["seconds"], _totals["programs"], _blocked.get(me, 0.0), len(_traced))
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = _totals["seconds"] - self._start[0]
        self.programs = _totals["programs"] - self._start[1]
        self.blocked = _blocked.get(threading.get_ident(), 0.0) - self._start[2]
        self.traced = _traced[self._start[3] :]


__all__ = ["CompileMeter", "EVENTS", "waiting"]
