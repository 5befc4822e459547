"""Predicted vs measured: every published measurement the project carries.

Datasets (``MeasuredRun.dataset``):

- ``published``: Megatron-LM's A100 runs (Narayanan et al. 2021, Korthikanti et al. 2022;
  ``data/published_runs.csv``), in the metric each was published in (a step time or Megatron's
  hardware TFLOP/s per GPU, whose eq. 3 counts the recomputed forward pass as our hardware FLOPs do);
- ``vtrain-multi`` and ``vtrain-single``: vTrain's measured Megatron-DeepSpeed iteration times
  (``data/vtrain``, MIT licence); the single-node runs (small layers, where the host's time per
  layer shows) are fitted too, and printed by ``trainscale validate --all``;
- ``<stack>-<generation>`` (``megatron-hopper``, ``nemo-hopper``, ``nemo-blackwell``, ``fsdp-hopper``,
  ``fsdp-ampere``, ``deepspeed-ampere``): public runs of other stacks and generations
  (``data/published_runs_stacks.csv``, sources in ``published_runs_stacks.md``), unless the file's
  ``dataset`` column names another: the runs with ``torch.compile`` form ``fsdp-compiled``, which is
  never fitted: it tests the fitted eager element-wise traffic of FSDP by predicting the same models
  compiled (plan ``compiled: true``); BigScience's layout trials before BLOOM form
  ``deepspeed-trials``, never fitted either (:data:`NOT_FITTED` says why).

A knob a source leaves blank takes the documented default of its stack and era
(:data:`UNPUBLISHED_DEFAULTS`), never a value searched per run. :func:`searched_dataset` asks the
planner's question beside it: with every published field fixed, which throughput does the plan
search (:func:`trainscale.model.perfmodel.search`, as ``trainscale search --fix ... --search ...``) find
when only the knobs the source left blank (:data:`SEARCHED_KNOBS`) are searched?
"""

from __future__ import annotations

import csv
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
import xarray as xr

from . import catalog, perfmodel
from ..common.io import provenance
from .specs import POSITION_EMBEDDINGS, RECOMPUTE_MODES, ModelSpec, PlanSpec, RunSpec, SpecError, SystemSpec

VTRAIN_SYSTEM = "dgx-a100-80gb"
VTRAIN_SCALE_OUT_GBps = 12.5  # vTrain's README: 800 Gb/s per 8-GPU node between nodes
VTRAIN_VOCAB = 50257  # GPT-2 tokenizer of Megatron-DeepSpeed's GPT examples ("about 50k")
# The runs of Megatron-LM (2021-22) and vTrain's Megatron-DeepSpeed predate FlashAttention in
# those code bases: their attention writes the s x s scores to HBM.
MEASURED_FLASH_ATTENTION = False
STACKS_FILE = "published_runs_stacks.csv"
# Validated, never fitted (named in the ``dataset`` column of published_runs_stacks.csv): the compiled
# FSDP runs test the eager stack's fitted element-wise traffic; BigScience's 39 layout trials before
# BLOOM (iteration-2 snapshots on Jean Zay) test DeepSpeed at 384 GPUs. Fitted, the trials lowered
# Ampere's GEMM efficiency (0.776 -> 0.757) and raised the left-out error of the eight other fitted
# datasets by 5.7 points in sum (80.0 -> 85.7, trainscale calibrate --cv, 2026-12-04): a shortfall
# of that cluster and those trials, which no generation or stack parameter should absorb.
# bridge-2602, bridge-2604, bridge-2606: every later release of the same archive (26.02 to 26.06.01, point releases
# with their release), transcribed by data/bridge_archive.py: validated, never fitted (issue 36).
ARCHIVE_DATASETS = ("bridge-2602", "bridge-2604", "bridge-2606")
NOT_FITTED = ("fsdp-compiled", "deepspeed-trials", "bridge-mla", "bridge-hopper", "bridge-blackwell", *ARCHIVE_DATASETS)
# bridge-mla: DeepSeek-V3's rows of the Megatron-Bridge 25.11 tables; the model has no multi-head latent
# attention (priced as 128-head MHA, about 2.5x MLA's attention weights) nor multi-token prediction, so
# they are validated, never fitted (issue 36).
# bridge-hopper, bridge-blackwell: the other rows of those tables (FP8, MXFP8 and BF16; dense Llama 3 and MoE
# Qwen3 / GPT-OSS), one dataset per generation. Not fitted yet: their MoE rows are priced 30-190% too fast
# (the token dispatch's host synchronisation and the per-expert kernels are not modelled), and a fit now would
# let them pull Hopper's and Blackwell's GEMM efficiency; the FP8 GEMM factor (lowp_gemm_efficiency) stays at
# its prior until they are fitted as their own datasets (issue 36).
# Fitted, but kept as a dataset of their own (not pooled into ``<stack>-<generation>``), so that
# cross-validation leaves each such source out on its own. MosaicML's MPT throughput table
# (llm-foundry, 18 runs on 128-512 H100s, added 2026-12-05) was first held out; it showed that the
# eager element-wise factor belongs to the ops eager code decomposes (kernels.layer.eager_chain_factor),
# after which it was no longer a blind test. By the trials' rule it is fitted: with it in, the
# left-out error of the nine other fitted datasets falls (99.5 -> 97.1 in sum; fsdp-hopper 8.3 -> 6.5,
# nemo-hopper 10.7 -> 9.9, none up by more than 0.07; trainscale calibrate --cv, 2026-12-06), and its
# own left-out error (8.1%) is the error it had held out.
SEPARATE_FITTED = ("fsdp-mosaic",)

