"""The README's table of the advisor's validation, made from ``results.json`` (so the README
cannot drift from the committed results; ``tests/test_docs.py`` checks it).

    python experiments/advise/readme.py          # prints the table
"""

from __future__ import annotations

import json
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def _f(v, fmt: str) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return format(v, fmt)


def _regret(b: dict) -> str:
    if b.get("regret") is None:  # no pick (nothing ranked), or a pick that never reaches the target
        return "n/a" if not b.get("ranked") else "inf"
    return _f(b["regret"], ".2f")


def table(results: dict) -> str:
    """One row per task: Kendall tau, top-1 regret and coverage at each probe budget, and the
    advisor's wall time at 10 % against one full dense run; the goals in the header."""
    g = results["goals"]
    budgets = [b["budget"] for b in results["tasks"][0]["budgets"]]
    pct = "/".join(f"{round(100 * b)}" for b in budgets)
    head = (
        f"| task (target) | tau at {pct} % (goal >= {g['tau']} at 10 %) | regret (<= {g['regret']}) "
        f"| coverage (>= {round(100 * g['coverage'])} %) | advisor wall / dense run (<= {g['wall_ratio']}x) |"
    )
    out = [head, "|---|---|---|---|---|"]
    for t in results["tasks"]:
        bs = t["budgets"]
        cov = " / ".join("n/a" if b.get("coverage") is None else f"{round(100 * b['coverage'])} %" for b in bs)
        wall = t.get("wall") or {}
        out.append(
            f"| {t['task']} ({t['target']}) | {' / '.join(_f(b.get('tau'), '.2f') for b in bs)} "
            f"| {' / '.join(_regret(b) for b in bs)} | {cov} | {_f(wall.get('ratio'), '.1f')}x |"
        )
    return "\n".join(out)


def load(path: str = os.path.join(HERE, "results.json")) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


if __name__ == "__main__":
    print(table(load()))
