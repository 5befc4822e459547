"""Predicted vs measured: the published runs the project carries and vTrain's measurements.

Published runs (``data/published_runs.csv``) report either a step time or Megatron's hardware
TFLOP/s per GPU (their eq. 3 counts the recomputed forward pass, as our hardware FLOPs do), so
each run is compared in the metric it was published in. vTrain's measured iteration times are
read from ``../shared/validation/vtrain`` at run time, never copied.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
import xarray as xr

from . import catalog, perfmodel
from .io import provenance
from .specs import ModelSpec, PlanSpec, RunSpec, SystemSpec

VTRAIN_SYSTEM = "dgx-a100-80gb"
VTRAIN_SCALE_OUT_GBps = 12.5  # vTrain's README: 800 Gb/s per 8-GPU node between nodes
VTRAIN_VOCAB = 50257  # GPT-2 tokenizer of Megatron-DeepSpeed's GPT examples ("about 50k")
# The runs of Megatron-LM (2021-22) and vTrain's Megatron-DeepSpeed predate FlashAttention in
# those code bases: their attention writes the s x s scores to HBM.
MEASURED_FLASH_ATTENTION = False


@dataclass(frozen=True)
class MeasuredRun:
    run: RunSpec
    dataset: str  # "published", "vtrain-multi", "vtrain-single"
    metric: str  # "step_time_s" or "hardware_tflops_per_gpu"
    measured: float
    source: str


def published_runs() -> list[MeasuredRun]:
    """The project's transcription of the published measured runs, as specs."""
    runs = []
    for row in catalog.published_runs():
        plan = {"tp": int(row["tp"]), "pp": int(row["pp"]), "dp": int(row["dp"]),
                "global_batch": int(row["global_batch"]), "recompute": row["recompute"],
                "sequence_parallel": row["sequence_parallel"] == "true", "zero": int(row["zero"]),
                "flash_attention": MEASURED_FLASH_ATTENTION}
        if plan["zero"] == 3:  # Narayanan et al. 2021 ran DeepSpeed's ZeRO-3
            plan["zero3_per_tensor"] = True
        # blank cells take the documented defaults (interleave 1, micro_batch 1): never searched
        for key in ("interleave", "micro_batch"):
            if row[key]:
                plan[key] = int(row[key])
        run = RunSpec.from_dict({"id": row["id"], "model": row["model"], "system": row["system"],
                                 "gpus": int(row["gpus"]), "plan": plan})
        runs.append(MeasuredRun(run, "published", row["metric"], float(row["value"]), row["source"]))
    return runs


def vtrain_runs(vtrain_dir: str | Path, which: str = "multi") -> list[MeasuredRun]:
    """vTrain's measured Megatron-DeepSpeed iteration times (``which`` = multi or single)."""
    path = Path(vtrain_dir) / f"ground_truth_{which}.csv"
    system = SystemSpec.from_catalog(VTRAIN_SYSTEM, {"scale_out_GBps_per_gpu": VTRAIN_SCALE_OUT_GBps})
    runs = []
    with open(path, encoding="utf-8-sig") as fh:
        for i, row in enumerate(csv.DictReader(fh)):
            hidden, heads, layers = int(row["hidden size"]), int(row["attention heads"]), int(row["# layers"])
            model = ModelSpec(name=f"gpt-h{hidden}-l{layers}", layers=layers, hidden=hidden, heads=heads,
                              kv_heads=heads, ffn_hidden=4 * hidden, ffn_type="gelu", vocab=VTRAIN_VOCAB,
                              seq_len=int(row["sequence length"]), source="vTrain ground truth")
            plan = PlanSpec.from_dict({"tp": int(row["tensor parallelism"]), "pp": int(row["pipeline parallelism"]),
                                       "dp": int(row["data parallelism"]), "micro_batch": int(row["micro batch"]),
                                       "global_batch": int(row["global batch"]), "recompute": "full",
                                       "flash_attention": MEASURED_FLASH_ATTENTION},
                                      gpus=int(row["# GPUs"]), where=f"vtrain-{which} row {i}")
            run = RunSpec(id=f"vtrain-{which}-{i}", model=model, system=system, plan=plan)
            runs.append(MeasuredRun(run, f"vtrain-{which}", "step_time_s",
                                    float(row["iteration time (ms)"]) / 1e3,
                                    "Bang et al. 2024 (vTrain, arXiv 2312.12391), ground_truth_" + which))
    return runs