# Knobs a source leaves blank, per stack: the defaults of the code the runs used (2024-25).
# NeMo 2.0 performance recipes: Megatron-Core + Transformer Engine (fused attention), sequence
# parallelism and TP communication overlap wherever tp > 1, the distributed optimizer, overlapped
# gradient reduction, no recomputation. Megatron-Core (README scaling table, 2024): the same, as
# its text states ("fine-grained overlapping of data-parallel (--overlap-grad-reduce
# --overlap-param-gather), tensor-parallel (--tp-comm-overlap) and pipeline-parallel communication";
# NVIDIA/Megatron-LM README, "Training Speed and Scalability", July 2024).
# PyTorch FSDP: torch.compile is off unless a source says it was on (torchtitan's job configs
# default `compile = false`; fms-fsdp's `use_torch_compile` is the README's separate 'compile' table).
# FSDP (torchtitan, fms-fsdp): SDPA flash attention, prefetching.
# BLOOM's Megatron-DeepSpeed: no flash attention, ZeRO-1.
UNPUBLISHED_DEFAULTS = {
    "nemo": {"recompute": "none", "flash_attention": True, "zero": 1, "overlap_grad_reduce": True,
             "sequence_parallel": "tp>1", "tp_comm_overlap": "tp>1"},
    "megatron": {"recompute": "none", "flash_attention": True, "zero": 1, "overlap_grad_reduce": True,
                 "sequence_parallel": "tp>1", "tp_comm_overlap": "tp>1"},
    "fsdp": {"recompute": "none", "flash_attention": True, "zero": 3, "overlap_grad_reduce": True,
             "sequence_parallel": "tp>1", "compiled": False, "tp_comm_overlap": False},
    "deepspeed": {"recompute": "full", "flash_attention": False, "zero": 1, "sequence_parallel": False,
                  "overlap_grad_reduce": False, "tp_comm_overlap": False},
}
# Every measured run gives every knob whose default is the stack's (specs.STACK_DEFAULT_FIELDS): these
# are the settings of the runs' code and era, never the stack defaults of data/stack_defaults.yaml, so
# that a change to those defaults cannot move a measured run (tests/test_stack_defaults.py)


@dataclass(frozen=True)
class MeasuredRun:
    run: RunSpec
    dataset: str
    metric: str  # step_time_s, hardware_tflops_per_gpu, model_tflops_per_gpu, tokens_per_s_per_gpu
    measured: float
    source: str
    unpublished: tuple = ()  # plan knobs (of SEARCHED_KNOBS) the source leaves blank
    memory_reported_GB: float = float("nan")  # per-GPU memory the source reports (NaN: none)


# The knobs a planner tunes that sources often leave blank, and the values searched for them when
# they do (searched_dataset). Interleaving is searched only where the stack has an interleaved
# schedule (Megatron-LM, NeMo; DeepSpeed's pipeline engine and FSDP have none) and pp > 1.
SEARCHED_KNOBS = {"interleave": [1, 2, 3, 4, 6, 8], "micro_batch": [1, 2, 4, 8, 16],
                  "recompute": ["none", "selective", "full"]}
