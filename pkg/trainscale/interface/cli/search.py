"""``trainscale search`` (the fastest plans that fit, from the plan space) and ``trainscale scale`` (the best
plan at each GPU count of a fixed global batch, and the throughput per GPU lost to each cause), with the
arguments and helpers they share.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import numpy as np
import yaml

from ...model.spec_fields import CUDA_GRAPH_IMPLS, MOE_DISPATCHERS
from ...model.specs import ROTARY_KERNELS
from .shared import (CLIError, _bounded_int, _dump_json, _imbalance, _positive_int, _progress, _share, _spec_arg,
                     _recompute_modules, _table, _warn)

TOP_MAX = 1000  # `search --top`: plans re-priced by simulation and printed


def _fixed_fields(pairs: Sequence[str] | None) -> dict:
    from ...model import perfmodel

    fixed = {}
    valid = perfmodel.GRID_AXES + perfmodel.EXPERT_AXES
    for pair in pairs or []:
        key, sep, text = pair.partition("=")
        if not sep or key not in valid:
            raise CLIError(f"--fix = {pair!r} is invalid; expected FIELD=VALUE with FIELD one of {', '.join(valid)}")
        value = yaml.safe_load(text) if text else None
        if key == "recompute":
            fixed[key] = str(value)
        elif isinstance(value, bool):
            fixed[key] = int(value)
        elif isinstance(value, int) and 0 <= value < 2**31:
            fixed[key] = value
        else:
            raise CLIError(f"--fix = {pair!r} is invalid; {key} takes an integer in [0, 2^31) or true/false")
    return fixed


def search_space(model, system, gpus: int, global_batch: int, fixed: dict, knobs: Sequence[str] | None) -> dict:
    """The default plan space, narrowed to ``knobs`` (the rest at their defaults) and ``fixed``."""
    from ...model import perfmodel

    space = perfmodel.default_space(model, system, gpus, global_batch)
    if knobs:
        valid = set(space)
        for knob in knobs:
            if knob not in valid:
                raise CLIError(f"--search = {knob!r} is invalid; searchable knobs: {', '.join(sorted(valid))}")
        space = {k: v for k, v in space.items() if k in knobs or k == perfmodel.EP_AXIS}
    for key, value in fixed.items():
        space[key] = [value]
    return space


def _on_off(value: str) -> bool | None:
    """A --tp-async-backward style choice: None for 'stack' (the stack's default), else on / off."""
    return None if value == "stack" else value == "on"


# --split-ends: the embedding (1) and the loss (2) counted in the pipeline split (perfmodel.evaluate_grid)
SPLIT_ENDS = {"none": 0, "embedding": 1, "loss": 2, "both": 3}


def _search_inputs(args) -> tuple:
    """(model, system, fixed fields, searched knobs) of a search-like command (``search``, ``scale``): the
    model with ``--seq-len`` applied, the system (with its plausibility warnings), ``--fix`` and ``--search``."""
    from ...common.inputs import plausibility_warnings
    from ...model.specs import resolve_model, resolve_system

    model = resolve_model(_spec_arg(args.model, "model"), where="--model")
    if args.seq_len is not None:
        model = resolve_model({**{k: v for k, v in model.__dict__.items() if k != "name"}, "name": model.name,
                               "seq_len": args.seq_len}, where="--seq-len")
    system = resolve_system(_spec_arg(args.system, "system"), where="--system")
    for warning in plausibility_warnings(system):
        _warn(f"--system: {warning}")
    fixed = _fixed_fields(args.fix)
    knobs = [k for part in (args.search or []) for k in part.split(",") if k]
    return model, system, fixed, knobs


def _search_options(args) -> dict:
    """The keyword arguments of :func:`trainscale.model.planner.search` that a search-like command's flags set."""
    return {"stack": args.stack, "compiled": args.compiled, "grad_reduce_fp32": args.grad_reduce_fp32,
            "recompute_share": args.recompute_share, "rotary_kernel": args.rotary_kernel,
            "tp_async_backward": _on_off(args.tp_async_backward), "split_ends": SPLIT_ENDS[args.split_ends],
            "allow_unrunnable": args.allow_unrunnable, "precision": args.precision, "fp8_recipe": args.fp8_recipe,
            "moe_imbalance": args.moe_imbalance, "overlap_moe_expert_parallel_comm": args.ep_overlap,
            "moe_dispatcher": args.moe_dispatcher, "recompute_modules": args.recompute_modules,
            "cuda_graph_impl": args.cuda_graph_impl, "fused_grouped_mlp": args.fused_grouped_mlp}


def _precisions(args, system) -> list[tuple[str, str]]:
    """``--precision`` and ``--fp8-recipe`` checked against the system (one line naming the flag if refused):
    the ``(precision, recipe)`` pairs searched."""
    from ...model import perfmodel

    return perfmodel.precision_choices(system, args.precision, args.fp8_recipe, field_name="--precision",
                                       recipe_field="--fp8-recipe")


def _precision_text(choices: Sequence[tuple[str, str]]) -> str:
    """``precision fp8 (recipe current)``; several: ``precisions bf16, fp8 (recipe current), ranked together``."""
    names = ", ".join(p if p == "bf16" else f"{p} (recipe {r})" for p, r in choices)
    return f"precision {names}" if len(choices) == 1 else f"precisions {names}, ranked together"


def _knob_text(args) -> str:
    """The search-wide MoE and recomputation knobs that differ from their defaults, for the header."""
    parts = ([f"moe imbalance {args.moe_imbalance:g}"] if args.moe_imbalance != 1.0 else []) \
        + (["EP all-to-all overlap"] if args.ep_overlap else []) \
        + ([f"{args.moe_dispatcher} dispatcher"] if args.moe_dispatcher != "alltoall" else []) \
        + ([f"selective plans recompute {args.recompute_modules}"] if args.recompute_modules else []) \
        + ([f"{args.cuda_graph_impl} CUDA graphs"] if args.cuda_graph_impl != "none" else []) \
        + (["experts' fused grouped MLP"] if args.fused_grouped_mlp else [])
    return "".join(f"; {p}" for p in parts)


def cmd_search(args) -> int:
    from ...model import planner
    from ...kernels import layout as K

    model, system, fixed, knobs = _search_inputs(args)
    precisions = _precisions(args, system)
    space = search_space(model, system, args.gpus, args.global_batch, fixed, knobs)
    if args.space:
        print(_space_text(space))
        return 0
    summary, ranked = planner.search(model, system, args.gpus, args.global_batch, top=args.top, space=space,
                                       progress=_progress, **_search_options(args))
    if args.allow_unrunnable:
        _warn(f"--allow-unrunnable: the search includes plans the {args.stack} stack does not run")
    best = _predicted_rows(ranked, model, system, args.global_batch, args.allow_unrunnable)
    counts = {"plans_evaluated": summary.attrs["space_size"], "plans_priced": summary.attrs["plans_priced"],
              "plans_feasible": summary.attrs["plans_feasible"],
              "plans_unrunnable": int(summary["plans"].sel(reason=K.REASONS[K.R_STACK_RULE])),
              "plans_by_stack_rule": summary.attrs["plans_by_stack_rule"]}
    if args.json:
        _dump_json({"model": model.name, "system": system.name, "gpus": args.gpus, "stack": args.stack,
                    "compiled": args.compiled, "grad_reduce_fp32": args.grad_reduce_fp32,
                    "recompute_share": args.recompute_share, "rotary_kernel": args.rotary_kernel,
                    "tp_async_backward": _on_off(args.tp_async_backward),
                    "precision": [p for p, _ in precisions], "fp8_recipe": {p: r for p, r in precisions},
                    "moe_imbalance": args.moe_imbalance, "overlap_moe_expert_parallel_comm": args.ep_overlap,
                    "moe_dispatcher": args.moe_dispatcher, "recompute_modules": args.recompute_modules,
                    "cuda_graph_impl": args.cuda_graph_impl, "fused_grouped_mlp": args.fused_grouped_mlp,
                    "global_batch": args.global_batch, "seq_len": model.seq_len, "fixed": fixed,
                    "searched": sorted(k for k, v in space.items() if len(v) > 1), **counts, "best": best,
                    **({} if best else {"reason": _no_plan_reason(summary, args)})})
        return 0
    print(f"{model.name} on {args.gpus} GPUs of {system.name}, global batch {args.global_batch} sequences, "
          f"stack {args.stack}" + ("" if args.stack != "megatron" else " (the default; --stack picks another)")
          + f"; {_precision_text(precisions)}" + _knob_text(args))
    print(f"plans evaluated: {counts['plans_evaluated']}, feasible: {counts['plans_feasible']} "
          f"(priced: {counts['plans_priced']}, the rest structurally invalid; --space lists the space); "
          f"the {args.stack} stack does not run {counts['plans_unrunnable']} of the priced plans "
          f"(data/stack_rules.yaml)")
    if not best:
        print(_no_plan_reason(summary, args))
        return 0
    print(_table(_best_table_rows(best)))
    print("differs: from the best plan; same cost: settings priced alike, folded into the row "
          "(step time and memory equal to 1e-12)")
    print("validated: the nearest measured run of this stack and generation: the mechanisms in which the plan "
          "differs, its model size and GPUs relative to the run's, and that dataset's left-out error; above best: "
          "predicted MFU above the best measured on the generation (gen) or by the stack there (stack) by more "
          "than that error (README, 'How far a plan is from what was measured')")
    return 0


def _space_text(space: Mapping) -> str:
    """The search space, one axis a line with its values, and its size."""
    from ...model.searchspace import space_size, space_values

    values = space_values(space)
    lines = [f"{name} ({len(vals)}): {' '.join(str(v) for v in vals)}" for name, vals in values.items()]
    lines.append(f"space: {space_size(space):,} plans (the product of the axes' lengths)")
    return "\n".join(lines)


def _predicted_rows(ranked: Sequence[Mapping], model, system, global_batch: int,
                    allow_unrunnable: bool = False) -> list[dict]:
    """Each ranked plan with the same fields as ``predict``, what it folds and how it differs from the best."""
    from ...model import perfmodel
    from ...common.inputs import check_finite
    from ...model.searchspace import plan_differences
    from ...model.specs import RunSpec

    best = []
    for entry in _progress(ranked, len(ranked), "predict"):
        run = RunSpec(id=f"rank-{len(best) + 1}", model=model, system=system,
                      plan=perfmodel.plan_from_grid_entry(entry["plan"], global_batch))
        result = perfmodel.predict(run, allow_unrunnable=allow_unrunnable, warn=False).as_dict()
        check_finite(result, where=f"plan of rank {len(best) + 1}")
        best.append({"plan": entry["plan"], **result, "folded": entry["folded"],
                     "differs_from_best": plan_differences(entry["plan"], ranked[0]["plan"]),
                     "confidence": entry["confidence"]})
    return best


def _best_table_rows(best: Sequence[Mapping]) -> list[dict]:
    from ...model.confidence import above_text, confidence_text
    from ...model.searchspace import differs_text, fold_text

    rows = []
    for rank, entry in enumerate(best, 1):
        row = {"rank": rank}
        row.update(entry["plan"])
        if row.get("etp") == 0:  # the experts' tensor parallelism as the attention's (plan field etp 0)
            row["etp"] = "tp"
        row.update({"step_s": entry["step_time_s"], "tokens/s": entry["tokens_per_s"],
                    "MFU": entry["mfu"], "mem_GiB": entry["memory_gib_per_gpu"],
                    "differs": differs_text(entry["plan"], best[0]["plan"]) or "-",
                    "same cost": fold_text(entry) or "-",
                    "validated": confidence_text(entry["confidence"]), "above best": above_text(entry["confidence"])})
        rows.append(row)
    return rows


def _no_plan_reason(summary, args) -> str:
    """Why a search found nothing: no plan fits in memory, or every plan of the space is invalid, with
    the reasons the space's plans give (``summary['plans']`` by reason), most frequent first."""
    from ...kernels import layout as K

    plans = summary["plans"]
    unrunnable = int(plans.sel(reason=K.REASONS[K.R_STACK_RULE]))
    if unrunnable:
        rules = ", ".join(f"{rule} ({n})" for rule, n in summary.attrs["plans_by_stack_rule"].items() if n)
        fitting = "none of the others fits in memory; " if int(plans.sel(reason=K.REASONS[K.R_MEMORY])) else ""
        return (f"no plan the {args.stack} stack runs: {fitting}it does not run {unrunnable} plans (stack rules: "
                f"{rules}; --allow-unrunnable prices them)")
    if int(plans.sel(reason="does not fit in accelerator memory")) > 0:
        return "no plan fits in memory"
    total = int(plans.sum())
    counts = sorted(((int(n), str(r)) for r, n in zip(plans["reason"].values, plans.values) if n > 0),
                    key=lambda c: -c[0])
    why = "; ".join(f"{name} ({n} of {total} plans)" for n, name in counts)
    return (f"no valid plan for {args.gpus} GPUs and a global batch of {args.global_batch}: {why} "
            f"(no plan was priced, so none was too big for memory)")


def cmd_scale(args) -> int:
    from ...model import scaling
    from ...common.io import write_dataset

    model, system, fixed, knobs = _search_inputs(args)
    precisions = _precisions(args, system)
    counts = scaling.parse_gpus(args.gpus)
    if args.out and os.path.isdir(args.out):
        raise CLIError(f"--out = {args.out!r} is invalid; it is a folder, expected a file name such as scale.nc")
    spaces = {g: search_space(model, system, g, args.global_batch, fixed, knobs) for g in counts}
    if args.space:
        print("\n\n".join(f"{g} GPUs:\n{_space_text(spaces[g])}" for g in counts))
        return 0
    if args.allow_unrunnable:
        _warn(f"--allow-unrunnable: the search includes plans the {args.stack} stack does not run")
    ds = scaling.scaling_curve(model, system, counts, args.global_batch, space=spaces.__getitem__,
                               progress=_progress, **_search_options(args))
    if args.out:
        write_dataset(ds, args.out)
    if args.json:
        _dump_json(_scale_json(ds))
        return 0
    print(f"{model.name} on {system.name}, global batch {args.global_batch} sequences of {model.seq_len} tokens, "
          f"stack {args.stack}" + ("" if precisions == [("bf16", "none")] else f", {_precision_text(precisions)}")
          + "; each count's best plan from `search`")
    print(_table(_scale_rows(ds)))
    baseline = ds.attrs["baseline_gpus"]
    print(f"lost: the share of the throughput per GPU at {baseline} GPUs (the smallest count with a plan) lost "
          "relative to linear scaling; top causes: what each component of the step adds over its baseline time "
          "scaled by 1/GPUs, as a share of that throughput (they add up to lost; negative: shrank faster)")
    print("plan: tp, pp (vN: interleaved chunks), cp and dp degrees, micro-batch (mb), ZeRO stage, sp: sequence "
          "parallel, rc: recomputation if any" + (f"; wrote {args.out}" if args.out else "; --out writes the dataset"))
    print("above best: the plan's predicted MFU exceeds its GPU generation's best measured MFU by more than the "
          "left-out error of the nearest measured run's dataset: an optimum no measurement supports")
    return 0


def _scale_plan_text(ds, i: int) -> str:
    """One count's plan in a few words (the knobs that shape it)."""
    from ...model.specs import RECOMPUTE_MODES

    k = {name: int(ds[name].values[i]) for name in ("tp", "pp", "cp", "dp", "ep", "interleave", "micro_batch",
                                                     "zero", "sequence_parallel", "recompute")}
    text = f"tp{k['tp']} pp{k['pp']}" + (f" v{k['interleave']}" if k["interleave"] > 1 else "")
    text += f" cp{k['cp']} dp{k['dp']}" + (f" ep{k['ep']}" if k["ep"] > 1 else "") + f" mb{k['micro_batch']}"
    text += f" zero{k['zero']}" + (" sp" if k["sequence_parallel"] else "")
    return text + (f" rc:{RECOMPUTE_MODES[k['recompute']]}" if RECOMPUTE_MODES[k["recompute"]] != "none" else "")


def _top_causes(ds, i: int, top: int = 3) -> str:
    loss = ds["throughput_loss"].values[i]
    order = [j for j in np.argsort(-np.abs(loss), kind="stable")[:top] if abs(loss[j]) >= 5e-4]
    return ", ".join(f"{ds['cause'].values[j]} {100 * loss[j]:+.1f}%" for j in order) or "-"


def _scale_rows(ds) -> list[dict]:
    rows = []
    for i, gpus in enumerate(ds["gpus"].values):
        if not ds["has_plan"].values[i]:
            rows.append({"GPUs": int(gpus), "plan": "no plan fits (`search` at this count says why)"})
            continue
        rows.append({"GPUs": int(gpus), "plan": _scale_plan_text(ds, i),
                     "step_s": float(ds["step_time_s"].values[i]),
                     "tokens/s/GPU": float(ds["tokens_per_s_per_gpu"].values[i]),
                     "MFU": float(ds["mfu"].values[i]),
                     "lost": f"{100 * (1 - ds['scaling_efficiency'].values[i]):.1f}%",
                     "top causes": _top_causes(ds, i) if gpus != ds.attrs["baseline_gpus"] else "(baseline)",
                     "above best": _scale_above_text(ds, i)})
    return rows


def _scale_above_text(ds, i: int) -> str:
    """The ``above best`` column: the generation's best measured MFU where the plan's predicted MFU exceeds it by
    more than the left-out error of the nearest measured run's dataset, or ``-``."""
    if not ds["above_best_measured"].values[i]:
        return "-"
    return (f"gen {100 * ds['best_measured_mfu'].values[i]:.0f}% "
            f"(+{100 * ds['left_out_error'].values[i]:.1f}% err)")


def _scale_json(ds) -> dict:
    """The scaling curve as JSON: one object per GPU count (null where no plan fits)."""
    from ...model.scaling import PLAN_KNOBS
    from ...model.specs import RECOMPUTE_MODES

    causes = [str(c) for c in ds["cause"].values]
    counts = []
    for i, gpus in enumerate(ds["gpus"].values):
        entry = {"gpus": int(gpus), "has_plan": bool(ds["has_plan"].values[i])}
        if entry["has_plan"]:
            entry["plan"] = {name: int(ds[name].values[i]) for name in PLAN_KNOBS}
            entry["plan"]["recompute"] = RECOMPUTE_MODES[entry["plan"]["recompute"]]
        for name in ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "memory_gib_per_gpu",
                     "scaling_efficiency", "left_out_error", "best_measured_mfu"):
            entry[name] = float(ds[name].values[i])
        entry["above_best_measured"] = bool(ds["above_best_measured"].values[i])
        for name in ("time_s", "added_time_s", "throughput_loss"):
            entry[name] = dict(zip(causes, ds[name].values[i].tolist()))
        counts.append(entry)
    keys = ("model", "system", "global_batch", "seq_len", "stack", "baseline_gpus")
    return {**{k: ds.attrs[k] for k in keys}, "counts": counts}


