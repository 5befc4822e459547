r"""The performance model of one training step, as two scalar kernels.

:func:`layer_costs` prices one transformer layer for one micro-batch on one GPU (it depends only
on tp, cp, micro-batch, recomputation, sequence parallelism and flash attention, so a grid
evaluates it once per distinct combination); :func:`plan_costs` assembles a whole step from it:
pipeline stages, bubble, data-parallel and ZeRO communication, optimizer, memory and power.

Per-layer FLOPs (``b`` sequences of ``s`` tokens, hidden ``h``, FFN width ``f`` with ``n_f``
matrices, key/value width ``h_kv``; forward, no causal halving):

.. math:: F_\mathrm{layer} = 2bsh(h + 2h_{kv}) + 2bsh^2 + 2 n_f\, bshf + 4bs^2h

which for GPT (``h_kv = h``, ``f = 4h``, ``n_f = 2``) is Megatron's ``24bsh^2 + 4bs^2h``.
Backward costs two GEMMs per forward GEMM. Full recomputation repeats the forward; selective
recomputation repeats the attention core (Korthikanti et al. 2022).
The last stage adds the output layer's GEMMs and the stack's cross-entropy, memory-bound over the
fp32 logits of its vocabulary shard: ``(B_fwd + B_bwd) b s V / t`` bytes, with the stack's bytes per
logit element counted from its code (``loss_*_bytes_per_logit`` in ``data/calibration.yaml``:
Megatron's unfused loss 38 + 14, NeMo's fused one 22 + 10, PyTorch's ``cross_entropy`` 22 + 26).

Activation bytes per layer and micro-batch follow Korthikanti et al. 2022, eq. 1-2,
``sbh (34 + 5as/h)`` for GPT, generalised to GQA and SwiGLU widths, with the tensor- and
sequence-parallel divisions of their Table 2.

Pipeline (closed form, exact for the 1F1B and interleaved schedules when micro-batches are
equal): with per-micro-batch stage times ``t_i``, ``m`` micro-batches and ``v`` chunks per device,

.. math:: T_\mathrm{pipe} = m \max_i t_i + \frac{\sum_i t_i - \max_i t_i}{v}

which is ``(m + (p-1)/v)\,t`` for equal stages (bubble fraction ``(p-1)/(v m + p - 1)``).

Mixture of experts (``E`` experts of FFN width ``f`` per layer, top-``k`` routing, capacity factor
``c``, expert parallelism ``ep`` taken from the data-parallel ranks as in Megatron-LM and
DeepSpeed-MoE): the FFN of every layer is replaced by ``E`` experts and a router (``h x E``).
A token is processed by ``k`` experts, so the model FLOPs of the FFN are ``k`` times the dense
one's plus the router's ``2bshE``; the GEMM time is that of ``E/ep`` local experts each given
``c k m ep / E`` of the ``m`` tokens per GPU (capacity padding is work, not model FLOPs), times the
busiest rank's load imbalance (``plan.moe_imbalance``, 1 by default).
Tokens reach their experts and come back by two all-to-alls per pass (dispatch, combine) over the
``ep`` ranks, each GPU sending ``c k m h`` 16-bit values split over its ``tp`` ranks, and with expert
tensor parallelism an all-gather and a reduce-scatter over the ``etp`` ranks (:func:`moe_dispatch_time`),
not overlapped; the router's top-k and the permutations around them are memory-bound
(:func:`moe_permute_time`); the ops the host issues after the dropless dispatcher's tokens-per-expert
device-to-host sync, each pass, are charged at their issue time (:func:`moe_host_time`). Expert weights,
gradients and optimizer states are divided by ``tp x ep``; their gradients are reduced over the
``dp / ep`` (x ``cp``) expert-data-parallel ranks, ``tp x ep`` apart. A dense model (``E <= 1``)
takes exactly the dense path.

Scale-out topology: every collective that leaves the scale-up domain gets the link of its group
from :func:`~trainscale.kernels.collectives.tier_link` (oversubscribed spine of a two-tier
fat-tree, or one flat tier).
"""

import math

import numpy as np
from numba import njit

# An integer constant passed to another kernel is written np.int64(n): a literal argument makes Numba compile the
# callee (and everything it calls) once more for that value, seconds from an empty cache (issue 38 item 5).
from .collectives import allgather_time, allreduce_time, alltoall_time, group_split, p2p_time, tier_link
from .scale import straggler_time_s
from .compute import fused_attention_fwd_bwd_time, gemm_fwd_bwd_time, memory_bound_time
from .layout import (
    C_ATTN_BWD_EFF, C_EVEN_SPLIT, C_ROTARY_BYTES, C_ROTARY_KERNELS, C_LOSS_BWD_BYTES, C_LOSS_BWD_KERNELS, C_LOSS_FWD_BYTES, C_LOSS_FWD_KERNELS,
    C_SP_LAYOUT_COPY, C_ELEM_TRAFFIC, C_LINEAR_SPEEDUP, C_CAST_BYTES, C_WEIGHT_CAST_BYTES, C_LP_WEIGHT_BYTES,
    C_STRAGGLER_SPREAD, C_PIPE_PARTITIONED, C_MOE_IMBALANCE, C_MOE_OP_HOST_S, C_KERNEL_S,
    M_HEAD_DIM, M_SHARED_FFN, C_FETCH_S, C_OVERLAP_SLOWDOWN, C_SELECTIVE_SHARE, C_BF16_OPTIMIZER, C_GRAD_BYTES, C_LAYER_HOST_S, C_NET_EFF, C_TP_ASYNC_BWD, C_POWER_COMPUTE, C_POWER_MEMORY, C_RESERVED_BYTES,
    L_ACT_BYTES, L_BWD_ELEM, L_BWD_GEMM, L_BWD_TP, L_CP, L_FLOPS_FWD, L_FLOPS_HEAD, L_FLOPS_RECOMP,
    L_FWD_ELEM, L_FWD_GEMM, L_FWD_TP, L_HBM_TIME, L_HEAD_BWD, L_HEAD_BYTES, L_HEAD_FWD, L_RECOMP,
    L_RECOMP_TP, L_WORK_BYTES, L_FWD_EP, L_BWD_EP, L_TP_TOTAL, L_CP_TOTAL, L_CP_FWD, L_FWD_MOE, L_BWD_MOE,
    L_FWD_MOE_HOST, L_BWD_MOE_HOST,
    M_CAPACITY, M_EXPERTS, M_FFN, M_FFN_MATS, M_HEADS, M_HIDDEN, M_KV_HEADS, M_LAYERS, M_PARAMS_EMBED,
    M_ROTARY, M_PARAMS_EXPERTS, M_PARAMS_HEAD, M_PARAMS_LAYER, M_SEQ, M_TENSORS_LAYER, M_TOP_K, M_VOCAB,
    O_BUBBLE, O_COMPUTE, O_CP_COMM, O_DP_COMM, O_DP_EXPOSED, O_ENDS, O_ENERGY_J, O_EP_COMM, O_GEMM_BUSY,
    O_HBM_BUSY,
    O_HEAD_BWD, O_HEAD_FWD, O_HW_FLOPS, O_LAYER_BWD, O_LAYER_FWD, O_MEM_BYTES, O_MODEL_FLOPS, O_OPTIMIZER,
    O_P2P, O_POWER_W, O_PP_COMM, O_REASON, O_RECOMPUTE, O_STEP, O_TP_COMM,
    O_MEM_WEIGHTS, O_MEM_GRADS, O_MEM_OPTIMIZER, O_MEM_ACTIVATIONS, O_MEM_TRANSIENT, O_MEM_BUFFERS, O_MEM_RESERVED,
    O_TP_COMM_TOTAL, O_CP_COMM_TOTAL, O_DP_COMM_TOTAL, O_STRAGGLER, O_MOE_PERMUTE, O_MOE_HOST,
    R_BATCH, R_CP_SEQ, R_EP, R_GPUS, R_INTERLEAVE, R_MEMORY, R_OK, R_PP_LAYERS, R_SHARD, R_TP_HEADS, R_TP_KV, R_UNEVEN_CHUNKS,
    RC_FULL, RC_SELECTIVE,
    S_HBM_BW, S_HBM_BYTES, S_HOP_LAT, S_IDLE_W, S_LEAF_GPUS, S_OVERSUB, S_PEAK_FLOPS, S_SCALE_OUT_BW,
    S_SCALE_OUT_LAT, S_SCALE_UP_BW, S_SCALE_UP_DOMAIN, S_SCALE_UP_LAT, S_SMS, S_TDP_W,
)

BYTES = 2.0  # 16-bit activations, weights and gradients
OPTIMIZER_BYTES_PER_PARAM = 12.0  # fp32 master weights, Adam m and v (ZeRO paper's K = 12)
ADAM_TRAFFIC_BYTES_PER_PARAM = 28.0  # read p32, m, v, g16 and write p32, m, v, p16
ELEMENTWISE_KERNELS_PER_LAYER = 12.0
# DeepSpeed's BF16_Optimizer adds each micro-batch's gradients into its fp32 buffer, per parameter:
# read the bf16 gradient (2), write and read its fp32 cast (4 + 4), read and write the buffer (4 + 4)
# (PipelineEngine._exec_backward_pass calls optimizer.update_hp_grads after every backward;
# BF16_Optimizer.update_hp_grads: hp_grad.add_(lp.grad.to(hp_grad.dtype)))
HP_GRAD_ACCUM_BYTES = 18.0
# HBM bytes per s x s score of the unfused attention (16-bit values, 1-byte dropout mask): the
# scaled masked softmax (read, write: 4) and the attention dropout (read, write, mask: 5); backward
# the dropout (read dy and the mask, write: 5) and the softmax (read y and dy, write: 6)
SCORE_BYTES = (4.0 + 5.0, 5.0 + 6.0)
# per hidden element of a token: LayerNorms, dropouts and residual adds, forward (the backward moves
# twice as much, as does the FFN activation's 2 bytes per element and input matrix)
NORM_DROPOUT_RESIDUAL_BYTES = 30.0
FLASH_BLOCK = 128.0  # key/value block of FlashAttention-2 and cuDNN's fused attention on Ampere/Hopper


