"""Global batches assembled from per-worker partitions, reproducible and resumable.

    it = Batcher(ds.train, parts, global_batch=256, key=jax.random.key(0))
    batch = it.next()                  # {"x": [256, ...], "y": [256, ...]} NumPy arrays
    saved = it.state_dict()            # plain ints and lists (JSON-serialisable)
    it2 = Batcher(ds.train, parts, 256, key); it2.load_state_dict(saved)   # continues identically

With P = len(parts) workers and b = global_batch // P, rows ``[w*b, (w+1)*b)`` of every batch come
from worker w's partition: ``shard_map`` (and ``jax.device_put`` with a sharding over the leading
axis) split the leading axis in order, so worker w trains on its own data.

Sampling is without replacement within an epoch: worker w reads the stream
``perm(w, 0) ++ perm(w, 1) ++ ...`` where ``perm(w, e)`` is a permutation of its partition drawn
from ``numpy_rng(key, w, e)``.  A batch may straddle an epoch boundary, so no sample is dropped and
a partition smaller than b still works.  Workers with partitions of different sizes (Dirichlet) go
through epochs at different rates; ``epochs`` reports each worker's progress.  The state is
``(step, epoch[w], position[w])`` plus the key: permutations are recomputed, not stored.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cconv.data.base import check_split, key_words, numpy_rng


class Batcher:
    """Iterator of global batches; see the module docstring."""

    def __init__(self, data: dict, parts, global_batch: int, key: Any):
        n = check_split(data, "data")
        self.data = {k: np.asarray(v) for k, v in data.items()}
        self.parts = [np.asarray(p, np.int64).reshape(-1) for p in parts]
        self.workers = len(self.parts)
        if self.workers < 1:
            raise ValueError("parts must hold at least one worker's index array")
        if isinstance(global_batch, bool) or not isinstance(global_batch, (int, np.integer)) or global_batch < 1:
            raise ValueError(f"global_batch must be a positive integer, got {global_batch!r}")
        if global_batch % self.workers:
            raise ValueError(f"global batch {global_batch} is not divisible by {self.workers} workers")
        for w, p in enumerate(self.parts):
            if len(p) == 0:
                raise ValueError(f"worker {w} has an empty partition")
            if p.min() < 0 or p.max() >= n:
                raise ValueError(f"worker {w}'s partition has indices outside [0, {n})")
        self.global_batch = int(global_batch)
        self.per_worker = self.global_batch // self.workers
        self._seed = key_words(key)
        self.step = 0
        self._epoch = [0] * self.workers
        self._pos = [0] * self.workers
        self._perm = [self._permutation(w, 0) for w in range(self.workers)]

    def _permutation(self, w: int, epoch: int) -> np.ndarray:
        return self.parts[w][numpy_rng(self._seed, w, epoch).permutation(len(self.parts[w]))]

    def indices(self) -> np.ndarray:
        """Advance by one step and return the [global_batch] sample indices of that batch."""
        out = np.empty(self.global_batch, np.int64)
        for w in range(self.workers):
            filled = 0
            while filled < self.per_worker:
                perm, pos = self._perm[w], self._pos[w]
                take = min(self.per_worker - filled, len(perm) - pos)
                start = w * self.per_worker + filled
                out[start : start + take] = perm[pos : pos + take]
                filled += take
                self._pos[w] = pos + take
                if self._pos[w] == len(perm):
                    self._epoch[w] += 1
                    self._pos[w] = 0
                    self._perm[w] = self._permutation(w, self._epoch[w])
        self.step += 1
        return out

    def next(self) -> dict:
        """The next global batch: ``{name: array[global_batch, ...]}`` for every array in data."""
        idx = self.indices()
        return {k: v[idx] for k, v in self.data.items()}

    __next__ = next

    def __iter__(self):
        return self

    @property
    def epochs(self) -> list[float]:
        """Epochs completed by each worker (fractional)."""
        return [e + p / len(part) for e, p, part in zip(self._epoch, self._pos, self.parts)]

    def state_dict(self) -> dict:
        """Everything needed to continue with the same batches (plain ints and lists)."""
        return {
            "step": self.step,
            "epoch": list(self._epoch),
            "position": list(self._pos),
            "seed": list(self._seed),
            "global_batch": self.global_batch,
            "sizes": [len(p) for p in self.parts],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``; the saved seed wins over the constructor's key."""
        missing = {"step", "epoch", "position", "seed", "global_batch", "sizes"} - set(state)
        if missing:
            raise ValueError(f"Batcher state lacks {', '.join(sorted(missing))}")
        sizes = [int(s) for s in state["sizes"]]
        if sizes != [len(p) for p in self.parts] or int(state["global_batch"]) != self.global_batch:
            raise ValueError(
                f"Batcher state is for {len(sizes)} partitions of sizes {sizes} and "
                f"global batch {state['global_batch']}, not {[len(p) for p in self.parts]} and "
                f"{self.global_batch}"
            )
        pos = [int(p) for p in state["position"]]
        if (
            any(not 0 <= p < s for p, s in zip(pos, sizes))
            or len(pos) != self.workers
            or len(state["epoch"]) != self.workers
        ):
            raise ValueError("Batcher state has positions outside the partitions")
        self._seed = [int(s) for s in state["seed"]]
        self.step = int(state["step"])
        self._epoch = [int(e) for e in state["epoch"]]
        self._pos = pos
        self._perm = [self._permutation(w, e) for w, e in enumerate(self._epoch)]
