r"""Mixture-of-experts layers: token dispatch and combine, router scores and token permutation, and the
host issue after the dropless dispatcher's sync, each per layer and micro-batch on one GPU
(:func:`trainscale.kernels.layer.layer_costs` adds them to the layer's costs).

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
"""

import numpy as np
from numba import njit

# An integer constant passed to another kernel is written np.int64(n): a literal argument makes Numba compile the
# callee (and everything it calls) once more for that value, seconds from an empty cache (issue 38 item 5).
from .collectives import BYTES, allgather_time, alltoall_time, deduplicated_alltoall_time, out_link, overlapped_exposed
from .compute import memory_bound_time
from .layout import C_MOE_NODE_DEDUP, C_NET_EFF, S_SCALE_UP_BW, S_SCALE_UP_DOMAIN, S_SCALE_UP_LAT

# MoE router and permutation HBM bytes (Megatron-Core's fused router and permute kernels, 16-bit tokens):
# the router's top-k over fp32 scores reads the logits and writes the probabilities and the routing map
# (4 + 4 + 1 bytes per score element); its backward reads the probabilities and their gradient and
# writes the logits' gradient (4 + 4 + 4)
ROUTER_SCORE_BYTES = (9.0, 12.0)
# The second expert linear's bias where the experts have biases (GPT-OSS), which Megatron-Core's TEGroupedMLP adds
# outside the grouped GEMM, expert by expert: torch.cat([t + b * p for each local expert]).to(dtype)
# (TEGroupedMLP._apply_bias, NVIDIA/Megatron-LM core_r0.16 megatron/core/transformer/moe/experts.py; the same in
# the 26.02-26.04 containers' Megatron-Core). HBM bytes per element of the received copies (rows x h), 16-bit
# probabilities (moe_router_dtype unset): forward, b * p (write 2), t + bp (read 4, write 2), the cat (read 2, write
# 2) = 12; backward, for the bias and for the probabilities a product with the output gradient (read 2, write 2) and
# its reduction (read 2), and the split's gradient gathered into one tensor (read 2, write 2) = 16
EXPERT_BIAS_BYTES = (12.0, 16.0)
# The clamp of a clamped GLU (GPT-OSS: activation_func_clamp_value 7), which Megatron-Core runs in PyTorch before its
# fused weighted quick-GeGLU kernel: x_glu.clamp(max=c) and x_linear.clamp(-c, c) on the two halves of the first
# expert linear's 2 f wide output, then torch.cat of the two (weighted_bias_quick_geglu_impl, NVIDIA/Megatron-LM
# megatron/core/fusions/fused_bias_geglu.py, the same at b0cc2706, d7288711 and d0b3b775, the 26.02-26.06
# containers'). HBM bytes per element of one half (f per copy), 16 bits: forward, each clamp reads and writes its
# half (2 x 4) and the cat reads and writes both (8) = 16; backward, each clamp's gradient reads the gradient and its
# saved input and writes (2 x 6), and the chunk's gradient gathers the two halves into one tensor (8) = 20
GLU_CLAMP_BYTES = (16.0, 20.0)


