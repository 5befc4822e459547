"""Fit the few global performance-model parameters per generation and per software stack.

Parameters (``perfmodel.GENERATION_FITTED`` per accelerator generation, ``perfmodel.STACK_FITTED``
per stack) are fitted only where measurements of that generation or stack exist; the others carry
the values named by ``carries_from`` in ``data/calibration.yaml``. The objective is the soft-L1
loss of each run's log error in its published metric (:func:`robust`), every dataset weighted equally (each in proportion to the square root of its size, so 109 vTrain rows do not outvote 21
published ones, nor do three BLOOM rows count as much as either). Blank plan fields keep their documented defaults: nothing is
searched per run, and no value is ever fitted per run.

:func:`fit` reports in-sample errors per dataset; :func:`cross_validate` refits without each
dataset in turn (leave-one-dataset-out) and without each model-size class (leave-one-size-out)
and reports the error on what was left out: a form that only reproduces its fitting rows shows
up there. :func:`trainscale.model.validation.size_out_by_dataset` regroups the leave-one-size-out
errors per dataset (a new model size on a known stack and generation). A fitted value at a bound
is reported as such (``at_bound``), never silently.

``trainscale calibrate --write`` runs :func:`fit` and writes ``data/calibration_fitted.yaml``,
which the model then uses; the file records the data, the objective, the errors it reached and,
with ``--cv``, the cross-validated errors.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import yaml
from scipy.optimize import least_squares

from . import catalog, perfmodel
from .validation import NOT_FITTED, MeasuredRun, measured_runs, metric_value, vtrain_dir as default_vtrain_dir

FITTED_FILE = "calibration_fitted.yaml"
SIZE_CLASSES = ((0.0, 10.0, "under 10B"), (10.0, 60.0, "10-60B"), (60.0, 200.0, "60-200B"),
                (200.0, float("inf"), "200B and over"))


def size_class(m: MeasuredRun) -> str:
    params_b = m.run.model.params() / 1e9
    return next(name for lo, hi, name in SIZE_CLASSES if lo <= params_b < hi)


def parameter_keys(runs: Sequence[MeasuredRun]) -> list[tuple[str, str, str]]:
    """``(scope, name, parameter)`` fitted on ``runs``: each generation's efficiencies where it has
    runs; each stack's host time where it has runs, and its ZeRO-3 fetch cost where it has per-tensor
    ZeRO-3 runs (a parameter marked ``carried_from`` is never fitted for that stack)."""
    cal = catalog.calibration()
    keys = [("generations", g, n) for g in sorted({m.run.system.generation for m in runs})
            for n in perfmodel.GENERATION_FITTED]
    # the low-precision GEMM factor only where a generation has FP8 / MXFP8 / NVFP4 runs (issue 36)
    keys += [("generations", g, n) for g in sorted({m.run.system.generation for m in runs
                                                    if m.run.plan.precision != "bf16"})
             for n in perfmodel.PRECISION_FITTED]
    for stack in sorted({m.run.plan.stack for m in runs}):
        for name in perfmodel.STACK_FITTED:
            spec = cal["stacks"][stack]["fitted"][name]
            if "carried_from" in spec or float(spec["bounds"][0]) == float(spec["bounds"][1]):
                continue  # taken from another stack, or fixed by definition (Megatron is the reference)
            if name == "zero3_fetch_s" and not any(m.run.plan.stack == stack and m.run.plan.zero == 3
                                                   and m.run.plan.zero3_per_tensor for m in runs):
                continue
            keys.append(("stacks", stack, name))
    # one value for all (perfmodel.COMMON_FITTED): the straggler spread, identified by the GPU-count
    # differences within the datasets (weak-scaling pairs), never by one run
    keys += [("common", "all", name) for name in perfmodel.COMMON_FITTED]
    return keys


def _spec(key):
    scope, owner, name = key
    cal = catalog.calibration()
    if scope == "common":
        return cal["common_fitted"][name]
    return cal["fitted"][owner][name] if scope == "generations" else cal["stacks"][owner]["fitted"][name]


def fitted_dict(keys, values) -> dict:
    out = {"generations": {}, "stacks": {}}
    for (scope, owner, name), value in zip(keys, values):
        out.setdefault(scope, {}).setdefault(owner, {})[name] = float(value)
    return out


def _predictions(runs, fitted) -> np.ndarray:
    return np.array([metric_value(perfmodel.predict(m.run, perfmodel.calibration_parameters(
        m.run.system.generation, None, m.run.plan.stack, fitted)), m.metric, m.run.gpus) for m in runs])


def _weights(runs) -> np.ndarray:
    counts = {}
    for m in runs:
        counts[m.dataset] = counts.get(m.dataset, 0) + 1
    # a dataset of n runs weighs sqrt(n) in all: a large one does not outvote the others, and a
    # three-row one does not count as much as 109 rows
    return np.array([counts[m.dataset] ** -0.25 for m in runs])


def errors_by_dataset(runs, predicted) -> dict:
    measured = np.array([m.measured for m in runs])
    ape = np.abs(predicted / measured - 1.0)
    out = {}
    for name in dict.fromkeys(m.dataset for m in runs):
        sel = np.array([m.dataset == name for m in runs])
        out[name] = {"runs": int(sel.sum()), "mape": float(ape[sel].mean()), "worst": float(ape[sel].max())}
    return out


ROBUST_SCALE = 0.1  # log-error scale beyond which a run's pull grows like |error|, not error^2


def robust(log_error: np.ndarray) -> np.ndarray:
    """Residuals whose squares are the soft-L1 loss ``2c^2 (sqrt(1 + (r/c)^2) - 1)`` of the log
    errors (``c`` = :data:`ROBUST_SCALE`): quadratic for errors under ~10%, linear beyond, so a few
    public runs on hardware unlike the catalog's (documented in published_runs_stacks.md) cannot
    drag a generation's parameters."""
    c = ROBUST_SCALE
    return np.sign(log_error) * np.sqrt(2.0 * c * c * (np.sqrt(1.0 + (log_error / c) ** 2) - 1.0))


