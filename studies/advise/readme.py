"""The README's table of the advisor's validation, made from ``results.json`` (so the README
cannot drift from the committed results; ``tests/test_docs.py`` checks it).

    python studies/advise/readme.py          # prints the table
"""

from __future__ import annotations

import json
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def _f(v, fmt: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return format(v, fmt)


def _regret(b: dict) -> str:
    if b.get("regret") is None:  # no pick (nothing ranked), or a pick that never reaches the target
        return "n/a" if not b.get("ranked") else "inf"
    return _f(b["regret"], ".2f")


def _pct(v) -> str:
    return "n/a" if v is None else f"{round(100 * v)} %"


def _programs(wall: dict) -> str:
    """``48 (30) / 18 (3)``: programs each command built, and the seconds it took to build them
    (tracing, lowering and compiling, summed over the threads that built them: the advisor builds
    on one per core beside its race)."""
    if "advise_programs" not in wall:
        return "n/a"
    a, d = wall["advise_programs"], wall["dense_programs"]
    return f"{a:.0f} ({wall['advise_compile_s']:.0f}) / {d:.0f} ({wall['dense_compile_s']:.0f})"


def table(results: dict) -> str:
    """One row per task: Kendall tau, top-1 regret, coverage and median interval width of the
    replayed advice at the default budget, and the advisor's wall time against one dense run; the
    goals in the header, held-out tasks marked."""
    g = results["goals"]
    head = (
        f"| task (target) | Kendall tau (>= {g['tau']}) | regret (<= {g['regret']}) | coverage (>= "
        f"{round(100 * g['coverage'])} %) | width hi/lo (<= {g['width']:g}) | advise / dense run wall "
        f"(<= {g['wall_ratio']}x) | programs built, advise / dense (build s) |"
    )
    out = [head, "|---|---|---|---|---|---|---|"]
    for t in results["tasks"]:
        b, wall = t["score"], t.get("wall") or {}
        held = " held out" if t["task"] in results.get("held_out", ()) else ""
        out.append(
            f"| {t['task']}{held} ({t['target']}) | {_f(b.get('tau'), '.2f')} | {_regret(b)} | "
            f"{_pct(b.get('coverage'))} | {_f(b.get('width'), '.1f')} | {_f(wall.get('ratio'), '.1f')}x | "
            f"{_programs(wall)} |"
        )
    return "\n".join(out)


def load(path: str = os.path.join(HERE, "results.json")) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


if __name__ == "__main__":
    print(table(load()))
