"""The planner: the best distinct plans of a space (:func:`search`). One pass of the Numba kernel prices the
space's valid layouts in closed form (:mod:`.searchspace`), the best are re-priced by :func:`~.perfmodel.predict`
with their pipelines simulated, folded where equal, and each carries its confidence (:mod:`.confidence`).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import xarray as xr

from ..common.checks import check_float
from .grid import _check_split_ends, default_space, plan_from_grid_entry
from .perfmodel import predict
from .specs import DEFAULT_STACK, ModelSpec, PlanSpec, RunSpec, SystemSpec, resolve_model, resolve_system
from .vectors import calibration_vector, precision_choices, with_moe_knobs, with_precision

RERANK_CANDIDATES = 32
# the fixed MoE knobs the stack rules read (data/stack_rules.yaml)
RULE_KNOBS = ("overlap_moe_expert_parallel_comm", "moe_dispatcher", "recompute_modules", "cuda_graph_impl",
              "fused_grouped_mlp")
MOE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(PlanSpec)
                if f.name in ("moe_imbalance", "overlap_moe_expert_parallel_comm", "moe_dispatcher", "cuda_graph_impl",
                              "fused_grouped_mlp")}


def moe_knobs(moe_imbalance: float = 1.0, overlap_moe_expert_parallel_comm: bool = False,
              moe_dispatcher: str = "alltoall", recompute_modules: str | Sequence[str] = "",
              cuda_graph_impl: str = "none", fused_grouped_mlp: bool = False) -> dict:
    """A search's fixed MoE, recomputation and CUDA-graph knobs, checked as a plan's (one line naming the field on
    bad input), with the kernels' module mask."""
    plan = PlanSpec.from_dict({"global_batch": 1, "dp": 1, "recompute": "selective", "moe_imbalance": moe_imbalance,
                               "overlap_moe_expert_parallel_comm": overlap_moe_expert_parallel_comm,
                               "moe_dispatcher": moe_dispatcher, "recompute_modules": recompute_modules,
                               "cuda_graph_impl": cuda_graph_impl, "fused_grouped_mlp": fused_grouped_mlp})
    return {"moe_imbalance": plan.moe_imbalance,
            "overlap_moe_expert_parallel_comm": plan.overlap_moe_expert_parallel_comm,
            "moe_dispatcher": plan.moe_dispatcher, "recompute_modules": plan.recompute_modules,
            "recompute_module_mask": plan.recompute_module_mask, "cuda_graph_impl": plan.cuda_graph_impl,
            "fused_grouped_mlp": plan.fused_grouped_mlp}


