"""The ``trainscale`` command line: predict runs, search plans, validate, calibrate, list catalogs.

Every input error is reported as one line on stderr (``trainscale: error: ...``) with exit
status 2 and nothing on stdout; input is validated completely before anything is printed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import yaml

from .. import __version__
from ..model.specs import ROTARY_KERNELS

PROG = "trainscale"

# Units and meaning of every field a run may override on a catalog system.
SYSTEM_FIELDS: dict[str, tuple[str, str]] = {
    "accelerator": ("-", "accelerator model name (label only)"),
    "generation": ("-", "accelerator generation; selects the calibration parameters"),
    "peak_flops_bf16": ("FLOP/s", "dense BF16 (FP16 on Volta) tensor-core peak per GPU"),
    "peak_flops_fp8": ("FLOP/s", "dense FP8 tensor-core peak per GPU (null if none)"),
    "peak_flops_fp4": ("FLOP/s", "dense FP4 (NVFP4) tensor-core peak per GPU (null if none)"),
    "sm_count": ("1", "streaming multiprocessors (compute units) per GPU"),
    "hbm_capacity_GiB": ("GiB", "HBM capacity per GPU as reported by the driver"),
    "hbm_bandwidth_GBps": ("GB/s", "HBM bandwidth per GPU"),
    "tdp_W": ("W", "GPU board power limit (TDP)"),
    "idle_W": ("W", "GPU power when idle"),
    "gpus_per_node": ("1", "GPUs per node"),
    "scale_up_domain": ("GPUs", "GPUs in one scale-up (NVLink/NVSwitch/Infinity Fabric) domain"),
    "scale_up_GBps_per_gpu": ("GB/s", "scale-up bandwidth per GPU, unidirectional"),
    "scale_up_latency_s": ("s", "scale-up latency per collective step (alpha)"),
    "scale_out_GBps_per_gpu": ("GB/s", "scale-out network bandwidth per GPU, unidirectional"),
    "scale_out_latency_s": ("s", "scale-out latency per collective step (alpha)"),
    "node_overhead_W": ("W", "node power besides the GPUs (CPUs, switches, NICs, fans)"),
    "scale_out_leaf_gpus": ("GPUs", "GPUs under one leaf switch of a two-tier fat-tree (0: one flat tier)"),
    "scale_out_oversubscription": ("1", "leaf-to-spine oversubscription; bandwidth across the spine is divided by it"),
    "scale_out_hop_latency_s": ("s", "latency per switch hop (2 hops inside a leaf, 4 across the spine)"),
}


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
}


def plan_fields_help() -> str:
    """The plan fields of a run with unit, default and meaning, then each stack's defaults (from
    data/stack_defaults.yaml): the epilog of ``predict --help``."""
    import dataclasses

    from ..model.specs import STACK_DEFAULT_FIELDS, PlanSpec, stack_defaults_text

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


# `plan` simulates the chosen pipeline micro-batch by micro-batch (memory and time grow with the count)
PLAN_SIMULATED_MICRO_BATCHES = 2**20
TOP_MAX = 1000  # `search --top`: plans re-priced by simulation and printed


class CLIError(Exception):
    """An input error reported as one line with exit status 2."""


# --------------------------------------------------------------------------- helpers
def _one_line(text: str) -> str:
    """One line, at most ``inputs.MAX_MESSAGE`` characters (``...`` marks a cut)."""
    from ..common.inputs import one_line

    return one_line(text)


def _warn(message: str) -> None:
    print(f"{PROG}: warning: {_one_line(message)}", file=sys.stderr)


def _progress(iterable, total: int | None = None, desc: str = ""):
    from ..common.progress import progress

    return progress(iterable, total, desc)


def _clean(obj: Any) -> Any:
    """JSON-safe copy: non-finite floats become None, numpy scalars become Python ones."""
    if isinstance(obj, Mapping):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        try:
            obj = obj.item()
        except (TypeError, ValueError):
            pass
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _dump_json(obj: Any) -> None:
    print(json.dumps(_clean(obj), indent=2, allow_nan=False))


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        if value == 0:
            return "0"
        if 1e4 <= abs(value) < 1e12:
            return f"{value:,.0f}"
        if abs(value) >= 1e12 or abs(value) < 1e-3:
            return f"{value:.3e}"
        return f"{value:.4g}"
    return str(value)


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Plain aligned text table (numbers right-aligned)."""
    if not rows:
        return "(none)"
    columns = list(columns or rows[0].keys())
    cells = [[_fmt(row.get(c)) for c in columns] for row in rows]
    numeric = [all(isinstance(row.get(c), (int, float)) and not isinstance(row.get(c), bool)
                   for row in rows) for c in columns]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]

    def line(values):
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [line(columns), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _load_yaml(path: str) -> Any:
    """A YAML file read strictly: duplicate keys, deep nesting and alias bombs are errors
    (:func:`trainscale.common.inputs.load_yaml`)."""
    from ..common.inputs import load_yaml

    return load_yaml(path)


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
    from ..common.inputs import check_unique_ids, plausibility_warnings
    from ..model.specs import RunSpec, SpecError

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


# --------------------------------------------------------------------------- commands
def cmd_predict(args) -> int:
    from ..model import perfmodel
    from ..common.inputs import check_finite
    from ..model.specs import SpecError

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


def _spec_arg(value: str, what: str):
    """A catalog name, or a YAML file holding the spec (a model's shape; a system's name + overrides)."""
    if value.endswith((".yaml", ".yml")) or Path(value).is_file():
        doc = _load_yaml(value)
        if not isinstance(doc, dict):
            raise CLIError(f"--{what} = {value!r} is invalid; the file must hold a mapping")
        return doc
    return value


def _fixed_fields(pairs: Sequence[str] | None) -> dict:
    from ..model import perfmodel

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
    from ..model import perfmodel

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
    from ..common.inputs import plausibility_warnings
    from ..model.specs import resolve_model, resolve_system

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
            "allow_unrunnable": args.allow_unrunnable, "precision": args.precision, "fp8_recipe": args.fp8_recipe}


