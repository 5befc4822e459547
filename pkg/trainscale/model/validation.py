"""Predicted vs measured: the model's prediction of every measured run (:mod:`.measured`) as one xarray
Dataset (:func:`validation_dataset`), its errors per dataset, precision, size class and scale group, the
left-out errors of the fit, and the side-by-side checks of memory (Calculon), collectives (nccl-tests) and
per-layer times. The measured runs' names (:func:`measured_runs`, :data:`NOT_FITTED`, ...) are re-exported
from :mod:`.measured`; the planner's question on the same runs is :mod:`.searched`.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
import xarray as xr

from . import catalog, perfmodel
from ..common.io import provenance
from .measured import (ARCHIVE_DATASETS, INTERLEAVED_STACKS, MEASURED_FLASH_ATTENTION, MOE_COLUMNS, NOT_FITTED,
                       SEARCH_RANGES, SEARCHED_KNOBS, SEPARATE_FITTED, STACKS_FILE, UNPUBLISHED_DEFAULTS,
                       VTRAIN_SCALE_OUT_GBps, VTRAIN_SYSTEM, VTRAIN_VOCAB, MeasuredRun, _flag, measured_runs,
                       public_runs, published_runs, vtrain_dir, vtrain_runs)
from .specs import RECOMPUTE_MODES, RunSpec, SpecError, SystemSpec

def metric_value(p: perfmodel.Prediction, metric: str, gpus: int) -> float:
    """A prediction in the metric a run was published in."""
    if metric == "step_time_s":
        return p.step_time_s
    if metric == "hardware_tflops_per_gpu":
        return p.hardware_tflops_per_gpu
    if metric == "model_tflops_per_gpu":
        return p.model_tflops_per_gpu
    if metric == "tokens_per_s_per_gpu":
        return p.tokens_per_s / gpus
    raise ValueError(f"metric {metric!r} is not one of step_time_s, hardware_tflops_per_gpu, "
                     "model_tflops_per_gpu, tokens_per_s_per_gpu")


def predicted_value(m: MeasuredRun, calibration: Mapping[str, float] | None = None) -> float:
    return metric_value(perfmodel.predict(m.run, calibration), m.metric, m.run.gpus)


COORD_NAMES = {"run": "measured run (id)", "dataset": "dataset the run belongs to", "metric": "metric the source reports",
               "model": "model", "source": "where the measurement is published", "gpus": "GPUs",
               "tp": "tensor-parallel degree", "pp": "pipeline-parallel degree", "dp": "data-parallel degree",
               "global_batch": "global batch (sequences per step)",
               "stack": "software stack", "precision": "GEMM precision of the run (bf16, fp8, mxfp8, nvfp4)",
               "kind": "dense or mixture-of-experts model", "generation": "GPU generation",
               "fitted": "used to fit the calibration"}


def left_out_mape(datasets) -> np.ndarray:
    """Per run, the cross-validated MAPE of its dataset (left out of the fit), from calibration_fitted.yaml."""
    left_out = catalog.stored_cross_validation().get("leave_one_dataset_out", {})
    return np.array([float(left_out[d]["mape"]) if d in left_out else np.nan for d in datasets])


def size_out_by_dataset(cv: dict) -> dict:
    """Per dataset, the error of its runs when their model-size class is left out of the fit.

    Every run lies in one size class, so the leave-one-size-out refits predict each run exactly once;
    this gathers those predictions per dataset: ``{dataset: {"runs", "mape", "worst"}}`` (MAPE
    weighted by runs). Unlike leaving the whole dataset out, the dataset's other sizes stay in the
    fit: it asks how the model carries to a new model size on a known stack and generation."""
    parts: dict[str, list[dict]] = {}
    for entry in cv.get("leave_one_size_out", {}).values():
        for name, errors in entry.get("by_dataset", {}).items():
            parts.setdefault(name, []).append(errors)
    out = {}
    for name, errors in parts.items():
        runs = sum(int(e["runs"]) for e in errors)
        out[name] = {"runs": runs, "mape": sum(float(e["mape"]) * int(e["runs"]) for e in errors) / runs,
                     "worst": max(float(e["worst"]) for e in errors)}
    return out


def size_out_mape(datasets) -> np.ndarray:
    """Per run, the MAPE of its dataset's runs when each run's model-size class is left out of the fit
    (:func:`size_out_by_dataset`, from calibration_fitted.yaml)."""
    size_out = size_out_by_dataset(catalog.stored_cross_validation())
    return np.array([float(size_out[d]["mape"]) if d in size_out else np.nan for d in datasets])


def validation_dataset(vtrain_dir: str | Path | None = None, include_vtrain_single: bool = False,
                       calibration: Mapping[str, float] | None = None, include_public: bool = True) -> xr.Dataset:
    """Predicted vs measured for every measured run (dim ``run``)."""
    runs = measured_runs(vtrain_dir, include_vtrain_single, include_public)
    predictions = [perfmodel.predict(m.run, calibration) for m in runs]
    predicted = np.array([metric_value(p, m.metric, m.run.gpus) for m, p in zip(runs, predictions)])
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
            "left_out_mape": ("run", left_out_mape([m.dataset for m in runs]),
                              {"units": "1", "long_name": "MAPE of the run's dataset when that dataset is left out "
                               "of the fit (trainscale calibrate --cv; NaN: dataset not fitted)"}),
            "size_out_mape": ("run", size_out_mape([m.dataset for m in runs]),
                              {"units": "1", "long_name": "MAPE of the run's dataset when each of its runs' model-size "
                               "class is left out of the fit (trainscale calibrate --cv; NaN: dataset not fitted)"}),
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
            "global_batch": ("run", np.array([m.run.plan.global_batch for m in runs], dtype=np.int64)),
            "stack": ("run", [m.run.plan.stack for m in runs]),
            "precision": ("run", [m.run.plan.precision for m in runs]),
            "kind": ("run", ["moe" if m.run.model.is_moe else "dense" for m in runs]),
            "generation": ("run", [m.run.system.generation for m in runs]),
            "fitted": ("run", np.array([m.dataset not in NOT_FITTED for m in runs])),
        },
    )
    for name, long_name in COORD_NAMES.items():
        ds[name].attrs["long_name"] = long_name
    for name in ("gpus", "tp", "pp", "dp", "global_batch", "fitted"):
        ds[name].attrs["units"] = "1"
    for name in dict.fromkeys(ds["dataset"].values.tolist()):
        key = name.replace("-", "_")
        ape = np.abs(rel[ds["dataset"].values == name])
        ds.attrs[f"mape_{key}"] = float(ape.mean())
        ds.attrs[f"max_abs_error_{key}"] = float(ape.max())
    for key, value in scale_group_attrs(ds).items():
        ds.attrs[key] = value
    ds.attrs["calibration"] = json.dumps({f"{g}/{st}": perfmodel.calibration_parameters(g, calibration, st)
                                          for g, st in sorted({(m.run.system.generation, m.run.plan.stack)
                                                               for m in runs})}, sort_keys=True)
    ds.attrs.update(provenance({"vtrain_dir": None if vtrain_dir is None else str(vtrain_dir),
                                "include_vtrain_single": bool(include_vtrain_single),
                                "calibration": dict(calibration or {})}))
    return ds


MIN_PLANS = 5  # a model measured at one GPU count in at least this many plans is ranked


def plan_ranking(ds: xr.Dataset, min_plans: int = MIN_PLANS) -> pd.DataFrame:
    """Does the model order a planner's choices as measured? For every model of a dataset measured
    at one GPU count in at least ``min_plans`` plans (layout, micro-batch and global batch; the
    step-time rows of :func:`validation_dataset`): Spearman's rank correlation of predicted and
    measured time per sequence (step time / global batch, so plans at different global batches
    compare), and the regret of trusting the model: how much longer per sequence its fastest plan
    measured than the measured fastest (0: it picks the best)."""
    from scipy.stats import spearmanr

    steps = ds.isel(run=np.flatnonzero(ds["metric"].values == "step_time_s"))
    keys = list(zip(steps["dataset"].values.tolist(), steps["model"].values.tolist(), steps["gpus"].values.tolist()))
    rows = []
    for key in dict.fromkeys(keys):
        sel = np.array([k == key for k in keys])
        if sel.sum() < min_plans:
            continue
        batch = steps["global_batch"].values[sel]
        measured = steps["measured"].values[sel] / batch
        predicted = steps["predicted"].values[sel] / batch
        runs = steps["run"].values[sel]
        pick, best = int(np.argmin(predicted)), int(np.argmin(measured))
        rows.append((key[0], key[1], key[2], int(sel.sum()), float(spearmanr(predicted, measured)[0]),
                     str(runs[pick]), str(runs[best]), 100.0 * (measured[pick] / measured[best] - 1.0)))
    return pd.DataFrame(rows, columns=["dataset", "model", "gpus", "plans", "spearman", "model_pick",
                                       "measured_best", "regret_%"])


def parity_by_precision(ds: xr.Dataset) -> pd.DataFrame:
    """One row per (dataset, precision, dense / MoE) group of :func:`validation_dataset`: runs, MAPE and
    worst absolute percentage error under the stored calibration, and ``fit``: ``in-sample`` where the dataset
    was fitted, ``held out`` where it never was (:data:`NOT_FITTED`)."""
    keys = list(zip(ds["dataset"].values.tolist(), ds["precision"].values.tolist(), ds["kind"].values.tolist()))
    ape = 100 * np.abs(ds["rel_error"].values)
    rows = []
    for key in dict.fromkeys(keys):
        sel = np.array([k == key for k in keys])
        rows.append({"dataset": key[0], "precision": key[1], "kind": key[2],
                     "fit": "held out" if key[0] in NOT_FITTED else "in-sample", "runs": int(sel.sum()),
                     "MAPE_%": float(ape[sel].mean()), "worst_APE_%": float(ape[sel].max())})
    return pd.DataFrame(rows)


def unfitted_precisions(ds: xr.Dataset) -> pd.DataFrame:
    """The precisions no fitted run uses (issue 36 item 3: a precision left out entirely), one row per
    (precision, dense / MoE) over every dataset: runs, MAPE and worst absolute percentage error. Their GEMMs are
    priced from the BF16 fit and the generation's peak ratio, so these errors are out of sample."""
    fitted = ~np.isin(ds["dataset"].values, NOT_FITTED)
    precision, kind = ds["precision"].values, ds["kind"].values
    left_out = sorted(set(precision.tolist()) - set(precision[fitted].tolist()))
    ape = 100 * np.abs(ds["rel_error"].values)
    rows = []
    for key in dict.fromkeys(zip(precision.tolist(), kind.tolist())):
        if key[0] not in left_out:
            continue
        sel = (precision == key[0]) & (kind == key[1])
        rows.append({"precision": key[0], "kind": key[1], "runs": int(sel.sum()), "MAPE_%": float(ape[sel].mean()),
                     "worst_APE_%": float(ape[sel].max())})
    return pd.DataFrame(rows, columns=["precision", "kind", "runs", "MAPE_%", "worst_APE_%"])


