"""Steps to a target from a short learning curve, with an interval, or the reason there is none.

The model (a power law, the shape of SGD's error bound O(t^-b) and of empirical learning curves,
Hestness et al., "Deep Learning Scaling is Predictable, Empirically", 2017; Domhan et al.,
IJCAI 2015 use it among their curve families): the gap to the metric's best value
(``cconv.advisor.target``) decays as

    e(t) = A t^(-b)          i.e.   log e = a - b log t,

fitted by least squares to the seed-mean curve's last ``fit_fraction`` of points (the early
transient is not a power law).  The steps to the target gap e* solve it:

    log t* = (a - log e*) / b.

Interval on log t*: ``z`` standard errors of the noise each side, plus the model's error:

* noise, two estimates of the same variance, the larger taken: the delta method on the
  least-squares covariance of (a, b) (residual variance s^2 (X^T X)^-1, gradient (1/b, -log t*/b),
  the classical inverse-regression interval), and the spread of the same prediction made on each
  seed's own curve, var_s / S (the mean of S curves);
* extrapolation: ``kappa * log(1 + t* / t_end)`` -- the model's own error grows with how far past
  the probe's last step t_end it reaches, and does not vanish when t* is close to t_end (the
  curve's last points are its noisiest; a plain ``log(t*/t_end)`` shrank the interval to the noise
  there and covered 17 % of the text task's full runs at a 20 % probe).  ``kappa`` was set on the
  digits task of the validation benchmark (``experiments/advise``: the smallest value whose coverage
  is >= 80 % at every probe budget) and is checked on the other tasks there.

A curve whose seed-mean already reached the target needs no model: t* is the first crossing,
linearly interpolated between logged steps, and the interval is those two logged steps.

No prediction (``Prediction.ok`` is False) when: a seed's metric is non-finite (``diverged``); the
fitted decay rate b is below ``min_rate`` (``stalled``: the gap is not shrinking); t* lies more
than ``max_extrapolation`` probe lengths ahead (``not-approached``); or the noise part of the
interval alone spans more than a factor ``max_width`` (``noisy``: seeds disagree or the curve
scatters; how far the prediction reaches is ``not-approached``'s business, not this one's).  Each
says why in ``reason``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from cconv.advisor.target import Target

STATUSES = ("reached", "predicted", "diverged", "stalled", "not-approached", "noisy", "too-short")


class Curve(NamedTuple):
    """A probe's learning curve: ``values[s, j]`` is seed s's metric at ``steps[j]``."""

    steps: np.ndarray
    values: np.ndarray


class Prediction(NamedTuple):
    """Steps to the target (``steps``, interval ``[lo, hi]``) or, when ``ok`` is False, why not."""

    status: str
    steps: float
    lo: float
    hi: float
    reason: str = ""
    rate: float = math.nan  # fitted decay exponent b
    extrapolation: float = math.nan  # t* / t_end

    @property
    def ok(self) -> bool:
        return self.status in ("reached", "predicted")


class Settings(NamedTuple):
    """The extrapolation's constants (module docstring)."""

    fit_fraction: float = 0.6
    min_points: int = 4
    z: float = 1.645  # two-sided 90 % under a normal error on log t*
    kappa: float = 0.2  # calibrated on the digits task of experiments/advise (validate.py --calibrate)
    min_rate: float = 0.05
    max_extrapolation: float = 50.0
    max_width: float = 20.0  # on exp(2 z sd): the noise part of the interval


def _none(status: str, reason: str, **kw) -> Prediction:
    return Prediction(status, math.nan, math.nan, math.nan, reason, **kw)


def first_crossing(steps: np.ndarray, values: np.ndarray, target: Target) -> tuple[float, float, float] | None:
    """(t*, previous logged step, crossing logged step) of the first logged point that reaches
    the target, t* interpolated linearly in the gap between the two; None if never reached."""
    hit = np.flatnonzero(target.reached(values))
    if hit.size == 0:
        return None
    j = int(hit[0])
    if j == 0:
        return float(steps[0]), 0.0, float(steps[0])
    g0, g1, e = target.gap(values[j - 1]), target.gap(values[j]), target.gap_target
    w = 1.0 if g0 == g1 else float(np.clip((g0 - e) / (g0 - g1), 0.0, 1.0))
    return float(steps[j - 1] + w * (steps[j] - steps[j - 1])), float(steps[j - 1]), float(steps[j])


def fit_power(steps: np.ndarray, gap: np.ndarray) -> tuple[float, float, np.ndarray, float]:
    """Least squares of ``log gap = a - b log t``: (a, b, covariance of (a, b), residual variance)."""
    x, y = np.log(steps), np.log(gap)
    X = np.stack([np.ones_like(x), -x], 1)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    dof = max(len(x) - 2, 1)
    s2 = float(resid @ resid / dof)
    cov = s2 * np.linalg.pinv(X.T @ X)
    return float(coef[0]), float(coef[1]), cov, s2


def log_steps_to(a: float, b: float, gap_target: float) -> float:
    return (a - math.log(gap_target)) / b


def _seed_curves(curve: Curve) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values[seed, step]) in float64; one seed's curve gets the seed axis."""
    steps, values = np.asarray(curve.steps, np.float64), np.asarray(curve.values, np.float64)
    return steps, values[None] if values.ndim == 1 else values