def _precisions(args, system) -> list[tuple[str, str]]:
    """``--precision`` and ``--fp8-recipe`` checked against the system (one line naming the flag if refused):
    the ``(precision, recipe)`` pairs searched."""
    from ..model import perfmodel

    return perfmodel.precision_choices(system, args.precision, args.fp8_recipe, field_name="--precision",
                                       recipe_field="--fp8-recipe")


def _precision_text(choices: Sequence[tuple[str, str]]) -> str:
    """``precision fp8 (recipe current)``; several: ``precisions bf16, fp8 (recipe current), ranked together``."""
    names = ", ".join(p if p == "bf16" else f"{p} (recipe {r})" for p, r in choices)
    return f"precision {names}" if len(choices) == 1 else f"precisions {names}, ranked together"


def cmd_search(args) -> int:
    from ..model import planner
    from ..kernels import layout as K

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
                    "global_batch": args.global_batch, "seq_len": model.seq_len, "fixed": fixed,
                    "searched": sorted(k for k, v in space.items() if len(v) > 1), **counts, "best": best,
                    **({} if best else {"reason": _no_plan_reason(summary, args)})})
        return 0
    print(f"{model.name} on {args.gpus} GPUs of {system.name}, global batch {args.global_batch} sequences, "
          f"stack {args.stack}" + ("" if args.stack != "megatron" else " (the default; --stack picks another)")
          + f"; {_precision_text(precisions)}")
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
    from ..model.searchspace import space_size, space_values

    values = space_values(space)
    lines = [f"{name} ({len(vals)}): {' '.join(str(v) for v in vals)}" for name, vals in values.items()]
    lines.append(f"space: {space_size(space):,} plans (the product of the axes' lengths)")
    return "\n".join(lines)


def _predicted_rows(ranked: Sequence[Mapping], model, system, global_batch: int,
                    allow_unrunnable: bool = False) -> list[dict]:
    """Each ranked plan with the same fields as ``predict``, what it folds and how it differs from the best."""
    from ..model import perfmodel
    from ..common.inputs import check_finite
    from ..model.searchspace import plan_differences
    from ..model.specs import RunSpec

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
    from ..model.confidence import above_text, confidence_text
    from ..model.searchspace import differs_text, fold_text

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
    from ..kernels import layout as K

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
    from ..model import scaling
    from ..common.io import write_dataset

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
    from ..model.specs import RECOMPUTE_MODES

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
    from ..model.scaling import PLAN_KNOBS
    from ..model.specs import RECOMPUTE_MODES

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