def summary(ds: xr.Dataset) -> pd.DataFrame:
    """One row per dataset: runs, MAPE, median and worst absolute percentage error."""
    rows = []
    for name in dict.fromkeys(ds["dataset"].values.tolist()):
        ape = 100 * np.abs(ds["rel_error"].values[ds["dataset"].values == name])
        rows.append({"dataset": name, "runs": int(ape.size), "MAPE_%": float(ape.mean()),
                     "median_APE_%": float(np.median(ape)), "worst_APE_%": float(ape.max())})
    return pd.DataFrame(rows).set_index("dataset")


LARGE_GPUS = 1000  # runs at this many GPUs or more form their own group (issue 35)


def too_fast_error(ds: xr.Dataset) -> np.ndarray:
    """Signed error of each run as a speed: predicted / measured throughput - 1 (for a step-time
    row, measured / predicted step - 1). Positive: the model is too fast."""
    rel = ds["rel_error"].values
    time_rows = ds["metric"].values == "step_time_s"
    return np.where(time_rows, 1.0 / (1.0 + rel) - 1.0, rel)


def scale_groups(ds: xr.Dataset, threshold: int = LARGE_GPUS) -> pd.DataFrame:
    """The runs at ``threshold`` GPUs or more as their own group, per dataset and in all, beside
    the runs below it: runs, MAPE, worst error, mean signed speed error (positive: too fast) and
    the slope of that signed error per doubling of the GPU count within the group (a systematic
    too-fast drift with scale shows as a positive slope)."""
    gpus = ds["gpus"].values
    fast = too_fast_error(ds)
    datasets = ds["dataset"].values
    rows = []
    for group, sel_g in ((f">= {threshold} GPUs", gpus >= threshold), (f"< {threshold} GPUs", gpus < threshold)):
        names = ["all"] + [n for n in dict.fromkeys(datasets.tolist()) if (sel_g & (datasets == n)).any()]
        for name in names:
            sel = sel_g & ((datasets == name) if name != "all" else True)
            if not sel.any():
                continue
            x = np.log2(gpus[sel].astype(float))
            slope = float(np.polyfit(x, fast[sel], 1)[0]) if np.ptp(x) > 0 and sel.sum() >= 3 else float("nan")
            rows.append({"group": group, "dataset": name, "runs": int(sel.sum()),
                         "MAPE_%": 100.0 * float(np.abs(ds["rel_error"].values[sel]).mean()),
                         "worst_APE_%": 100.0 * float(np.abs(ds["rel_error"].values[sel]).max()),
                         "mean_too_fast_%": 100.0 * float(fast[sel].mean()),
                         "too_fast_per_doubling_%": 100.0 * slope})
    return pd.DataFrame(rows)


