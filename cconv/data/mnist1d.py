"""MNIST-1D (Greydanus & Kalantari, "Scaling down deep learning with MNIST-1D", ICML 2024): ten
1-D templates of the digits, each example a template padded, scaled, sheared, translated and
noised into a length-40 signal.  Generated offline by the ``mnist1d`` package's
``make_dataset`` (nothing downloaded; install with ``pip install 'cconv[data]'``), with its
default arguments (5,000 samples, 80 % train, length 40, seed 42) unless overridden.

Inputs have shape ``(40, 1, 1)`` (height 40, width 1, one channel), so the image models apply as
1-D models: cconv's ``cnn`` convolves with 3x3 kernels over a width-1 image, i.e. a 1-D
convolution of width 3 (zero padding), and skips pooling (the map is 1 pixel wide).
Standardised like digits: one mean and one standard deviation over all training values.
"""

from __future__ import annotations

import numpy as np

from cconv.data.base import Dataset, standardise_channels


def mnist1d(num_samples: int = 5000, seed: int = 42, train_split: float = 0.8) -> Dataset:
    """MNIST-1D from ``mnist1d.data.make_dataset`` (module docstring)."""
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError:
        raise ValueError("dataset 'mnist1d' needs the mnist1d package: pip install 'cconv[data]'") from None
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 20:
        raise ValueError(f"num_samples must be an integer >= 20, got {num_samples!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if not isinstance(train_split, (int, float)) or not 0 < train_split < 1:
        raise ValueError(f"train_split must be a number in (0, 1), got {train_split!r}")
    args = get_dataset_args()
    args.num_samples, args.seed, args.train_split = num_samples, seed, float(train_split)
    d = make_dataset(args)
    xtr = np.asarray(d["x"], np.float64).reshape(-1, args.final_seq_length, 1, 1)
    xte = np.asarray(d["x_test"], np.float64).reshape(-1, args.final_seq_length, 1, 1)
    xtr, xte, mean, std = standardise_channels(xtr, xte)
    info = {
        "name": "mnist1d",
        "source": "mnist1d.data.make_dataset (generated offline)",
        "seed": seed,
        "mean": mean.tolist(),
        "std": std.tolist(),
    }
    ytr, yte = np.asarray(d["y"], np.int32), np.asarray(d["y_test"], np.int32)
    return Dataset({"x": xtr, "y": ytr}, {"x": xte, "y": yte}, 10, tuple(xtr.shape[1:]), "classification", info)
