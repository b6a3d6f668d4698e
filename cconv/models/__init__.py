"""Models (Flax NNX) as pure functions over parameter pytrees, and their losses.

    >>> import cconv, jax
    >>> spec = cconv.models.build("mlp", (8, 8, 1), 10, jax.random.key(0), hidden=(32,))
    >>> loss_fn = cconv.models.make_loss(spec, "classification")
    >>> loss, (model_state, aux) = loss_fn(spec.params, spec.model_state, batch, key)

Models (``names()``; hyper-parameters from ``hparams_of(name)``):

============ ================================================================ ===================
name         what                                                             hyper-parameters
============ ================================================================ ===================
linear       one dense layer on the flattened input (``cconv.models.linear``) zero_init
logistic     the same model, named for logistic regression                    zero_init
mlp          ReLU MLP (``cconv.models.mlp``)                                  hidden, dropout
cnn          conv-ReLU-maxpool x2, dense, dense (``cconv.models.cnn``)         channels, hidden
resnet       CIFAR ResNet-(6n+2) with BatchNorm (``cconv.models.resnet``)     depth, width,
                                                                              bn_momentum
resnet8      ResNet-8 (n = 1)                                                 width, bn_momentum
resnet20     ResNet-20 (n = 3)                                                width, bn_momentum
transformer  causal decoder-only LM (``cconv.models.transformer``)            d_model, layers,
                                                                              heads, mlp_ratio,
                                                                              dropout
============ ================================================================ ===================

A new model is an ``nnx.Module`` with the call convention ``module(x, train, key)`` and a line in
``_REGISTRY``; unregistered ones are named by import path, ``build("my_pkg.nets:Wide", ...)`` (a
class or function called as ``factory(input_shape, num_classes, rngs=..., **hparams)``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import jax
import numpy as np
from flax import nnx

from cconv._registry import check_hparams, lookup
from cconv.models.base import ModelSpec, functional
from cconv.models.cnn import CNN
from cconv.models.linear import Linear
from cconv.models.losses import evaluate, make_eval, make_loss, objective
from cconv.models.mlp import MLP
from cconv.models.resnet import ResNet
from cconv.models.transformer import TransformerLM


def resnet8(input_shape, num_classes, *, rngs, width: int = 16, bn_momentum: float = 0.9):
    """ResNet-8 (He et al. 2016, n = 1)."""
    return ResNet(input_shape, num_classes, rngs=rngs, depth=8, width=width, bn_momentum=bn_momentum)


def resnet20(input_shape, num_classes, *, rngs, width: int = 16, bn_momentum: float = 0.9):
    """ResNet-20 (He et al. 2016, n = 3)."""
    return ResNet(input_shape, num_classes, rngs=rngs, depth=20, width=width, bn_momentum=bn_momentum)


_REGISTRY: dict[str, Callable[..., nnx.Module]] = {
    "linear": Linear,
    "logistic": Linear,
    "mlp": MLP,
    "cnn": CNN,
    "resnet": ResNet,
    "resnet8": resnet8,
    "resnet20": resnet20,
    "transformer": TransformerLM,
}
_POSITIONAL = ("self", "input_shape", "num_classes", "rngs")


def names() -> list[str]:
    """Registered model names."""
    return sorted(_REGISTRY)


def _lookup(name: str) -> Callable[..., nnx.Module]:
    return lookup("model", _REGISTRY, name)


def hparams_of(name: str) -> list[str]:
    """The hyper-parameters ``build(name, ...)`` accepts."""
    factory = _lookup(name)
    target = factory.__init__ if isinstance(factory, type) else factory  # NNX metaclass hides it
    return [p for p in inspect.signature(target).parameters if p not in _POSITIONAL]


def _checked(name: str, input_shape, num_classes: int, hparams: dict):
    factory = _lookup(name)
    check_hparams("model", name, hparams, hparams_of(name))
    try:
        shape = tuple(int(s) for s in input_shape)
    except TypeError:
        raise ValueError(f"input_shape must be a sequence of positive ints, got {input_shape!r}") from None
    if not shape or min(shape) < 1:
        raise ValueError(f"input_shape must be a non-empty sequence of positive ints, got {input_shape!r}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    return factory, shape


def _key(key):
    return jax.random.key(key) if isinstance(key, int) and not isinstance(key, bool) else key


def build(name: str, input_shape, num_classes: int, key, **hparams) -> ModelSpec:
    """Initialise model ``name`` for inputs of shape ``input_shape`` (one sample, no batch axis)
    and ``num_classes`` outputs (classes, regression outputs or vocabulary) from PRNG ``key``
    (a JAX key or an int seed); returns its ``ModelSpec``.  Unknown names or hyper-parameters and
    invalid values raise a one-line ValueError."""
    factory, shape = _checked(name, input_shape, num_classes, hparams)
    num_classes = int(num_classes)
    return functional(factory(shape, num_classes, rngs=nnx.Rngs(params=_key(key)), **hparams))


def abstract(name: str, input_shape, num_classes: int, **hparams) -> ModelSpec:
    """The ``ModelSpec`` of ``build(name, ...)`` with shape-only parameters (no FLOPs; validated
    the same way)."""
    factory, shape = _checked(name, input_shape, num_classes, hparams)
    return functional(nnx.eval_shape(lambda: factory(shape, int(num_classes), rngs=nnx.Rngs(params=0), **hparams)))


def input_dtype(name: str) -> str:
    """The dtype of model ``name``'s inputs: a model class's ``input_dtype`` (token ids for
    language models), else float32."""
    return str(getattr(_lookup(name), "input_dtype", "float32"))


def initializer(name: str, input_shape, num_classes: int, **hparams) -> Callable:
    """A pure ``init(key) -> (params, model_state)`` for model ``name``: the same pytrees as
    ``build(name, input_shape, num_classes, key, **hparams)`` gives, but jit- and vmap-able, e.g.
    ``jax.vmap(init)(jax.random.split(key, seeds))`` initialises one model per seed."""
    factory, shape = _checked(name, input_shape, num_classes, hparams)
    num_classes = int(num_classes)
    # abstract construction (no FLOPs): invalid hyper-parameter values fail here, not under jit
    nnx.eval_shape(lambda: factory(shape, num_classes, rngs=nnx.Rngs(params=0), **hparams))

    def init(key):
        module = factory(shape, num_classes, rngs=nnx.Rngs(params=_key(key)), **hparams)
        _, params, rest = nnx.split(module, nnx.Param, ...)
        return nnx.to_pure_dict(params), nnx.to_pure_dict(rest)

    return init


__all__ = [
    "ModelSpec",
    "build",
    "abstract",
    "input_dtype",
    "initializer",
    "names",
    "hparams_of",
    "make_loss",
    "make_eval",
    "evaluate",
    "objective",
    "functional",
    "Linear",
    "MLP",
    "CNN",
    "ResNet",
    "TransformerLM",
]