def _add_search_arguments(p, gpus_type, gpus_help: str, space_help: str) -> None:
    """The arguments ``search`` and ``scale`` share: model, system, GPUs, global batch, the plan fields fixed for
    every plan searched, ``--fix``/``--search`` (the space), ``--space``, ``--json``, ``--allow-unrunnable``."""
    p.add_argument("--model", required=True, help="catalog model name, or a YAML file with the model's shape")
    p.add_argument("--system", required=True, help="catalog system name, or a YAML file {name: ..., overrides}")
    p.add_argument("--gpus", required=True, type=gpus_type, help=gpus_help)
    p.add_argument("--global-batch", required=True, type=_positive_int,
                   help="sequences per optimizer step, over all data-parallel ranks")
    p.add_argument("--seq-len", type=_positive_int, help="sequence length in tokens (default: the model's)")
    p.add_argument("--stack", default="megatron", choices=("megatron", "deepspeed", "fsdp", "nemo"),
                   help="software stack that runs the plans (default megatron; the search header names it)")
    p.add_argument("--compiled", action="store_true",
                   help="the model runs under torch.compile (fuses an eager stack's element-wise kernels)")
    p.add_argument("--grad-reduce-fp32", action="store_true",
                   help="gradients held and reduced in fp32 (DeepSpeed's BF16_Optimizer: all-reduced on --stack deepspeed)")
    p.add_argument("--recompute-share", type=_share, metavar="SHARE",
                   help="share of the forward a selective recompute recomputes")
    p.add_argument("--rotary-kernel", default="", choices=("",) + ROTARY_KERNELS, metavar="KERNEL",
                   help=f"how the code applies rotary embeddings ({', '.join(ROTARY_KERNELS)}; default: the stack's)")
    p.add_argument("--tp-async-backward", default="stack", choices=("stack", "on", "off"),
                   help="backward tensor-parallel collectives run beside the GEMMs, as Megatron-LM's since September 2021 "
                        "(default: the stack's)")
    p.add_argument("--split-ends", default="none", choices=tuple(SPLIT_ENDS),
                   help="count the embedding, the loss or both as layers of every pipeline split (Megatron-Core's "
                        "--account-for-embedding/loss-in-pipeline-split): layer counts pp*interleave does not "
                        "divide become plans (default none)")
    p.add_argument("--precision", default="bf16", metavar="FORMAT",
                   help="number format of every plan's linear-layer GEMMs, as predict's plan.precision: bf16 (default), "
                        "fp8 (Hopper and newer), mxfp8 or nvfp4 (Blackwell); several, comma-separated (bf16,fp8), are "
                        "searched one after the other and ranked together")
    p.add_argument("--fp8-recipe", default="", metavar="RECIPE",
                   help="scaling recipe of the low precision, as predict's plan.fp8_recipe: fp8 current (default), "
                        "delayed or blockwise; mxfp8 mxfp8; nvfp4 nvfp4")
    p.add_argument("--moe-imbalance", type=_imbalance, default=1.0, metavar="RATIO",
                   help="mixture of experts: routed tokens of the busiest expert-parallel rank over the mean, as "
                        "predict's plan.moe_imbalance (default 1: balanced)")
    p.add_argument("--ep-overlap", action="store_true",
                   help="mixture of experts: hide the expert-parallel all-to-alls behind another micro-batch's pass "
                        "(Megatron-Core's --overlap-moe-expert-parallel-comm; its stack rules keep only the plans "
                        "with ep > 1, interleaving where pp > 1 and no full recompute)")
    p.add_argument("--moe-dispatcher", default="alltoall", choices=MOE_DISPATCHERS,
                   help="mixture of experts: token dispatcher, alltoall (default), deepep or hybridep (both once per remote node)")
    p.add_argument("--recompute-modules", default="", metavar="NAMES", type=_recompute_modules,
                   help="Megatron-Core's modules a selective recompute re-runs, comma-separated, as predict's "
                        "plan.recompute_modules (core_attn, mla_up_proj, layernorm, moe_act, mlp, moe, "
                        "shared_experts; default: the stack's, core_attn); applies to the selective plans")
    p.add_argument("--cuda-graph-impl", default="none", choices=CUDA_GRAPH_IMPLS,
                   help="Megatron-Core's CUDA graphs of every plan, as predict's plan.cuda_graph_impl: none (default), "
                        "local, transformer_engine or full_iteration (only full_iteration changes the price: no host "
                        "issue inside the step)")
    p.add_argument("--fused-grouped-mlp", action="store_true",
                   help="mixture of experts: the experts' fused grouped MLP (Megatron-Core's cutedsl_fused_grouped_mlp, "
                        "as predict's plan.fused_grouped_mlp; its stack rule needs --precision mxfp8)")
    p.add_argument("--fix", nargs="+", metavar="FIELD=VALUE", help="fixed plan fields, e.g. --fix tp=8 pp=16 cp=1")
    p.add_argument("--search", nargs="+", metavar="KNOB", help="search only these knobs (the others keep "
                   "their defaults unless fixed), e.g. --search interleave recompute micro_batch")
    p.add_argument("--space", action="store_true", help=space_help)
    p.add_argument("--json", action="store_true")
    p.add_argument("--allow-unrunnable", action="store_true",
                   help="also propose plans the stack does not run (data/stack_rules.yaml), with a warning")


