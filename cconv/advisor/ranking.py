"""Ranking and output: the table, the recommendation line, the JSON.

A row is one raced candidate under one communication schedule.  Its steps to target are
*observed* (the race ran it to the target: the first crossing, between two logged steps) or
*predicted* from its curve so far (``cconv.advisor.extrapolate``, with an interval), and

    time = steps to target x seconds per step on the cluster  (interval: [lo, hi] x the same).

Rows whose steps to target are known or predicted within the config's step budget are ranked by
the time the advisor can vouch for (``seen_time``): an observed row's time, a predicted row's
interval's slow end.  The recommendation is the first ranked row that the race's verdict allows
(``pick``): a row the race did not prune.  The race compared the candidates' curves at equal
time and pruned the others; extrapolating a short curve does not overrule that (learning-curve
extrapolation prunes, it is not the verdict: Domhan et al. 2015; Hyperband's survivors are its
answer).  A cheaper step, which the cluster model gives and no curve does, can: a pruned row
whose advantage over the fastest kept row holds on its step time alone -- faster even needing as
many steps as the kept row that needs the most (``leapfrog``; seen steps: observed, or the
interval's slow end) -- is run on by the race beside the survivors (``cconv.advisor.api.revived``)
and is recommended only from that longer curve, as a survivor.  Recommending it from its first
rung's curve chose a candidate that never reached the target (the Adam task of the validation,
on two communication-bound clusters).  When every ranked row was pruned, the first is recommended.  Rows that
cannot be ranked follow the ranked ones, with the reason: diverged
(``cconv.experiments.divergence``), missed (ran the whole step budget without reaching the
target), misses the budget (predicted past it), stalled, not approached, noisy.
``speedup`` is the dense baseline's time over the row's (same schedule), with its interval
(``speedup_lo``: dense's fast end over the row's slow end; ``speedup_hi`` the other way) where
either time is predicted: a prediction from a short curve can claim a speedup its interval does
not vouch for, and the recommendation line prints both.  ``why`` says where the
row's step time goes (``steptime.StepTime``): compute-, communication- or compression-bound, with the share.  Flags:

    observed     the race saw this candidate reach the target (no extrapolation)
    wide         the interval spans more than a factor 3
    tied         this row's interval holds the recommended row's time (not separable by the race)
    pruned       the race pruned it at equal time on the cluster: ranked from its curve, never
                 recommended over a candidate that outlasted it (``pick``)
    lr-change    the learning-rate schedule moves by ``LR_CHANGE`` or more between the curve's end and
                 its prediction's slow end (``lr_factor``: a step decay, a warm-up or a decay the
                 curve has not reached, so no fit of it can see its effect)
"""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

from cconv.advisor.extrapolate import Prediction
from cconv.advisor.race import PRUNED
from cconv.advisor.steptime import StepTime

WIDE = 3.0
LR_CHANGE = 2.0  # the ``lr-change`` flag: the learning rate moves by this factor past the curve


class Row(NamedTuple):
    candidate: str
    overrides: dict
    schedule: str
    prediction: Prediction
    step: StepTime
    bytes_per_step: float
    final_metric: float  # the metric at the full step budget (observed, or the fitted curve's)
    race: str = ""  # how the race left it: reached, pruned, finalist, missed, diverged
    lr_factor: float = 1.0  # how far the learning rate moves past the curve's end (``api.lr_factor``)
    steps_trained: int = 0
    time_s: float = math.nan
    time_lo: float = math.nan
    time_hi: float = math.nan
    speedup: float = math.nan
    speedup_lo: float = math.nan  # dense's fast end / this row's slow end (where either is predicted)
    speedup_hi: float = math.nan  # dense's slow end / this row's fast end
    why: str = ""
    flags: tuple = ()
    rank: int | None = None
    recommended: bool = False


def bound_by(st: StepTime) -> str:
    """Which part dominates a step: ``compute-bound (62 %)`` etc. (the parts without overlap)."""
    parts = {"compute": st.compute_s, "communication": st.comm_s, "compression": st.compress_s}
    total = sum(parts.values())
    if not total > 0:
        return ""
    name, x = max(parts.items(), key=lambda kv: kv[1])
    return f"{name}-bound ({100 * x / total:.0f} %)"


def _times(r: Row) -> Row:
    p, s = r.prediction, r.step.step_s
    r = r._replace(why=bound_by(r.step))
    return r._replace(time_s=p.steps * s, time_lo=p.lo * s, time_hi=p.hi * s) if p.ok else r


def seen_time(r: Row) -> float:
    """The time the advisor can vouch for: an observed row's time, a predicted row's interval's
    slow end (so a prediction ranks above what the race saw only when even its pessimistic end is
    faster; on the tuning tasks of the validation, ranking pruned candidates by their point
    predictions from short curves cost a 1.4-1.9x regret)."""
    return r.time_s if r.prediction.observed else r.time_hi


