"""Synthetic training problems for :mod:`.convergence`: :func:`make_problem` generates one from a seed
(least squares with set conditioning and label noise, L2-regularised logistic regression, or a two-layer tanh
network fitted to a teacher of the same shape), its data split into one shard per worker, non-IID by
``heterogeneity``; :class:`Problem` holds the data, the shards, the loss and gradient (the kernels of
:mod:`trainscale.kernels.optim`) and the exact optimum where one is known (:func:`least_squares_optimum`,
:func:`logistic_optimum`). Also the seed handling every run shares (:func:`_seed_sequence`).

Data model. Features of worker ``k``: ``x = mu_k + Q diag(sqrt(lambda)) z`` with ``z`` standard
normal, ``Q`` a random rotation and ``lambda`` spaced geometrically from ``1/kappa`` to 1 (the
covariance's condition number is ``kappa``). Worker ``k`` labels with its own teacher
``theta_k = theta* + heterogeneity * delta_k``; the ``delta_k`` (centred over workers, so the
pooled teacher stays ``theta*``) are as large as ``theta*`` per coordinate, and the covariate shift
``mu_k = heterogeneity * Q diag(sqrt(lambda)) z_k`` is one standard deviation of the data.
``heterogeneity = 0`` gives identically distributed shards. Labels: least squares
``y = x . w_k + sigma eps``; logistic ``y = +1`` with probability ``s(x . w_k)``, else ``-1``;
network ``y = teacher_k(x) + sigma eps``. ``|w*| = 1`` for least squares, ``|w*| = 3`` for logistic
(labels stay random, so the data are not separable); the teacher network has
``W1 ~ N(0, 1/d)``, ``b1 ~ N(0, 0.1^2)``, ``a ~ N(0, 1/h)``, ``b2 = 0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..common.checks import check_choice as _check_choice
from ..common.checks import check_float as _check_float
from ..common.checks import check_int as _check_int
from ..kernels import objectives
from ..kernels import optim as K
from ..model.specs import SpecError

__all__ = ["KINDS", "Problem", "make_problem", "least_squares_optimum", "logistic_optimum"]

KINDS = {"least_squares": objectives.LEAST_SQUARES, "logistic": objectives.LOGISTIC, "two_layer": objectives.TWO_LAYER}


# ---------------------------------------------------------------------------------------------
# validation helpers


def _seed_sequence(seed) -> np.random.SeedSequence:
    """An int, a SeedSequence, or a Generator (from which a fresh SeedSequence's entropy is drawn)."""
    if isinstance(seed, np.random.SeedSequence):
        return seed
    if isinstance(seed, np.random.Generator):
        return np.random.SeedSequence([int(v) for v in seed.integers(0, 2**63, size=4)])
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise SpecError("seed", seed, "expected a non-negative integer, a numpy SeedSequence or Generator")
    return np.random.SeedSequence(int(seed))


def _seed_attr(seed):
    return int(seed) if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) else None


# ---------------------------------------------------------------------------------------------
# problems


