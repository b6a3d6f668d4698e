"""Splitting a training set across P workers: iid, Dirichlet label skew, and label shards.

``partition(labels, workers, scheme, ...)`` returns P sorted, disjoint index arrays that together
cover ``range(len(labels))``.

iid
    A uniformly random permutation cut into P contiguous pieces of sizes floor(N/P) or ceil(N/P).

dirichlet (label-distribution skew)
    Hsu, Qi and Brown (2019), "Measuring the effects of non-identical data distribution for
    federated visual classification", model worker w's label distribution as q_w ~ Dir(alpha p).
    We use the standard way to turn that into a *partition* of a fixed training set
    (Yurochkin et al. 2019; the NIID-Bench code of Li et al. 2022): for every class c, draw
    proportions ``pi_c ~ Dir_P(alpha)`` over workers and hand the class's shuffled samples out in
    those proportions; a worker that already holds N/P samples gets no more (its proportion is
    set to 0 and the rest renormalised).  The whole draw is repeated until every worker has at least
    ``min_size`` samples (default ``min(10, N // P)``).  alpha -> 0: each worker sees few classes;
    alpha -> inf: iid.  ``mean_tv_distance`` measures the skew.

shards (pathological non-iid)
    McMahan et al. (2017), FedAvg: sort by label, cut into ``shards_per_worker * P`` equal shards,
    give each worker ``shards_per_worker`` random shards.

Randomness comes only from ``key`` (a JAX PRNG key or an int seed), via ``numpy_rng``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cconv.data.base import numpy_rng

SCHEMES = ("iid", "dirichlet", "shards")


def _class_labels(labels, scheme: str) -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise ValueError(
            f"partition scheme {scheme!r} needs 1-D integer class labels, got shape "
            f"{y.shape} and dtype {y.dtype} (use scheme='iid' for this task)"
        )
    return y


def partition(
    labels,
    workers: int,
    scheme: str = "iid",
    alpha: float = 0.5,
    key: Any = 0,
    min_size: int | None = None,
    shards_per_worker: int = 2,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """Index arrays, one per worker, that partition the training set (module docstring)."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown partition scheme {scheme!r}; valid: {', '.join(SCHEMES)}")
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    n = len(labels)
    if n < workers:
        raise ValueError(f"cannot split {n} samples across {workers} workers")
    rng = numpy_rng(key, 0x9A27)
    if scheme == "iid":
        return [np.sort(p) for p in np.array_split(rng.permutation(n), workers)]
    y = _class_labels(labels, scheme)
    if scheme == "shards":
        return _shards(y, workers, shards_per_worker, rng)
    if not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"dirichlet alpha must be a finite number > 0, got {alpha!r}")
    if min_size is None:
        min_size = min(10, n // workers)
    if not 0 <= min_size <= n // workers:
        raise ValueError(f"min_size must be in [0, N/P = {n // workers}], got {min_size}")
    classes = [np.flatnonzero(y == c) for c in np.unique(y)]
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(workers)]
        sizes = np.zeros(workers, np.int64)
        for idx in classes:
            idx = rng.permutation(idx)
            prop = rng.dirichlet(np.full(workers, float(alpha)))
            prop = prop * (sizes < n / workers)
            total = prop.sum()
            prop = prop / total if total > 0 else np.full(workers, 1.0 / workers)
            cuts = (np.cumsum(prop) * len(idx)).astype(np.int64)[:-1]
            for w, piece in enumerate(np.split(idx, cuts)):
                parts[w].append(piece)
                sizes[w] += len(piece)
        if sizes.min() >= min_size:
            return [np.sort(np.concatenate(p)) for p in parts]
    raise ValueError(
        f"dirichlet(alpha={alpha}) could not give each of {workers} workers >= "
        f"{min_size} of {n} samples in {max_tries} draws; raise alpha or lower min_size"
    )


def _shards(y: np.ndarray, workers: int, per_worker: int, rng) -> list[np.ndarray]:
    if isinstance(per_worker, bool) or not isinstance(per_worker, (int, np.integer)) or per_worker < 1:
        raise ValueError(f"shards_per_worker must be a positive integer, got {per_worker!r}")
    count = workers * per_worker
    if count > len(y):
        raise ValueError(f"{count} shards need at least {count} samples, got {len(y)}")
    order = np.argsort(y, kind="stable")
    shards = np.array_split(order, count)
    assign = rng.permutation(count).reshape(workers, per_worker)
    return [np.sort(np.concatenate([shards[s] for s in row])) for row in assign]


def label_histograms(labels, parts, num_classes: int | None = None) -> np.ndarray:
    """[P, C] label distribution of each worker (rows sum to 1)."""
    y = _class_labels(labels, "histogram")
    c = int(num_classes if num_classes is not None else y.max() + 1)
    hist = np.stack([np.bincount(y[p], minlength=c)[:c] for p in parts]).astype(np.float64)
    return hist / np.maximum(hist.sum(1, keepdims=True), 1)


def mean_tv_distance(labels, parts, num_classes: int | None = None) -> float:
    """Mean over workers of the total-variation distance ``0.5 |q_w - q|_1`` between a worker's
    label distribution ``q_w`` and the global one ``q``: 0 for identical, up to 1 - min_c q_c."""
    y = _class_labels(labels, "histogram")
    c = int(num_classes if num_classes is not None else y.max() + 1)
    q = np.bincount(y, minlength=c)[:c] / len(y)
    return float(np.mean(0.5 * np.abs(label_histograms(y, parts, c) - q).sum(1)))
