r"""Tensor-parallel inference: prefill and decode latency of a transformer layer stack, with the
prefill either serial or split in two chunks whose computation and communication overlap (ISO,
Xiao & Su 2024, "ISO: Overlap of Computation and Communication within Sequence for LLM
Inference", arXiv 2409.11155).

**One layer on one of ``t`` tensor-parallel GPUs** (Megatron split: QKV and the first FFN
matrices by columns, the output projection and the last FFN matrix by rows, so each of the two
blocks ends in an all-reduce of the activations). A chunk of ``s_k`` tokens of ``b`` sequences
(``m = b s_k``) that follows ``c_k`` tokens already in the KV cache costs, in FLOPs per GPU,

.. math::
    F = \frac{2m}{t}\Big(h(h + 2h_{kv}) + h^2 + n_f\, h f\Big)
        + \frac{4 b\, a\, d}{t}\Big(s_k c_k + \frac{s_k (s_k + 1)}{2}\Big)

(``a`` heads of width ``d = h/a``, ``n_f`` FFN matrices of width ``f``): the GEMMs, and causal
attention where token ``i`` of the chunk attends to ``c_k + i + 1`` keys. Split in two chunks the
attention term adds up to the unsplit one exactly, ``s_1(s_1+1)/2 + s_2 s_1 + s_2(s_2+1)/2 =
s(s+1)/2``: ISO does no extra arithmetic, only smaller GEMMs (worse wave quantisation), more
kernel launches and more collective latencies.

Times come from :mod:`~trainscale.kernels.compute` (GEMM roofline with shape-dependent efficiency,
memory-bound kernels by bytes) and :mod:`~trainscale.kernels.collectives` (all-reduce of
``2 m h`` bytes over the ``t`` GPUs). Attention is fused (flash attention: no score matrix in HBM):

.. math:: t_\mathrm{attn} = \max\left(\frac{F_\mathrm{attn}}{\eta(s_k, L)\,P},\
          \frac{2\,(2 m h + 2 b (c_k + s_k) h_{kv})/t}{\eta_\mathrm{HBM} B_\mathrm{HBM}}\right) + t_\mathrm{kernel}

with the efficiency of a ``s_k x L`` score GEMM, ``L = c_k + \lceil s_k/2 \rceil`` its mean key
count. Memory-bound kernels per block: RMSNorm (``4mh`` bytes), residual add (``6mh``), rotary
embedding on Q and K (``4m(h + h_{kv})/t``) in the attention block, the activation
(``2 n_f m f / t``) in the MLP block.

**Schedule.** Two streams per GPU, compute and communication, each running its operations in
order; an operation starts when its stream is free and its input is ready. With chunks
``k = 1..K`` each layer runs ``A_1..A_K, M_1..M_K`` (attention and MLP blocks) on the compute
stream and ``R^A_1..R^A_K, R^M_1..R^M_K`` (their all-reduces) on the communication stream, with

.. math:: R^A_k \leftarrow A_k,\quad M_k \leftarrow R^A_k,\quad R^M_k \leftarrow M_k,\quad
          A_k^{(l+1)} \leftarrow R^{M\,(l)}_k

and chunk 2's attention after chunk 1's on the compute stream (it reads chunk 1's keys and
values). ``K = 1`` is the serial execution, ``T = \sum_l (A + R^A + M + R^M)``. ``K = 2`` is ISO:
one chunk's all-reduce runs while the other chunk computes. The start times are max-plus
expressions of the durations, so the makespan never grows when an operation gets faster, and

.. math:: \max(C', R') \le T_\mathrm{ISO} \le C' + R'

with ``C'``, ``R'`` the summed compute and communication of the split execution: ISO hides at most
``\min(C', R')``. While a collective runs, the compute stream may slow down (the collective's
kernels take SMs and memory bandwidth): ``overlap_slowdown`` ``\kappa`` makes compute progress at
rate ``1/(1+\kappa)`` whenever a collective is in flight (an event simulation, exact for this rate
model; ``\kappa = 0``: no interference).

**Decode** (one new token per sequence, context ``c`` in the cache) is the same layer with
``s_k = 1``: its GEMMs are matrix-vector products bound by reading the weights (split-K GEMV
kernels: no tile quantisation, :func:`gemv_time`), attention is bound by reading the KV cache, and both all-reduces carry ``2bh`` bytes, so they are latency-bound; one
token cannot be split, so decode is always serial.

The output layer (vocabulary-parallel, ``V/t`` rows per GPU) runs once, for the last token of each
sequence, followed by an all-gather of the ``2bV`` logit bytes; the embedding lookup is neglected.
"""

