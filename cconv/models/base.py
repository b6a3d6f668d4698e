"""A Flax NNX module seen as pure functions over plain pytrees: the ``ModelSpec``.

    spec = cconv.models.build("resnet8", (32, 32, 3), 10, jax.random.key(0))
    out, new_model_state = spec.apply(spec.params, spec.model_state, x, train=True, key=key)

``nnx.split(module, nnx.Param, ...)`` separates the trainable parameters from everything else
(BatchNorm running statistics, ``nnx.BatchStat``); both are converted to *pure* nested dicts of
arrays with string keys, so the engine, optax, the compressors (layer by layer) and orbax see
ordinary pytrees.  ``apply`` merges them back into a module inside the traced function
(``nnx.merge``), calls it, and splits the updated non-parameter state out again: it is a pure
function, safe under ``jax.jit``, ``jax.grad``, ``jax.vmap`` and ``shard_map``.

The modules in this package share one call convention, ``module(x, train: bool, key)``:
``train`` selects batch statistics (True) or running statistics (False) in BatchNorm and turns
dropout on; ``key`` (a PRNG key) feeds dropout and may be None when no layer is stochastic.
Modules never store an ``nnx.Rngs`` (it would end up in ``model_state``, which the engine
averages across workers); randomness is passed in explicitly.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import nnx

Params = Any
ModelState = Any


class ModelSpec(NamedTuple):
    """graphdef: the NNX graph definition; params: pure dict of ``nnx.Param`` values;
    model_state: pure dict of every other variable (e.g. BatchNorm ``mean``/``var``; ``{}`` when
    there is none); apply(params, model_state, x, train, key=None) -> (outputs, new_model_state)."""

    graphdef: Any
    params: Params
    model_state: ModelState
    apply: Callable[..., tuple[jax.Array, ModelState]]

    @property
    def num_params(self) -> int:
        """Number of trainable scalars."""
        return int(sum(x.size for x in jax.tree.leaves(self.params)))


def _check_string_keys(tree, what: str, path: str = "") -> None:
    if isinstance(tree, dict):
        for k, v in tree.items():
            if not isinstance(k, str):
                raise TypeError(f"{what} key {path}/{k!r} is not a string; name submodules with attributes, not lists")
            _check_string_keys(v, what, f"{path}/{k}")


def functional(module: nnx.Module) -> ModelSpec:
    """Split an NNX module (call convention ``module(x, train, key)``) into a ``ModelSpec``."""
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    params, rest = nnx.to_pure_dict(params), nnx.to_pure_dict(rest)
    _check_string_keys(params, "parameter")
    _check_string_keys(rest, "model state")

    def apply(
        params: Params, model_state: ModelState, x: jax.Array, train: bool, key: jax.Array | None = None
    ) -> tuple[jax.Array, ModelState]:
        if not isinstance(train, bool):
            raise TypeError(f"train must be a Python bool (it selects the program), got {train!r}")
        model = nnx.merge(graphdef, params, model_state)
        out = model(x, train, key)
        _, _, new_state = nnx.split(model, nnx.Param, ...)
        return out, nnx.to_pure_dict(new_state)

    return ModelSpec(graphdef, params, rest, apply)


def dropout_key(key: jax.Array | None, index: int, rate: float, train: bool):
    """The key for dropout layer ``index`` (``fold_in(key, index)``); None when dropout is off."""
    if rate == 0.0 or not train:
        return None
    if key is None:
        raise ValueError(f"dropout rate {rate} in training mode needs a PRNG key (loss_fn's key)")
    return jax.random.fold_in(key, index)


# --------------------------------------------------------------------------- hyper-parameter checks


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def positive_int(model: str, name: str, v: Any) -> int:
    """``v`` as an int, or a one-line ValueError unless it is an integer >= 1 (no silent 8.5 -> 8)."""
    if not _is_int(v) or v < 1:
        raise ValueError(f"{model} {name} must be a positive integer, got {v!r}")
    return int(v)


def positive_ints(model: str, name: str, v: Any) -> tuple[int, ...]:
    """``v`` as a non-empty tuple of ints >= 1 (layer widths), or a one-line ValueError."""
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence) or not v or not all(_is_int(h) and h >= 1 for h in v):
        raise ValueError(f"{model} {name} must be a non-empty list of positive integers, got {v!r}")
    return tuple(int(h) for h in v)


def fraction(model: str, name: str, v: Any) -> float:
    """``v`` as a float in [0, 1) (dropout rate, batch-norm momentum), or a one-line ValueError."""
    if not isinstance(v, numbers.Real) or isinstance(v, (bool, np.bool_)) or not 0.0 <= v < 1.0:
        raise ValueError(f"{model} {name} must be a number in [0, 1), got {v!r}")
    return float(v)
