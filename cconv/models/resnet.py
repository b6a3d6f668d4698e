"""CIFAR-style residual networks, ResNet-(6n+2) (He, Zhang, Ren and Sun 2016, section 4.2).

``conv3x3(w) -> BN -> ReLU``, then three stages of n basic blocks with widths w, 2w, 4w (the first
block of stages 2 and 3 has stride 2), global average pooling and a dense classifier.  A basic
block is ``relu(BN(conv3x3(relu(BN(conv3x3(x))))) + shortcut(x))``.  The shortcut is the paper's
option A for CIFAR: identity, or, where the shape changes, stride-2 subsampling with zero-padded
extra channels (parameter-free, so every parameter is a conv kernel, a BN scale/bias or the
classifier).  depth 8 (n = 1, 75k parameters at w = 16) and depth 20 (n = 3, ~0.27M) are
registered as ``resnet8`` and ``resnet20``; ``resnet`` takes any ``depth = 6n + 2``.

BatchNorm across data-parallel workers
    Training mode (``train=True``) normalises with the statistics of the batch the module sees and
    updates the running averages ``mean <- m mean + (1 - m) mean_batch`` (same for ``var``,
    momentum ``m = bn_momentum``), returned as the new ``model_state``.  Evaluation mode uses the
    running averages and leaves them unchanged.  In data-parallel training every worker calls the
    loss on its own shard, so it normalises with its *local* batch statistics (as in standard
    data-parallel training without SyncBN; Goyal et al. 2017 call the per-worker batch the "BN
    batch"), and the engine averages the returned running statistics across workers with ``pmean``
    every step, so every replica evaluates with the same statistics.  BN parameters (scale, bias)
    are ordinary parameters and travel with the compressed gradients.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from cconv.models.base import fraction, positive_int
from cconv.models.cnn import image_shape
from cconv.models.init import he_normal, lecun_normal

_he = he_normal


class BasicBlock(nnx.Module):
    """Two 3x3 conv-BN layers and an option-A shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int, momentum: float, *, rngs: nnx.Rngs):
        self.stride, self.pad = stride, c_out - c_in
        self.conv1 = nnx.Conv(c_in, c_out, (3, 3), strides=stride, use_bias=False, kernel_init=_he, rngs=rngs)
        self.bn1 = nnx.BatchNorm(c_out, momentum=momentum, rngs=rngs)
        self.conv2 = nnx.Conv(c_out, c_out, (3, 3), use_bias=False, kernel_init=_he, rngs=rngs)
        self.bn2 = nnx.BatchNorm(c_out, momentum=momentum, rngs=rngs)

    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        y = jax.nn.relu(self.bn1(self.conv1(x), use_running_average=not train))
        y = self.bn2(self.conv2(y), use_running_average=not train)
        shortcut = x[:, :: self.stride, :: self.stride, :] if self.stride > 1 else x
        if self.pad:
            shortcut = jnp.pad(shortcut, ((0, 0), (0, 0), (0, 0), (0, self.pad)))
        return jax.nn.relu(y + shortcut)


class ResNet(nnx.Module):
    """ResNet-(6n+2) for small images (module docstring)."""

    def __init__(
        self,
        input_shape,
        num_classes: int,
        *,
        rngs: nnx.Rngs,
        depth: int = 20,
        width: int = 16,
        bn_momentum: float = 0.9,
    ):
        _, _, c = image_shape("resnet", input_shape)
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 8 or (depth - 2) % 6:
            raise ValueError(f"resnet depth must be 6n + 2 with n >= 1 (8, 14, 20, 32, ...), got {depth!r}")
        bn_momentum = fraction("resnet", "bn_momentum", bn_momentum)
        n, w = (depth - 2) // 6, positive_int("resnet", "width", width)
        self.stem = nnx.Conv(c, w, (3, 3), use_bias=False, kernel_init=_he, rngs=rngs)
        self.stem_bn = nnx.BatchNorm(w, momentum=bn_momentum, rngs=rngs)
        c_in, self.blocks = w, 3 * n
        for s in range(3):
            c_out = w * 2**s
            for i in range(n):
                stride = 2 if (s > 0 and i == 0) else 1
                setattr(self, f"block{s * n + i}", BasicBlock(c_in, c_out, stride, bn_momentum, rngs=rngs))
                c_in = c_out
        self.head = nnx.Linear(c_in, num_classes, kernel_init=lecun_normal, rngs=rngs)

    def __call__(self, x: jax.Array, train: bool, key: jax.Array | None = None) -> jax.Array:
        x = jax.nn.relu(self.stem_bn(self.stem(x), use_running_average=not train))
        for i in range(self.blocks):
            x = getattr(self, f"block{i}")(x, train)
        return self.head(x.mean(axis=(1, 2)))
