"""Fit the few global performance-model parameters of a generation on measured runs.

The objective is the mean squared log error of each run's published metric, with the published
runs and vTrain's multi-node runs weighted equally as two datasets (so 109 vTrain rows do not
outvote 21 published ones). One value per parameter per generation; never one per run. Blank
plan fields keep their documented defaults: nothing is searched per run.

``trainscale calibrate`` runs :func:`fit` and writes ``data/calibration_fitted.yaml``, which the
model then uses; the file records the data, the objective and the errors it reached.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import least_squares

from . import catalog, perfmodel
from .validation import measured_runs, predicted_value

FITTED_FILE = "calibration_fitted.yaml"


def _residuals(x, runs, weights, names):
    cal = dict(zip(names, x))
    pred = np.array([predicted_value(m, cal) for m in runs])
    meas = np.array([m.measured for m in runs])
    return weights * np.log(pred / meas)


def fit(vtrain_dir: str | Path | None, generation: str = "ampere") -> dict:
    """Least-squares fit of the generation's parameters; returns values and achieved errors."""
    runs = [m for m in measured_runs(vtrain_dir) if m.run.system.generation == generation]
    datasets = sorted({m.dataset for m in runs})
    counts = {d: sum(m.dataset == d for m in runs) for d in datasets}
    weights = np.array([1.0 / np.sqrt(counts[m.dataset] * len(datasets)) for m in runs])
    spec = catalog.calibration()["fitted"][generation]
    names = list(perfmodel.FITTED)
    x0 = np.array([float(spec[n]["value"]) for n in names])
    lower = np.array([float(spec[n]["bounds"][0]) for n in names])
    upper = np.array([float(spec[n]["bounds"][1]) for n in names])
    scale = np.maximum(np.abs(x0), 1e-4)
    result = least_squares(lambda z: _residuals(z * scale, runs, weights, names), x0 / scale,
                           bounds=(lower / scale, upper / scale), x_scale="jac", diff_step=1e-3)
    values = {n: float(v) for n, v in zip(names, result.x * scale)}
    errors = {}
    for d in datasets:
        sel = [m for m in runs if m.dataset == d]
        pred = np.array([predicted_value(m, values) for m in sel])
        meas = np.array([m.measured for m in sel])
        ape = np.abs(pred / meas - 1)
        errors[d] = {"runs": len(sel), "mape": float(ape.mean()), "worst": float(ape.max())}
    return {"generation": generation, "values": values, "errors": errors,
            "datasets": datasets, "cost": float(result.cost)}


def write_fitted(result: dict, path: Path | None = None) -> Path:
    path = path or catalog.data_path(FITTED_FILE)
    doc = {
        "how": ("trainscale calibrate: scipy least_squares on log(predicted/measured) of each run's "
                "published metric; datasets " + ", ".join(result["datasets"]) +
                " weighted equally; bounds and starting values in calibration.yaml"),
        "fitted": {result["generation"]: {k: round(v, 6) for k, v in result["values"].items()}},
        "errors_at_fit": result["errors"],
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=True))
    tmp.replace(path)
    catalog.reload()
    return path
