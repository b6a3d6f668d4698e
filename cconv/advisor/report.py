"""Ranking and output: the table, the recommendation line, the JSON.

A row is one probed candidate under one communication schedule.  Rows whose prediction is
``ok`` (``cconv.advisor.extrapolate``) are ranked by predicted time to the target,

    time = steps to target x seconds per step on the cluster  (interval: [lo, hi] x the same),

fastest first; the others (diverged, stalled, not approached, noisy) are listed after them with
the reason and no rank.  ``speedup`` is the dense baseline's predicted time over the row's (the
dense candidate under the first sync mode and architecture, same schedule).  Risk flags:

    wide         the interval spans more than a factor 3
    over-budget  the interval's upper end exceeds the config's step budget
    far          the prediction extrapolates more than 5x past the probe
    tied         the best row's interval overlaps this row's (not separable by the probes)
"""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

from cconv.advisor.extrapolate import Prediction
from cconv.advisor.timing import StepTime

WIDE, FAR = 3.0, 5.0


class Row(NamedTuple):
    candidate: str
    overrides: dict
    schedule: str
    prediction: Prediction
    step: StepTime
    bytes_per_step: float
    final_metric: float  # the fitted curve's metric at the full step budget
    time_s: float = math.nan
    time_lo: float = math.nan
    time_hi: float = math.nan
    speedup: float = math.nan
    flags: tuple = ()
    rank: int | None = None


def _times(r: Row) -> Row:
    p, s = r.prediction, r.step.step_s
    return r._replace(time_s=p.steps * s, time_lo=p.lo * s, time_hi=p.hi * s) if p.ok else r


def rank(rows: list[Row], budget: int, baseline: str = "none") -> list[Row]:
    """Rows with times, speedups, flags and ranks; ranked rows first (fastest first).  ``baseline``:
    the dense candidate's name (dense under the first sync mode and architecture)."""
    rows = [_times(r) for r in rows]
    dense = {r.schedule: r for r in rows if r.candidate == baseline}
    ok = sorted((r for r in rows if r.prediction.ok), key=lambda r: r.time_s)
    best = ok[0] if ok else None
    out = []
    for i, r in enumerate(ok):
        p, flags = r.prediction, []
        if p.hi / max(p.lo, 1e-12) > WIDE:
            flags.append("wide")
        if p.hi > budget:
            flags.append("over-budget")
        if p.extrapolation > FAR:
            flags.append("far")
        if i > 0 and r.time_lo <= best.time_hi:
            flags.append("tied")
        d = dense.get(r.schedule)
        sp = d.time_s / r.time_s if d is not None and d.prediction.ok else math.nan
        out.append(r._replace(speedup=sp, flags=tuple(flags), rank=i + 1))
    return out + [r for r in rows if not r.prediction.ok]


def _fmt_t(x: float) -> str:
    if not math.isfinite(x):
        return "-"
    for unit, f in (("h", 3600), ("min", 60), ("s", 1), ("ms", 1e-3)):
        if x >= f:
            return f"{x / f:.3g} {unit}"
    return f"{x * 1e6:.4g} us"


def _fmt_b(x: float) -> str:
    if not math.isfinite(x):
        return "-"
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= f:
            return f"{x / f:.3g} {unit}"
    return f"{x:.0f} B"


def table(rows: list[Row], multi_schedule: bool) -> str:
    """The ranked table (plain text, one row per line)."""
    head = ["#", "candidate"] + (["schedule"] if multi_schedule else [])
    head += ["steps [interval]", "s/step", "time to target [interval]", "speedup", "bytes/step", "flags"]
    body = []
    for r in rows:
        p = r.prediction
        if p.ok:
            steps = f"{p.steps:.0f} [{p.lo:.0f}, {p.hi:.0f}]"
            tt = f"{_fmt_t(r.time_s)} [{_fmt_t(r.time_lo)}, {_fmt_t(r.time_hi)}]"
            sp = f"{r.speedup:.2f}x" if math.isfinite(r.speedup) else "-"
            flags = ",".join(r.flags) or ""
        else:
            steps, tt, sp, flags = "-", "-", "-", f"{p.status}: {p.reason}"
        cells = [str(r.rank) if r.rank else "-", r.candidate] + ([r.schedule] if multi_schedule else [])
        cells += [steps, _fmt_t(r.step.step_s), tt, sp, _fmt_b(r.bytes_per_step), flags]
        body.append(cells)
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head) - 1)]
    lines = []
    for cells in [head, *body]:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + "  " + cells[-1])
    return "\n".join(line.rstrip() for line in lines)


def recommendation(rows: list[Row], target: str, cluster: str, baseline: str = "none") -> tuple[bool, str]:
    """(supported, one line): the fastest ranked row, or why the probes support no ranking."""
    ok = [r for r in rows if r.rank]
    if not ok:
        counts: dict[str, int] = {}
        for r in rows:
            counts[r.prediction.status] = counts.get(r.prediction.status, 0) + 1
        dense = next((r for r in rows if r.candidate == baseline), None)
        why = f"; dense: {dense.prediction.reason}" if dense is not None else ""
        what = ", ".join(f"{n} {k}" for k, n in counts.items())
        return False, f"No recommendation: the probes support no prediction of {target} ({what}){why}."
    b = ok[0]
    sp = f", {b.speedup:.2f}x dense" if math.isfinite(b.speedup) else ", dense not predictable"
    tied = [r.candidate for r in ok[1:] if "tied" in r.flags]
    tie = f"; not separable from {', '.join(tied[:3])}{' ...' if len(tied) > 3 else ''}" if tied else ""
    sched = f" ({b.schedule})"
    return True, (
        f"Recommended: {b.candidate}{sched}: {target} in {_fmt_t(b.time_s)} "
        f"[{_fmt_t(b.time_lo)}, {_fmt_t(b.time_hi)}] on {cluster}{sp}{tie}."
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
