"""Datasets that need no files: scikit-learn's digits and two synthetic problems with a known optimum.

digits
    The UCI optical-recognition handwritten digits as shipped inside scikit-learn
    (``sklearn.datasets.load_digits``: 1797 grey-scale 8x8 images, 10 balanced classes, pixel values
    0..16; bundled with the package, no network).  Fixed split: a permutation drawn from the PCG64
    bit generator seeded with 0 (bit-generator streams are stable across NumPy versions), the
    first ``train_size`` (default 1500) samples for training, the rest (297) for test.
    Standardised like MNIST/CIFAR: one mean and one standard deviation over all training pixels,
    ``x = (x - mean) / std`` (per-pixel statistics would blow up the rarely lit corner pixels).
    Images have shape (8, 8, 1), or (64,) with ``flat=True``.

least_squares
    ``y = A w_true + b_true + noise * eps``, rows of ``A`` Gaussian with column scales
    ``s_j = cond**(-j / (2 (d - 1)))`` so that the population Hessian has condition number
    ``cond``.  The loss is the one ``cconv.models.make_loss(spec, "regression")`` computes, the
    mean squared error ``f(w, b) = (1/n) sum_i (a_i.w + b - y_i)^2``.  ``info`` gives the generating
    ``w_true``, ``b_true``, the empirical optimum ``w_star``, ``b_star`` on the training set (normal
    equations in float64), ``optimal_loss`` = f(w_star, b_star) on train, ``optimal_test_loss`` (the
    same parameters on test), and the smoothness ``L`` and strong-convexity ``mu`` constants of f:
    the extreme eigenvalues of its Hessian ``(2/n) [A 1]^T [A 1]``.

logistic
    ``x ~ N(0, I_d)``, ``P(y = 1 | x) = sigmoid(x.w_true + b_true)``.  Binary classification
    (``num_classes = 2``): a two-output softmax model is the logistic model with
    ``w = w_1 - w_0``, so its cross-entropy has the same optimal value as the logistic loss
    ``f(w, b) = (1/n) sum_i log(1 + exp(-s_i (x_i.w + b))) + (l2/2) |w|^2``, ``s_i = 2 y_i - 1``.
    ``info`` gives ``w_true``, ``b_true`` and the optimum ``w_opt``, ``b_opt`` of f on the training
    set (Newton's method in float64 to a gradient norm below 1e-10), ``optimal_loss`` = f at the
    optimum, ``optimal_data_loss`` (its cross-entropy part, which the model's loss reaches at
    kernel[:, 1] - kernel[:, 0] = w_opt, bias[1] - bias[0] = b_opt) and train/test accuracies of the
    optimum.  With ``l2 = 0`` (default) this is the maximum-likelihood estimate; it exists because
    labels drawn from a logistic model with n >> d are not linearly separable (checked).
"""

from __future__ import annotations

import gzip
import importlib.util
import os

import numpy as np

from cconv.data.base import Dataset, numpy_rng, standardise_channels

DIGITS_SIZE = 1797


def _check_int(name: str, value, low: int, high: int | None = None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, np.integer))
        or value < low
        or (high is not None and value > high)
    ):
        rng = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an integer in {rng}, got {value!r}")
    return int(value)


def _check_float(name: str, value, low: float, strict: bool = False) -> float:
    ok = isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)
    if not ok or not np.isfinite(value) or value < low or (strict and value == low):
        op = ">" if strict else ">="
        raise ValueError(f"{name} must be a finite number {op} {low}, got {value!r}")
    return float(value)


