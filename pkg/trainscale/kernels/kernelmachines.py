r"""Numba kernels of random-feature kernel machines trained by block-splitting ADMM (Avron & Sindhwani,
arXiv 1409.0940; Parikh & Boyd's block splitting). Called through :mod:`trainscale.workloads.kernelmachines`.

Random Fourier features of the Gaussian kernel :math:`k(x, x') = \exp(-\|x - x'\|^2 / 2\sigma^2)`:
with :math:`\omega_j \sim N(0, \sigma^{-2} I)` and :math:`b_j \sim U[0, 2\pi)`,

.. math:: z_j(x) = \sqrt{2/D}\,\cos(\omega_j^\top x + b_j),\qquad
          \mathbb{E}\left[z(x)^\top z(x')\right] = k(x, x')

(Rahimi & Recht 2007), so ``Z Z^T`` approximates the kernel matrix ``K`` with a Monte Carlo error
:math:`O(D^{-1/2})`.

The model: :math:`\min_W \tfrac12\|Z W - T\|_F^2 + \tfrac{\lambda}{2}\|W\|_F^2` (squared loss summed over the
examples, ``W`` of ``D x k``). Examples are split over ``P`` workers (rows ``Z_i``), features over ``J`` blocks
(columns ``Z_{ij}``, one thread each). One iteration, with :math:`\rho` the ADMM penalty (the paper: 1):

* broadcast :math:`\bar W`; every worker: :math:`O_i = \mathrm{prox}_{f/\rho}(\bar O_i - \nu_i) =
  (T_i + \rho(\bar O_i - \nu_i)) / (1 + \rho)` (the proximal step on the loss);
* every block: project :math:`(\bar W_J - \mu_{iJ},\ y_{ij} + \nu_i)` on the graph :math:`y = Z_{ij} x`:
  :math:`W_{iJ} = (Z_{ij}^\top Z_{ij} + I)^{-1}(\bar W_J - \mu_{iJ} + Z_{ij}^\top y_{ij} + Z_{ij}^\top \nu_i)`,
  by the Cholesky factor of :math:`Z_{ij}^\top Z_{ij} + I` computed once (the cached block solve), then
  :math:`o_j = Z_{ij} W_{iJ}`;
* exchange: :math:`s = O_i - \sum_j o_j`, :math:`y_{ij} = o_j + s/(J+1)`, :math:`\bar O_i = O_i - s/(J+1)`,
  :math:`\nu_i \mathrel{+}= s/(J+1)` (only :math:`Z_{ij}^\top y_{ij}` is kept: ``D x k`` per worker, not
  ``n_i x k`` per block, the paper's memory reorganisation);
* master: :math:`W_0 = \mathrm{prox}_{g/\rho}(\bar W - \mu) = \rho(\bar W - \mu)/(\lambda + \rho)`;
  reduce :math:`\bar W = (W_0 + \sum_i W_i)/(P + 1)`; :math:`\mu \mathrel{+}= W_0 - \bar W`,
  :math:`\mu_i \mathrel{+}= W_i - \bar W`.

Parallel loops (``prange``) run over feature blocks or rows; every sum is inside one iteration of a
``prange`` (no reduction variable crosses iterations).
"""

import math

import numpy as np
from numba import njit, prange


@njit(cache=True, parallel=True)
def rff_features(X, omega, phase, out):
    """``out[i, j] = sqrt(2/D) cos(X[i] . omega[:, j] + phase[j])`` for ``X`` (n x d), ``omega`` (d x D)."""
    n, d = X.shape
    D = omega.shape[1]
    scale = math.sqrt(2.0 / D)
    for i in prange(n):
        for j in range(D):
            acc = phase[j]
            for a in range(d):
                acc += X[i, a] * omega[a, j]
            out[i, j] = scale * math.cos(acc)