@dataclass(frozen=True, eq=False)
class Problem:
    """A generated training problem: data, shards, and what is known of its optimum.

    ``X`` (``n x d``) and ``y`` (``n``) hold all workers' data, worker ``k`` owning rows
    ``shard_offsets[k]:shard_offsets[k+1]``. ``teacher`` is the pooled teacher ``theta*`` and
    ``worker_teachers`` (``W x p``) each shard's. ``optimum`` is the exact minimiser of the pooled
    objective (closed form for least squares, Newton's method to machine precision for logistic
    regression; None for the network), ``optimum_loss`` its loss (for the network: the noise
    floor ``sigma^2 / 2``, the loss of the teacher on noise-free predictions).
    """

    kind: str
    X: np.ndarray
    y: np.ndarray
    shard_offsets: np.ndarray
    dim: int
    hidden: int
    lam: float
    sigma: float
    kappa: float
    heterogeneity: float
    teacher: np.ndarray
    worker_teachers: np.ndarray
    eigenvalues: np.ndarray
    optimum: np.ndarray | None
    optimum_loss: float
    parameters: dict = field(default_factory=dict)

    @property
    def code(self) -> int:
        return KINDS[self.kind]

    @property
    def workers(self) -> int:
        return len(self.shard_offsets) - 1

    @property
    def n_samples(self) -> int:
        return self.X.shape[0]

    @property
    def n_params(self) -> int:
        return int(objectives.n_params(self.code, self.dim, self.hidden))

    def shard(self, k: int) -> slice:
        return slice(int(self.shard_offsets[k]), int(self.shard_offsets[k + 1]))

    def loss(self, params, idx=None) -> float:
        """Objective on the examples ``idx`` (default: the whole pooled dataset)."""
        params = np.ascontiguousarray(params, dtype=np.float64)
        idx = np.arange(self.n_samples) if idx is None else np.ascontiguousarray(idx, dtype=np.int64)
        return float(objectives.batch_loss(self.code, self.hidden, self.lam, params, self.X, self.y, idx,
                                  np.empty(max(self.hidden, 1))))

    def grad(self, params, idx=None) -> np.ndarray:
        """Gradient of :meth:`loss`."""
        params = np.ascontiguousarray(params, dtype=np.float64)
        idx = np.arange(self.n_samples) if idx is None else np.ascontiguousarray(idx, dtype=np.int64)
        out = np.empty_like(params)
        objectives.batch_grad(self.code, self.hidden, self.lam, params, self.X, self.y, idx, out,
                     np.empty(max(self.hidden, 1)))
        return out

    def initial_params(self, seed=0, scale: float = 1.0) -> np.ndarray:
        """Starting point: zeros for linear models; for the network a random one with the
        teacher's scales (``scale`` times), so tanh units are not symmetric."""
        if self.kind != "two_layer":
            return np.zeros(self.n_params)
        rng = np.random.default_rng(_seed_sequence(seed))
        return scale * _random_network(rng, self.dim, self.hidden)


def _random_network(rng, d, h):
    w1 = rng.normal(0.0, 1.0 / math.sqrt(d), size=h * d)
    b1 = rng.normal(0.0, 0.1, size=h)
    a = rng.normal(0.0, 1.0 / math.sqrt(h), size=h)
    return np.concatenate([w1, b1, a, [0.0]])


def _network_out(theta, X, h):
    d = X.shape[1]
    w1 = theta[: h * d].reshape(h, d)
    b1 = theta[h * d: h * d + h]
    a = theta[h * d + h: h * d + 2 * h]
    return np.tanh(X @ w1.T + b1) @ a + theta[-1]


