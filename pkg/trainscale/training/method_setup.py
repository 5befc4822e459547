"""What :func:`.convergence.run` draws and checks before a method's kernel runs: every worker's mini-batch
indices (:func:`draw_batches`, :func:`run_batches`; the whole shard with ``full_batch``), the simulated duration of
each gradient of an event-driven run (:func:`run_durations`), the compressor and its seed
(:func:`compressor_seed`), the workers' regions of a hierarchical run (:func:`region_assignment`), and for
``async_local`` and ``hierarchical`` the schedule (timing only) that the replay kernel then follows
(:func:`_run_local_async`).

The streams each draw comes from (a child of the run's seed per purpose) are described under *Randomness* in
:mod:`.convergence`'s docstring.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict

import numpy as np

from .compression import CODES as COMPRESSOR_NAMES
from .compression import CompressorSpec, resolve_compressor
from .synthetic_problems import Problem, _seed_sequence
from ..common.checks import check_float as _check_float
from ..common.checks import check_int as _check_int
from ..common.checks import check_speeds
from ..kernels import hierarchical
from ..kernels import optim as K
from ..model.specs import SpecError

__all__ = ["compressor_seed", "draw_batches", "region_assignment", "run_batches", "run_durations"]


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
    """The mini-batch indices :func:`.convergence.run` draws for ``seed`` (for references and tests)."""
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
    """The compressor seed :func:`.convergence.run` uses for ``seed`` (an int in ``[0, 2^63)``, for references)."""
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
    ev_kind, ev_who, ev_round, ev_time = hierarchical.hierarchical_schedule(durations, worker_comm, region_of, region_comm,
                                                                 K_push, steps)
    rounds = int(ev_round.max()) + 1
    batches = draw_batches(problem, rounds * H, B, batch_ss)
    region_bits = np.zeros(R)
    hierarchical.run_hierarchical(problem.code, problem.hidden, problem.lam, problem.X, problem.y, x0, batches, ev_kind,
                       ev_who, ev_round, ev_time, region_of, R, flat, H, opt, lr, beta1, beta2, eps, outer_lr,
                       outer_momentum, global_lr, global_momentum, merge_weight, eval_every, spec.code,
                       comp_params, comp_seed, comp_state, x_out, loss, gnorm, bits, upd_time, upd_stale,
                       upd_worker, region_bits)
    parameters = dict(worker_comm_s=worker_comm.tolist())
    out = {"parameters": parameters}
    if not flat:
        parameters.update(regions=region_of.tolist(), updates_per_push=K_push, region_comm_s=region_comm.tolist(),
                          global_lr=global_lr, global_momentum=global_momentum, merge_weight=merge_weight)
        out.update(region_bits=region_bits, region_of=region_of)
    return out
