"""SIGTERM and SIGINT during training: finish the step, checkpoint, stop (exit 143 / 130).

Schedulers such as SLURM send SIGTERM some seconds before they kill a job (``--signal``,
``KillWait``); Ctrl-C sends SIGINT.  Inside ``deferred()`` (``runner.execute`` and
``sweep.run_sweep`` enter it) the first such signal only records its number; the training loop
asks ``pending()`` after every step it dispatches, and when one is pending it waits for the steps
in flight, writes the metric lines due, saves a checkpoint at that step, marks the run's summary
``interrupted`` and raises ``Interrupted``.  The CLI turns that into exit ``128 + signal``, as a
shell reports a process killed by the signal: 143 for SIGTERM, 130 for SIGINT.  The same command
run again resumes from that checkpoint (``cconv.experiments.runner``'s protocol): nothing is lost
or repeated.

A second signal while the first is being handled raises ``Interrupted`` at once (an impatient
second Ctrl-C, or a scheduler's repeated SIGTERM): the run stops where it is, as after a SIGKILL,
and resumes from its previous checkpoint.  The original handlers are back when ``deferred()`` ends;
a signal that arrived after the run had nothing left to train is dropped (the work it asked to
stop has ended).  Outside the main thread (where Python cannot install handlers) ``deferred()``
changes nothing.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Callable, Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)

_state = {"depth": 0, "received": None}


class Interrupted(KeyboardInterrupt):
    """Training stopped on a signal: a KeyboardInterrupt (the user's or the scheduler's will, no
    failure to record; ``except Exception`` lets it through).  ``step``: the step the run was
    checkpointed at, None when it stopped without a new checkpoint (a second signal, or between
    two runs of a sweep); ``exit_code``: ``128 + signum``."""

    def __init__(self, signum: int, step: int | None = None):
        self.signum, self.step = signum, step
        super().__init__(f"{signal.Signals(signum).name} at step {step}")

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _handler(signum: int, frame) -> None:
    if _state["received"] is not None:  # the second signal: stop now
        raise Interrupted(signum)
    _state["received"] = signum


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Record SIGTERM/SIGINT instead of dying (module docstring); nested uses share the outer one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outer = _state["depth"] == 0
    previous = {s: signal.signal(s, _handler) for s in SIGNALS} if outer else {}
    _state["depth"] += 1
    try:
        yield
    finally:
        _state["depth"] -= 1
        if outer:
            for s, h in previous.items():
                signal.signal(s, h)
            _state["received"] = None


def deferring(fn: Callable) -> Callable:
    """``fn`` run inside ``deferred()``."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with deferred():
            return fn(*args, **kwargs)

    return wrapped


def pending() -> int | None:
    """The number of the signal received inside ``deferred()``, or None."""
    return _state["received"]


def check(step: int | None = None) -> None:
    """Raise ``Interrupted`` when a signal is pending (between runs of a sweep, say)."""
    if _state["received"] is not None:
        raise Interrupted(_state["received"], step)