@njit(cache=True)
def moe_dispatch_time(system, calib, routed, h, tp, et, ep, imbalance, top_k=1.0):
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

    0 with ``ep = 1`` and ``e_t = 1`` (every expert local, nothing to gather). With DeepEP
    (``calib[C_MOE_NODE_DEDUP]``, plan ``moe_dispatcher: deepep``) the all-to-all sends each of the ``top_k`` copies'
    tokens once per remote domain: :func:`~trainscale.kernels.collectives.deduplicated_alltoall_time`."""
    domain = int(system[S_SCALE_UP_DOMAIN])
    eff = calib[C_NET_EFF]
    bw_up, lat_up = system[S_SCALE_UP_BW], system[S_SCALE_UP_LAT]
    sent = BYTES * routed * h * imbalance / tp
    a2a = 0.0
    if ep > 1:
        bw_a, lat_a = out_link(system, ep, et)
        if calib[C_MOE_NODE_DEDUP] > 0.0:
            a2a = deduplicated_alltoall_time(sent, ep, et, domain, bw_up, lat_up, bw_a, lat_a, eff, top_k)
        else:
            a2a = alltoall_time(sent, ep, et, domain, bw_up, lat_up, bw_a, lat_a, eff)
    gather = 0.0
    if et > 1:
        bw_g, lat_g = out_link(system, et, np.int64(1))
        gather = allgather_time(sent * et, et, np.int64(1), domain, bw_up, lat_up, bw_g, lat_g, eff)
    return 2.0 * (a2a + gather)


@njit(cache=True)
def ep_overlapped_times(dispatch_fwd, dispatch_bwd, fwd_compute, bwd_compute, slowdown):
    r"""(forward, backward) exposed seconds of one layer's dispatch and combine under Megatron-Core's batch-level
    EP overlap (``overlap_moe_expert_parallel_comm``): the schedule merges the forward of one micro-batch with the
    backward of another layer by layer, so the forward's all-to-alls run beside that layer's backward compute
    and the backward's beside its forward compute, each exposed as
    :func:`~trainscale.kernels.collectives.overlapped_exposed` prices a collective beside computation (the
    compute slowed by the communication kernels):

    .. math:: t_\mathrm{fwd} = \max\left(c_f - w_b,\ c_f \tfrac{\sigma}{1+\sigma}\right), \qquad
              t_\mathrm{bwd} = \max\left(c_b - w_f,\ c_b \tfrac{\sigma}{1+\sigma}\right)

    Every micro-batch is priced as in the steady state: the pipeline's warm-up and cool-down passes, which have
    no partner, are not told apart (they are ``2 (p - 1)`` of a device's ``M v`` chunk passes)."""
    return (overlapped_exposed(dispatch_fwd, bwd_compute, slowdown),
            overlapped_exposed(dispatch_bwd, fwd_compute, slowdown))


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
def expert_bias_time(routed, h, local, tp, et, imbalance, hbm_bw, op_s, calib):
    r"""(forward, backward) seconds of the second expert linear's bias on one GPU, where the experts have biases
    (``model.expert_bias``, GPT-OSS): Megatron-Core adds it outside the grouped GEMM in a Python loop over the
    ``E_l`` local experts (``TEGroupedMLP._apply_bias``), one product and one sum per expert, over the ``\iota r
    e_t / t`` copies this GPU's experts receive (as :func:`moe_permute_time` counts them), ``h`` wide,
    :data:`EXPERT_BIAS_BYTES` per element.

    Forward: the host issues ``2 E_l + 4`` Python-level ops (the two splits, the products and sums, the cat and
    the cast) at ``t_op`` each (:data:`~trainscale.kernels.layout.C_MOE_OP_HOST_S`) after the dispatcher's sync,
    as :func:`moe_host_time` counts its own; the GPU's ``2 E_l + 1`` memory-bound kernels run beside them, and the
    longer of the two is charged. Backward: autograd's engine issues ``4 E_l + 1`` kernels (a product and a
    reduction for the bias and for the probabilities, per expert, and the split's gradient), priced by
    :func:`~trainscale.kernels.compute.memory_bound_time` with their launches:

    .. math:: t_\mathrm{fwd} = \max\left((2E_l + 4)\,t_\mathrm{op},\ \frac{12\,\iota r e_t h / t}{\eta B}
              + (2E_l + 1)\,t_l\right), \qquad
              t_\mathrm{bwd} = \frac{16\,\iota r e_t h / t}{\eta B} + (4E_l + 1)\,t_l"""
    elements = imbalance * routed * et / tp * h
    fwd_gpu = memory_bound_time(EXPERT_BIAS_BYTES[0] * elements, 2.0 * local + 1.0, hbm_bw, calib)
    fwd_host = (2.0 * local + 4.0) * op_s
    bwd = memory_bound_time(EXPERT_BIAS_BYTES[1] * elements, 4.0 * local + 1.0, hbm_bw, calib)
    return (fwd_gpu if fwd_gpu > fwd_host else fwd_host), bwd


@njit(cache=True)
def glu_clamp_time(half_elements, recomputed, hbm_bw, calib):
    r"""(forward, backward) seconds of a clamped GLU's clamp on one GPU (``model.activation_func_clamp_value`` > 0,
    GPT-OSS): three memory-bound kernels each pass over the ``n`` elements of one half of the experts' first linear
    output (``n`` = the received copies x ``f / t``), :data:`GLU_CLAMP_BYTES` per element; where the plan
    recomputes the experts' activation (``recomputed``: Megatron-Core's ``moe_act`` module) the backward runs the
    forward's again:

    .. math:: t_\mathrm{fwd} = \frac{16 n}{\eta B} + 3 t_l, \qquad
              t_\mathrm{bwd} = \frac{20 n}{\eta B} + 3 t_l + [\mathrm{recomputed}]\, t_\mathrm{fwd}"""
    fwd = memory_bound_time(GLU_CLAMP_BYTES[0] * half_elements, 3.0, hbm_bw, calib)
    bwd = memory_bound_time(GLU_CLAMP_BYTES[1] * half_elements, 3.0, hbm_bw, calib)
    if recomputed:
        bwd += fwd
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
