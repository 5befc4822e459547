r"""The performance model of one training step: :func:`plan_costs` assembles a whole step from one
layer's costs (:func:`trainscale.kernels.layer.layer_costs`, priced once per distinct tp, cp,
micro-batch, recomputation, sequence parallelism and flash attention): pipeline stages, bubble,
data-parallel and ZeRO communication, optimizer, memory and power. Each part but the pipeline is
its own module, whose docstring has its formulas:

* :mod:`~trainscale.kernels.layer`: one transformer layer (FLOPs, GEMMs, element-wise chains,
  tensor- and context-parallel communication, activation bytes);
* :mod:`~trainscale.kernels.moe`: a mixture-of-experts layer's dispatch, permutation and host issue;
* :mod:`~trainscale.kernels.pipesplit`: the layers of every pipeline device and chunk (even and
  Megatron-Core's explicit splits) and the activations a device holds;
* :mod:`~trainscale.kernels.memory`: the most loaded GPU's memory by component;
* :mod:`~trainscale.kernels.zero3`: ZeRO-3 / FSDP's per-layer gathers and reduce-scatters;
* :mod:`~trainscale.kernels.dpsync`: the data-parallel gradient synchronisation once per step;
* :mod:`~trainscale.kernels.power`: the accelerator's power;
* :mod:`~trainscale.kernels.collectives`: the collectives, the scale-out link of a group
  (:func:`~trainscale.kernels.collectives.out_link`) and a collective's time beside computation
  (:func:`~trainscale.kernels.collectives.overlapped_exposed`).

Pipeline (closed form, exact for the 1F1B and interleaved schedules when micro-batches are
equal): with per-micro-batch stage times ``t_i``, ``m`` micro-batches and ``v`` chunks per device,

.. math:: T_\mathrm{pipe} = m \max_i t_i + \frac{\sum_i t_i - \max_i t_i}{v}

which is ``(m + (p-1)/v)\,t`` for equal stages (bubble fraction ``(p-1)/(v m + p - 1)``).

Scale-out topology: every collective that leaves the scale-up domain gets the link of its group
from :func:`~trainscale.kernels.collectives.tier_link` (oversubscribed spine of a two-tier
fat-tree, or one flat tier).
"""

import math

import numpy as np
from numba import njit

# An integer constant passed to another kernel is written np.int64(n): a literal argument makes Numba compile the
# callee (and everything it calls) once more for that value, seconds from an empty cache (issue 38 item 5).
from .collectives import BYTES, allgather_time, group_split, out_link, overlapped_exposed, p2p_time
from .compute import memory_bound_time
from .dpsync import dp_sync_time
from .layer import layer_fwd_bwd
from .layout import (
    C_EVEN_SPLIT, C_GRAD_BYTES, C_NET_EFF, C_OVERLAP_SLOWDOWN, C_PIPE_PARTITIONED, C_POWER_COMPUTE, C_POWER_MEMORY,
    C_STRAGGLER_SPREAD, C_WEIGHT_CAST_BYTES, L_BWD_ELEM, L_BWD_EP, L_BWD_GEMM, L_BWD_MOE, L_BWD_MOE_HOST, L_BWD_TP,
    L_CP, L_CP_FWD, L_CP_TOTAL, L_FLOPS_FWD, L_FLOPS_HEAD, L_FLOPS_RECOMP, L_FWD_ELEM, L_FWD_EP, L_FWD_GEMM, L_FWD_MOE,
    L_FWD_MOE_HOST, L_FWD_TP, L_HBM_TIME, L_HEAD_BWD, L_HEAD_FWD, L_RECOMP, L_RECOMP_TP, L_TP_TOTAL, M_EXPERTS, M_HEADS,
    M_HIDDEN, M_KV_HEADS, M_LAYERS, M_MTP_LAYERS, M_PARAMS_EMBED, M_PARAMS_EXPERTS, M_PARAMS_HEAD, M_PARAMS_LAYER,
    M_SEQ, O_BUBBLE,
    O_COMPUTE, O_CP_COMM, O_CP_COMM_TOTAL, O_DP_COMM, O_DP_COMM_TOTAL, O_DP_EXPOSED, O_ENDS, O_ENERGY_J, O_EP_COMM,
    O_GEMM_BUSY, O_HBM_BUSY, O_HEAD_BWD, O_HEAD_FWD, O_HW_FLOPS, O_LAYER_BWD, O_LAYER_FWD, O_MEM_BYTES, O_MODEL_FLOPS,
    O_MOE_HOST, O_MOE_PERMUTE, O_OPTIMIZER, O_P2P, O_POWER_W, O_PP_COMM, O_REASON, O_RECOMPUTE, O_STEP, O_STRAGGLER,
    O_TP_COMM, O_TP_COMM_TOTAL, RC_FULL, R_BATCH, R_CP_SEQ, R_EP, R_GPUS, R_INTERLEAVE, R_MEMORY, R_OK, R_PP_LAYERS,
    R_SHARD, R_TP_HEADS, R_TP_KV, R_UNEVEN_CHUNKS, S_HBM_BW, S_HBM_BYTES, S_IDLE_W, S_SCALE_UP_BW, S_SCALE_UP_DOMAIN,
    S_SCALE_UP_LAT, S_TDP_W,
)
from .memory import SHAPE_STAGES, pipeline_memory_shape, shaped_memory_components
from .pipesplit import split_reason, split_stage_layers
from .power import power_draw
from .scale import straggler_time_s
from .zero3 import zero3_layer_time, zero3_tensor_windows

