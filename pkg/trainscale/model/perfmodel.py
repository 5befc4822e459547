"""Python API of the performance model: specs in, predictions and xarray Datasets out.

``predict`` prices one run; ``evaluate_grid`` prices a Cartesian grid of plans in one Numba
``prange`` call and returns a Dataset with one dimension per plan axis; ``search`` picks the best
feasible plans from such a grid. All of them call the same scalar kernels
(:mod:`trainscale.kernels.plan`), so one formula lives in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np
import xarray as xr

from . import catalog
from ..common.checks import check_float
from ..kernels import layout as K
from ..kernels.grid import evaluate_grid_ep as _grid_kernel
from ..kernels.collectives import allgather_time as _allgather_time
from ..kernels.collectives import allreduce_time as _allreduce_time
from ..kernels.collectives import alltoall_time as _alltoall_time
from ..kernels.collectives import out_link as _out_link
from ..kernels.layer import layer_costs, layer_fwd_bwd
from ..kernels.pipesplit import split_chunk_layers
from ..kernels.plan import plan_costs, step_straggler_time
from ..kernels.power import power_draw
from .specs import DEFAULT_STACK, FP8_RECIPES, PRECISIONS, RECOMPUTE_MODES, ROTARY_KERNELS, ModelSpec, PlanSpec, RunSpec, SpecError, SystemSpec, resolve_model, \
    resolve_system

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
    vec[K.C_MOE_IMBALANCE] = 1.0  # balanced experts; a plan's moe_imbalance: plan_calibration_vector
    vec[K.C_MOE_OP_HOST_S] = common["moe_op_host_s"]["value"]  # used by MoE layers only
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


def plan_calibration_vector(system: SystemSpec, plan: PlanSpec,
                            calibration: Mapping[str, float] | None = None) -> np.ndarray:
    """The calibration vector a plan runs with: its system's generation, its stack and the plan's
    own knobs (``compiled``, ``grad_reduce_fp32``, ``recompute_share``, ``rotary_kernel``,
    ``tp_async_backward``, ``precision`` and ``fp8_recipe``, ``custom_pipeline_layout``, ``moe_imbalance``)."""
    vec = calibration_vector(system.generation, calibration, plan.stack, plan.compiled, plan.grad_reduce_fp32,
                             plan.recompute_share, plan.rotary_kernel, plan.tp_async_backward)
    if plan.custom_pipeline_layout:  # the run's own layout: chunks need not hold equal layers
        vec[K.C_EVEN_SPLIT] = 0.0
    vec[K.C_MOE_IMBALANCE] = plan.moe_imbalance
    return with_precision(vec, system, calibration, plan.stack, plan.precision, plan.recipe)


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


# --------------------------------------------------------------------------- one run
@dataclass
class Prediction:
    """Predicted step of one run. Rates are per GPU unless named otherwise; ``energy_J_per_token``
    counts the accelerators, ``node_energy_J_per_token`` adds each node's overhead power.

    ``breakdown`` holds the exposed time of each component on the critical pipeline stage (they add
    up to the step); ``comm_total_s`` the tensor-, context- and data-parallel communication before
    overlap (what the breakdown's ``tp_comm``, ``cp_comm`` and ``dp_comm`` would be with nothing
    hidden); ``memory_breakdown_gib`` the most loaded GPU's memory by component (it adds up to
    ``memory_gib_per_gpu``)."""

    id: str
    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    memory_gib_per_gpu: float
    fits: bool
    reason: str | None
    power_W_per_gpu: float
    energy_J_per_token: float
    node_energy_J_per_token: float
    breakdown: dict = field(default_factory=dict)
    memory_breakdown_gib: dict = field(default_factory=dict)
    comm_total_s: dict = field(default_factory=dict)
    unrunnable: list = field(default_factory=list)
    """The stack rules the plan breaks (:mod:`trainscale.model.stackrules`): empty unless priced with
    ``allow_unrunnable``."""
    stage_layers: list = field(default_factory=list)
    """Transformer layers priced on each pipeline device, one list of its chunks' layers per device
    (``[[6], [8], [8], [8]]``; interleaved ``[[3, 4], [4, 4], ...]``); ``as_dict`` shows it where the
    chunks are not all equal."""

    def as_dict(self) -> dict:
        out = {
            "id": self.id,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "memory_gib_per_gpu": self.memory_gib_per_gpu,
            "fits": self.fits,
        }
        if not self.fits:
            out["reason"] = self.reason
        out["power_W_per_gpu"] = self.power_W_per_gpu
        out["energy_J_per_token"] = self.energy_J_per_token
        out["node_energy_J_per_token"] = self.node_energy_J_per_token
        out["breakdown"] = dict(self.breakdown)
        out["memory_breakdown_gib"] = dict(self.memory_breakdown_gib)
        out["comm_total_s"] = dict(self.comm_total_s)
        if self.unrunnable:
            out["unrunnable"] = list(self.unrunnable)
        if len({n for device in self.stage_layers for n in device}) > 1:
            out["stage_layers"] = [list(device) for device in self.stage_layers]
        return out


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


def simulate_pipeline(out: np.ndarray, model: ModelSpec, plan: PlanSpec, calib: np.ndarray,
                      system: SystemSpec) -> None:
    """Re-time the pipeline of a priced plan (``pp > 1``) with the discrete-event simulator, in place.

    The closed form of :func:`~trainscale.kernels.plan.plan_costs` charges every stage its
    transfers and uses the bottleneck form, exact only for equal stages and free links. Here each
    chunk's forward and backward (its layers, the output layer on the last one, ZeRO-3 gathers of
    the end layers) run in the schedule's own order (1F1B, or interleaved 1F1B), each activation
    transfer delaying its consumer. In the breakdown, ``pp_comm`` becomes what the transfers add
    to the makespan and ``pipeline_bubble`` the busiest device's idle time without them; the
    busiest device's work is split into compute, recomputation and communication in the closed
    form's proportions.
    """
    from . import pipeline

    pp, v, micro = plan.pp, plan.interleave, plan.micro_batches
    layers = chunk_layer_counts(model, plan).ravel().astype(float)  # virtual stage c*pp + d
    fwd = layers * out[K.O_LAYER_FWD]
    bwd = layers * out[K.O_LAYER_BWD]
    fwd[0] += out[K.O_ENDS]
    fwd[-1] += out[K.O_HEAD_FWD] + out[K.O_ENDS]
    bwd[-1] += out[K.O_HEAD_BWD]
    schedule = "1f1b" if v == 1 else "interleaved"
    send = np.full(pp * v - 1, out[K.O_P2P])
    linked = pipeline.simulate_many(schedule, fwd[None], bwd[None], send=send[None], micro_batches=micro,
                                    interleave=v)
    free = pipeline.simulate_many(schedule, fwd[None], bwd[None], micro_batches=micro, interleave=v)
    makespan, makespan_free = float(linked.makespan_s[0]), float(free.makespan_s[0])
    busiest = float(free.busy_s[0].max())

    closed_busy = out[K.O_COMPUTE] + out[K.O_RECOMPUTE] + out[K.O_TP_COMM] + out[K.O_CP_COMM] + (
        out[K.O_DP_COMM] - out[K.O_DP_EXPOSED]) + out[K.O_EP_COMM] + out[K.O_MOE_PERMUTE] + out[K.O_MOE_HOST]
    scale = busiest / closed_busy
    for slot in (K.O_COMPUTE, K.O_RECOMPUTE, K.O_TP_COMM, K.O_CP_COMM, K.O_EP_COMM, K.O_MOE_PERMUTE, K.O_MOE_HOST,
                 K.O_TP_COMM_TOTAL, K.O_CP_COMM_TOTAL):
        out[slot] *= scale
    dp_exposed = (out[K.O_DP_COMM] - out[K.O_DP_EXPOSED]) * scale + out[K.O_DP_EXPOSED]
    out[K.O_DP_COMM_TOTAL] += dp_exposed - out[K.O_DP_COMM]  # what overlap hides is unchanged
    out[K.O_DP_COMM] = dp_exposed
    out[K.O_PP_COMM] = makespan - makespan_free
    out[K.O_BUBBLE] = makespan_free - busiest
    step = makespan + out[K.O_DP_EXPOSED] + out[K.O_OPTIMIZER]
    out[K.O_STRAGGLER] = step_straggler_time(step, plan.gpus, calib)
    step += out[K.O_STRAGGLER]
    out[K.O_GEMM_BUSY] *= scale
    out[K.O_STEP] = step
    out[K.O_POWER_W] = power_draw(system.idle_W, system.tdp_W, calib[K.C_POWER_COMPUTE], calib[K.C_POWER_MEMORY],
                                  out[K.O_GEMM_BUSY], out[K.O_HBM_BUSY], step)
    out[K.O_ENERGY_J] = out[K.O_POWER_W] * step


def _prediction(run_id: str, out: np.ndarray, model: ModelSpec, system: SystemSpec, gpus: int,
                global_batch: int, chunks: np.ndarray | None = None) -> Prediction:
    step = float(out[K.O_STEP])
    tokens = global_batch * model.seq_len
    reason_code = int(out[K.O_REASON])
    names = K.BREAKDOWN_MOE if model.is_moe else K.BREAKDOWN  # the MoE terms only where there are experts
    breakdown = {name: float(out[slot]) for name, slot in zip(names, K.BREAKDOWN_SLOTS)}
    peak = system.peak_flops_bf16
    return Prediction(
        id=run_id,
        step_time_s=step,
        tokens_per_s=tokens / step,
        model_tflops_per_gpu=float(out[K.O_MODEL_FLOPS]) / step / 1e12,
        hardware_tflops_per_gpu=float(out[K.O_HW_FLOPS]) / step / 1e12,
        mfu=float(out[K.O_MODEL_FLOPS]) / step / peak,
        hfu=float(out[K.O_HW_FLOPS]) / step / peak,
        memory_gib_per_gpu=float(out[K.O_MEM_BYTES]) / GiB,
        fits=reason_code == K.R_OK,
        reason=None if reason_code == K.R_OK else K.REASONS[reason_code],
        power_W_per_gpu=float(out[K.O_POWER_W]),
        energy_J_per_token=float(out[K.O_ENERGY_J]) * gpus / tokens,
        # the node's own draw (CPUs, NICs, switches, fans) shared by its GPUs, at the catalog's value
        node_energy_J_per_token=(float(out[K.O_ENERGY_J]) + system.node_overhead_W / system.gpus_per_node * step)
        * gpus / tokens,
        breakdown=breakdown,
        memory_breakdown_gib={name: float(out[slot]) / GiB for name, slot in zip(K.MEMORY_COMPONENTS,
                                                                                 K.MEMORY_SLOTS)},
        comm_total_s={"tp_comm": float(out[K.O_TP_COMM_TOTAL]), "cp_comm": float(out[K.O_CP_COMM_TOTAL]),
                      "dp_comm": float(out[K.O_DP_COMM_TOTAL])},
        stage_layers=[] if chunks is None else [[int(n) for n in chunks[:, d]] for d in range(chunks.shape[1])],
    )


def predict(run: RunSpec | Mapping, calibration: Mapping[str, float] | None = None,
            pipeline_simulation: bool = True, allow_unrunnable: bool = False, warn: bool = True) -> Prediction:
    """Predict one run (a :class:`RunSpec` or the mapping the CLI reads).

    With pipeline parallelism the pipeline is simulated (:func:`simulate_pipeline`);
    ``pipeline_simulation=False`` keeps the grid kernel's closed form. A plan its stack does not run
    (:mod:`trainscale.model.stackrules`) is refused with a :class:`SpecError` naming the rule, unless
    ``allow_unrunnable``: then it is priced, its ``unrunnable`` lists the rules it breaks, and (``warn``)
    an :class:`UnrunnablePlanWarning` says so."""
    if not isinstance(run, RunSpec):
        run = RunSpec.from_dict(run)
    broken = _broken_stack_rules(run, allow_unrunnable, warn)
    calib = plan_calibration_vector(run.system, run.plan, calibration)
    out = plan_vector(run.model, run.system, run.plan, calib)
    if pipeline_simulation and run.plan.pp > 1 and np.isfinite(out[K.O_STEP]):
        simulate_pipeline(out, run.model, run.plan, calib, run.system)
    structural = int(out[K.O_REASON]) in (K.R_OK, K.R_MEMORY)
    if structural and not (np.isfinite(out[K.O_STEP]) and out[K.O_STEP] > 0 and np.isfinite(out[K.O_MEM_BYTES])):
        raise SpecError("run", run.id, "the prediction is not a finite positive step time; a model, system or "
                        "plan value is out of scale")
    prediction = _prediction(run.id, out, run.model, run.system, run.gpus, run.plan.global_batch,
                             chunk_layer_counts(run.model, run.plan))
    prediction.unrunnable = [rule.id for rule in broken]
    return prediction


class UnrunnablePlanWarning(UserWarning):
    """A plan its stack does not run was priced (``allow_unrunnable``)."""


def _broken_stack_rules(run: RunSpec, allow_unrunnable: bool, warn: bool) -> list:
    """The stack rules ``run``'s plan breaks: refused (the first, as a :class:`SpecError`) unless allowed."""
    from .stackrules import broken_rules, refusal

    broken = broken_rules(run.plan, run.system)
    if broken and not allow_unrunnable:
        raise SpecError(*refusal(broken[0], run.plan, run.system), where=f"run {run.id!r}")
    if broken and warn:
        import warnings

        field_name, value, valid = refusal(broken[0], run.plan, run.system)
        warnings.warn(f"run {run.id!r}: priced a plan the {run.plan.stack} stack does not run "
                      f"({field_name} = {value}; rules broken: {', '.join(r.id for r in broken)})",
                      UnrunnablePlanWarning, stacklevel=3)
    return broken