def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(data float64 (1797, 64), target) exactly as ``sklearn.datasets.load_digits()`` returns them:
    its bundled ``datasets/data/digits.csv.gz`` parsed the way it parses it (``np.loadtxt``, comma
    separated, the last column the label), without importing scikit-learn (about 2 s of imports,
    scipy included, in every process that loads digits).  Falls back to ``load_digits`` where the
    file is not at that place."""
    spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
    path = None
    if spec is not None and spec.origin is not None:
        path = os.path.join(os.path.dirname(spec.origin), "datasets", "data", "digits.csv.gz")
    if path is None or not os.path.isfile(path):
        from sklearn.datasets import load_digits

        raw = load_digits()
        return raw.data, raw.target
    with gzip.open(path, mode="rt", encoding="utf-8") as fh:
        data = np.loadtxt(fh, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int)


def digits(train_size: int = 1500, flat: bool = False) -> Dataset:
    """scikit-learn's 8x8 digits, standardised, fixed split (module docstring)."""
    train_size = _check_int("train_size", train_size, 1, DIGITS_SIZE - 1)
    data, target = _load_digits()
    x = data.reshape(-1, 8, 8, 1).astype(np.float64)
    y = target.astype(np.int32)
    order = np.argsort(np.random.PCG64(0).random_raw(len(y)), kind="stable")
    tr, te = order[:train_size], order[train_size:]
    xtr, xte, mean, std = standardise_channels(x[tr], x[te])
    if flat:
        xtr, xte = xtr.reshape(len(tr), -1), xte.reshape(len(te), -1)
    info = {
        "name": "digits",
        "source": "sklearn.datasets.load_digits (UCI optdigits, bundled)",
        "split_seed": 0,
        "mean": mean.tolist(),
        "std": std.tolist(),
    }
    return Dataset({"x": xtr, "y": y[tr]}, {"x": xte, "y": y[te]}, 10, tuple(xtr.shape[1:]), "classification", info)


def least_squares(
    dim: int = 20, train_size: int = 1024, test_size: int = 256, noise: float = 0.1, cond: float = 10.0, seed: int = 0
) -> Dataset:
    """Linear regression with a known optimum (module docstring)."""
    dim = _check_int("dim", dim, 1)
    train_size = _check_int("train_size", train_size, dim + 1)
    test_size = _check_int("test_size", test_size, 1)
    noise = _check_float("noise", noise, 0.0)
    cond = _check_float("cond", cond, 1.0)
    seed = _check_int("seed", seed, 0)
    rng = numpy_rng(seed, 1)
    scales = cond ** (-np.arange(dim) / (2 * max(dim - 1, 1)))
    w_true = rng.standard_normal(dim) / np.sqrt(dim) / scales  # signal of order 1 in every direction
    b_true = float(rng.standard_normal())
    n = train_size + test_size
    a = rng.standard_normal((n, dim)) * scales
    y = a @ w_true + b_true + noise * rng.standard_normal(n)
    a_tr, y_tr, a_te, y_te = a[:train_size], y[:train_size], a[train_size:], y[train_size:]
    aug = np.hstack([a_tr, np.ones((train_size, 1))])
    sol, *_ = np.linalg.lstsq(aug, y_tr, rcond=None)
    w_star, b_star = sol[:-1], float(sol[-1])
    mse = lambda aa, yy: float(np.mean((aa @ w_star + b_star - yy) ** 2))  # noqa: E731
    eig = np.linalg.eigvalsh(2.0 / train_size * aug.T @ aug)
    info = {
        "name": "least_squares",
        "loss": "mean((a.w + b - y)^2)",
        "w_true": w_true.tolist(),
        "b_true": b_true,
        "w_star": w_star.tolist(),
        "b_star": b_star,
        "optimal_loss": mse(a_tr, y_tr),
        "optimal_test_loss": mse(a_te, y_te),
        "L": float(eig[-1]),
        "mu": float(eig[0]),
        "noise": noise,
        "cond": cond,
        "seed": seed,
    }
    f32 = lambda v: np.asarray(v, np.float32)  # noqa: E731
    return Dataset({"x": f32(a_tr), "y": f32(y_tr)}, {"x": f32(a_te), "y": f32(y_te)}, 1, (dim,), "regression", info)


