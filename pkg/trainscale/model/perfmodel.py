"""Python API of the performance model: one run priced (:func:`predict`, a :class:`Prediction`), and the
model's pieces the studies call (:func:`collective_time_s`, :func:`layer_times`, :func:`pipeline_stage_times`).

The model is built in four modules, one role each: :mod:`.vectors` (specs to the kernels' arrays),
:mod:`.perfmodel` (one run), :mod:`.grid` (a Cartesian grid of plans in one Numba ``prange`` call, as an
xarray Dataset, and its ranking) and :mod:`.planner` (the best plans of a space: ``search``). All of them call
the same scalar kernels (:mod:`trainscale.kernels.plan`), so one formula lives in one place. The names of
:mod:`.vectors` and :mod:`.grid` that callers use are re-exported here (``perfmodel.evaluate_grid``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ..kernels import layout as K
from ..kernels.collectives import domain_allreduce_time as _domain_allreduce_time
from ..kernels.collectives import node_allgather_time as _node_allgather_time
from ..kernels.collectives import alltoall_time as _alltoall_time
from ..kernels.collectives import out_link as _out_link
from ..kernels.layer import layer_fwd_bwd
from ..kernels.plan import step_straggler_time
from ..kernels.power import power_draw
from .grid import (BOOLEAN_AXES, EP_AXIS, ETP_AXIS, EXPERT_AXES, EXPERT_TP_CHOICES, GRID_AXES, canonical_plan,
                   default_space, divisors, evaluate_grid, expert_axes, expert_pairs, grid_axes, grid_dataset,
                   grid_size, local_batch_divisors, plan_from_grid_entry, rank)
from .specs import DEFAULT_STACK, ModelSpec, PlanSpec, RunSpec, SpecError, SystemSpec, resolve_model, resolve_system
from .vectors import (COMMON_FITTED, COMMON_OVERRIDABLE, FITTED, GENERATION_FITTED, PRECISION_FITTED, STACK_FITTED,
                      GiB, calibration_parameters, calibration_vector, chunk_layer_counts, dense_layer_model,
                      low_precision_peak, mixed_layer_vectors, model_vector, plan_calibration_vector, plan_fields,
                      plan_split, plan_vector, precision_choices, precision_slots, system_vector, with_precision)


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
    if kind == "allreduce":  # ring, tree, hierarchical, or NVLS in one NVSwitch domain
        return float(_domain_allreduce_time(svec, float(nbytes), int(ranks), int(stride), bw_out, lat_out, eff))
    if kind == "alltoall":
        return float(_alltoall_time(float(nbytes), int(ranks), int(stride), system.scale_up_domain,
                                    svec[K.S_SCALE_UP_BW], svec[K.S_SCALE_UP_LAT], bw_out, lat_out, eff))
    # ring, or PAT with one GPU per node
    return float(_node_allgather_time(svec, float(nbytes), int(ranks), int(stride), bw_out, lat_out, eff))


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
    if model.is_mla:  # latent attention's projections and core at its own widths (trainscale.kernels.attention)
        weight_flops = 2 * tokens * (model.attention_params() + model.ffn_matrices * h * model.ffn_hidden)
        attention_flops = 2 * mb * s * s * model.heads * (model.qk_head_dim + model.qk_pos_emb_head_dim
                                                          + model.v_head_dim)
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




__all__ = ["Prediction", "predict", "UnrunnablePlanWarning", "simulate_pipeline", "collective_time_s",
           "pipeline_stage_times", "layer_times", "COLLECTIVES",
           # re-exported from .vectors
           "FITTED", "GENERATION_FITTED", "PRECISION_FITTED", "STACK_FITTED", "COMMON_FITTED", "COMMON_OVERRIDABLE",
           "GiB", "model_vector", "system_vector", "calibration_vector", "plan_calibration_vector",
           "calibration_parameters", "low_precision_peak", "precision_slots", "with_precision", "precision_choices",
           "plan_fields", "plan_split", "chunk_layer_counts", "dense_layer_model", "mixed_layer_vectors",
           "plan_vector",
           # re-exported from .grid
           "evaluate_grid", "grid_dataset", "rank", "default_space", "GRID_AXES", "BOOLEAN_AXES", "EP_AXIS",
           "ETP_AXIS", "EXPERT_AXES", "EXPERT_TP_CHOICES", "expert_axes", "expert_pairs", "grid_axes", "grid_size",
           "divisors", "local_batch_divisors", "canonical_plan", "plan_from_grid_entry"]