def add_parsers(sub) -> None:
    """The ``search`` and ``scale`` commands (``sub``: the parser's subcommands)."""
    p = sub.add_parser("search", help="search the plan space for the fastest plans that fit")
    _add_search_arguments(p, gpus_type=_positive_int, gpus_help="GPUs of the run (tp*pp*dp*cp)",
                          space_help="print the search space (every axis and its values) and its size, then stop")
    p.add_argument("--top", type=_bounded_int(TOP_MAX), default=5,
                   help=f"distinct plans to show (default 5, at most {TOP_MAX}); plans priced alike that differ only "
                        "in settings (recompute, ZeRO, shard group, ...) are folded into one row")
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("scale", help="scaling curve: the best plan at each GPU count of a fixed global batch, "
                       "and the throughput per GPU lost to each cause",
                       description="For each GPU count, the best plan `search` finds (same stack rules and options) "
                       "at a fixed global batch: throughput per GPU, MFU, step time, and the share of the smallest "
                       "count's throughput per GPU lost to each component of the step (compute, tp_comm, "
                       "pipeline_bubble, dp_comm, straggler, ...) relative to linear scaling.")
    _add_search_arguments(p, gpus_type=str, gpus_help="GPU counts: START..STOP (START doubled up to STOP, e.g. "
                          "256..16384) or a comma list (256,512,1024)",
                          space_help="print the search space at each GPU count and its size, then stop")
    p.add_argument("--out", metavar="FILE.nc", help="write the curve as a netCDF dataset (dims gpus, cause)")
    p.set_defaults(func=cmd_scale)
