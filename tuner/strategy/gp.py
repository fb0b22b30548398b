"""A small Gaussian process in numpy: Matern-5/2 kernel with one length scale per input column.

Inputs are encoded configs (:mod:`tuner.strategy.encoding`), targets standardised by the caller.
Hyperparameters (log length scales, log signal variance, log noise) maximise the marginal
likelihood plus a weak log-normal prior on the length scales, by L-BFGS-B with the analytic
gradient; fitting is deterministic for given data (always from the same start).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from scipy.linalg import cho_factor, cho_solve, solve_triangular
from scipy.optimize import minimize
from scipy.special import erfc


@functools.cache
def _blas_controller() -> object | None:
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # optional: without it BLAS keeps its own thread count
        return None
    return ThreadpoolController()


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run the enclosed numpy / scipy linear algebra on one BLAS thread.

    The matrices here are at most a few hundred rows: BLAS threads only spin against each other and against
    the engine's other work. On a busy 2-core machine a proposal at 400 trials took 330 ms with OpenBLAS's
    default threads and 18 ms with one (the same process, the same seed).
    """
    controller = _blas_controller()
    if controller is None:
        yield
        return
    with controller.limit(limits=1, user_api="blas"):  # type: ignore[attr-defined]
        yield


SQRT5 = math.sqrt(5.0)
LOG_LS_BOUNDS = (math.log(0.03), math.log(20.0))
LOG_SF2_BOUNDS = (math.log(0.05), math.log(20.0))
LOG_NOISE_BOUNDS = (math.log(1e-6), math.log(0.5))
LS_PRIOR_MEAN, LS_PRIOR_SD = math.log(0.5), 1.0
JITTER = 1e-8


@dataclass(frozen=True)
class Hyper:
    """Kernel hyperparameters: length scales (per column, in encoded units), signal and noise variances."""

    lengthscales: np.ndarray
    signal_var: float
    noise_var: float

    @classmethod
    def default(cls, width: int) -> Hyper:
        return cls(np.full(width, 0.5), 1.0, 1e-3)


