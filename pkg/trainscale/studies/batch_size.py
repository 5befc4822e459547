"""Batch-size study: scale-out (more nodes) against scale-up (a bigger global batch).

Tyagi & Wang, "Tula: Optimizing Time, Cost, and Generalization in Distributed Large-Batch
Training" (arXiv 2603.18112) choose the global batch and the node count of a data-parallel job
by predicting its time and cost to a target: a bigger batch takes fewer steps, but only down to
the critical batch size, and more nodes make a step shorter, but not in proportion. Here both
halves come from the package:

* **statistical efficiency** (:func:`steps_to_target_sweep`): synchronous SGD on a synthetic
  teacher-student problem (:func:`trainscale.convergence.make_problem`), one run per global batch
  and learning rate, each batch at its best learning rate; the steps to a target loss are fitted
  with ``S = S_min (1 + B_crit / B)`` (:func:`trainscale.convergence.fit_critical_batch`,
  McCandlish et al. 2018, arXiv 1812.06162, eq. 2.11) and the knee ``B_crit`` is compared with the
  gradient noise scale ``B_simple`` (:func:`trainscale.convergence.gradient_noise_scale`) at the
  start and where the loss reaches the target;
* **step time** (:func:`step_costs`): one data-parallel step of a catalog model (one synthetic
  example stands in for one sequence) with global batch ``B`` on ``N`` nodes of a catalog system,
  priced by :func:`trainscale.perfmodel.predict`: every GPU one data-parallel rank (``dp = 8 N``),
  ``B / dp`` sequences per GPU in micro-batches, gradient all-reduce over NVLink and the
  scale-out network overlapped with the last backward pass; the micro-batch, recomputation and
  ZeRO-1 are chosen per cell (fastest plan that fits). ``B`` must be a multiple of the GPU count;
  other cells are NaN with a reason code.

:func:`batch_size_study` joins them: time to target ``S(B) x t(B, N)``, cost
``time x N x price per node-hour`` and energy ``S(B) x t(B, N) x N x (GPU power x GPUs per node +
node overhead)``, over the dimensions ``global_batch`` and ``nodes``.

Why ``predict`` of the whole data-parallel plan rather than ``wallclock.worker_step`` plus
``wallclock.allreduce_time_s``: the plan prices the hierarchical all-reduce (inside the node over
NVLink, across nodes over InfiniBand) and its overlap with the backward pass in one place, with the
same formulas the validation study checks against published runs; a worker plus a flat ring
all-reduce would charge the whole gradient exchange as exposed time.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np
import xarray as xr

from .. import convergence as cv
from .. import perfmodel
from ..checks import check_float, check_floats, check_int
from ..io import provenance
from ..specs import (
    RECOMPUTE_MODES,
    PlanSpec,
    RunSpec,
    SpecError,
    resolve_model,
    resolve_system,
)

__all__ = ["REASONS", "batch_size_study", "step_costs", "steps_to_target_sweep", "target_loss"]

REASONS = (
    "ok",
    "global batch is not a multiple of the GPU count",
    "no data-parallel plan fits in GPU memory",
    "target loss not reached within the step budget",
)
R_OK, R_DIVIDE, R_MEMORY, R_TARGET = range(4)


# ---------------------------------------------------------------------------------------------
# validation


def _increasing(name: str, values: list):
    if any(b <= a for a, b in zip(values, values[1:])):
        raise SpecError(name, values, "expected strictly increasing values")
    return values


def _int_list(name: str, values, minimum: int = 1) -> list[int]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or len(values) == 0:
        raise SpecError(name, values, f"expected a non-empty list of integers >= {minimum}")
    return _increasing(name, [check_int(name, v, minimum) for v in values])


def _float_list(name: str, values) -> list[float]:
    return _increasing(name, check_floats(name, values, 0.0, open_min=True))


def _positive(name: str, value, integer: bool = False, maximum: float = math.inf) -> float:
    if integer:
        return check_int(name, value, 1, None if maximum == math.inf else int(maximum))
    return check_float(name, value, 0.0, maximum, open_min=True)


# ---------------------------------------------------------------------------------------------
# statistical efficiency


def target_loss(problem: cv.Problem, x0, target_gap: float) -> float:
    """The target: ``floor + target_gap * (loss(x0) - floor)``, ``floor`` the problem's
    ``optimum_loss`` (the exact optimum's loss; for the network the noise floor ``sigma^2 / 2``)."""
    gap = _positive("target_gap", target_gap, maximum=1.0)
    floor = float(problem.optimum_loss)
    return floor + gap * (problem.loss(x0) - floor)


def _budget(B: int, budget_steps: int, budget_samples: int, evals_per_run: int) -> tuple[int, int]:
    """Steps and evaluation interval of the run of global batch ``B``: ``budget_steps +
    budget_samples / B`` steps (the shape of ``S_min (1 + B_crit / B)``, so every batch gets the
    same margin), rounded up to a multiple of the interval ``steps / evals_per_run``."""
    steps = budget_steps + -(-budget_samples // B)
    every = max(1, steps // evals_per_run)
    return -(-steps // every) * every, every


def steps_to_target_sweep(kind: str = "two_layer", n_samples: int = 2048, dim: int = 32, hidden: int = 16,
                          kappa: float = 10.0, sigma: float = 0.5,
                          global_batches: Sequence[int] = (4, 16, 64, 256, 1024),
                          lrs: Sequence[float] = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6),
                          target_gap: float = 0.05, budget_steps: int = 50, budget_samples: int = 8000,
                          evals_per_run: int = 100, noise_examples: int | None = None,
                          seed: int = 0) -> xr.Dataset:
    """Steps to the target loss against the global batch, each batch at its best learning rate.

    Synchronous SGD (one worker holding the whole global batch: with identically distributed
    shards, ``W`` workers of ``B / W`` examples give the same update) from one starting point
    ``problem.initial_params(seed)``, every run with the same batch seed. The learning rates are
    tried in increasing order and the scan stops once two consecutive rates are worse than the best
    so far, or one diverges (NaN) after one reached the target (steps to target are unimodal in the
    rate). Returns, over ``global_batch`` and ``lr``, ``steps_to_target`` (NaN where not reached or
    not tried) and over ``global_batch`` ``best_steps``, ``best_lr``, ``best_samples``,
    ``fitted_steps``; scalars ``S_min``, ``B_crit`` (fit) and ``B_simple_start``,
    ``B_simple_target`` (gradient noise scale at the start and where full-batch gradient descent at
    the largest batch's best rate first reaches the target).
    """
    batches = _int_list("global_batches", global_batches)
    lrs = _float_list("lrs", lrs)
    budget_steps = _positive("budget_steps", budget_steps, integer=True)
    budget_samples = _positive("budget_samples", budget_samples, integer=True)
    evals = _positive("evals_per_run", evals_per_run, integer=True)
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise SpecError("seed", seed, "expected a non-negative integer")
    problem = cv.make_problem(kind, n_samples, dim, 1, 0.0, seed=int(seed), kappa=kappa, sigma=sigma, hidden=hidden)
    x0 = problem.initial_params(int(seed))
    target = target_loss(problem, x0, target_gap)

    S = np.full((len(batches), len(lrs)), np.nan)
    budget = np.zeros(len(batches), dtype=np.int64)
    every = np.zeros(len(batches), dtype=np.int64)
    for i, B in enumerate(batches):
        steps, ee = _budget(B, budget_steps, budget_samples, evals)
        budget[i], every[i] = steps, ee
        best, worse = math.inf, 0
        for j, lr in enumerate(lrs):
            ds = cv.run(problem, "sync", "sgd", lr, steps, B, eval_every=ee, seed=int(seed), x0=x0,
                        _provenance=False)
            S[i, j] = cv.steps_to_target(ds, target)
            if np.isnan(S[i, j]):
                diverged = not np.isfinite(ds["loss"].values[-1])
                if diverged and math.isfinite(best):
                    break
                continue
            if S[i, j] < best:
                best, worse = S[i, j], 0
            else:
                worse += 1
                if worse >= 2:
                    break
    reached = ~np.all(np.isnan(S), axis=1)
    best_j = np.where(reached, np.argmin(np.where(np.isnan(S), np.inf, S), axis=1), 0)
    best_steps = np.where(reached, S[np.arange(len(batches)), best_j], np.nan)
    best_lr = np.where(reached, np.asarray(lrs)[best_j], np.nan)
    s_min, b_crit = cv.fit_critical_batch(batches, best_steps)
    gb = np.asarray(batches, dtype=np.float64)

    # gradient noise scale along the noise-free path: full-batch gradient descent at the largest
    # batch's best rate, one step at a time from x0 until it reaches the target
    lr_gd = float(best_lr[reached][-1]) if reached.any() else lrs[-1]
    gd_cap = 4 * budget_steps
    x = x0
    b_path = []
    for _ in range(gd_cap):
        if problem.loss(x) <= target:
            break
        b_path.append(cv.gradient_noise_scale(problem, x, seed=int(seed), n_examples=noise_examples).b_simple)
        x = cv.run(problem, "sync", "sgd", lr_gd, 1, 1, full_batch=True, seed=int(seed), x0=x,
                   _provenance=False)["params"].values
    reached_gd = problem.loss(x) <= target
    b_start = b_path[0] if b_path else math.nan
    b_target = cv.gradient_noise_scale(problem, x, seed=int(seed), n_examples=noise_examples).b_simple \
        if reached_gd else math.nan
    b_mean = float(np.mean(b_path)) if reached_gd and b_path else math.nan

    def v(dims, data, units, long_name):
        return (dims, data, {"units": units, "long_name": long_name})

    ds = xr.Dataset(
        {
            "steps_to_target": v(("global_batch", "lr"), S, "1", "steps to the target loss (NaN: not reached or not tried)"),
            "best_steps": v("global_batch", best_steps, "1", "steps to target at the best learning rate"),
            "best_lr": v("global_batch", best_lr, "1", "best learning rate"),
            "best_samples": v("global_batch", best_steps * gb, "1", "examples (sequences) to target at the best lr"),
            "fitted_steps": v("global_batch", s_min * (1.0 + b_crit / gb), "1",
                              "fit S_min (1 + B_crit / B) of the steps to target"),
            "step_budget": v("global_batch", budget, "1", "steps each run was given"),
            "eval_every": v("global_batch", every, "1", "evaluation interval (resolution of steps to target)"),
            "S_min": v((), s_min, "1", "fitted minimum steps to target (infinite batch)"),
            "B_crit": v((), b_crit, "1", "fitted critical batch size (examples)"),
            "E_min": v((), s_min * b_crit, "1", "fitted minimum examples to target (batch 1 limit)"),
            "B_simple_start": v((), b_start, "1", "gradient noise scale B_simple at the start"),
            "B_simple_target": v((), b_target, "1",
                                 "gradient noise scale B_simple where gradient descent reaches the target"),
            "B_simple_mean": v((), b_mean, "1",
                               "gradient noise scale B_simple averaged over the steps of gradient descent to the target"),
            "gd_steps": v((), len(b_path) if reached_gd else math.nan, "1",
                          "steps of full-batch gradient descent to the target"),
            "target_loss": v((), target, "1", "target loss"),
            "initial_loss": v((), problem.loss(x0), "1", "loss at the start"),
            "floor_loss": v((), float(problem.optimum_loss), "1", "loss floor (optimum, or noise floor sigma^2/2)"),
            "n_params": v((), problem.n_params, "1", "parameters of the synthetic model"),
        },
        coords={
            "global_batch": ("global_batch", np.asarray(batches, dtype=np.int64),
                             {"units": "sequences", "long_name": "global batch (one example = one sequence)"}),
            "lr": ("lr", np.asarray(lrs), {"units": "1", "long_name": "learning rate"}),
        },
    )
    ds.attrs.update(provenance({"kind": kind, "n_samples": n_samples, "dim": dim, "hidden": hidden, "kappa": kappa, "sigma": sigma,
                                    "global_batches": batches, "lrs": lrs, "target_gap": target_gap,
                                    "budget_steps": budget_steps, "budget_samples": budget_samples,
                                    "evals_per_run": evals, "noise_examples": noise_examples}, int(seed)))
    return ds


# ---------------------------------------------------------------------------------------------
# step time from the performance model


def _best_dp_plan(model, system, gpus: int, B: int, calibration=None):
    """Fastest fitting data-parallel plan (dp = gpus): micro-batch, recomputation and ZeRO-1 searched."""
    per_gpu = B // gpus
    best = best_plan = None
    for mb in (m for m in (1, 2, 4, 8, 16) if per_gpu % m == 0):
        for mode in RECOMPUTE_MODES:
            for zero in (0, 1):
                plan = PlanSpec(tp=1, pp=1, dp=gpus, micro_batch=mb, global_batch=B, recompute=mode, zero=zero,
                                overlap_grad_reduce=True, flash_attention=True)
                pred = perfmodel.predict(RunSpec("batch-size", model, system, plan), calibration)
                if pred.fits and math.isfinite(pred.step_time_s) and (best is None or pred.step_time_s < best.step_time_s):
                    best, best_plan = pred, plan
    return best, best_plan


def _system(system, scale_out_GBps_per_gpu):
    if scale_out_GBps_per_gpu is None:
        return resolve_system(system)
    bw = _positive("scale_out_GBps_per_gpu", scale_out_GBps_per_gpu)
    return resolve_system({"name": system, "scale_out_GBps_per_gpu": bw})


def step_costs(model: str, system: str, global_batches: Sequence[int], nodes: Sequence[int],
               scale_out_GBps_per_gpu: float | None = None, calibration=None) -> xr.Dataset:
    """One data-parallel training step of ``model`` with each global batch (sequences) on each node
    count of ``system``, priced by :func:`trainscale.perfmodel.predict` (see the module docstring).

    Returns over (``global_batch``, ``nodes``): ``step_time_s``, ``power_W_per_gpu``, ``mfu``,
    ``micro_batch``, ``exposed_comm_s`` (data-parallel communication not hidden behind compute),
    ``reason`` (index into the attribute ``reasons``; 0 = ok); NaN where infeasible.
    """
    m = resolve_model(model)
    s = _system(system, scale_out_GBps_per_gpu)
    batches = _int_list("global_batches", global_batches)
    node_list = _int_list("nodes", nodes)
    shape = (len(batches), len(node_list))
    t, p, mfu, mb, exposed = (np.full(shape, np.nan) for _ in range(5))
    reason = np.zeros(shape, dtype=np.int8)
    for i, B in enumerate(batches):
        for k, N in enumerate(node_list):
            gpus = N * s.gpus_per_node
            if B % gpus:
                reason[i, k] = R_DIVIDE
                continue
            pred, plan = _best_dp_plan(m, s, gpus, B, calibration)
            if pred is None:
                reason[i, k] = R_MEMORY
                continue
            t[i, k], p[i, k], mfu[i, k], mb[i, k] = pred.step_time_s, pred.power_W_per_gpu, pred.mfu, plan.micro_batch
            exposed[i, k] = pred.breakdown["dp_comm"]

    def v(data, units, long_name):
        return (("global_batch", "nodes"), data, {"units": units, "long_name": long_name})

    ds = xr.Dataset(
        {
            "step_time_s": v(t, "s", "step time"),
            "power_W_per_gpu": v(p, "W", "average power per GPU during a step"),
            "mfu": v(mfu, "1", "model FLOPs utilisation"),
            "micro_batch": v(mb, "sequences", "micro-batch of the fastest plan"),
            "exposed_comm_s": v(exposed, "s", "data-parallel communication not hidden behind compute"),
            "reason": v(reason, "1", "why a cell is NaN: index into the attribute reasons"),
        },
        coords={
            "global_batch": ("global_batch", np.asarray(batches, dtype=np.int64),
                             {"units": "sequences", "long_name": "global batch"}),
            "nodes": ("nodes", np.asarray(node_list, dtype=np.int64), {"units": "1", "long_name": "nodes"}),
        },
    )
    ds["reason"].attrs["reasons"] = list(REASONS)
    ds.attrs.update(provenance({"model": m.name, "system": s.name, "global_batches": batches, "nodes": node_list,
                                    "scale_out_GBps_per_gpu": s.scale_out_GBps_per_gpu,
                                    "calibration": dict(calibration or {})}))
    return ds


# ---------------------------------------------------------------------------------------------
# the study


def batch_size_study(model: str = "llama2-1b", system: str = "dgx-a100-80gb",
                     global_batches: Sequence[int] = (8, 32, 128, 512, 2048, 8192),
                     nodes: Sequence[int] = (1, 4, 16, 64), price_per_node_hour: float = 16.0, *,
                     scale_out_GBps_per_gpu: float | None = None,
                     kind: str = "two_layer", n_samples: int = 2048, dim: int = 32, hidden: int = 16,
                     kappa: float = 10.0, sigma: float = 0.5, lrs: Sequence[float] = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6),
                     target_gap: float = 0.05, budget_steps: int = 50, budget_samples: int = 8000,
                     evals_per_run: int = 100, noise_examples: int | None = None,
                     seed: int = 0) -> xr.Dataset:
    """Time, cost and energy to the target loss over (``global_batch``, ``nodes``).

    ``S(B)`` from :func:`steps_to_target_sweep` (one synthetic example = one sequence of
    ``model``), ``t(B, N)`` from :func:`step_costs`; ``time_to_target_s = S t``, ``cost_to_target
    = time x N x price_per_node_hour / 3600`` (the price is an assumption of the caller, in any
    currency per node-hour), ``energy_to_target_J = time x N x (GPUs per node x GPU power + node
    overhead power)``. Cells where the batch does not split over the GPUs, no plan fits, or the
    target was not reached are NaN (``reason``). Attributes ``fastest`` / ``cheapest`` /
    ``largest`` name the cells (as ``[global_batch, nodes]``).
    """
    price = _positive("price_per_node_hour", price_per_node_hour)
    conv = steps_to_target_sweep(kind, n_samples, dim, hidden, kappa, sigma, global_batches, lrs, target_gap,
                                 budget_steps, budget_samples, evals_per_run, noise_examples, seed)
    perf = step_costs(model, system, global_batches, nodes, scale_out_GBps_per_gpu)
    s = _system(system, scale_out_GBps_per_gpu)
    steps = conv["best_steps"]
    time_s = steps * perf["step_time_s"]
    node_W = s.gpus_per_node * perf["power_W_per_gpu"] + s.node_overhead_W
    N = perf["nodes"].astype(float)
    cost = time_s * N * price / 3600.0
    energy = time_s * N * node_W
    reason = perf["reason"].values.copy()
    reason[(reason == R_OK) & np.isnan(steps.values)[:, None]] = R_TARGET

    ds = xr.merge([conv, perf.drop_vars("reason")], combine_attrs="drop")
    ds["reason"] = (("global_batch", "nodes"), reason,
                    {"units": "1", "long_name": "why a cell is NaN: index into the attribute reasons",
                     "reasons": list(REASONS)})
    ds["time_to_target_s"] = time_s.assign_attrs(units="s", long_name="time to target")
    ds["cost_to_target"] = cost.assign_attrs(units="currency", long_name="cost to target (price per node-hour x node-hours)")
    ds["energy_to_target_J"] = energy.assign_attrs(units="J", long_name="energy to target (GPUs and node overhead)")
    ds["tokens_to_target"] = (steps * perf["global_batch"] * resolve_model(model).seq_len).assign_attrs(
        units="tokens", long_name="tokens to target")
    ds["node_power_W"] = node_W.assign_attrs(units="W", long_name="power per node (GPUs and node overhead)")

    ok = np.isfinite(ds["time_to_target_s"].values)
    cells = {}
    if ok.any():
        for name, var in (("fastest", "time_to_target_s"), ("cheapest", "cost_to_target")):
            vals = np.where(ok, ds[var].values, np.inf)
            i, k = np.unravel_index(int(np.argmin(vals)), vals.shape)
            cells[name] = [int(ds["global_batch"].values[i]), int(ds["nodes"].values[k])]
        i, k = len(ds["global_batch"]) - 1, len(ds["nodes"]) - 1  # the largest batch on the most nodes
        cells["largest"] = [int(ds["global_batch"].values[i]), int(ds["nodes"].values[k])]
    parameters = dict(model=resolve_model(model).name, system=s.name, price_per_node_hour=price,
                      scale_out_GBps_per_gpu=s.scale_out_GBps_per_gpu,
                      **json.loads(conv.attrs["parameters"]),
                      nodes=[int(n) for n in nodes])
    ds.attrs.update(provenance(parameters, int(seed)))
    for name, cell in cells.items():
        ds.attrs[name] = cell
    return ds
