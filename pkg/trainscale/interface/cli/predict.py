"""``trainscale predict``: step time, throughput, MFU, memory and energy of the runs in a YAML file; the plan
fields of a run with their units and defaults (``predict --help``).
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any, Mapping

from .shared import CLIError, _dump_json, _fmt, _load_yaml, _one_line, _progress, _table, _warn

# Units and meaning of every plan field of a run (PlanSpec); `predict --help` lists them with their defaults.
PLAN_FIELDS: dict[str, tuple[str, str]] = {
    "tp": ("GPUs", "tensor-parallel degree"),
    "pp": ("GPUs", "pipeline-parallel degree (stages)"),
    "dp": ("GPUs", "data-parallel degree"),
    "cp": ("GPUs", "context-parallel degree (splits each sequence)"),
    "interleave": ("chunks", "model chunks per pipeline device (interleaved schedule)"),
    "micro_batch": ("sequences", "sequences one data-parallel rank runs per forward/backward pass"),
    "global_batch": ("sequences", "sequences per optimizer step over all data-parallel ranks"),
    "recompute": ("-", "activation recomputation: none, selective or full"),
    "sequence_parallel": ("true/false", "shard the norms' and dropouts' activations over the sequence (with tp)"),
    "zero": ("stage", "ZeRO stage 0-3 (1: optimizer state sharded, 2: + gradients, 3: + weights, FSDP)"),
    "shard_group": ("ranks", "data-parallel ranks sharing one copy of the sharded state (0: all of dp)"),
    "overlap_grad_reduce": ("true/false", "hide the gradient reduction behind the backward pass"),
    "flash_attention": ("true/false", "fused attention: no seq x seq scores in HBM"),
    "zero3_per_tensor": ("true/false", "ZeRO-3 fetches each weight matrix apart (DeepSpeed 2021)"),
    "ep": ("ranks", "expert-parallel degree of a mixture of experts (divides dp)"),
    "etp": ("GPUs", "the experts' tensor-parallel degree (0: tp)"),
    "tp_comm_overlap": ("true/false", "overlap the sequence-parallel collectives with the GEMMs (needs sequence_parallel)"),
    "stack": ("-", "software that runs the plan: megatron, deepspeed, fsdp or nemo"),
    "compiled": ("true/false", "the model runs under torch.compile"),
    "grad_reduce_fp32": ("true/false", "gradients held and reduced in fp32"),
    "recompute_share": ("fraction", "share of the forward a selective recompute recomputes"),
    "rotary_kernel": ("-", "how rotary embeddings are applied: fused, complex, matrix, rotate_half"),
    "tp_async_backward": ("true/false", "backward TP collectives beside the GEMMs"),
    "first_stage_layers": ("layers", "transformer layers of the first pipeline device (0: even split)"),
    "last_stage_layers": ("layers", "transformer layers of the last pipeline device (0: even split)"),
    "embedding_in_split": ("true/false", "the embedding counts as one layer of the pipeline split"),
    "loss_in_split": ("true/false", "the loss counts as one layer of the pipeline split"),
    "precision": ("-", "number format of the linear layers' GEMMs: bf16, fp8, mxfp8, nvfp4"),
    "fp8_recipe": ("-", "scaling recipe of a low-precision format (blank: the format's first)"),
    "custom_pipeline_layout": ("true/false", "the run gives its own assignment of layers to pipeline chunks"),
    "moe_imbalance": ("ratio", "routed tokens of the busiest expert-parallel rank over the mean (1: balanced)"),
    "overlap_moe_expert_parallel_comm": ("true/false", "hide the expert-parallel all-to-alls behind another "
                                         "micro-batch's pass (Megatron-Core)"),
    "moe_dispatcher": ("-", "token dispatcher of a mixture of experts: alltoall, deepep or hybridep (both once per remote node)"),
    "recompute_modules": ("-", "Megatron-Core's modules a selective recompute re-runs, comma-separated (core_attn, "
                          "mla_up_proj, layernorm, moe_act, mlp, moe, shared_experts)"),
    "cuda_graph_impl": ("-", "Megatron-Core's CUDA graphs: none, local, transformer_engine (named scopes: priced as "
                        "none) or full_iteration (no host issue inside the step)"),
    "fused_grouped_mlp": ("true/false", "the experts' MLP as two fused grouped-GEMM kernels (Megatron-Core, MXFP8)"),
}


def plan_fields_help() -> str:
    """The plan fields of a run with unit, default and meaning, then each stack's defaults (from
    data/stack_defaults.yaml): the epilog of ``predict --help``."""
    import dataclasses

    from ...model.specs import STACK_DEFAULT_FIELDS, PlanSpec, stack_defaults_text

    rows = []
    for f in dataclasses.fields(PlanSpec):
        unit, meaning = PLAN_FIELDS[f.name]
        if f.name in STACK_DEFAULT_FIELDS or f.name in ("recompute_share", "rotary_kernel", "tp_async_backward"):
            default = "the stack's"
        elif f.name == "fp8_recipe":
            default = "the format's"
        elif f.name == "global_batch":
            default = "required"
        elif f.name == "dp":
            default = "gpus/(tp pp cp)"
        else:
            default = _fmt(f.default)
        rows.append((f.name, unit, default, meaning))
    widths = [max(len(r[i]) for r in rows + [("field", "unit", "default", "")]) for i in range(3)]
    lines = ["plan fields (a run's plan: mapping; global_batch and micro_batch count sequences of the model's "
             "seq_len tokens):", ""]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(("field", "unit", "default"), widths)) + "  meaning"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3] for r in rows]
    lines += ["", "defaults of each stack (what the stack does when its flag is not given; the sources, files and "
              "commits, are in trainscale/data/stack_defaults.yaml). A plan without stack is megatron's:", "",
              stack_defaults_text(indent="  ")]
    return "\n".join(lines)


def _run_dicts(doc: Any, path: str) -> list:
    if isinstance(doc, Mapping) and "runs" in doc:
        extra = sorted(set(doc) - {"runs"})
        if extra:
            raise CLIError(f"{path}: unexpected top-level key {extra[0]!r} next to 'runs'")
        runs = doc["runs"]
        if not isinstance(runs, list) or not runs:
            raise CLIError(f"{path}: runs = {runs!r} is invalid; expected a non-empty list of runs")
        return runs
    if isinstance(doc, Mapping):
        return [doc]
    raise CLIError(f"{path}: top level = {_one_line(repr(doc))[:80]} is invalid; "
                   "expected one run (a mapping) or 'runs:' with a list of runs")


def _build_runs(run_dicts: list) -> list:
    from ...common.inputs import check_unique_ids, plausibility_warnings
    from ...model.specs import RunSpec, SpecError

    check_unique_ids([str(d["id"]) for d in run_dicts if isinstance(d, Mapping) and "id" in d], "id", "runs")
    runs = []
    for i, d in enumerate(run_dicts):
        try:
            runs.append(RunSpec.from_dict(d, i))
        except SpecError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            run_id = d.get("id", i) if isinstance(d, Mapping) else i
            raise CLIError(f"run {str(run_id)!r}: invalid input: {_one_line(exc)}") from None
    for run in runs:
        for warning in plausibility_warnings(run.system):
            _warn(f"run {run.id!r}: {warning}")
    return runs


def cmd_predict(args) -> int:
    from ...model import perfmodel
    from ...common.inputs import check_finite
    from ...model.specs import SpecError

    run_dicts = _run_dicts(_load_yaml(args.runs), args.runs)
    runs = _build_runs(run_dicts)
    results = []
    for run in _progress(runs, len(runs), "predict") if len(runs) > 1 else runs:
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", perfmodel.UnrunnablePlanWarning)
                result = perfmodel.predict(run, allow_unrunnable=args.allow_unrunnable).as_dict()
            for warning in caught:
                _warn(str(warning.message))
        except SpecError:
            raise
        except (ValueError, TypeError, ZeroDivisionError, OverflowError, FloatingPointError) as exc:
            raise CLIError(f"run {run.id!r}: prediction failed: {_one_line(exc)}") from None
        if result.get("fits"):
            check_finite(result, where=f"run {run.id!r}")
        results.append((run, result))
    if args.json:
        _dump_json([r for _, r in results])
        return 0
    rows = []
    for run, r in results:
        rows.append({
            "id": r["id"], "model": run.model.name, "system": run.system.name, "gpus": run.gpus,
            "tp": run.plan.tp, "pp": run.plan.pp, "dp": run.plan.dp, "cp": run.plan.cp,
            "step_s": r["step_time_s"], "tokens/s": r["tokens_per_s"],
            "TFLOP/s/GPU": r["model_tflops_per_gpu"], "MFU": r["mfu"], "HFU": r["hfu"],
            "mem_GiB": r["memory_gib_per_gpu"], "W/GPU": r["power_W_per_gpu"],
            "J/token": r["energy_J_per_token"],
            "fits": r["fits"] if r["fits"] else f"no: {r.get('reason')}",
        })
    print(_table(rows))
    return 0


def add_parsers(sub) -> None:
    """The ``predict`` command (``sub``: the parser's subcommands)."""
    p = sub.add_parser("predict", help="predict step time, throughput, MFU, memory and energy of runs",
                       description="Predict step time, throughput, MFU, memory and energy of runs. A run is "
                       "{id, model, system, gpus, plan}; its plan's fields are below.",
                       epilog=plan_fields_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", metavar="RUNS.yaml", help="one run (a mapping) or 'runs:' with a list of runs")
    p.add_argument("--json", action="store_true", help="print one JSON array, one object per run")
    p.add_argument("--allow-unrunnable", action="store_true",
                   help="price a plan its stack does not run (data/stack_rules.yaml) with a warning, instead of refusing it")
    p.set_defaults(func=cmd_predict)
