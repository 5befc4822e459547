r"""One transformer layer for one micro-batch on one GPU: :func:`layer_costs` fills the layer's costs
(``L_*``). It depends only on tp, cp, micro-batch, recomputation, sequence parallelism and flash
attention, so a grid evaluates it once per distinct combination;
:func:`trainscale.kernels.plan.plan_costs` assembles a whole step from it.

Per-layer FLOPs (``b`` sequences of ``s`` tokens, hidden ``h``, FFN width ``f`` with ``n_f``
matrices, key/value width ``h_kv``; forward, no causal halving):

.. math:: F_\mathrm{layer} = 2bsh(h + 2h_{kv}) + 2bsh^2 + 2 n_f\, bshf + 4bs^2h

which for GPT (``h_kv = h``, ``f = 4h``, ``n_f = 2``) is Megatron's ``24bsh^2 + 4bs^2h``; a fused
attention adds its softmax's ``b a s^2`` exponentials on the special-function units (``attention_exp_time``).
Backward costs two GEMMs per forward GEMM. Full recomputation repeats the forward; selective
recomputation repeats the attention core (Korthikanti et al. 2022).
The last stage adds the output layer's GEMMs and the stack's cross-entropy, memory-bound over the
fp32 logits of its vocabulary shard: ``(B_fwd + B_bwd) b s V / t`` bytes, with the stack's bytes per
logit element counted from its code (``loss_*_bytes_per_logit`` in ``data/calibration.yaml``:
Megatron's unfused loss 38 + 14, NeMo's fused one 22 + 10, PyTorch's ``cross_entropy`` 22 + 26).

Activation bytes per layer and micro-batch follow Korthikanti et al. 2022, eq. 1-2,
``sbh (34 + 5as/h)`` for GPT, generalised to GQA and SwiGLU widths, with the tensor- and
sequence-parallel divisions of their Table 2.

A mixture-of-experts layer replaces the FFN by experts and a router: its FLOPs, GEMMs and
activations here, its dispatch, permutation and host issue in :mod:`trainscale.kernels.moe`
(whose docstring has the formulas).
"""

import math

import numpy as np
from numba import njit

# An integer constant passed to another kernel is written np.int64(n): a literal argument makes Numba compile the
# callee (and everything it calls) once more for that value, seconds from an empty cache (issue 38 item 5).
from .collectives import BYTES, allgather_time, domain_allreduce_time, out_link, overlapped_exposed
from .activations import (
    attention_saved_units, dropout_mask_units, mlp_saved_units, recomputes, saved_input_bytes, unfused_score_bytes,
)
from .attention import (  # causal_block_fraction is imported from here too
    attention_widths, causal_block_fraction, is_latent_attention, linear_input_width,
    qkv_projection_flops, qkv_projection_time, rotary_widths, up_projection_flops, up_projection_time,
)
from .compute import attention_exp_time, cast_time, fused_attention_fwd_bwd_time, gemm_fwd_bwd_time, memory_bound_time
from .layout import (
    C_ATTN_BWD_EFF, C_BF16_OPTIMIZER, C_CAST_BYTES, C_ELEM_TRAFFIC, C_EP_A2A_OVERLAP, C_FULL_ITERATION_GRAPH,
    C_FUSED_GROUPED_MLP, C_KERNEL_S, C_LAYER_HOST_S,
    C_LINEAR_SPEEDUP, C_LOSS_BWD_BYTES, C_LOSS_BWD_KERNELS, C_LOSS_FWD_BYTES, C_LOSS_FWD_KERNELS, C_MOE_IMBALANCE, C_MOE_OP_HOST_S,
    C_NET_EFF, C_OVERLAP_SLOWDOWN, C_ROTARY_BYTES, C_ROTARY_KERNELS, C_SELECTIVE_SHARE, C_SP_LAYOUT_COPY,
    C_TP_ASYNC_BWD, L_ACT_BYTES, L_BWD_ELEM, L_BWD_EP, L_BWD_GEMM, L_BWD_MOE, L_BWD_MOE_HOST, L_BWD_TP, L_CP, L_CP_FWD,
    L_CP_TOTAL, L_FLOPS_FWD, L_FLOPS_HEAD, L_FLOPS_RECOMP, L_FWD_ELEM, L_FWD_EP, L_FWD_GEMM, L_FWD_MOE, L_FWD_MOE_HOST,
    L_FWD_TP, L_HBM_TIME, L_HEAD_BWD, L_HEAD_BYTES, L_HEAD_FWD, L_RECOMP, L_RECOMP_TP, L_TP_TOTAL, L_WORK_BYTES,
    M_CAPACITY, M_EXPERT_BIAS, M_EXPERTS, M_FFN, M_FFN_MATS, M_GLU_CLAMP, M_HEADS, M_HIDDEN, M_MTP_LAYERS, M_PARAMS_LAYER,
    M_ROTARY, M_SEQ, M_SHARED_FFN, M_TOP_K, M_VOCAB, RC_FULL, RC_SELECTIVE, RM_CORE_ATTN, RM_LAYERNORM, RM_MLA_UP_PROJ,
    RM_MLP, RM_MOE, RM_MOE_ACT, RM_SHARED_EXPERTS, S_HBM_BW, S_PEAK_FLOPS, S_SCALE_UP_BW,
    S_SCALE_UP_DOMAIN, S_SCALE_UP_LAT, S_SMS,
)
from .moe import (ep_overlapped_times, expert_bias_time, glu_clamp_time, moe_dispatch_time, moe_host_time,
                  moe_permute_time)

