"""Multi-layer perceptron: ``h_0 = vec(x)``, ``h_{l+1} = dropout(relu(W_l h_l + b_l))``, output
``W_L h_L + b_L`` (logits or regression outputs).  Layers are attributes ``layer0, layer1, ...``
and ``head``, so parameter names read ``layer0/kernel``, ... ."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
from flax import nnx

from cconv.models.base import dropout_key, fraction, positive_ints
from cconv.models.init import lecun_normal


class MLP(nnx.Module):
    """Fully connected ReLU network with widths ``hidden`` and optional dropout after each layer."""

    def __init__(
        self, input_shape, num_classes: int, *, rngs: nnx.Rngs, hidden: Sequence[int] = (128, 128), dropout: float = 0.0
    ):
        hidden = positive_ints("mlp", "hidden", hidden)
        self.depth, self.rate = len(hidden), fraction("mlp", "dropout", dropout)
        widths = (math.prod(input_shape),) + hidden
        for i in range(self.depth):
            setattr(self, f"layer{i}", nnx.Linear(widths[i], widths[i + 1], kernel_init=lecun_normal, rngs=rngs))
        self.head = nnx.Linear(widths[-1], num_classes, kernel_init=lecun_normal, rngs=rngs)
        self.drop = nnx.Dropout(self.rate)

    def __call__(self, x: jax.Array, train: bool, key: jax.Array | None = None) -> jax.Array:
        h = x.reshape(x.shape[0], -1)
        for i in range(self.depth):
            h = jax.nn.relu(getattr(self, f"layer{i}")(h))
            k = dropout_key(key, i, self.rate, train)
            if k is not None:
                h = self.drop(h, deterministic=False, rngs=k)
        return self.head(h)
