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
A persistent-cache hit (``JAX_COMPILATION_CACHE_DIR``, or ``shared_programs()``) counts as a
program whose build time is the time to load it; ``shared`` counts those hits.

``shared_programs()`` builds each distinct XLA program once per process: candidates of one advise
(or runs of one sweep) that trace to the same HLO (the evaluator, the initial state, any program
that does not depend on the compressor) load the first one's executable instead of compiling it
again.  It is JAX's own persistent compilation cache, pointed at a private temporary directory for
the block: JAX keys an entry on the HLO, the devices, the flags and the jaxlib version, so a hit is
the same executable, bit for bit.  A cache that already exists in the process (a user's
``JAX_COMPILATION_CACHE_DIR``; the test session's) is left alone.  JAX's in-memory caches are keyed
on the Python function, and each candidate's programs are distinct closures, so they cannot share.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import threading
import time

EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
_BACKEND = EVENTS[2]
_HIT = "/jax/compilation_cache/cache_hits"
_totals = {"seconds": 0.0, "programs": 0, "shared": 0}
_traced: list[str] = []  # the functions traced, in order (JAX's ``fun_name``)
_blocked: dict[str, float] = {}  # thread name -> seconds it built programs or waited for them
_lock = threading.Lock()
_registered = False


def _block(seconds: float) -> None:
    with _lock:
        me = threading.current_thread().name
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


def _count(event: str, **kw) -> None:
    if event == _HIT:
        with _lock:
            _totals["shared"] += 1


def _register() -> None:
    global _registered
    if not _registered:
        import jax

        jax.monitoring.register_event_duration_secs_listener(_listen)
        jax.monitoring.register_event_listener(_count)
        _registered = True


PREFIX = "cconv-programs-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (EPERM): alive
        return True
    return True


def remove_stale(where: str | None = None) -> list[str]:
    """Remove the program caches that killed processes left behind (``<tmp>/cconv-programs-<pid>-*``
    of this user whose process no longer exists: a SIGKILLed advise or sweep cannot clean up);
    the removed paths.  A link, another user's directory, or one whose process is alive (or whose
    pid was reused) is left alone."""
    where = where or tempfile.gettempdir()
    gone = []
    for name in os.listdir(where):
        pid = name[len(PREFIX) :].split("-", 1)[0]
        if not (name.startswith(PREFIX) and pid.isdigit()) or _alive(int(pid)):
            continue
        path = os.path.join(where, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:  # another process removed it first
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():  # never a link, never another user's
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
    return gone


@contextlib.contextmanager
def shared_programs():
    """Inside the block, a program whose HLO was already compiled in this process is loaded, not
    compiled again (module docstring).  The cache lives in a private temporary directory (mode
    0700, named with this process's pid, removed at the end; what a killed process left is
    removed by the next block: ``remove_stale``); a cache the process already has is used as it is."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    remove_stale()
    if jax.config.jax_compilation_cache_dir:
        yield
        return
    knobs = (
        "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes",
        "jax_compilation_cache_max_size",
    )
    before = {k: getattr(jax.config, k) for k in knobs}
    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}{os.getpid()}-") as where:
        jax.config.update(knobs[0], 0.0)  # every program, however quick to compile
        jax.config.update(knobs[1], -1)
        # a size bound turns on JAX's file lock around each entry: a build thread never reads an
        # entry another thread is still writing (a torn read is a warning and a recompile)
        jax.config.update(knobs[2], 8 << 30)
        cc.set_cache_dir(where)
        cc.reset_cache()  # JAX decides whether a cache is used once per process: decide again
        try:
            yield
        finally:
            cc.set_cache_dir(None)
            for k, v in before.items():
                jax.config.update(k, v)
            cc.reset_cache()


class CompileMeter:
    """Build time (trace + lower + compile, seconds, every thread), backend compilations, and the
    time the metering thread spent building or ``waiting()`` for programs, inside a block.
    ``also``: a thread-name prefix; the threads so named (those the metering thread hands its work
    to, e.g. a ``ThreadPoolExecutor(thread_name_prefix=...)``) count in ``blocked`` too, which is
    then a sum over threads that can exceed the block's wall time."""

    def __init__(self, also: str | None = None) -> None:
        self.seconds, self.programs, self.blocked, self.shared = 0.0, 0, 0.0, 0
        self.traced: list[str] = []  # names of the functions traced in the block (every thread)
        self._start = (0.0, 0, 0.0, 0, 0)
        self._also = also

    def _mine(self) -> float:
        me = threading.current_thread().name
        with _lock:
            return sum(v for k, v in _blocked.items() if k == me or (self._also and k.startswith(self._also)))

    def __enter__(self) -> CompileMeter:
        _register()
        t = _totals
        self._start = (t["seconds"], t["programs"], self._mine(), len(_traced), t["shared"])
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = _totals["seconds"] - self._start[0]
        self.programs = _totals["programs"] - self._start[1]
        self.blocked = self._mine() - self._start[2]
        self.traced = _traced[self._start[3] :]
        self.shared = _totals["shared"] - self._start[4]  # programs loaded from the cache


__all__ = ["CompileMeter", "EVENTS", "remove_stale", "shared_programs", "waiting"]