ELEMENTWISE_KERNELS_PER_LAYER = 12.0
# DeepSpeed's BF16_Optimizer adds each micro-batch's gradients into its fp32 buffer, per parameter:
# read the bf16 gradient (2), write and read its fp32 cast (4 + 4), read and write the buffer (4 + 4)
# (PipelineEngine._exec_backward_pass calls optimizer.update_hp_grads after every backward;
# BF16_Optimizer.update_hp_grads: hp_grad.add_(lp.grad.to(hp_grad.dtype)))
HP_GRAD_ACCUM_BYTES = 18.0
# HBM bytes per s x s score of the unfused attention (16-bit values, 1-byte dropout mask): the
# scaled masked softmax (read, write: 4) and the attention dropout (read, write, mask: 5); backward
# the dropout (read dy and the mask, write: 5) and the softmax (read y and dy, write: 6)
# (priced for every model: one without dropout runs no dropout kernel and its fused bias-dropout-add writes no mask,
# which only its memory takes so far, kernels.activations; the time would move the fitted calibration: a refit)
SCORE_BYTES = (4.0 + 5.0, 5.0 + 6.0)
# per hidden element of a token: LayerNorms, dropouts and residual adds, forward (the backward moves
# twice as much, as does the FFN activation's 2 bytes per element and input matrix)
NORM_DROPOUT_RESIDUAL_BYTES = 30.0


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
def tp_overlapped_time(collective_s, tp, gemm_a_s, gemm_b_s, gemm_c_s, gemm_d_s, slowdown):
    """Exposed time of a pass's four sequence-parallel collectives (each ``collective_s``), each
    overlapped with its neighbouring GEMM as Megatron-Core's TP communication overlap does: the
    collective is split into ``tp`` chunks pipelined with the GEMM's chunks, so one chunk is always
    exposed and the rest runs beside the GEMM (:func:`~trainscale.kernels.collectives.overlapped_exposed`, which slows
    the GEMM by ``slowdown`` while it does)."""
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

    with ``e`` :func:`~trainscale.kernels.collectives.overlapped_exposed`. Korthikanti et al. 2022 (Sec. 6.2) name
    this overlap as why full recomputation (whose recomputed forward communicates exposed) costs 39%, not 33%."""
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
def module_recompute_times(calib, moe, up_s, norm_bytes, ffn_gemm_s, shared_gemm_s, routed_fn_bytes, shared_fn_bytes,
                           tp_fwd, moe_fwd, ep_fwd, hbm_bw):
    """(compute and element-wise, tensor-parallel, permutation, expert-parallel) seconds that Megatron-Core's
    selective recomputation of named modules (``calib[C_RECOMPUTE_MODULES]``, :mod:`trainscale.kernels.activations`)
    re-runs in the backward of one layer and micro-batch: the forward of each module it discards. ``up_s``: latent
    attention's up projections; ``norm_bytes``: the stand-alone norms' HBM traffic; ``ffn_gemm_s``: the MLP's (or
    the MoE block's: router, experts and shared experts) GEMMs; ``shared_gemm_s``: the shared experts'; the
    activation functions' traffic of the routed copies and of the shared experts; the layer's forward tensor-parallel
    time (a dense MLP re-runs its half), and a MoE block's permutation and dispatch."""
    seconds = 0.0
    tp_s = 0.0
    permute_s = 0.0
    ep_s = 0.0
    if recomputes(calib, np.int64(RM_MLA_UP_PROJ)):
        seconds += up_s
    if recomputes(calib, np.int64(RM_LAYERNORM)) and norm_bytes > 0.0:
        seconds += memory_bound_time(norm_bytes, 1.0, hbm_bw, calib)
    if not moe:
        if recomputes(calib, np.int64(RM_MLP)):
            seconds += ffn_gemm_s + memory_bound_time(routed_fn_bytes, 1.0, hbm_bw, calib)
            tp_s += 0.5 * tp_fwd
        return seconds, tp_s, permute_s, ep_s
    if recomputes(calib, np.int64(RM_MOE)):
        seconds += ffn_gemm_s + memory_bound_time(routed_fn_bytes + shared_fn_bytes, 2.0, hbm_bw, calib)
        return seconds, tp_s, moe_fwd, ep_fwd
    if recomputes(calib, np.int64(RM_MOE_ACT)):
        seconds += memory_bound_time(routed_fn_bytes, 1.0, hbm_bw, calib)
    if recomputes(calib, np.int64(RM_SHARED_EXPERTS)) and shared_fn_bytes > 0.0:
        seconds += shared_gemm_s + memory_bound_time(shared_fn_bytes, 1.0, hbm_bw, calib)
    return seconds, tp_s, permute_s, ep_s