@njit(cache=True, parallel=True)
def gaussian_kernel(X1, X2, sigma, out):
    """``out[i, j] = exp(-||X1[i] - X2[j]||^2 / (2 sigma^2))``."""
    n1, d = X1.shape
    n2 = X2.shape[0]
    inv = 1.0 / (2.0 * sigma * sigma)
    for i in prange(n1):
        for j in range(n2):
            acc = 0.0
            for a in range(d):
                diff = X1[i, a] - X2[j, a]
                acc += diff * diff
            out[i, j] = math.exp(-acc * inv)


@njit(cache=True)
def cholesky_shifted(Zb, L):
    """Lower Cholesky factor ``L`` of ``Zb^T Zb + I`` (``Zb``: n_i x D_j; the Gram matrix accumulated row by
    row of ``Zb``, which is stored by rows)."""
    n, m = Zb.shape
    for a in range(m):
        for b in range(m):
            L[a, b] = 1.0 if a == b else 0.0
    for r in range(n):
        for a in range(m):
            za = Zb[r, a]
            for b in range(a + 1):
                L[a, b] += za * Zb[r, b]
    for a in range(m):
        for b in range(a + 1):
            acc = L[a, b]
            for c in range(b):
                acc -= L[a, c] * L[b, c]
            if a == b:
                L[a, a] = math.sqrt(acc)
            else:
                L[a, b] = acc / L[b, b]


@njit(cache=True)
def cholesky_solve(L, rhs):
    """Solve ``L L^T x = rhs`` in place (``rhs``: m x k): forward then back substitution, 2 m^2 k flops."""
    m, k = rhs.shape
    for c in range(k):
        for a in range(m):
            acc = rhs[a, c]
            for b in range(a):
                acc -= L[a, b] * rhs[b, c]
            rhs[a, c] = acc / L[a, a]
        for a in range(m - 1, -1, -1):
            acc = rhs[a, c]
            for b in range(a + 1, m):
                acc -= L[b, a] * rhs[b, c]
            rhs[a, c] = acc / L[a, a]


@njit(cache=True, parallel=True)
def factor_blocks(Z, rows, cols, factors):
    """The cached block solves: ``factors[i][j]`` = Cholesky of ``Z_ij^T Z_ij + I`` for worker ``i`` (rows
    ``rows[i]:rows[i+1]``) and block ``j`` (columns ``cols[j]:cols[j+1]``); ``factors``: P x J x m x m
    (``m`` = the largest block, the rest left zero). One task per (worker, block)."""
    P = rows.size - 1
    J = cols.size - 1
    for t in prange(P * J):
        i = t // J
        j = t - i * J
        m = cols[j + 1] - cols[j]
        cholesky_shifted(Z[rows[i]:rows[i + 1], cols[j]:cols[j + 1]], factors[i, j, :m, :m])