def cmd_plan(args) -> int:
    from ..model import hetero

    from ..common.inputs import check_finite, plausibility_warnings

    doc = _load_yaml(args.cluster)
    cluster = hetero.Cluster.from_dict(doc, where=args.cluster)
    for group in cluster.groups:
        for warning in plausibility_warnings(group.system):
            _warn(f"{args.cluster} group {group.name!r}: {warning}")
    problem = hetero.problem(args.model, cluster, args.global_batch, max_stages=args.max_stages)
    best = hetero.plan(problem)
    if best is not None and best.micro_batches > PLAN_SIMULATED_MICRO_BATCHES:
        raise CLIError(f"--global-batch = {args.global_batch} is invalid; the best plan runs {best.micro_batches:,} "
                       f"micro-batches per replica, the pipeline simulation at most {PLAN_SIMULATED_MICRO_BATCHES:,} "
                       f"(a global batch up to {PLAN_SIMULATED_MICRO_BATCHES * best.dp:,} with dp {best.dp})")
    if best is None:
        result = {"model": args.model, "global_batch": args.global_batch, "fits": False,
                  "reason": "no plan fits in the cluster's memory"}
    else:
        simulated, step = hetero.simulate(problem, best)
        result = {"model": args.model, "global_batch": args.global_batch, "fits": True,
                  "dp": best.dp, "pp": len(best.groups), "micro_batches": best.micro_batches,
                  "step_time_s": step, "planner_step_time_s": best.step_time_s,
                  "bubble_fraction": simulated.bubble_fraction,
                  "tokens_per_s": problem.global_batch * problem.model.seq_len / step,
                  "gradient_sync_s": best.sync_s, "stages": best.describe(cluster)}
        check_finite(result, where=args.cluster)
    if args.json:
        _dump_json(result)
        return 0
    print(f"{args.model} on {', '.join(f'{g.nodes} x {g.system.name} ({g.name})' for g in cluster.groups)}, "
          f"global batch {args.global_batch}")
    if not result["fits"]:
        print(result["reason"])
        return 0
    print(f"dp {result['dp']} x pp {result['pp']}, {result['micro_batches']} micro-batches per replica: "
          f"step {_fmt(result['step_time_s'])} s (simulated 1F1B; planner's closed form "
          f"{_fmt(result['planner_step_time_s'])} s), {_fmt(result['tokens_per_s'])} tokens/s")
    print(_table(result["stages"]))
    return 0


def cmd_plan_cluster(args) -> int:
    from ..model import plancluster
    from ..common import io as tsio
    from ..model.specs import resolve_model, resolve_system

    sizes = plancluster.parse_gpus(args.gpus, "--gpus")
    tokens = plancluster.parse_tokens(args.tokens, "--tokens")
    for option, path, suffix in (("--out", args.out, ".nc"), ("--figure", args.figure, ".png")):
        if path is not None and (not path.endswith(suffix) or os.path.isdir(path)):
            raise CLIError(f"{option} = {path!r} is invalid; expected a file name ending in {suffix}")
    model = resolve_model(_spec_arg(args.model, "model"), where="--model")
    system = resolve_system(_spec_arg(args.system, "system"), where="--system")
    from ..common.inputs import plausibility_warnings

    for warning in plausibility_warnings(system):
        _warn(f"--system: {warning}")
    ds = plancluster.cluster_front(model, system, sizes, tokens, args.global_batch, stack=args.stack,
                                   progress=_progress)
    written = []
    if args.out:
        written.append(tsio.write_dataset(ds, args.out))
    if args.figure:
        written.append(plancluster.save_front_figure(ds, args.figure))
    rows = plancluster.front_rows(ds)
    if args.json:
        _dump_json({"model": model.name, "system": system.name, "stack": args.stack, "tokens": tokens,
                    "global_batch": args.global_batch, "seq_len": model.seq_len,
                    "objectives": list(plancluster.OBJECTIVES),
                    "sizes": [{**{k: v for k, v in row.items() if k != "front"}, "on_front": bool(row["front"])}
                              for row in rows],
                    "written": [str(p) for p in written]})
        return 0
    print(f"{model.name} on {system.name}, {tokens:.4g} tokens, global batch {args.global_batch} sequences of "
          f"{model.seq_len} tokens, stack {args.stack}: each size's best plan the stack runs (trainscale search)")
    print(_table([{k: v for k, v in row.items() if k != "reason"} for row in rows]))
    for row in rows:
        if "reason" in row:
            print(f"{row['gpus']} GPUs: {row['reason']}")
    print("*: on the Pareto front of (days, GPU_h, MWh): no other size is no worse in all three and better in one; "
          "days = tokens / predicted tokens/s; MWh: GPUs at their predicted power and each node's overhead "
          "(systems.yaml node_overhead_W)")
    for path in written:
        print(f"wrote {path}")
    return 0