def seen_steps(p: Prediction) -> float:
    """The steps the advisor can vouch for (as ``seen_time``): observed, or the interval's slow end."""
    return p.steps if p.observed else p.hi


def _order(seen: list, pruned: list) -> tuple[list, list]:
    """(the ranked rows' indices, fastest seen first; those of them the race did not prune)."""
    order = sorted((i for i in range(len(seen)) if math.isfinite(seen[i])), key=lambda i: seen[i])
    return order, [i for i in order if not pruned[i]]


def pick(seen: list, pruned: list) -> int | None:
    """The index of the recommendation among rows given by their seen times (``seen_time``; not
    finite: not ranked) and whether the race pruned them: the fastest row the race did not prune,
    or the fastest row when it pruned every ranked one.  None when nothing is ranked."""
    order, kept = _order(seen, pruned)
    return kept[0] if kept else (order[0] if order else None)


def leapfrog(seen: list, steps: list, step_s: list, pruned: list) -> int | None:
    """The pruned row whose advantage over the fastest row the race kept holds on its step time
    alone: faster even needing as many steps as the kept row that needs the most (``steps``: seen
    steps, observed or the interval's slow end); the fastest such row, or None.  The race runs it
    on with its finalists (``cconv.advisor.api.revived``), which is how such a row can become the
    recommendation: from its own longer curve, never from its short one (module docstring)."""
    order, kept = _order(seen, pruned)
    if not kept:
        return None
    need, best = max(steps[i] for i in kept), seen[kept[0]]
    ahead = order[: order.index(kept[0])]  # all pruned: seen faster than the fastest kept row
    return next((i for i in ahead if max(steps[i], need) * step_s[i] < best), None)


def speedup_bounds(dense_lo: float, dense_hi: float, lo: float, hi: float) -> tuple[float, float]:
    """A speedup's interval over dense from the two times' intervals: dense's fast end over the
    row's slow end, dense's slow end over the row's fast end."""
    return dense_lo / hi, (dense_hi / lo if lo > 0 else math.inf)


def _recommended(ok: list[Row]) -> Row | None:
    i = pick([seen_time(r) for r in ok], [r.race == PRUNED for r in ok])
    return None if i is None else ok[i]


def in_budget(r: Row, budget: int) -> bool:
    return r.prediction.ok and r.prediction.steps <= budget


def rank(rows: list[Row], budget: int, baseline: str = "dense") -> list[Row]:
    """Rows with times, speedups, flags and ranks; ranked rows first (fastest first).  ``budget``:
    the config's steps; ``baseline``: the dense candidate's name."""
    rows = [_times(r) for r in rows]
    dense = {r.schedule: r for r in rows if r.candidate == baseline}
    ok = sorted((r for r in rows if in_budget(r, budget)), key=seen_time)
    best = _recommended(ok)
    out = []
    for i, r in enumerate(ok):
        p, flags = r.prediction, []
        if p.observed:
            flags.append("observed")
        if p.hi / max(p.lo, 1e-12) > WIDE:
            flags.append("wide")
        if r is not best and r.time_lo <= seen_time(best) <= r.time_hi:
            flags.append("tied")
        if r.race == PRUNED:
            flags.append("pruned")  # the flag's name, the race's status
        if not p.observed and r.lr_factor >= LR_CHANGE:
            flags.append("lr-change")
        d = dense.get(r.schedule)
        sp = d.time_s / r.time_s if d is not None and in_budget(d, budget) else math.nan
        lo = hi = math.nan
        if math.isfinite(sp) and r is not d and not (p.observed and d.prediction.observed):
            lo, hi = speedup_bounds(d.time_lo, d.time_hi, r.time_lo, r.time_hi)
        out.append(
            r._replace(speedup=sp, speedup_lo=lo, speedup_hi=hi, flags=tuple(flags), rank=i + 1, recommended=r is best)
        )
    return out + [r for r in rows if not in_budget(r, budget)]


def fmt_time(x: float) -> str:
    """Seconds in the unit that reads best: ``2.5 ms``, ``340 us``, ``1.2 min``."""
    if not math.isfinite(x):
        return "-"
    for unit, f in (("h", 3600), ("min", 60), ("s", 1), ("ms", 1e-3)):
        if x >= f * (1 - 1e-9):  # a tick at 1e-3 computed as 0.000999... is 1 ms
            return f"{x / f:.3g} {unit}"
    return f"{x * 1e6:.4g} us"


def _fmt_b(x: float) -> str:
    if not math.isfinite(x):
        return "-"
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= f:
            return f"{x / f:.3g} {unit}"
    return f"{x:.0f} B"


def _unranked(r: Row, budget: int) -> str:
    p = r.prediction
    if p.ok:
        return f"misses the budget: ~{p.steps:.0f} steps [{p.lo:.0f}, {p.hi:.0f}] > {budget}"
    return f"{p.status}: {p.reason}"