import math

import numpy as np
from numba import njit, prange

from .collectives import allgather_time, domain_allreduce_time
from .compute import attention_exp_time, gemm_efficiency, gemm_time, memory_bound_time
from .layout import (
    C_GEMM_PEAK_EFF, C_HBM_EFF, C_KERNEL_S, C_NET_EFF, C_TILE_M, C_TILE_N,
    M_FFN, M_FFN_MATS, M_HEADS, M_HIDDEN, M_KV_HEADS, M_LAYERS, M_VOCAB,
    S_HBM_BW, S_PEAK_FLOPS, S_SCALE_OUT_BW, S_SCALE_OUT_LAT, S_SCALE_UP_BW, S_SCALE_UP_DOMAIN,
    S_SCALE_UP_LAT, S_SMS,
)

BYTES = 2.0  # 16-bit weights, activations and KV cache

# result vector of :func:`prefill_time` and :func:`decode_time`
P_TIME = 0  # latency, s
P_COMPUTE = 1  # summed compute-stream work (without overlap slowdown), s
P_COMM = 2  # summed communication, s
P_FLOPS = 3  # FLOPs per GPU
P_SIZE = 4


# --------------------------------------------------------------------------- FLOPs and bytes
@njit(cache=True)
def layer_flops(b, s_k, ctx, h, heads, kv, f, nf, t):
    """FLOPs per GPU of one layer for a chunk of ``s_k`` tokens after ``ctx`` cached tokens."""
    m = b * s_k
    gemm = 2.0 * m / t * (h * (h + 2.0 * kv) + h * h + nf * h * f)
    d = h / heads
    attention = 4.0 * b * heads * d / t * (s_k * ctx + s_k * (s_k + 1.0) / 2.0)
    return gemm + attention


@njit(cache=True)
def allreduce_bytes(b, s_k, h):
    """Bytes of one tensor-parallel all-reduce: the chunk's activations, ``2 m h``."""
    return BYTES * b * s_k * h


@njit(cache=True)
def attention_elementwise_bytes(m, h, kv, t):
    """RMSNorm + residual add (replicated) and rotary embedding of Q and K (sharded)."""
    return 10.0 * m * h + 4.0 * m * (h + kv) / t


@njit(cache=True)
def mlp_elementwise_bytes(m, h, f, nf, t):
    """RMSNorm + residual add (replicated) and the activation function (sharded)."""
    return 10.0 * m * h + 2.0 * nf * m * f / t