@njit(cache=True)
def eager_chain_factor(model, calib):
    """HBM traffic (and kernel count) of a layer's norm / activation / residual chains relative to
    fused kernels.

    The stack's factor ``calib[C_ELEM_TRAFFIC]`` (1: fused kernels, Megatron's reference; eager
    PyTorch: fitted, about 2.8) counts what eager code decomposes: a Llama-shaped layer's RMSNorm
    (cast to fp32, square, mean, reciprocal square root, two multiplies, cast back: about 36 bytes
    per element against 4 fused) and SwiGLU (SiLU, then a multiply). A layer with LayerNorm and a
    GeLU MLP (``M_FFN_MATS`` = 2: GPT, BLOOM, MPT) runs each as one PyTorch kernel
    (``torch.nn.functional.layer_norm``, ``gelu``) even in an eager stack, as fused as the
    reference: its factor is 1."""
    if model[M_FFN_MATS] < 2.5:
        return 1.0
    return calib[C_ELEM_TRAFFIC]


@njit(cache=True)
def causal_block_fraction(s_q, s_k):
    """Share of the ``s_q x s_k`` score blocks a fused causal attention kernel computes.

    FlashAttention skips the key blocks wholly above the diagonal: with ``n = s_k / B`` blocks
    of ``B`` = :data:`FLASH_BLOCK` keys, ``n (n + 1) / 2`` of the ``n^2`` blocks are computed,
    a fraction ``(1 + B / s_k) / 2`` (for a query slice of ``s_q < s_k`` tokens, as under context
    parallelism with load balancing, the same on average). Unfused attention (Megatron without
    flash) multiplies the whole matrix and masks it: fraction 1. The model FLOPs keep the
    convention of Narayanan et al. (no causal halving); only the time is halved."""
    if s_k <= FLASH_BLOCK:
        return 1.0
    return 0.5 * (1.0 + FLASH_BLOCK / s_k)


@njit(cache=True)
def out_link(system, n, stride):
    """(bandwidth, per-step latency) of the scale-out network for a group of ``n`` GPUs
    ``stride`` ranks apart, from the system vector's topology (:func:`tier_link`)."""
    return tier_link(n, stride, system[S_SCALE_OUT_BW], system[S_SCALE_OUT_LAT], system[S_LEAF_GPUS],
                     system[S_OVERSUB], system[S_HOP_LAT])


@njit(cache=True)
def overlapped_exposed(comm_s, work_s, slowdown):
    """Exposed time of a collective of ``comm_s`` run beside ``work_s`` of computation.

    While the collective runs, the computation beside it is slowed by ``1 + slowdown``: NCCL's
    kernels occupy SMs and HBM bandwidth (Lee et al. 2025, arXiv 2507.03114: 18.9% on average
    on A100, H100 and MI250). Of the computation, ``comm_s / (1 + slowdown)`` gets done while the
    collective runs, so the pair takes ``max(comm_s, work_s + comm_s * slowdown / (1 + slowdown))``
    and the time beyond the computation alone is

    .. math:: \\max\\left(c - w,\\; c\\,\\frac{\\sigma}{1 + \\sigma}\\right).

    With ``slowdown`` 0 this is the ideal overlap, ``max(0, c - w)``."""
    if comm_s <= 0.0:
        return 0.0
    return max(comm_s - work_s, comm_s * slowdown / (1.0 + slowdown))


@njit(cache=True)
def tp_overlapped_time(collective_s, tp, gemm_a_s, gemm_b_s, gemm_c_s, gemm_d_s, slowdown):
    """Exposed time of a pass's four sequence-parallel collectives (each ``collective_s``), each
    overlapped with its neighbouring GEMM as Megatron-Core's TP communication overlap does: the
    collective is split into ``tp`` chunks pipelined with the GEMM's chunks, so one chunk is always
    exposed and the rest runs beside the GEMM (:func:`overlapped_exposed`, which slows the GEMM by
    ``slowdown`` while it does)."""
    c = collective_s
    first = c / tp
    exposed = 0.0
    for g in (gemm_a_s, gemm_b_s, gemm_c_s, gemm_d_s):
        exposed += first + overlapped_exposed(c - first, g, slowdown)
    return exposed


@njit(cache=True)
def tp_async_backward_time(collective_s, sp, qkv_bwd_s, fc1_bwd_s, slowdown):
    r"""Exposed tensor-parallel communication of one layer's backward pass when Megatron-LM issues
    it asynchronously (``collective_s``: one all-reduce of the layer's activations, or one
    all-gather plus one reduce-scatter with sequence parallelism; ``*_bwd_s``: the backward GEMM
    time of the two column-parallel linears, QKV and the FFN's first, each half data gradient and
    half weight gradient).

    Without sequence parallelism the backward has two all-reduces, of the input gradients of the
    column-parallel linears, each run beside that linear's weight-gradient GEMM
    (``--async-tensor-model-parallel-allreduce``; the row-parallel linears' backward needs none).
    With it, each column-parallel linear re-gathers its sharded input beside its data-gradient GEMM
    and reduce-scatters the input gradient beside its weight-gradient GEMM, and each row-parallel
    linear all-gathers its output gradient before its GEMMs can start (exposed):

    .. math:: t = \sum_{g \in \{\mathrm{QKV}, \mathrm{FC1}\}} e(c, g/2)
        \quad\text{or}\quad t = c + \sum_g \left[e(c/2, g/2) + e(c/2, g/2)\right]

    with ``e`` :func:`overlapped_exposed`. Korthikanti et al. 2022 (Sec. 6.2) name this overlap as
    why full recomputation (whose recomputed forward communicates exposed) costs 39%, not 33%."""
    exposed = 0.0
    if sp:
        exposed = collective_s  # two blocking all-gathers, each half the pair
        for g in (qkv_bwd_s, fc1_bwd_s):
            exposed += 2.0 * overlapped_exposed(0.5 * collective_s, 0.5 * g, slowdown)
    else:
        for g in (qkv_bwd_s, fc1_bwd_s):
            exposed += overlapped_exposed(collective_s, 0.5 * g, slowdown)
    return exposed


@njit(cache=True)
def sp_layout_copy_time(m, h, tp, sp, hbm_bw, calib):
    r"""Seconds per pass of the layout copies around a layer's four sequence-parallel collectives.

    NCCL gathers and scatters along a tensor's first dimension. A stack that keeps activations
    batch-first (``b x s x h``) and shards the sequence (dim 1) reorders every gathered output, and
    every input to a reduce-scatter, by one more read and write of the whole ``m x h`` tensor
    (``calib[C_SP_LAYOUT_COPY]`` = 1: PyTorch's functional collectives, ``torch.cat(torch.chunk(...))``
    along the gather / scatter dim, as DTensor's ``Shard(1)`` sequence parallelism in torchtitan).
    Megatron keeps activations sequence-first (``s x b x h``) and needs none:

    .. math:: t = 4 \cdot \frac{2 \cdot 2 m h}{\eta_\mathrm{HBM} B_\mathrm{HBM}} + 4\,t_\mathrm{kernel}
    """
    if not sp or tp <= 1 or calib[C_SP_LAYOUT_COPY] <= 0.0:
        return 0.0
    return 4.0 * memory_bound_time(2.0 * BYTES * m * h, 1.0, hbm_bw, calib)


@njit(cache=True)
def rotary_time(m, h, kv, tp, hbm_bw, calib):
    r"""Seconds per pass of a layer's rotary position embedding (Su et al. 2021) on one GPU.

    The rotation is applied to this GPU's share of the queries and keys, ``m (h + h_kv) / t``
    elements, as a memory-bound kernel chain moving the plan's ``B_rot`` bytes per element in its
    ``k_rot`` kernels (``rotary_kernels`` in ``data/calibration.yaml``, counted from each code: a fused
    kernel reads and writes each 16-bit element once, 4 bytes; torchtitan's complex multiplication in
    fp32 moves 20, foundation-model-stack's 2 x 2 rotation matrices 36). The backward rotates the gradients by the opposite angle: the same cost.

    .. math:: t = \frac{B_\mathrm{rot}\, m (h + h_{kv}) / t}{\eta_\mathrm{HBM} B_\mathrm{HBM}} + k_\mathrm{rot}\, t_\mathrm{kernel}
    """
    return memory_bound_time(calib[C_ROTARY_BYTES] * m * (h + kv) / tp, calib[C_ROTARY_KERNELS], hbm_bw, calib)


@njit(cache=True)
def linear_peak(peak, calib):
    r"""Peak FLOP/s the linear layers' GEMMs are priced at, in the plan's precision.

    BF16: the bf16 peak ``P``. FP8, MXFP8, NVFP4 (``plan.precision``): the linear layers (QKV, projection,
    FFN, experts) run at the low-precision peak times an efficiency tied to bf16's by one factor per
    generation, folded into ``calib[C_LINEAR_SPEEDUP]`` = :math:`(P_\mathrm{lp} / P)\,\rho`
    (:func:`trainscale.model.perfmodel.precision_slots`); attention, router and output layer stay in bf16."""
    speedup = calib[C_LINEAR_SPEEDUP]
    if speedup == 1.0:
        return peak
    return peak * speedup


@njit(cache=True)
def cast_time(elements, kernels, hbm_bw, calib):
    r"""Seconds to quantize ``elements`` 16-bit values to the plan's low precision (amax or block
    scales, the cast, and the transposed copy where the recipe needs one), at ``calib[C_CAST_BYTES]``
    bytes of HBM traffic per element (0 in bf16: no time):

    .. math:: t = \frac{B_\mathrm{cast}\, n}{\eta_\mathrm{HBM} B_\mathrm{HBM}} + k\, t_\mathrm{kernel}"""
    if calib[C_CAST_BYTES] <= 0.0:
        return 0.0
    return memory_bound_time(calib[C_CAST_BYTES] * elements, kernels, hbm_bw, calib)


# MoE router and permutation HBM bytes (Megatron-Core's fused router and permute kernels, 16-bit tokens):
# the router's top-k over fp32 scores reads the logits and writes the probabilities and the routing map
# (4 + 4 + 1 bytes per score element); its backward reads the probabilities and their gradient and
# writes the logits' gradient (4 + 4 + 4)
ROUTER_SCORE_BYTES = (9.0, 12.0)