def _validation_summary(ds) -> dict:
    import numpy as np

    out = {}
    datasets = ds["dataset"].values
    for name in dict.fromkeys(datasets.tolist()):
        ape = np.abs(ds["rel_error"].values[datasets == name])
        out[name] = {"runs": int(ape.size), "mape": float(ape.mean()), "median": float(np.median(ape)),
                     "worst": float(ape.max())}
    return out


def _vtrain_arg(args):
    from ..model import validation

    if args.vtrain is None:
        return validation.vtrain_dir()
    if not Path(args.vtrain).is_dir():
        raise CLIError(f"--vtrain = {args.vtrain!r} is invalid; no such directory")
    if validation.vtrain_dir(args.vtrain) is None:
        raise CLIError(f"--vtrain = {args.vtrain!r} is invalid; it holds no ground_truth_multi.csv")
    return Path(args.vtrain)


def cmd_validate(args) -> int:
    from ..model import catalog, validation

    vtrain = _vtrain_arg(args)
    if args.search_unpublished:
        return _validate_searched(args, validation)
    try:
        ds = validation.validation_dataset(vtrain_dir=vtrain, include_vtrain_single=True)
    except FileNotFoundError as exc:
        raise CLIError(f"--vtrain = {args.vtrain!r} is invalid; {_one_line(exc)}") from None
    df = validation.table(ds).reset_index()
    summary = _validation_summary(ds)
    stored_cv = catalog.stored_cross_validation()
    cv = stored_cv.get("leave_one_dataset_out", {})
    size_out = validation.size_out_by_dataset(stored_cv)
    for name, entry in summary.items():
        entry["fitted"] = name not in validation.NOT_FITTED
        if name in cv:
            entry["cv_mape"] = float(cv[name]["mape"])
            entry["cv_worst"] = float(cv[name]["worst"])
        if name in size_out:
            entry["size_out_mape"] = float(size_out[name]["mape"])
            entry["size_out_worst"] = float(size_out[name]["worst"])
    scale = validation.scale_groups(ds)
    if args.json:
        _dump_json({"runs": df.to_dict(orient="records"), "summary": summary,
                    "scale_groups": scale.to_dict(orient="records"),
                    "plan_ranking": validation.plan_ranking(ds).to_dict(orient="records")})
        return 0
    shown = df if args.all else df[df["dataset"] != "vtrain-single"]  # 1,440 rows: only when asked
    print(_table(shown.to_dict(orient="records")))
    print()
    rows = [{"dataset": k, "runs": v["runs"], "fitted": "yes" if v["fitted"] else "no (held out)",
             "MAPE_%": 100 * v["mape"], "worst_APE_%": 100 * v["worst"],
             "left-out_MAPE_%": 100 * v["cv_mape"] if "cv_mape" in v else None,
             "left-out_worst_%": 100 * v["cv_worst"] if "cv_worst" in v else None,
             "size-out_MAPE_%": 100 * v["size_out_mape"] if "size_out_mape" in v else None}
            for k, v in summary.items()]
    print(_table(rows))
    print("\nby precision and dense / MoE (fit: in-sample where the dataset was fitted, held out where never):")
    print(_table(validation.parity_by_precision(ds).to_dict(orient="records")))
    unfitted = validation.unfitted_precisions(ds)
    if len(unfitted):
        print("\nprecisions no fitted run uses, left out entirely (their GEMMs priced from the BF16 fit and the "
              "generation's peak ratio):")
        print(_table(unfitted.to_dict(orient="records")))
    print("\nleft-out: the error when the dataset is left out of the fit; size-out: the error of its runs when "
          "each run's model-size class is left out (its other sizes stay in the fit). Both from trainscale "
          "calibrate --cv, stored in calibration_fitted.yaml\n")
    print(_table(scale.to_dict(orient="records")))
    print(f"\nruns at >= {validation.LARGE_GPUS} GPUs and below, per dataset: mean_too_fast_% is the mean signed error "
          "as a speed (positive: predicted faster than measured); too_fast_per_doubling_% its slope per doubling "
          "of the GPU count within the group\n")
    ranking = validation.plan_ranking(ds)
    print(_table((ranking if args.all else ranking[ranking["dataset"] != "vtrain-single"]).to_dict(orient="records")))
    print(f"\nplans of one model at one GPU count ({validation.MIN_PLANS} or more): spearman ranks predicted "
          "against measured time per sequence; regret_%: how much longer the model's fastest plan measured "
          "than the measured fastest")
    return 0