# --------------------------------------------------------------------------- model API for studies
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "alltoall")


def collective_time_s(system, kind: str, nbytes: float, ranks: int, stride: int = 1,
                      calibration: Mapping[str, float] | None = None, stack: str = DEFAULT_STACK) -> float:
    """Seconds for one NCCL-style collective (``COLLECTIVES``) of ``nbytes`` over ``ranks`` GPUs
    ``stride`` ranks apart on ``system``: the same formulas the plans are priced with
    (:mod:`trainscale.kernels.collectives`), including the scale-out topology (a fat-tree's spine)
    and the generation's fitted network efficiency. ``nbytes`` is the gathered buffer for an
    all-gather or reduce-scatter, each GPU's buffer for an all-to-all."""
    system = resolve_system(system)
    if kind not in COLLECTIVES:
        raise SpecError("kind", kind, f"expected one of {', '.join(COLLECTIVES)}")
    if not (np.isfinite(nbytes) and nbytes >= 0):
        raise SpecError("nbytes", nbytes, "expected a finite number of bytes >= 0")
    if int(ranks) < 1 or int(stride) < 1:
        raise SpecError("ranks" if int(ranks) < 1 else "stride", ranks if int(ranks) < 1 else stride,
                        "expected an integer >= 1")
    svec = system_vector(system)
    eff = calibration_vector(system.generation, calibration, stack)[K.C_NET_EFF]
    bw_out, lat_out = _out_link(svec, int(ranks), int(stride))
    args = (float(nbytes), int(ranks), int(stride), system.scale_up_domain, svec[K.S_SCALE_UP_BW],
            svec[K.S_SCALE_UP_LAT], bw_out, lat_out, eff)
    if kind == "allreduce":
        return float(_allreduce_time(*args))
    if kind == "alltoall":
        return float(_alltoall_time(*args))
    return float(_allgather_time(*args))