@njit(cache=True)
def moe_dispatch_time(system, calib, routed, h, tp, et, ep, imbalance):
    r"""Seconds of one pass's token dispatch and combine on one GPU (Megatron-Core's ``alltoall`` token
    dispatcher, MoEAlltoAllTokenDispatcher).

    Each of the ``t`` tensor-parallel ranks holds ``m / t`` of the micro-batch's ``m`` tokens (Megatron
    runs MoE with tensor parallelism only under sequence parallelism) and sends their ``r = c k m``
    routed copies (capacity ``c``, top-``k``), 16-bit, ``h`` wide, to the ranks of their experts: one
    all-to-all over the ``ep`` ranks (:func:`~trainscale.kernels.collectives.alltoall_time`, the
    NVLink share inside the scale-up domain and the rest through the NIC at once), then, with expert
    tensor parallelism ``e_t > 1``, an all-gather of the received copies over the ``e_t`` ranks of each
    expert shard. The combine runs both backwards (reduce-scatter, all-to-all), the same bytes. The
    expert ranks are laid out as Megatron-Core's expert rank generator does (``etp`` innermost, then
    ``ep``): the ``ep`` ranks are ``e_t`` apart, the ``e_t`` ranks adjacent. The busiest rank receives
    ``\iota`` times the mean (``imbalance``, :data:`~trainscale.kernels.layout.C_MOE_IMBALANCE`), and
    the collective ends when it does:

    .. math:: t = 2\left[T_\mathrm{a2a}\!\left(\frac{2 r h \iota}{t}, ep\right)
              + T_\mathrm{ag}\!\left(\frac{2 r h \iota\, e_t}{t}, e_t\right)\right]

    0 with ``ep = 1`` and ``e_t = 1`` (every expert local, nothing to gather)."""
    domain = int(system[S_SCALE_UP_DOMAIN])
    eff = calib[C_NET_EFF]
    bw_up, lat_up = system[S_SCALE_UP_BW], system[S_SCALE_UP_LAT]
    sent = BYTES * routed * h * imbalance / tp
    a2a = 0.0
    if ep > 1:
        bw_a, lat_a = out_link(system, ep, et)
        a2a = alltoall_time(sent, ep, et, domain, bw_up, lat_up, bw_a, lat_a, eff)
    gather = 0.0
    if et > 1:
        bw_g, lat_g = out_link(system, et, np.int64(1))
        gather = allgather_time(sent * et, et, np.int64(1), domain, bw_up, lat_up, bw_g, lat_g, eff)
    return 2.0 * (a2a + gather)


@njit(cache=True)
def moe_permute_time(routed, m, h, experts, local, tp, et, imbalance, hbm_bw, calib):
    r"""(forward, backward) seconds of a MoE layer's router scores and token permutation on one GPU:
    memory-bound kernels priced by their HBM bytes (:func:`~trainscale.kernels.compute.memory_bound_time`).

    With ``r = c k m`` routed copies of the micro-batch's ``m`` tokens, ``h`` wide in 16 bits, this
    GPU's ``1/t`` share of them (sequence parallel), ``E`` experts of which ``E_l`` are local, and the
    busiest rank receiving ``\iota`` times the mean:

    * router: top-``k`` of the fp32 scores of its ``m E / t`` token-expert pairs, :data:`ROUTER_SCORE_BYTES`
      per pair (forward 9, backward 12);
    * permute: gather each token's ``k`` copies into expert order (read and write ``r / t`` rows);
      un-permute: read the copies back and write the ``m / t`` weighted sums (``r / t + m / t`` rows);
    * with ``E_l > 1`` local experts, the received copies (``\iota r e_t / t`` after the expert-tensor
      gather) sorted by expert before the expert GEMMs and back after them (read and write, twice).

    .. math:: B_\mathrm{fwd} = 2h\left[\frac{3r + m}{t} + [E_l > 1]\,\frac{4 \iota r e_t}{t}\right]
              + 9\,\frac{mE}{t}

    The backward applies the inverse permutations (the same rows) and reads the copies once more for
    the gradient of the routing probabilities (``+ 2 h r / t``), and the router's backward moves 12 bytes
    per pair. Kernels: router, permute, un-permute, and the two sorts where ``E_l > 1``."""
    sort = 4.0 * imbalance * routed * et / tp if local > 1 else 0.0
    rows_fwd = (3.0 * routed + m) / tp + sort
    rows_bwd = rows_fwd + routed / tp
    pairs = m * experts / tp
    kernels = 5.0 if local > 1 else 3.0
    fwd = memory_bound_time(BYTES * h * rows_fwd + ROUTER_SCORE_BYTES[0] * pairs, kernels, hbm_bw, calib)
    bwd = memory_bound_time(BYTES * h * rows_bwd + ROUTER_SCORE_BYTES[1] * pairs, kernels, hbm_bw, calib)
    return fwd, bwd


@njit(cache=True)
def moe_host_time(local, ep, et, low_precision, op_s, launch_s):
    r"""(forward, backward) seconds the GPU waits, per MoE layer and micro-batch, for the host to issue the
    layer's dispatch, expert and combine work (Megatron-Core's dropless ``alltoall`` dispatcher,
    MoEAlltoAllTokenDispatcher, and TEGroupedMLP; NVIDIA/Megatron-LM d98e8a6).

    Dropless routing gives the split sizes of the all-to-all and of the grouped GEMM only on the GPU; the
    dispatcher copies them to the host and waits for them (``_maybe_dtoh_and_synchronize``:
    ``d2h_event.synchronize()`` before the expert-parallel all-to-all, or before permutation / the experts
    without one), so the host's launch queue is drained at every MoE layer of every micro-batch and what
    the host issues after it reaches the GPU only as fast as it is issued. Counted from the code, the host
    issues after the sync, per pass:

    * ``n_op`` Python-level ops at ``t_op`` each (:data:`~trainscale.kernels.layout.C_MOE_OP_HOST_S`): the two
      experts' grouped linears and their activation (3), the un-permutation (1), with ``ep > 1`` the tokens' and
      probabilities' all-to-alls and the combine all-to-all (3), with expert tensor parallelism ``e_t > 1`` the
      two gathers and the reduce-scatter (3), with ``E_l > 1`` local experts the sort by expert and its inverse
      (2);
    * inside Transformer Engine's GroupedLinear (a C++ loop, one cuBLAS GEMM per local expert) ``E_l``
      GEMM launches per grouped linear forward and ``2 E_l`` backward (data and weight gradients), and
      in a low-precision recipe ``E_l`` quantisations more per grouped linear each pass (``split_quantize``
      of the inputs, of the output gradients), at ``t_l`` each (the kernel launch cost
      :data:`~trainscale.kernels.layout.C_KERNEL_S`):

    .. math:: t_\mathrm{fwd} = n_\mathrm{op} t_\mathrm{op} + 2 E_l (1 + q)\, t_l, \qquad
              t_\mathrm{bwd} = n_\mathrm{op} t_\mathrm{op} + 2 E_l (2 + q)\, t_l

    with ``q`` 1 in low precision, else 0 (a recomputed forward issues, and syncs, again). The whole issue
    time is charged in both passes. Forward: after the sync the GPU has nothing queued. Backward: it has no
    sync of its own, but the host reaches it with no lead beyond the forward's last sync and its expert
    kernels are the same fine-grained ones (an assumption). Both are upper bounds where the experts' GEMMs
    run longer than their launches (large micro-batches), where the issue then hides behind them; a
    fine-grained expert's GEMM of a few microseconds does not hide its own launch. 0 for a dense layer (the
    caller prices it only with experts)."""
    n_op = 4.0
    if ep > 1:
        n_op += 3.0
    if et > 1:
        n_op += 3.0
    if local > 1:
        n_op += 2.0
    q = 1.0 if low_precision else 0.0
    fwd = n_op * op_s + 2.0 * local * (1.0 + q) * launch_s
    bwd = n_op * op_s + 2.0 * local * (2.0 + q) * launch_s
    return fwd, bwd


