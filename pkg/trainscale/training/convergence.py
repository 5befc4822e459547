"""Statistical efficiency: distributed optimisation on synthetic problems, and steps to a target.

:func:`make_problem` generates a problem from a seed: least squares with set conditioning and
label noise, L2-regularised logistic regression, or a two-layer tanh network fitted to a teacher
of the same shape; the data are split into one shard per worker, non-IID by ``heterogeneity``.
:func:`run` trains it with synchronous data parallelism, local SGD / DiLoCo, or asynchronous
SGD with staleness set by worker speeds (the kernels of :mod:`trainscale.kernels.optim`, on the problems of :mod:`trainscale.kernels.objectives`) and returns the loss, gradient-norm and bits-sent curves as an
``xarray.Dataset``; :func:`steps_to_target` and :func:`tokens_to_target` read the first crossing
of a target loss. :func:`gradient_noise_scale` estimates ``B_simple = tr(Sigma) / |G|^2``
(McCandlish et al. 2018, arXiv 1812.06162, eq. 2.8) from per-example gradients;
:func:`batch_size_sweep` measures steps to target against batch size and fits the paper's
``S = S_min (1 + B_crit / B)`` (eq. 2.11) so the knee can be compared with ``B_simple``.

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

Randomness: the problem's seed spawns one stream for the shared draws and one per worker; a run's
seed spawns one stream per worker, from which all its mini-batch indices (sampled with
replacement from the worker's shard) are drawn before the kernel starts, so curves never depend
on the number of threads. A second child of the run's seed gives the compressor seed
(:func:`compressor_seed`): worker ``k``'s message at step (sync) or round (local) ``t`` is
compressed with ``trainscale.training.compression.key(compressor_seed, k, t)``, its state starting from
``CompressorSpec.init_state(p, compressor_seed, k)``. Asynchronous runs key worker ``k``'s
``j``-th gradient with ``(compressor_seed, k, j)``; their duration jitter (:func:`run_durations`)
comes from a third child of the run's seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import numpy as np
import xarray as xr

from .compression import CODES as COMPRESSOR_NAMES
from .compression import CompressorSpec, resolve_compressor
from ..common.checks import check_choice as _check_choice
from ..common.checks import check_float as _check_float
from ..common.checks import check_int as _check_int
from ..common.checks import check_speeds
from ..common.io import provenance
from ..kernels import hierarchical, objectives
from ..kernels import optim as K
from ..model.specs import SpecError

__all__ = [
    "KINDS",
    "METHODS",
    "OPTIMIZERS",
    "NoiseScale",
    "Problem",
    "batch_size_sweep",
    "compressor_seed",
    "fit_critical_batch",
    "gradient_noise_scale",
    "make_problem",
    "region_assignment",
    "run",
    "run_batches",
    "run_durations",
    "steps_to_target",
    "tokens_to_target",
]

KINDS = {"least_squares": objectives.LEAST_SQUARES, "logistic": objectives.LOGISTIC,
         "two_layer": objectives.TWO_LAYER}
OPTIMIZERS = {"sgd": K.SGD, "momentum": K.MOMENTUM, "adam": K.ADAM}
METHODS = ("sync", "local", "async", "async_local", "hierarchical", "ist")
_EVENT_METHODS = ("async", "async_local", "hierarchical")


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


# ---------------------------------------------------------------------------------------------
# runs


def draw_batches(problem: Problem, steps: int, batch_size: int, seed) -> np.ndarray:
    """``int64[steps, W, batch_size]``: worker ``k``'s indices, with replacement from its shard,
    from the ``k``-th stream spawned from ``seed``."""
    streams = _seed_sequence(seed).spawn(problem.workers)
    out = np.empty((steps, problem.workers, batch_size), np.int64)
    for k, s in enumerate(streams):
        sl = problem.shard(k)
        out[:, k, :] = sl.start + np.random.default_rng(s).integers(0, sl.stop - sl.start,
                                                                     size=(steps, batch_size))
    return out


def run_batches(problem: Problem, steps: int, batch_size: int, seed=0) -> np.ndarray:
    """The mini-batch indices :func:`run` draws for ``seed`` (for references and tests)."""
    batch_ss, _ = _seed_sequence(seed).spawn(2)
    return draw_batches(problem, steps, batch_size, batch_ss)


def run_durations(problem: Problem, steps: int, speeds, time_per_step_s: float = 1.0,
                  jitter: float = 0.0, seed=0) -> np.ndarray:
    """``float64[steps, W]``: simulated seconds of worker ``k``'s ``j``-th gradient in an async run.

    ``time_per_step_s / speeds[k]``, times (when ``jitter > 0``) a log-normal factor
    ``exp(jitter z - jitter^2 / 2)`` (mean 1) with ``z`` standard normal, all drawn before the
    loop from the third child spawned from ``seed``.
    """
    speeds = _check_speeds(problem, speeds)
    tps = _check_float("time_per_step_s", time_per_step_s, 0.0, 1e12, open_min=True)
    jitter = _check_float("jitter", jitter, 0.0, 10.0)
    steps = _check_int("steps", steps, 1)
    base = np.broadcast_to(tps / speeds, (steps, problem.workers))
    if jitter == 0.0:
        return np.ascontiguousarray(base, dtype=np.float64)
    jit_ss = _seed_sequence(seed).spawn(3)[2]
    z = np.random.default_rng(jit_ss).standard_normal((steps, problem.workers))
    return np.ascontiguousarray(base * np.exp(jitter * z - 0.5 * jitter * jitter))


def _check_speeds(problem: Problem, speeds) -> np.ndarray:
    return check_speeds(speeds, problem.workers)


def compressor_seed(seed=0) -> int:
    """The compressor seed :func:`run` uses for ``seed`` (an int in ``[0, 2^63)``, for references)."""
    _, comp_ss = _seed_sequence(seed).spawn(2)
    return int(comp_ss.generate_state(1, np.uint64)[0] >> np.uint64(1))


def _resolve_compressor(compressor) -> CompressorSpec:
    if isinstance(compressor, str) and compressor not in COMPRESSOR_NAMES:
        raise SpecError("compressor", compressor, f"expected one of {', '.join(COMPRESSOR_NAMES)}, "
                        "a mapping or a CompressorSpec")
    if compressor is not None and not isinstance(compressor, (str, Mapping, CompressorSpec)):
        raise SpecError("compressor", compressor, "expected a name, a mapping or a CompressorSpec")
    return resolve_compressor(compressor, where="compressor")


def _spec_dict(spec: CompressorSpec) -> dict:
    out = asdict(spec)
    out.pop("where", None)
    return {k: v for k, v in out.items() if v is not None}


def run(problem: Problem, method: str = "sync", optimizer: str = "sgd", lr: float = 0.1,
        steps: int = 100, batch_size: int = 8, *, H: int = 1, outer_lr: float = 1.0,
        outer_momentum: float = 0.0, delayed: bool = False, eval_every: int | None = None,
        seed=0, x0=None, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
        compressor: str | Mapping | CompressorSpec = "none", speeds=None, time_per_step_s: float | None = None,
        jitter: float | None = None, worker_comm_s=None, regions=None, updates_per_push: int | None = None,
        region_comm_s=None, global_lr: float = 1.0, global_momentum: float = 0.0, merge_weight: float = 1.0,
        full_batch: bool = False, _provenance: bool = True) -> xr.Dataset:
    """Train ``problem`` and return its curves.

    ``method='sync'``: synchronous SGD over the problem's workers, each with a mini-batch of
    ``batch_size`` examples per step (global batch ``W * batch_size``); ``method='local'``:
    local SGD / DiLoCo with ``H`` inner steps per round, ``optimizer`` as the inner optimiser and
    an outer Nesterov step (``outer_lr``, ``outer_momentum``), one round late when ``delayed``.
    ``steps`` counts (inner) optimiser steps; ``beta1`` is the momentum coefficient for
    ``momentum`` and Adam's first-moment decay. ``eval_every`` defaults to ``H`` (a multiple of
    ``H`` is required for local SGD). ``x0`` defaults to :meth:`Problem.initial_params`.
    ``full_batch=True`` (sync, local and ist; equal shards) makes every worker use its whole
    shard at every step instead of ``batch_size`` examples drawn with replacement.

    ``method='ist'``: independent subnetwork training with permutation sketches
    (:func:`trainscale.kernels.optim.run_ist`; plain SGD steps of ``lr``); the coordinates' split
    at step ``s`` is keyed by ``(compressor_seed(seed), 0, s)``.

    Event-driven methods (simulated time; ``speeds``, ``time_per_step_s`` and ``jitter`` set the
    durations as in :func:`run_durations`, default 1 s per gradient for every worker):

    * ``'async'``: asynchronous SGD through a parameter server (``optimizer`` is the server's).
      Worker ``k`` takes ``time_per_step_s / speeds[k]`` simulated seconds per gradient, times a
      seeded log-normal factor of log-standard-deviation ``jitter``; the server applies each
      gradient as it arrives and the worker restarts from the new parameters. ``steps`` counts
      server updates (one worker's mini-batch each).
    * ``'async_local'``: asynchronous local SGD: every worker runs ``H`` inner steps of
      ``optimizer`` and sends its pseudo-gradient to one server, which applies an outer Nesterov
      step (``outer_lr``, ``outer_momentum``) at once; ``worker_comm_s`` (one number, or one per
      worker) is the one-way time between a worker and the server.
    * ``'hierarchical'``: HALoS (Kim et al. 2025): workers in ``regions`` (a count, splitting the
      workers into equal consecutive groups, or a region index per worker) send to their
      region's server (``worker_comm_s`` away), which applies the outer step and, every
      ``updates_per_push`` worker updates, pushes what it accumulated to a global server
      ``region_comm_s`` away (one number or one per region); the global server applies its own
      Nesterov step (``global_lr``, ``global_momentum``) and returns its model, which the region
      merges with weight ``merge_weight``. Loss and gradient norm are the global model's.
      See :func:`trainscale.kernels.hierarchical.hierarchical_schedule` and ``run_hierarchical``.

    For ``async_local`` and ``hierarchical`` ``steps`` counts worker messages (``H`` inner steps
    each) and ``eval_every`` defaults to 1. Event-driven Datasets also have the coordinate
    ``time_s`` over ``step`` (simulated time of the evaluated update), ``staleness`` over ``step``
    (mean over the updates since the previous evaluation; NaN at step 0), and per update
    (dimension ``update``, 1..steps) ``update_time_s``, ``update_staleness`` and
    ``update_worker``; ``hierarchical`` adds ``region_bits_sent`` over ``region``.

    Returns a Dataset over ``step`` (0, eval_every, ...) and ``worker`` with ``loss``,
    ``grad_norm`` (full pooled dataset, global parameters), ``samples`` (examples processed by
    all workers), ``bits_sent_per_worker`` (cumulative) and, where the optimum is known,
    ``suboptimality``; attrs hold the parameters and provenance; ``ds.attrs`` does not hold the
    final parameters, which are the variable ``params`` over ``param``.
    """
    if not isinstance(problem, Problem):
        raise SpecError("problem", type(problem).__name__, "expected a convergence.Problem")
    _check_choice("method", method, METHODS)
    _check_choice("optimizer", optimizer, tuple(OPTIMIZERS))
    spec = _resolve_compressor(compressor)
    lr = _check_float("lr", lr, 0.0, 1e6, open_min=True)
    steps = _check_int("steps", steps, 1)
    B = _check_int("batch_size", batch_size, 1)
    H = _check_int("H", H, 1)
    outer_lr = _check_float("outer_lr", outer_lr, 0.0, 1e6, open_min=True)
    outer_momentum = _check_float("outer_momentum", outer_momentum, 0.0, 1.0, open_max=True)
    beta1 = _check_float("beta1", beta1, 0.0, 1.0, open_max=True)
    beta2 = _check_float("beta2", beta2, 0.0, 1.0, open_max=True)
    eps = _check_float("eps", eps, 0.0, 1.0)
    for name, flag in (("delayed", delayed), ("full_batch", full_batch)):
        if not isinstance(flag, (bool, np.bool_)):
            raise SpecError(name, flag, "expected true or false")
    local_like = ("local", "async_local", "hierarchical")
    if method not in local_like and (H != 1 or outer_lr != 1.0 or outer_momentum != 0.0):
        raise SpecError("method", method, "H, outer_lr and outer_momentum apply to methods "
                        + ", ".join(local_like))
    if method != "local" and delayed:
        raise SpecError("method", method, "delayed applies to method='local'")
    if method not in _EVENT_METHODS and (speeds is not None or time_per_step_s is not None or jitter is not None):
        raise SpecError("method", method, "speeds, time_per_step_s and jitter apply to methods "
                        + ", ".join(_EVENT_METHODS))
    if method not in ("async_local", "hierarchical") and worker_comm_s is not None:
        raise SpecError("method", method, "worker_comm_s applies to methods async_local and hierarchical")
    if method != "hierarchical" and (regions is not None or updates_per_push is not None or region_comm_s is not None
                                     or global_lr != 1.0 or global_momentum != 0.0 or merge_weight != 1.0):
        raise SpecError("method", method, "regions, updates_per_push, region_comm_s, global_lr, global_momentum "
                        "and merge_weight apply to method='hierarchical'")
    if full_batch and method not in ("sync", "local", "ist"):
        raise SpecError("full_batch", full_batch, "full_batch applies to methods sync, local and ist")
    if method == "ist" and (optimizer != "sgd" or spec.code != 0):
        raise SpecError("method", method, "ist takes plain SGD steps (optimizer='sgd') and no compressor "
                        "(its sub-model split is the compression)")
    if method in _EVENT_METHODS:
        speeds = _check_speeds(problem, speeds)
        time_per_step_s = _check_float("time_per_step_s", 1.0 if time_per_step_s is None else time_per_step_s,
                                       0.0, 1e12, open_min=True)
        jitter = _check_float("jitter", 0.0 if jitter is None else jitter, 0.0, 10.0)
    if eval_every is None:
        eval_every = H if method == "local" else 1
    eval_every = _check_int("eval_every", eval_every, 1)
    if steps % eval_every:
        raise SpecError("steps", steps, f"expected a multiple of eval_every = {eval_every}")
    if method == "local" and eval_every % H:
        raise SpecError("eval_every", eval_every, f"expected a multiple of H = {H} (evaluations fall on round ends)")
    p = problem.n_params
    if x0 is None:
        x0 = problem.initial_params(seed)
    x0 = np.ascontiguousarray(x0, dtype=np.float64)
    if x0.shape != (p,) or not np.all(np.isfinite(x0)):
        raise SpecError("x0", x0.shape, f"expected {p} finite floats")

    comp_params = spec.params(p)  # validates k, rank, rows against p
    W = problem.workers
    batch_ss, _ = _seed_sequence(seed).spawn(2)
    comp_seed = compressor_seed(seed)
    comp_state = np.zeros((W, spec.state_size(p)))
    for k in range(W):
        comp_state[k] = spec.init_state(p, comp_seed, k)

    n_eval = steps // eval_every + 1
    loss = np.empty(n_eval)
    gnorm = np.empty(n_eval)
    bits = np.empty((n_eval, W))
    x_out = np.empty(p)
    opt = OPTIMIZERS[optimizer]
    extra = {}
    if method in ("sync", "local", "ist"):
        batches = _full_batches(problem, steps) if full_batch else draw_batches(problem, steps, B, batch_ss)
        B = batches.shape[2]
        args_common = (problem.code, problem.hidden, problem.lam, problem.X, problem.y, x0, batches)
        if method == "sync":
            K.run_sync(*args_common, opt, lr, beta1, beta2, eps, eval_every,
                       spec.code, comp_params, comp_seed, comp_state, x_out, loss, gnorm, bits)
        elif method == "local":
            K.run_local(*args_common, H, opt, lr, beta1, beta2, eps, outer_lr,
                        outer_momentum, bool(delayed), eval_every, spec.code, comp_params,
                        comp_seed, comp_state, x_out, loss, gnorm, bits)
        else:
            K.run_ist(*args_common, lr, eval_every, comp_seed, x_out, loss, gnorm, bits)
    else:
        upd_time = np.empty(steps)
        upd_stale = np.empty(steps, np.int64)
        upd_worker = np.empty(steps, np.int64)
        if method == "async":
            batches = draw_batches(problem, steps, B, batch_ss)
            durations = run_durations(problem, steps, speeds, time_per_step_s, jitter, seed)
            K.run_async(problem.code, problem.hidden, problem.lam, problem.X, problem.y, x0, batches, durations,
                        opt, lr, beta1, beta2, eps, eval_every, spec.code, comp_params, comp_seed, comp_state,
                        x_out, loss, gnorm, bits, upd_time, upd_stale, upd_worker)
        else:
            extra = _run_local_async(problem, method, steps, B, H, speeds, time_per_step_s, jitter, seed,
                                     batch_ss, worker_comm_s, regions, updates_per_push, region_comm_s,
                                     x0, opt, lr, beta1, beta2, eps, outer_lr, outer_momentum, global_lr,
                                     global_momentum, merge_weight, eval_every, spec, comp_params, comp_seed,
                                     comp_state, x_out, loss, gnorm, bits, upd_time, upd_stale, upd_worker)

    step = np.arange(n_eval) * eval_every
    per_step = {"sync": W * B, "local": W * B, "ist": W * B, "async": B}.get(method, H * B)
    ds = xr.Dataset(
        {
            "loss": ("step", loss, {"units": "1", "long_name": "training loss on the pooled dataset"}),
            "grad_norm": ("step", gnorm, {"units": "1", "long_name": "norm of the full-dataset gradient"}),
            "bits_sent_per_worker": (("step", "worker"), bits,
                                     {"units": "bit", "long_name": "cumulative bits sent by each worker"}),
            "params": ("param", x_out, {"units": "1", "long_name": "final global parameters"}),
        },
        coords={
            "step": ("step", step, {"units": "1", "long_name": _STEP_NAMES[method]}),
            "worker": ("worker", np.arange(W), {"units": "1", "long_name": "worker"}),
            "samples": ("step", step * per_step, {"units": "1", "long_name": "examples processed by all workers (tokens)"}),
        },
    )
    if method in _EVENT_METHODS:
        ds = ds.assign_coords(
            time_s=("step", np.concatenate([[0.0], upd_time[eval_every - 1::eval_every]]),
                    {"units": "s", "long_name": "simulated wall time of the evaluated update"}),
            update=("update", np.arange(1, steps + 1), {"units": "1", "long_name": "server update"}))
        ds["staleness"] = ("step", np.concatenate([[np.nan], upd_stale.reshape(-1, eval_every).mean(axis=1)]),
                           {"units": "1", "long_name": "mean staleness of the updates since the last evaluation"})
        ds["update_time_s"] = ("update", upd_time, {"units": "s", "long_name": "simulated arrival time"})
        ds["update_staleness"] = ("update", upd_stale,
                                  {"units": "1", "long_name": "server updates since the worker read its parameters"})
        ds["update_worker"] = ("update", upd_worker, {"units": "1", "long_name": "worker whose update was applied"})
    if "region_bits" in extra:
        ds["region_bits_sent"] = ("region", extra["region_bits"],
                                  {"units": "bit", "long_name": "bits each region sent to the global server"})
        ds["region_of_worker"] = ("worker", extra["region_of"], {"units": "1", "long_name": "region of each worker"})
    if math.isfinite(problem.optimum_loss) and problem.optimum is not None:
        ds["suboptimality"] = ("step", loss - problem.optimum_loss,
                               {"units": "1", "long_name": "loss minus the optimal loss"})
    parameters = dict(problem=problem.parameters, method=method, optimizer=optimizer, lr=lr, steps=steps,
                      batch_size=B, H=H, outer_lr=outer_lr, outer_momentum=outer_momentum,
                      delayed=bool(delayed), eval_every=eval_every, beta1=beta1, beta2=beta2, eps=eps,
                      compressor=_spec_dict(spec), full_batch=bool(full_batch))
    if method in _EVENT_METHODS:
        parameters.update(speeds=[float(s) for s in speeds], time_per_step_s=time_per_step_s, jitter=jitter)
    parameters.update(extra.get("parameters", {}))
    if _provenance:
        ds.attrs.update(provenance(parameters, _seed_attr(seed)))
    ds.attrs["method"] = method
    ds.attrs["samples_per_step"] = int(per_step)
    ds.attrs["inner_steps_per_message"] = int(H)
    ds.attrs["optimum_loss"] = float(problem.optimum_loss)
    ds.attrs["compressor"] = spec.name
    ds.attrs["compressor_seed"] = comp_seed
    return ds


_STEP_NAMES = {
    "sync": "optimiser steps",
    "local": "inner optimiser steps",
    "ist": "optimiser steps",
    "async": "server updates",
    "async_local": "worker messages (H inner steps each)",
    "hierarchical": "worker messages (H inner steps each)",
}


def run_schedule(problem: Problem, steps, joins, averages, lr: float = 0.1, batch_size: int = 8,
                 seed=0) -> dict:
    """SGD on sites that average on a measured schedule (:func:`trainscale.kernels.optim.run_rounds`):
    ``steps`` (rounds x sites, steps each site takes in each round), ``joins`` (a site restarts from
    the last average) and ``averages`` (the sites averaging, weighted by their steps, as a round
    closes). Mini-batches of ``batch_size`` from the whole data set, one stream (``seed``) consumed
    in schedule order. Returns ``{"params", "loss", "excess_loss", "steps"}`` (``excess_loss``: over
    the optimum's loss, NaN where the optimum is unknown)."""
    steps = np.ascontiguousarray(np.asarray(steps, dtype=np.int64))
    if steps.ndim != 2 or np.any(steps < 0):
        raise SpecError("steps", steps.shape, "expected a rounds x sites array of step counts >= 0")
    joins = np.ascontiguousarray(np.asarray(joins, dtype=np.bool_))
    averages = np.ascontiguousarray(np.asarray(averages, dtype=np.bool_))
    for name, a in (("joins", joins), ("averages", averages)):
        if a.shape != steps.shape:
            raise SpecError(name, a.shape, f"expected the shape of steps, {steps.shape}")
    lr = _check_float("lr", lr, 0.0, open_min=True)
    B = _check_int("batch_size", batch_size, 1)
    total = int(steps.sum())
    rng = np.random.default_rng(_seed_sequence(seed))
    batches = rng.integers(0, problem.n_samples, size=(max(total, 1), B)).astype(np.int64)
    x = problem.initial_params(seed)
    out = np.empty_like(x)
    K.run_rounds(problem.code, problem.hidden, problem.lam, problem.X, problem.y, x, batches, steps, joins,
                 averages, lr, out)
    loss = problem.loss(out)
    excess = loss - problem.optimum_loss if problem.optimum is not None else math.nan
    return {"params": out, "loss": float(loss), "excess_loss": float(excess), "steps": total}


def _full_batches(problem: Problem, steps: int) -> np.ndarray:
    """``int64[steps, W, n_k]``: every worker's whole shard at every step (equal shards required)."""
    sizes = np.diff(problem.shard_offsets)
    if np.any(sizes != sizes[0]):
        raise SpecError("full_batch", True, f"needs equal shards; shard sizes are {sorted(set(sizes.tolist()))} "
                        f"(choose n_samples divisible by workers = {problem.workers})")
    shards = np.stack([np.arange(problem.shard(k).start, problem.shard(k).stop) for k in range(problem.workers)])
    return np.ascontiguousarray(np.broadcast_to(shards, (steps, *shards.shape)))


def _per_entity(name: str, value, n: int, what: str) -> np.ndarray:
    """One non-negative finite number, or ``n`` of them (one per ``what``)."""
    try:
        arr = np.asarray(0.0 if value is None else value, dtype=np.float64)
    except (TypeError, ValueError):
        raise SpecError(name, value, f"expected a non-negative number or {n} of them (one per {what})") from None
    if arr.ndim == 0:
        arr = np.full(n, float(arr))
    if arr.shape != (n,) or not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise SpecError(name, value, f"expected a non-negative number or {n} of them (one per {what})")
    return arr


def region_assignment(workers: int, regions) -> np.ndarray:
    """Region index of each worker: ``regions`` an int (equal consecutive groups) or a list."""
    if isinstance(regions, (int, np.integer)) and not isinstance(regions, bool):
        R = _check_int("regions", regions, 1, workers)
        if workers % R:
            raise SpecError("regions", regions, f"expected a divisor of workers = {workers}, or one region index per worker")
        return np.repeat(np.arange(R), workers // R).astype(np.int64)
    try:
        arr = np.asarray(regions)
    except (TypeError, ValueError):
        arr = np.empty(0)
    if arr.shape != (workers,) or arr.dtype.kind not in "iu" or arr.min() < 0 \
            or set(arr.tolist()) != set(range(int(arr.max()) + 1)):
        raise SpecError("regions", regions, f"expected a region count or {workers} region indices 0..R-1, "
                        "every region used")
    return arr.astype(np.int64)


def _run_local_async(problem, method, steps, B, H, speeds, time_per_step_s, jitter, seed, batch_ss,
                     worker_comm_s, regions, updates_per_push, region_comm_s, x0, opt, lr, beta1, beta2, eps,
                     outer_lr, outer_momentum, global_lr, global_momentum, merge_weight, eval_every, spec,
                     comp_params, comp_seed, comp_state, x_out, loss, gnorm, bits, upd_time, upd_stale,
                     upd_worker) -> dict:
    """Schedule (timing only) then replay (numbers) for ``async_local`` and ``hierarchical``."""
    W = problem.workers
    flat = method == "async_local"
    worker_comm = _per_entity("worker_comm_s", worker_comm_s, W, "worker")
    if flat:
        region_of = np.zeros(W, np.int64)
        R, K_push = 1, 0
        region_comm = np.zeros(1)
    else:
        region_of = region_assignment(W, 1 if regions is None else regions)
        R = int(region_of.max()) + 1
        K_push = _check_int("updates_per_push", 1 if updates_per_push is None else updates_per_push, 1)
        region_comm = _per_entity("region_comm_s", region_comm_s, R, "region")
        global_lr = _check_float("global_lr", global_lr, 0.0, 1e6, open_min=True)
        global_momentum = _check_float("global_momentum", global_momentum, 0.0, 1.0, open_max=True)
        merge_weight = _check_float("merge_weight", merge_weight, 0.0, 1.0)
    per_step = run_durations(problem, steps * H, speeds, time_per_step_s, jitter, seed)
    durations = np.ascontiguousarray(per_step.reshape(steps, H, W).sum(axis=1))
    ev_kind, ev_who, ev_round, ev_time = hierarchical.hierarchical_schedule(durations, worker_comm, region_of,
                                                                            region_comm, K_push, steps)
    rounds = int(ev_round.max()) + 1
    batches = draw_batches(problem, rounds * H, B, batch_ss)
    region_bits = np.zeros(R)
    hierarchical.run_hierarchical(problem.code, problem.hidden, problem.lam, problem.X, problem.y, x0, batches,
                                  ev_kind, ev_who, ev_round, ev_time, region_of, R, flat, H, opt, lr, beta1, beta2,
                                  eps, outer_lr, outer_momentum, global_lr, global_momentum, merge_weight, eval_every,
                                  spec.code, comp_params, comp_seed, comp_state, x_out, loss, gnorm, bits, upd_time,
                                  upd_stale, upd_worker, region_bits)
    parameters = dict(worker_comm_s=worker_comm.tolist())
    out = {"parameters": parameters}
    if not flat:
        parameters.update(regions=region_of.tolist(), updates_per_push=K_push, region_comm_s=region_comm.tolist(),
                          global_lr=global_lr, global_momentum=global_momentum, merge_weight=merge_weight)
        out.update(region_bits=region_bits, region_of=region_of)
    return out


def steps_to_target(ds: xr.Dataset, target: float, var: str = "loss") -> float:
    """First evaluated step at which ``ds[var] <= target`` (NaN if never reached).

    The resolution is the dataset's ``eval_every``: the crossing is the first evaluation at or
    below the target, not interpolated.
    """
    values = np.asarray(ds[var].values)
    hit = np.flatnonzero(values <= target)
    return float(ds["step"].values[hit[0]]) if hit.size else math.nan


def tokens_to_target(ds: xr.Dataset, target: float, var: str = "loss") -> float:
    """Examples (tokens) processed by all workers until :func:`steps_to_target` (NaN if never)."""
    return steps_to_target(ds, target, var) * ds.attrs["samples_per_step"]


# ---------------------------------------------------------------------------------------------
# gradient noise scale and critical batch


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


def batch_size_sweep(problem: Problem, batch_sizes, lrs, target: float, steps: int, *,
                     optimizer: str = "sgd", eval_every: int = 1, seed=0, x0=None,
                     var: str = "loss") -> xr.Dataset:
    """Steps and examples to reach ``target`` against batch size, each at its best learning rate.

    Runs synchronous training for every (per-worker) batch size and learning rate (same seed);
    returns ``steps_to_target`` over (``batch_size``, ``lr``), the best over ``lr`` as
    ``best_steps`` / ``best_samples`` over ``batch_size`` (coordinate ``global_batch`` =
    ``W * batch_size``), and in attrs the fit ``S_min``, ``B_crit`` (in global examples) of
    :func:`fit_critical_batch`, the knee to compare with :func:`gradient_noise_scale`.
    """
    batch_sizes = [_check_int("batch_size", b, 1) for b in batch_sizes]
    lrs = [_check_float("lr", v, 0.0, 1e6, open_min=True) for v in lrs]
    if not batch_sizes or not lrs:
        raise SpecError("batch_sizes", batch_sizes, "expected at least one batch size and one lr")
    S = np.full((len(batch_sizes), len(lrs)), np.nan)
    for i, b in enumerate(batch_sizes):
        for j, lr in enumerate(lrs):
            ds = run(problem, "sync", optimizer, lr, steps, b, eval_every=eval_every, seed=seed, x0=x0,
                     _provenance=False)  # git is asked once, for the sweep
            S[i, j] = steps_to_target(ds, target, var)
    W = problem.workers
    best = np.where(np.all(np.isnan(S), axis=1), np.nan, np.nanmin(np.where(np.isnan(S), np.inf, S), axis=1))
    global_batch = W * np.asarray(batch_sizes)
    s_min, b_crit = fit_critical_batch(global_batch, best)
    out = xr.Dataset(
        {
            "steps_to_target": (("batch_size", "lr"), S, {"units": "1", "long_name": "steps to reach the target loss"}),
            "best_steps": ("batch_size", best, {"units": "1", "long_name": "steps to target at the best lr"}),
            "best_samples": ("batch_size", best * global_batch,
                             {"units": "1", "long_name": "examples (tokens) to target at the best lr"}),
        },
        coords={
            "batch_size": ("batch_size", np.asarray(batch_sizes), {"units": "1", "long_name": "per-worker batch size"}),
            "global_batch": ("batch_size", global_batch, {"units": "1", "long_name": "global batch size"}),
            "lr": ("lr", np.asarray(lrs), {"units": "1", "long_name": "learning rate"}),
        },
    )
    out.attrs.update(provenance(dict(problem=problem.parameters, batch_sizes=batch_sizes, lrs=lrs, target=target,
                                     steps=steps, optimizer=optimizer, eval_every=eval_every, var=var),
                                _seed_attr(seed)))
    out.attrs["S_min"] = s_min
    out.attrs["B_crit"] = b_crit
    return out
