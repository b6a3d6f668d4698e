"""A small convolutional network (the FedAvg/LeNet family, McMahan et al. 2017):
``[conv3x3(c_i) -> ReLU -> maxpool 2x2] for c_i in channels -> flatten -> dense(hidden) -> ReLU
-> dense(num_classes)``.  Pooling is skipped once the feature map is 1 pixel wide, so 8x8 digits,
28x28 MNIST and 32x32 CIFAR all work.  Inputs NHWC."""

from __future__ import annotations

from collections.abc import Sequence

import jax
from flax import nnx

from cconv.models.base import positive_int, positive_ints
from cconv.models.init import lecun_normal


def image_shape(name: str, input_shape) -> tuple[int, int, int]:
    """Validate an (H, W, C) input shape for a convolutional model."""
    if len(input_shape) != 3 or min(input_shape) < 1:
        raise ValueError(f"model {name!r} needs image inputs (H, W, C), got input_shape {tuple(input_shape)}")
    return tuple(int(s) for s in input_shape)


class CNN(nnx.Module):
    """Conv-ReLU-pool blocks with widths ``channels``, then a ReLU dense layer of width ``hidden``."""

    def __init__(
        self, input_shape, num_classes: int, *, rngs: nnx.Rngs, channels: Sequence[int] = (32, 64), hidden: int = 128
    ):
        h, w, c = image_shape("cnn", input_shape)
        channels = positive_ints("cnn", "channels", channels)
        hidden = positive_int("cnn", "hidden", hidden)
        self.depth, pools = len(channels), []
        for i, out in enumerate(channels):
            setattr(self, f"conv{i}", nnx.Conv(c, out, (3, 3), kernel_init=lecun_normal, rngs=rngs))
            pool = min(h, w) >= 2
            pools.append(pool)
            if pool:
                h, w = h // 2, w // 2
            c = out
        self.pool = tuple(pools)
        self.dense = nnx.Linear(h * w * c, int(hidden), kernel_init=lecun_normal, rngs=rngs)
        self.head = nnx.Linear(int(hidden), num_classes, kernel_init=lecun_normal, rngs=rngs)

    def __call__(self, x: jax.Array, train: bool, key: jax.Array | None = None) -> jax.Array:
        for i in range(self.depth):
            x = jax.nn.relu(getattr(self, f"conv{i}")(x))
            if self.pool[i]:
                x = nnx.max_pool(x, (2, 2), strides=(2, 2))
        x = jax.nn.relu(self.dense(x.reshape(x.shape[0], -1)))
        return self.head(x)