def _validate_searched(args, validation) -> int:
    """``validate --search-unpublished``: the runs whose source leaves a knob blank, with those knobs
    searched (searched.searched_dataset) beside their stack's defaults."""
    from ..model import searched

    ds = searched.searched_dataset()
    # one row per run: the narrower ranges (dim search_range) are summarised, not listed
    df = ds.drop_dims("search_range").to_dataframe().reset_index()
    summary = searched.searched_summary(ds).reset_index()
    if args.json:
        _dump_json({"runs": df.to_dict(orient="records"), "summary": summary.to_dict(orient="records")})
        return 0
    cols = ["run", "dataset", "metric", "measured", "predicted_default", "predicted_searched", "rel_error_default",
            "rel_error_searched"] + [f"searched_{k}" for k in validation.SEARCHED_KNOBS]
    print(_table(df[cols].to_dict(orient="records")))
    print()
    print(_table(summary.to_dict(orient="records")))
    print("\nsearched: the best plan of `trainscale search` with every published field fixed and only the knobs "
          "the source leaves blank searched (blank searched_* cell: published, not searched)")
    return 0


def cmd_calibrate(args) -> int:
    from ..model import calibration, validation

    vtrain = _vtrain_arg(args)
    progress = (lambda msg: print(f"  refit without {msg} ...", file=sys.stderr, flush=True)) \
        if sys.stderr.isatty() else None
    result = calibration.fit(vtrain)
    cv = calibration.cross_validate(vtrain, full=result, progress=progress) if args.cv else None
    written = str(calibration.write_fitted(result, cv=cv)) if args.write else None
    if args.json:
        _dump_json({"fitted": result["fitted"], "at_bound": result["at_bound"], "errors": result["errors"],
                    "cross_validation": cv, "written": written})
        return 0
    print(f"datasets: {', '.join(result['datasets'])}   cost: {result['cost']:.6g}")
    print(_table([{"scope": f"{scope[:-1]} {owner}", "parameter": name, "value": value,
                   "at_bound": "AT BOUND" if f"{owner}.{name}" in result["at_bound"] else ""}
                  for scope, owners in result["fitted"].items() for owner, params in owners.items()
                  for name, value in params.items()]))
    print()
    rows = []
    size_out = validation.size_out_by_dataset(cv) if cv is not None else {}
    for d, e in result["errors"].items():
        row = {"dataset": d, "runs": e["runs"], "MAPE_%": 100 * e["mape"], "worst_APE_%": 100 * e["worst"]}
        if cv is not None and d in cv["leave_one_dataset_out"]:
            left = cv["leave_one_dataset_out"][d]
            row.update({"left-out_MAPE_%": 100 * left["mape"], "left-out_worst_%": 100 * left["worst"]})
        if d in size_out:
            row["size-out_MAPE_%"] = 100 * size_out[d]["mape"]
        rows.append(row)
    print(_table(rows))
    if cv is not None:
        print()
        print(_table([{"size class left out": k, "runs": v["runs"], "MAPE_%": 100 * v["mape"],
                       "worst_APE_%": 100 * v["worst"]} for k, v in cv["leave_one_size_out"].items()]))
    if result["at_bound"]:
        print(f"warning: fitted at a bound: {', '.join(result['at_bound'])} (the bound, not the data, "
              "sets these values)", file=sys.stderr)
    print(f"written: {written}" if written else "not written (use --write to update the package data)")
    return 0


def cmd_systems(args) -> int:
    from ..model import catalog
    from ..model.specs import SystemSpec

    if args.fields:
        rows = [{"field": f, "units": SYSTEM_FIELDS.get(f, ("", ""))[0],
                 "meaning": SYSTEM_FIELDS.get(f, ("", ""))[1]} for f in SystemSpec.overridable_fields()]
        if args.json:
            _dump_json(rows)
        else:
            print(_table(rows))
        return 0
    rows = []
    for name in catalog.systems():
        s = SystemSpec.from_catalog(name)
        rows.append({"name": name, "accelerator": s.accelerator, "generation": s.generation,
                     "peak_TFLOPs_bf16": s.peak_flops_bf16 / 1e12, "HBM_GiB": s.hbm_capacity_GiB,
                     "HBM_GBps": s.hbm_bandwidth_GBps, "gpus_per_node": s.gpus_per_node,
                     "scale_up_domain": s.scale_up_domain, "scale_up_GBps": s.scale_up_GBps_per_gpu,
                     "scale_out_GBps": s.scale_out_GBps_per_gpu})
    if args.json:
        _dump_json(rows)
    else:
        print(_table(rows))
    return 0


