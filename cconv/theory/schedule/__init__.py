"""Scheduling one training iteration: an event simulator, architectures and schedules.

* ``sim``: a list scheduler for a DAG of tasks on exclusive resources (``Task``, ``simulate``).
* ``arch``: how a message travels (all-to-all ring/tree/hierarchical, PS co-located or BytePS).
* ``schedules``: the iteration DAG under BSP, WFBP, Horovod fusion, MG-WFBP, ByteScheduler.
* ``survey``: the survey's seven lossless methods (``cconv plan --methods survey``).

Derivations: ``theory/planner.md`` ("Scheduling").
"""

from cconv.theory.schedule import arch, schedules, sim
from cconv.theory.schedule.arch import ARCHITECTURES, NETWORK_TOPOLOGIES, AllToAll, ParameterServer
from cconv.theory.schedule.schedules import (
    BSP,
    MGWFBP,
    SCHEDULES,
    WFBP,
    ByteScheduler,
    Fusion,
    LayerCost,
    Message,
    Result,
    layer_costs,
    optimal_merge,
    ready_times,
    run,
)
from cconv.theory.schedule.sim import Event, Task, simulate

__all__ = [
    "arch",
    "schedules",
    "sim",
    "ARCHITECTURES",
    "NETWORK_TOPOLOGIES",
    "AllToAll",
    "ParameterServer",
    "BSP",
    "WFBP",
    "Fusion",
    "MGWFBP",
    "ByteScheduler",
    "SCHEDULES",
    "LayerCost",
    "Message",
    "Result",
    "layer_costs",
    "optimal_merge",
    "ready_times",
    "run",
    "Event",
    "Task",
    "simulate",
]