@njit(cache=True)
def layer_costs(model, system, calib, tp, cp, mb, rc, sp, flash, out, ep=1, tp_overlap=False, etp=0):
    """Fill ``out`` (layout ``L_*``) with one layer's costs for one micro-batch on one GPU
    (``ep``: expert-parallel degree, used by mixture-of-experts models only; ``tp_overlap``:
    tensor-parallel communication overlapped with the GEMMs, see :func:`tp_overlapped_time`;
    ``etp``: the experts' tensor-parallel degree, 0 for ``tp``).

    Experts under ``etp`` (Megatron-Core's expert tensor parallelism): the ``ep x etp`` GPUs of an expert
    group hold the routed copies of ``ep etp / tp`` tensor-parallel groups' tokens, so each local expert
    GEMM has ``c k m (etp / tp) ep / E`` rows of width ``f / etp`` (the same FLOPs per GPU as ``etp = tp``),
    times the busiest rank's imbalance ``calib[C_MOE_IMBALANCE]`` (the step waits for that rank). The
    router runs on this GPU's ``m / t`` tokens (sequence parallel). Dispatch and combine:
    :func:`moe_dispatch_time`; router scores and permutation: :func:`moe_permute_time`."""
    h = model[M_HIDDEN]
    a = model[M_HEADS]
    f = model[M_FFN]
    nf = model[M_FFN_MATS]
    vocab = model[M_VOCAB]
    s = model[M_SEQ]
    d = h / a
    qw = h  # width of the queries (and the attention output): hidden, or heads x a given head width
    if model[M_HEAD_DIM] > 0.0:
        d = model[M_HEAD_DIM]
        qw = a * d
    kv = model[M_KV_HEADS] * d
    t = float(tp)
    et = etp if etp > 0 else tp
    sc = s / cp  # query tokens of each sequence on this GPU
    m = mb * sc  # tokens per micro-batch on this GPU
    peak = system[S_PEAK_FLOPS]
    hbm = system[S_HBM_BW]
    sms = system[S_SMS]
    ih, ikv, if_, ia, iqw = int(h), int(kv), int(f), int(a), int(qw)
    lin = linear_peak(peak, calib)  # the linear layers' peak in the plan's precision
    im, isc, is_, ib = int(m), int(sc), int(s), int(mb)
    itp = int(tp)

    # GEMMs of one layer (tensor-parallel shard)
    f_qkv, b_qkv = gemm_fwd_bwd_time(im, (iqw + 2 * ikv) // itp, ih, np.int64(1), lin, hbm, sms, calib)
    heads_local = ib * ia // itp
    if flash:  # fused attention: the s x s scores stay on chip
        f_sc, b_sc = fused_attention_fwd_bwd_time(isc, is_, int(d), heads_local, peak, hbm, sms, calib)
        f_av, b_av = f_sc, b_sc
    else:  # unfused: scores written to and read from HBM
        f_sc, b_sc = gemm_fwd_bwd_time(isc, is_, int(d), heads_local, peak, hbm, sms, calib)
        f_av, b_av = gemm_fwd_bwd_time(isc, int(d), is_, heads_local, peak, hbm, sms, calib)
    if flash:  # fused causal attention computes only the blocks on and below the diagonal
        causal = causal_block_fraction(sc, s)
        f_sc *= causal
        b_sc *= causal
        f_av *= causal
        b_av *= causal
    f_o, b_o = gemm_fwd_bwd_time(im, ih, iqw // itp, np.int64(1), lin, hbm, sms, calib)
    f_up, b_up = gemm_fwd_bwd_time(im, (int(nf) - 1) * if_ // itp, ih, np.int64(1), lin, hbm, sms, calib)
    f_dn, b_dn = gemm_fwd_bwd_time(im, ih, if_ // itp, np.int64(1), lin, hbm, sms, calib)
    experts = int(model[M_EXPERTS])
    moe = experts > 1
    routed = 0.0  # token copies of the micro-batch's tokens (mixture of experts)
    received = 0.0  # the copies the busiest rank's experts process: routed x the imbalance
    local = 1
    if moe:  # E/ep local experts, each a batch of c k m ep / E tokens, and the router
        routed = model[M_CAPACITY] * model[M_TOP_K] * m
        received = routed * calib[C_MOE_IMBALANCE]
        local = experts // ep if experts >= ep else 1
        iet = int(et)
        rows = int(math.ceil(received / local)) if iet == itp else int(math.ceil(received * (et / t) / local))
        f_up, b_up = gemm_fwd_bwd_time(rows, (int(nf) - 1) * if_ // iet, ih, local, lin, hbm, sms, calib)
        f_dn, b_dn = gemm_fwd_bwd_time(rows, ih, if_ // iet, local, lin, hbm, sms, calib)
        f_rt, b_rt = gemm_fwd_bwd_time(im // itp, experts, ih, np.int64(1), peak, hbm, sms, calib)
        f_up += f_rt
        b_up += b_rt
        if model[M_SHARED_FFN] > 0.0:  # shared experts: a dense FFN every token passes, tp-sharded
            ifs = int(model[M_SHARED_FFN])
            f_su, b_su = gemm_fwd_bwd_time(im, (int(nf) - 1) * ifs // itp, ih, np.int64(1), lin, hbm, sms, calib)
            f_sd, b_sd = gemm_fwd_bwd_time(im, ih, ifs // itp, np.int64(1), lin, hbm, sms, calib)
            f_up += f_su
            b_up += b_su
            f_dn += f_sd
            b_dn += b_sd
    fwd_gemm = f_qkv + f_sc + f_av + f_o + f_up + f_dn
    bwd_gemm = b_qkv + b_sc + b_av + b_o + b_up + b_dn
    if flash:  # flash attention's backward recomputes the scores on chip, at the backward's efficiency
        bwd_gemm += f_sc / calib[C_ATTN_BWD_EFF]

    # memory-bound kernels: LayerNorms, dropouts, residual adds (replicated across TP ranks
    # unless sequence parallel), the FFN activation, softmax + attention dropout on s x s scores
    replicated = 1.0 / t if sp else 1.0
    norm_drop_res = NORM_DROPOUT_RESIDUAL_BYTES * m * h * replicated
    activation_fn = (2.0 * nf) * m * f / t
    if moe:  # every copy the experts receive goes through its expert's activation (permute: moe_permute_time)
        activation_fn = (2.0 * nf) * received * f / t
        if model[M_SHARED_FFN] > 0.0:
            activation_fn += (2.0 * nf) * m * model[M_SHARED_FFN] / t
    chains = norm_drop_res + activation_fn  # the backward moves twice as much
    if flash:
        attention_fwd = 8.0 * m * h / t
        attention_bwd = 2.0 * attention_fwd
    else:
        score_elements = mb * (a / t) * sc * s
        attention_fwd = SCORE_BYTES[0] * score_elements
        attention_bwd = SCORE_BYTES[1] * score_elements
    # an eager stack runs the norm / activation / residual chains as separate kernels, each
    # reading and writing HBM (often in fp32): the stack's traffic factor over fused kernels
    unfused = eager_chain_factor(model, calib)
    fwd_kernels = unfused * ELEMENTWISE_KERNELS_PER_LAYER
    fwd_elem = memory_bound_time(unfused * chains + attention_fwd, fwd_kernels, hbm, calib)
    bwd_elem = memory_bound_time(unfused * 2.0 * chains + attention_bwd, 2.0 * fwd_kernels, hbm, calib)
    if model[M_ROTARY] > 0.0:  # rotary embeddings of the queries and keys, forward and backward
        rotary = rotary_time(m, h, kv, t, hbm, calib)
        fwd_elem += rotary
        bwd_elem += rotary
    if calib[C_BF16_OPTIMIZER] > 0.0:  # DeepSpeed's BF16_Optimizer: after each micro-batch's backward,
        # its 16-bit gradients are cast and added into the fp32 gradient buffer (update_hp_grads)
        bwd_elem += memory_bound_time(HP_GRAD_ACCUM_BYTES * model[M_PARAMS_LAYER] / t, 1.0, hbm, calib)
    attn_elem = memory_bound_time(attention_fwd, 2.0, hbm, calib)
    if calib[C_CAST_BYTES] > 0.0:  # low precision: quantize the inputs of the four linear layers (forward)
        # and their output gradients (backward), this GPU's share; the experts' inputs per routed copy
        ffn_in = m * (h + f) / t if not moe else received * (h + f) / t + m * (h + model[M_SHARED_FFN]) / t
        cast_fwd = cast_time(m * (h + qw) / t + ffn_in, 4.0, hbm, calib)
        fwd_elem += cast_fwd
        bwd_elem += cast_fwd

    # tensor parallelism: two all-reduces of the layer's activations per pass (with sequence
    # parallelism an all-gather + reduce-scatter pair each, the same ring traffic)
    domain = int(system[S_SCALE_UP_DOMAIN])
    eff = calib[C_NET_EFF]
    bw_up, lat_up = system[S_SCALE_UP_BW], system[S_SCALE_UP_LAT]
    msg = BYTES * m * h
    bw_t, lat_t = out_link(system, itp, np.int64(1))
    if sp:
        one = 2.0 * allgather_time(msg, itp, np.int64(1), domain, bw_up, lat_up, bw_t, lat_t, eff)
    else:
        one = allreduce_time(msg, itp, np.int64(1), domain, bw_up, lat_up, bw_t, lat_t, eff)
    tp_pass = 2.0 * one
    tp_fwd = tp_pass
    tp_bwd = tp_pass
    if tp_overlap and sp and itp > 1:  # all-gathers before QKV / FC1, reduce-scatters after proj / FC2
        half = 0.5 * one
        tp_fwd = tp_overlapped_time(half, itp, f_qkv, f_o, f_up, f_dn, calib[C_OVERLAP_SLOWDOWN])
        tp_bwd = tp_overlapped_time(half, itp, b_qkv, b_o, b_up, b_dn, calib[C_OVERLAP_SLOWDOWN])
    elif calib[C_TP_ASYNC_BWD] > 0.0 and itp > 1:
        tp_bwd = tp_async_backward_time(one, sp, b_qkv, b_up, calib[C_OVERLAP_SLOWDOWN])
    layout_copies = sp_layout_copy_time(m, h, itp, sp, hbm, calib)
    tp_pass += layout_copies
    tp_fwd += layout_copies
    tp_bwd += layout_copies

    # expert parallelism: dispatch and combine (all-to-alls over the ep ranks, gathers over the etp ranks),
    # and the router scores and token permutation around them
    ep_fwd = 0.0
    ep_bwd = 0.0
    moe_fwd = 0.0
    moe_bwd = 0.0
    host_fwd = 0.0  # the MoE layer's host issue time after its tokens-per-expert sync
    host_bwd = 0.0
    if moe:
        dispatch = moe_dispatch_time(system, calib, routed, h, t, et, ep, calib[C_MOE_IMBALANCE])
        ep_fwd = dispatch
        ep_bwd = dispatch + (dispatch if rc == RC_FULL else 0.0)
        moe_fwd, moe_bwd = moe_permute_time(routed, m, h, experts, local, t, et, calib[C_MOE_IMBALANCE], hbm,
                                            calib)
        host_fwd, host_bwd = moe_host_time(local, ep, int(et), calib[C_CAST_BYTES] > 0.0, calib[C_MOE_OP_HOST_S],
                                           calib[C_KERNEL_S])

    # recomputation in the backward pass: the share of the forward's weight GEMMs, element-wise work
    # and TP collectives it repeats (full: all; selective: Megatron's attention core only, a stack's
    # own selective checkpointing, torchtitan or fms-fsdp, also a share of the rest)
    recomputed = 1.0 if rc == RC_FULL else (calib[C_SELECTIVE_SHARE] if rc == RC_SELECTIVE else 0.0)
    recomp_tp = recomputed * tp_fwd
    if rc == RC_FULL:
        recomp = fwd_gemm + fwd_elem
    elif rc == RC_SELECTIVE:
        recomp = recomputed * (fwd_gemm - f_sc - f_av + fwd_elem)
        if not flash:  # the attention core, its scores re-materialised
            recomp += f_sc + f_av + attn_elem
    else:
        recomp = 0.0
    moe_bwd += recomputed * moe_fwd  # the recomputed share of the forward's permutation
    host_bwd += recomputed * host_fwd  # and of its issue (a recomputed forward syncs again)

    # context parallelism: ring attention passes K and V around the cp ranks (and their
    # gradients backward), hidden behind the attention core where it can be
    cp_exposed = 0.0
    cp_fwd = 0.0
    cp_total = 0.0
    if cp > 1:
        kv_bytes = 2.0 * BYTES * mb * sc * kv / t
        bw_c, lat_c = out_link(system, cp, itp)
        fwd_ring = allgather_time(kv_bytes * cp, cp, itp, domain, bw_up, lat_up, bw_c, lat_c, eff)
        core = f_sc + f_av
        cp_fwd = overlapped_exposed(fwd_ring, core, calib[C_OVERLAP_SLOWDOWN])
        cp_exposed = cp_fwd + overlapped_exposed(2.0 * fwd_ring, b_sc + b_av, calib[C_OVERLAP_SLOWDOWN])
        cp_total = 3.0 * fwd_ring

    # activation memory (Korthikanti et al. 2022), per token in units of h bytes
    attn_act = 7.0 + 4.0 * kv / h
    mlp_act = 3.0 + 2.0 * nf * f / h
    if moe:  # the FFN activations of every copy the busiest rank receives, and the dispatched copies themselves
        mlp_act = 3.0 + model[M_CAPACITY] * model[M_TOP_K] * calib[C_MOE_IMBALANCE] * (2.0 * nf * f / h + 2.0)
    per_token = 4.0 + attn_act + mlp_act  # 34 for GPT
    if sp:
        dense = per_token * m * h / t
    else:
        dense = 10.0 * m * h + (per_token - 10.0) * m * h / t
    scores = 4.0 * mb * (a / t) * sc if flash else 5.0 * mb * (a / t) * sc * s
    # transient while one layer runs its backward: the gradients of its activations (one layer,
    # one micro-batch, the size of what it stores without recomputation), plus what it
    # re-materialises (full: the whole layer; selective: the attention scores)
    grads = dense + scores
    if rc == RC_FULL:
        act = BYTES * m * h / (t if sp else 1.0)
        work = grads + dense + scores
    elif rc == RC_SELECTIVE:  # a stack's own selective checkpointing keeps only the input of its
        # recomputed share (as full recomputation) and re-materialises it in the backward
        share = calib[C_SELECTIVE_SHARE]
        act = (1.0 - share) * (dense + (scores if flash else 0.0)) + share * BYTES * m * h / (t if sp else 1.0)
        work = grads + (0.0 if flash else scores) + share * (dense + scores)
    else:
        act = dense + scores
        work = grads

    # output projection + cross-entropy on the last stage (fp32 logits kept for the loss): the
    # stack's loss streams its bytes per logit element of this GPU's vocabulary shard
    f_head, b_head = gemm_fwd_bwd_time(im, int(vocab) // itp, ih, np.int64(1), peak, hbm, sms, calib)
    logits = m * vocab / t
    loss_fwd = memory_bound_time(calib[C_LOSS_FWD_BYTES] * logits, calib[C_LOSS_FWD_KERNELS], hbm, calib)
    loss_bwd = memory_bound_time(calib[C_LOSS_BWD_BYTES] * logits, calib[C_LOSS_BWD_KERNELS], hbm, calib)

    # FLOPs of the whole layer (all TP and CP ranks) for the micro-batch
    tokens = mb * s
    flops_fwd = (2.0 * tokens * h * (qw + 2.0 * kv) + 2.0 * tokens * qw * h + 2.0 * nf * tokens * h * f
                 + 4.0 * mb * s * s * qw)
    if moe:  # top-k experts per token, the shared experts and the router
        flops_fwd = (2.0 * tokens * h * (qw + 2.0 * kv) + 2.0 * tokens * qw * h
                     + 2.0 * nf * tokens * h * f * model[M_TOP_K] + 2.0 * tokens * h * experts
                     + 2.0 * nf * tokens * h * model[M_SHARED_FFN] + 4.0 * mb * s * s * qw)
    if rc == RC_FULL:
        flops_recomp = flops_fwd
    elif rc == RC_SELECTIVE:
        flops_recomp = 4.0 * mb * s * s * qw + calib[C_SELECTIVE_SHARE] * (flops_fwd - 4.0 * mb * s * s * qw)
    else:
        flops_recomp = 0.0

    # the host issues every kernel: a pass takes at least the stack's host time per layer (the
    # backward issues twice the forward's kernels, and the recomputed forward's too); what the GPU
    # work does not cover is idle time, counted with the element-wise work (not as HBM traffic)
    host = calib[C_LAYER_HOST_S]
    fwd_idle = max(0.0, host - (fwd_gemm + fwd_elem + tp_fwd + ep_fwd + cp_fwd + moe_fwd))
    bwd_host = (3.0 if rc == RC_FULL else 2.0) * host
    bwd_idle = max(0.0, bwd_host - (bwd_gemm + bwd_elem + tp_bwd + ep_bwd + recomp + recomp_tp
                                    + cp_exposed - cp_fwd + moe_bwd))

    out[L_FWD_GEMM] = fwd_gemm
    out[L_FWD_ELEM] = fwd_elem + fwd_idle
    out[L_FWD_TP] = tp_fwd
    out[L_BWD_GEMM] = bwd_gemm
    out[L_BWD_ELEM] = bwd_elem + bwd_idle
    out[L_BWD_TP] = tp_bwd
    out[L_RECOMP] = recomp
    out[L_RECOMP_TP] = recomp_tp
    out[L_CP] = cp_exposed
    out[L_ACT_BYTES] = act
    out[L_WORK_BYTES] = work
    out[L_HEAD_FWD] = f_head + loss_fwd
    out[L_HEAD_BWD] = b_head + loss_bwd
    out[L_HEAD_BYTES] = 4.0 * m * vocab / t
    out[L_FLOPS_FWD] = flops_fwd
    out[L_FLOPS_RECOMP] = flops_recomp
    out[L_FLOPS_HEAD] = 2.0 * tokens * h * vocab
    out[L_HBM_TIME] = fwd_elem + bwd_elem + (fwd_elem if rc == RC_FULL else 0.0) + moe_fwd + moe_bwd
    out[L_FWD_EP] = ep_fwd
    out[L_BWD_EP] = ep_bwd
    out[L_FWD_MOE] = moe_fwd
    out[L_BWD_MOE] = moe_bwd
    out[L_FWD_MOE_HOST] = host_fwd
    out[L_BWD_MOE_HOST] = host_bwd
    # traffic before overlap: forward, backward (Megatron's and Transformer Engine's sequence-parallel
    # backward re-gathers each column-parallel input: half a pass more), recomputed share
    regather = 0.5 if (sp and itp > 1 and calib[C_TP_ASYNC_BWD] > 0.0) else 0.0
    out[L_TP_TOTAL] = (2.0 + regather + recomputed) * tp_pass
    out[L_CP_TOTAL] = cp_total
    out[L_CP_FWD] = cp_fwd


@njit(cache=True)
def layer_fwd_bwd(lc):
    """(forward, backward) seconds of one layer and micro-batch from its costs ``lc``: the backward
    includes the recomputation and its tensor-parallel communication (and, for a mixture of
    experts, each pass its dispatch and combine, its router and permutation and its exposed host issue)."""
    fwd = lc[L_FWD_GEMM] + lc[L_FWD_ELEM] + lc[L_FWD_TP] + lc[L_FWD_EP] + lc[L_FWD_MOE] + lc[L_FWD_MOE_HOST]
    bwd = (lc[L_BWD_GEMM] + lc[L_BWD_ELEM] + lc[L_BWD_TP] + lc[L_RECOMP] + lc[L_RECOMP_TP] + lc[L_BWD_EP]
           + lc[L_BWD_MOE] + lc[L_BWD_MOE_HOST])
    return fwd, bwd


@njit(cache=True)
def power_draw(idle_w, tdp_w, compute_share, memory_share, gemm_busy_s, hbm_busy_s, step_s):
    """Accelerator power: idle plus dynamic power in proportion to the time the tensor cores and
    HBM are busy, ``P = P_idle + (P_TDP - P_idle) min(1, a_c t_GEMM / T + a_m t_HBM / T)``."""
    use = (compute_share * gemm_busy_s + memory_share * hbm_busy_s) / step_s
    if use > 1.0:
        use = 1.0
    return idle_w + (tdp_w - idle_w) * use


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
def stage_layers(layers, pp, v):
    """Layers on (first, middle-most loaded, last) device: chunks differ by at most one layer
    and the extra layers go to middle stages first, leaving room for embedding and logits."""
    chunks = pp * v
    base = layers // chunks
    rem = layers - base * chunks
    even = v * base
    if pp == 1:
        return layers, layers, layers
    if pp == 2:
        return even + (rem + 1) // 2, even + (rem + 1) // 2, even + rem // 2
    capacity = (pp - 2) * v
    if rem <= capacity:
        middle = even + (rem + pp - 3) // (pp - 2)
        return even, middle, even
    left = rem - capacity
    return even + (left + 1) // 2, even + v, even + left // 2


@njit(cache=True)
def chunk_layers(layers, pp, v):
    """Layers of every model chunk, ``[v, pp]`` (chunk c of device d is virtual stage c*pp + d).

    The extra layers of an uneven split go one per chunk to the middle devices first, round
    robin, then to the first and last devices: the per-device totals are :func:`stage_layers`'."""
    out = np.full((v, pp), layers // (pp * v), dtype=np.int64)
    rem = layers - (layers // (pp * v)) * pp * v
    order = np.empty(pp, dtype=np.int64)  # devices in the order they take extra layers
    k = 0
    for d in range(1, pp - 1):
        order[k] = d
        k += 1
    if pp == 1:
        order[0] = 0
    else:
        order[k] = 0
        order[k + 1] = pp - 1
    # middle devices: round robin over devices, one extra per chunk
    n_mid = pp - 2 if pp > 2 else 0
    i = 0
    while rem > 0 and i < n_mid * v:
        out[i // n_mid, order[i % n_mid]] += 1
        rem -= 1
        i += 1
    # then the ends (first gets the odd one), one extra per chunk
    j = 0
    n_end = pp - n_mid
    while rem > 0:
        out[j // n_end, order[n_mid + j % n_end]] += 1
        rem -= 1
        j += 1
    return out


# --------------------------------------------------------------------------- uneven pipeline splits
# ``ends`` bits of a split: the embedding (1) and the loss (2) counted as layers in the split
ENDS_EMBEDDING = 1
ENDS_LOSS = 2


@njit(cache=True)
def structural_reason(model, gpus, tp, pp, dp, cp, v, mb, gb, shard, ep, even_split, first=0, last=0, ends=0,
                      etp=0):
    """:func:`plan_reason` with the pipeline split: a split given explicitly (``first``, ``last``, ``ends``)
    replaces the stack's even-split rule by Megatron-Core's rules (:func:`split_reason`)."""
    explicit = first != 0 or last != 0 or ends != 0
    reason = plan_reason(model, gpus, tp, pp, dp, cp, v, mb, gb, shard, ep, even_split and not explicit, etp)
    if reason == R_OK and explicit:
        reason = split_reason(int(model[M_LAYERS]), pp, v, first, last, ends)
    return reason


@njit(cache=True)
def split_reason(layers, pp, v, first, last, ends):
    r"""Whether Megatron-Core builds the split ``first`` / ``last`` (layers of the first and last
    device, 0: not given) or ``ends`` (:data:`ENDS_EMBEDDING` | :data:`ENDS_LOSS`: the embedding and
    the loss each counted as one layer of the split): ``R_OK`` or ``R_UNEVEN_CHUNKS``.

    The rules of NVIDIA/Megatron-LM d98e8a6 (2026-08), ``TransformerConfig.__post_init__`` in
    megatron/core/transformer/transformer_config.py: a given end count is ``> 0`` and, interleaved, a
    multiple of ``v``; the ``L_mid = L - first - last`` other layers split evenly over the ``p_mid``
    other devices (none left over when there are none), ``L_mid / p_mid`` a multiple of ``v``. With
    ``ends``, ``(L + e + l) / p`` layers per device, a multiple of ``v``, and the end counts may not be
    given as well; no chunk may be left with fewer than one layer (Megatron allows an empty one; a
    chunk without layers is not priced here)."""
    if pp <= 1:
        return R_OK if first == 0 and last == 0 and ends == 0 else R_UNEVEN_CHUNKS
    if ends != 0:
        if first != 0 or last != 0:
            return R_UNEVEN_CHUNKS
        total = layers + (1 if ends & ENDS_EMBEDDING else 0) + (1 if ends & ENDS_LOSS else 0)
        if total % pp != 0 or (total // pp) % v != 0 or total // (pp * v) < 2:
            return R_UNEVEN_CHUNKS
        return R_OK
    rest = layers - first - last
    devices = pp - (1 if first > 0 else 0) - (1 if last > 0 else 0)
    if first < 0 or last < 0 or first % v != 0 or last % v != 0 or rest < 0:
        return R_UNEVEN_CHUNKS
    if devices == 0:
        return R_OK if rest == 0 else R_UNEVEN_CHUNKS
    if rest == 0 or rest % devices != 0 or (rest // devices) % v != 0:
        return R_UNEVEN_CHUNKS
    return R_OK


@njit(cache=True)
def split_chunk_layers(layers, pp, v, first, last, ends):
    """Layers of every model chunk, ``[v, pp]`` (chunk c of device d is virtual stage c*pp + d), of a
    valid split (:func:`split_reason`).

    Without a split (all 0) the stack's default: :func:`chunk_layers`. Otherwise Megatron-Core's
    ``get_num_layers_to_build`` (megatron/core/transformer/transformer_block.py, d98e8a6): every
    chunk of a device holds its device's layers / ``v``; the first device ``first`` layers, the last
    ``last``, the others an even share of the rest; with ``ends``, ``(L + e + l) / (p v)`` layers per
    chunk, one fewer in the first chunk of the first device (the embedding) and in the last chunk of
    the last device (the loss)."""
    if first == 0 and last == 0 and ends == 0:
        return chunk_layers(layers, pp, v)
    out = np.empty((v, pp), dtype=np.int64)
    if ends != 0:
        total = layers + (1 if ends & ENDS_EMBEDDING else 0) + (1 if ends & ENDS_LOSS else 0)
        out[:, :] = total // (pp * v)
        if ends & ENDS_EMBEDDING:
            out[0, 0] -= 1
        if ends & ENDS_LOSS:
            out[v - 1, pp - 1] -= 1
        return out
    devices = pp - (1 if first > 0 else 0) - (1 if last > 0 else 0)
    middle = (layers - first - last) // devices if devices > 0 else 0
    for d in range(pp):
        n = middle
        if d == 0 and first > 0:
            n = first
        elif d == pp - 1 and last > 0:
            n = last
        out[:, d] = n // v
    return out


@njit(cache=True)
def split_stage_layers(layers, pp, v, first, last, ends):
    """(first, most loaded middle, last) device's layers of a split (:func:`stage_layers` without
    one); the middle is the first device with the most layers among devices 1..p-2."""
    if first == 0 and last == 0 and ends == 0:
        return stage_layers(layers, pp, v)
    per_device = split_chunk_layers(layers, pp, v, first, last, ends).sum(axis=0)
    mid = per_device[0]
    for d in range(1, pp - 1):
        if d == 1 or per_device[d] > mid:
            mid = per_device[d]
    return per_device[0], mid, per_device[pp - 1]


@njit(cache=True, inline="always")
def interleaved_op(p, v, d, step, forward):
    """(chunk, micro-batch) of forward or backward micro-step ``step`` of device ``d`` in Megatron's
    interleaved schedule (the order of :func:`trainscale.kernels.pipeline.build_orders`)."""
    chunk = (step // p) % v
    if not forward:
        chunk = v - 1 - chunk
    return chunk, (step // (p * v)) * p + step % p


@njit(cache=True)
def held_layers(chunks, p, v, m, d):
    r"""Most layer-micro-batches of activations device ``d`` holds at once (``chunks``: layers per
    chunk, ``[v, p]``), in 1F1B (``v`` = 1) or Megatron's interleaved 1F1B.

    1F1B: device ``d`` runs ``min(m, p - d)`` forwards before its first backward, so it holds
    ``min(m, p - d) L_d`` (Korthikanti et al. 2022, Sec. 4.2.3). Interleaved: ``w_d = \min(mv,
    2(p - d - 1) + (v - 1) p)`` warm-up forwards of chunks ``(j // p) mod v``, then forward/backward
    pairs whose backward chunks run in reverse: the peak is reached within the warm-up, its first
    pair and one period of ``p v`` pairs (both chunk sequences repeat with that period, each chunk
    ``p`` times), which this replays. With equal chunks the warm-up gives

    .. math:: \frac{L_d}{v} \min\left(mv,\; pv + p - 2d - 1\right),

    for ``d = 0`` Megatron's ``p L_0 (1 + (p-1)/(pv))`` (megatron/training/theoretical_memory_usage.py)."""
    if v == 1:
        return (m if m < p - d else p - d) * chunks[0, d]
    total = m * v
    warm = 2 * (p - d - 1) + (v - 1) * p
    warm = warm if warm < total else total
    held = 0
    for j in range(warm):
        held += chunks[interleaved_op(p, v, d, j, True)[0], d]
    peak = held
    pairs = total - warm
    pairs = pairs if pairs < p * v + 1 else p * v + 1
    for i in range(pairs):
        held += chunks[interleaved_op(p, v, d, warm + i, True)[0], d]
        peak = held if held > peak else peak
        held -= chunks[interleaved_op(p, v, d, i, False)[0], d]
    return peak



@njit(cache=True)
def zero3_tensor_params(model, i):
    """Parameters of weight matrix ``i`` (forward order) of one layer, the unit DeepSpeed's ZeRO-3
    gathers: with ``model[M_TENSORS_LAYER]`` = 4, Megatron's fused layout (QKV, projection, the
    FFN's input matrices fused, its output matrix); otherwise Q, K, V, O and the FFN's matrices."""
    h = model[M_HIDDEN]
    kv = model[M_KV_HEADS] * h / model[M_HEADS]
    f = model[M_FFN]
    if int(model[M_TENSORS_LAYER]) == 4:
        if i == 0:
            return h * (h + 2.0 * kv)
        if i == 1:
            return h * h
        if i == 2:
            return (model[M_FFN_MATS] - 1.0) * h * f
        return h * f
    if i == 0 or i == 3:
        return h * h
    if i < 3:
        return kv * h
    return h * f


@njit(cache=True)
def zero3_layer_time(model, system, calib, tp, cp, ep, n_shard, e_shard, per_tensor):
    """ZeRO-3 / FSDP communication of one layer and micro-batch, before any overlap:
    ``(gather_s, reduce_scatter_s, end_gathers_s)``, the last for the embedding (or output layer)
    of an end stage.

    A layer's parameters are all-gathered before every use (forward, backward, and the recomputed
    forward) and its gradients reduce-scattered (in ``calib[C_GRAD_BYTES]`` bytes each: torchtitan
    reduces in fp32), per micro-batch. PyTorch FSDP gathers a layer as
    one flat buffer; DeepSpeed's ZeRO-3 (``per_tensor``) fetches each weight matrix separately
    (:func:`zero3_tensor_gather_time`). This form scales with bytes: the published 175B ZeRO-3
    runs (Narayanan et al. 2021, 384-1536 A100) take about as long as every GPU receiving its
    full share of the parameters through its own NIC in each pass, while a cost per tensor
    alone (the form used until 2026-12) fits those three runs but cannot carry to other sizes.
    """
    if n_shard * cp <= 1:
        return 0.0, 0.0, 0.0
    domain = int(system[S_SCALE_UP_DOMAIN])
    eff = calib[C_NET_EFF]
    bw_up, lat_up = system[S_SCALE_UP_BW], system[S_SCALE_UP_LAT]
    t = float(tp)
    group = n_shard * cp
    layer_bytes = BYTES * model[M_PARAMS_LAYER] / t
    bw_z, lat_z = out_link(system, group, tp)
    grad_scale = calib[C_GRAD_BYTES] / BYTES  # gradients reduced in the stack's or plan's precision
    if per_tensor:
        gather = 0.0
        for i in range(int(model[M_TENSORS_LAYER])):
            gather += zero3_tensor_gather_time(model, system, calib, tp, group, i)
    else:
        gather = allgather_time(layer_bytes, group, tp, domain, bw_up, lat_up, bw_z, lat_z, eff)
    scatter = allgather_time(grad_scale * layer_bytes, group, tp, domain, bw_up, lat_up, bw_z, lat_z, eff)
    if model[M_EXPERTS] > 1.0 and e_shard * cp > 1:  # local experts, over the expert-data-parallel ranks
        e_group = e_shard * cp
        e_bytes = BYTES * model[M_PARAMS_EXPERTS] / (t * ep)
        bw_e, lat_e = out_link(system, e_group, tp * ep)
        gather += allgather_time(e_bytes, e_group, tp * ep, domain, bw_up, lat_up, bw_e, lat_e, eff)
        scatter += allgather_time(grad_scale * e_bytes, e_group, tp * ep, domain, bw_up, lat_up, bw_e, lat_e, eff)
    embed_bytes = BYTES * model[M_PARAMS_EMBED] / t
    per_end = 3.0 * allgather_time(embed_bytes, group, tp, domain, bw_up, lat_up, bw_z, lat_z, eff)
    return gather, scatter, per_end


@njit(cache=True)
def zero3_tensor_allgather_time(model, system, calib, tp, group, i):
    """The all-gather of weight matrix ``i`` (:func:`zero3_tensor_params`) over the ``group``
    sharding ranks. A fetch is a collective of one tensor, for which NCCL opens few channels: it
    moves at one NIC's bandwidth, not the node's NICs pooled as a large flat-buffer gather does."""
    domain = int(system[S_SCALE_UP_DOMAIN])
    bw_z, lat_z = out_link(system, group, tp)
    n_in, _ = group_split(group, tp, domain)
    nbytes = BYTES * zero3_tensor_params(model, i) / tp
    return allgather_time(nbytes, group, tp, domain, system[S_SCALE_UP_BW], system[S_SCALE_UP_LAT], bw_z / n_in,
                          lat_z, calib[C_NET_EFF])


@njit(cache=True)
def zero3_tensor_gather_time(model, system, calib, tp, group, i):
    """One DeepSpeed ZeRO-3 fetch of weight matrix ``i``: its all-gather
    (:func:`zero3_tensor_allgather_time`) plus the host-side cost ``calib[C_FETCH_S]`` (hooks,
    issue, re-partition)."""
    return zero3_tensor_allgather_time(model, system, calib, tp, group, i) + calib[C_FETCH_S]


@njit(cache=True)
def zero3_tensor_windows(model, system, calib, tp, group, fwd_s, recomp_s, bwd_s, slowdown):
    """Exposed seconds ``(forward, backward)`` of DeepSpeed's ZeRO-3 in one layer and micro-batch,
    its fetches pipelined one weight matrix ahead.

    DeepSpeed's ZeRO-3 (``stage3.py``, v0.3.13-0.5, 2021: the code of the published 175B runs'
    time) fetches a sub-module's parameters in its pre-forward (pre-backward) hook and waits for
    them with ``torch.cuda.synchronize()``, then prefetches the next parameters only when no
    fetch is in flight, up to ``stage3_prefetch_bucket_size`` (default 5e7 elements, less than
    one of these matrices: one matrix ahead). Each matrix's computation therefore runs beside
    the next matrix's fetch and nothing else, and the device synchronisation also waits for the
    gradient reduce-scatter launched by the matrix before (backward). DeepSpeed's own traces show
    it: "the prefetching only partially overlaps with computation", only the next module being
    prefetched (microsoft/DeepSpeed#1170, July 2021); the coordinator was rewritten in January
    2022 (#1453). With weight matrices
    ``i`` of parameter share ``p_i`` (their GEMMs' share of a pass's work ``W``), the pass takes

    .. math:: \\sum_i W p_i + \\mathrm{exposed}(c_i, W p_i) + h,

    with ``c_i`` the next matrix's gather (and, backward, the previous one's reduce-scatter),
    ``exposed`` :func:`overlapped_exposed` and ``h`` the host cost of a fetch (paid after the
    synchronisation, while the GPU waits). ``recomp_s``: the recomputed forward inside the
    backward (0 without full recomputation), priced as a forward. Exact where every matrix holds
    at least the bucket's 5e7 elements (GPT's projection, h^2: hidden 7,072 and up); for smaller
    models a bucket spans several matrices, which this prices pessimistically. Not modelled:
    ``stage3_max_live_parameters`` (1e9 by default) skips the prefetch while more is gathered,
    which would expose the fetches beside 530B's 1.3-1.7e9-element matrices; the never-fitted
    530B runs agree without it (their settings are not published)."""
    n = int(model[M_TENSORS_LAYER])
    domain = int(system[S_SCALE_UP_DOMAIN])
    bw_z, lat_z = out_link(system, group, tp)
    total = 0.0
    for i in range(n):
        total += zero3_tensor_params(model, i)
    grad_scale = calib[C_GRAD_BYTES] / BYTES
    fetch_s = calib[C_FETCH_S]
    fwd = 0.0
    bwd = 0.0
    for i in range(n):
        share = zero3_tensor_params(model, i) / total
        nxt = zero3_tensor_allgather_time(model, system, calib, tp, group, (i + 1) % n)
        prev = zero3_tensor_allgather_time(model, system, calib, tp, group, (i - 1 + n) % n)
        after = BYTES * grad_scale * zero3_tensor_params(model, (i + 1) % n) / tp  # its gradients
        scatter = allgather_time(after, group, tp, domain, system[S_SCALE_UP_BW], system[S_SCALE_UP_LAT], bw_z,
                                 lat_z, calib[C_NET_EFF])
        fwd += overlapped_exposed(nxt, fwd_s * share, slowdown) + fetch_s
        if recomp_s > 0.0:
            bwd += overlapped_exposed(nxt, recomp_s * share, slowdown) + fetch_s
        bwd += overlapped_exposed(prev + scatter, bwd_s * share, slowdown) + fetch_s
    return fwd, bwd


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
def dp_sync_time(system, calib, params, grad_bytes, group_ranks, stride, n_shard, dp_replicas, zero):
    """Gradient synchronisation of one step for ``params`` parameters over ``group_ranks``
    data-parallel ranks ``stride`` apart: ``(reduce_s, gather_s)``.

    ZeRO 0: an all-reduce of the gradients (``grad_bytes`` each). ZeRO 1-2: a reduce-scatter of the
    gradients and, after the optimizer step, an all-gather of the updated 16-bit weights, in the
    shard group of ``n_shard`` ranks (ZeRO 3 gathers and reduces per layer instead, see
    :func:`zero3_layer_time`). An optimizer that shards its states but reduces every gradient
    everywhere (``calib[C_BF16_OPTIMIZER]`` = 1: DeepSpeed's BF16_Optimizer, whose engine passes
    ``get_grads_for_reduction()`` to ``buffered_allreduce_fallback``) all-reduces instead of
    reduce-scattering, twice the bytes on the wire. With hybrid sharding (``dp_replicas`` > 1) the
    shards are also all-reduced across the replicas (counted with the reduction)."""
    domain = int(system[S_SCALE_UP_DOMAIN])
    eff = calib[C_NET_EFF]
    bw_up, lat_up = system[S_SCALE_UP_BW], system[S_SCALE_UP_LAT]
    if zero == 0:
        bw_d, lat_d = out_link(system, group_ranks, stride)
        return allreduce_time(grad_bytes * params, group_ranks, stride, domain, bw_up, lat_up, bw_d, lat_d,
                              eff), 0.0
    shard_ranks = group_ranks // dp_replicas if dp_replicas > 0 else group_ranks
    reduce = 0.0
    gather = 0.0
    if zero <= 2:
        bw_d, lat_d = out_link(system, shard_ranks, stride)
        if calib[C_BF16_OPTIMIZER] > 0.0:
            reduce = allreduce_time(grad_bytes * params, shard_ranks, stride, domain, bw_up, lat_up, bw_d, lat_d,
                                    eff)
        else:
            reduce = allgather_time(grad_bytes * params, shard_ranks, stride, domain, bw_up, lat_up, bw_d, lat_d,
                                    eff)
        gather = allgather_time(BYTES * params, shard_ranks, stride, domain, bw_up, lat_up, bw_d, lat_d, eff)
    if dp_replicas > 1:
        rstride = stride * shard_ranks
        bw_d, lat_d = out_link(system, dp_replicas, rstride)
        reduce += allreduce_time(grad_bytes * params / n_shard, dp_replicas, rstride, domain, bw_up, lat_up, bw_d,
                                 lat_d, eff)
    return reduce, gather


@njit(cache=True)
def state_bytes_per_param(zero, shard_ranks, grad_bytes):
    """(weights, gradients, optimizer) bytes per parameter of a GPU's stage under ZeRO stage
    ``zero`` sharded over ``shard_ranks``: 16-bit weights, gradients of ``grad_bytes`` (2, or 4 for
    Megatron's fp32 main gradients), 12 bytes of fp32 master weights and Adam moments (the ZeRO
    paper's ``2 + 2 + K``, K = 12); stage 1 shards the optimizer, 2 also the gradients, 3 also the
    weights (ZeRO paper, Sec. 5)."""
    w = BYTES / shard_ranks if zero == 3 else BYTES
    g = grad_bytes / shard_ranks if zero >= 2 else grad_bytes
    o = OPTIMIZER_BYTES_PER_PARAM / shard_ranks if zero >= 1 else OPTIMIZER_BYTES_PER_PARAM
    return w, g, o


@njit(cache=True)
def middle_device(chunks):
    """The middle device (1..p-2) with the most layers, the first of them (the most in flight)."""
    per_device = chunks.sum(axis=0)
    best = 1
    for d in range(2, chunks.shape[1] - 1):
        if per_device[d] > per_device[best]:
            best = d
    return best


@njit(cache=True)
def stage_activation_bytes(act, chunks, pp, v, micro, d):
    """Activation bytes device ``d`` holds at its peak: ``act`` bytes per layer and micro-batch
    times :func:`held_layers` (in 1F1B written ``act L_d min(m, p - d)``, the order of operations
    of the closed form before uneven splits, so that even plans price to the bit as before)."""
    if v == 1:
        return act * chunks[0, d] * (micro if micro < pp - d else pp - d)
    return act * held_layers(chunks, pp, v, micro, d)


# rows of a pipeline's memory shape (:func:`pipeline_memory_shape`): the first, most loaded middle and last device
SHAPE_STAGES = 3


@njit(cache=True)
def pipeline_memory_shape(layers, pp, v, micro, first, last, ends, shape):
    """What :func:`memory_components` needs of the pipeline, into ``shape[SHAPE_STAGES, 3]`` (int64): per candidate
    device (first, most loaded middle, last; pp > 1) its layers and the two factors of its activations, ``act *
    shape[k, 1] * shape[k, 2]`` in 1F1B (:func:`stage_activation_bytes`' ``L_d`` and ``min(m, p - d)``), ``act *
    shape[k, 1]`` interleaved (:func:`held_layers`). It depends on the layout only (layers, pp, v, micro-batches
    and the split), so the search computes it once per layout, not once per plan
    (:func:`trainscale.kernels.grid.scan_layouts`); ``shape[0, 0] = -1`` marks it not computed."""
    if pp == 1:
        shape[:, :] = 0
        shape[0, 0] = layers
        return
    chunks = split_chunk_layers(layers, pp, v, first, last, ends)
    l_first, l_mid, l_last = split_stage_layers(layers, pp, v, first, last, ends)
    for k in range(SHAPE_STAGES):
        if k == 0:
            d, n_l = 0, l_first
        elif k == 1:
            d, n_l = (middle_device(chunks) if pp > 2 else pp - 1), l_mid
        else:
            d, n_l = pp - 1, l_last
        shape[k, 0] = n_l
        if v == 1:
            shape[k, 1] = chunks[0, d]
            shape[k, 2] = micro if micro < pp - d else pp - d
        else:
            shape[k, 1] = held_layers(chunks, pp, v, micro, d)
            shape[k, 2] = 1


@njit(cache=True)
def memory_components(model, calib, lc, pp, v, micro, zero, shard_ranks, e_shard_ranks, ep, tp, out,
                      per_tensor=False, first=0, last=0, ends=0, etp=0):
    """:func:`shaped_memory_components` with the pipeline's shape computed here (:func:`pipeline_memory_shape`)."""
    shape = np.empty((SHAPE_STAGES, 3), dtype=np.int64)
    pipeline_memory_shape(int(model[M_LAYERS]), pp, v, micro, first, last, ends, shape)
    return shaped_memory_components(model, calib, lc, pp, v, zero, shard_ranks, e_shard_ranks, ep, tp, out,
                                    per_tensor, etp, shape)


@njit(cache=True)
def shaped_memory_components(model, calib, lc, pp, v, zero, shard_ranks, e_shard_ranks, ep, tp, out, per_tensor, etp,
                             shape):
    """Per-GPU memory of the most loaded pipeline stage, by component, into ``out[O_MEM_*]``;
    returns the total (bytes).

    Candidates are the first device (the embedding), the most loaded middle one (device 1 of the
    most layers) and the last (the output layer), each with its layers of the split (``first``,
    ``last``, ``ends``: :func:`split_chunk_layers`). Device ``d`` holds the activations of
    :func:`held_layers` layer-micro-batches: ``min(m, p - d)`` micro-batches of its layers in 1F1B
    (Korthikanti et al. 2022 Sec. 4.2.3), its warm-up's chunks in interleaved 1F1B (the first device
    ``1 + (p-1)/(p v)`` times ``p``, the last ``(v - 1) p + 1`` chunks, not one micro-batch). The last
    device keeps the logits of one micro-batch of its last chunk in flight. Expert parameters (mixture of
    experts) are sharded over the expert-data-parallel ranks. DeepSpeed's BF16_Optimizer
    (``calib[C_BF16_OPTIMIZER]`` = 1, ZeRO 0-1) holds the 16-bit gradients of every parameter as well
    as its fp32 accumulation buffer: its pipeline engine only zeroes them between micro-batches
    (``clear_lp_grads``, then ``update_hp_grads(clear_lp_grads=False)``), 2 more bytes per parameter.
    ZeRO-3 holds gathered weights beyond its shard: FSDP the layer in use and the prefetched next
    one; DeepSpeed (``per_tensor``, dense layers) the weight matrix in use and the next one
    (:func:`zero3_tensor_windows`). Experts are split over ``ep x etp`` GPUs (``etp`` 0: ``tp``).
    A low-precision plan holds its quantized weight copies beside the 16-bit weights
    (``calib[C_LP_WEIGHT_BYTES]`` per parameter, unsharded: every GPU quantizes what it computes with).
    """
    layers = int(model[M_LAYERS])
    t = float(tp)
    p_layer = model[M_PARAMS_LAYER] / t
    et = float(etp) if etp > 0 else t
    pe_layer = model[M_PARAMS_EXPERTS] / (et * ep) if model[M_EXPERTS] > 1.0 else 0.0
    w, g, o = state_bytes_per_param(zero, shard_ranks, calib[C_GRAD_BYTES])
    we, ge, oe = state_bytes_per_param(zero, e_shard_ranks, calib[C_GRAD_BYTES])
    if calib[C_LP_WEIGHT_BYTES] > 0.0:
        w += calib[C_LP_WEIGHT_BYTES]
        we += calib[C_LP_WEIGHT_BYTES]
    if calib[C_BF16_OPTIMIZER] > 0.0 and zero <= 1:
        g += BYTES
        ge += BYTES
    act = lc[L_ACT_BYTES]
    best = -1.0
    # candidate stages: first, middle-most loaded, last (one stage when pp == 1)
    n_stages = 1 if pp == 1 else (3 if pp > 2 else 2)
    for k in range(n_stages):
        if pp == 1:
            n_l = layers
            dense = layers * p_layer + (model[M_PARAMS_EMBED] + model[M_PARAMS_HEAD]) / t
            a = act * layers + lc[L_HEAD_BYTES]
            k_shape = 0
        else:  # the same operations, in the same order, as stage_activation_bytes
            k_shape = k if pp > 2 or k == 0 else 2
            n_l = shape[k_shape, 0]
            a = act * shape[k_shape, 1] * shape[k_shape, 2] if v == 1 else act * shape[k_shape, 1]
            if k_shape == 0:
                dense = n_l * p_layer + model[M_PARAMS_EMBED] / t
            elif k_shape == 1:
                dense = n_l * p_layer
            else:
                dense = n_l * p_layer + model[M_PARAMS_HEAD] / t
                a = a + lc[L_HEAD_BYTES]
        experts = n_l * pe_layer
        weights = dense * w + experts * we
        grads = dense * g + experts * ge
        optim = dense * o + experts * oe
        if weights + grads + optim + a > best:
            best = weights + grads + optim + a
            out[O_MEM_WEIGHTS] = weights
            out[O_MEM_GRADS] = grads
            out[O_MEM_OPTIMIZER] = optim
            out[O_MEM_ACTIVATIONS] = a
    buffers = 0.0
    if zero == 3 and per_tensor and pe_layer == 0.0:  # the matrix in use and the prefetched next one
        n = int(model[M_TENSORS_LAYER])
        for i in range(n):
            pair = BYTES * (zero3_tensor_params(model, i) + zero3_tensor_params(model, (i + 1) % n)) / t
            buffers = pair if pair > buffers else buffers
    elif zero == 3:  # the layer in use and the prefetched next one
        buffers = 2.0 * BYTES * (p_layer + pe_layer)
    out[O_MEM_TRANSIENT] = lc[L_WORK_BYTES]
    out[O_MEM_BUFFERS] = buffers
    out[O_MEM_RESERVED] = calib[C_RESERVED_BYTES]
    return best + lc[L_WORK_BYTES] + buffers + calib[C_RESERVED_BYTES]


@njit(cache=True)
def plan_costs(model, system, calib, lc, gpus, tp, pp, dp, cp, v, mb, gb, rc, zero, shard,
               overlap, per_tensor, out, ep=1, first=0, last=0, ends=0, etp=0):
    """Fill ``out`` (layout ``O_*``) with the step time, its breakdown, FLOPs, memory and power
    of one plan, given its layer costs ``lc`` from :func:`layer_costs` (priced with the same ``ep``
    and ``etp``). ``first``, ``last``, ``ends``: the pipeline split (:func:`split_chunk_layers`; all 0: the
    stack's default, which on a stack that builds even chunks needs pp·v to divide the layers). A
    low-precision plan quantizes its weights once per step (the first micro-batch's copies are reused, as
    Transformer Engine does), counted with the optimizer step."""
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
    """:func:`plan_memory` with the layout's :func:`pipeline_memory_shape` in ``shape`` (computed here when
    ``shape[0, 0]`` is -1, else taken as the shape of this plan's layout): a caller that prices many plans of one
    layout passes the same ``shape`` to all of them, and nothing is allocated per plan."""
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
    p_last = l_last * p_layer + model[M_PARAMS_HEAD] / tp
    if pp == 1:
        p_first = layers * p_layer + (model[M_PARAMS_EMBED] + model[M_PARAMS_HEAD]) / tp
        p_last = p_first
    p_dev = max(p_first, p_last)
    pe_layer = model[M_PARAMS_EXPERTS] / (et * ep) if moe else 0.0
    pe_dev = max(l_first, max(l_mid, l_last)) * pe_layer

    # data-parallel gradient synchronisation, once per step (over dp x cp ranks, tp apart); the
    # expert gradients over the expert-data-parallel ranks (tp*ep apart); in the stack's gradient precision
    g_bytes = calib[C_GRAD_BYTES]
    dp_reduce, dp_gather = dp_sync_time(system, calib, p_dev, g_bytes, dp * cp, tp, n_shard, dp // n_shard, zero)
    if moe:
        e_reduce, e_gather = dp_sync_time(system, calib, pe_dev, g_bytes, e_dp * cp, et * ep, e_shard,
                                          e_replicas, zero)
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