def cmd_models(args) -> int:
    from ..model import catalog
    from ..model.specs import resolve_model

    rows = []
    for name in catalog.models():
        m = resolve_model(name)
        rows.append({"name": name, "layers": m.layers, "hidden": m.hidden, "heads": m.heads,
                     "kv_heads": m.kv_heads, "ffn_hidden": m.ffn_hidden, "ffn_type": m.ffn_type,
                     "vocab": m.vocab, "seq_len": m.seq_len, "params_B": m.params() / 1e9})
    if args.json:
        _dump_json(rows)
    else:
        print(_table(rows))
    return 0


def cmd_verify(args) -> int:
    from . import verify

    _require_file(args.config, "--config")
    try:
        checks = verify.verify(args.figures, args.config, args.study, write=args.write)
    except ValueError as err:
        raise CLIError(str(err)) from None
    failed = 0
    for check in checks:
        if check.ok:
            tally = comparison_counts(check.records)
            print(f"ok    {check.study}: {len(check.records)} claims ({tally})")
        else:
            failed += 1
            print(f"FAIL  {check.study}:")
            for problem in check.problems:
                print(f"        {problem}")
    print(f"{len(checks) - failed} of {len(checks)} studies' committed comparisons and figures follow from their datasets"
          f" in {args.figures}/")
    return 1 if failed else 0


def comparison_counts(records) -> str:
    from ..common import comparison

    return ", ".join(f"{n} {v}" for v, n in comparison.counts(records).items())