def _logistic_newton(x: np.ndarray, y: np.ndarray, l2: float, tol: float = 1e-10, max_iter: int = 100):
    """argmin_{w,b} mean(softplus(z) - y z) + l2/2 |w|^2, z = x w + b, by damped Newton (float64)."""
    n, d = x.shape
    xa = np.hstack([x, np.ones((n, 1))])
    reg = np.full(d + 1, l2)
    reg[-1] = 0.0

    def objective(theta):
        z = xa @ theta
        return float(np.mean(np.logaddexp(0.0, z) - y * z) + 0.5 * np.sum(reg * theta * theta))

    theta = np.zeros(d + 1)
    for _ in range(max_iter):
        z = xa @ theta
        p = 1.0 / (1.0 + np.exp(-z))
        grad = xa.T @ (p - y) / n + reg * theta
        if np.linalg.norm(grad) < tol:
            if l2 == 0 and np.all((2 * y - 1) * z > 0):
                break  # every point on its side: separable, the loss only vanishes at infinity
            return theta, objective(theta)
        hess = (xa * (p * (1 - p))[:, None]).T @ xa / n + np.diag(reg)
        step = np.linalg.solve(hess + 1e-12 * np.eye(d + 1), grad)
        t, f0 = 1.0, objective(theta)
        while objective(theta - t * step) > f0 - 0.25 * t * float(grad @ step) and t > 1e-8:
            t *= 0.5
        theta = theta - t * step
    raise ValueError(
        "logistic: Newton's method did not converge (the training data are linearly "
        "separable, so the unregularised optimum is at infinity); use l2 > 0 or more "
        "samples"
    )


def logistic(
    dim: int = 20, train_size: int = 2048, test_size: int = 512, w_norm: float = 4.0, l2: float = 0.0, seed: int = 0
) -> Dataset:
    """Binary logistic regression generated from a known w (module docstring)."""
    dim = _check_int("dim", dim, 1)
    train_size = _check_int("train_size", train_size, 2)
    test_size = _check_int("test_size", test_size, 1)
    w_norm = _check_float("w_norm", w_norm, 0.0)
    l2 = _check_float("l2", l2, 0.0)
    seed = _check_int("seed", seed, 0)
    rng = numpy_rng(seed, 2)
    u = rng.standard_normal(dim)
    w_true = w_norm * u / np.linalg.norm(u)
    b_true = 0.5 * float(rng.standard_normal())
    n = train_size + test_size
    x = rng.standard_normal((n, dim))
    p = 1.0 / (1.0 + np.exp(-(x @ w_true + b_true)))
    y = (rng.random(n) < p).astype(np.int32)
    x_tr, y_tr, x_te, y_te = x[:train_size], y[:train_size], x[train_size:], y[train_size:]
    theta, opt = _logistic_newton(x_tr, y_tr.astype(np.float64), l2)
    w_opt, b_opt = theta[:-1], float(theta[-1])
    acc = lambda xx, yy: float(np.mean(((xx @ w_opt + b_opt) >= 0) == (yy == 1)))  # noqa: E731
    info = {
        "name": "logistic",
        "loss": "mean(log(1 + exp(-s (x.w + b)))) + l2/2 |w|^2, s = 2y - 1",
        "w_true": w_true.tolist(),
        "b_true": b_true,
        "w_opt": w_opt.tolist(),
        "b_opt": b_opt,
        "l2": l2,
        "optimal_loss": opt,
        "optimal_data_loss": opt - 0.5 * l2 * float(w_opt @ w_opt),
        "optimal_train_accuracy": acc(x_tr, y_tr),
        "optimal_test_accuracy": acc(x_te, y_te),
        "seed": seed,
    }
    f32 = lambda v: np.asarray(v, np.float32)  # noqa: E731
    return Dataset({"x": f32(x_tr), "y": y_tr}, {"x": f32(x_te), "y": y_te}, 2, (dim,), "classification", info)