def make_problem(kind: str, n_samples: int, dim: int, workers: int = 1, heterogeneity: float = 0.0,
                 seed=0, *, kappa: float = 1.0, sigma: float = 0.1, lam: float | None = None,
                 hidden: int = 8) -> Problem:
    """Generate a problem (see the module docstring for the data model).

    ``kind``: ``least_squares``, ``logistic`` or ``two_layer``; ``n_samples`` in all, split into
    ``workers`` shards of (nearly) equal size; ``kappa >= 1`` the condition number of the feature
    covariance; ``sigma`` the label-noise standard deviation (unused by ``logistic``); ``lam``
    the L2 coefficient (default 0, and 1e-2 for ``logistic`` where it must be > 0);
    ``hidden`` the width of the network.
    """
    _check_choice("kind", kind, tuple(KINDS))
    n = _check_int("n_samples", n_samples, 2)
    d = _check_int("dim", dim, 1)
    W = _check_int("workers", workers, 1, n)
    het = _check_float("heterogeneity", heterogeneity, 0.0, 1.0)
    kappa = _check_float("kappa", kappa, 1.0, 1e12)
    sigma = _check_float("sigma", sigma, 0.0, 1e6)
    h = _check_int("hidden", hidden, 1)
    if lam is None:
        lam = 1e-2 if kind == "logistic" else 0.0
    lam = _check_float("lam", lam, 0.0, 1e6, open_min=(kind == "logistic"))
    ss = _seed_sequence(seed)
    shared, *worker_ss = ss.spawn(W + 1)
    rng = np.random.default_rng(shared)

    eig = np.geomspace(1.0 / kappa, 1.0, d)[::-1].copy()
    q, r = np.linalg.qr(rng.normal(size=(d, d)))
    Q = q * np.sign(np.diag(r))  # Haar-distributed rotation
    L = Q * np.sqrt(eig)  # x = L z has covariance Q diag(eig) Q^T

    if kind == "two_layer":
        teacher = _random_network(rng, d, h)
    else:
        teacher = rng.normal(size=d)
        teacher *= (1.0 if kind == "least_squares" else 3.0) / np.linalg.norm(teacher)
    p = teacher.size
    per_coord = np.linalg.norm(teacher) / math.sqrt(p)
    deltas = rng.normal(0.0, per_coord, size=(W, p))
    mus = rng.normal(size=(W, d)) @ L.T
    if W > 1:
        deltas -= deltas.mean(axis=0)
        mus -= mus.mean(axis=0)
    else:
        deltas[:] = 0.0
        mus[:] = 0.0
    worker_teachers = teacher + het * deltas

    offsets = np.linspace(0, n, W + 1).round().astype(np.int64)
    X = np.empty((n, d))
    y = np.empty(n)
    for k in range(W):
        wr = np.random.default_rng(worker_ss[k])
        sl = slice(offsets[k], offsets[k + 1])
        m = offsets[k + 1] - offsets[k]
        Xk = het * mus[k] + wr.normal(size=(m, d)) @ L.T
        if kind == "least_squares":
            yk = Xk @ worker_teachers[k] + sigma * wr.normal(size=m)
        elif kind == "logistic":
            prob = 1.0 / (1.0 + np.exp(-(Xk @ worker_teachers[k])))
            yk = np.where(wr.random(m) < prob, 1.0, -1.0)
        else:
            yk = _network_out(worker_teachers[k], Xk, h) + sigma * wr.normal(size=m)
        X[sl] = Xk
        y[sl] = yk

    params = dict(kind=kind, n_samples=n, dim=d, workers=W, heterogeneity=het, kappa=kappa,
                  sigma=sigma, lam=lam, hidden=h, seed=_seed_attr(seed))
    prob = Problem(kind, X, y, offsets, d, h, lam, sigma, kappa, het, teacher, worker_teachers,
                   eig, None, math.nan, params)
    if kind == "least_squares":
        optimum = least_squares_optimum(X, y, lam)
        object.__setattr__(prob, "optimum", optimum)
        object.__setattr__(prob, "optimum_loss", prob.loss(optimum))
    elif kind == "logistic":
        optimum = logistic_optimum(X, y, lam)
        object.__setattr__(prob, "optimum", optimum)
        object.__setattr__(prob, "optimum_loss", prob.loss(optimum))
    else:
        object.__setattr__(prob, "optimum_loss", 0.5 * sigma * sigma)
    return prob


def least_squares_optimum(X, y, lam=0.0) -> np.ndarray:
    """Closed form: ``(X^T X / n + lam I) w = X^T y / n``."""
    n, d = X.shape
    return np.linalg.solve(X.T @ X / n + lam * np.eye(d), X.T @ y / n)


def logistic_optimum(X, y, lam, tol=1e-14, max_iter=100) -> np.ndarray:
    """Minimiser of the L2-regularised logistic loss by Newton's method (quadratic convergence)."""
    n, d = X.shape
    w = np.zeros(d)
    for _ in range(max_iter):
        m = y * (X @ w)
        s = 0.5 * (1.0 - np.tanh(0.5 * m))  # 1 / (1 + exp(m))
        g = -(X.T @ (y * s)) / n + lam * w
        if np.linalg.norm(g) < tol:
            break
        hess = (X.T * (s * (1.0 - s))) @ X / n + lam * np.eye(d)
        w = w - np.linalg.solve(hess, g)
    return w