def _gap(target: Target, values: np.ndarray) -> np.ndarray:
    """The gap to the metric's best value, floored at 1e-12 (the fit takes its log)."""
    return np.maximum(target.gap(values), 1e-12)


def predict(curve: Curve, target: Target, settings: Settings = Settings()) -> Prediction:
    """Steps to ``target`` from ``curve`` (module docstring)."""
    steps, values = _seed_curves(curve)
    bad = ~np.isfinite(values)
    if bad.any():
        s, j = np.argwhere(bad)[0]
        return _none("diverged", f"seed {s}: non-finite {target.metric} at step {int(steps[j])}")
    mean = values.mean(0)
    hit = first_crossing(steps, mean, target)
    if hit is not None:
        t, lo, hi = hit
        return Prediction("reached", t, lo, hi, f"reached within the probe (step {t:.0f})", extrapolation=1.0)
    n_fit = max(settings.min_points, int(math.ceil(settings.fit_fraction * len(steps))))
    keep = steps > 0
    steps, values, mean = steps[keep], values[:, keep], mean[keep]
    if len(steps) < n_fit:
        return _none("too-short", f"{len(steps)} logged points; the fit needs {n_fit} (a longer probe or log_every)")
    return _extrapolate(steps[-n_fit:], values[:, -n_fit:], mean[-n_fit:], target, settings)


def _extrapolate(
    xs: np.ndarray, values: np.ndarray, mean: np.ndarray, target: Target, settings: Settings
) -> Prediction:
    """The power-law fit to the seed mean ``mean`` at steps ``xs`` (seeds: ``values``), and t* with its
    interval, or why not (``stalled``, then ``_interval``'s reasons)."""
    a, b, cov, _ = fit_power(xs, _gap(target, mean))
    if b < settings.min_rate:
        return _none(
            "stalled",
            f"the gap to {target.kind.best:g} shrinks as t^-{max(b, 0):.3f} over steps {xs[0]:.0f}-{xs[-1]:.0f} "
            f"(< t^-{settings.min_rate:g}): no progress to extrapolate",
            rate=b,
        )
    lt = log_steps_to(a, b, target.gap_target)
    grad = np.array([1.0 / b, -lt / b])
    var_fit = float(grad @ cov @ grad)  # the delta method on the fit's covariance
    noise = settings.z * math.sqrt(max(var_fit, _seed_variance(xs, values, target, settings)))
    return _interval(lt, noise, b, float(xs[-1]), settings)


def _seed_variance(xs: np.ndarray, values: np.ndarray, target: Target, settings: Settings) -> float:
    """var_s / S of log t* predicted on each seed's own curve; inf when one of them stalls."""
    per_seed = []
    for v in values:
        a_s, b_s, _, _ = fit_power(xs, _gap(target, v))
        per_seed.append(log_steps_to(a_s, b_s, target.gap_target) if b_s >= settings.min_rate else math.inf)
    per_seed = np.asarray(per_seed)
    if not np.all(np.isfinite(per_seed)):
        return math.inf
    return float(per_seed.var(ddof=1) / len(per_seed)) if len(per_seed) > 1 else 0.0


def _interval(lt: float, noise: float, b: float, t_end: float, settings: Settings) -> Prediction:
    """t* = exp(lt) with ``noise`` plus kappa log(1 + t*/t_end) each side (in log t), or
    ``not-approached`` / ``noisy`` (module docstring)."""
    ext = math.exp(lt) / t_end
    half = noise + settings.kappa * math.log1p(max(ext, 1.0))
    t, lo, hi = math.exp(lt), math.exp(lt - half), math.exp(lt + half)
    lo = max(lo, t_end)  # not reached by the probe's last step
    if ext > settings.max_extrapolation:
        return _none(
            "not-approached",
            f"the fit puts the target at ~{t:.3g} steps, {ext:.3g}x the probe (limit {settings.max_extrapolation:g}x)",
            rate=b,
            extrapolation=ext,
        )
    if not math.isfinite(noise) or 2.0 * noise > math.log(settings.max_width):
        spread = "a seed's own curve stalls" if not math.isfinite(noise) else f"{math.exp(2.0 * noise):.3g}x"
        return _none(
            "noisy",
            f"the noise alone spans more than {settings.max_width:g}x ({spread}; interval [{lo:.3g}, {hi:.3g}]): "
            "seeds disagree or the curve is noisy",
            rate=b,
            extrapolation=ext,
        )
    return Prediction("predicted", t, lo, hi, f"extrapolated {ext:.1f}x past the probe", rate=b, extrapolation=ext)


def metric_at(curve: Curve, target: Target, t: float, settings: Settings = Settings()) -> float:
    """The metric the fitted power law gives at step ``t`` (the seed mean; NaN when a seed
    diverged or the curve is too short to fit)."""
    steps, values = _seed_curves(curve)
    if not np.all(np.isfinite(values)):
        return math.nan
    keep = steps > 0
    n_fit = max(settings.min_points, int(math.ceil(settings.fit_fraction * int(keep.sum()))))
    if keep.sum() < n_fit:
        return math.nan
    xs, mean = steps[keep][-n_fit:], values[:, keep].mean(0)[-n_fit:]
    a, b, _, _ = fit_power(xs, _gap(target, mean))
    gap = math.exp(a - max(b, 0.0) * math.log(max(t, xs[-1])))
    return target.kind.best - gap if target.kind.higher else target.kind.best + gap
