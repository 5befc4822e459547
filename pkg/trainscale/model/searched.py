"""The planner's question on the measured runs: with every published field fixed, which throughput does the
plan search (:func:`trainscale.model.planner.search`, as ``trainscale search --fix ... --search ...``) find when
only the knobs the source left blank (:data:`~trainscale.model.measured.SEARCHED_KNOBS`) are searched?
:func:`searched_dataset` holds one searched and one default prediction per run, and the spread over narrower
search ranges (:data:`~trainscale.model.measured.SEARCH_RANGES`); :func:`searched_summary` one row per dataset.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
import xarray as xr

from . import perfmodel, planner
from ..common.io import provenance
from .measured import INTERLEAVED_STACKS, SEARCH_RANGES, SEARCHED_KNOBS, MeasuredRun, measured_runs
from .specs import RunSpec
from .validation import COORD_NAMES, predicted_value


def searched_knobs(m: MeasuredRun) -> tuple:
    """The knobs searched for a run: those its source leaves blank, interleaving only where its
    stack has an interleaved schedule and the run a pipeline."""
    plan = m.run.plan
    return tuple(k for k in m.unpublished
                 if k != "interleave" or (plan.stack in INTERLEAVED_STACKS and plan.pp > 1))


def searched_space(m: MeasuredRun, values: Mapping[str, list] | None = None) -> dict:
    """The plan space of a run with its published fields fixed and :func:`searched_knobs` free over
    ``values`` (default :data:`SEARCHED_KNOBS`; what ``trainscale search --fix FIELD=VALUE ...
    --search KNOB ...`` builds)."""
    values = {**SEARCHED_KNOBS, **(values or {})}
    plan = m.run.plan
    space = {name: [int(getattr(plan, name)) if name in perfmodel.BOOLEAN_AXES else getattr(plan, name)]
             for name in perfmodel.GRID_AXES}
    if m.run.model.is_moe:
        space[perfmodel.EP_AXIS] = [plan.ep]
        space[perfmodel.ETP_AXIS] = [plan.etp]
    for knob in searched_knobs(m):
        space[knob] = list(values[knob])
    return space


def searched_prediction(m: MeasuredRun, calibration: Mapping[str, float] | None = None,
                        values: Mapping[str, list] | None = None) -> tuple[dict, float]:
    """(best plan, its predicted value in the run's metric) when only the knobs the source left
    blank are searched, over ``values`` (plan search with every other field fixed;
    :func:`searched_space`); the best plan is ``{}`` and the value NaN when no plan of that space fits."""
    plan = m.run.plan
    _, best = planner.search(m.run.model, m.run.system, m.run.gpus, plan.global_batch, top=1,
                               space=searched_space(m, values), calibration=calibration, stack=plan.stack,
                               compiled=plan.compiled, grad_reduce_fp32=plan.grad_reduce_fp32,
                               recompute_share=plan.recompute_share, rotary_kernel=plan.rotary_kernel,
                               tp_async_backward=plan.tp_async_backward)
    if not best:
        return {}, float("nan")
    chosen = best[0]["plan"]
    run = RunSpec(id=m.run.id, model=m.run.model, system=m.run.system,
                  plan=perfmodel.plan_from_grid_entry(chosen, plan.global_batch))
    return chosen, predicted_value(MeasuredRun(run, m.dataset, m.metric, m.measured, m.source), calibration)


def searched_dataset(vtrain_dir: str | Path | None = None,
                     calibration: Mapping[str, float] | None = None) -> xr.Dataset:
    """Predicted vs measured for every measured run with a searched knob (dim ``run``): with the
    knobs its source leaves blank as priced by :func:`validation_dataset` (at the stack's documented
    defaults, or as run where another source, such as the authors' scripts, gives them)
    and searched (:func:`searched_prediction`), with the values the search chose; and searched over
    each narrower range of :data:`SEARCH_RANGES` (dim ``search_range``)."""
    runs = [m for m in measured_runs(vtrain_dir) if searched_knobs(m)]
    default = np.array([predicted_value(m, calibration) for m in runs])
    results = [searched_prediction(m, calibration) for m in runs]
    searched = np.array([value for _, value in results])
    measured = np.array([m.measured for m in runs])
    narrower = np.array([[searched_prediction(m, calibration, values)[1] for values in SEARCH_RANGES.values()]
                         for m in runs]).reshape(len(runs), len(SEARCH_RANGES))
    knobs = list(SEARCHED_KNOBS)

    def chosen(m, plan, knob):
        if knob not in searched_knobs(m) or not plan:
            return ""
        return str(plan[knob])

    data = {
        "measured": ("run", measured, {"units": "metric", "long_name": "measured (in the row's metric)"}),
        "predicted_default": ("run", default, {"units": "metric", "long_name": "predicted with the blank knobs at "
                                               "the stack's documented defaults or as run (in the row's metric)"}),
        "predicted_searched": ("run", searched, {"units": "metric", "long_name": "predicted for the best plan with "
                                                 "the blank knobs searched (in the row's metric)"}),
        "rel_error_default": ("run", (default - measured) / measured,
                              {"units": "1", "long_name": "relative error, blank knobs at their defaults or as run"}),
        "rel_error_searched": ("run", (searched - measured) / measured,
                               {"units": "1", "long_name": "relative error, blank knobs searched"}),
        "rel_error_searched_range": (("run", "search_range"), (narrower - measured[:, None]) / measured[:, None],
                                     {"units": "1", "long_name": "relative error, blank knobs searched over a "
                                                                 "narrower range"}),
    }
    for knob in knobs:
        data[f"searched_{knob}"] = ("run", [chosen(m, plan, knob) for m, (plan, _) in zip(runs, results)],
                                    {"units": "1", "long_name": f"{knob} the search chose ('': published, not searched)"})
    ds = xr.Dataset(data, coords={"run": [m.run.id for m in runs],
                                  "dataset": ("run", [m.dataset for m in runs]),
                                  "metric": ("run", [m.metric for m in runs]),
                                  "search_range": list(SEARCH_RANGES)})
    for name in ("run", "dataset", "metric"):
        ds[name].attrs["long_name"] = COORD_NAMES[name]
    ds["search_range"].attrs["long_name"] = "narrower search: one knob's values capped, the others as searched"
    ds.attrs["searched_values"] = json.dumps(SEARCHED_KNOBS)
    ds.attrs.update(provenance({"vtrain_dir": None if vtrain_dir is None else str(vtrain_dir),
                                "calibration": dict(calibration or {})}))
    return ds


def _mape_pct(rel_errors) -> float:
    ape = np.abs(np.asarray(rel_errors, dtype=float))
    return float(100 * np.nanmean(ape)) if np.isfinite(ape).any() else float("nan")


def searched_summary(ds: xr.Dataset) -> pd.DataFrame:
    """One row per dataset of :func:`searched_dataset`: runs, MAPE with defaults and searched (worst
    run, runs with no plan that fits), and the lowest and highest MAPE over the narrower search ranges
    and the full one."""
    rows = []
    for name in dict.fromkeys(ds["dataset"].values.tolist()):
        part = ds.isel(run=np.flatnonzero(ds["dataset"].values == name))
        searched = np.abs(part["rel_error_searched"].values)
        over_ranges = [_mape_pct(part["rel_error_searched"].values)] + [
            _mape_pct(part["rel_error_searched_range"].sel(search_range=r).values)
            for r in part["search_range"].values]
        rows.append({"dataset": name, "runs": int(part.sizes["run"]),
                     "MAPE_default_%": float(100 * np.abs(part["rel_error_default"].values).mean()),
                     "MAPE_searched_%": _mape_pct(searched),
                     "worst_searched_%": float(100 * np.nanmax(searched)) if np.isfinite(searched).any() else float("nan"),
                     "no_fitting_plan": int((~np.isfinite(searched)).sum()),
                     "MAPE_searched_low_%": float(np.nanmin(over_ranges)),
                     "MAPE_searched_high_%": float(np.nanmax(over_ranges))})
    return pd.DataFrame(rows).set_index("dataset")


__all__ = ["searched_dataset", "searched_summary", "searched_prediction", "searched_space", "searched_knobs"]