def _layer_costs(model: ModelSpec, system: SystemSpec, plan: PlanSpec, calib: np.ndarray) -> np.ndarray:
    """One transformer layer's costs (layout ``L_*``) for one micro-batch of ``plan`` on one GPU."""
    (tp, pp, dp, cp, v, mb, gb, rc, sp, zero, shard, overlap, flash, per_tensor, ep, tpo) = plan_fields(plan)
    return mixed_layer_vectors(model, system, plan, calib)[2]


def layer_times(model, system, plan: PlanSpec, calibration: Mapping[str, float] | None = None) -> dict:
    """Seconds of one transformer layer's forward and backward pass (the backward with its
    recomputation) for one micro-batch of ``plan`` on one GPU, and their parts: ``gemm``,
    ``elementwise`` (memory-bound kernels and host idle), ``tp_comm`` (exposed), ``recompute``
    (compute and its exposed TP communication); for a mixture of experts also ``ep_comm`` (dispatch and
    combine), ``moe_permute`` (router scores and token permutation) and ``moe_host`` (the host issue the GPU
    waits for after the tokens-per-expert sync). The same layer :func:`predict` prices; what
    Korthikanti et al. 2022 measured per layer (their Table 4)."""
    model, system = resolve_model(model), resolve_system(system)
    plan.check_against(model)
    lc = _layer_costs(model, system, plan, plan_calibration_vector(system, plan, calibration))
    fwd, bwd = layer_fwd_bwd(lc)
    times = {"fwd_s": fwd, "bwd_s": bwd,
             "fwd_gemm_s": lc[K.L_FWD_GEMM], "fwd_elementwise_s": lc[K.L_FWD_ELEM], "fwd_tp_comm_s": lc[K.L_FWD_TP],
             "bwd_gemm_s": lc[K.L_BWD_GEMM], "bwd_elementwise_s": lc[K.L_BWD_ELEM], "bwd_tp_comm_s": lc[K.L_BWD_TP],
             "recompute_s": lc[K.L_RECOMP], "recompute_tp_comm_s": lc[K.L_RECOMP_TP]}
    if model.is_moe:  # dispatch and combine, router and permutation (a leading dense layer's mixed in)
        times.update({"fwd_ep_comm_s": lc[K.L_FWD_EP], "bwd_ep_comm_s": lc[K.L_BWD_EP],
                      "fwd_moe_permute_s": lc[K.L_FWD_MOE], "bwd_moe_permute_s": lc[K.L_BWD_MOE],
                      "fwd_moe_host_s": lc[K.L_FWD_MOE_HOST], "bwd_moe_host_s": lc[K.L_BWD_MOE_HOST]})
    return times