def table(rows: list[Row], multi_schedule: bool, budget: int) -> str:
    """The ranked table (plain text, one row per line)."""
    head = ["#", "candidate"] + (["schedule"] if multi_schedule else [])
    measured = any(math.isfinite(r.step.measured_s) for r in rows)  # then the model beside it
    per_step = ["measured s/step", "modelled s/step"] if measured else ["s/step"]
    head += ["steps to target", *per_step, "time to target", "speedup", "bytes/step", "why", "flags"]
    body = []
    for r in rows:
        p = r.prediction
        if r.rank:
            steps = f"{p.steps:.0f}" + ("" if p.observed else f" [{p.lo:.0f}, {p.hi:.0f}]")
            tt = fmt_time(r.time_s) + ("" if p.observed else f" [{fmt_time(r.time_lo)}, {fmt_time(r.time_hi)}]")
            sp = f"{r.speedup:.2f}x" if math.isfinite(r.speedup) else "-"
            flags = ",".join(r.flags)
        else:
            steps, tt, sp, flags = "-", "-", "-", _unranked(r, budget)
        cells = [str(r.rank) if r.rank else "-", r.candidate] + ([r.schedule] if multi_schedule else [])
        cells += [steps, fmt_time(r.step.step_s), *([fmt_time(r.step.modelled_s)] if measured else [])]
        cells += [tt, sp, _fmt_b(r.bytes_per_step), r.why, flags]
        body.append(cells)
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head) - 1)]
    lines = []
    for cells in [head, *body]:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + "  " + cells[-1])
    return "\n".join(line.rstrip() for line in lines)


def _no_recommendation(rows: list[Row], target: str, budget: int) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        k = "misses the budget" if r.prediction.ok else r.prediction.status
        counts[k] = counts.get(k, 0) + 1
    what = ", ".join(f"{n} {k}" for k, n in counts.items())
    over = sorted((r for r in rows if r.prediction.ok), key=lambda r: r.prediction.steps)
    need = (
        f" The nearest, {over[0].candidate}, is predicted at ~{over[0].prediction.steps:.0f} steps "
        f"[{over[0].prediction.lo:.0f}, {over[0].prediction.hi:.0f}]: a step budget of "
        f"{math.ceil(over[0].prediction.hi)} would reach it."
        if over
        else ""
    )
    return f"No recommendation: no candidate reaches {target} within {budget} steps ({what}).{need}"


def recommendation(rows: list[Row], target: str, cluster: str, budget: int) -> tuple[bool, str]:
    """(supported, one line): the recommended row (``rank``, ``pick``), with the pruned rows
    ranked above it, or why none can be recommended (and the step budget that would reach the
    target, when a candidate is predicted past it)."""
    ok = [r for r in rows if r.rank]
    if not ok:
        return False, _no_recommendation(rows, target, budget)
    b = next(r for r in ok if r.recommended)
    if b.prediction.observed and b.prediction.lo == 0.0:  # reached at its first logged step
        return False, (
            f"No recommendation: {b.candidate} meets {target} at its first logged step ({b.prediction.steps:.0f}): "
            "the target does not separate the candidates (their order would be step time alone); "
            "choose a harder target."
        )
    sp = f", {b.speedup:.2f}x dense" if math.isfinite(b.speedup) else ""
    if sp and math.isfinite(b.speedup_lo):  # a prediction on either side: the speedup's interval too
        sp += f" [{b.speedup_lo:.2f}x, {b.speedup_hi:.3g}x]"
    seen = "observed" if b.prediction.observed else f"predicted [{fmt_time(b.time_lo)}, {fmt_time(b.time_hi)}]"
    tied = [r.candidate for r in ok if "tied" in r.flags]
    more = f" and {len(tied) - 3} more" if len(tied) > 3 else ""
    tie = f"; not separable from {', '.join(tied[:3])}{more}" if tied else ""
    why = f"; {b.why}" if b.why else ""
    above = list(dict.fromkeys(r.candidate for r in ok[: b.rank - 1] if r.candidate != b.candidate))
    over = ""
    if above:  # --verify trains the top N candidates on (``api.verify``): these and the recommendation
        over = (
            f"; ranked above it from their curves, pruned by the race: {', '.join(above)} "
            f"(--verify {len(above) + 1} trains them and it to the step budget)"
        )
    return True, (
        f"Recommended: {b.candidate} ({b.schedule}): {target} in {fmt_time(b.time_s)} on {cluster} "
        f"({b.prediction.steps:.0f} steps, {seen}){sp}{why}{tie}{over}."
    )


def to_jsonable(x: Any) -> Any:
    """NamedTuples -> dicts, non-finite floats -> None (strict JSON)."""
    if hasattr(x, "_asdict"):
        return {k: to_jsonable(v) for k, v in x._asdict().items()}
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def dumps(obj: Any) -> str:
    return json.dumps(to_jsonable(obj), indent=1, allow_nan=False)
