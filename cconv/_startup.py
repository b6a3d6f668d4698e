"""What a command must do before jax starts a backend: ask XLA for simulated CPU devices, keep
library chatter quiet (and off stdout, across processes).  A leaf module (it imports nothing of
cconv), so that the CLI and the commands that register themselves with it (``cconv.doctor``,
``cconv.advisor.cli``) share it without importing each other."""

from __future__ import annotations

import contextlib
import os
import sys

# One process simulates at most this many CPU devices: XLA takes minutes, silently, to start
# tens of thousands (workers=65536 hung for minutes before this bound; 1024 start in seconds).
MAX_SIMULATED_WORKERS = 1024


def configure_devices(workers: int) -> None:
    """Ask XLA for ``workers`` simulated CPU devices (must run before jax initialises a backend).

    More than ``MAX_SIMULATED_WORKERS`` is refused with a ValueError (one process cannot hold
    more devices than that; without the bound, XLA spends minutes creating them)."""
    if workers > MAX_SIMULATED_WORKERS:
        raise ValueError(
            f"workers={workers}: one process runs at most {MAX_SIMULATED_WORKERS} workers (devices); use fewer workers"
        )
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags and workers > 1:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={int(workers)}".strip()
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")


def quiet_libraries() -> None:
    """Keep absl/orbax INFO chatter off the terminal (warnings and errors still show)."""
    import logging

    for name in ("absl", "orbax", "jax._src.xla_bridge"):
        logging.getLogger(name).setLevel(logging.ERROR)


@contextlib.contextmanager
def stdout_to_stderr(on: bool):
    """While ``on``, file descriptor 1 writes to 2: what a library prints from C++ (gloo's "Rank 0
    is connected to 1 peer ranks", across processes) stays out of a command's table and ``--json``."""
    if not on:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