INTERLEAVED_STACKS = ("megatron", "nemo")
# The searched values are an analysis choice that moves the result: searched_dataset also prices
# narrower ranges (the largest micro-batch, the deepest interleaving tried), whose spread is reported.
SEARCH_RANGES = {f"micro-batch <= {cap}": {"micro_batch": [b for b in SEARCHED_KNOBS["micro_batch"] if b <= cap]}
                 for cap in (1, 2, 4, 8)}
SEARCH_RANGES.update({f"interleave <= {cap}": {"interleave": [v for v in SEARCHED_KNOBS["interleave"] if v <= cap]}
                      for cap in (1, 2, 4)})


def _paper_blank_knobs(row: Mapping, keys=("interleave", "micro_batch"),
                       file: str = "published_runs.csv") -> tuple:
    """The knobs (of ``keys``) a published run's source leaves blank: blank cells, and those
    (``not_in_paper``) whose value is inferred from elsewhere, such as the authors' scripts or the
    code the source names (the run is priced with that value; the planner's question still searches
    them)."""
    other = set((row.get("not_in_paper") or "").split())
    if not other <= set(keys):
        raise ValueError(f"{file}: row {row['id']}: not_in_paper = {row['not_in_paper']!r} is "
                         f"invalid; valid: blank or space-separated names of {', '.join(sorted(keys))}")
    return tuple(key for key in keys if not row.get(key) or key in other)


def _flag(row: Mapping, key: str, file: str) -> bool | None:
    """A true/false cell of a data file: None where blank; any other value is refused with one line."""
    cell = row.get(key) or ""
    if cell not in ("", "true", "false"):
        raise ValueError(f"{file}: row {row.get('id') or row.get('plan_id')}: {key} = {cell!r} is invalid; "
                         "valid: blank, true or false")
    return None if cell == "" else cell == "true"


def vtrain_dir(path: str | Path | None = None) -> Path | None:
    """The vTrain folder: ``path`` if given, else the copy shipped in ``trainscale/data/vtrain``."""
    folder = Path(path) if path is not None else catalog.data_path("vtrain")
    return folder if (folder / "ground_truth_multi.csv").is_file() else None


def published_runs() -> list[MeasuredRun]:
    """Megatron-LM's published A100 runs (``data/published_runs.csv``), as specs."""
    runs = []
    for row in catalog.published_runs():
        plan = {"tp": int(row["tp"]), "pp": int(row["pp"]), "dp": int(row["dp"]),
                "global_batch": int(row["global_batch"]), "recompute": row["recompute"],
                "sequence_parallel": bool(_flag(row, "sequence_parallel", "published_runs.csv")),
                "zero": int(row["zero"]), "flash_attention": MEASURED_FLASH_ATTENTION,
                "overlap_grad_reduce": False, "tp_comm_overlap": False}  # unless the row says otherwise (below)
        if plan["zero"] == 3:  # Narayanan et al. 2021 ran DeepSpeed's ZeRO-3, which prefetches parameters
            # (stage3_prefetch_bucket_size) and overlaps the reduction (overlap_comm defaults to true at stage 3)
            plan.update(zero3_per_tensor=True, stack="deepspeed", overlap_grad_reduce=True)
        # blank cells take the documented defaults (interleave 1, micro_batch 1): never searched
        for key in ("interleave", "micro_batch"):
            if row[key]:
                plan[key] = int(row[key])
        overlap = _flag(row, "overlap_grad_reduce", "published_runs.csv")
        if overlap is not None:  # Megatron-LM 2021: --DDP-impl torch overlaps, local does not
            plan["overlap_grad_reduce"] = overlap
        async_bwd = _flag(row, "tp_async_backward", "published_runs.csv")
        if async_bwd is not None:  # blank: the stack's (Megatron-LM's asynchronous backward, since September 2021)
            plan["tp_async_backward"] = async_bwd
        run = RunSpec.from_dict({"id": row["id"], "model": row["model"], "system": row["system"],
                                 "gpus": int(row["gpus"]), "plan": plan})
        runs.append(MeasuredRun(run, "published", row["metric"], float(row["value"]), row["source"],
                                _paper_blank_knobs(row)))
    return runs