# --------------------------------------------------------------------------- block times
@njit(cache=True)
def attention_core_time(b, s_k, ctx, h, heads, kv, t, peak, hbm, sms, calib):
    """Fused causal attention of ``s_k`` query tokens over ``ctx + s_k`` keys, one GPU's heads: both products
    on the roofline, plus the softmax's exponentials (:func:`~trainscale.kernels.compute.attention_exp_time`)."""
    if s_k <= 0:
        return 0.0
    d = h / heads
    flops = 4.0 * b * heads * d / t * (s_k * ctx + s_k * (s_k + 1.0) / 2.0)
    mean_keys = ctx + (s_k + 1) // 2
    eff = gemm_efficiency(s_k, mean_keys, b * (heads // t), sms, calib[C_GEMM_PEAK_EFF],
                          calib[C_TILE_M], calib[C_TILE_N])
    scores = b * (heads / t) * (s_k * ctx + s_k * (s_k + 1.0) / 2.0)
    t_compute = flops / (eff * peak) + attention_exp_time(scores, peak, calib)  # the softmax's exponentials
    nbytes = BYTES * (2.0 * b * s_k * h + 2.0 * b * (ctx + s_k) * kv) / t
    t_memory = nbytes / (calib[C_HBM_EFF] * hbm)
    return (t_compute if t_compute > t_memory else t_memory) + calib[C_KERNEL_S]


@njit(cache=True)
def attention_block_time(b, s_k, ctx, h, heads, kv, t, peak, hbm, sms, calib):
    """Norm, QKV projection, rotary, attention core, output projection and residual of a chunk."""
    if s_k <= 0:
        return 0.0
    m = b * s_k
    ih, ikv, it = int(h), int(kv), int(t)
    qkv = gemm_time(m, (ih + 2 * ikv) // it, ih, 1, peak, hbm, sms, calib)
    out = gemm_time(m, ih, ih // it, 1, peak, hbm, sms, calib)
    core = attention_core_time(b, s_k, ctx, h, heads, kv, t, peak, hbm, sms, calib)
    elem = memory_bound_time(attention_elementwise_bytes(m, h, kv, t), 3.0, hbm, calib)
    return qkv + core + out + elem


@njit(cache=True)
def mlp_block_time(b, s_k, h, f, nf, t, peak, hbm, sms, calib):
    """Norm, FFN up (and gate), activation, FFN down and residual of a chunk."""
    if s_k <= 0:
        return 0.0
    m = b * s_k
    ih, i_f, it = int(h), int(f), int(t)
    up = gemm_time(m, (int(nf) - 1) * i_f // it, ih, 1, peak, hbm, sms, calib)
    down = gemm_time(m, ih, i_f // it, 1, peak, hbm, sms, calib)
    elem = memory_bound_time(mlp_elementwise_bytes(m, h, f, nf, t), 3.0, hbm, calib)
    return up + down + elem


@njit(cache=True)
def tp_allreduce_time(nbytes, t, system, calib):
    """All-reduce of ``nbytes`` over ``t`` consecutive GPUs (the tensor-parallel group), as the training
    plans' (:func:`~trainscale.kernels.collectives.domain_allreduce_time`: NVLS where the domain's
    switches reduce)."""
    return domain_allreduce_time(system, nbytes, int(t), 1, system[S_SCALE_OUT_BW], system[S_SCALE_OUT_LAT],
                                 calib[C_NET_EFF])


@njit(cache=True)
def gemv_time(m, n, k, peak, hbm, calib):
    """Seconds for a skinny GEMM (``m`` = the decode batch): split-K / GEMV kernels spread ``k`` over
    all SMs, so there is no tile quantisation; the roofline of ``2mnk`` FLOPs at the best
    achievable efficiency and ``2(mk + kn + mn)`` bytes."""
    t_compute = 2.0 * m * n * k / (calib[C_GEMM_PEAK_EFF] * peak)
    t_memory = BYTES * (m * k + k * n + m * n) / (calib[C_HBM_EFF] * hbm)
    return (t_compute if t_compute > t_memory else t_memory) + calib[C_KERNEL_S]


@njit(cache=True)
def head_time(b, h, vocab, t, system, calib):
    """(compute, communication) of the vocabulary-parallel output layer for one token per sequence."""
    compute = gemv_time(float(b), vocab / t, h, system[S_PEAK_FLOPS], system[S_HBM_BW], calib)
    comm = allgather_time(BYTES * b * vocab, int(t), 1, int(system[S_SCALE_UP_DOMAIN]), system[S_SCALE_UP_BW],
                          system[S_SCALE_UP_LAT], system[S_SCALE_OUT_BW], system[S_SCALE_OUT_LAT],
                          calib[C_NET_EFF])
    return compute, comm


# --------------------------------------------------------------------------- two-stream schedule
@njit(cache=True)
def two_stream_makespan(comp, comm, comp_dep, comm_dep, slowdown):
    """Makespan of two in-order streams with cross-stream dependencies.

    ``comp_dep[i]`` is the communication operation compute operation ``i`` waits for (-1: none),
    ``comm_dep[j]`` the compute operation communication ``j`` waits for. Compute progresses at rate
    ``1 / (1 + slowdown)`` while a collective is in flight. Returns NaN on a dependency cycle.
    """
    nc, nm = comp.size, comm.size
    ic, im = 0, 0
    now = 0.0
    rc = comp[0] if nc > 0 else 0.0
    rm = comm[0] if nm > 0 else 0.0
    slow_rate = 1.0 / (1.0 + slowdown)
    while ic < nc or im < nm:
        c_ready = ic < nc and (comp_dep[ic] < 0 or comp_dep[ic] < im)
        m_ready = im < nm and (comm_dep[im] < 0 or comm_dep[im] < ic)
        if not c_ready and not m_ready:
            return math.nan
        rate = slow_rate if (c_ready and m_ready and rm > 0.0) else 1.0
        dc = rc / rate if c_ready else math.inf
        dm = rm if m_ready else math.inf
        dt = dc if dc < dm else dm
        now += dt
        finish_c = c_ready and dc <= dm
        finish_m = m_ready and dm <= dc
        if c_ready:
            rc -= dt * rate
        if m_ready:
            rm -= dt
        if finish_c:
            ic += 1
            rc = comp[ic] if ic < nc else 0.0
        if finish_m:
            im += 1
            rm = comm[im] if im < nm else 0.0
    return now


@njit(cache=True)
def chunk_tokens(s, ratio):
    """Tokens of the first chunk for a split ratio in [0, 1] (nearest integer)."""
    s1 = int(math.floor(ratio * s + 0.5))
    if s1 < 0:
        s1 = 0
    if s1 > s:
        s1 = s
    return s1


@njit(cache=True)
def prefill_time(model, system, calib, tp, b, s, s1, slowdown, out):
    """Fill ``out`` (``P_*``) with the prefill of ``b`` prompts of ``s`` tokens on ``tp`` GPUs,
    split after ``s1`` tokens (``s1 = 0`` or ``s``: serial)."""
    h, heads, kv_heads = model[M_HIDDEN], model[M_HEADS], model[M_KV_HEADS]
    kv = kv_heads * h / heads
    f, nf, layers, vocab = model[M_FFN], model[M_FFN_MATS], int(model[M_LAYERS]), model[M_VOCAB]
    t = float(tp)
    peak, hbm, sms = system[S_PEAK_FLOPS], system[S_HBM_BW], int(system[S_SMS])
    if s1 <= 0 or s1 >= s:
        k = 1
        sizes = np.array([s])
        ctxs = np.array([0])
    else:
        k = 2
        sizes = np.array([s1, s - s1])
        ctxs = np.array([0, s1])
    a_t = np.empty(k)
    m_t = np.empty(k)
    r_t = np.empty(k)
    flops = 0.0
    for c in range(k):
        a_t[c] = attention_block_time(b, sizes[c], ctxs[c], h, heads, kv, t, peak, hbm, sms, calib)
        m_t[c] = mlp_block_time(b, sizes[c], h, f, nf, t, peak, hbm, sms, calib)
        r_t[c] = tp_allreduce_time(allreduce_bytes(b, sizes[c], h), t, system, calib)
        flops += layer_flops(b, sizes[c], ctxs[c], h, heads, kv, f, nf, t)
    n = layers * 2 * k
    comp = np.empty(n)
    comm = np.empty(n)
    comp_dep = np.empty(n, dtype=np.int64)
    comm_dep = np.empty(n, dtype=np.int64)
    for layer in range(layers):
        base = layer * 2 * k
        for c in range(k):
            ia, im = base + c, base + k + c  # attention, MLP (and their all-reduces)
            comp[ia] = a_t[c]
            comp[im] = m_t[c]
            comm[ia] = r_t[c]
            comm[im] = r_t[c]
            comp_dep[ia] = ia - k if layer > 0 else -1  # previous layer's MLP all-reduce
            comp_dep[im] = ia
            comm_dep[ia] = ia
            comm_dep[im] = im
    head_c, head_r = head_time(b, h, vocab, t, system, calib)
    out[P_TIME] = two_stream_makespan(comp, comm, comp_dep, comm_dep, slowdown) + head_c + head_r
    out[P_COMPUTE] = comp.sum() + head_c
    out[P_COMM] = comm.sum() + head_r
    out[P_FLOPS] = layers * flops + 2.0 * b * h * vocab / t


@njit(cache=True)
def decode_layer_compute(b, ctx, h, heads, kv, f, nf, t, peak, hbm, calib):
    """One layer's compute for one new token per sequence after ``ctx`` cached tokens: four
    weight GEMVs, attention over ``ctx + 1`` keys (reading the KV cache) and the element-wise
    kernels of both blocks."""
    m = float(b)
    gemvs = (gemv_time(m, (h + 2.0 * kv) / t, h, peak, hbm, calib) + gemv_time(m, h, h / t, peak, hbm, calib)
             + gemv_time(m, (nf - 1.0) * f / t, h, peak, hbm, calib) + gemv_time(m, h, f / t, peak, hbm, calib))
    d = h / heads
    flops = 4.0 * b * heads * d / t * (ctx + 1.0)
    kv_bytes = BYTES * (2.0 * b * h + 2.0 * b * (ctx + 1.0) * kv) / t
    t_flops = flops / (calib[C_GEMM_PEAK_EFF] * peak)
    t_bytes = kv_bytes / (calib[C_HBM_EFF] * hbm)
    core = (t_flops if t_flops > t_bytes else t_bytes) + calib[C_KERNEL_S]
    elem = memory_bound_time(attention_elementwise_bytes(m, h, kv, t) + mlp_elementwise_bytes(m, h, f, nf, t),
                             6.0, hbm, calib)
    return gemvs + core + elem


@njit(cache=True)
def decode_time(model, system, calib, tp, b, ctx, out):
    """Fill ``out`` (``P_*``) with one decode step (one token per sequence) after ``ctx`` tokens."""
    h, heads, kv_heads = model[M_HIDDEN], model[M_HEADS], model[M_KV_HEADS]
    kv = kv_heads * h / heads
    f, nf, layers, vocab = model[M_FFN], model[M_FFN_MATS], int(model[M_LAYERS]), model[M_VOCAB]
    t = float(tp)
    peak, hbm, sms = system[S_PEAK_FLOPS], system[S_HBM_BW], int(system[S_SMS])
    compute = decode_layer_compute(b, ctx, h, heads, kv, f, nf, t, peak, hbm, calib)
    comm = 2.0 * tp_allreduce_time(allreduce_bytes(b, 1, h), t, system, calib)
    head_c, head_r = head_time(b, h, vocab, t, system, calib)
    out[P_COMPUTE] = layers * compute + head_c
    out[P_COMM] = layers * comm + head_r
    out[P_TIME] = out[P_COMPUTE] + out[P_COMM]
    out[P_FLOPS] = layers * layer_flops(b, 1, ctx, h, heads, kv, f, nf, t) + 2.0 * b * h * vocab / t


@njit(cache=True, parallel=True)
def prefill_grid(model, system, calib, tps, prompts, ratios, b, slowdown, out):
    """``out[i, j, r, :]``: :func:`prefill_time` for ``tps[i]``, ``prompts[j]``, ``ratios[r]``."""
    ni, nj, nr = tps.size, prompts.size, ratios.size
    for flat in prange(ni * nj * nr):
        i = flat // (nj * nr)
        j = (flat // nr) % nj
        r = flat % nr
        s = prompts[j]
        prefill_time(model, system, calib, tps[i], b, s, chunk_tokens(s, ratios[r]), slowdown, out[i, j, r])
