r"""Gear training (Dong et al., arXiv 1806.03925): the parts of a model-parallel network updated at different
rates, against synchronous and asynchronous SGD.

**The run** (:func:`make_problem`, :func:`train`): a multi-layer perceptron of layer widths ``dims`` (tanh
hidden layers, linear output; part ``p`` = layer ``p`` on its own device) learns a generated regression: the
inputs are standard normal, the targets the outputs of a *teacher* network of the same shape (weights
:math:`N(0, 1/d_p)`) plus Gaussian noise of standard deviation ``noise``. The student starts from its own
random weights. Every method sees the same mini-batches (drawn once from ``seed``) and the same learning rate;
the update rule and its three cases (synchronous, gear with periods :math:`k_p`, asynchronous with delay
:math:`\tau`) are in :mod:`trainscale.kernels.gear`. :func:`train_numpy` is the same rule in NumPy (the
reference of the tests and of ``make bench``).

**Wall time per step** (:func:`step_times`): the same architecture deployed ``width_scale`` times wider (part
``p`` a GEMM of ``tokens`` x ``scale d_{p+1}`` x ``scale d_p``), each part on its own GPU, the model replicated
over ``replicas`` data-parallel groups. Compute per step: the slowest part's forward and backward GEMMs
(:func:`trainscale.kernels.compute.gemm_fwd_bwd_time` with the catalog GPU and its generation's calibration;
a steady pipeline, the bubble left out: it is the same for every method). Communication: part ``p``'s
gradient all-reduce over the replicas (:func:`trainscale.training.wallclock.allreduce_time_s`, ring, on the catalog
system's scale-out link or a swept bandwidth), the parts' all-reduces in parallel (each part's GPUs have their
own links). Synchronous SGD waits for every all-reduce every step:
:math:`t = c + \max_p A_p`; gear waits only for the parts whose period ends at that step:
:math:`t_s = c + \max_{p:\,(s+1) \bmod k_p = 0} A_p` (averaged over a full cycle of the periods);
asynchronous SGD overlaps the all-reduces with the next steps' compute: :math:`t = \max(c, \max_p A_p)`, its
gradients then :math:`\tau = \lceil \max_p A_p / c \rceil` steps old (at least 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..model import perfmodel
from ..common.checks import check_float, check_int, check_ints
from ..kernels import compute as KC
from ..kernels import gear as K
from ..model.specs import SpecError, resolve_system
from ..training.wallclock import Link, allreduce_time_s

__all__ = ["make_problem", "init_params", "part_offsets", "part_sizes", "train", "train_numpy", "step_times",
           "gear_step_s", "async_step_s", "schedule"]


def _dims(dims) -> np.ndarray:
    d = check_ints("dims", dims, 1, 10**6, distinct=False)
    if len(d) < 2:
        raise SpecError("dims", dims, "expected at least two layer widths (input, output)")
    return np.asarray(d, dtype=np.int64)


def part_sizes(dims) -> np.ndarray:
    """Parameters of each part (layer ``p``: :math:`d_p d_{p+1} + d_{p+1}`)."""
    d = _dims(dims)
    return d[:-1] * d[1:] + d[1:]


def part_offsets(dims) -> np.ndarray:
    """Start of each part in the flat parameter vector, and the total (``P + 1`` entries)."""
    return np.concatenate([[0], np.cumsum(part_sizes(dims))]).astype(np.int64)


def init_params(dims, seed: int) -> np.ndarray:
    """Random weights :math:`N(0, 1/d_p)`, zero biases, as one flat vector."""
    d = _dims(dims)
    rng = np.random.default_rng(check_int("seed", seed, 0, 2**63 - 1))
    parts = []
    for p in range(d.size - 1):
        parts.append(rng.normal(0.0, 1.0 / math.sqrt(d[p]), size=d[p] * d[p + 1]))
        parts.append(np.zeros(d[p + 1]))
    return np.concatenate(parts)


def make_problem(dims, n_train: int = 4096, n_eval: int = 1024, noise: float = 0.1, seed: int = 0) -> dict:
    """The generated regression (module docstring): ``X`` (n_train + n_eval x d_0) and ``Y`` from the teacher
    network plus noise; ``eval_idx`` the last ``n_eval`` rows (never trained on)."""
    d = _dims(dims)
    n_train = check_int("n_train", n_train, 1, 10**7)
    n_eval = check_int("n_eval", n_eval, 1, 10**7)
    noise = check_float("noise", noise, 0.0, 100.0)
    rng = np.random.default_rng(check_int("problem_seed", seed, 0, 2**63 - 1))
    X = rng.normal(size=(n_train + n_eval, d[0]))
    teacher = init_params(d, int(rng.integers(2**31)))
    Y = _forward_numpy(teacher, d, X) + noise * rng.normal(size=(X.shape[0], d[-1]))
    return {"dims": d, "X": X, "Y": Y, "n_train": n_train, "eval_idx": np.arange(n_train, n_train + n_eval),
            "teacher": teacher, "noise": noise}


def schedule(problem: dict, steps: int, batch: int, seed: int) -> np.ndarray:
    """The mini-batches (``steps x batch`` training rows, with replacement), the same for every method."""
    steps = check_int("steps", steps, 1, 10**7)
    batch = check_int("batch", batch, 1, problem["n_train"])
    return np.random.default_rng(check_int("seed", seed, 0, 2**63 - 1)).integers(
        0, problem["n_train"], size=(steps, batch)).astype(np.int64)


def _rates(dims, periods, delays):
    P = _dims(dims).size - 1
    k = np.asarray(check_ints("periods", periods, 1, 10**6, distinct=False), dtype=np.int64)
    tau = np.asarray(check_ints("delays", delays, 0, 10**4, distinct=False), dtype=np.int64)
    if k.size != P or tau.size != P:
        raise SpecError("periods" if k.size != P else "delays", list(k if k.size != P else tau),
                        f"expected one value per part ({P} parts)")
    return k, tau


def train(problem: dict, theta0: np.ndarray, batches: np.ndarray, lr: float, periods, delays,
          eval_every: int) -> dict:
    """One run of the update rule (Numba): the final parameters and the evaluation loss every ``eval_every``
    steps (``loss[0]`` before the first step)."""
    d = problem["dims"]
    k, tau = _rates(d, periods, delays)
    lr = check_float("lr", lr, 0.0, 100.0, open_min=True)
    eval_every = check_int("eval_every", eval_every, 1, 10**7)
    steps = batches.shape[0]
    off = part_offsets(d)
    if theta0.shape != (off[-1],):
        raise SpecError("theta0", theta0.shape, f"expected {off[-1]} parameters for dims {d.tolist()}")
    theta = theta0.astype(np.float64).copy()
    ring = np.zeros((int(tau.max()) + 1, theta.size))
    acc, grad = np.zeros(theta.size), np.zeros(theta.size)
    width = int(max(d.max(), 1))
    B = max(batches.shape[1], 256)
    acts, deltas = np.zeros((d.size, B, width)), np.zeros((2, B, width))
    losses = np.full(steps // eval_every + 1, np.nan)
    K.train_steps(theta, d, off, problem["X"], problem["Y"], batches, 0, steps, lr, k, tau, ring, acc, grad,
                  acts, deltas, problem["eval_idx"], eval_every, losses)
    return {"theta": theta, "loss": losses, "eval_steps": np.arange(losses.size) * eval_every}


# ------------------------------------------------------------------------------------------ NumPy reference
def _forward_numpy(theta, dims, X):
    acts = _activations(theta, dims, X)
    return acts[-1]


def _activations(theta, dims, X):
    off = part_offsets(dims)
    acts = [X]
    P = len(dims) - 1
    for p in range(P):
        W = theta[off[p]: off[p] + dims[p] * dims[p + 1]].reshape(dims[p + 1], dims[p])
        b = theta[off[p] + dims[p] * dims[p + 1]: off[p + 1]]
        z = acts[-1] @ W.T + b
        acts.append(np.tanh(z) if p < P - 1 else z)
    return acts


def loss_and_gradient_numpy(theta, dims, X, Y):
    """NumPy: mean-squared loss of the rows ``X, Y`` and its gradient (flat, like ``theta``)."""
    off = part_offsets(dims)
    acts = _activations(theta, dims, X)
    B = X.shape[0]
    r = acts[-1] - Y
    delta = r / B
    grads = []
    for p in range(len(dims) - 2, -1, -1):
        W = theta[off[p]: off[p] + dims[p] * dims[p + 1]].reshape(dims[p + 1], dims[p])
        grads.append(np.concatenate([(delta.T @ acts[p]).ravel(), delta.sum(0)]))
        if p > 0:
            delta = (delta @ W) * (1.0 - acts[p] ** 2)
    return 0.5 * float((r * r).sum()) / B, np.concatenate(grads[::-1])


def train_numpy(problem: dict, theta0, batches, lr: float, periods, delays) -> np.ndarray:
    """The same update rule in NumPy (no evaluation): the final parameters."""
    d = problem["dims"]
    k, tau = _rates(d, periods, delays)
    off = part_offsets(d)
    theta = np.asarray(theta0, dtype=float).copy()
    history, acc = [], np.zeros_like(theta)
    for t, rows in enumerate(batches):
        history.append(loss_and_gradient_numpy(theta, d, problem["X"][rows], problem["Y"][rows])[1])
        for p in range(d.size - 1):
            part = slice(off[p], off[p + 1])
            if t >= tau[p]:
                acc[part] += history[t - tau[p]][part]
            if (t + 1) % k[p] == 0:
                theta[part] -= lr * acc[part]
                acc[part] = 0.0
    return theta


# ------------------------------------------------------------------------------------------ wall time
def step_times(dims, width_scale: int, tokens: int, replicas: int, system: str, bandwidth_GBps: float,
               bytes_per_value: int = 2) -> dict:
    """Per-step compute ``compute_s`` and each part's gradient all-reduce ``allreduce_s`` (seconds) of the
    deployed network (module docstring), and its parameters per part."""
    d = _dims(dims)
    scale = check_int("width_scale", width_scale, 1, 10**5)
    tokens = check_int("tokens", tokens, 1, 10**9)
    replicas = check_int("replicas", replicas, 1, 10**6)
    bpv = check_int("bytes_per_value", bytes_per_value, 1, 8)
    sysx = resolve_system(system)
    bw = check_float("bandwidth_GBps", bandwidth_GBps, 0.0, 1e5, open_min=True)
    calib = perfmodel.calibration_vector(sysx.generation)
    args = (float(sysx.peak_flops_bf16), float(sysx.hbm_bandwidth_GBps) * 1e9, int(sysx.sm_count), calib)
    deployed = d.copy()
    deployed[:-1] *= scale  # the output width stays (a regression head)
    compute = max(sum(KC.gemm_fwd_bwd_time(tokens, int(deployed[p + 1]), int(deployed[p]), 1, *args))
                  for p in range(d.size - 1))
    params = part_sizes(deployed)
    link = Link(bw, float(sysx.scale_out_latency_s))
    ar = np.array([allreduce_time_s(bpv * float(n), replicas, link) for n in params])
    return {"compute_s": float(compute), "allreduce_s": ar, "params": params}


def gear_step_s(compute_s: float, allreduce_s, periods) -> float:
    """Mean step time of gear training over one full cycle of the periods: compute plus the slowest all-reduce
    of the parts whose period ends at the step (synchronous SGD: all periods 1)."""
    ar = np.asarray(allreduce_s, dtype=float)
    k = np.asarray(periods, dtype=np.int64)
    cycle = int(np.lcm.reduce(k))
    total = 0.0
    for s in range(cycle):
        due = (s + 1) % k == 0
        total += compute_s + (float(ar[due].max()) if due.any() else 0.0)
    return total / cycle


def async_step_s(compute_s: float, allreduce_s) -> tuple[float, int]:
    """(step time, staleness in steps) of asynchronous SGD whose all-reduces overlap the next steps' compute."""
    slowest = float(np.max(allreduce_s))
    return max(compute_s, slowest), max(1, math.ceil(slowest / compute_s))