def _position_embedding(row: Mapping) -> str:
    """A row's ``position_embedding`` cell: blank (the FFN's convention) or one of
    :data:`~trainscale.model.specs.POSITION_EMBEDDINGS`; anything else is refused with one line."""
    cell = row.get("position_embedding") or ""
    if cell and cell not in POSITION_EMBEDDINGS:
        raise ValueError(f"{STACKS_FILE}: row {row.get('id')}: position_embedding = {cell!r} is invalid; "
                         f"valid: blank, {', '.join(POSITION_EMBEDDINGS)}")
    return cell


def _public_model(row: Mapping) -> str | ModelSpec:
    positions = _position_embedding(row)
    if row["model"] in catalog.models():
        if positions:
            raise ValueError(f"{STACKS_FILE}: row {row.get('id')}: position_embedding = {positions!r} is "
                             f"invalid for the catalog model {row['model']}; valid: blank (models.yaml gives it)")
        return row["model"]
    hidden, heads = int(row["hidden"]), int(row["heads"])
    moe = {key: int(row[key]) for key in MOE_COLUMNS if row.get(key)}
    if not moe:  # the dense shape, as before
        return ModelSpec(name=row["model"], layers=int(row["layers"]), hidden=hidden, heads=heads,
                         kv_heads=int(row["kv_heads"] or heads), ffn_hidden=int(row["ffn_hidden"] or 4 * hidden),
                         ffn_type=row["ffn_type"] or "gelu", vocab=int(row["vocab"]), seq_len=int(row["seq_len"]),
                         source=row["source"], position_embedding=positions)
    shape = {"layers": int(row["layers"]), "hidden": hidden, "heads": heads, "kv_heads": int(row["kv_heads"] or heads),
             "ffn_hidden": int(row["ffn_hidden"] or 4 * hidden), "ffn_type": row["ffn_type"] or "gelu",
             "vocab": int(row["vocab"]), "seq_len": int(row["seq_len"]), "source": row["source"],
             "position_embedding": positions, **moe}
    return ModelSpec.from_dict(shape, name=row["model"], where=f"{STACKS_FILE}: row {row.get('id')}")


# model columns beyond the dense shape (issue 36): experts, attention width, shared and leading dense layers
MOE_COLUMNS = ("experts", "top_k", "shared_experts", "shared_expert_ffn_hidden", "dense_layers", "dense_ffn_hidden",
               "kv_channels")


def _public_plan(row: Mapping) -> dict:
    stack = row["stack"]
    tp = int(row["tp"])
    plan = {"tp": tp, "pp": int(row["pp"]), "global_batch": int(row["global_batch"]), "stack": stack}
    for key in ("dp", "cp", "interleave", "micro_batch", "zero", "ep", "shard_group"):
        if row.get(key):
            plan[key] = int(row[key])
    if row["recompute"]:
        plan["recompute"] = row["recompute"]
    for key in ("sequence_parallel", "compiled", "grad_reduce_fp32"):
        value = _flag(row, key, STACKS_FILE)
        if value is not None:
            plan[key] = value
    if row.get("recompute_share"):
        plan["recompute_share"] = float(row["recompute_share"])
    if row.get("rotary_kernel"):  # a code base other than the stack's reference (PlanSpec checks the name)
        plan["rotary_kernel"] = row["rotary_kernel"]
    if row.get("etp"):
        plan["etp"] = int(row["etp"])
    for key in ("precision", "fp8_recipe"):  # PlanSpec refuses an unknown name with the valid ones
        if row.get(key):
            plan[key] = row[key]
    if _flag(row, "custom_pipeline_layout", STACKS_FILE):
        plan["custom_pipeline_layout"] = True
    for key, value in UNPUBLISHED_DEFAULTS[stack].items():
        if key not in plan:
            plan[key] = tp > 1 if value == "tp>1" else value
    if "asynctp" in row["id"]:  # torchtitan's asynchronous TP overlaps its collectives with the GEMMs
        plan.update(tp_comm_overlap=True, sequence_parallel=True)
    if not plan.get("sequence_parallel"):
        plan["tp_comm_overlap"] = False
    return plan


