"""The measured runs the model is judged on: every published measurement the project carries, as
:class:`MeasuredRun` (a :class:`~trainscale.model.specs.RunSpec`, the metric its source reports, its dataset).

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
(:data:`UNPUBLISHED_DEFAULTS`), never a value searched per run; the knobs a planner would search there are
:data:`SEARCHED_KNOBS` (:mod:`.searched` asks that question).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from . import catalog
from .specs import POSITION_EMBEDDINGS, ModelSpec, PlanSpec, RunSpec, SystemSpec

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
# bridge-mla: DeepSeek-V3's rows of the Megatron-Bridge 25.11 tables, validated, never fitted (issue 36). Priced as
# 128-head MHA (about 2.5x the attention weights) until 2026-12-07, with its multi-head latent attention since
# (trainscale.kernels.attention); multi-token prediction is not modelled.
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
        for key in ("position_embedding", "expert_bias", "activation_func_clamp_value") + DROPOUT_COLUMNS:
            if row.get(key):
                raise ValueError(f"{STACKS_FILE}: row {row.get('id')}: {key} = {row[key]!r} is invalid for the "
                                 f"catalog model {row['model']}; valid: blank (models.yaml gives it)")
        return row["model"]
    hidden, heads = int(row["hidden"]), int(row["heads"])
    moe = {key: int(row[key]) for key in MOE_COLUMNS if row.get(key)}
    dropouts = {key: _number(row, key) for key in DROPOUT_COLUMNS if row.get(key)}
    shape = {"layers": int(row["layers"]), "hidden": hidden, "heads": heads, "kv_heads": int(row["kv_heads"] or heads),
             "ffn_hidden": int(row["ffn_hidden"] or 4 * hidden), "ffn_type": row["ffn_type"] or "gelu",
             "vocab": int(row["vocab"]), "seq_len": int(row["seq_len"]), "source": row["source"],
             "position_embedding": positions, **moe, **dropouts}
    if row.get("expert_bias"):
        shape["expert_bias"] = _flag(row, "expert_bias", STACKS_FILE)
    if row.get("activation_func_clamp_value"):
        shape["activation_func_clamp_value"] = _number(row, "activation_func_clamp_value")
    return ModelSpec.from_dict(shape, name=row["model"], where=f"{STACKS_FILE}: row {row.get('id')}")


def _number(row: Mapping, key: str) -> float:
    try:
        return float(row[key])
    except ValueError:
        raise ValueError(f"{STACKS_FILE}: row {row.get('id')}: {key} = {row[key]!r} is invalid; valid: a number, "
                         "or blank") from None


# the dropout probabilities a row's model trains with (blank: Megatron-Core's 0.1, or the catalog's)
DROPOUT_COLUMNS = ("hidden_dropout", "attention_dropout")
# model columns beyond the dense shape (issue 36): experts, attention width, shared and leading dense layers
MOE_COLUMNS = ("experts", "top_k", "shared_experts", "shared_expert_ffn_hidden", "dense_layers", "dense_ffn_hidden",
               "kv_channels", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
               "mtp_num_layers")


def _public_plan(row: Mapping) -> dict:
    stack = row["stack"]
    tp = int(row["tp"])
    plan = {"tp": tp, "pp": int(row["pp"]), "global_batch": int(row["global_batch"]), "stack": stack}
    for key in ("dp", "cp", "interleave", "micro_batch", "zero", "ep", "shard_group", "first_stage_layers",
                "last_stage_layers"):
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
    if _flag(row, "overlap_moe_expert_parallel_comm", STACKS_FILE):  # where the release's own config turns it on
        plan["overlap_moe_expert_parallel_comm"] = True
    if row.get("moe_dispatcher"):  # PlanSpec refuses an unknown name with the valid ones
        plan["moe_dispatcher"] = row["moe_dispatcher"]
    if row.get("recompute_modules"):  # Megatron-Core's named modules, comma-separated (PlanSpec checks the names)
        plan["recompute_modules"] = row["recompute_modules"]
    if row.get("cuda_graph_impl"):  # where the release's own config captures CUDA graphs (PlanSpec checks the name)
        plan["cuda_graph_impl"] = row["cuda_graph_impl"]
    if _flag(row, "fused_grouped_mlp", STACKS_FILE):
        plan["fused_grouped_mlp"] = True
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


__all__ = ["MeasuredRun", "measured_runs", "published_runs", "public_runs", "vtrain_runs", "vtrain_dir", "NOT_FITTED",
           "ARCHIVE_DATASETS", "SEPARATE_FITTED", "STACKS_FILE", "UNPUBLISHED_DEFAULTS", "SEARCHED_KNOBS",
           "SEARCH_RANGES", "INTERLEAVED_STACKS", "MEASURED_FLASH_ATTENTION", "MOE_COLUMNS", "VTRAIN_SYSTEM",
           "VTRAIN_SCALE_OUT_GBps", "VTRAIN_VOCAB"]
