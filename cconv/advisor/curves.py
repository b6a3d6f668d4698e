"""Learning-curve families and the steps at which a curve reaches a target, chosen per curve.

Extrapolation works on the *gap* to the metric's best value, ``e(t) = |y(t) - best|``
(``cconv.advisor.target``), of the seed-mean curve.  No one shape fits every task (Domhan et al.,
IJCAI 2015, combine eleven families for that reason; Viering & Loog, "The shape of learning
curves", 2022, review the shapes seen in practice), so each curve is given the family that
predicts its own *last* points best:

``power``       log e = a - b log t             SGD's O(t^-b) (Hestness et al. 2017)
``exp``         log e = a - k t                 linear convergence: strongly convex problems,
                                                gradient descent's (1 - mu/L)^t
``loglogistic`` log e = log e0 - log(1 + (t/tau)^b)
                                                S-shaped in log t: a plateau (warm-up, momentum's
                                                start, symmetry breaking), then t^-b
``stretched``   log e = a - c t^beta, beta <= 1  the stretched exponential (Kohlrausch; Williams &
                                                Watts 1970): a decay whose rate falls with time, as
                                                a sum of exponentials' does once its fast modes are
                                                gone (least squares, a model with noise); between
                                                the exponential (beta = 1) and the power law
``warp``        log e(t) = log e_R(t / s)       the shape of a reference curve R that ran further
                                                (a survivor of the race), stretched in time by s:
                                                the candidate learns like R, s times slower

Selection (held-out error): each family is fitted (least squares on log e) to the curve's points
but the last ``holdout`` ones, and scored by the root mean squared error of log e on those; the
family with the smallest error is refitted on every point.  The prediction ``t*`` solves
``e(t*) = e*`` (closed forms; ``warp``: ``t* = s t*_R`` where the reference crossed e*).

Interval on log t* (half-widths: the fast side, and the slow side, which widens faster with the
extrapolation)::

    z * sqrt(var_seed + var_family) + kappa * log(1 + t* / t_end)
    z * sqrt(var_seed + var_family) + (kappa + kappa_slow) * log(1 + t* / t_end)

* ``var_seed``: the chosen family refitted on each seed's own curve, variance of its log t* / S;
* ``var_family``: the spread of log t* over the families whose held-out error is within
  ``family_slack`` of the best (model uncertainty; Domhan et al.'s ensemble in two lines);
* the extrapolation term grows with how far past the curve's last step t_end the target lies.
``z``, ``kappa`` and ``kappa_slow`` are set on the tuning tasks of ``studies/advise/validate.py``
and checked on the held-out ones there (``cconv.advisor.extrapolate``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

FAMILIES = ("power", "exp", "loglogistic", "stretched", "warp")
MIN_RATE = 0.05  # a fit whose gap falls slower than t^-0.05 at the curve's last step predicts nothing


class Fit(NamedTuple):
    """One family fitted to (t, log e): its name, log e as a function of t, its inverse (the t at
    which log e reaches a level, NaN if never), and its held-out RMSE (NaN before scoring)."""

    family: str
    log_gap: Callable[[np.ndarray], np.ndarray]
    steps_to: Callable[[float], float]
    holdout_rmse: float = math.nan
    index: int = -1  # position in ``fitters(refs)`` (which reference a warp used)


def _lstsq(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    return coef


POWER_TAIL = 0.6  # the power law is fitted to the last 60 % of the points (the early transient is not one)


def fit_power(t: np.ndarray, le: np.ndarray) -> Fit | None:
    """log e = a - b log t (b > 0), on the last ``POWER_TAIL`` of the points (at least 3)."""
    k = min(len(t), max(3, math.ceil(POWER_TAIL * len(t))))
    t, le = t[-k:], le[-k:]
    a, b = _lstsq(np.stack([np.ones_like(t), -np.log(t)], 1), le)
    if not b >= MIN_RATE:
        return None
    return Fit("power", lambda x: a - b * np.log(x), lambda lv: math.exp((a - lv) / b))


def fit_exp(t: np.ndarray, le: np.ndarray) -> Fit | None:
    """log e = a - k t (k > 0)."""
    a, k = _lstsq(np.stack([np.ones_like(t), -t], 1), le)
    if not k * t[-1] >= MIN_RATE:  # d log e / d log t = -k t at the last step
        return None
    return Fit("exp", lambda x: a - k * np.asarray(x, np.float64), lambda lv: (a - lv) / k)


def fit_loglogistic(t: np.ndarray, le: np.ndarray) -> Fit | None:
    """log e = l0 - log(1 + (t / tau)^b): a plateau at e0 = exp(l0), then t^-b (b > 0, tau > 0).
    The knee tau lies inside the curve and the fitted decay at its last step is at least MIN_RATE:
    a plateau whose fall is all in the future is not evidence of a fall.

    Variable projection: for fixed (log tau, b) the best l0 is a mean, so the fit is a vectorised
    grid over (log tau, b) then a least-squares polish of all three from the best grid point."""
    from scipy.optimize import least_squares

    if len(t) < 4:
        return None
    lt = np.log(t)
    ltaus = np.linspace(lt[0] - 2.0, lt[-1], 36)[:, None, None]
    bs = np.geomspace(0.2, 8.0, 24)[None, :, None]
    soft = np.logaddexp(0.0, bs * (lt[None, None, :] - ltaus))  # (tau, b, points)
    l0 = (le[None, None, :] + soft).mean(-1, keepdims=True)
    cost = ((l0 - soft - le) ** 2).sum(-1)
    i, j = np.unravel_index(int(np.argmin(cost)), cost.shape)
    p0 = np.array([float(l0[i, j, 0]), float(ltaus[i, 0, 0]), float(bs[0, j, 0])])

    def resid(p):
        return p[0] - np.logaddexp(0.0, p[2] * (lt - p[1])) - le

    def jac(p):
        sig = 1.0 / (1.0 + np.exp(-p[2] * (lt - p[1])))  # d softplus(u)/du
        return np.stack([np.ones_like(lt), p[2] * sig, -(lt - p[1]) * sig], 1)

    lo, hi = [-60.0, lt[0] - 5.0, 1e-3], [60.0, lt[-1], 20.0]
    p0 = np.clip(p0, np.array(lo) + 1e-9, np.array(hi) - 1e-9)
    try:
        x = least_squares(resid, p0, jac=jac, bounds=(lo, hi), max_nfev=50).x
    except ValueError:
        x = p0
    l0, ltau, b = (float(v) for v in x)
    if b / (1.0 + math.exp(-b * (lt[-1] - ltau))) < MIN_RATE:  # -d log e / d log t at the last step
        return None

    def inv(lv: float) -> float:
        d = l0 - lv  # log(1 + (t/tau)^b) = d
        if d <= 0:
            return 0.0
        return math.exp(ltau + math.log(math.expm1(d)) / b) if d < 700 else math.inf

    return Fit("loglogistic", lambda q: l0 - np.logaddexp(0.0, b * (np.log(np.asarray(q, np.float64)) - ltau)), inv)


STRETCH = np.geomspace(0.15, 1.0, 40)  # the stretched exponential's beta: its grid, never past exp's 1


def fit_stretched(t: np.ndarray, le: np.ndarray) -> Fit | None:
    """log e = a - c t^beta (c > 0, 0.15 <= beta <= 1).  Variable projection: for each beta of
    ``STRETCH`` the best (a, c) is a linear regression of log e on t^beta, all betas at once; the
    one with the least squared error is kept.  A beta above 1 (a decay faster than exponential)
    is left out: from a short curve it only extrapolates a fall that speeds up."""
    if len(t) < 4:
        return None
    x = t[None, :] ** STRETCH[:, None]  # (beta, points)
    xm, ym = x.mean(1, keepdims=True), le.mean()
    c = -((x - xm) * (le - ym)).sum(1) / np.maximum(((x - xm) ** 2).sum(1), 1e-300)
    a = ym + c * xm[:, 0]
    sse = ((a[:, None] - c[:, None] * x - le) ** 2).sum(1)
    sse[~(c > 0)] = np.inf
    i = int(np.argmin(sse))
    if not math.isfinite(sse[i]):
        return None
    a, c, b = float(a[i]), float(c[i]), float(STRETCH[i])
    if not c * b * t[-1] ** b >= MIN_RATE:  # -d log e / d log t at the last step
        return None

    def inv(lv: float) -> float:
        d = a - lv
        return 0.0 if d <= 0 else (d / c) ** (1.0 / b)

    return Fit("stretched", lambda q: a - c * np.asarray(q, np.float64) ** b, inv)


class Reference(NamedTuple):
    """A curve that ran further (a race's survivor): its steps and seed-mean log gap, and the
    step at which it reached the target's gap (NaN if it did not)."""

    steps: np.ndarray
    log_gap: np.ndarray


def fit_warp(t: np.ndarray, le: np.ndarray, ref: Reference) -> Fit | None:
    """log e(t) = log e_R(t / s): the reference's curve (interpolated in log t) stretched by s,
    s fitted on a grid then refined (golden section on log s).  The candidate's last point must
    lie inside the reference's stretched range, and so must its later half: before its first
    logged step the reference is read as flat (its first value), so a candidate slower than the
    reference (s > 1, compression's usual case: its first steps map before the reference's
    first) is fitted too, not only a faster one."""
    rt, rl = np.log(ref.steps), ref.log_gap

    def at(x, ls):
        q = np.log(np.asarray(x, np.float64)) - ls
        return np.interp(q, rt, rl, left=rl[0], right=np.nan)

    lo, hi = np.log(t[-1]) - rt[-1], np.log(t[len(t) // 2]) - rt[0]
    if not lo <= hi:
        return None
    grid = np.linspace(lo, hi, 41)
    cost = [np.nanmean((at(t, g) - le) ** 2) for g in grid]
    j = int(np.nanargmin(cost))
    a, b = grid[max(j - 1, 0)], grid[min(j + 1, len(grid) - 1)]
    for _ in range(30):
        m1, m2 = a + 0.382 * (b - a), a + 0.618 * (b - a)
        c1, c2 = np.nanmean((at(t, m1) - le) ** 2), np.nanmean((at(t, m2) - le) ** 2)
        a, b = (a, m2) if c1 <= c2 else (m1, b)
    ls = 0.5 * (a + b)

    def inv(lv: float) -> float:
        below = np.flatnonzero(rl <= lv)
        if below.size == 0:
            return math.nan  # the reference never got there: nothing to borrow
        k = int(below[0])
        if k == 0:
            return float(math.exp(rt[0] + ls))
        w = (rl[k - 1] - lv) / (rl[k - 1] - rl[k]) if rl[k - 1] != rl[k] else 1.0
        return float(math.exp(rt[k - 1] + w * (rt[k] - rt[k - 1]) + ls))

    return Fit("warp", lambda x: at(x, ls), inv)


def fitters(refs: tuple = ()) -> list[Callable[[np.ndarray, np.ndarray], Fit | None]]:
    """The families as functions (t, log e) -> Fit or None: power, exp, loglogistic, stretched, and
    one warp per reference curve."""
    out: list = [fit_power, fit_exp, fit_loglogistic, fit_stretched]
    return out + [lambda t, le, r=r: fit_warp(t, le, r) for r in refs]


def scored(t: np.ndarray, le: np.ndarray, refs: tuple = (), holdout: int = 3) -> list[Fit]:
    """Every family refitted on all points, with its held-out RMSE (fitted on all but the last
    ``holdout`` points, scored on those), best first; families that cannot be fitted or cannot
    predict the held-out points are left out."""
    h = min(holdout, max(1, len(t) // 3))
    out = []
    for i, fitter in enumerate(fitters(refs)):
        part = fitter(t[:-h], le[:-h])
        if part is None:
            continue
        pred = part.log_gap(t[-h:])
        if not np.all(np.isfinite(pred)):
            continue
        full = fitter(t, le)
        if full is not None:
            out.append(full._replace(holdout_rmse=float(np.sqrt(np.mean((pred - le[-h:]) ** 2))), index=i))
    return sorted(out, key=lambda f: f.holdout_rmse)