def search(model, system, gpus: int, global_batch: int, top: int = 5, space: Mapping | None = None,
           calibration: Mapping | None = None, rerank: int = RERANK_CANDIDATES,
           stack: str = DEFAULT_STACK, progress=None, compiled: bool = False, grad_reduce_fp32: bool = False,
           recompute_share: float | None = None, rotary_kernel: str = "",
           tp_async_backward: bool | None = None, split_ends: int = 0,
           allow_unrunnable: bool = False, precision: str | Sequence[str] = "bf16",
           fp8_recipe: str = "", moe_imbalance: float = 1.0, overlap_moe_expert_parallel_comm: bool = False,
           moe_dispatcher: str = "alltoall", recompute_modules: str | Sequence[str] = "",
           cuda_graph_impl: str = "none", fused_grouped_mlp: bool = False) -> tuple[xr.Dataset, list[dict]]:
    """The ``top`` best distinct feasible plans (highest throughput first) with a summary of the space.

    The space (default :func:`default_space`) is priced with the pipeline closed form over its structurally
    valid layouts in one pass that keeps only the fastest plans (:func:`trainscale.model.searchspace.scan_space`); the
    best ``max(top, rerank)`` plans in that order (a tie at the cut taken whole) are re-priced by :func:`predict`,
    which simulates their pipelines, re-ranked and folded (:func:`trainscale.model.searchspace.fold_equal_plans`: equal step time and memory, same
    layout, differing only in settings such as recompute none / selective under flash attention); more plans
    are re-priced until ``top`` distinct ones are found or the space runs out. Returns ``(summary, ranked)``:
    ``summary`` (:func:`trainscale.model.searchspace.space_summary`) counts the space's plans by reason, ``ranked``
    holds dicts with the plan, its predicted step time (simulated), the closed form's, throughput, MFU,
    memory, ``folded`` (the knob values of the plans folded into it) and ``confidence``
    (:func:`trainscale.model.confidence.plan_confidence`: the nearest measured run, the distance from it, its dataset's
    left-out error, and whether the plan's MFU exceeds the best measured on its generation by more than that). ``progress`` (optional) wraps the
    re-pricing loop, e.g. :func:`trainscale.common.progress.progress` for a bar on a terminal. ``stack``,
    ``compiled``, ``grad_reduce_fp32``, ``recompute_share``, ``rotary_kernel`` and ``tp_async_backward``
    are fixed plan fields of every plan searched (the share only on the selective ones); ``split_ends``
    (:func:`evaluate_grid`) the pipeline split of every pipelined one. Plans the stack does not run
    (:mod:`trainscale.model.stackrules`, ``data/stack_rules.yaml``) are masked and counted by rule
    (``summary.attrs['plans_by_stack_rule']``) unless ``allow_unrunnable``.

    ``precision`` (bf16, fp8, mxfp8, nvfp4) and ``fp8_recipe`` (blank: the format's first) are the number format
    of every plan, priced as :func:`predict` prices that plan field (:func:`with_precision`) and carried by the
    rows' plans; a format the system has no tensor cores for is refused (:func:`precision_choices`). Several
    formats (a sequence, or ``"bf16,fp8"``) are searched one after the other and ranked together: the ``top``
    fastest rows of all, the summary's counts the sums (``summary.attrs['precision']`` lists them).

    ``moe_imbalance``, ``overlap_moe_expert_parallel_comm`` and ``moe_dispatcher`` (a mixture of experts) and
    ``recompute_modules`` (Megatron-Core's named modules, on the plans that recompute selectively), ``cuda_graph_impl``
    and ``fused_grouped_mlp`` (Megatron-Core's CUDA graphs and the experts' fused grouped MLP) are fixed plan
    fields of every plan searched, priced as :func:`predict` prices them; the stack rules see them with the
    precision (the EP all-to-all overlap needs ep > 1, so with it on a search keeps only the plans with expert
    parallelism; the fused grouped MLP needs mxfp8).
    """
    from .confidence import plan_confidence
    from .searchspace import (CandidateStream, distinct_plans, fold_equal_plans, merge_summaries, scan_space,
                              space_summary)

    model = resolve_model(model)
    system = resolve_system(system)
    choices = precision_choices(system, precision, fp8_recipe)
    if len(choices) > 1:
        found = [search(model, system, gpus, global_batch, top, space, calibration, rerank, stack, progress,
                        compiled, grad_reduce_fp32, recompute_share, rotary_kernel, tp_async_backward, split_ends,
                        allow_unrunnable, precision=p, fp8_recipe=r, moe_imbalance=moe_imbalance,
                        overlap_moe_expert_parallel_comm=overlap_moe_expert_parallel_comm,
                        moe_dispatcher=moe_dispatcher, recompute_modules=recompute_modules,
                        cuda_graph_impl=cuda_graph_impl, fused_grouped_mlp=fused_grouped_mlp) for p, r in choices]
        rows = sorted((row for _, ranked in found for row in ranked), key=lambda row: row["step_time_s"])
        return merge_summaries([summary for summary, _ in found]), rows[:top]
    ((precision, recipe),) = choices
    space = dict(space or default_space(model, system, gpus, global_batch))
    if recompute_share is not None:
        recompute_share = check_float("recompute_share", recompute_share, 0.0, 1.0)
    moe = moe_knobs(moe_imbalance, overlap_moe_expert_parallel_comm, moe_dispatcher, recompute_modules,
                    cuda_graph_impl, fused_grouped_mlp)
    calib = with_precision(calibration_vector(system.generation, calibration, stack, compiled, grad_reduce_fp32,
                                              recompute_share, rotary_kernel, tp_async_backward),
                           system, calibration, stack, precision, recipe)
    with_moe_knobs(calib, moe["moe_imbalance"], moe["overlap_moe_expert_parallel_comm"], moe["moe_dispatcher"],
                   moe["recompute_module_mask"], moe["cuda_graph_impl"], moe["fused_grouped_mlp"])
    _check_split_ends(split_ends)
    prices = scan_space(model, system, calib, gpus, global_batch, space, split_ends=split_ends,
                        stack_rules=None if allow_unrunnable else stack,
                        fixed={"compiled": bool(compiled), "precision": precision, **{k: moe[k] for k in RULE_KNOBS}})
    fixed = {"stack": stack, "allow_unrunnable": bool(allow_unrunnable), "compiled": bool(compiled), "grad_reduce_fp32": bool(grad_reduce_fp32),
             "rotary_kernel": rotary_kernel, "tp_async_backward": tp_async_backward,
             "recompute_share": recompute_share, "split_ends": int(split_ends), "precision": precision,
             "fp8_recipe": recipe, **moe}
    stream = CandidateStream(distinct_plans(prices))
    priced, rows = [], []
    count = max(top, rerank)
    while len(rows) < top and not stream.exhausted:
        batch = stream.take(count)
        for entry in (progress(batch, len(batch), "re-price") if progress else batch):
            _reprice(entry, model, system, global_batch, calibration, fixed)
        priced = sorted(priced + batch, key=lambda e: e["step_time_s"])
        rows = fold_equal_plans(priced)
        count = top - len(rows)
    for row in rows[:top]:
        row["confidence"] = plan_confidence(model, system, plan_from_grid_entry(row["plan"], global_batch), row["mfu"])
    summary = space_summary(prices)
    summary.attrs["precision"] = [precision]
    return summary, rows[:top]