@njit(cache=True)
def module_recompute_flops(model, calib, tokens, latent, moe):
    """Hardware FLOPs (whole layer, all tensor-parallel ranks) that the named modules' recomputation re-runs."""
    h = model[M_HIDDEN]
    nf = model[M_FFN_MATS]
    flops = 0.0
    if latent and recomputes(calib, np.int64(RM_MLA_UP_PROJ)):
        flops += up_projection_flops(model, tokens)
    shared = 2.0 * nf * tokens * h * model[M_SHARED_FFN]
    if not moe:
        if recomputes(calib, np.int64(RM_MLP)):
            flops += 2.0 * nf * tokens * h * model[M_FFN]
    elif recomputes(calib, np.int64(RM_MOE)):
        flops += 2.0 * nf * tokens * h * model[M_FFN] * model[M_TOP_K] + 2.0 * tokens * h * model[M_EXPERTS] + shared
    elif recomputes(calib, np.int64(RM_SHARED_EXPERTS)):
        flops += shared
    return flops


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
    :func:`~trainscale.kernels.moe.moe_dispatch_time`; router scores and permutation:
    :func:`~trainscale.kernels.moe.moe_permute_time`. The attention block's shapes (multi-head, grouped-query or
    latent attention): :mod:`trainscale.kernels.attention`."""
    h = model[M_HIDDEN]
    a = model[M_HEADS]
    f = model[M_FFN]
    nf = model[M_FFN_MATS]
    vocab = model[M_VOCAB]
    s = model[M_SEQ]
    d_qk, d_v, qw, kv = attention_widths(model)  # score and value channels per head, output and key widths
    latent = is_latent_attention(model)
    core_w = kv if latent else qw  # the attention core's FLOPs are 4 b s^2 core_w (both products)
    t = float(tp)
    et = etp if etp > 0 else tp
    sc = s / cp  # query tokens of each sequence on this GPU
    m = mb * sc  # tokens per micro-batch on this GPU
    peak = system[S_PEAK_FLOPS]
    hbm = system[S_HBM_BW]
    sms = system[S_SMS]
    ih, if_, ia, iqw = int(h), int(f), int(a), int(qw)
    lin = linear_peak(peak, calib)  # the linear layers' peak in the plan's precision
    im, isc, is_, ib = int(m), int(sc), int(s), int(mb)
    itp = int(tp)

    # GEMMs of one layer (tensor-parallel shard)
    f_qkv, b_qkv = qkv_projection_time(model, im, itp, sp, qw, kv, lin, hbm, sms, calib)
    heads_local = ib * ia // itp
    t_exp = 0.0  # the fused softmax's exponentials (forward; again in the backward's recompute of P)
    if flash:  # fused attention: the s x s scores stay on chip
        f_sc, b_sc = fused_attention_fwd_bwd_time(isc, is_, int(d_qk), heads_local, peak, hbm, sms, calib)
        f_av, b_av = f_sc, b_sc
        if d_v != d_qk:
            f_av, b_av = fused_attention_fwd_bwd_time(isc, is_, int(d_v), heads_local, peak, hbm, sms, calib)
    else:  # unfused: scores written to and read from HBM
        f_sc, b_sc = gemm_fwd_bwd_time(isc, is_, int(d_qk), heads_local, peak, hbm, sms, calib)
        f_av, b_av = gemm_fwd_bwd_time(isc, int(d_v), is_, heads_local, peak, hbm, sms, calib)
    if flash:  # fused causal attention computes only the blocks on and below the diagonal
        causal = causal_block_fraction(sc, s)
        t_exp = attention_exp_time(heads_local * sc * s, peak, calib) * causal  # the softmax's exponentials
        f_sc = f_sc * causal + t_exp
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
    f_rt = 0.0  # forward seconds of the router's GEMM and of the shared experts' two GEMMs (in f_up / f_dn too)
    f_shared = 0.0
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
            f_shared = f_su + f_sd
    fwd_gemm = f_qkv + f_sc + f_av + f_o + f_up + f_dn
    bwd_gemm = b_qkv + b_sc + b_av + b_o + b_up + b_dn
    if flash:  # flash attention's backward recomputes the scores on chip, at the backward's efficiency, and P
        bwd_gemm += (f_sc - t_exp) / calib[C_ATTN_BWD_EFF] + t_exp

    # memory-bound kernels: LayerNorms, dropouts, residual adds (replicated across TP ranks
    # unless sequence parallel), the FFN activation, softmax + attention dropout on s x s scores
    replicated = 1.0 / t if sp else 1.0
    norm_drop_res = NORM_DROPOUT_RESIDUAL_BYTES * m * h * replicated
    activation_fn = (2.0 * nf) * m * f / t
    shared_fn = 0.0
    fused_mlp = moe and calib[C_FUSED_GROUPED_MLP] > 0.0  # the experts' activation inside their first GEMM
    if moe:  # every copy the experts receive goes through its expert's activation (permute: moe_permute_time)
        activation_fn = 0.0 if fused_mlp else (2.0 * nf) * received * f / t
        shared_fn = (2.0 * nf) * m * model[M_SHARED_FFN] / t
        activation_fn += shared_fn
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
        rot_q, rot_k = rotary_widths(model, h, kv)
        rotary = rotary_time(m, rot_q, rot_k, t, hbm, calib)
        fwd_elem += rotary
        bwd_elem += rotary
    if calib[C_BF16_OPTIMIZER] > 0.0:  # DeepSpeed's BF16_Optimizer: after each micro-batch's backward,
        # its 16-bit gradients are cast and added into the fp32 gradient buffer (update_hp_grads)
        bwd_elem += memory_bound_time(HP_GRAD_ACCUM_BYTES * model[M_PARAMS_LAYER] / t, 1.0, hbm, calib)
    attn_elem = memory_bound_time(attention_fwd, 2.0, hbm, calib)
    if calib[C_CAST_BYTES] > 0.0:  # low precision: quantize the inputs of the four linear layers (forward)
        # and their output gradients (backward), this GPU's share; the experts' inputs per routed copy
        # (a fused grouped MLP quantizes the second GEMM's input in the first's kernel)
        ffn_in = m * (h + f) / t if not moe else received * (h + (0.0 if fused_mlp else f)) / t + m * (
            h + model[M_SHARED_FFN]) / t
        cast_fwd = cast_time(m * linear_input_width(model, h, qw) / t + ffn_in, 6.0 if latent else 4.0, hbm, calib)
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
        one = domain_allreduce_time(system, msg, itp, np.int64(1), bw_t, lat_t, eff)  # NVLS where the switches reduce
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
        dispatch = moe_dispatch_time(system, calib, routed, h, t, et, ep, calib[C_MOE_IMBALANCE], model[M_TOP_K])
        ep_fwd = dispatch
        ep_bwd = dispatch + (dispatch if rc == RC_FULL else 0.0)
        if calib[C_EP_A2A_OVERLAP] > 0.0 and ep > 1:  # beside another micro-batch's pass (a stack rule: ep > 1)
            ep_fwd, ep_bwd = ep_overlapped_times(ep_fwd, ep_bwd, fwd_gemm + fwd_elem, bwd_gemm + bwd_elem,
                                                 calib[C_OVERLAP_SLOWDOWN])
        moe_fwd, moe_bwd = moe_permute_time(routed, m, h, experts, local, t, et, calib[C_MOE_IMBALANCE], hbm,
                                            calib)
        graphed = calib[C_FULL_ITERATION_GRAPH] > 0.0  # no host issue, no token-count sync inside the step
        if not graphed:
            host_fwd, host_bwd = moe_host_time(local, ep, int(et), calib[C_CAST_BYTES] > 0.0,
                                               calib[C_MOE_OP_HOST_S], calib[C_KERNEL_S])
        if model[M_EXPERT_BIAS] > 0.0 and not fused_mlp:  # the second expert linear's bias, expert by expert
            bias_fwd, bias_bwd = expert_bias_time(routed, h, local, t, et, calib[C_MOE_IMBALANCE], hbm,
                                                  0.0 if graphed else calib[C_MOE_OP_HOST_S], calib)
            moe_fwd += bias_fwd
            moe_bwd += bias_bwd
        if model[M_GLU_CLAMP] > 0.0 and not fused_mlp:  # a clamped GLU's clamp, in PyTorch before the fused activation
            clamp_fwd, clamp_bwd = glu_clamp_time(received * f / t, recomputes(calib, np.int64(RM_MOE_ACT)), hbm,
                                                  calib)
            moe_fwd += clamp_fwd
            moe_bwd += clamp_bwd

    # recomputation in the backward pass: the share of the forward's weight GEMMs, element-wise work
    # and TP collectives it repeats (full: all; selective: Megatron's attention core only, a stack's
    # own selective checkpointing, torchtitan or fms-fsdp, also a share of the rest)
    recomputed = 1.0 if rc == RC_FULL else (calib[C_SELECTIVE_SHARE] if rc == RC_SELECTIVE else 0.0)
    recomp_tp = recomputed * tp_fwd
    module_flops = 0.0
    if rc == RC_FULL:
        recomp = fwd_gemm + fwd_elem
    elif rc == RC_SELECTIVE:
        recomp = recomputed * (fwd_gemm - f_sc - f_av + fwd_elem)
        if not flash and recomputes(calib, np.int64(RM_CORE_ATTN)):  # the attention core, its scores re-materialised
            recomp += f_sc + f_av + attn_elem
        # Megatron-Core's named modules (plan.recompute_modules): their forward again before their backward
        up_s = up_projection_time(model, im, itp, lin, hbm, sms, calib)[0] if latent else 0.0
        norm_bytes = 4.0 * m * h * replicated * ((1.0 if moe else 0.0) + (1.0 if latent else 0.0))
        module_s, module_tp, module_moe, module_ep = module_recompute_times(
            calib, moe, up_s, norm_bytes, f_up + f_dn, f_shared, activation_fn - shared_fn, shared_fn, tp_fwd,
            moe_fwd, ep_fwd, hbm)
        recomp += module_s
        recomp_tp += module_tp
        moe_bwd += module_moe
        ep_bwd += module_ep
        module_flops = module_recompute_flops(model, calib, mb * s, latent, moe)
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

    # activation memory (Korthikanti et al. 2022; kernels.activations), per token in units of h bytes: what the
    # layer makes, and what the named modules of a selective recomputation discard of it
    attn_act, attn_gone = attention_saved_units(model, h, kv, qw, calib)
    mlp_act, mlp_gone = mlp_saved_units(model, h, f, nf, calib, calib[C_MOE_IMBALANCE])
    per_token = 4.0 + attn_act + mlp_act + attn_gone + mlp_gone  # 34 for GPT in bf16
    q_in, _ = saved_input_bytes(calib)
    # replicated over the tp ranks without sequence parallelism: the norms' inputs, the dropout masks and the
    # attention's and the MLP's inputs (a MoE router's in 16 bits)
    replicated_units = 4.0 + 2.0 * dropout_mask_units(model) + q_in + (BYTES if moe else q_in)  # 10 in bf16
    if sp:
        dense = per_token * m * h / t
    else:
        dense = replicated_units * m * h + (per_token - replicated_units) * m * h / t
    gone = (attn_gone + mlp_gone) * m * h / t if rc == RC_SELECTIVE else 0.0
    scores = 4.0 * mb * (a / t) * sc if flash else unfused_score_bytes(model) * mb * (a / t) * sc * s
    # transient while one layer runs its backward: the gradients of its activations (one layer,
    # one micro-batch, the size of what it stores without recomputation), plus what it
    # re-materialises (full: the whole layer; selective: the attention scores and the named modules' outputs)
    grads = dense + scores
    if rc == RC_FULL:
        act = BYTES * m * h / (t if sp else 1.0)
        work = grads + dense + scores
    elif rc == RC_SELECTIVE:  # a stack's own selective checkpointing keeps only the input of its
        # recomputed share (as full recomputation) and re-materialises it in the backward
        share = calib[C_SELECTIVE_SHARE]
        kept_scores = 0.0 if (not flash and recomputes(calib, np.int64(RM_CORE_ATTN))) else scores
        act = (1.0 - share) * (dense - gone + kept_scores) + share * BYTES * m * h / (t if sp else 1.0)
        work = grads + (scores - kept_scores) + share * (dense + scores) + gone
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
    attention_in = qkv_projection_flops(model, tokens, qw, kv)
    flops_fwd = (attention_in + 2.0 * tokens * qw * h + 2.0 * nf * tokens * h * f
                 + 4.0 * mb * s * s * core_w)
    if moe:  # top-k experts per token, the shared experts and the router
        flops_fwd = (attention_in + 2.0 * tokens * qw * h
                     + 2.0 * nf * tokens * h * f * model[M_TOP_K] + 2.0 * tokens * h * experts
                     + 2.0 * nf * tokens * h * model[M_SHARED_FFN] + 4.0 * mb * s * s * core_w)
    if rc == RC_FULL:
        flops_recomp = flops_fwd
    elif rc == RC_SELECTIVE:
        flops_recomp = (4.0 * mb * s * s * core_w
                        + calib[C_SELECTIVE_SHARE] * (flops_fwd - 4.0 * mb * s * s * core_w) + module_flops)
    else:
        flops_recomp = 0.0

    # the host issues every kernel: a pass takes at least the stack's host time per layer (the
    # backward issues twice the forward's kernels, and the recomputed forward's too); what the GPU
    # work does not cover is idle time, counted with the element-wise work (not as HBM traffic)
    host = 0.0 if calib[C_FULL_ITERATION_GRAPH] > 0.0 else calib[C_LAYER_HOST_S]  # a graph replays the kernels
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
    if model[M_MTP_LAYERS] > 0:  # multi-token prediction on the last stage: its projection from 2h to h
        eh_proj = gemm_fwd_bwd_time(im, ih // itp, 2 * ih, np.int64(1), lin, hbm, sms, calib)
        mtp_head_costs(out, model[M_MTP_LAYERS], eh_proj[0], eh_proj[1], float(tokens), h)


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
def mtp_head_costs(lc, depths, eh_fwd, eh_bwd, tokens, h):
    """Add ``depths`` multi-token prediction modules to the last stage's head (``L_HEAD_*``, in place), each one more
    layer of the model (:func:`layer_fwd_bwd`), the projection of ``[norm(h); norm(emb)]`` from ``2h`` to ``h``
    (``eh_fwd``, ``eh_bwd`` seconds) and another output layer and loss, with that layer's activations and logits
    kept: Megatron-Core's ``MultiTokenPredictionBlock`` (megatron/core/transformer/multi_token_prediction.py)."""
    fwd, bwd = layer_fwd_bwd(lc)
    head_fwd, head_bwd = lc[L_HEAD_FWD], lc[L_HEAD_BWD]
    lc[L_HEAD_FWD] = head_fwd + depths * (fwd + eh_fwd + head_fwd)
    lc[L_HEAD_BWD] = head_bwd + depths * (bwd + eh_bwd + head_bwd)
    lc[L_HEAD_BYTES] = lc[L_HEAD_BYTES] * (1.0 + depths) + depths * lc[L_ACT_BYTES]
    lc[L_FLOPS_HEAD] = lc[L_FLOPS_HEAD] * (1.0 + depths) + depths * (lc[L_FLOPS_FWD] + 4.0 * tokens * h * h)
