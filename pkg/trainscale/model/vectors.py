"""From specs to the kernels' arrays: the model, system and calibration vectors (layouts ``M_*``, ``S_*``,
``C_*`` of :mod:`trainscale.kernels.layout`), the calibration's fitted and carried parameters, the low-precision
slots of a plan's number format, a plan's integer fields and pipeline split, and one plan's result vector in
closed form (:func:`plan_vector`). Everything :mod:`.perfmodel`, :mod:`.grid` and :mod:`.searchspace` hand to
the kernels is built here, once.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from . import catalog
from ..kernels import layout as K
from ..kernels.layer import layer_costs
from ..kernels.pipesplit import split_chunk_layers
from ..kernels.plan import plan_costs
from .specs import (DEFAULT_STACK, FP8_RECIPES, PRECISIONS, RECOMPUTE_MODES, ROTARY_KERNELS, ModelSpec, PlanSpec,
                    SpecError, SystemSpec)

GiB = 2.0**30


# --------------------------------------------------------------------------- spec -> arrays
def model_vector(model: ModelSpec) -> np.ndarray:
    vec = np.zeros(K.M_SIZE)
    h = model.hidden
    vec[K.M_LAYERS] = model.layers
    vec[K.M_HIDDEN] = h
    vec[K.M_HEADS] = model.heads
    vec[K.M_KV_HEADS] = model.kv_heads
    vec[K.M_FFN] = model.ffn_hidden
    vec[K.M_FFN_MATS] = model.ffn_matrices
    vec[K.M_VOCAB] = model.vocab
    vec[K.M_SEQ] = model.seq_len
    vec[K.M_PARAMS_LAYER] = model.params_per_layer()
    vec[K.M_EXPERTS] = model.experts
    vec[K.M_TOP_K] = model.top_k
    vec[K.M_CAPACITY] = model.capacity_factor
    if model.is_moe:  # the layer's shared part; its experts in their own slot
        vec[K.M_PARAMS_LAYER] = model.shared_params_per_layer()
        vec[K.M_PARAMS_EXPERTS] = model.expert_params_per_layer()
    vec[K.M_ROTARY] = 1.0 if model.rotary else 0.0
    vec[K.M_PARAMS_EMBED] = model.vocab * h + model.position_params()
    vec[K.M_PARAMS_HEAD] = model.params() - model.layer_params() - vec[K.M_PARAMS_EMBED]
    vec[K.M_HEAD_DIM] = model.kv_channels
    vec[K.M_SHARED_FFN] = model.shared_ffn_width
    vec[K.M_Q_LORA] = model.q_lora_rank
    vec[K.M_KV_LORA] = model.kv_lora_rank
    vec[K.M_QK_HEAD] = model.qk_head_dim
    vec[K.M_QK_POS] = model.qk_pos_emb_head_dim
    vec[K.M_V_HEAD] = model.v_head_dim
    vec[K.M_HIDDEN_DROPOUT] = model.hidden_dropout
    vec[K.M_ATTENTION_DROPOUT] = model.attention_dropout
    vec[K.M_EXPERT_BIAS] = 1.0 if model.expert_bias else 0.0
    vec[K.M_GLU_CLAMP] = model.activation_func_clamp_value
    vec[K.M_MTP_LAYERS] = model.mtp_num_layers
    vec[K.M_TENSORS_LAYER] = model.weight_matrices_per_layer()
    return vec


def system_vector(system: SystemSpec) -> np.ndarray:
    vec = np.zeros(K.S_SIZE)
    vec[K.S_PEAK_FLOPS] = system.peak_flops_bf16
    vec[K.S_HBM_BW] = system.hbm_bandwidth_GBps * 1e9
    vec[K.S_HBM_BYTES] = system.hbm_capacity_GiB * GiB
    vec[K.S_SMS] = system.sm_count
    vec[K.S_TDP_W] = system.tdp_W
    vec[K.S_IDLE_W] = system.idle_W
    vec[K.S_GPUS_PER_NODE] = system.gpus_per_node
    vec[K.S_SCALE_UP_DOMAIN] = system.scale_up_domain
    vec[K.S_SCALE_UP_BW] = system.scale_up_GBps_per_gpu * 1e9
    vec[K.S_SCALE_UP_LAT] = system.scale_up_latency_s
    vec[K.S_SCALE_OUT_BW] = system.scale_out_GBps_per_gpu * 1e9
    vec[K.S_SCALE_OUT_LAT] = system.scale_out_latency_s
    vec[K.S_LEAF_GPUS] = system.scale_out_leaf_gpus
    vec[K.S_OVERSUB] = system.scale_out_oversubscription
    vec[K.S_HOP_LAT] = system.scale_out_hop_latency_s
    vec[K.S_NVLS_EFF] = system.scale_up_nvls_efficiency
    return vec


GENERATION_FITTED = ("gemm_peak_efficiency", "network_efficiency")
# per generation, fitted only where a generation has low-precision runs (trainscale.model.calibration.parameter_keys)
PRECISION_FITTED = ("lowp_gemm_efficiency",)
STACK_FITTED = ("compute_efficiency", "layer_host_s", "zero3_fetch_s", "elementwise_traffic")
COMMON_FITTED = ("straggler_spread",)  # one value for every generation and stack (calibration.yaml: common_fitted)
FITTED = GENERATION_FITTED + PRECISION_FITTED + STACK_FITTED + COMMON_FITTED
# fixed common values an override may also replace (a sensitivity sweep, or a module that prices the
# effect itself: trainscale.model.overlap computes the contention of overlapped collectives per run)
COMMON_OVERRIDABLE = ("overlap_compute_slowdown",)


def _carried(table: Mapping, scope: str, fitted: Mapping, name: str, start: Mapping) -> float:
    """The value of parameter ``name`` for the generation or stack ``scope``: its own fitted value;
    else, following ``carries_from`` (and a parameter's ``carried_from``), the first fitted value
    on the way; else the starting value in ``calibration.yaml``."""
    visited = []
    while scope not in visited:
        visited.append(scope)
        spec = start.get(scope, {}).get(name, {})
        if "carried_from" in spec:  # never fitted for this scope: always the other one's value
            scope = spec["carried_from"]
            continue
        if name in fitted.get(scope, {}):
            return float(fitted[scope][name])
        scope = table[scope]["carries_from"]
    for seen in visited:  # nothing fitted on the way: the first own starting value
        spec = start.get(seen, {}).get(name)
        if spec is not None and "carried_from" not in spec:
            return float(spec["value"])
    raise SpecError("calibration", name, f"no starting value for {visited[0]} in calibration.yaml")


def calibration_parameters(generation: str, overrides: Mapping[str, float] | None = None,
                           stack: str = DEFAULT_STACK, fitted: Mapping | None = None) -> dict:
    """The fitted parameters in force for an accelerator generation and software stack (name -> value).

    ``overrides`` replaces any of them (``FITTED``) for this call, as the studies' sensitivity
    sweeps do; ``fitted`` (``{"generations": {...}, "stacks": {...}}``, default: the values
    ``trainscale calibrate`` wrote) is what the fit itself varies."""
    cal = catalog.calibration()
    gens = cal["generations"]
    if generation not in gens:
        raise SpecError("generation", generation, f"expected one of {', '.join(gens)}")
    if stack not in cal["stacks"]:
        raise SpecError("plan.stack", stack, f"expected one of {', '.join(cal['stacks'])}")
    fitted = catalog.fitted_calibration() if fitted is None else fitted
    stack_start = {name: spec["fitted"] for name, spec in cal["stacks"].items()}
    params = {name: _carried(gens, generation, fitted.get("generations", {}), name, cal["fitted"])
              for name in GENERATION_FITTED + PRECISION_FITTED}
    params.update({name: _carried(cal["stacks"], stack, fitted.get("stacks", {}), name, stack_start)
                   for name in STACK_FITTED})
    common_fitted = (fitted.get("common") or {}).get("all", {})
    params.update({name: float(common_fitted.get(name, cal["common_fitted"][name]["value"]))
                   for name in COMMON_FITTED})
    for name, value in (overrides or {}).items():
        if name in COMMON_OVERRIDABLE:
            continue  # applied by calibration_vector
        if name not in params:
            raise SpecError("calibration", name, f"expected one of {', '.join(FITTED + COMMON_OVERRIDABLE)}")
        params[name] = float(value)
    return params


def calibration_vector(generation: str, overrides: Mapping[str, float] | None = None,
                       stack: str = DEFAULT_STACK, compiled: bool = False,
                       grad_reduce_fp32: bool = False, recompute_share: float | None = None,
                       rotary_kernel: str = "", tp_async_backward: bool | None = None) -> np.ndarray:
    """The calibration vector (layout ``C_*``) of a generation and stack; ``compiled`` (a plan's
    ``compiled``: torch.compile fuses the element-wise chains) sets the stack's element-wise traffic
    factor to 1, that of hand-fused kernels; ``grad_reduce_fp32`` (a plan's) makes the gradients
    4 bytes each, and where the stack reduces fp32 gradients with an all-reduce
    (``fp32_grads_allreduced``: DeepSpeed's BF16_Optimizer) it does so under ZeRO 1-2 too;
    ``recompute_share`` (a plan's) replaces the stack's selective-recompute share; ``rotary_kernel``
    (a plan's) the stack's rotary-embedding kernel (a compiled plan's is ``fused``);
    ``tp_async_backward`` (a plan's; None: the stack's) whether the backward's tensor-parallel
    collectives run asynchronously beside its GEMMs."""
    cal = catalog.calibration()
    params = calibration_parameters(generation, overrides, stack)
    fixed = cal["generations"][generation]["fixed"]
    common = cal["common"]
    vec = np.zeros(K.C_SIZE)
    # the stack's kernels reach compute_efficiency of Megatron's GEMM and element-wise efficiency
    vec[K.C_GEMM_PEAK_EFF] = min(1.0, params["gemm_peak_efficiency"] * params["compute_efficiency"])
    vec[K.C_NET_EFF] = params["network_efficiency"]
    vec[K.C_FETCH_S] = params["zero3_fetch_s"]
    vec[K.C_LAYER_HOST_S] = params["layer_host_s"]
    stack_fixed = cal["stacks"][stack]["fixed"]
    vec[K.C_GRAD_BYTES] = 4.0 if grad_reduce_fp32 else stack_fixed["grad_bytes"]["value"]
    vec[K.C_ELEM_TRAFFIC] = 1.0 if compiled else params["elementwise_traffic"]
    vec[K.C_SELECTIVE_SHARE] = (stack_fixed["selective_recompute_share"]["value"] if recompute_share is None
                                else recompute_share)
    vec[K.C_BF16_OPTIMIZER] = 1.0 if grad_reduce_fp32 and stack_fixed["fp32_grads_allreduced"]["value"] else 0.0
    vec[K.C_SP_LAYOUT_COPY] = 1.0 if stack_fixed["sp_batch_first_copies"]["value"] else 0.0
    vec[K.C_EVEN_SPLIT] = 1.0 if stack_fixed["interleave_even_split"]["value"] else 0.0
    async_bwd = stack_fixed["tp_async_backward"]["value"] if tp_async_backward is None else tp_async_backward
    vec[K.C_TP_ASYNC_BWD] = 1.0 if async_bwd else 0.0
    for direction, k_bytes, k_kernels in (("forward", K.C_LOSS_FWD_BYTES, K.C_LOSS_FWD_KERNELS),
                                          ("backward", K.C_LOSS_BWD_BYTES, K.C_LOSS_BWD_KERNELS)):
        loss = stack_fixed[f"loss_{direction}_bytes_per_logit"]
        vec[k_bytes], vec[k_kernels] = loss["value"], loss["kernels"]
    kernel = "fused" if compiled else (rotary_kernel or stack_fixed["rotary_kernel"]["value"])
    if kernel not in ROTARY_KERNELS:
        raise SpecError("plan.rotary_kernel", kernel, f"expected one of {', '.join(ROTARY_KERNELS)}")
    rotary = common["rotary_kernels"][kernel]
    vec[K.C_ROTARY_BYTES], vec[K.C_ROTARY_KERNELS] = rotary["bytes_per_element"], rotary["kernels"]
    # the stack's fused attention kernel: native to the generation, or FlashAttention-2 at its measured share
    fa2 = stack_fixed["attention_kernel"]["value"] == "fa2"
    vec[K.C_ATTN_EFF] = fixed["fa2_attention_efficiency"]["value"] if fa2 else 1.0
    vec[K.C_ATTN_EXP_FLOPS] = fixed["flops_per_exponential"]["value"]
    vec[K.C_TILE_M] = fixed["tile_m"]["value"]
    vec[K.C_TILE_N] = fixed["tile_n"]["value"]
    vec[K.C_KERNEL_S] = common["kernel_overhead_s"]["value"]
    vec[K.C_HBM_EFF] = min(1.0, common["hbm_efficiency"]["value"] * params["compute_efficiency"])
    vec[K.C_RESERVED_BYTES] = common["reserved_GiB"]["value"] * GiB
    vec[K.C_POWER_COMPUTE] = common["power_compute_share"]["value"]
    vec[K.C_POWER_MEMORY] = common["power_memory_share"]["value"]
    vec[K.C_OVERLAP_SLOWDOWN] = float((overrides or {}).get("overlap_compute_slowdown",
                                                            common["overlap_compute_slowdown"]["value"]))
    vec[K.C_ATTN_BWD_EFF] = common["attention_backward_efficiency"]["value"]
    vec[K.C_LINEAR_SPEEDUP] = 1.0  # bf16; a plan's precision: plan_calibration_vector
    vec[K.C_STRAGGLER_SPREAD] = params["straggler_spread"]
    vec[K.C_PIPE_PARTITIONED] = 1.0 if stack_fixed.get("pipe_partitioned_gathers", {}).get("value", False) else 0.0
    bucket = stack_fixed["dp_bucket"]  # how the stack cuts the data-parallel gradients (kernels.dpsync.dp_buckets)
    vec[K.C_DP_BUCKET_FLOOR] = float(bucket["params_floor"])
    vec[K.C_DP_BUCKET_PER_RANK] = float(bucket["params_per_rank"])
    vec[K.C_DP_BUCKET_OVERLAP_ONLY] = 1.0 if bucket["only_with_overlap"] else 0.0
    vec[K.C_DP_BUCKET_PER_BLOCK] = 1.0 if bucket.get("per_block", False) else 0.0
    vec[K.C_MOE_IMBALANCE] = 1.0  # balanced experts; a plan's moe_imbalance: plan_calibration_vector
    vec[K.C_MOE_OP_HOST_S] = common["moe_op_host_s"]["value"]  # used by MoE layers only
    vec[K.C_RECOMPUTE_MODULES] = float(K.RM_CORE_ATTN)  # a selective recompute's default; a plan's: plan_calibration_vector
    return vec


def low_precision_peak(system: SystemSpec, precision: str) -> float:
    """The dense tensor-core peak (FLOP/s) of ``precision`` on ``system``: bf16's, FP8's (also MXFP8's:
    the same tensor-core rate on Blackwell), or FP4's for NVFP4 (``peak_flops_fp4`` in systems.yaml)."""
    if precision == "bf16":
        return system.peak_flops_bf16
    peak = system.peak_flops_fp4 if precision == "nvfp4" else system.peak_flops_fp8
    if peak is None:
        raise SpecError("plan.precision", precision, f"{system.name} has no {precision} peak in systems.yaml; "
                        "valid: bf16" + (", fp8" if system.peak_flops_fp8 else ""))
    return peak


def precision_slots(vec: np.ndarray, system: SystemSpec, precision: str, recipe: str, relative_efficiency: float,
                    ) -> None:
    r"""Write a plan's precision into its calibration vector (in place); bf16 leaves it untouched.

    The linear layers' GEMMs run at the low-precision peak ``P_lp`` with the bf16 efficiency of their
    shape times ``rho``, the generation's fitted ``lowp_gemm_efficiency`` (scale management, the
    tensor-core pipeline and the narrower operands keep a low-precision GEMM from doubling bf16's rate):
    ``C_LINEAR_SPEEDUP = rho P_lp / P_bf16``. The recipe's HBM bytes to quantize each activation element,
    each weight, and the low-precision weight copies held come from ``precision_recipes`` in
    calibration.yaml (counted from Transformer Engine's kernels, not fitted)."""
    if precision == "bf16":
        return
    spec = catalog.calibration()["common"]["precision_recipes"][recipe]
    vec[K.C_LINEAR_SPEEDUP] = relative_efficiency * low_precision_peak(system, precision) / system.peak_flops_bf16
    vec[K.C_CAST_BYTES] = spec["cast_bytes_per_element"]
    vec[K.C_WEIGHT_CAST_BYTES] = spec["weight_cast_bytes_per_param"]
    vec[K.C_LP_WEIGHT_BYTES] = spec["weight_copy_bytes_per_param"]
    vec[K.C_SAVED_INPUT_BYTES] = spec["saved_input_bytes_per_element"]


def plan_calibration_vector(system: SystemSpec, plan: PlanSpec,
                            calibration: Mapping[str, float] | None = None) -> np.ndarray:
    """The calibration vector a plan runs with: its system's generation, its stack and the plan's
    own knobs (``compiled``, ``grad_reduce_fp32``, ``recompute_share``, ``rotary_kernel``,
    ``tp_async_backward``, ``precision`` and ``fp8_recipe``, ``custom_pipeline_layout``, ``moe_imbalance``,
    ``overlap_moe_expert_parallel_comm``, ``moe_dispatcher``, ``recompute_modules``, ``cuda_graph_impl``,
    ``fused_grouped_mlp``)."""
    vec = calibration_vector(system.generation, calibration, plan.stack, plan.compiled, plan.grad_reduce_fp32,
                             plan.recompute_share, plan.rotary_kernel, plan.tp_async_backward)
    if plan.custom_pipeline_layout:  # the run's own layout: chunks need not hold equal layers
        vec[K.C_EVEN_SPLIT] = 0.0
    with_moe_knobs(vec, plan.moe_imbalance, plan.overlap_moe_expert_parallel_comm, plan.moe_dispatcher,
                   plan.recompute_module_mask, plan.cuda_graph_impl, plan.fused_grouped_mlp)
    return with_precision(vec, system, calibration, plan.stack, plan.precision, plan.recipe)


def with_moe_knobs(vec: np.ndarray, moe_imbalance: float = 1.0, overlap_moe_expert_parallel_comm: bool = False,
                   moe_dispatcher: str = "alltoall", recompute_module_mask: int = K.RM_CORE_ATTN,
                   cuda_graph_impl: str = "none", fused_grouped_mlp: bool = False) -> np.ndarray:
    """``vec`` with a plan's mixture-of-experts knobs, its selective recomputation's modules and its CUDA graphs
    written in (in place): what :func:`plan_calibration_vector` gives a plan and a search gives every plan it
    prices (only ``full_iteration`` graphs change the price)."""
    vec[K.C_FULL_ITERATION_GRAPH] = 1.0 if cuda_graph_impl == "full_iteration" else 0.0
    vec[K.C_FUSED_GROUPED_MLP] = 1.0 if fused_grouped_mlp else 0.0
    vec[K.C_MOE_IMBALANCE] = moe_imbalance
    vec[K.C_EP_A2A_OVERLAP] = 1.0 if overlap_moe_expert_parallel_comm else 0.0
    vec[K.C_MOE_NODE_DEDUP] = 1.0 if moe_dispatcher in ("deepep", "hybridep") else 0.0  # both once per remote node
    vec[K.C_RECOMPUTE_MODULES] = float(recompute_module_mask)
    return vec


def with_precision(vec: np.ndarray, system: SystemSpec, calibration: Mapping[str, float] | None, stack: str,
                   precision: str, recipe: str) -> np.ndarray:
    """``vec`` (a :func:`calibration_vector`) with ``precision`` and its scaling ``recipe`` written in
    (:func:`precision_slots`, at the generation's fitted ``lowp_gemm_efficiency``); bf16 leaves it as it is.
    What :func:`predict` (:func:`plan_calibration_vector`) and a search or grid in that precision both run."""
    if precision != "bf16":
        rho = calibration_parameters(system.generation, calibration, stack)["lowp_gemm_efficiency"]
        precision_slots(vec, system, precision, recipe, rho)
    return vec


def precision_choices(system: SystemSpec, precision: str | Sequence[str] = "bf16", fp8_recipe: str = "",
                      field_name: str = "precision", recipe_field: str = "fp8_recipe") -> list[tuple[str, str]]:
    """The ``(precision, recipe)`` pairs a search prices: ``precision`` one format of ``PRECISIONS`` or several
    (a sequence, or comma-separated text such as ``"bf16,fp8"``), each with the recipe in force (``fp8_recipe``
    for the low precisions, blank: the format's first, :data:`~trainscale.model.specs.FP8_RECIPES`; bf16's ``none``).
    A format ``system`` has no tensor cores for is refused as :meth:`~trainscale.model.specs.PlanSpec.check_precision`
    refuses it in :func:`predict`, naming ``field_name``; a recipe of another format naming ``recipe_field``."""
    names = precision.split(",") if isinstance(precision, str) else list(precision)
    names = [str(n).strip() for n in names]
    if not names or "" in names:
        raise SpecError(field_name, precision, f"expected one of {', '.join(PRECISIONS)} (or several, "
                        "comma-separated)")
    chosen = []
    for name in names:
        if name not in PRECISIONS:
            raise SpecError(field_name, name, f"expected one of {', '.join(PRECISIONS)} (or several, comma-separated)")
        try:
            PlanSpec(precision=name).check_precision(system)
        except SpecError as err:
            raise SpecError(field_name, name, err.valid) from None
        if name not in chosen:
            chosen.append(name)
    if fp8_recipe:
        for name in [n for n in chosen if n != "bf16"] or chosen:
            valid = FP8_RECIPES[name]
            if fp8_recipe not in valid:
                raise SpecError(recipe_field, fp8_recipe, f"expected one of {', '.join(valid)} for precision "
                                f"{name} (or blank: {valid[0]})")
    return [(name, fp8_recipe if fp8_recipe and name != "bf16" else FP8_RECIPES[name][0]) for name in chosen]


def plan_fields(plan: PlanSpec) -> tuple:
    return (plan.tp, plan.pp, plan.dp, plan.cp, plan.interleave, plan.micro_batch, plan.global_batch,
            RECOMPUTE_MODES.index(plan.recompute), plan.sequence_parallel, plan.zero, plan.shard_group,
            plan.overlap_grad_reduce, plan.flash_attention, plan.zero3_per_tensor, plan.ep, plan.tp_comm_overlap)


def plan_split(plan: PlanSpec) -> tuple[int, int, int]:
    """The pipeline split as the kernels take it: ``(first, last, ends)``
    (:func:`~trainscale.kernels.pipesplit.split_chunk_layers`; all 0: the stack's default)."""
    return plan.first_stage_layers, plan.last_stage_layers, plan.split_ends


def chunk_layer_counts(model: ModelSpec, plan: PlanSpec) -> np.ndarray:
    """Transformer layers of every model chunk the plan prices, ``[interleave, pp]`` (chunk c of
    device d is virtual stage c*pp + d): the plan's split, or its stack's default."""
    return split_chunk_layers(model.layers, plan.pp, plan.interleave, *plan_split(plan))



def dense_layer_model(model: ModelSpec) -> ModelSpec:
    """One of a MoE model's leading dense layers as a dense model of the same shape (its FFN
    ``dense_ffn_hidden`` wide), for pricing that layer."""
    import dataclasses
    return dataclasses.replace(model, experts=1, top_k=1, capacity_factor=1.0, shared_experts=0,
                               shared_expert_ffn_hidden=0, dense_layers=0,
                               ffn_hidden=model.dense_ffn_hidden or model.ffn_hidden)


def mixed_layer_vectors(model: ModelSpec, system: SystemSpec, plan: PlanSpec, calib: np.ndarray):
    r"""(model vector, layer costs) of ``plan``: for a MoE model with ``d`` leading dense layers of ``L``,
    the layer every stage is priced with is the layer-weighted mean of the two kinds,

    .. math:: c = \frac{(L - d)\, c_\mathrm{MoE} + d\, c_\mathrm{dense}}{L}

    for every per-layer time, FLOP count and byte count (and the per-layer parameters in the model
    vector), so the whole model's work is exact and each stage holds its share of the dense layers
    (where the stack puts them, on the first stage, is not modelled). Otherwise the layer as it is."""
    mvec, svec = model_vector(model), system_vector(system)
    (tp, pp, dp, cp, v, mb, gb, rc, sp, zero, shard, overlap, flash, per_tensor, ep, tpo) = plan_fields(plan)
    lc = np.empty(K.L_SIZE)
    layer_costs(mvec, svec, calib, tp, cp, mb, rc, sp, flash, lc, ep, tpo, plan.etp)
    if model.is_moe and model.dense_layers:
        dense = dense_layer_model(model)
        dvec = model_vector(dense)
        lc_dense = np.empty(K.L_SIZE)
        layer_costs(dvec, svec, calib, tp, cp, mb, rc, sp, flash, lc_dense, 1, tpo, 0)
        share = model.dense_layers / model.layers
        lc = (1.0 - share) * lc + share * lc_dense
        mvec[K.M_PARAMS_LAYER] = (1.0 - share) * mvec[K.M_PARAMS_LAYER] + share * dvec[K.M_PARAMS_LAYER]
        mvec[K.M_PARAMS_EXPERTS] = (1.0 - share) * mvec[K.M_PARAMS_EXPERTS]
    return mvec, svec, lc


def plan_vector(model: ModelSpec, system: SystemSpec, plan: PlanSpec, calib: np.ndarray) -> np.ndarray:
    """The kernel's result vector (layout ``O_*``) of one plan, pipeline in closed form."""
    (tp, pp, dp, cp, v, mb, gb, rc, sp, zero, shard, overlap, flash, per_tensor, ep, tpo) = plan_fields(plan)
    mvec, svec, lc = mixed_layer_vectors(model, system, plan, calib)
    out = np.empty(K.O_SIZE)
    plan_costs(mvec, svec, calib, lc, plan.gpus, tp, pp, dp, cp, v, mb, gb, rc, zero, shard, overlap,
               per_tensor, out, ep, *plan_split(plan), plan.etp)
    return out


