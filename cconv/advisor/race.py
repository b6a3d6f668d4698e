"""Racing the candidates at equal time on the target cluster: successive halving by simulated time.

Successive halving (Jamieson & Talwalkar, AISTATS 2016; the rung of Hyperband, Li et al., JMLR
2018, and ASHA, Li et al., MLSys 2020) trains every candidate for a small budget, keeps the best
1/eta, multiplies the budget by eta, and repeats.  Here the budget of a rung is *time on the
target cluster*, not steps: rung r lasts ``T_r = T_0 eta^r`` simulated seconds, and candidate i
trains ``ceil(T_r / step_s_i)`` steps (at most the config's ``max_steps``), with ``step_s_i`` its
seconds per step on the cluster (``cconv.advisor.steptime``).  A candidate whose steps are cheap
(compression that saves traffic) gets more of them in the same time, which is the whole
question.  At each rung the candidates are ordered by

1. reached the target: by time to target (first crossing x step_s), fastest first;
2. not yet: by the gap to the target's metric at the time every one of them has trained
   (``equal_time_score``: each curve read at that time / its own step_s, never before
   ``MIN_STEPS``), smallest first;

diverged candidates (``cconv.experiments.divergence``) drop out, and a candidate is dropped as soon
as the time it has trained passes the best time to target already seen (it cannot win).  Survivors
continue from their checkpoints (``observe`` trains from where a candidate stopped).  A rung's time
is at least ``eta`` times the time every survivor has already trained (the first rung's minimum of
``MIN_STEPS`` can put it past ``T_r``), so every rung trains someone further: a rung never prunes
on what the previous one already showed.  When
``finalists`` are left, they run to the target (or to ``max_steps``) in rungs that keep
doubling, while the budget lasts.  After each halving rung, a pruned candidate whose cheaper step
would still win needing as many steps as the survivors (``revive``:
``cconv.advisor.ranking.leapfrog``) runs on beside them into the next rung, where equal time
decides again: a curve that only starts slowly catches up there, one that stalls is pruned again
(a revived candidate that the budget gives no further step stays pruned).  So its own longer
curve, not its first rung's, decides whether it can be recommended.  What the budget leaves then
goes to the pruned candidates whose curves do not yet give a time to target within the step
budget, and what it still leaves to every pruned candidate (``refine``, as
``cconv.advisor.api.spend_left`` calls it).

Budget: ``budget_steps`` training steps in all, counted in steps of a candidate's program (its
seeds are vmapped into one program; ``cconv.advisor.api`` sets ``budget_steps = B x max_steps``,
B in units of one full dense run).  ``T_0`` is the largest time whose halving rungs fit in
``halving_share`` of the budget under the worst case (the candidates with the most steps survive
longest); what the halving leaves is the finalists'.  The race never trains a step past the
budget: a rung that would is cut to the steps that fit.  A rung's steps are planned before any
trains (``_wants``), so its arms, independent runs, can train side by side (``race``'s ``train``).

We write these lines rather than use Optuna's ``SuccessiveHalvingPruner``: Optuna prunes one
trial at a time against rungs measured in steps it is told, with no notion of a per-candidate
time per step, of candidates whose seeds are one program, or of a global step budget; its
pruner would hold the ordering logic only, which is the five lines of ``order`` below.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from cconv.advisor.extrapolate import Curve, first_crossing
from cconv.advisor.target import Target

ETA, FINALISTS, HALVING_SHARE, MIN_STEPS = 2, 2, 0.5, 8
PRUNED = "pruned"  # the status of an arm a rung left behind (``Standing.status``)


class Arm(NamedTuple):
    """A candidate in the race: its name and seconds per step on the target cluster."""

    name: str
    step_s: float


class Observation(NamedTuple):
    """What training an arm to some step showed: its curve so far and whether it diverged (with
    the divergence rule's reason)."""

    curve: Curve
    steps: int  # steps trained so far
    diverged: str | None = None


class Standing(NamedTuple):
    """An arm after the race: how far it got and why it stopped."""

    arm: Arm
    steps: int
    curve: Curve | None
    status: str  # reached | diverged | pruned | missed (all max_steps, not reached) | finalist (budget ran out)
    reached_at: float = math.nan  # steps to target (first crossing), when reached
    rung: int = 0  # the last rung it ran in
    diverged: str | None = None

    @property
    def time_to_target(self) -> float:
        return self.reached_at * self.arm.step_s


class Rung(NamedTuple):
    time_s: float
    steps: dict  # arm name -> steps trained by the rung's end
    kept: tuple  # arm names that go on
    revived: tuple = ()  # pruned arms that go on beside them (``race``'s ``revive``)


class Race(NamedTuple):
    standings: list
    rungs: list
    spent: int  # training steps spent (program steps)
    budget: int


def rung_counts(n: int, eta: int = ETA, finalists: int = FINALISTS) -> list[int]:
    """Arms in each halving rung: n, ceil(n / eta), ... down to ``finalists`` (at least one rung)."""
    out = [n]
    while out[-1] > finalists:
        out.append(max(finalists, math.ceil(out[-1] / eta)))
    return out


def steps_at(arm: Arm, t: float, max_steps: int, min_steps: int | None = None) -> int:
    return int(min(max_steps, max(min_steps or MIN_STEPS, math.ceil(t / arm.step_s - 1e-9))))


def halving_cost(arms: list[Arm], t0: float, max_steps: int, eta: int = ETA, finalists: int = FINALISTS) -> int:
    """Worst-case steps of the halving rungs started at ``t0``: the arms with the most steps at
    each rung are the ones that survive to it."""
    counts = rung_counts(len(arms), eta, finalists)
    total, prev = 0, {a.name: 0 for a in arms}
    for r, n in enumerate(counts):
        t = t0 * eta**r
        cost = sorted(((steps_at(a, t, max_steps) - prev[a.name], a) for a in arms), key=lambda x: -x[0])[:n]
        for c, a in cost:
            total += c
            prev[a.name] += c
    return total


def first_time(arms: list[Arm], budget: int, max_steps: int, eta: int = ETA, finalists: int = FINALISTS) -> float:
    """The largest T_0 whose worst-case halving cost fits ``budget`` steps (bisection in log T_0)."""
    fastest = min(a.step_s for a in arms)
    lo, hi = fastest * 1e-3, max(a.step_s for a in arms) * max_steps * 2
    if halving_cost(arms, lo, max_steps, eta, finalists) > budget:
        return lo
    return _largest_time(lambda t: halving_cost(arms, t, max_steps, eta, finalists) <= budget, lo, hi)


def _largest_time(fits: Callable[[float], bool], lo: float, hi: float) -> float:
    """The largest time in [lo, hi] that ``fits`` (monotone; ``lo`` fits), by bisection in log time."""
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def gap_score(curve: Curve, target: Target) -> float:
    """Mean log gap of the seed-mean curve over its last two logged points (smaller: closer)."""
    m = np.nanmean(np.asarray(curve.values, np.float64).reshape(-1, len(curve.steps)), 0)
    g = np.maximum(target.gap(m[-2:]), 1e-12)
    return float(np.mean(np.log(g)))


def gap_at(curve: Curve, step: float, target: Target) -> float:
    """Log gap of the seed-mean curve at ``step`` (linear in log gap between logged points; a step
    before the first logged one reads the first)."""
    m = np.nanmean(np.asarray(curve.values, np.float64).reshape(-1, len(curve.steps)), 0)
    g = np.log(np.maximum(target.gap(m), 1e-12))
    return float(np.interp(step, np.asarray(curve.steps, np.float64), g))


def common_time(standings: list[Standing]) -> float:
    """The longest simulated time every running candidate has trained (the equal-time point at
    which a rung compares them)."""
    return min((s.steps * s.arm.step_s for s in standings if s.status == "running"), default=0.0)


def equal_time_score(standings: list[Standing], target: Target):
    """The rung's order key for not-yet-reached candidates: each one's gap at the common time
    (``common_time``), read from its own curve at step common_time / step_s -- the comparison at
    equal time on the target cluster that the race is about -- but never before ``MIN_STEPS``
    (the shortest stretch of a curve that says anything; before it, start-up transients such as
    momentum's S-shaped start decide the order).  Where the first rung's minimum of steps made a
    fast candidate train past the common time, this reads it where the slowest one stands."""
    t = common_time(standings)
    return lambda s: gap_at(s.curve, max(t / s.arm.step_s, MIN_STEPS), target)


def order(standings: list[Standing], target: Target, score=None) -> list[Standing]:
    """Reached (by time to target) before not reached (by ``score``, default the gap at the
    rung's end, ``gap_score``); diverged last."""
    score = score or (lambda s: gap_score(s.curve, target))

    def key(s: Standing):
        if s.status == "diverged":
            return (2, 0.0)
        if s.status == "reached":
            return (0, s.time_to_target)
        return (1, score(s)) if s.curve is not None else (1, math.inf)

    return sorted(standings, key=key)


def _wants(st: dict, alive: list, t: float, max_steps: int, left: int) -> dict:
    """The steps each of ``alive`` trains to in a rung of time ``t``, in order, while ``left``
    budget steps last (a rung never plans a step past the budget); arms with nothing to train
    are left out."""
    wants = {}
    for name in alive:
        s = st[name]
        want = min(steps_at(s.arm, t, max_steps), s.steps + max(left, 0))
        if s.status not in ("reached", "diverged") and want > s.steps:
            wants[name] = want
            left -= want - s.steps
    return wants


def _settle(s: Standing, ob: Observation, target: Target, rung: int) -> tuple[Standing, int]:
    """``s`` after training showed ``ob``: (its new standing, steps spent)."""
    spent = ob.steps - s.steps
    if ob.diverged is not None:
        return s._replace(steps=ob.steps, curve=ob.curve, status="diverged", rung=rung, diverged=ob.diverged), spent
    mean = np.nanmean(np.asarray(ob.curve.values, np.float64).reshape(-1, len(ob.curve.steps)), 0)
    hit = first_crossing(ob.curve.steps, mean, target)
    if hit is not None:
        return s._replace(steps=ob.steps, curve=ob.curve, status="reached", reached_at=hit[0], rung=rung), spent
    return s._replace(steps=ob.steps, curve=ob.curve, status="running", rung=rung), spent


def one_by_one(observe: Callable[[str, int], Observation], wants: dict) -> list[Observation]:
    """Train a rung's arms one after the other (``race``'s default ``train``)."""
    return [observe(name, steps) for name, steps in wants.items()]


def _best_time(standings: list[Standing]) -> float:
    return min((s.time_to_target for s in standings if s.status == "reached"), default=math.inf)


def race(
    arms: list[Arm],
    observe: Callable[[str, int], Observation],
    target: Target,
    max_steps: int,
    budget: int,
    eta: int = ETA,
    finalists: int = FINALISTS,
    halving_share: float = HALVING_SHARE,
    score=None,
    train: Callable[[Callable, dict], list] = one_by_one,
    revive: Callable[[list], list] | None = None,
) -> Race:
    """Successive halving by simulated time, then the finalists to the target (module docstring).
    ``train(observe, {name: steps})``: the rung's observations, in its order; the arms of a rung
    are independent, so it may train them side by side (``cconv.advisor.api`` does).
    ``revive(standings)``: after each halving rung, the names of pruned arms that run on beside
    its survivors (``cconv.advisor.api.revived``; after the last one, beside the finalists)."""
    st = {a.name: Standing(a, 0, None, "unrun") for a in arms}
    counts = rung_counts(len(arms), eta, finalists)
    t0 = first_time(arms, int(budget * halving_share), max_steps, eta, finalists)
    spent, rungs, alive, revived_at = 0, [], [a.name for a in arms], {}
    r, t = 0, t0
    while alive:
        wants = _wants(st, alive, t, max_steps, budget - spent)
        for name, ob in zip(wants, train(observe, wants)):
            st[name], used = _settle(st[name], ob, target, r)
            spent += used
        best = _best_time(list(st.values()))
        for n in alive:
            if st[n].status == "running" and st[n].steps >= max_steps:
                st[n] = st[n]._replace(status="missed")  # the whole step budget, target not reached
        running = [n for n in alive if st[n].status == "running" and st[n].steps * st[n].arm.step_s < best]
        keep_n = counts[r + 1] if r + 1 < len(counts) else finalists
        live = [st[n] for n in running]
        kept = [s.arm.name for s in order(live, target, score or equal_time_score(live, target))][:keep_n]
        for n in alive:
            if st[n].status == "running" and n not in kept:
                st[n] = st[n]._replace(status=PRUNED)
        back = []
        if revive is not None and r + 2 <= len(counts) and spent < budget:  # a halving rung's pruned arms
            back = [n for n in revive(list(st.values())) if st[n].status == PRUNED]
            for n in back:
                st[n] = st[n]._replace(status="running")
                revived_at[n] = st[n].steps
            finalists += len(back) if r + 2 == len(counts) else 0  # the halving's last rung: they join the finalists
        rungs.append(Rung(t, {n: st[n].steps for n in alive}, tuple(kept), tuple(back)))
        alive = kept + back
        if spent >= budget:
            break
        r, t = r + 1, max(t, common_time([st[n] for n in alive])) * eta  # every rung trains someone further
    for n in alive:  # still running when the budget ran out (a revived arm that trained no further: pruned)
        st[n] = st[n]._replace(status=PRUNED if revived_at.get(n) == st[n].steps else "finalist")
    return Race(list(st.values()), rungs, spent, budget)


def refine_time(standings: list[Standing], left: int, max_steps: int) -> float:
    """The longest simulated time that ``standings`` can all train to (each at its own time per
    step, never back) within ``left`` more steps in all (bisection in log time)."""

    def cost(t: float) -> int:
        return sum(max(0, steps_at(s.arm, t, max_steps) - s.steps) for s in standings)

    lo, hi = min(s.steps * s.arm.step_s for s in standings), max(s.arm.step_s for s in standings) * max_steps
    if cost(hi) <= left:
        return hi
    return _largest_time(lambda t: cost(t) <= left, lo, hi)


def refine(
    result: Race,
    names,
    observe: Callable[[str, int], Observation],
    target: Target,
    max_steps: int,
    train: Callable[[Callable, dict], list] = one_by_one,
) -> Race:
    """What the race left of its budget, spent on the pruned arms ``names`` (``api.spend_left``:
    first those whose time to target their curves cannot tell yet, then every one): they train on to an
    equal simulated time again, the longest that fits (``refine_time``), so their times to target
    are read from longer curves or seen.  They stay pruned unless they reach the target, diverge
    or run out of steps; a rung with nothing kept records it.  Never past the budget."""
    st = {s.arm.name: s for s in result.standings}
    arms = [st[n] for n in names if n in st and st[n].status == PRUNED]
    left = result.budget - result.spent
    if not arms or left <= 0:
        return result
    t = refine_time(arms, left, max_steps)
    wants = {s.arm.name: w for s in arms if (w := steps_at(s.arm, t, max_steps)) > s.steps}
    if not wants:
        return result
    spent = result.spent
    for name, ob in zip(wants, train(observe, wants)):
        st[name], used = _settle(st[name], ob, target, len(result.rungs))
        spent += used
        if st[name].status == "running":
            st[name] = st[name]._replace(status="missed" if st[name].steps >= max_steps else PRUNED)
    rung = Rung(t, {n: st[n].steps for n in wants}, ())
    return Race([st[s.arm.name] for s in result.standings], [*result.rungs, rung], spent, result.budget)
