"""The gradient noise scale and the critical batch (McCandlish et al. 2018, arXiv 1812.06162):
:func:`gradient_noise_scale` estimates ``B_simple = tr(Sigma) / |G|^2`` (eq. 2.8) from per-example gradients of a
:class:`~.synthetic_problems.Problem`, and :func:`fit_critical_batch` fits ``S = S_min (1 + B_crit / B)``
(eq. 2.11) to steps to target against batch size, as :func:`.convergence.batch_size_sweep` measures them, so the
knee can be compared with ``B_simple``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .synthetic_problems import Problem, _seed_sequence
from ..common.checks import check_int as _check_int
from ..kernels import objectives
from ..kernels import optim as K
from ..model.specs import SpecError

__all__ = ["NoiseScale", "fit_critical_batch", "gradient_noise_scale"]


@dataclass(frozen=True)
class NoiseScale:
    """``B_simple = trace_sigma / grad_sq_norm`` at one point (McCandlish et al. 2018, eq. 2.8).

    ``trace_sigma``: trace of the per-example gradient covariance; ``grad_sq_norm``: ``|G|^2``
    of the true (pooled) gradient, both over the ``N`` examples of the dataset
    (``tr = (1/N) sum_i |g_i - G|^2``). They are exact when every example is used, otherwise
    unbiased estimates from ``m = n_examples`` examples drawn without replacement: with the
    sample covariance trace ``S2 = (1/(m-1)) sum |g_i - mean|^2``, ``tr = (N-1)/N S2`` and
    ``|G|^2 = |mean|^2 - (1 - m/N) S2 / m`` (finite-population corrections).
    """

    b_simple: float
    trace_sigma: float
    grad_sq_norm: float
    n_examples: int


def gradient_noise_scale(problem: Problem, params, seed=0, n_examples: int | None = None) -> NoiseScale:
    """Estimate ``B_simple`` at ``params`` from per-example gradients (see :class:`NoiseScale`)."""
    if not isinstance(problem, Problem):
        raise SpecError("problem", type(problem).__name__, "expected a convergence.Problem")
    params = np.ascontiguousarray(params, dtype=np.float64)
    if params.shape != (problem.n_params,):
        raise SpecError("params", params.shape, f"expected {problem.n_params} floats")
    n = problem.n_samples
    if n_examples is None or n_examples == n:
        idx = np.arange(n)
        exact = True
    else:
        m = _check_int("n_examples", n_examples, 2, n)
        idx = np.sort(np.random.default_rng(_seed_sequence(seed)).choice(n, size=m, replace=False))
        exact = False
    g = np.empty((idx.size, problem.n_params))
    objectives.per_example_grads(problem.code, problem.hidden, problem.lam, params, problem.X, problem.y,
                        idx.astype(np.int64), g)
    mean = g.mean(axis=0)
    sq = float(((g - mean) ** 2).sum())
    m = idx.size
    if exact:
        tr = sq / m
        gsq = float(mean @ mean)
    else:
        s2 = sq / (m - 1)
        tr = s2 * (n - 1) / n
        gsq = float(mean @ mean) - (1.0 - m / n) * s2 / m
    b = tr / gsq if gsq > 0 else math.inf
    return NoiseScale(b, tr, gsq, m)


def fit_critical_batch(batch_sizes, steps) -> tuple[float, float]:
    """Fit ``S = S_min (1 + B_crit / B)`` (McCandlish et al. eq. 2.11) by least squares of ``S``
    on ``1 / B``; returns ``(S_min, B_crit)``. Points with NaN steps are ignored."""
    b = np.asarray(batch_sizes, dtype=np.float64)
    s = np.asarray(steps, dtype=np.float64)
    ok = np.isfinite(s)
    if ok.sum() < 2:
        return math.nan, math.nan
    slope, intercept = np.polyfit(1.0 / b[ok], s[ok], 1)
    return float(intercept), float(slope / intercept) if intercept > 0 else math.nan