def priors(specs) -> tuple[np.ndarray, np.ndarray]:
    """Prior means and standard deviations of the fitted parameters (``prior: {mean, sd}`` in
    calibration.yaml; a parameter without one has an infinite sd, i.e. no prior)."""
    mean = np.array([float(s.get("prior", {}).get("mean", 0.0)) for s in specs])
    sd = np.array([float(s.get("prior", {}).get("sd", np.inf)) for s in specs])
    return mean, sd


def prior_residuals(values: np.ndarray, mean: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """Gaussian priors as extra residuals, ``c (x - mean) / sd`` with ``c`` = :data:`ROBUST_SCALE`:
    a parameter one prior sd away costs as much as one unit-weight run that is off by ~10%. With
    many runs the data decide; a generation or stack with a few runs stays near its prior instead
    of running to a bound (the maximum a-posteriori fit of a log-normal error model)."""
    finite = np.isfinite(sd)
    return ROBUST_SCALE * (values[finite] - mean[finite]) / sd[finite]


def fit_runs(runs: Sequence[MeasuredRun], start: dict | None = None, max_nfev: int | None = None) -> dict:
    """Least-squares fit on ``runs``; returns ``{"fitted", "keys", "values", "at_bound", "cost"}``."""
    keys = parameter_keys(runs)
    specs = [_spec(k) for k in keys]
    x0 = np.array([float(s["value"]) for s in specs])
    if start is not None:  # warm start (cross-validation folds start from the full fit)
        x0 = np.array([start.get(k[0], {}).get(k[1], {}).get(k[2], v) for k, v in zip(keys, x0)])
    lower = np.array([float(s["bounds"][0]) for s in specs])
    upper = np.array([float(s["bounds"][1]) for s in specs])
    x0 = np.clip(x0, lower, upper)
    scale = np.maximum(np.abs(upper - lower), 1e-6)
    weights = _weights(runs)
    measured = np.array([m.measured for m in runs])

    prior_mean, prior_sd = priors(specs)

    def residuals(z):
        log_error = np.log(_predictions(runs, fitted_dict(keys, z * scale)) / measured)
        return np.concatenate([weights * robust(log_error), prior_residuals(z * scale, prior_mean, prior_sd)])

    result = least_squares(residuals, x0 / scale, bounds=(lower / scale, upper / scale), x_scale="jac",
                           diff_step=1e-3, max_nfev=max_nfev)
    values = result.x * scale
    span = upper - lower
    at_bound = [f"{k[1]}.{k[2]}" for k, v, lo, hi, w in zip(keys, values, lower, upper, span)
                if min(v - lo, hi - v) <= 1e-3 * w]
    return {"fitted": fitted_dict(keys, values), "keys": keys, "values": values, "at_bound": at_bound,
            "cost": float(result.cost)}


def fitting_runs(vtrain: str | Path | None = None) -> list[MeasuredRun]:
    """Every measured run that is fitted: all but the datasets of ``NOT_FITTED`` (the compiled FSDP
    runs and BigScience's layout trials, validated only); vTrain's single-node runs where the folder
    has them (they identify the host time per layer)."""
    folder = default_vtrain_dir(vtrain)
    single = folder is not None and (Path(folder) / "ground_truth_single.csv").is_file()
    return [m for m in measured_runs(folder, include_vtrain_single=single) if m.dataset not in NOT_FITTED]


def fit(vtrain: str | Path | None = None) -> dict:
    """Fit every generation's and stack's parameters on the fitting runs; errors per dataset."""
    runs = fitting_runs(vtrain)
    result = fit_runs(runs)
    result["errors"] = errors_by_dataset(runs, _predictions(runs, result["fitted"]))
    result["datasets"] = sorted({m.dataset for m in runs})
    return result


def _held_out(runs, leave: Callable[[MeasuredRun], bool], start: dict, max_nfev: int) -> tuple[list, np.ndarray]:
    train = [m for m in runs if not leave(m)]
    test = [m for m in runs if leave(m)]
    result = fit_runs(train, start=start, max_nfev=max_nfev)
    return test, _predictions(test, result["fitted"])


def _leaves(fold: tuple[str, str]) -> Callable[[MeasuredRun], bool]:
    """Which runs a fold leaves out: ``("dataset", name)`` or ``("size", class name)``."""
    kind, name = fold
    return (lambda m: m.dataset == name) if kind == "dataset" else (lambda m: size_class(m) == name)


_FOLD_RUNS: list = []  # the runs a forked worker refits (set by the parent before it forks)


def _fold_predictions(fold: tuple[str, str], start: dict, max_nfev: int) -> np.ndarray:
    """The left-out runs' predictions of one fold, refitted without them (in a worker process)."""
    return _held_out(_FOLD_RUNS, _leaves(fold), start, max_nfev)[1]


def _fold_name(fold: tuple[str, str]) -> str:
    """How the progress line names a fold: ``dataset X`` or ``size class X``."""
    return f"{'size class' if fold[0] == 'size' else 'dataset'} {fold[1]}"


def _run_folds(runs, folds, start, max_nfev, workers, progress):
    """Each fold's left-out predictions, in the order of ``folds``: the folds are independent fits, so
    ``workers`` processes (forked, each given the runs) refit them side by side; the same numbers as
    one after another."""
    global _FOLD_RUNS
    if workers <= 1 or len(folds) <= 1:
        out = []
        for fold in folds:
            if progress:
                progress(_fold_name(fold))
            out.append(_held_out(runs, _leaves(fold), start, max_nfev)[1])
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    _FOLD_RUNS = list(runs)
    try:
        with ProcessPoolExecutor(min(workers, len(folds)), mp_context=multiprocessing.get_context("fork")) as pool:
            futures = [pool.submit(_fold_predictions, fold, start, max_nfev) for fold in folds]
            out = []
            for fold, future in zip(folds, futures):
                out.append(future.result())
                if progress:
                    progress(_fold_name(fold))
            return out
    finally:
        _FOLD_RUNS = []


def cross_validate(vtrain: str | Path | None = None, full: dict | None = None, max_nfev: int = 40,
                   progress: Callable[[str], None] | None = None, workers: int | None = None) -> dict:
    """Leave-one-dataset-out and leave-one-size-class-out errors, per left-out group.

    A generation or stack whose only runs are left out carries the values of ``carries_from``
    (Blackwell: Hopper's; a stack: Megatron's): that is the extrapolation being tested. The folds
    are refitted in ``workers`` processes side by side (default: one per CPU; :func:`_run_folds`)."""
    runs = fitting_runs(vtrain)
    full = full or fit(vtrain)
    folds = [("dataset", name) for name in sorted({m.dataset for m in runs})]
    folds += [("size", name) for _, _, name in SIZE_CLASSES if any(size_class(m) == name for m in runs)]
    workers = int(workers) if workers is not None else (os.cpu_count() or 1)
    predictions = _run_folds(runs, folds, full["fitted"], max_nfev, workers, progress)
    out = {"leave_one_dataset_out": {}, "leave_one_size_out": {}}
    for fold, predicted in zip(folds, predictions):
        test = [m for m in runs if _leaves(fold)(m)]
        kind, name = fold
        if kind == "dataset":
            out["leave_one_dataset_out"][name] = errors_by_dataset(test, predicted)[name]
            continue
        ape = np.abs(predicted / np.array([m.measured for m in test]) - 1.0)
        out["leave_one_size_out"][name] = {"runs": len(test), "mape": float(ape.mean()),
                                           "worst": float(ape.max()), "by_dataset": errors_by_dataset(test, predicted)}
    return out


def write_fitted(result: dict, path: Path | None = None, cv: dict | None = None) -> Path:
    path = path or catalog.data_path(FITTED_FILE)
    doc = {
        "how": ("trainscale calibrate: scipy least_squares on log(predicted/measured) of each run's "
                "published metric; datasets " + ", ".join(result["datasets"]) +
                " weighted equally; bounds and starting values in calibration.yaml"),
        "fitted": {scope: {owner: {k: round(v, 7) for k, v in params.items()} for owner, params in owners.items()}
                   for scope, owners in result["fitted"].items()},
        "at_bound": list(result["at_bound"]),
        "errors_at_fit": result["errors"],
    }
    if cv is not None:
        doc["cross_validation"] = cv
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=True))
    tmp.replace(path)
    catalog.reload()
    return path