def _reprice(entry: dict, model: ModelSpec, system: SystemSpec, global_batch: int, calibration, fixed: Mapping):
    """Give a ranked entry its search-wide plan fields and re-price it with :func:`predict` (pipeline simulated)."""
    plan = entry["plan"]
    plan.update(stack=fixed["stack"], compiled=fixed["compiled"], grad_reduce_fp32=fixed["grad_reduce_fp32"],
                precision=fixed["precision"], fp8_recipe=fixed["fp8_recipe"])
    if fixed["rotary_kernel"]:
        plan["rotary_kernel"] = fixed["rotary_kernel"]
    if fixed["tp_async_backward"] is not None:
        plan["tp_async_backward"] = bool(fixed["tp_async_backward"])
    if fixed["recompute_share"] is not None and plan["recompute"] == "selective":
        plan["recompute_share"] = float(fixed["recompute_share"])
    plan.update({k: v for k, v in fixed.items() if k in MOE_DEFAULTS and v != MOE_DEFAULTS[k]})  # given ones only
    if fixed["recompute_modules"] and plan["recompute"] == "selective":
        plan["recompute_modules"] = fixed["recompute_modules"]
    if fixed["split_ends"] and plan["pp"] > 1:
        plan["embedding_in_split"] = bool(fixed["split_ends"] & 1)
        plan["loss_in_split"] = bool(fixed["split_ends"] & 2)
    p = predict(RunSpec(id="search", model=model, system=system, plan=plan_from_grid_entry(plan, global_batch)),
                calibration, allow_unrunnable=fixed["allow_unrunnable"], warn=False)
    entry["closed_form_step_time_s"] = entry["step_time_s"]
    entry.update(step_time_s=p.step_time_s, tokens_per_s=p.tokens_per_s, mfu=p.mfu,
                 memory_gib_per_gpu=p.memory_gib_per_gpu, power_W_per_gpu=p.power_W_per_gpu,
                 energy_J_per_token=p.energy_J_per_token)




__all__ = ["search", "RERANK_CANDIDATES"]
