"""The dataset record and the host-side randomness shared by the data package.

A dataset is a NamedTuple of host (NumPy) arrays::

    ds = cconv.data.load("digits")
    ds.train["x"], ds.train["y"]       # leading axis = samples
    ds.test["x"],  ds.test["y"]
    ds.num_classes                     # classes (classification), outputs (regression), vocab (lm)
    ds.input_shape                     # shape of one sample of x, e.g. (8, 8, 1) or (64,) or (T,)
    ds.task                            # "classification" | "regression" | "lm"
    ds.info                            # provenance and, for synthetic problems, the known optimum
                                       # (JSON-serialisable: vectors are lists of floats)

Data stays on the host: the ``Batcher`` gathers global batches with NumPy fancy indexing and the
training loop moves them to devices.  Randomness is explicit: every function that shuffles takes a
JAX PRNG key (or an integer seed) and derives a NumPy ``Generator`` from it with
``numpy_rng(key, *salt)``, so results never depend on a global RNG.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

TASKS = ("classification", "regression", "lm")


class Dataset(NamedTuple):
    """A train/test pair of ``{"x", "y"}`` dicts of NumPy arrays plus metadata (module docstring)."""

    train: dict
    test: dict
    num_classes: int
    input_shape: tuple
    task: str
    info: dict

    def __repr__(self) -> str:
        return (
            f"Dataset({self.info.get('name', '?')}: task={self.task}, "
            f"train={len(self.train['y'])}, test={len(self.test['y'])}, "
            f"input_shape={self.input_shape}, num_classes={self.num_classes})"
        )


def key_words(key: Any) -> list[int]:
    """The 32-bit words of a JAX PRNG key (typed or raw ``uint32[2]``) or of a non-negative int."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        if key < 0:
            raise ValueError(f"seed must be a non-negative integer, got {key}")
        key = int(key)
        return [key & 0xFFFFFFFF, (key >> 32) & 0xFFFFFFFF]
    try:
        import jax

        if hasattr(key, "dtype") and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jax.random.key_data(key)
        words = np.asarray(key)
    except (TypeError, ValueError) as err:  # pragma: no cover - message below is the point
        raise ValueError(f"expected a JAX PRNG key or a non-negative int seed, got {key!r}") from err
    if words.dtype.kind not in "ui" or words.ndim != 1:
        raise ValueError(
            f"expected a single JAX PRNG key or a non-negative int seed, got array of "
            f"shape {words.shape} and dtype {words.dtype}"
        )
    return [int(w) & 0xFFFFFFFF for w in words]


def numpy_rng(key: Any, *salt: int) -> np.random.Generator:
    """A NumPy Generator determined by ``key`` and the integers ``salt`` (e.g. worker, epoch).

    Uses ``SeedSequence(words(key) + salt)``: distinct salts give statistically independent
    streams, and the same (key, salt) always gives the same stream on every platform.
    """
    return np.random.default_rng(np.random.SeedSequence(key_words(key) + [int(s) for s in salt]))


def check_split(split: dict, name: str) -> int:
    """Validate a ``{"x", "y"}`` split and return its number of samples."""
    if not isinstance(split, dict) or "x" not in split or "y" not in split:
        raise ValueError(f"{name} must be a dict with keys 'x' and 'y'")
    n = len(split["x"])
    if len(split["y"]) != n:
        raise ValueError(f"{name}: x has {n} samples but y has {len(split['y'])}")
    return n


def standardise_channels(train_x: np.ndarray, test_x: np.ndarray, chunk: int = 4096):
    """Per-channel (last axis) standardisation with the training set's mean and std.

    ``x -> (x - mean_c) / std_c`` in float32 (std 0 -> 1); the statistics are float64 sums over
    chunks of samples, so a uint8 CIFAR-10 never needs a float64 copy.  Returns
    ``(train, test, mean, std)``.
    """
    c = train_x.shape[-1]
    s, s2, count = np.zeros(c), np.zeros(c), 0
    for i in range(0, len(train_x), chunk):
        block = np.asarray(train_x[i : i + chunk], np.float64).reshape(-1, c)
        s += block.sum(0)
        s2 += (block * block).sum(0)
        count += len(block)
    mean = s / max(count, 1)
    std = np.sqrt(np.maximum(s2 / max(count, 1) - mean * mean, 0.0))
    std = np.where(std > 0, std, 1.0)
    m32, s32 = mean.astype(np.float32), std.astype(np.float32)

    def norm(a):
        return (np.asarray(a, np.float32) - m32) / s32

    return norm(train_x), norm(test_x), mean, std