def scale_group_attrs(ds: xr.Dataset, threshold: int = LARGE_GPUS) -> dict:
    """:func:`scale_groups`' totals as dataset attributes (``mape_gpus_ge_1000`` and the like)."""
    out = {}
    groups = scale_groups(ds, threshold)
    for _, row in groups[groups["dataset"] == "all"].iterrows():
        key = ("ge" if row["group"].startswith(">=") else "lt") + f"_{threshold}"
        out[f"mape_gpus_{key}"] = row["MAPE_%"] / 100.0
        out[f"mean_too_fast_gpus_{key}"] = row["mean_too_fast_%"] / 100.0
        out[f"runs_gpus_{key}"] = int(row["runs"])
    return out


def table(ds: xr.Dataset, dataset: str | None = None) -> pd.DataFrame:
    """Per-run comparison as a DataFrame."""
    df = ds[["measured", "predicted", "rel_error"]].to_dataframe()
    df = df[["dataset", "metric", "model", "gpus", "tp", "pp", "dp", "measured", "predicted", "rel_error"]]
    if dataset is not None:
        df = df[df["dataset"] == dataset]
    return df


# --------------------------------------------------------------------------- memory side by side with Calculon
CALCULON_FILE = "calculon_reference.csv"
CALCULON_MODELS = {"gpt3-175B": "gpt3-175b", "turing-530B": "gpt-530b", "megatron-22B": "gpt-22b"}
MEMORY_TERMS = ("block weights", "block optimizer states", "total without reserve")