ADAM_TRAFFIC_BYTES_PER_PARAM = 28.0  # read p32, m, v, g16 and write p32, m, v, p16


@njit(cache=True)
def plan_reason(model, gpus, tp, pp, dp, cp, v, mb, gb, shard, ep=1, even_split=False, etp=0):
    """Why a plan is structurally invalid (``R_*``), or ``R_OK``. ``even_split``: the stack builds
    ``layers / (pp v)`` layers in every interleaved chunk (Megatron-LM), so pp·v must divide the layers.
    ``etp`` (0: ``tp``): the experts' tensor-parallel degree; ``ep x etp`` must divide ``tp x dp`` (with
    ``etp = tp``: ``ep`` divides ``dp``), Megatron-Core's expert groups folded over the tensor- and
    data-parallel ranks."""
    if int(model[M_HEADS]) % tp != 0:
        return R_TP_HEADS
    if int(model[M_KV_HEADS]) % tp != 0:
        return R_TP_KV
    if pp * v > int(model[M_LAYERS]):
        return R_PP_LAYERS
    if tp * pp * dp * cp != gpus:
        return R_GPUS
    if gb % (dp * mb) != 0:
        return R_BATCH
    if int(model[M_SEQ]) % cp != 0:
        return R_CP_SEQ
    if v > 1 and (pp == 1 or (gb // (dp * mb)) % pp != 0):
        return R_INTERLEAVE
    if shard > 0 and dp % shard != 0:
        return R_SHARD
    if ep != 1:
        experts = int(model[M_EXPERTS])
        et = etp if etp > 0 else tp
        if ep < 1 or experts <= 1 or experts % ep != 0 or (dp * tp) % (ep * et) != 0:
            return R_EP
    if even_split and v > 1 and int(model[M_LAYERS]) % (pp * v) != 0:
        return R_UNEVEN_CHUNKS
    return R_OK


@njit(cache=True)
def structural_reason(model, gpus, tp, pp, dp, cp, v, mb, gb, shard, ep, even_split, first=0, last=0, ends=0,
                      etp=0):
    """:func:`plan_reason` with the pipeline split: a split given explicitly (``first``, ``last``, ``ends``)
    replaces the stack's even-split rule by Megatron-Core's rules
    (:func:`~trainscale.kernels.pipesplit.split_reason`)."""
    explicit = first != 0 or last != 0 or ends != 0
    reason = plan_reason(model, gpus, tp, pp, dp, cp, v, mb, gb, shard, ep, even_split and not explicit, etp)
    if reason == R_OK and explicit:
        reason = split_reason(int(model[M_LAYERS]), pp, v, first, last, ends)
    return reason


@njit(cache=True)
def p2p_stage_time(model, system, calib, tp, pp, dp, cp, v, mb):
    """Activation sends and receives of one stage per micro-batch (``2 v`` transfers of a
    micro-batch's boundary activations, Megatron's scatter/gather over the tp ranks)."""
    if pp <= 1:
        return 0.0
    domain = int(system[S_SCALE_UP_DOMAIN])
    n_in, n_out = group_split(pp, tp * cp * dp, domain)
    p2p_bytes = BYTES * mb * (model[M_SEQ] / cp) * model[M_HIDDEN] / float(tp)
    bw_p, lat_p = out_link(system, np.int64(2), tp * cp * dp)
    return 2.0 * v * p2p_time(p2p_bytes, n_out > 1, system[S_SCALE_UP_BW], system[S_SCALE_UP_LAT], bw_p, lat_p,
                              calib[C_NET_EFF])


@njit(cache=True)
def plan_costs(model, system, calib, lc, gpus, tp, pp, dp, cp, v, mb, gb, rc, zero, shard,
               overlap, per_tensor, out, ep=1, first=0, last=0, ends=0, etp=0):
    """Fill ``out`` (layout ``O_*``) with the step time, its breakdown, FLOPs, memory and power
    of one plan, given its layer costs ``lc`` from :func:`~trainscale.kernels.layer.layer_costs` (priced with the same
    ``ep`` and ``etp``). ``first``, ``last``, ``ends``: the pipeline split
    (:func:`~trainscale.kernels.pipesplit.split_chunk_layers`; all 0: the stack's default, which on a stack that
    builds even chunks needs pp·v to divide the layers). A low-precision plan quantizes its weights once per step (the
    first micro-batch's copies are reused, as Transformer Engine does), counted with the optimizer step."""
    reason = plan_memory(model, system, calib, lc, gpus, tp, pp, dp, cp, v, mb, gb, rc, zero, shard, overlap,
                         per_tensor, out, ep, first, last, ends, etp)
    if reason == R_OK or reason == R_MEMORY:
        plan_time(model, system, calib, lc, gpus, tp, pp, dp, cp, v, mb, gb, rc, zero, shard, overlap, per_tensor,
                  out, ep, first, last, ends, etp)


@njit(cache=True)
def plan_memory(model, system, calib, lc, gpus, tp, pp, dp, cp, v, mb, gb, rc, zero, shard,
                overlap, per_tensor, out, ep=1, first=0, last=0, ends=0, etp=0):
    """The first part of :func:`plan_costs`: ``out`` set to NaN, then the plan's reason (structural, else
    ``R_MEMORY`` where its memory exceeds the GPU's, else ``R_OK``) and, unless structurally invalid, its
    memory (``O_MEM_*``); returns the reason. The search (:func:`trainscale.kernels.grid.scan_layouts`) times
    only the plans this leaves feasible, through :func:`shaped_plan_memory`."""
    shape = np.empty((SHAPE_STAGES, 3), dtype=np.int64)
    shape[0, 0] = -1
    return shaped_plan_memory(model, system, calib, lc, gpus, tp, pp, dp, cp, v, mb, gb, rc, zero, shard, overlap,
                              per_tensor, out, ep, first, last, ends, etp, shape)


@njit(cache=True)
def shaped_plan_memory(model, system, calib, lc, gpus, tp, pp, dp, cp, v, mb, gb, rc, zero, shard,
                       overlap, per_tensor, out, ep, first, last, ends, etp, shape):
    """:func:`plan_memory` with the layout's :func:`~trainscale.kernels.memory.pipeline_memory_shape` in ``shape``
    (computed here when ``shape[0, 0]`` is -1, else taken as the shape of this plan's layout): a caller that prices
    many plans of one layout passes the same ``shape`` to all of them, and nothing is allocated per plan."""
    for i in range(out.shape[0]):
        out[i] = math.nan
    reason = structural_reason(model, gpus, tp, pp, dp, cp, v, mb, gb, shard, ep, calib[C_EVEN_SPLIT] > 0.0,
                               first, last, ends, etp)
    out[O_REASON] = reason
    if reason != R_OK:
        return reason
    n_shard = shard if shard > 0 else dp
    micro = gb // (dp * mb)
    et = etp if etp > 0 else tp
    e_shard = (n_shard * tp) // (ep * et) if et != tp else n_shard // ep
    if e_shard < 1:
        e_shard = 1
    if shape[0, 0] < 0:
        pipeline_memory_shape(int(model[M_LAYERS]), pp, v, micro, first, last, ends, shape)
    mem = shaped_memory_components(model, calib, lc, pp, v, zero, n_shard * cp, e_shard * cp, ep, tp, out, per_tensor,
                                   etp, shape)
    out[O_MEM_BYTES] = mem
    if mem > system[S_HBM_BYTES]:
        out[O_REASON] = R_MEMORY
        return R_MEMORY
    return R_OK


@njit(cache=True)
def plan_time(model, system, calib, lc, gpus, tp, pp, dp, cp, v, mb, gb, rc, zero, shard,
              overlap, per_tensor, out, ep=1, first=0, last=0, ends=0, etp=0):
    """The second part of :func:`plan_costs` (after :func:`plan_memory`, of a structurally valid plan): the step
    time, its breakdown, FLOPs and power into ``out``."""
    layers = int(model[M_LAYERS])
    n_shard = shard if shard > 0 else dp
    micro = gb // (dp * mb)
    moe = model[M_EXPERTS] > 1.0
    # expert-data-parallel ranks: the dp/ep replicas of each expert shard, sharded as dp is (with
    # expert tensor parallelism etp != tp: the tp*dp / (ep*etp) ranks that hold the same expert shard)
    et = etp if etp > 0 else tp
    e_dp = (dp * tp) // (ep * et) if et != tp else dp // ep
    e_shard = (n_shard * tp) // (ep * et) if et != tp else n_shard // ep
    if e_shard < 1:
        e_shard = 1
    e_replicas = e_dp // e_shard if e_dp >= e_shard else 1

    compute_l = lc[L_FWD_GEMM] + lc[L_FWD_ELEM] + lc[L_BWD_GEMM] + lc[L_BWD_ELEM]
    recomp_l = lc[L_RECOMP]
    tp_l = lc[L_FWD_TP] + lc[L_BWD_TP] + lc[L_RECOMP_TP]
    cp_l = lc[L_CP]
    ep_l = lc[L_FWD_EP] + lc[L_BWD_EP]
    moe_l = lc[L_FWD_MOE] + lc[L_BWD_MOE]
    host_l = lc[L_FWD_MOE_HOST] + lc[L_BWD_MOE_HOST]  # 0 for a dense layer

    # ZeRO-3: one gather in the forward; the other gathers (the recomputed forward's too) and the
    # reduce-scatter in the backward. Prefetching hides each pass's collectives behind its own work.
    z3_fwd_comm = 0.0
    z3_bwd_comm = 0.0
    z3_embed = 0.0
    if zero == 3:
        gather, scatter, z3_embed = zero3_layer_time(model, system, calib, tp, cp, ep, n_shard, e_shard,
                                                     per_tensor)
        z3_fwd_comm = gather
        z3_bwd_comm = (2.0 if rc == RC_FULL else 1.0) * gather + scatter
    z3_total_l = z3_fwd_comm + z3_bwd_comm
    fwd_l, bwd_l = layer_fwd_bwd(lc)
    z3_fwd = z3_fwd_comm
    z3_bwd = z3_bwd_comm
    if overlap and zero == 3:
        slow = calib[C_OVERLAP_SLOWDOWN]
        if per_tensor and not moe and n_shard * cp > 1:  # DeepSpeed: one weight matrix ahead
            recomp_pass = lc[L_RECOMP] + lc[L_RECOMP_TP] if rc == RC_FULL else 0.0
            z3_fwd, z3_bwd = zero3_tensor_windows(model, system, calib, tp, n_shard * cp, fwd_l + lc[L_CP_FWD],
                                                  recomp_pass, bwd_l - recomp_pass + cp_l - lc[L_CP_FWD], slow)
        else:  # FSDP: the next layer's gathers behind this layer's pass
            z3_fwd = overlapped_exposed(z3_fwd_comm, fwd_l + lc[L_CP_FWD], slow)
            z3_bwd = overlapped_exposed(z3_bwd_comm, bwd_l + cp_l - lc[L_CP_FWD], slow)
    z3_l = z3_fwd + z3_bwd
    per_layer = compute_l + recomp_l + tp_l + cp_l + ep_l + z3_l + moe_l
    if moe:  # the MoE layers' exposed host issue (added only with experts: a dense sum stays bit-identical)
        per_layer += host_l

    # pipeline stages
    l_first, l_mid, l_last = split_stage_layers(layers, pp, v, first, last, ends)
    p2p = p2p_stage_time(model, system, calib, tp, pp, dp, cp, v, mb) + pipe_partition_gather_time(
        model, system, calib, tp, pp, cp, mb)
    head = lc[L_HEAD_FWD] + lc[L_HEAD_BWD]
    if pp == 1:
        t_first = layers * per_layer + head + 2.0 * z3_embed
        t_max = t_first
        t_sum = t_first
        l_crit = layers
        head_crit = head
        z3_ends = 2.0 * z3_embed
    else:
        t_first = l_first * per_layer + z3_embed + p2p
        t_mid = l_mid * per_layer + p2p
        t_last = l_last * per_layer + head + z3_embed + p2p
        t_sum = layers * per_layer + head + 2.0 * z3_embed + pp * p2p
        t_max = t_first
        l_crit = l_first
        head_crit = 0.0
        z3_ends = z3_embed
        if pp > 2 and t_mid > t_max:
            t_max = t_mid
            l_crit = l_mid
            z3_ends = 0.0
        if t_last > t_max:
            t_max = t_last
            l_crit = l_last
            head_crit = head
            z3_ends = z3_embed
    bubble = (t_sum - t_max) / v

    # parameters on the most loaded device (first or last stage hold embedding / output layer)
    p_layer = model[M_PARAMS_LAYER] / tp
    p_first = l_first * p_layer + model[M_PARAMS_EMBED] / tp
    mtp = model[M_MTP_LAYERS]  # multi-token prediction: its layers and a copy of the embedding on the last stage
    p_last = (l_last + mtp) * p_layer + model[M_PARAMS_HEAD] / tp + (model[M_PARAMS_EMBED] / tp if mtp > 0 else 0.0)
    if pp == 1:
        p_first = (layers + mtp) * p_layer + (model[M_PARAMS_EMBED] + model[M_PARAMS_HEAD]) / tp
        p_last = p_first
    p_dev = max(p_first, p_last)
    pe_layer = model[M_PARAMS_EXPERTS] / (et * ep) if moe else 0.0
    pe_dev = max(l_first, max(l_mid, l_last + mtp)) * pe_layer

    # data-parallel gradient synchronisation, once per step (over dp x cp ranks, tp apart); the
    # expert gradients over the expert-data-parallel ranks (tp*ep apart); in the stack's gradient precision
    g_bytes = calib[C_GRAD_BYTES]
    dp_reduce, dp_gather = dp_sync_time(system, calib, p_dev, p_layer, g_bytes, dp * cp, tp, n_shard, dp // n_shard,
                                         zero, overlap)
    if moe:
        e_reduce, e_gather = dp_sync_time(system, calib, pe_dev, pe_layer, g_bytes, e_dp * cp, et * ep, e_shard,
                                          e_replicas, zero, overlap)
        dp_reduce += e_reduce
        dp_gather += e_gather
    dp_time = dp_reduce + dp_gather
    dp_exposed = dp_time
    if overlap:  # the reduction behind the last micro-batch's backward, the weight all-gather behind
        # the next step's first forward (Megatron-Core's overlapped grad reduce and param gather)
        backward = l_crit * (lc[L_BWD_GEMM] + lc[L_BWD_ELEM] + lc[L_RECOMP] + lc[L_BWD_TP]
                             + lc[L_RECOMP_TP] + lc[L_BWD_EP] + z3_bwd + lc[L_BWD_MOE])
        forward = l_crit * (lc[L_FWD_GEMM] + lc[L_FWD_ELEM] + lc[L_FWD_TP] + lc[L_FWD_EP] + z3_fwd + lc[L_FWD_MOE])
        if moe:
            backward += l_crit * lc[L_BWD_MOE_HOST]
            forward += l_crit * lc[L_FWD_MOE_HOST]
        dp_exposed = (overlapped_exposed(dp_reduce, backward, calib[C_OVERLAP_SLOWDOWN])
                      + overlapped_exposed(dp_gather, forward, calib[C_OVERLAP_SLOWDOWN]))

    # optimizer (memory-bound Adam over this GPU's shard)
    opt_div = n_shard * cp if zero >= 1 else 1
    e_div = e_shard * cp if zero >= 1 else 1
    optimizer = memory_bound_time(ADAM_TRAFFIC_BYTES_PER_PARAM * (p_dev / opt_div + pe_dev / e_div), 4.0,
                                  system[S_HBM_BW], calib)
    if calib[C_WEIGHT_CAST_BYTES] > 0.0:  # the weights quantized once per step
        optimizer += memory_bound_time(calib[C_WEIGHT_CAST_BYTES] * (p_dev + pe_dev), 2.0, system[S_HBM_BW], calib)

    step = micro * t_max + bubble + dp_exposed + optimizer
    straggler = step_straggler_time(step, gpus, calib)
    step += straggler
    out[O_STEP] = step
    out[O_STRAGGLER] = straggler
    out[O_COMPUTE] = micro * (l_crit * compute_l + head_crit)
    out[O_RECOMPUTE] = micro * l_crit * recomp_l
    out[O_TP_COMM] = micro * l_crit * tp_l
    out[O_CP_COMM] = micro * l_crit * cp_l
    out[O_PP_COMM] = micro * (p2p if pp > 1 else 0.0)
    out[O_BUBBLE] = bubble
    out[O_DP_COMM] = micro * (l_crit * z3_l + z3_ends) + dp_exposed
    out[O_OPTIMIZER] = optimizer
    out[O_EP_COMM] = micro * l_crit * ep_l
    out[O_MOE_PERMUTE] = micro * l_crit * moe_l
    out[O_MOE_HOST] = micro * l_crit * host_l
    out[O_TP_COMM_TOTAL] = micro * l_crit * lc[L_TP_TOTAL]
    out[O_CP_COMM_TOTAL] = micro * l_crit * lc[L_CP_TOTAL]
    out[O_DP_COMM_TOTAL] = micro * (l_crit * z3_total_l + z3_ends) + dp_time

    # FLOPs per GPU per step
    model_flops = 3.0 * (gb / mb) * (layers * lc[L_FLOPS_FWD] + lc[L_FLOPS_HEAD])
    hw_flops = model_flops + (gb / mb) * layers * lc[L_FLOPS_RECOMP]
    out[O_MODEL_FLOPS] = model_flops / gpus
    out[O_HW_FLOPS] = hw_flops / gpus

    # memory of the most loaded GPU: plan_memory

    # power
    gemm_busy = micro * l_crit * (lc[L_FWD_GEMM] + lc[L_BWD_GEMM]) + micro * head_crit
    if rc == RC_FULL:
        gemm_busy += micro * l_crit * lc[L_FWD_GEMM]
    hbm_busy = micro * l_crit * lc[L_HBM_TIME] + optimizer
    power = power_draw(system[S_IDLE_W], system[S_TDP_W], calib[C_POWER_COMPUTE], calib[C_POWER_MEMORY],
                       gemm_busy, hbm_busy, step)
    out[O_POWER_W] = power
    out[O_ENERGY_J] = power * step
    out[O_GEMM_BUSY] = gemm_busy
    out[O_HBM_BUSY] = hbm_busy

    # stage description for a pipeline simulation: forward and backward of one layer, each with the
    # exposed CP / ZeRO-3 communication of its own pass (ZeRO-3: one of the layer's gathers in the
    # forward, the others and the reduce-scatter in the backward)
    out[O_LAYER_FWD] = fwd_l + lc[L_CP_FWD] + z3_fwd
    out[O_LAYER_BWD] = bwd_l + (cp_l - lc[L_CP_FWD]) + z3_bwd
    out[O_HEAD_FWD] = lc[L_HEAD_FWD]
    out[O_HEAD_BWD] = lc[L_HEAD_BWD]
    out[O_ENDS] = z3_embed
    out[O_P2P] = p2p / (2.0 * v) if pp > 1 else 0.0
    out[O_DP_EXPOSED] = dp_exposed


# --------------------------------------------------------------------------- what scale costs
# (kept apart from the functions above so that changes to the stage layout merge cleanly)


@njit(cache=True)
def step_straggler_time(step_s, gpus, calib):
    """Expected wait for the slowest rank in one step of ``step_s`` seconds on ``gpus`` GPUs
    (:func:`~trainscale.kernels.scale.straggler_time_s` with the fitted spread
    ``calib[C_STRAGGLER_SPREAD]``).

    Every GPU of a step waits at its synchronisations: tensor-parallel ranks every layer, the
    pipeline's stages at every transfer and its flush, the data-parallel replicas of every stage
    at the gradient reduction. The step of the whole job therefore ends when its slowest rank's
    does: ``N`` = all GPUs, once per step (a rank that is slow in one micro-batch is, for a
    thermal or clock difference, slow in all of them, so the spread is of whole-step times)."""
    return straggler_time_s(step_s, calib[C_STRAGGLER_SPREAD], gpus)


@njit(cache=True)
def pipe_partition_gather_time(model, system, calib, tp, pp, cp, mb):
    """Seconds per micro-batch a stage spends re-assembling partitioned pipeline tensors
    (``calib[C_PIPE_PARTITIONED]`` = 1: DeepSpeed's pipeline engine with tensor parallelism).

    DeepSpeed's ``PipelineEngine`` (deepspeed/runtime/pipe/engine.py, v0.5-0.16:
    ``is_pipe_partitioned = is_model_parallel``) sends each boundary activation as a
    ``PartitionedTensor`` (its 1/tp share and a meta tensor) and the receiver rebuilds it with
    ``PartitionedTensor.full()``, an all-gather over the tensor-parallel ("slice parallel") group,
    before its forward; the gradient sent back is partitioned and gathered the same way before
    the backward (``is_grad_partitioned``). Both gathers block the stage's compute, once per
    micro-batch each: ``2 T_ag(2 b s h / cp)`` over the ``tp`` ranks. Megatron's own
    scatter/gather of pipeline tensors is priced in :func:`p2p_stage_time` already."""
    if calib[C_PIPE_PARTITIONED] <= 0.0 or pp <= 1 or tp <= 1:
        return 0.0
    domain = int(system[S_SCALE_UP_DOMAIN])
    nbytes = BYTES * mb * (model[M_SEQ] / cp) * model[M_HIDDEN]
    bw_t, lat_t = out_link(system, tp, np.int64(1))
    return 2.0 * allgather_time(nbytes, tp, np.int64(1), domain, system[S_SCALE_UP_BW], system[S_SCALE_UP_LAT], bw_t,
                                lat_t, calib[C_NET_EFF])
