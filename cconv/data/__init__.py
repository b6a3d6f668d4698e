"""Datasets, worker partitions and global batches; nothing is downloaded at run time.

    >>> import cconv, jax
    >>> ds = cconv.data.load("digits")                   # Dataset(train, test, num_classes, ...)
    >>> parts = cconv.data.partition(ds.train["y"], 8, scheme="dirichlet", alpha=0.5, key=0)
    >>> it = cconv.data.Batcher(ds.train, parts, 64, jax.random.key(0))
    >>> it.next()["x"].shape
    (64, 8, 8, 1)

Datasets (``names()``):

=============== ============== ======================================================================
name            task           source
=============== ============== ======================================================================
digits          classification scikit-learn's bundled 8x8 digits (``cconv.data.embedded``)
least_squares   regression     synthetic, known optimum in ``info`` (``cconv.data.embedded``)
logistic        classification synthetic binary, generating w and optimum in ``info``
mnist           classification IDX files in a local directory (``cconv.data.files``)
fashion_mnist   classification IDX files in a local directory
cifar10         classification python pickle batches in a local directory
mnist1d         classification MNIST-1D, generated offline by the mnist1d package (``cconv.data.mnist1d``)
text            lm             bytes of CPython's standard library (``cconv.data.text``)
=============== ============== ======================================================================

A new dataset is one function returning a ``Dataset`` and a line in ``_REGISTRY``; unregistered ones
are named by import path, ``load("my_pkg.sets:toy", n=100)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from cconv._registry import check_hparams, lookup
from cconv.data.base import TASKS, Dataset, key_words, numpy_rng
from cconv.data.batcher import Batcher
from cconv.data.embedded import digits, least_squares, logistic
from cconv.data.files import cifar10, fashion_mnist, mnist, read_cifar_batch, read_idx, write_idx
from cconv.data.mnist1d import mnist1d
from cconv.data.partition import SCHEMES, label_histograms, mean_tv_distance, partition
from cconv.data.text import text

_REGISTRY: dict[str, Callable[..., Dataset]] = {
    "digits": digits,
    "least_squares": least_squares,
    "logistic": logistic,
    "mnist": mnist,
    "fashion_mnist": fashion_mnist,
    "cifar10": cifar10,
    "text": text,
    "mnist1d": mnist1d,
}


def names() -> list[str]:
    """Registered dataset names."""
    return sorted(_REGISTRY)


def _lookup(name: str) -> Callable[..., Dataset]:
    return lookup("dataset", _REGISTRY, name)


def hparams_of(name: str) -> list[str]:
    """The keyword arguments ``load(name, ...)`` accepts (``root`` included where meaningful)."""
    return list(inspect.signature(_lookup(name)).parameters)


def load(name: str, root=None, **hparams) -> Dataset:
    """Load a registered dataset, e.g. ``load("mnist", root="~/data")`` or ``load("digits")``.

    ``root`` is the local directory of file-based datasets (and an optional ``*.txt`` corpus
    directory for ``text``); the embedded datasets take none.  Unknown names or hyper-parameters
    and missing files raise a one-line ValueError.
    """
    factory = _lookup(name)
    accepted = hparams_of(name)
    if root is not None:
        if "root" not in accepted:
            raise ValueError(f"dataset {name!r} is embedded and takes no root directory")
        hparams["root"] = root
    check_hparams("dataset", name, hparams, accepted)
    return factory(**hparams)


__all__ = [
    "Dataset",
    "TASKS",
    "SCHEMES",
    "Batcher",
    "load",
    "names",
    "hparams_of",
    "partition",
    "label_histograms",
    "mean_tv_distance",
    "read_idx",
    "write_idx",
    "read_cifar_batch",
    "key_words",
    "numpy_rng",
    *_REGISTRY,
]