def pipeline_stage_times(model, system, plan: PlanSpec, calibration: Mapping[str, float] | None = None) -> dict:
    """Per-virtual-stage forward, backward (input gradient) and weight-gradient seconds, the
    activation bytes of one micro-batch and the send time between stages, for a pipeline simulation
    of ``plan`` (the same stage description :func:`predict` simulates).

    The weight-gradient share of a layer's backward is its weight GEMMs' half of the backward GEMM
    time (the attention core has no weights), which is what ZB-H1 may defer; the other schedules
    run backward as one pass (``bwd + wgrad``)."""
    model, system = resolve_model(model), resolve_system(system)
    plan.check_against(model)
    calib = plan_calibration_vector(system, plan, calibration)
    out = plan_vector(model, system, plan, calib)
    lc = _layer_costs(model, system, plan, calib)
    mb, pp, v = plan.micro_batch, plan.pp, plan.interleave
    tokens, h, s = mb * model.seq_len, model.hidden, model.seq_len
    kv = model.kv_heads * model.head_dim
    weight_flops = (2 * tokens * h * (h + 2 * kv) + 2 * tokens * h * h
                    + 2 * model.ffn_matrices * tokens * h * model.ffn_hidden)
    attention_flops = 4 * mb * s * s * h
    wgrad_layer = 0.5 * lc[K.L_BWD_GEMM] * weight_flops / (weight_flops + attention_flops)
    layers = chunk_layer_counts(model, plan).ravel().astype(float)
    fwd = layers * out[K.O_LAYER_FWD]
    bwd = layers * (out[K.O_LAYER_BWD] - wgrad_layer)
    wgrad = layers * wgrad_layer
    fwd[-1] += out[K.O_HEAD_FWD]
    bwd[-1] += out[K.O_HEAD_BWD]
    act = layers * lc[K.L_ACT_BYTES]
    act[-1] += lc[K.L_HEAD_BYTES]
    return {"fwd": fwd, "bwd": bwd, "wgrad": wgrad, "send": np.full(pp * v - 1, out[K.O_P2P]), "act_bytes": act}


# --------------------------------------------------------------------------- grids
GRID_AXES = ("tp", "pp", "cp", "interleave", "micro_batch", "recompute", "sequence_parallel", "zero",
             "shard_group", "overlap_grad_reduce", "flash_attention", "zero3_per_tensor", "tp_comm_overlap")
