"""What a run counts while it trains, per seed, and the records made of it: the running totals
(``Counters``, checkpointed with the state), the metric lines of ``metrics.jsonl`` (their columns:
``cconv.experiments.runner``'s docstring) and the final ``summary.json``.

A step metric named ``*_max`` is a maximum (a line carries the largest since the previous line);
every other step metric, the mean.  A loss that breaks ``cconv.experiments.divergence``'s rule
marks its seed diverged: that line is written, later steps of the seed are not counted.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from cconv.experiments import divergence


@dataclasses.dataclass
class Counters:
    """Running totals of a run, per seed; checkpointed with the state (``to_dict`` / ``from_dict``,
    a JSON mapping with these keys).

    cum_sent, cum_recv  bytes sent / received per worker since step 0 (moved by the collectives)
    cum_enc_sent, cum_enc_recv   the same for the encoded messages (= moved for fixed formats)
    sim                 simulated time since step 0, per seed and network (None: no network)
    wall                wall-clock seconds spent training, resumes included
    diverged            the step at which the seed diverged (``cconv.experiments.divergence``:
                        non-finite loss, or above 10x the first step's), per seed (None: not)
    diverged_why        that rule's one-line reason, per seed (None: not diverged)
    loss0               the seed's first step's training loss, the divergence rule's reference
    calibration         the measured compute / exchange times behind ``sim`` (None: no network)
    acc                 running sums of the metrics since the last metric line, per seed, with
                        ``_n`` (steps summed), ``_last`` (the last step's metrics) and ``_times``
                        (its simulated step times)
    """

    cum_sent: list[float]
    cum_recv: list[float]
    sim: list[list[float]] | None
    wall: float
    diverged: list[int | None]
    calibration: dict | None
    acc: list[dict]
    cum_enc_sent: list[float] = dataclasses.field(default_factory=list)
    cum_enc_recv: list[float] = dataclasses.field(default_factory=list)
    diverged_why: list = dataclasses.field(default_factory=list)
    loss0: list = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.cum_sent)  # counters made before the divergence rule had a reference
        self.diverged_why = self.diverged_why or [None] * n
        self.loss0 = self.loss0 or [None] * n

    @classmethod
    def fresh(cls, seeds: int) -> Counters:
        z = lambda: [0.0] * seeds
        n = lambda: [None] * seeds
        return cls(z(), z(), None, 0.0, n(), None, [dict() for _ in range(seeds)], z(), z(), n(), n())

    @classmethod
    def from_dict(cls, d: dict) -> Counters:
        # checkpoints written before encoded sizes were logged: every format was fixed (encoded = moved);
        # before the divergence rule had a reference: only its non-finite part applies (loss0 None)
        n = [None] * len(d["cum_sent"])
        d = {
            "cum_enc_sent": list(d["cum_sent"]),
            "cum_enc_recv": list(d["cum_recv"]),
            "diverged_why": n,
            "loss0": n,
            **d,
        }
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})

    def to_dict(self) -> dict:
        """The checkpointed mapping (shares the lists and dicts, no copy)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def all_diverged(self) -> bool:
        return all(d is not None for d in self.diverged)


def _is_max(name: str) -> bool:
    """A step metric named ``*_max`` is a maximum: a line carries the largest since the previous
    line; every other step metric, the mean."""
    return name.endswith("_max")


def accumulate(
    counters: Counters, clock: Any, pending: list[tuple[int, dict]], log_every: int, steps: int
) -> list[tuple[int, int, dict]]:
    """Add the host metrics of finished steps (``(step index, metrics)``; with several seeds each
    value has a leading seed axis) to ``counters``; returns the metric lines due, as (seed index,
    step, accumulated sums): every ``log_every`` steps, at ``steps`` and where a seed diverges.
    ``clock``: the run's ``SimClock`` (its ``step_times``), or None."""
    seeds = len(counters.cum_sent)
    records = []
    for s_idx, hm in pending:
        times = clock.step_times(s_idx) if clock else []
        done = s_idx + 1
        for i in range(seeds):
            if counters.diverged[i] is not None:
                continue
            mi = {k: float(np.asarray(v)[i]) if seeds > 1 else float(np.asarray(v)) for k, v in hm.items()}
            a = _add_step(counters, i, mi, times)
            bad = _check_divergence(counters, i, mi.get("loss", 0.0), done)
            if bad or done % log_every == 0 or done == steps:
                records.append((i, done, a))
                counters.acc[i] = {}
    return records


def _add_step(counters: Counters, i: int, mi: dict, times: list[float]) -> dict:
    """Count one step's metrics ``mi`` of seed index ``i``; returns its running sums."""
    counters.cum_sent[i] += mi.get("bytes_sent", 0.0)
    counters.cum_recv[i] += mi.get("bytes_received", 0.0)
    counters.cum_enc_sent[i] += mi.get("bytes_encoded_sent", 0.0)
    counters.cum_enc_recv[i] += mi.get("bytes_encoded_received", 0.0)
    for j, t in enumerate(times):
        counters.sim[i][j] += t
    a = counters.acc[i]
    for k, v in mi.items():
        if not k.startswith("bytes_") and k != "density":
            a[k] = max(a.get(k, -math.inf), v) if _is_max(k) else a.get(k, 0.0) + v
    a["_n"] = a.get("_n", 0) + 1
    a["_last"] = mi
    a["_times"] = times
    return a


def _check_divergence(counters: Counters, i: int, loss: float, done: int) -> bool:
    """Has seed index ``i`` diverged at step ``done`` (``cconv.experiments.divergence``)?  Marks
    it so; the first finite loss becomes the rule's reference."""
    why = divergence.reason(loss, counters.loss0[i], done)
    if counters.loss0[i] is None and math.isfinite(loss):
        counters.loss0[i] = loss
    if why is None:
        return False
    counters.diverged[i], counters.diverged_why[i] = done, why
    return True


def metric_line(
    counters: Counters, clock: Any, seed: int, i: int, done: int, a: dict, test: dict | None, elapsed: float
) -> dict:
    """One metrics.jsonl line of seed ``seed`` (index ``i``) at step ``done``, from its running sums
    ``a`` (emptied), its test metrics (None: not evaluated) and the wall time ``elapsed``."""
    line = {"step": done, "seed": seed}
    n = a.pop("_n")
    last = a.pop("_last")
    times = a.pop("_times")
    for k, v in a.items():
        line[k] = v if _is_max(k) else v / n
    if test is not None:
        line.update(test)
    line["bytes_sent"] = last.get("bytes_sent", 0.0)
    line["bytes_received"] = last.get("bytes_received", 0.0)
    line["bytes_encoded_sent"] = last.get("bytes_encoded_sent", 0.0)
    line["bytes_encoded_received"] = last.get("bytes_encoded_received", 0.0)
    if "density" in last:
        line["density"] = last["density"]
    line["cum_bytes_sent"] = counters.cum_sent[i]
    line["cum_bytes_received"] = counters.cum_recv[i]
    line["cum_bytes"] = counters.cum_sent[i] + counters.cum_recv[i]
    line["cum_bytes_encoded"] = counters.cum_enc_sent[i] + counters.cum_enc_recv[i]
    if clock:
        for j, lab in enumerate(clock.labels):
            line[f"sim_time@{lab}"] = counters.sim[i][j]
            line[f"sim_step_time@{lab}"] = times[j]
        line["sim_time"] = counters.sim[i][0]
        line["sim_step_time"] = times[0]
    line["wall_time"] = elapsed
    return line


def final_summary(seeds: list[int], base: dict, step: int, counters: Counters, last_lines: list) -> dict:
    """summary.json of a run that ended at ``step``: completed, or diverged (with the steps per
    seed); ``last_lines``: each seed's last metric line."""
    div = counters.diverged
    status = "diverged" if any(d is not None for d in div) else "completed"
    per_seed = {
        str(s): {
            "status": "diverged" if div[i] is not None else "completed",
            "diverged_at_step": div[i],
            "diverged_why": counters.diverged_why[i],
            "final": last_lines[i],
        }
        for i, s in enumerate(seeds)
    }
    summary = {
        **base,
        "status": status,
        "error": None,
        "step": step,
        "wall_time": counters.wall,
        "final": last_lines[0] if len(seeds) == 1 else None,
        "per_seed": per_seed,
    }
    if status == "diverged":
        why = counters.diverged_why
        summary["error"] = "; ".join(
            f"seed {s}: {why[i] or f'non-finite loss at step {d}'}"
            for i, (s, d) in enumerate(zip(seeds, div))
            if d is not None
        )
    return summary
