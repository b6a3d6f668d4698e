"""Multi-process set-up: ``jax.distributed`` (NCCL on GPUs, gloo on CPUs) and MPI detection.

Two ways to run cconv on several hosts:

1. ``jax.distributed`` + the ``shard_map`` launcher (recommended).  Call ``initialize()`` first
   thing in every process; then ``jax.devices()`` lists every device of every process and
   ``EngineConfig(workers=len(jax.devices()))`` trains over all of them.  Under SLURM
   (``srun``) or OpenMPI (``mpirun``) the coordinator, process count and process id are read
   from the environment; elsewhere pass them (or set ``CCONV_COORDINATOR``,
   ``CCONV_NUM_PROCESSES``, ``CCONV_PROCESS_ID``).  GPU collectives go through NCCL; CPU
   collectives through gloo (set here, before the back-end starts).
2. ``launcher="mpi"``: one process per worker under ``mpirun``, collectives by mpi4jax
   (``cconv.comm.mpi``); no ``jax.distributed`` needed.

Every process must feed the same global batch and key to ``trainer.step`` (same seeds); the
engine turns host arrays into global arrays and each process computes only its own workers.

A lost process (``jax.distributed``; docs/signals.md).  By default JAX notices a dead process
only by its missing heartbeats (100 s), and then aborts every other process with a C++ stack
trace (``client.h: Terminating process because the JAX distributed service detected fatal
errors``); a survivor blocked at exit waits for that.  ``initialize`` instead sets the heartbeat
timeout to ``HEARTBEAT_TIMEOUT`` seconds, turns on ``jax_enable_recoverability`` (a task's death
is no longer a fatal error pushed to the others) and starts a ``PeerWatch`` thread in every
process: it asks the coordination service which processes are alive (``get_live_nodes``, a
barrier of the live processes, once per ``WATCH_PERIOD``).  When one is missing, every survivor
prints one line naming the lost process and exits at once with ``PEER_LOST_EXIT`` (75,
``EX_TEMPFAIL``: start the run again; it resumes from its last checkpoint).  A collective that
fails because its peer died (gloo: "Connection closed by peer") leaves the decision to the watch
(``sys.excepthook`` waits for its next round), so that error too ends in that one line; an
uncaught error of the process itself is printed as usual and the process leaves at once (the
others then find it lost).  ``shutdown`` (also run at exit) first waits at a barrier for every
process, so that process 0, which hosts the service, never leaves before the others, and last
waits for the watch thread to return: a daemon thread still inside JAX's client when the
interpreter finalises made the process abort after its work (exit 134, "exception not rethrown").  When
process 0 dies, the service dies with it and JAX's client aborts the others at once from its own
thread (SIGABRT, with its C++ stack trace); jaxlib 0.10 gives Python no way to replace that
(its ``missed_heartbeat_callback`` aborts with ``std::bad_cast`` when given a Python function).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

import jax

ENV = ("CCONV_COORDINATOR", "CCONV_NUM_PROCESSES", "CCONV_PROCESS_ID")
# A process without a heartbeat for this long is lost (JAX's default, 100 s, is what kept the
# survivors waiting ~95 s).  Long enough for a loaded host, whose heartbeat thread may lag a few
# seconds; a lost process is named within about this time.
HEARTBEAT_TIMEOUT = 10
WATCH_PERIOD = 1.0  # seconds between two liveness rounds of the PeerWatch
PEER_LOST_EXIT = 75  # os.EX_TEMPFAIL: a temporary failure, start the run again to resume
END_BARRIER_TIMEOUT = 24 * 3600  # s: ``shutdown`` waits this long for slower processes (a lost one ends it sooner)


def detect() -> str:
    """Which launcher started this process: "slurm", "mpi" (OpenMPI/PMIx), "env" or "single"."""
    if "SLURM_JOB_ID" in os.environ and "SLURM_PROCID" in os.environ:
        return "slurm"
    if "OMPI_COMM_WORLD_SIZE" in os.environ or "PMIX_RANK" in os.environ:
        return "mpi"
    if all(k in os.environ for k in ENV):
        return "env"
    return "single"


def launched_processes() -> int:
    """How many processes the launcher started, read from its environment before anything starts
    (SLURM's ``SLURM_NTASKS``, OpenMPI's ``OMPI_COMM_WORLD_SIZE``, ``CCONV_NUM_PROCESSES``); 1 when
    none says (a process started by hand)."""
    for var in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "CCONV_NUM_PROCESSES"):
        try:
            n = int(os.environ.get(var, ""))
        except ValueError:
            continue
        if n >= 1:
            return n
    return 1


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids=None,
    cpu_collectives: str = "gloo",
    watch: bool = True,
    **kwargs,
) -> dict:
    """Start ``jax.distributed`` (a no-op for a single process); returns a description.

    Explicit arguments win, then ``CCONV_*`` variables, then JAX's own cluster detection
    (SLURM, OpenMPI).  ``cpu_collectives``: "gloo" (default) or "mpi" for CPU devices.
    ``watch``: end every process promptly, with one line, when one is lost (module docstring);
    ``heartbeat_timeout_seconds`` (passed on to ``jax.distributed.initialize``) defaults to
    ``HEARTBEAT_TIMEOUT``.
    """
    if cpu_collectives not in ("gloo", "mpi"):
        raise ValueError(f"cpu_collectives must be 'gloo' or 'mpi', got {cpu_collectives!r}")
    how = detect()
    if how == "env" and coordinator_address is None:
        coordinator_address = os.environ["CCONV_COORDINATOR"]
        num_processes = int(os.environ["CCONV_NUM_PROCESSES"])
        process_id = int(os.environ["CCONV_PROCESS_ID"])
    explicit = coordinator_address is not None
    if how == "single" and not explicit:
        return {"launcher": "single", "process_id": 0, "num_processes": 1}
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    kwargs.setdefault("heartbeat_timeout_seconds", HEARTBEAT_TIMEOUT)
    if watch:  # a dead task is not fatal to the others: the PeerWatch names it and ends them
        jax.config.update("jax_enable_recoverability", True)
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=local_device_ids,
        **kwargs,
    )
    if watch and jax.process_count() > 1:
        PeerWatch.start(kwargs["heartbeat_timeout_seconds"])
    return {
        "launcher": "explicit" if explicit else how,
        "process_id": jax.process_index(),
        "num_processes": jax.process_count(),
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
    }


def shutdown() -> None:
    """Leave ``jax.distributed``: wait for every process (``PeerWatch.finish``), then shut down.

    Call this, not ``jax.distributed.shutdown()`` alone: with recoverable tasks JAX's own shutdown
    no longer waits for the others, so process 0 could stop the coordination service while another
    process is still shutting down (that process then aborts).  At exit it runs by itself."""
    if jax.process_count() > 1:
        PeerWatch.finish()
        jax.distributed.shutdown()
        PeerWatch.join()


def _at_exit() -> None:
    """``shutdown`` at the interpreter's exit, unless the program called it (or JAX's) already;
    either way the watch has returned before the interpreter finalises."""
    if _client() is not None:
        shutdown()
    else:
        PeerWatch.join()


def start_devices(workers: int) -> None:
    """Before jax starts its backend, the devices of a command that measures real steps (``cconv
    plan --measure``, ``cconv advise --timing measured``): every process's, through
    ``initialize``, when the launcher started several (``launched_processes``); else ``workers``
    simulated CPU devices in this one (``cconv._startup.configure_devices``)."""
    from cconv._startup import configure_devices

    if launched_processes() > 1:
        initialize()
    else:
        configure_devices(workers)


def _client():
    from jax._src import distributed as _dist  # the live client: jax has no public accessor

    return _dist.global_state.client


class PeerWatch:
    """The liveness thread of one process (module docstring); one per process, class-level."""

    thread: threading.Thread | None = None  # the running watch (None once the end began)
    watcher: threading.Thread | None = None  # the same thread, kept to be joined (``join``)
    ended = threading.Event()  # this process passed the end barrier: every process got there
    departed = threading.Event()  # process 0: every other process has left (shut down its client)
    rounds = 0  # liveness rounds completed with every process alive
    rounds_done = threading.Condition()
    heartbeat = HEARTBEAT_TIMEOUT

    @classmethod
    def start(cls, heartbeat: int) -> None:
        cls.heartbeat, cls.rounds = heartbeat, 0
        cls.ended.clear()
        cls.departed.clear()
        cls.thread = cls.watcher = threading.Thread(target=cls._run, name="cconv-peer-watch", daemon=True)
        cls.thread.start()
        previous = sys.excepthook

        def excepthook(*exc):  # an error of this process, or a collective whose peer died?
            cls.settle()  # a lost peer ends the process here, with the watch's line
            cls.thread = None  # an error of its own: leave without waiting for the others (finish)
            previous(*exc)

        sys.excepthook = excepthook
        atexit.register(_at_exit)

    @classmethod
    def _run(cls) -> None:
        client, n, me = _client(), jax.process_count(), jax.process_index()
        while True:
            try:
                live, why = set(client.get_live_nodes(list(range(n)))), ""
            except Exception as e:  # noqa: BLE001 - the service is gone: process 0 hosts it
                if _client() is None:  # jax.distributed.shutdown() was called directly: the end
                    return
                live, why = None, f"the coordination service on process 0 is unreachable ({type(e).__name__})"
            if cls.ended.is_set():  # every process reached the end barrier
                if me != 0 or live is None or live == {0}:  # process 0: once the others have left
                    cls.departed.set()
                    return
                continue  # a round returns when each live process has called it, or has left
            lost = [0] if live is None else sorted(set(range(n)) - live)
            if lost and me not in lost:
                # at the normal end the others leave (and process 0's service stops) right after
                # the end barrier: not a loss if this process passed it too
                if cls.ended.wait(timeout=2.0):
                    continue
                why = why or f"gone from the coordination service; heartbeat timeout {cls.heartbeat} s"
                cls._exit(lost, n, me, why)
            with cls.rounds_done:
                cls.rounds += 1
                cls.rounds_done.notify_all()
            cls.ended.wait(WATCH_PERIOD)

    @staticmethod
    def _exit(lost: list, n: int, me: int, why: str) -> None:
        names = ", ".join(map(str, lost))
        print(
            f"cconv: lost process {names} of {n} ({why}); process {me} exits ({PEER_LOST_EXIT}): "
            f"start the run again to resume from its last checkpoint",
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        os._exit(PEER_LOST_EXIT)

    @classmethod
    def settle(cls) -> None:
        """Wait for a liveness round that began after now (a lost peer ends the process there)."""
        if cls.thread is None or not cls.thread.is_alive():
            return
        with cls.rounds_done:
            target = cls.rounds + 2
            cls.rounds_done.wait_for(lambda: cls.rounds >= target, timeout=2 * cls.heartbeat + 5)

    @classmethod
    def join(cls, timeout: float | None = None) -> None:
        """Wait for the watch to return (its liveness round ends once the client is shut down).
        A daemon thread still inside JAX's C++ client when the interpreter finalises is ended with
        a forced unwind that the client's C++ swallows: the process aborts ("terminate called after
        throwing an instance of ''", "exception not rethrown"; 1 exit in 12 of a two-process script
        here), after its work, with exit status 134."""
        t = cls.watcher
        if t is not None and t is not threading.current_thread():
            t.join(timeout=cls.heartbeat + 10 if timeout is None else timeout)

    @classmethod
    def finish(cls) -> None:
        """At the end: wait at a barrier for every process (a lost one ends the wait through the
        watch), then let the watch go; process 0, whose coordination service the others need to
        shut down, waits until they have left (a process still shutting down when the service
        stops aborts)."""
        if cls.thread is None:
            return
        cls.thread = None
        _client().wait_at_barrier("cconv_end", END_BARRIER_TIMEOUT * 1000)
        cls.ended.set()
        if jax.process_index() == 0:
            cls.departed.wait(timeout=cls.heartbeat + 10)