BOOLEAN_AXES = ("sequence_parallel", "overlap_grad_reduce", "flash_attention", "zero3_per_tensor", "tp_comm_overlap")
# the expert axes: a grid has them (last, in this order) only when the caller asks for them. ``etp`` is the
# experts' tensor-parallel degree (Megatron-Core's --expert-tensor-parallel-size), 0 meaning "as tp"
EP_AXIS = "ep"
ETP_AXIS = "etp"
EXPERT_AXES = (EP_AXIS, ETP_AXIS)


def grid_axes(grid: xr.Dataset) -> tuple[str, ...]:
    """The plan axes of an evaluated grid, in order (``GRID_AXES``, then ``ep`` and ``etp`` if swept)."""
    return tuple(grid["step_time_s"].dims)


def expert_axes(values: Mapping) -> tuple[str, ...]:
    """The expert axes a space or grid has (:data:`EXPERT_AXES` in order)."""
    return tuple(name for name in EXPERT_AXES if name in values)


def expert_pairs(arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The kernels' expert layout: ``(ep_v, etp_v)`` of equal length, the product of the ``ep`` and ``etp``
    axes in C order (etp fastest), so a grid's flat index over ``(..., ep, etp)`` is the kernels' over
    ``(..., pair)``; an axis the space lacks is ``[1]`` (ep) or ``[0]`` (etp: as tp)."""
    ep = np.asarray(arrays.get(EP_AXIS, np.ones(1, dtype=np.int64)), dtype=np.int64)
    etp = np.asarray(arrays.get(ETP_AXIS, np.zeros(1, dtype=np.int64)), dtype=np.int64)
    return (np.ascontiguousarray(np.repeat(ep, etp.shape[0])),
            np.ascontiguousarray(np.tile(etp, ep.shape[0])))


def _axis(values, name: str) -> np.ndarray:
    if name == "recompute":
        codes = []
        for v in values:
            if v not in RECOMPUTE_MODES:
                raise SpecError(name, v, f"expected one of {', '.join(RECOMPUTE_MODES)}")
            codes.append(RECOMPUTE_MODES.index(v))
        return np.asarray(codes, dtype=np.int64)
    arr = np.asarray([int(v) for v in values], dtype=np.int64)
    if arr.size == 0:
        raise SpecError(name, list(values), "expected at least one value")
    minimum = 0 if name in BOOLEAN_AXES + ("zero", "shard_group", ETP_AXIS) else 1
    if (arr < minimum).any():
        raise SpecError(name, list(values), f"expected integers >= {minimum}")
    return arr


def _check_split_ends(split_ends) -> None:
    if split_ends not in (0, 1, 2, 3):
        raise SpecError("split_ends", split_ends, "expected 0 (none), 1 (embedding), 2 (loss) or 3 (both)")


def evaluate_grid(model, system, gpus: int, global_batch: int, calibration: Mapping | None = None,
                  stack: str = DEFAULT_STACK, compiled: bool = False, grad_reduce_fp32: bool = False,
                  recompute_share: float | None = None, rotary_kernel: str = "",
                  tp_async_backward: bool | None = None, split_ends: int = 0, precision: str = "bf16",
                  fp8_recipe: str = "", **axes: Iterable) -> xr.Dataset:
    """Evaluate every combination of the plan axes (``GRID_AXES``; each a list of values, default
    ``[1]`` / ``[0]`` / ``["full"]``) for one model, system, GPU count and global batch.

    Returns a Dataset with one dimension per axis; ``dp`` follows from the GPU count. Invalid or
    non-fitting plans stay in the grid with ``fits`` false and ``reason`` saying why; structurally
    invalid ones have NaN times. ``stack``, ``compiled``, ``grad_reduce_fp32``, ``recompute_share``,
    ``rotary_kernel``, ``tp_async_backward``, ``precision`` and ``fp8_recipe`` (one per grid; the share acts on
    the selective plans) are those fields of every plan
    (:class:`~trainscale.model.specs.PlanSpec`). ``split_ends`` counts the embedding (1), the loss (2) or
    both (3) as layers of every pipelined plan's split (``embedding_in_split`` / ``loss_in_split``,
    Megatron-Core's ``--account-for-*-in-pipeline-split``); a plan whose layers do not split so is
    masked (``R_UNEVEN_CHUNKS``).
    """
    _check_split_ends(split_ends)
    model = resolve_model(model)
    system = resolve_system(system)
    unknown = set(axes) - set(GRID_AXES) - set(EXPERT_AXES)
    if unknown:
        name = sorted(unknown)[0]
        raise SpecError(name, axes[name], f"unknown grid axis; valid axes: {', '.join(GRID_AXES + EXPERT_AXES)}")
    defaults = {"recompute": ["full"], "zero": [0], "shard_group": [0], **{name: [0] for name in BOOLEAN_AXES}}
    names = GRID_AXES + expert_axes(axes)
    values = {name: list(axes.get(name, defaults.get(name, [1]))) for name in names}
    arrays = [_axis(values[name], name) for name in GRID_AXES]
    ep, etp = expert_pairs({name: _axis(values[name], name) for name in expert_axes(axes)})
    if recompute_share is not None:
        recompute_share = check_float("recompute_share", recompute_share, 0.0, 1.0)
    ((precision, recipe),) = _one_precision(system, precision, fp8_recipe)
    calib = with_precision(calibration_vector(system.generation, calibration, stack, compiled, grad_reduce_fp32,
                                              recompute_share, rotary_kernel, tp_async_backward),
                           system, calibration, stack, precision, recipe)
    results, dps = _grid_kernel(model_vector(model), system_vector(system), calib, int(gpus), int(global_batch),
                                *arrays, ep, etp, int(split_ends))
    ds = grid_dataset(results, dps, values, model, system, gpus, global_batch, calibration)
    ds.attrs["stack"] = stack
    ds.attrs["compiled"] = int(compiled)
    ds.attrs["grad_reduce_fp32"] = int(grad_reduce_fp32)
    ds.attrs["recompute_share"] = "stack default" if recompute_share is None else float(recompute_share)
    if split_ends:
        ds.attrs["split_ends"] = int(split_ends)
    if precision != "bf16":
        ds.attrs.update(precision=precision, fp8_recipe=recipe)
    return ds


def _one_precision(system: SystemSpec, precision, fp8_recipe: str) -> list[tuple[str, str]]:
    choices = precision_choices(system, precision, fp8_recipe)
    if len(choices) > 1:
        raise SpecError("precision", precision, "expected one precision per grid (a search takes several)")
    return choices


def grid_dataset(results: np.ndarray, dps: np.ndarray, values: Mapping[str, list], model: ModelSpec,
                 system: SystemSpec, gpus: int, global_batch: int,
                 calibration: Mapping | None = None) -> xr.Dataset:
    dims = GRID_AXES + expert_axes(values)
    shape = tuple(len(values[name]) for name in dims)
    res = results.reshape(shape + (K.O_SIZE,))
    step = res[..., K.O_STEP]
    tokens = global_batch * model.seq_len
    peak = system.peak_flops_bf16
    reason = np.nan_to_num(res[..., K.O_REASON], nan=K.R_GPUS).astype(np.int8)
    coords = {name: values[name] for name in dims}

    def var(data, units, long_name):
        return xr.Variable(dims, data, {"units": units, "long_name": long_name})

    data = {
        "step_time_s": var(step, "s", "step time"),
        "tokens_per_s": var(tokens / step, "tokens/s", "cluster throughput"),
        "mfu": var(res[..., K.O_MODEL_FLOPS] / step / peak, "1", "model FLOPs utilisation"),
        "hfu": var(res[..., K.O_HW_FLOPS] / step / peak, "1", "hardware FLOPs utilisation"),
        "memory_gib_per_gpu": var(res[..., K.O_MEM_BYTES] / GiB, "GiB", "memory of the most loaded GPU"),
        "power_W_per_gpu": var(res[..., K.O_POWER_W], "W", "accelerator power"),
        "energy_J_per_token": var(res[..., K.O_ENERGY_J] * gpus / tokens, "J/token",
                                  "accelerator energy per token"),
        "dp": var(dps.reshape(shape).astype(np.int64), "1", "data-parallel degree"),
        "fits": var(reason == K.R_OK, "1", "valid and fits in memory"),
        "reason": var(reason, "1", "why masked: index into the attribute reasons"),
    }
    for name, slot in zip(K.BREAKDOWN_MOE, K.BREAKDOWN_SLOTS):
        if name in K.MOE_BREAKDOWN and not model.is_moe:
            continue
        data[f"time_{name}_s"] = var(res[..., slot], "s", f"step time: {name.replace('_', ' ')}")
    ds = xr.Dataset(data, coords=coords)
    ds["reason"].attrs["reasons"] = list(K.REASONS)
    ds.attrs.update({"model": model.name, "system": system.name, "gpus": int(gpus),
                     "global_batch": int(global_batch), "seq_len": model.seq_len})
    return ds


# --------------------------------------------------------------------------- search
def divisors(n: int) -> list[int]:
    """Every positive divisor of ``n``, ascending."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


# the experts' tensor-parallel degrees a default space offers: as the attention's (0: Megatron-Core's default,
# megatron/core/parallel_state.py initialize_model_parallel(expert_tensor_parallel_size=None), which takes the
# tensor-parallel size) or none (1: each expert whole on its GPU, expert_tensor_parallel_size=1, as MoE training
# configs commonly set it: Megatron-Bridge's workload base configs, veRL's Megatron examples; read in the code
# corpus, 2026-12-06). Any etp with ep x etp dividing tp x dp is priced (--fix etp=N, a space's etp axis)
EXPERT_TP_CHOICES = (0, 1)

# interleave depths kept besides the divisors of the layers: uneven splits, which stacks that balance uneven
# chunks (NeMo, DeepSpeed) can run; Megatron-LM's even split refuses them (R_UNEVEN_CHUNKS), never priced
UNEVEN_INTERLEAVE = (3, 6)


def default_space(model: ModelSpec, system: SystemSpec, gpus: int, global_batch: int) -> dict:
    """A broad plan space: every power-of-two (and node-size) degree, every micro-batch and interleave depth
    that can be valid, all options.

    ``micro_batch``: every divisor of the global batch that divides some local batch (``global_batch / dp``
    for a ``dp`` the tp, pp and cp degrees leave); ``interleave``: every divisor of the layers that leaves a
    pipeline of at least two stages (and ``UNEVEN_INTERLEAVE``). ``shard_group`` adds hybrid sharding (HSDP)
    for ZeRO >= 1: besides sharding over all of dp (0), shard groups of one node (8 GPUs) up to 512 ranks in
    powers of two (below the GPU count). A mixture-of-experts model adds the ``ep`` axis, every power of two
    dividing its experts, and the ``etp`` axis, the experts' tensor-parallel degree: as ``tp`` (0) or 1
    (:data:`EXPERT_TP_CHOICES`). Most of its layouts are invalid; :func:`search` prices only the valid ones.
    """
    pow2 = [2**i for i in range(0, 14) if 2**i <= gpus]
    pp = sorted({p for p in pow2 + [3, 5, 6, 12, 24] if p <= model.layers and gpus % p == 0})
    tp = [t for t in pow2 if t <= min(model.heads, 64)]
    cp = [c for c in pow2 if c <= 16]
    shard = [0] + [g for g in pow2 if 8 <= g <= min(512, gpus // 2)]
    moe = ({EP_AXIS: [e for e in pow2 if model.experts % e == 0], ETP_AXIS: list(EXPERT_TP_CHOICES)}
           if model.is_moe else {})
    return {**moe,
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "interleave": [v for v in sorted(set(divisors(model.layers)) | {1, *UNEVEN_INTERLEAVE})
                       if v == 1 or 2 * v <= model.layers],
        "micro_batch": local_batch_divisors(gpus, global_batch, tp, pp, cp),
        "recompute": list(RECOMPUTE_MODES),
        "sequence_parallel": [0, 1],
        "zero": [0, 1, 2, 3],
        "shard_group": shard,
        "overlap_grad_reduce": [0, 1],
        "flash_attention": [0, 1],
        "tp_comm_overlap": [0, 1],
    }


def local_batch_divisors(gpus: int, global_batch: int, tp: Sequence[int], pp: Sequence[int],
                         cp: Sequence[int]) -> list[int]:
    """Every micro-batch that divides the local batch ``global_batch / dp`` of some split of ``gpus`` into
    the given tp, pp and cp degrees (``dp = gpus / (tp pp cp)``), ascending."""
    ways = {t * p * c for t in tp for p in pp for c in cp if gpus % (t * p * c) == 0}
    local = {global_batch // (gpus // w) for w in ways if global_batch % (gpus // w) == 0}
    return sorted({d for b in local for d in divisors(b)}) or [1]


RERANK_CANDIDATES = 32


def search(model, system, gpus: int, global_batch: int, top: int = 5, space: Mapping | None = None,
           calibration: Mapping | None = None, rerank: int = RERANK_CANDIDATES,
           stack: str = DEFAULT_STACK, progress=None, compiled: bool = False, grad_reduce_fp32: bool = False,
           recompute_share: float | None = None, rotary_kernel: str = "",
           tp_async_backward: bool | None = None, split_ends: int = 0,
           allow_unrunnable: bool = False, precision: str | Sequence[str] = "bf16",
           fp8_recipe: str = "") -> tuple[xr.Dataset, list[dict]]:
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
                        allow_unrunnable, precision=p, fp8_recipe=r) for p, r in choices]
        rows = sorted((row for _, ranked in found for row in ranked), key=lambda row: row["step_time_s"])
        return merge_summaries([summary for summary, _ in found]), rows[:top]
    ((precision, recipe),) = choices
    space = dict(space or default_space(model, system, gpus, global_batch))
    if recompute_share is not None:
        recompute_share = check_float("recompute_share", recompute_share, 0.0, 1.0)
    calib = with_precision(calibration_vector(system.generation, calibration, stack, compiled, grad_reduce_fp32,
                                              recompute_share, rotary_kernel, tp_async_backward),
                           system, calibration, stack, precision, recipe)
    _check_split_ends(split_ends)
    prices = scan_space(model, system, calib, gpus, global_batch, space, split_ends=split_ends,
                        stack_rules=None if allow_unrunnable else stack, fixed={"compiled": bool(compiled)})
    fixed = {"stack": stack, "allow_unrunnable": bool(allow_unrunnable), "compiled": bool(compiled), "grad_reduce_fp32": bool(grad_reduce_fp32),
             "rotary_kernel": rotary_kernel, "tp_async_backward": tp_async_backward,
             "recompute_share": recompute_share, "split_ends": int(split_ends), "precision": precision,
             "fp8_recipe": recipe}
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
    if fixed["split_ends"] and plan["pp"] > 1:
        plan["embedding_in_split"] = bool(fixed["split_ends"] & 1)
        plan["loss_in_split"] = bool(fixed["split_ends"] & 2)
    p = predict(RunSpec(id="search", model=model, system=system, plan=plan_from_grid_entry(plan, global_batch)),
                calibration, allow_unrunnable=fixed["allow_unrunnable"], warn=False)
    entry["closed_form_step_time_s"] = entry["step_time_s"]
    entry.update(step_time_s=p.step_time_s, tokens_per_s=p.tokens_per_s, mfu=p.mfu,
                 memory_gib_per_gpu=p.memory_gib_per_gpu, power_W_per_gpu=p.power_W_per_gpu,
                 energy_J_per_token=p.energy_J_per_token)


def canonical_plan(plan: Mapping) -> tuple:
    """A key equal for plans that are the same plan: ``shard_group`` 0 and ``dp`` (or any shard
    group without ZeRO), TP overlap without sequence parallelism, sequence parallelism without tensor
    parallelism (tp 1: no TP group to split the sequence over), per-tensor fetches without ZeRO-3."""
    p = dict(plan)
    if p.get("zero", 0) == 0 or p.get("shard_group", 0) in (0, p.get("dp")):
        p["shard_group"] = 0
    if p.get("tp", 1) == 1:
        p["sequence_parallel"] = False
    if not p.get("sequence_parallel"):
        p["tp_comm_overlap"] = False
    if p.get("zero", 0) != 3:
        p["zero3_per_tensor"] = False
    if p.get(ETP_AXIS, 0) == p.get("tp", 1):
        p[ETP_AXIS] = 0
    return tuple(sorted(p.items()))


def rank(grid: xr.Dataset, top: int) -> list[dict]:
    """The ``top`` fastest distinct feasible plans of a grid (equivalent spellings of one plan,
    :func:`canonical_plan`, count once)."""
    step = grid["step_time_s"].values
    ok = grid["fits"].values & np.isfinite(step)
    flat = np.flatnonzero(ok.ravel())
    if flat.size == 0:
        return []
    order = flat[np.argsort(step.ravel()[flat], kind="stable")]
    ranked = []
    seen = set()
    axes = grid_axes(grid)
    for index in order:
        if len(ranked) >= top:
            break
        idx = np.unravel_index(index, step.shape)
        plan = {name: grid[name].values[i].item() for name, i in zip(axes, idx)}
        plan["dp"] = int(grid["dp"].values[idx])
        for key in BOOLEAN_AXES:
            plan[key] = bool(plan[key])
        key = canonical_plan(plan)
        if key in seen:
            continue
        seen.add(key)
        ranked.append({
            "plan": plan,
            "step_time_s": float(step[idx]),
            "tokens_per_s": float(grid["tokens_per_s"].values[idx]),
            "mfu": float(grid["mfu"].values[idx]),
            "memory_gib_per_gpu": float(grid["memory_gib_per_gpu"].values[idx]),
            "power_W_per_gpu": float(grid["power_W_per_gpu"].values[idx]),
            "energy_J_per_token": float(grid["energy_J_per_token"].values[idx]),
        })
    return ranked


def grid_size(space: Mapping[str, Sequence]) -> int:
    return int(np.prod([len(v) for v in space.values()]))


def plan_from_grid_entry(entry: Mapping, global_batch: int) -> PlanSpec:
    p = dict(entry)
    return PlanSpec(tp=p["tp"], pp=p["pp"], dp=p["dp"], cp=p["cp"], interleave=p["interleave"],
                    micro_batch=p["micro_batch"], global_batch=global_batch, recompute=p["recompute"],
                    sequence_parallel=bool(p["sequence_parallel"]), zero=p["zero"],
                    shard_group=p.get("shard_group", 0), overlap_grad_reduce=bool(p["overlap_grad_reduce"]),
                    flash_attention=bool(p["flash_attention"]),
                    zero3_per_tensor=bool(p.get("zero3_per_tensor", False)), ep=int(p.get("ep", 1)),
                    etp=int(p.get(ETP_AXIS, 0)),
                    tp_comm_overlap=bool(p.get("tp_comm_overlap", False)) and bool(p["sequence_parallel"]),
                    stack=p.get("stack", DEFAULT_STACK), compiled=bool(p.get("compiled", False)),
                    grad_reduce_fp32=bool(p.get("grad_reduce_fp32", False)),
                    recompute_share=p.get("recompute_share"), rotary_kernel=p.get("rotary_kernel", ""),
                    tp_async_backward=p.get("tp_async_backward"),
                    first_stage_layers=int(p.get("first_stage_layers", 0)),
                    last_stage_layers=int(p.get("last_stage_layers", 0)),
                    embedding_in_split=bool(p.get("embedding_in_split", False)),
                    loss_in_split=bool(p.get("loss_in_split", False)),
                    precision=p.get("precision", "bf16"), fp8_recipe=p.get("fp8_recipe", ""))


__all__ = ["Prediction", "predict", "UnrunnablePlanWarning", "FITTED", "GENERATION_FITTED", "STACK_FITTED", "evaluate_grid", "search", "rank", "default_space", "GRID_AXES",
           "model_vector", "system_vector", "calibration_vector", "plan_calibration_vector", "calibration_parameters", "grid_size", "plan_vector",
           "plan_from_grid_entry", "EP_AXIS", "ETP_AXIS", "EXPERT_AXES", "expert_axes", "expert_pairs", "EXPERT_TP_CHOICES", "with_precision", "precision_choices", "divisors", "local_batch_divisors", "grid_axes", "canonical_plan", "BOOLEAN_AXES",
           "collective_time_s", "pipeline_stage_times", "layer_times", "COLLECTIVES", "plan_split",
           "chunk_layer_counts"]
