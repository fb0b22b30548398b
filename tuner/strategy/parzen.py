"""Parzen mixtures of TPE: one kernel per observed trial and a prior's, over a group of params.

Optuna's estimator (``optuna.samplers._tpe.parzen_estimator``, default settings): a numerical param's
kernels are truncated Gaussians on the param's range (log params in log space; int and stepped params on
the range widened by half a step, each value the mass of its step's bin), at the observations and, for the
prior, at the middle with the range as its bandwidth; a kernel's bandwidth is the larger distance to its
neighbours (the outermost ones look inwards only), clipped to [range / min(100, n + 2), range]. A
categorical param's kernel is the observed choice's one-hot smoothed by the prior weight. Densities are
numpy over points x kernels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution
from scipy.special import log_ndtr, ndtr, ndtri

PRIOR_WEIGHT = 1.0
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def ramp_weights(n: int) -> np.ndarray:
    """Optuna's default weights of ``n`` observations in trial order: the newest 25 weigh 1, older ones less."""
    if n < 25:
        return np.ones(n)
    return np.concatenate([np.linspace(1.0 / n, 1.0, num=n - 25), np.ones(25)])


def log_gauss_mass(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """log(Phi(b) - Phi(a)) for a <= b, elementwise, accurate in both tails (worked in the left one)."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=float), np.asarray(b, dtype=float))
    left, right = b <= 0, a > 0
    if not (left.any() or right.any()):  # every interval holds 0 (a kernel's own bounds always do)
        return np.log1p(-ndtr(a) - ndtr(-b))
    out = np.empty(a.shape)
    central = ~(left | right)
    with np.errstate(divide="ignore"):
        for mask, lo, hi in ((left, a, b), (right, -b, -a)):
            if mask.any():
                log_hi, log_lo = log_ndtr(hi[mask]), log_ndtr(lo[mask])
                out[mask] = log_hi + np.log(-np.expm1(log_lo - log_hi))
        out[central] = np.log1p(-ndtr(a[central]) - ndtr(-b[central]))
    return out


@dataclass(frozen=True)
class _Numeric:
    """One numerical param's kernels, in the modelled space (log for log scales), widened by half a step."""

    mu: np.ndarray
    sigma: np.ndarray
    low: float
    high: float
    step: float  # 0: continuous
    log: bool
    raw_low: float
    raw_high: float
    pairs: np.ndarray  # the distinct (mu, sigma) pairs, as mu + i sigma: discrete kernels repeat
    pair_of: np.ndarray  # each kernel's pair
    log_norm: np.ndarray  # each pair's log mass inside [low, high]


def modelled_bounds(dist: BaseDistribution) -> tuple[float, float, float]:
    """The modelled interval of a numerical distribution and its step (0: continuous)."""
    step = 0.0 if isinstance(dist, FloatDistribution) and dist.step is None else float(dist.step)
    low, high = dist.low - step / 2, dist.high + step / 2
    return (math.log(low), math.log(high), step) if dist.log else (low, high, step)


def _numeric(observed: np.ndarray, dist: BaseDistribution) -> _Numeric:
    low, high, step = modelled_bounds(dist)
    mus = np.log(observed) if dist.log else observed
    order = np.argsort(mus)
    padded = np.concatenate([[low], mus[order], [high]])
    spread = np.maximum(padded[1:-1] - padded[:-2], padded[2:] - padded[1:-1])
    if len(mus) >= 2:  # Optuna's consider_endpoints=False: the outermost kernels look inwards only
        spread[0], spread[-1] = padded[2] - padded[1], padded[-2] - padded[-3]
    sigmas = np.empty(len(mus))
    sigmas[order] = spread
    sigmas = np.clip(sigmas, (high - low) / min(100.0, len(mus) + 2.0), high - low)  # the magic clip
    mu, sigma = np.append(mus, 0.5 * (low + high)), np.append(sigmas, high - low)
    pairs, pair_of = np.unique(mu + 1j * sigma, return_inverse=True) if step else (mu + 1j * sigma, None)
    norm = log_gauss_mass((low - pairs.real) / pairs.imag, (high - pairs.real) / pairs.imag)
    return _Numeric(mu, sigma, low, high, step, bool(dist.log), float(dist.low), float(dist.high), pairs, pair_of, norm)


def _categorical(observed: np.ndarray, dist: CategoricalDistribution) -> np.ndarray:
    """log probability of each choice (rows) under each kernel (columns: one per observation, then the
    prior's): a one-hot smoothed by the prior."""
    n_kernels, n_choices = len(observed) + 1, len(dist.choices)
    weights = np.full((n_kernels, n_choices), PRIOR_WEIGHT / n_kernels)
    weights[np.arange(len(observed)), observed.astype(int)] += 1.0
    return np.log(weights / weights.sum(axis=1, keepdims=True)).T


def _sample_numeric(part: _Numeric, active: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    mu, sigma = part.mu[active], part.sigma[active]
    lo, hi = ndtr((part.low - mu) / sigma), ndtr((part.high - mu) / sigma)
    z = ndtri(lo + rng.random(len(active)) * (hi - lo))  # inverse CDF of the truncated Gaussian
    value = np.clip(mu + sigma * z, part.low, part.high)
    value = np.exp(value) if part.log else value
    if part.step:
        value = part.raw_low + np.round((value - part.raw_low) / part.step) * part.step
    return np.clip(value, part.raw_low, part.raw_high)


def _numeric_log_pdf(part: _Numeric, x: np.ndarray) -> np.ndarray:
    """log density (continuous) or log mass of the step's bin (discrete) of each x under each kernel."""
    if not part.step:
        z = ((np.log(x) if part.log else x)[:, None] - part.mu) / part.sigma
        return -0.5 * z * z - _LOG_SQRT_2PI - np.log(part.sigma) - part.log_norm
    # Few distinct values and few distinct kernels: the masses are computed once for each pair.
    values, value_of = np.unique(x, return_inverse=True)
    lo, hi = values - part.step / 2, values + part.step / 2
    if part.log:
        lo, hi = np.log(lo), np.log(hi)
    mu, sigma = part.pairs.real, part.pairs.imag
    mass = log_gauss_mass((lo[:, None] - mu) / sigma, (hi[:, None] - mu) / sigma) - part.log_norm
    return np.take(mass, part.pair_of, axis=1)[value_of]


class ParzenMixture:
    """A product-of-kernels mixture over a group's params: one kernel per observation and a prior's.

    ``observed``: (n, d) internal values (categorical: choice index; log params unlogged) in trial order;
    ``weights``: n weights of the observations (the prior's is :data:`PRIOR_WEIGHT`)."""

    def __init__(self, observed: np.ndarray, dists: Sequence[BaseDistribution], weights: np.ndarray) -> None:
        w = np.append(weights, PRIOR_WEIGHT) if len(observed) else np.ones(1)
        self.weights = w / w.sum()
        self.parts = [
            _categorical(observed[:, j], d) if isinstance(d, CategoricalDistribution) else _numeric(observed[:, j], d)
            for j, d in enumerate(dists)
        ]

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` draws, (size, d) internal values."""
        active = rng.choice(len(self.weights), p=self.weights, size=size)
        out = np.empty((size, len(self.parts)))
        for j, part in enumerate(self.parts):
            if isinstance(part, _Numeric):
                out[:, j] = _sample_numeric(part, active, rng)
                continue
            cumulative = np.cumsum(np.exp(part[:, active].T), axis=1)
            cumulative[:, -1] = 1.0
            out[:, j] = (cumulative < rng.random(size)[:, None]).sum(axis=1)
        return out

    def log_pdf(self, x: np.ndarray) -> np.ndarray:
        """log density of each row of ``x`` (n, d)."""
        total = np.broadcast_to(np.log(self.weights), (len(x), len(self.weights))).copy()
        for j, part in enumerate(self.parts):
            if isinstance(part, _Numeric):
                total += _numeric_log_pdf(part, x[:, j])
            else:
                total += part[x[:, j].astype(int)]
        top = total.max(axis=1)
        top[np.isneginf(top)] = 0.0
        return np.log(np.exp(total - top[:, None]).sum(axis=1)) + top