def measured_runs(vtrain_dir: str | Path | None = None, include_vtrain_single: bool = False) -> list[MeasuredRun]:
    runs = published_runs()
    if vtrain_dir is not None and Path(vtrain_dir).is_dir():
        runs += vtrain_runs(vtrain_dir, "multi")
        if include_vtrain_single:
            runs += vtrain_runs(vtrain_dir, "single")
    return runs


def predicted_value(m: MeasuredRun, calibration: Mapping[str, float] | None = None) -> float:
    p = perfmodel.predict(m.run, calibration)
    return p.step_time_s if m.metric == "step_time_s" else p.hardware_tflops_per_gpu


def validation_dataset(vtrain_dir: str | Path | None = None, include_vtrain_single: bool = False,
                       calibration: Mapping[str, float] | None = None) -> xr.Dataset:
    """Predicted vs measured for every measured run (dim ``run``)."""
    runs = measured_runs(vtrain_dir, include_vtrain_single)
    predictions = [perfmodel.predict(m.run, calibration) for m in runs]
    predicted = np.array([p.step_time_s if m.metric == "step_time_s" else p.hardware_tflops_per_gpu
                          for m, p in zip(runs, predictions)])
    measured = np.array([m.measured for m in runs])
    rel = (predicted - measured) / measured
    ds = xr.Dataset(
        {
            "measured": ("run", measured, {"units": "metric", "long_name": "measured (in the row's metric)"}),
            "predicted": ("run", predicted, {"units": "metric", "long_name": "predicted (in the row's metric)"}),
            "rel_error": ("run", rel, {"units": "1", "long_name": "relative error (predicted - measured) / measured"}),
            "step_time_s_predicted": ("run", np.array([p.step_time_s for p in predictions]),
                                      {"units": "s", "long_name": "predicted step time"}),
            "mfu_predicted": ("run", np.array([p.mfu for p in predictions]),
                              {"units": "1", "long_name": "predicted model FLOPs utilisation"}),
        },
        coords={
            "run": [m.run.id for m in runs],
            "dataset": ("run", [m.dataset for m in runs]),
            "metric": ("run", [m.metric for m in runs]),
            "model": ("run", [m.run.model.name for m in runs]),
            "source": ("run", [m.source for m in runs]),
            "gpus": ("run", np.array([m.run.gpus for m in runs], dtype=np.int64)),
            "tp": ("run", np.array([m.run.plan.tp for m in runs], dtype=np.int64)),
            "pp": ("run", np.array([m.run.plan.pp for m in runs], dtype=np.int64)),
            "dp": ("run", np.array([m.run.plan.dp for m in runs], dtype=np.int64)),
        },
    )
    for name, key in (("published", "published"), ("vtrain-multi", "vtrain_multi"),
                      ("vtrain-single", "vtrain_single")):
        sel = ds["dataset"].values == name
        if sel.any():
            ape = np.abs(rel[sel])
            ds.attrs[f"mape_{key}"] = float(ape.mean())
            ds.attrs[f"max_abs_error_{key}"] = float(ape.max())
    ds.attrs["calibration"] = str(perfmodel.calibration_parameters("ampere", calibration))
    ds.attrs.update(provenance({"vtrain_dir": None if vtrain_dir is None else str(vtrain_dir),
                                "include_vtrain_single": bool(include_vtrain_single),
                                "calibration": dict(calibration or {})}))
    return ds


def summary(ds: xr.Dataset) -> pd.DataFrame:
    """One row per dataset: runs, MAPE, median and worst absolute percentage error."""
    rows = []
    for name in dict.fromkeys(ds["dataset"].values.tolist()):
        ape = 100 * np.abs(ds["rel_error"].values[ds["dataset"].values == name])
        rows.append({"dataset": name, "runs": int(ape.size), "MAPE_%": float(ape.mean()),
                     "median_APE_%": float(np.median(ape)), "worst_APE_%": float(ape.max())})
    return pd.DataFrame(rows).set_index("dataset")


def table(ds: xr.Dataset, dataset: str | None = None) -> pd.DataFrame:
    """Per-run comparison as a DataFrame."""
    df = ds[["measured", "predicted", "rel_error"]].to_dataframe()
    df = df[["dataset", "metric", "model", "gpus", "tp", "pp", "dp", "measured", "predicted", "rel_error"]]
    if dataset is not None:
        df = df[df["dataset"] == dataset]
    return df


__all__ = ["MeasuredRun", "published_runs", "vtrain_runs", "measured_runs", "validation_dataset", "summary",
           "table"]