def _public_dataset(row: Mapping, default: str) -> str:
    """The dataset of a public run: ``<stack>-<generation>``, or the set the ``dataset`` column names
    (one of :data:`NOT_FITTED` or :data:`SEPARATE_FITTED`)."""
    named = row.get("dataset") or ""
    valid = NOT_FITTED + SEPARATE_FITTED
    if named and named not in valid and named != default:
        raise ValueError(f"{STACKS_FILE}: row {row['id']}: dataset = {named!r} is invalid; valid: blank "
                         f"({default}) or a named set, one of {', '.join(valid)}")
    return named or default


def _reported_memory_GB(row: Mapping) -> float:
    text = row.get("memory_reported_GB") or ""
    try:
        return float(text) if text else float("nan")
    except ValueError:
        raise ValueError(f"{STACKS_FILE}: row {row['id']}: memory_reported_GB = {text!r} is invalid; "
                         "valid: a number of GB, or blank") from None


def public_runs(skipped: list | None = None) -> list[MeasuredRun]:
    """Public runs of other stacks and generations (``data/published_runs_stacks.csv``). Rows
    without a published tp and pp cannot be priced; they are left out (appended to ``skipped``)."""
    runs = []
    with open(catalog.data_path(STACKS_FILE), encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            if not row["tp"] or not row["pp"]:
                if skipped is not None:
                    skipped.append((row["id"], "tp/pp not published"))
                continue
            model = _public_model(row)
            if not isinstance(model, str) and not row["seq_len"]:
                raise ValueError(f"{STACKS_FILE}: row {row['id']}: seq_len is blank")
            if isinstance(model, str) and row["seq_len"]:
                base = catalog.models()[model]
                if int(row["seq_len"]) != int(base["seq_len"]):
                    model = dict(ModelSpec.from_catalog(model).__dict__, seq_len=int(row["seq_len"]))
            run = RunSpec.from_dict({"id": row["id"], "model": model, "system": row["system"],
                                     "gpus": int(row["gpus"]), "plan": _public_plan(row)})
            dataset = _public_dataset(row, f"{row['stack']}-{run.system.generation}")
            runs.append(MeasuredRun(run, dataset, row["metric"], float(row["value"]), row["source"],
                                    _paper_blank_knobs(row, tuple(SEARCHED_KNOBS), STACKS_FILE),
                                    _reported_memory_GB(row)))
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
                                       "flash_attention": MEASURED_FLASH_ATTENTION, "stack": "deepspeed",
                                       # vTrain's Megatron-DeepSpeed runs keep the whole optimizer state per
                                       # rank (ZeRO 0), not Megatron-DeepSpeed's --zero-stage default 1
                                       "zero": 0, "sequence_parallel": False, "overlap_grad_reduce": False,
                                       "tp_comm_overlap": False},
                                      gpus=int(row["# GPUs"]), where=f"vtrain-{which} row {i}")
            run = RunSpec(id=f"vtrain-{which}-{i}", model=model, system=system, plan=plan)
            runs.append(MeasuredRun(run, f"vtrain-{which}", "step_time_s",
                                    float(row["iteration time (ms)"]) / 1e3,
                                    "Bang et al. 2024 (vTrain, arXiv 2312.12391), ground_truth_" + which))
    return runs


def measured_runs(vtrain_dir: str | Path | None = None, include_vtrain_single: bool = False,
                  include_public: bool = True) -> list[MeasuredRun]:
    """Every measured run: published, the public runs of other stacks (``include_public``) and,
    where ``vtrain_dir`` holds them, vTrain's."""
    runs = published_runs()
    if include_public:
        runs += public_runs()
    if vtrain_dir is not None and Path(vtrain_dir).is_dir():
        runs += vtrain_runs(vtrain_dir, "multi")
        if include_vtrain_single:
            runs += vtrain_runs(vtrain_dir, "single")
    return runs


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
    _, best = perfmodel.search(m.run.model, m.run.system, m.run.gpus, plan.global_batch, top=1,
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


__all__ = ["unfitted_precisions", "MeasuredRun", "searched_dataset", "searched_summary", "searched_prediction", "searched_space", "searched_knobs", "SEARCHED_KNOBS", "SEARCH_RANGES", "NOT_FITTED", "plan_ranking", "reported_memory", "nccl_allreduce", "layer_times", "published_runs", "public_runs", "vtrain_runs", "vtrain_dir", "metric_value", "measured_runs", "validation_dataset", "summary",
           "table"]


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