def sqdist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances between the rows of ``a`` and of ``b``."""
    d = a @ b.T
    d *= -2.0
    d += (a * a).sum(1)[:, None]
    d += (b * b).sum(1)[None, :]
    return np.maximum(d, 0.0, out=d)


def matern52(a: np.ndarray, b: np.ndarray, hyper: Hyper) -> np.ndarray:
    """Kernel matrix between rows of ``a`` and ``b``."""
    return _matern_scaled(a / hyper.lengthscales, b / hyper.lengthscales, hyper.signal_var)


def _matern_scaled(a: np.ndarray, b: np.ndarray, signal_var: float) -> np.ndarray:
    """Matern-5/2 of inputs already divided by the length scales, computed in place: with s = sqrt(5) r,
    sf2 (1 + s + s^2 / 3) e^-s (a candidate set times the history is the largest array of a proposal)."""
    s2 = sqdist(a, b)
    s2 *= 5.0
    s = np.sqrt(s2)
    s2 *= 1.0 / 3.0
    s2 += s
    s2 += 1.0
    np.negative(s, out=s)
    np.exp(s, out=s)
    s2 *= s
    s2 *= signal_var
    return s2


def _neg_log_likelihood(
    theta: np.ndarray, X: np.ndarray, y: np.ndarray, extra_noise: np.ndarray | None = None
) -> tuple[float, np.ndarray]:
    d = X.shape[1]
    ls, sf2, noise = np.exp(theta[:d]), math.exp(theta[d]), math.exp(theta[d + 1])
    Xs = X / ls
    r = np.sqrt(sqdist(Xs, Xs))
    e = np.exp(-SQRT5 * r)
    K = sf2 * (1.0 + SQRT5 * r + (5.0 / 3.0) * r * r) * e
    n = len(y)
    Kn = K + (noise + JITTER) * np.eye(n)
    if extra_noise is not None:  # rows known to be noisier (priors measured elsewhere): a constant of theta
        Kn[np.diag_indices_from(Kn)] += extra_noise
    try:
        factor = cho_factor(Kn, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        return 1e10, np.zeros_like(theta)
    alpha = cho_solve(factor, y, check_finite=False)
    logdet = 2.0 * np.log(np.diag(factor[0])).sum()
    prior = 0.5 * (((theta[:d] - LS_PRIOR_MEAN) / LS_PRIOR_SD) ** 2).sum()
    nll = 0.5 * y @ alpha + 0.5 * logdet + 0.5 * n * math.log(2 * math.pi) + prior
    W = np.outer(alpha, alpha) - cho_solve(factor, np.eye(n), check_finite=False)
    grad = np.empty_like(theta)
    # dK/dlog(l_j) = sf2 * 5/3 * (1 + sqrt5 r) e^{-sqrt5 r} * (x_ij - x_kj)^2 / l_j^2
    B = W * (sf2 * (5.0 / 3.0) * (1.0 + SQRT5 * r) * e)
    rows = B.sum(1)
    grad[:d] = -0.5 * (2.0 * rows @ (Xs * Xs) - 2.0 * (Xs * (B @ Xs)).sum(0))
    grad[:d] += (theta[:d] - LS_PRIOR_MEAN) / LS_PRIOR_SD**2
    grad[d] = -0.5 * (W * K).sum()
    grad[d + 1] = -0.5 * noise * np.trace(W)
    return float(nll), grad


def fit(X: np.ndarray, y: np.ndarray, max_iter: int = 60, extra_noise: np.ndarray | None = None) -> Hyper:
    """Hyperparameters that maximise the (penalised) marginal likelihood of standardised ``y`` at ``X``;
    ``extra_noise``: a noise variance per row added to the fitted one (rows measured elsewhere)."""
    d = X.shape[1]
    start = Hyper.default(d)
    theta0 = np.concatenate([np.log(start.lengthscales), [math.log(start.signal_var), math.log(start.noise_var)]])
    bounds = [LOG_LS_BOUNDS] * d + [LOG_SF2_BOUNDS, LOG_NOISE_BOUNDS]
    result = minimize(
        _neg_log_likelihood,
        theta0,
        args=(X, y, extra_noise),
        jac=True,
        method="L-BFGS-B",
        bounds=bounds,
        options={"maxiter": max_iter},
    )
    theta = result.x if np.all(np.isfinite(result.x)) else theta0
    return Hyper(np.exp(theta[:d]), float(math.exp(theta[d])), float(math.exp(theta[d + 1])))


class Posterior:
    """The GP conditioned on ``(X, y)``: mean and standard deviation at new points. ``extra_noise``: a
    noise variance per row on top of the kernel's (rows measured elsewhere count for less)."""

    def __init__(self, X: np.ndarray, y: np.ndarray, hyper: Hyper, extra_noise: np.ndarray | None = None) -> None:
        self.X, self.hyper = X, hyper
        self._Xs = X / hyper.lengthscales
        K = _matern_scaled(self._Xs, self._Xs, hyper.signal_var)
        K[np.diag_indices_from(K)] += hyper.noise_var + JITTER
        if extra_noise is not None:
            K[np.diag_indices_from(K)] += extra_noise
        self.L = np.linalg.cholesky(K)
        self.alpha = cho_solve((self.L, True), y, check_finite=False)

    def predict(self, Xq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        Ks = _matern_scaled(Xq / self.hyper.lengthscales, self._Xs, self.hyper.signal_var)
        mean = Ks @ self.alpha
        v = solve_triangular(self.L, Ks.T, lower=True, check_finite=False, overwrite_b=True)
        var = self.hyper.signal_var - np.einsum("ij,ij->j", v, v)
        return mean, np.sqrt(np.maximum(var, 1e-12))


def log_expected_improvement(mean: np.ndarray, std: np.ndarray, best: float) -> np.ndarray:
    """log E[max(f - best, 0)] for f ~ N(mean, std^2), stable far in the tail (maximisation)."""
    z = (mean - best) / std
    # EI = std * (z Phi(z) + phi(z)); for z << 0 use the asymptotic phi(z) / z^2 to stay finite in logs
    phi = np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    cdf = 0.5 * erfc(-z / math.sqrt(2))
    h = z * cdf + phi
    tail = z < -6
    safe = np.where(tail, 1.0, h)
    log_h = np.where(
        tail,
        -0.5 * z * z - math.log(math.sqrt(2 * math.pi)) - 2.0 * np.log(np.abs(z) + 1e-300),
        np.log(np.maximum(safe, 1e-300)),
    )
    return np.log(std) + log_h