@njit(cache=True, parallel=True)
def worker_step(Z, T, rows, i, cols, factors, Wbar, rho, mu, ZtY, Obar, nu, W, O, o):
    """One worker's part of an iteration (everything between the broadcast and the reduce), in place.

    Worker ``i`` holds rows ``rows[i]:rows[i+1]`` of ``Z`` and ``T``. Updated: ``mu[i]`` (gets ``+ W[i]``; the
    ``- Wbar`` follows the reduce), ``ZtY[i]`` (``Z_ij^T y_ij`` stacked over blocks), ``Obar``, ``nu`` and
    ``O`` (rows of this worker), ``W[i]`` (its copy of the weights). ``o``: J x n_max x k scratch."""
    r0 = rows[i]
    n = rows[i + 1] - r0
    J = cols.size - 1
    k = T.shape[1]
    for r in prange(n):  # proximal step on the squared loss
        for c in range(k):
            O[r0 + r, c] = (T[r0 + r, c] + rho * (Obar[r0 + r, c] - nu[r0 + r, c])) / (1.0 + rho)
    for j in prange(J):  # graph projection per feature block: the cached solve
        c0 = cols[j]
        m = cols[j + 1] - c0
        rhs = np.empty((m, k))
        for a in range(m):
            for c in range(k):
                rhs[a, c] = Wbar[c0 + a, c] - mu[i, c0 + a, c] + ZtY[i, c0 + a, c]
        for r in range(n):  # + Z_ij^T nu_i, row by row of Z
            for a in range(m):
                z = Z[r0 + r, c0 + a]
                for c in range(k):
                    rhs[a, c] += z * nu[r0 + r, c]
        cholesky_solve(factors[i, j, :m, :m], rhs)
        for a in range(m):
            for c in range(k):
                W[i, c0 + a, c] = rhs[a, c]
                mu[i, c0 + a, c] += rhs[a, c]
        for r in range(n):
            for c in range(k):
                acc = 0.0
                for a in range(m):
                    acc += Z[r0 + r, c0 + a] * rhs[a, c]
                o[j, r, c] = acc
    inv = 1.0 / (J + 1.0)
    for r in prange(n):  # exchange: s = O - sum_j o_j, kept in o[., r, .] as y_ij = o_j + s / (J + 1)
        for c in range(k):
            s = O[r0 + r, c]
            for j in range(J):
                s -= o[j, r, c]
            for j in range(J):
                o[j, r, c] += s * inv
            Obar[r0 + r, c] = O[r0 + r, c] - s * inv
            nu[r0 + r, c] += s * inv
    for j in prange(J):  # keep Z_ij^T y_ij only
        c0 = cols[j]
        m = cols[j + 1] - c0
        for a in range(m):
            for c in range(k):
                ZtY[i, c0 + a, c] = 0.0
        for r in range(n):
            for a in range(m):
                z = Z[r0 + r, c0 + a]
                for c in range(k):
                    ZtY[i, c0 + a, c] += z * o[j, r, c]


@njit(cache=True)
def master_step(Wbar, W, mu, mu_workers, lam, rho):
    """The regulariser's proximal step, the average of the ``P`` worker copies and its own, and the
    consensus duals; ``Wbar`` is replaced by the new average (what the reduce delivers)."""
    D, k = Wbar.shape
    P = W.shape[0]
    for a in range(D):
        for c in range(k):
            w0 = rho * (Wbar[a, c] - mu[a, c]) / (lam + rho)
            total = w0
            for i in range(P):
                total += W[i, a, c]
            avg = total / (P + 1.0)
            Wbar[a, c] = avg
            mu[a, c] += w0 - avg
            for i in range(P):
                mu_workers[i, a, c] -= avg


@njit(cache=True)
def squared_norm(A):
    """:math:`\\|A\\|_F^2` of a matrix, summed row by row."""
    acc = 0.0
    for a in range(A.shape[0]):
        for c in range(A.shape[1]):
            acc += A[a, c] * A[a, c]
    return acc


@njit(cache=True)
def relative_distance(A, B, norm_B):
    """:math:`\\|A - B\\|_F / \\|B\\|_F` (``norm_B`` given), summed row by row."""
    acc = 0.0
    for a in range(A.shape[0]):
        for c in range(A.shape[1]):
            diff = A[a, c] - B[a, c]
            acc += diff * diff
    return math.sqrt(acc) / norm_B


def admm_run(Z, T, rows, cols, factors, lam, rho, iterations, Wbar, mu, mu_workers, ZtY, Obar, nu, W, O, o,
             W_ref, distance):
    """``iterations`` ADMM iterations from the given state (all arrays updated in place);
    ``distance[t]`` = ``||Wbar - W_ref||_F / ||W_ref||_F`` after iteration ``t``.

    Plain Python over cached kernels: a jitted caller of the parallel :func:`worker_step` cannot be cached
    (kernels/__init__.py), so it compiled again in every process that ran it (9-18 s on 2 cores); a Python
    loop of a few hundred iterations costs microseconds per call."""
    P = rows.size - 1
    ref = squared_norm(W_ref)
    ref = math.sqrt(ref) if ref > 0.0 else 1.0
    for t in range(iterations):
        for i in range(P):
            worker_step(Z, T, rows, i, cols, factors, Wbar, rho, mu_workers, ZtY, Obar, nu, W, O, o)
        master_step(Wbar, W, mu, mu_workers, lam, rho)
        distance[t] = relative_distance(Wbar, W_ref, ref)
