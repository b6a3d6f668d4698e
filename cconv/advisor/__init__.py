"""``cconv advise``: which compression method, synchronization and schedule reaches a target
soonest on a given cluster, predicted from short probes of the user's own task and the systems
simulator, with intervals, and checked against full runs (``--verify``, ``studies/advise``).

Modules, one concept each: ``target`` (METRIC=VALUE), ``space`` (the candidates), ``probes``
(short runs through the runner), ``race`` (successive halving by simulated time), ``curves``
(the learning-curve families), ``extrapolate`` (steps to target from a curve), ``steptime``
(seconds per step on the cluster, modelled or measured), ``plan_measure`` (``cconv plan
--measure``), ``ranking`` (rows, table, JSON), ``figure``, ``api`` (``advise``), ``cli`` (the
sub-command).
"""

from cconv.advisor.api import Advice, VerifyRow, advise

__all__ = ["advise", "Advice", "VerifyRow"]
