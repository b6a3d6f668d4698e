"""The target a run must reach: ``METRIC=VALUE`` (``test_accuracy=0.9``, ``test_loss=0.3``, ``loss=0.3``).

A metric is a column of a run's ``metrics.jsonl`` (``cconv.experiments.runner``): ``loss`` (the
mean training loss over the steps since the previous line), its ``test_`` twins, ``accuracy``,
``perplexity``.  Its kind comes from the last word of its name (``KINDS``): whether higher is
better and the best value it can take.  Extrapolation works on the *gap* to that best value,
``e(t) = |y(t) - best|`` (``1 - accuracy``, ``loss``, ``perplexity - 1``), which a learning curve
drives towards zero; the target is reached when ``e(t) <= e* = |target - best|``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Kind(NamedTuple):
    """How a metric improves: ``higher`` is better or not, towards ``best``."""

    higher: bool
    best: float


KINDS: dict[str, Kind] = {
    "accuracy": Kind(True, 1.0),
    "loss": Kind(False, 0.0),  # cross-entropy and squared error are > 0
    "perplexity": Kind(False, 1.0),
}


class Target(NamedTuple):
    """Reach ``metric`` = ``value`` (at least, or at most, as ``kind.higher`` says)."""

    metric: str
    value: float
    kind: Kind

    def gap(self, y):
        """Distance to the metric's best value (the quantity a learning curve drives to 0)."""
        return np.abs(np.asarray(y, np.float64) - self.kind.best)

    @property
    def gap_target(self) -> float:
        return abs(self.value - self.kind.best)

    def reached(self, y) -> np.ndarray:
        y = np.asarray(y, np.float64)
        return y >= self.value if self.kind.higher else y <= self.value

    def __str__(self) -> str:
        return f"{self.metric}{'>=' if self.kind.higher else '<='}{self.value:g}"


def kind_of(metric: str) -> Kind:
    """The ``Kind`` of a metric name (by its last ``_``-separated word)."""
    word = metric.rsplit("_", 1)[-1]
    if word not in KINDS:
        raise ValueError(f"metric {metric!r}: cannot tell which way it improves (known kinds: {', '.join(KINDS)})")
    return KINDS[word]


def parse(text: str, available: list[str] | None = None) -> Target:
    """``METRIC=VALUE`` -> Target; a one-line ValueError for an unknown metric, a value that is not
    a number, or a value the metric never reaches (beyond its best, e.g. accuracy 1.2, loss 0)."""
    if not isinstance(text, str) or "=" not in text:
        raise ValueError(f"--target expects METRIC=VALUE (e.g. test_accuracy=0.9), got {text!r}")
    metric, raw = (s.strip() for s in text.split("=", 1))
    if available is not None and metric not in available:
        raise ValueError(f"--target: unknown metric {metric!r}; this task logs {', '.join(available)}")
    kind = kind_of(metric)
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"--target {metric}: {raw!r} is not a number") from None
    if not np.isfinite(value):
        raise ValueError(f"--target {metric}: {raw!r} is not a finite number")
    if kind.higher and value == kind.best:
        raise ValueError(
            f"--target {metric}={value:g}: the metric's best value, reached only by chance on a finite test set "
            f"and never approached by a curve (choose a value short of {kind.best:g}, e.g. 0.99)"
        )
    if kind.higher:
        beyond = value > kind.best
        trivial = value <= 0.0
    else:
        beyond = value <= kind.best
        trivial = False
    if beyond:
        raise ValueError(
            f"--target {metric}={value:g}: the metric never reaches it ({metric} is "
            f"{'at most' if kind.higher else 'always above'} {kind.best:g})"
        )
    if trivial:
        raise ValueError(f"--target {metric}={value:g}: every run starts there; choose a value in (0, {kind.best:g}]")
    return Target(metric, value, kind)