def cmd_gallery(args) -> int:
    from pathlib import Path

    from . import verify

    _require_file(args.config, "--config")
    try:
        if not args.write:
            print(verify.figure_gallery_markdown(args.config))
            print()
            print(verify.gallery_markdown(args.figures, args.config))
            return 0
        readme = Path(args.write)
        _require_file(str(readme), "--write")
        before = readme.read_text(encoding="utf-8")
        text = verify.update_readme(before, args.figures, args.config)
    except (FileNotFoundError, ValueError) as err:
        raise CLIError(f"gallery: {err}") from None
    if text == before:
        print(f"{readme}: the gallery and the comparison table are current (nothing written)")
        return 0
    tmp = readme.with_name(f".{readme.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, readme)
    print(f"updated the gallery and the comparison table in {readme}")
    return 0


def cmd_docs(args) -> int:
    import time

    from . import docs

    _require_file(args.config, "--config")
    if not os.path.isdir(args.figures):
        raise CLIError(f"--figures: {args.figures!r} is not a folder")
    try:
        import myst_nb  # noqa: F401 - the toolchain, checked before anything is written
        import sphinx_book_theme  # noqa: F401
    except ImportError as err:
        raise CLIError(f"docs: {err.name} is not installed (make docs installs requirements-docs.txt)") from None
    start = time.perf_counter()
    try:
        out = docs.build(args.out, args.figures, args.config, args.source)
        print(f"wrote {out}/index.html in {time.perf_counter() - start:.0f} s")
        if args.check:
            result = docs.check_site(out)
            print(f"checked in headless Chromium: {result['pages']} pages, {result['figures']} captioned figures, "
                  f"{result['images']} images, {result['links']} links")
            if result["problems"]:
                raise CLIError(f"docs: {len(result['problems'])} problem(s) in {out}; first: {result['problems'][0]}")
    except docs.DocsError as err:
        raise CLIError(str(err)) from None
    return 0


def cmd_fetch_trace(args) -> int:
    from ..workloads import curtailment

    path = curtailment.fetch_paper_trace(args.dest, args.git_dir)
    print(f"wrote {path} (sha256 {curtailment.PAPER_TRACE['sha256'][:12]}..., {curtailment.PAPER_TRACE['licence']})")
    return 0


def cmd_publish_notebook(args) -> int:
    from ..common import publish

    _require_file(args.executed, "EXECUTED")
    shown_as = None
    if args.shown_as:
        shown_as = (str(Path(args.destination).parent), args.shown_as)
    print(f"wrote {publish.publish_notebook(args.executed, args.destination, shown_as)}")
    return 0


def cmd_install_outputs(args) -> int:
    from . import workflow_outputs

    if not os.path.isdir(args.staging):
        raise CLIError(f"STAGING: {args.staging!r} is not a folder (the notebook wrote nothing there)")
    try:
        installed = workflow_outputs.install(args.staging, args.destination, args.names)
    except workflow_outputs.InstallError as err:
        raise CLIError(str(err)) from None
    print(f"installed {len(installed)} files in {args.destination}")
    return 0


def _require_file(path: str, option: str) -> None:
    if not os.path.isfile(path):
        raise CLIError(f"{option}: {path!r} is not a file")


# --------------------------------------------------------------------------- parser
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1 or value > 2**40:
        raise argparse.ArgumentTypeError(f"expected a positive integer up to 2^40, got {text!r}")
    return value


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share in [0, 1], got {text!r}")
    return value


def _bounded_int(maximum: int):
    def parse(text: str) -> int:
        value = _positive_int(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"expected a positive integer up to {maximum}, got {text!r}")
        return value

    return parse


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error in the CLI's one-line format (exit 2), without the
    usage block: ``trainscale <command>: error: <what is wrong>`` (``--help`` shows the usage)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {_one_line(message)}\n")


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
    p.add_argument("--fix", nargs="+", metavar="FIELD=VALUE", help="fixed plan fields, e.g. --fix tp=8 pp=16 cp=1")
    p.add_argument("--search", nargs="+", metavar="KNOB", help="search only these knobs (the others keep "
                   "their defaults unless fixed), e.g. --search interleave recompute micro_batch")
    p.add_argument("--space", action="store_true", help=space_help)
    p.add_argument("--json", action="store_true")
    p.add_argument("--allow-unrunnable", action="store_true",
                   help="also propose plans the stack does not run (data/stack_rules.yaml), with a warning")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser)

    p = sub.add_parser("predict", help="predict step time, throughput, MFU, memory and energy of runs",
                       description="Predict step time, throughput, MFU, memory and energy of runs. A run is "
                       "{id, model, system, gpus, plan}; its plan's fields are below.",
                       epilog=plan_fields_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", metavar="RUNS.yaml", help="one run (a mapping) or 'runs:' with a list of runs")
    p.add_argument("--json", action="store_true", help="print one JSON array, one object per run")
    p.add_argument("--allow-unrunnable", action="store_true",
                   help="price a plan its stack does not run (data/stack_rules.yaml) with a warning, instead of refusing it")
    p.set_defaults(func=cmd_predict)

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

    p = sub.add_parser("plan", help="plan a pipeline over a heterogeneous cluster (groups + links YAML)")
    p.add_argument("cluster", metavar="CLUSTER.yaml", help="groups: [{name, system, nodes}], links: [...]")
    p.add_argument("--model", required=True, help="catalog model name")
    p.add_argument("--global-batch", required=True, type=_positive_int,
                   help="sequences per optimizer step, over all data-parallel ranks")
    p.add_argument("--max-stages", type=_positive_int, default=8, help="most pipeline stages (default 8)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("plan-cluster", help="across cluster sizes: each size's best plan, its time to train a token "
                       "budget, GPU-hours and energy, and the Pareto front of the three",
                       description="For each cluster size, the best plan the stack runs (as `search` finds it) and "
                       "what training --tokens tokens on it costs: days, GPU-hours and MWh (GPUs at their predicted "
                       "power plus each node's overhead). A size is on the Pareto front (*) when no other size is no "
                       "worse in all three and better in one.")
    p.add_argument("--model", required=True, help="catalog model name, or a YAML file with the model's shape")
    p.add_argument("--system", required=True, help="catalog system name, or a YAML file {name: ..., overrides}")
    p.add_argument("--gpus", required=True, metavar="SIZES",
                   help="cluster sizes: 256,512,1024 or a range of powers of two 256..8192 (or both, comma-separated)")
    p.add_argument("--tokens", required=True, metavar="TOKENS", help="tokens to train, e.g. 1e12")
    p.add_argument("--global-batch", required=True, type=_positive_int,
                   help="sequences per optimizer step, over all data-parallel ranks (the same at every size)")
    p.add_argument("--stack", default="megatron", choices=("megatron", "deepspeed", "fsdp", "nemo"),
                   help="software stack that runs the plans (default megatron)")
    p.add_argument("--out", metavar="FRONT.nc", help="write the sizes, plans, costs and front as a netCDF dataset")
    p.add_argument("--figure", metavar="FRONT.png", help="draw time to train against GPU-hours, the front joined")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan_cluster)

    p = sub.add_parser("validate", help="predicted vs measured on every published run the project carries")
    p.add_argument("--vtrain", metavar="DIR", help="vTrain folder with ground_truth_multi.csv "
                   "(default: the copy shipped in trainscale/data/vtrain)")
    p.add_argument("--all", action="store_true", help="also print vTrain's 1,440 single-node runs one by one (the summary always has them)")
    p.add_argument("--search-unpublished", action="store_true",
                   help="only the runs whose source leaves a knob blank (interleave, micro-batch, recompute): "
                        "the best plan with those knobs searched, beside their stack's defaults")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("calibrate", help="fit the performance-model parameters on the measured runs")
    p.add_argument("--vtrain", metavar="DIR", help="vTrain folder with ground_truth_multi.csv "
                   "(default: the copy shipped in trainscale/data/vtrain)")
    p.add_argument("--cv", action="store_true", help="also refit leaving out each dataset and each model-size "
                   "class, and report the error on what was left out (minutes)")
    p.add_argument("--write", action="store_true", help="write the fitted values into the package data")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("verify", help="check every study's paper comparison on the committed datasets")
    p.add_argument("--figures", default="figures", help="folder with one folder per study (default: figures)")
    p.add_argument("--config", default="config/config.yaml", help="workflow config listing the studies")
    p.add_argument("--study", nargs="+", metavar="STUDY", help="only these studies")
    p.add_argument("--write", action="store_true",
                   help="first rewrite each study's comparison.csv from its committed datasets with the study's "
                        "compare (after a change to the verdict rule or to a compare, never to the data), then check")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("gallery", help="the README's gallery and verdict counts (from the registry and every "
                       "study's comparison.csv); without --write, the full figure gallery and comparison table")
    p.add_argument("--figures", default="figures", help="folder with one folder per study (default: figures)")
    p.add_argument("--config", default="config/config.yaml", help="workflow config listing the studies")
    p.add_argument("--write", metavar="README", help="replace the two generated blocks (between their markers) in this file")
    p.set_defaults(func=cmd_gallery)

    p = sub.add_parser("docs", help="the documentation site (Sphinx, myst-nb, book theme) from docs/ and the "
                       "committed outputs")
    p.add_argument("--figures", default="figures", help="folder with one folder per study (default: figures)")
    p.add_argument("--config", default="config/config.yaml", help="workflow config listing the studies")
    p.add_argument("--source", default="docs", help="the hand-written pages and conf.py (default: docs)")
    p.add_argument("--out", default="results/docs/html", help="the site's folder (default: results/docs/html)")
    p.add_argument("--check", action="store_true", help="then load every page in headless Chromium: no broken "
                   "link or image, every figure captioned")
    p.set_defaults(func=cmd_docs)

    p = sub.add_parser("publish-notebook", help="copy an executed notebook without timestamps, for readers")
    p.add_argument("executed", metavar="EXECUTED", help="the notebook papermill executed")
    p.add_argument("destination", metavar="DEST", help="where to write the copy (next to its figures)")
    p.add_argument("--shown-as", metavar="FOLDER",
                   help="the folder the outputs are moved to: replaces DEST's folder (a staging folder) in the copy")
    p.set_defaults(func=cmd_publish_notebook)

    p = sub.add_parser("install-outputs", help="move a study's staged outputs into place once all are there "
                       "(the workflow's last step; nothing moves if one is missing)")
    p.add_argument("staging", metavar="STAGING", help="the folder the notebook wrote into")
    p.add_argument("destination", metavar="DEST", help="the outputs' folder, e.g. figures/<study>")
    p.add_argument("names", metavar="NAME", nargs="+", help="the files to move (every declared output)")
    p.set_defaults(func=cmd_install_outputs)

    p = sub.add_parser("fetch-trace", help="fetch the curtailment paper's marginal-carbon-intensity trace "
                       "(exalsius/curtail-llm evaluation/mci.csv, not redistributable) into external/, checked by sha256")
    p.add_argument("--git-dir", metavar="DIR", help="read it from a local clone of exalsius/curtail-llm instead "
                   "of downloading it")
    p.add_argument("--dest", metavar="FILE", help="where to write it (default: external/curtail-llm/mci.csv)")
    p.set_defaults(func=cmd_fetch_trace)

    p = sub.add_parser("systems", help="list catalog systems")
    p.add_argument("--fields", action="store_true", help="list the fields a run may override, with units")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_systems)

    p = sub.add_parser("models", help="list catalog models")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ..model.specs import SpecError

    try:
        return args.func(args)
    except (SpecError, CLIError) as exc:
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's status for SIGINT
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `trainscale models | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
