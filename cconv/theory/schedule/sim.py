"""A discrete-event list scheduler for a DAG of tasks on exclusive resources.

Every ``Task`` runs on one ``resource`` (the compute stream, a communication channel, the push or
pull direction of a link), takes ``duration`` seconds, and may start once

* every task in ``deps`` has ended,
* its ``release`` time has passed (Horovod's cycle ticks),
* its resource is idle (one task at a time per resource, no preemption), and
* a token of its ``acquire`` pool is free (ByteScheduler's credit: a pool of ``capacity``
  tokens; the token comes back when the task named by the pool's owner ends, see ``Task.frees``).

Among the tasks ready on an idle resource the one with the smallest ``(priority, ready time,
position in the list)`` starts (list scheduling; Graham 1969).  The result is the list of
``Event(task, start, end)``; ``makespan`` is the last end.  The simulator knows nothing about
layers or networks: ``cconv.theory.schedule.schedules`` builds the DAG of one training
iteration (forward, backward, communication, optional compress/decompress per layer) and reads
iteration time and exposed communication off the events.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple


class Task(NamedTuple):
    """One operation of the DAG.

    ``kind``/``layer``/``iteration`` are labels for reading the events (``"forward"``,
    ``"backward"``, ``"comm"``, ``"compress"``, ``"decompress"``, ``"mark"``); the simulator only
    uses ``name``, ``resource``, ``duration``, ``deps``, ``priority``, ``release``, ``acquire``,
    ``frees``.
    """

    name: str
    resource: str
    duration: float
    deps: tuple[str, ...] = ()
    priority: float = 0.0  # smaller starts first among ready tasks on the same resource
    release: float = 0.0  # earliest start (seconds)
    acquire: str = ""  # pool a token is taken from when the task starts ("" = none)
    frees: str = ""  # pool a token is returned to when the task ends ("" = none)
    kind: str = "compute"
    layer: int = -1
    iteration: int = 0


class Event(NamedTuple):
    task: Task
    start: float
    end: float


def _check(tasks: Sequence[Task], pools: Mapping[str, int]) -> dict[str, int]:
    index: dict[str, int] = {}
    for i, t in enumerate(tasks):
        if not isinstance(t, Task):
            raise ValueError(f"expected a Task, got {type(t).__name__}")
        if t.name in index:
            raise ValueError(f"duplicate task name {t.name!r}")
        for what, v in (("duration", t.duration), ("release", t.release)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"task {t.name!r}: {what} must be a finite number >= 0, got {v!r}")
        index[t.name] = i
    for t in tasks:
        missing = [d for d in t.deps if d not in index]
        if missing:
            raise ValueError(f"task {t.name!r} depends on unknown task(s) {', '.join(missing)}")
        for p in (t.acquire, t.frees):
            if p and p not in pools:
                raise ValueError(f"task {t.name!r}: unknown pool {p!r}")
    for p, c in pools.items():
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise ValueError(f"pool {p!r}: capacity must be an integer >= 1, got {c!r}")
    return index


@dataclasses.dataclass
class _Run:
    """The simulator's state: per resource a heap of ready tasks (priority, ready time, index), the
    tasks waiting for their release time, the busy resources, the pools' free tokens, the running
    tasks (end, index), start times and finished events."""

    tasks: Sequence[Task]
    waiting: list[int]  # unfinished dependencies per task
    children: list[list[int]]
    tokens: dict[str, int]
    ready: dict[str, list[tuple[float, float, int]]] = dataclasses.field(default_factory=dict)
    released: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    busy: set[str] = dataclasses.field(default_factory=set)
    running: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    starts: dict[int, float] = dataclasses.field(default_factory=dict)
    events: list[Event] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, tasks: Sequence[Task], index: dict[str, int], pools: dict[str, int]) -> _Run:
        children: list[list[int]] = [[] for _ in tasks]
        for i, t in enumerate(tasks):
            for d in set(t.deps):
                children[index[d]].append(i)
        run = cls(tasks, [len(set(t.deps)) for t in tasks], children, dict(pools))
        for i, w in enumerate(run.waiting):
            if w == 0:
                run.make_ready(i, 0.0)
        return run

    def make_ready(self, i: int, t: float) -> None:
        """Task i's dependencies are done at ``t``: ready now, or at its release time."""
        task = self.tasks[i]
        if task.release > t:
            heapq.heappush(self.released, (task.release, i))
        else:
            heapq.heappush(self.ready.setdefault(task.resource, []), (task.priority, t, i))

    def release_due(self, now: float) -> None:
        while self.released and self.released[0][0] <= now:
            r, i = heapq.heappop(self.released)
            heapq.heappush(self.ready.setdefault(self.tasks[i].resource, []), (self.tasks[i].priority, r, i))

    def start_ready(self, now: float) -> None:
        """On every idle resource, start the first ready task whose pool has a token."""
        for res, heap in self.ready.items():
            if res in self.busy or not heap:
                continue
            blocked = []
            while heap:
                item = heapq.heappop(heap)
                pool = self.tasks[item[2]].acquire
                if pool and self.tokens[pool] == 0:
                    blocked.append(item)
                    continue
                if pool:
                    self.tokens[pool] -= 1
                i = item[2]
                self.busy.add(res)
                self.starts[i] = now
                heapq.heappush(self.running, (now + self.tasks[i].duration, i))
                break
            for item in blocked:
                heapq.heappush(heap, item)

    def finish(self, now: float) -> None:
        """End the tasks running until ``now``: free their resources and tokens, ready their children."""
        while self.running and self.running[0][0] <= now:
            end, i = heapq.heappop(self.running)
            task = self.tasks[i]
            self.busy.discard(task.resource)
            if task.frees:
                self.tokens[task.frees] += 1
            self.events.append(Event(task, self.starts[i], end))
            for c in self.children[i]:
                self.waiting[c] -= 1
                if self.waiting[c] == 0:
                    self.make_ready(c, end)


def simulate(tasks: Sequence[Task], pools: Mapping[str, int] | None = None) -> list[Event]:
    """Run the DAG; the events in start order.  Raises ValueError on a cycle or a deadlock."""
    pools = dict(pools or {})
    index = _check(tasks, pools)
    run = _Run.of(tasks, index, pools)
    now = 0.0
    while True:
        run.release_due(now)
        run.start_ready(now)
        if not run.running:
            if run.released:
                now = run.released[0][0]
                continue
            break
        now = run.running[0][0]
        run.finish(now)
    if len(run.events) != len(tasks):
        stuck = [tasks[i].name for i in range(len(tasks)) if i not in run.starts][:5]
        raise ValueError(f"the task graph has a cycle or a deadlock; never started: {', '.join(stuck)}")
    return sorted(run.events, key=lambda e: (e.start, e.end, index[e.task.name]))


def makespan(events: Sequence[Event]) -> float:
    """When the last task ends (0 for no events)."""
    return max((e.end for e in events), default=0.0)


def busy_time(events: Sequence[Event], resource: str) -> float:
    """Seconds ``resource`` is busy."""
    return sum(e.end - e.start for e in events if e.task.resource == resource)


__all__ = ["Task", "Event", "simulate", "makespan", "busy_time"]
