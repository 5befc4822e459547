r"""Kernel machines at scale by random Fourier features and block-splitting ADMM (Avron & Sindhwani, "High-
performance Kernel Machines with Implicit Distributed Optimization and Randomization", arXiv 1409.0940; the
algorithm of libSkylark's ``ml/BlockADMM.hpp``).

The pieces (the maths is in :mod:`trainscale.kernels.kernelmachines`):

* :func:`make_problem`: a generated classification problem (Gaussian clusters, several per class), small
  enough for exact kernel ridge regression;
* :func:`random_features`, :func:`features`, :func:`gaussian_kernel`: random Fourier features of the
  Gaussian kernel and the exact kernel;
* :func:`exact_krr`, :func:`ridge_direct`: the exact kernel ridge regression and the direct ridge solve on
  the random features (the two references);
* :func:`admm_solve`: block-splitting ADMM (examples over ``workers``, feature blocks over threads, cached
  Cholesky block solves) in Numba, and :func:`admm_numpy`, the same iterations in plain NumPy;
* :func:`worker_iteration_time_s` (measured kernel time of one worker's iteration), :func:`iteration_flops`
  and :func:`comm_time_s` (the broadcast and the reduce of the ``D x k`` weights priced with the
  project's collectives, :func:`trainscale.kernels.collectives.allreduce_time`).

Loss and regulariser: squared loss summed over the examples, :math:`\tfrac{\lambda}{2}\|W\|_F^2`; targets are
the classes coded +1 (the class) / -1 (the others), prediction is the arg-max (libSkylark's coding).
"""

from __future__ import annotations

import time

import numpy as np

from ..common.checks import check_float, check_int
from ..kernels import kernelmachines as K
from ..model.specs import SpecError
from ..kernels.collectives import allreduce_time
from ..training.wallclock import Link

__all__ = ["make_problem", "random_features", "features", "gaussian_kernel", "exact_krr", "ridge_direct",
           "split_bounds", "admm_solve", "admm_numpy", "accuracy", "kernel_error", "worker_iteration_time_s",
           "iteration_flops", "comm_time_s", "BYTES_PER_VALUE"]

BYTES_PER_VALUE = 8  # float64 weights on the wire, as libSkylark's MPI reduce/broadcast of doubles


def _rng(seed) -> np.random.Generator:
    return np.random.default_rng(check_int("seed", seed, 0, 2**63 - 1))


def make_problem(n_train: int = 2000, n_test: int = 1000, dim: int = 8, classes: int = 3,
                 clusters_per_class: int = 4, spread: float = 1.0, centre_scale: float = 2.0,
                 seed: int = 0) -> dict:
    """A classification problem: ``classes * clusters_per_class`` cluster centres drawn from
    ``N(0, (centre_scale spread)^2 I_dim)``, each assigned to a class in turn; an example is a uniformly drawn cluster's
    centre plus ``N(0, spread^2 I_dim)`` noise, so that classes overlap and interleave (no linear separation).
    Returns ``X_train`` (n_train x dim), ``T_train`` (+1/-1 coding, n_train x classes), ``y_train``,
    ``X_test``, ``y_test``."""
    n_train = check_int("n_train", n_train, 2, 10**6)
    n_test = check_int("n_test", n_test, 1, 10**6)
    dim = check_int("dim", dim, 1, 10**4)
    classes = check_int("classes", classes, 2, 1000)
    clusters = check_int("clusters_per_class", clusters_per_class, 1, 1000)
    spread = check_float("spread", spread, 0.0, 1e6, open_min=True)
    centre_scale = check_float("centre_scale", centre_scale, 0.0, 1e6, open_min=True)
    rng = _rng(seed)
    centres = rng.normal(0.0, centre_scale * spread, size=(classes * clusters, dim))
    owner = np.arange(classes * clusters) % classes

    def draw(n):
        which = rng.integers(0, classes * clusters, size=n)
        return centres[which] + rng.normal(0.0, spread, size=(n, dim)), owner[which]

    X_train, y_train = draw(n_train)
    X_test, y_test = draw(n_test)
    T = -np.ones((n_train, classes))
    T[np.arange(n_train), y_train] = 1.0
    return {"X_train": X_train, "T_train": T, "y_train": y_train, "X_test": X_test, "y_test": y_test}