def calculon_rows() -> list[dict]:
    """Calculon's per-GPU memory for eight GPT plans (``data/calculon_reference.csv``; how they were
    produced, and what each column is, in ``calculon_reference.md``)."""
    with open(catalog.data_path(CALCULON_FILE), encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def calculon_run(row: Mapping) -> RunSpec:
    """The plan of a Calculon reference row as a run: Calculon's optimizer sharding also shards the
    16-bit gradients, ZeRO stage 2 in our terms (stage 0 without sharding)."""
    plan = {"tp": int(row["tp"]), "pp": int(row["pp"]), "dp": int(row["dp"]),
            "micro_batch": int(row["micro_batch"]), "global_batch": int(row["global_batch"]),
            "interleave": int(row["interleave"]), "recompute": row["recompute"],
            "sequence_parallel": bool(_flag(row, "sequence_parallel", CALCULON_FILE)),
            "zero": 2 if _flag(row, "optimizer_sharding", CALCULON_FILE) else 0,
            # Calculon's plans are priced without fused attention and without overlap, whatever the stack's defaults
            "flash_attention": False, "overlap_grad_reduce": False, "tp_comm_overlap": False}
    return RunSpec.from_dict({"id": row["plan_id"], "model": CALCULON_MODELS[row["model"]],
                              "system": "dgx-a100-80gb", "gpus": int(row["gpus"]), "plan": plan})


def memory_side_by_side() -> xr.Dataset:
    """Per-GPU memory of ours and Calculon's on the same plans, for the terms both models count
    alike (``MEMORY_TERMS``): the weights and optimizer states of a stage's transformer blocks
    (Calculon puts ``ceil(L / p)`` blocks on every stage and no embedding) and the total without
    our 2 GiB reserve (Calculon holds none; the other differences are listed in the README)."""
    rows = calculon_rows()
    ours = np.empty((len(rows), len(MEMORY_TERMS)))
    theirs = np.empty_like(ours)
    for i, row in enumerate(rows):
        run = calculon_run(row)
        # Calculon's optimizer sharding is its model of Megatron, ZeRO-2 in ours, not a plan Megatron-LM's
        # distributed optimizer runs (data/stack_rules.yaml): priced as Calculon prices it, for the comparison
        p = perfmodel.predict(run, allow_unrunnable=True, warn=False)
        blocks = -(-run.model.layers // run.plan.pp)
        block_params = run.model.params_per_layer() / run.plan.tp * blocks
        shard = run.plan.dp if run.plan.zero else 1
        ours[i] = (2.0 * block_params / perfmodel.GiB, 12.0 * block_params / shard / perfmodel.GiB,
                   p.memory_gib_per_gpu - p.memory_breakdown_gib["reserved"])
        theirs[i] = (float(row["calculon_weight_GiB"]), float(row["calculon_optimizer_GiB"]),
                     float(row["calculon_total_GiB"]))
    described = {"units": "GiB"}
    ds = xr.Dataset(
        {"ours_GiB": (("plan", "term"), ours, {**described, "long_name": "per-GPU memory, trainscale"}),
         "calculon_GiB": (("plan", "term"), theirs, {**described, "long_name": "per-GPU memory, Calculon "
                                                                               "(calculon_reference.csv)"})},
        coords={"plan": ("plan", [r["plan_id"] for r in rows], {"long_name": "Calculon reference plan"}),
                "term": ("term", list(MEMORY_TERMS), {"long_name": "memory term both models count alike"})})
    ds["rel_difference"] = (ds["ours_GiB"] / ds["calculon_GiB"] - 1.0).assign_attrs(
        units="1", long_name="(ours - Calculon) / Calculon")
    ds.attrs.update(provenance({"calculon_file": CALCULON_FILE}), title="trainscale per-GPU memory side by side with Calculon",
                    calculon_commit=rows[0]["calculon_commit"])
    return ds


NCCL_TESTS_FILE = "nccl_allreduce_a100.csv"


def nccl_allreduce(system: str | SystemSpec = VTRAIN_SYSTEM, calibration: Mapping[str, float] | None = None) -> pd.DataFrame:
    """Intra-node all-reduce times measured with nccl-tests on vTrain's A100 node (2-8 GPUs, 1 MiB to
    1 GiB; ``data/vtrain/nccl_allreduce_a100.csv``, the mean of nccl-tests' out-of-place and in-place
    columns) beside :func:`trainscale.model.perfmodel.collective_time_s` on ``system``: a check of the
    collective formulas on measurements never fitted. ``regime`` is ``latency`` up to 16 MiB,
    ``bandwidth`` from 256 MiB, ``mixed`` between."""
    path = vtrain_dir() / NCCL_TESTS_FILE
    table = pd.read_csv(path)
    expected = ["gpus", "size_bytes", "time_out_of_place_ns", "time_in_place_ns"]
    if list(table.columns) != expected:
        raise SpecError(str(path), list(table.columns), f"expected the columns {', '.join(expected)}")
    measured = 0.5 * (table["time_out_of_place_ns"] + table["time_in_place_ns"]) / 1e3
    predicted = [1e6 * perfmodel.collective_time_s(system, "allreduce", float(b), int(n), calibration=calibration)
                 for n, b in zip(table["gpus"], table["size_bytes"])]
    size_mib = table["size_bytes"] / 2**20
    out = pd.DataFrame({"gpus": table["gpus"], "size_MiB": size_mib, "measured_us": measured,
                        "predicted_us": predicted})
    out["rel_error"] = out["predicted_us"] / out["measured_us"] - 1.0
    out["regime"] = np.where(size_mib <= 16, "latency", np.where(size_mib >= 256, "bandwidth", "mixed"))
    return out


def reported_memory() -> pd.DataFrame:
    """Per-GPU memory that a public source reports for a run (``memory_reported_GB`` of
    ``published_runs_stacks.csv``: BigScience's layout trials give nvidia-smi's figure for the
    embedding stages) beside the model's peak (:attr:`Prediction.memory_gib_per_gpu`). nvidia-smi
    also counts what PyTorch's caching allocator holds beyond its peak allocation, so the ratio
    ``predicted / reported`` is at most 1 where the model is right; ``GB`` is nvidia-smi's (MiB / 1024)."""
    rows = []
    for m in public_runs():
        if np.isfinite(m.memory_reported_GB):
            predicted = perfmodel.predict(m.run).memory_gib_per_gpu
            rows.append((m.run.id, m.dataset, m.memory_reported_GB, predicted, predicted / m.memory_reported_GB))
    return pd.DataFrame(rows, columns=["run", "dataset", "reported_GB", "predicted_GiB", "ratio"])


LAYER_TIMES_FILE = "layer_times.csv"


def layer_times(calibration: Mapping[str, float] | None = None) -> pd.DataFrame:
    """Measured seconds of one transformer layer's forward and backward pass (``data/layer_times.csv``:
    Korthikanti et al. 2022, Table 4, the 22B model under five recomputation / sequence-parallel
    settings) beside :func:`trainscale.model.perfmodel.layer_times` for the plan of the published run each
    row names, with the row's recomputation and sequence parallelism: a check of the per-layer terms
    (element-wise work replicated across tensor-parallel ranks, the backward's overlapped
    communication, the recomputed forward) on measurements never fitted. ``overhead`` is each row's
    forward + backward over the first row's (the paper's 'Overhead' column)."""
    runs = {m.run.id: m.run for m in published_runs()}
    rows = []
    with open(catalog.data_path(LAYER_TIMES_FILE), encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            if row["base_run"] not in runs:
                raise SpecError(f"{LAYER_TIMES_FILE}: row {row['id']}: base_run", row["base_run"],
                                "expected the id of a row of published_runs.csv")
            if row["recompute"] not in RECOMPUTE_MODES:
                raise SpecError(f"{LAYER_TIMES_FILE}: row {row['id']}: recompute", row["recompute"],
                                f"expected one of {', '.join(RECOMPUTE_MODES)}")
            base = runs[row["base_run"]]
            sp = _flag(row, "sequence_parallel", LAYER_TIMES_FILE)
            plan = dataclasses.replace(base.plan, recompute=row["recompute"], sequence_parallel=bool(sp))
            t = perfmodel.layer_times(base.model, base.system, plan, calibration)
            rows.append({"id": row["id"], "recompute": row["recompute"], "sequence_parallel": bool(sp),
                         "fwd_ms": float(row["fwd_ms"]), "bwd_ms": float(row["bwd_ms"]),
                         "predicted_fwd_ms": 1e3 * t["fwd_s"], "predicted_bwd_ms": 1e3 * t["bwd_s"]})
    out = pd.DataFrame(rows).set_index("id")
    out["measured_ms"] = out["fwd_ms"] + out["bwd_ms"]
    out["predicted_ms"] = out["predicted_fwd_ms"] + out["predicted_bwd_ms"]
    out["rel_error"] = out["predicted_ms"] / out["measured_ms"] - 1.0
    out["overhead"] = out["measured_ms"] / out["measured_ms"].iloc[0] - 1.0
    out["predicted_overhead"] = out["predicted_ms"] / out["predicted_ms"].iloc[0] - 1.0
    return out


__all__ = ["metric_value", "predicted_value", "validation_dataset", "left_out_mape", "size_out_mape", "size_out_by_dataset",
           "plan_ranking", "parity_by_precision", "unfitted_precisions", "summary", "scale_groups", "scale_group_attrs",
           "too_fast_error", "table", "reported_memory", "nccl_allreduce", "layer_times", "memory_side_by_side",
           "calculon_rows", "calculon_run", "COORD_NAMES", "LARGE_GPUS", "MIN_PLANS",
           # re-exported from .measured
           "MeasuredRun", "measured_runs", "published_runs", "public_runs", "vtrain_runs", "vtrain_dir", "NOT_FITTED",
           "ARCHIVE_DATASETS", "SEPARATE_FITTED", "STACKS_FILE", "UNPUBLISHED_DEFAULTS", "SEARCHED_KNOBS",
           "SEARCH_RANGES", "INTERLEAVED_STACKS", "MEASURED_FLASH_ATTENTION", "MOE_COLUMNS", "VTRAIN_SYSTEM",
           "VTRAIN_SCALE_OUT_GBps", "VTRAIN_VOCAB"]