def random_features(dim: int, n_features: int, sigma: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(omega, phase) of ``n_features`` random Fourier features of the Gaussian kernel of width ``sigma``:
    ``omega ~ N(0, sigma^-2)`` (dim x n_features), ``phase ~ U[0, 2 pi)``."""
    dim = check_int("dim", dim, 1, 10**4)
    n_features = check_int("n_features", n_features, 1, 10**6)
    sigma = check_float("sigma", sigma, 0.0, 1e6, open_min=True)
    rng = _rng(seed)
    return rng.normal(0.0, 1.0 / sigma, size=(dim, n_features)), rng.uniform(0.0, 2.0 * np.pi, size=n_features)


def _matrix(name, X, cols=None) -> np.ndarray:
    X = np.ascontiguousarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] == 0 or (cols is not None and X.shape[1] != cols) or not np.isfinite(X).all():
        want = f"{cols} columns" if cols is not None else "columns"
        raise SpecError(name, f"array of shape {X.shape}", f"expected a finite 2-D array with rows and {want}")
    return X


def features(X, omega, phase) -> np.ndarray:
    """The random feature matrix ``Z`` (n x D) of the rows of ``X``."""
    omega = _matrix("omega", omega)
    X = _matrix("X", X, omega.shape[0])
    phase = np.ascontiguousarray(phase, dtype=np.float64)
    if phase.shape != (omega.shape[1],):
        raise SpecError("phase", f"array of shape {phase.shape}", f"expected {omega.shape[1]} phases")
    out = np.empty((X.shape[0], omega.shape[1]))
    K.rff_features(X, np.ascontiguousarray(omega), phase, out)
    return out


def gaussian_kernel(X1, X2, sigma: float) -> np.ndarray:
    """The exact Gaussian kernel matrix ``exp(-||x - x'||^2 / 2 sigma^2)``."""
    X1 = _matrix("X1", X1)
    X2 = _matrix("X2", X2, X1.shape[1])
    out = np.empty((X1.shape[0], X2.shape[0]))
    K.gaussian_kernel(X1, X2, check_float("sigma", sigma, 0.0, 1e6, open_min=True), out)
    return out


def exact_krr(X_train, T_train, X_test, sigma: float, lam: float) -> np.ndarray:
    """Predictions of exact kernel ridge regression: ``k(X_test, X_train) (K + lam I)^-1 T``."""
    lam = check_float("lam", lam, 0.0, 1e12, open_min=True)
    Kxx = gaussian_kernel(X_train, X_train, sigma)
    alpha = np.linalg.solve(Kxx + lam * np.eye(Kxx.shape[0]), _matrix("T_train", T_train))
    return gaussian_kernel(X_test, X_train, sigma) @ alpha


def ridge_direct(Z, T, lam: float) -> np.ndarray:
    """``argmin 1/2 ||Z W - T||^2 + lam/2 ||W||^2 = (Z^T Z + lam I)^-1 Z^T T`` (the dual form
    ``Z^T (Z Z^T + lam I)^-1 T`` when there are fewer examples than features)."""
    Z = _matrix("Z", Z)
    T = _matrix("T", T)
    if T.shape[0] != Z.shape[0]:
        raise SpecError("T", f"{T.shape[0]} rows", f"expected {Z.shape[0]} rows (one per row of Z)")
    lam = check_float("lam", lam, 0.0, 1e12, open_min=True)
    n, D = Z.shape
    if D <= n:
        return np.linalg.solve(Z.T @ Z + lam * np.eye(D), Z.T @ T)
    return Z.T @ np.linalg.solve(Z @ Z.T + lam * np.eye(n), T)


def accuracy(scores, labels) -> float:
    """Fraction of rows whose arg-max is the label."""
    return float(np.mean(np.argmax(scores, axis=1) == np.asarray(labels)))


def kernel_error(Z, Kxx) -> float:
    """``||Z Z^T - K||_F / ||K||_F``: how far the random features are from the exact kernel."""
    return float(np.linalg.norm(Z @ Z.T - Kxx) / np.linalg.norm(Kxx))


def split_bounds(total: int, parts: int, name: str = "parts") -> np.ndarray:
    """Boundaries of ``parts`` contiguous, nearly equal pieces of ``range(total)`` (``parts + 1`` integers)."""
    parts = check_int(name, parts, 1, total)
    return np.array([(p * total) // parts for p in range(parts + 1)], dtype=np.int64)


def _admm_setup(Z, T, lam, workers, blocks, rho):
    Z, T = _matrix("Z", Z), _matrix("T", T)
    if T.shape[0] != Z.shape[0]:
        raise SpecError("T", f"{T.shape[0]} rows", f"expected {Z.shape[0]} rows (one per row of Z)")
    lam = check_float("lam", lam, 0.0, 1e12, open_min=True)
    rho = check_float("rho", rho, 0.0, 1e6, open_min=True)
    rows = split_bounds(Z.shape[0], workers, "workers")
    cols = split_bounds(Z.shape[1], blocks, "blocks")
    return Z, T, lam, rho, rows, cols


def _state(P, n, D, k, J, n_max):
    return {"Wbar": np.zeros((D, k)), "mu": np.zeros((D, k)), "mu_workers": np.zeros((P, D, k)),
            "ZtY": np.zeros((P, D, k)), "Obar": np.zeros((n, k)), "nu": np.zeros((n, k)),
            "W": np.zeros((P, D, k)), "O": np.zeros((n, k)), "o": np.zeros((J, n_max, k))}


def admm_solve(Z, T, lam: float, workers: int = 1, blocks: int = 1, iterations: int = 100, rho: float = 1.0,
               W_ref=None) -> dict:
    """Block-splitting ADMM (Numba) on ``min 1/2 ||Z W - T||^2 + lam/2 ||W||^2``: the rows of ``Z`` split over
    ``workers``, its columns over ``blocks``; ``iterations`` iterations from zero. Returns ``W`` (the
    consensus weights) and ``distance`` (``||W_t - W_ref|| / ||W_ref||`` per iteration; ``W_ref`` defaults to
    the direct ridge solve)."""
    Z, T, lam, rho, rows, cols = _admm_setup(Z, T, lam, workers, blocks, rho)
    iterations = check_int("iterations", iterations, 1, 10**7)
    W_ref = ridge_direct(Z, T, lam) if W_ref is None else _matrix("W_ref", W_ref, T.shape[1])
    P, J = rows.size - 1, cols.size - 1
    m = int(np.max(np.diff(cols)))
    n_max = int(np.max(np.diff(rows)))
    factors = np.zeros((P, J, m, m))
    K.factor_blocks(Z, rows, cols, factors)
    s = _state(P, Z.shape[0], Z.shape[1], T.shape[1], J, n_max)
    distance = np.empty(iterations)
    K.admm_run(Z, T, rows, cols, factors, lam, rho, iterations, s["Wbar"], s["mu"], s["mu_workers"], s["ZtY"],
               s["Obar"], s["nu"], s["W"], s["O"], s["o"], W_ref, distance)
    return {"W": s["Wbar"], "distance": distance, "rows": rows, "cols": cols}


def admm_numpy(Z, T, lam: float, workers: int = 1, blocks: int = 1, iterations: int = 100,
               rho: float = 1.0) -> np.ndarray:
    """The same iterations as :func:`admm_solve` in plain NumPy (block inverses by ``numpy.linalg.solve``):
    the reference the kernel is checked against. Returns the consensus weights."""
    Z, T, lam, rho, rows, cols = _admm_setup(Z, T, lam, workers, blocks, rho)
    P, J, (D, k) = rows.size - 1, cols.size - 1, (Z.shape[1], T.shape[1])
    blk = [[Z[rows[i]:rows[i + 1], cols[j]:cols[j + 1]] for j in range(J)] for i in range(P)]
    gram = [[b.T @ b + np.eye(b.shape[1]) for b in row] for row in blk]
    Wbar, mu = np.zeros((D, k)), np.zeros((D, k))
    mu_w, ZtY, W = np.zeros((P, D, k)), np.zeros((P, D, k)), np.zeros((P, D, k))
    Obar, nu = np.zeros(T.shape), np.zeros(T.shape)
    for _ in range(iterations):
        for i in range(P):
            r = slice(rows[i], rows[i + 1])
            O = (T[r] + rho * (Obar[r] - nu[r])) / (1.0 + rho)
            outs = []
            for j in range(J):
                c = slice(cols[j], cols[j + 1])
                W[i, c] = np.linalg.solve(gram[i][j], Wbar[c] - mu_w[i, c] + ZtY[i, c] + blk[i][j].T @ nu[r])
                mu_w[i, c] += W[i, c]
                outs.append(blk[i][j] @ W[i, c])
            s = (O - np.sum(outs, axis=0)) / (J + 1.0)
            for j in range(J):
                ZtY[i, cols[j]:cols[j + 1]] = blk[i][j].T @ (outs[j] + s)
            Obar[r], nu[r] = O - s, nu[r] + s
        W0 = rho * (Wbar - mu) / (lam + rho)
        Wbar = (W0 + W.sum(axis=0)) / (P + 1.0)
        mu += W0 - Wbar
        mu_w -= Wbar
    return Wbar


def iteration_flops(n_i: int, n_features: int, classes: int, blocks: int, input_dim: int = 0) -> float:
    """Floating-point operations of one worker's iteration (``n_i`` examples, all feature blocks): per
    block of ``m = D/J`` features, ``Z^T nu``, ``Z W``, ``Z^T y`` (2 n_i m k each) and the cached
    triangular solves (2 m^2 k). With ``input_dim = d > 0`` the random features are recomputed every
    iteration, ``Z = cos(X Omega + b)``: 2 n_i d D more (the product; the cosines are not counted), as
    libSkylark's ``BlockADMM`` does unless ``--cachetransforms`` is given; ``input_dim = 0`` keeps them."""
    m = n_features / blocks
    products = blocks * (3 * 2.0 * n_i * m * classes + 2.0 * m * m * classes)
    return float(products + 2.0 * n_i * input_dim * n_features)


def worker_iteration_time_s(n_i: int, n_features: int, classes: int, blocks: int, repeats: int = 5,
                            seed: int = 0) -> float:
    """Measured wall time (best of ``repeats``) of one worker's iteration in the Numba kernel for ``n_i``
    examples and ``n_features`` features in ``blocks`` blocks (random data: the time does not depend on
    the values), the broadcast and reduce excluded."""
    n_i = check_int("n_i", n_i, 1, 10**7)
    D = check_int("n_features", n_features, 1, 10**6)
    k = check_int("classes", classes, 1, 1000)
    repeats = check_int("repeats", repeats, 1, 1000)
    rng = _rng(seed)
    Z = rng.normal(size=(n_i, D)) / np.sqrt(D)
    T = rng.normal(size=(n_i, k))
    rows = np.array([0, n_i], dtype=np.int64)
    cols = split_bounds(D, blocks, "blocks")
    J, m = cols.size - 1, int(np.max(np.diff(cols)))
    factors = np.zeros((1, J, m, m))
    K.factor_blocks(Z, rows, cols, factors)
    s = _state(1, n_i, D, k, J, n_i)
    best = np.inf
    for _ in range(repeats + 1):  # the first call may compile
        t0 = time.perf_counter()
        K.worker_step(Z, T, rows, 0, cols, factors, s["Wbar"], 1.0, s["mu_workers"], s["ZtY"], s["Obar"], s["nu"],
                      s["W"], s["O"], s["o"])
        best = min(best, time.perf_counter() - t0)
    return float(best)


def comm_time_s(n_features: int, classes: int, workers: int, link: Link, efficiency: float = 1.0) -> dict:
    """Communication of one iteration among ``workers`` workers and the master (``workers + 1`` processes, one
    per node, each on its own ``link``): the broadcast of the ``D x k`` consensus weights, the reduce of the
    workers' copies, and the reduce of the scalar loss. Each is priced as one all-reduce of its size by
    :func:`trainscale.kernels.collectives.allreduce_time` (the faster of a ring and a binary tree): an upper
    bound, since a broadcast or a reduce is one half of a tree all-reduce and a ring broadcast (scatter +
    all-gather) costs what a ring all-reduce does."""
    D = check_int("n_features", n_features, 1, 10**9)
    k = check_int("classes", classes, 1, 10**6)
    n = check_int("workers", workers, 1, 10**7) + 1
    if not isinstance(link, Link):
        raise SpecError("link", link, "expected a wallclock.Link(bandwidth_GBps, latency_s)")
    eff = check_float("efficiency", efficiency, 0.0, 1.0, open_min=True)
    bw, lat = link.bandwidth_Bps, link.latency_s

    def op(nbytes):
        return float(allreduce_time(float(nbytes), n, 1, 1, bw, lat, bw, lat, eff))

    broadcast = op(D * k * BYTES_PER_VALUE)
    reduce = op(D * k * BYTES_PER_VALUE) + op(BYTES_PER_VALUE)
    return {"broadcast_s": broadcast, "reduce_s": reduce, "total_s": broadcast + reduce}
