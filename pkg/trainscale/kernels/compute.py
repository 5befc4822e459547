r"""Time of the accelerator's own work: GEMMs on a roofline, memory-bound kernels by bytes.

Achievable GEMM efficiency for ``C[m, n] = A[m, k] B[k, n]`` (``batch`` independent copies):
the output is cut into ``T_m x T_n`` tiles, one per streaming multiprocessor at a time, so
the work is quantised twice — partial tiles at the edges and a partial last wave:

.. math::
    \mathrm{tiles} = b \lceil m/T_m \rceil \lceil n/T_n \rceil,\quad
    \mathrm{waves} = \lceil \mathrm{tiles} / N_\mathrm{SM} \rceil,\quad
    q = \frac{b\,m\,n}{\mathrm{waves}\; N_\mathrm{SM}\, T_m T_n}

so that

.. math:: \eta(m, n) = \eta_\max \; q

with one fitted parameter per generation (``eta_max``); tile sizes and SM counts are the
hardware's. The reduction depth ``k`` enters through the arithmetic intensity: the time is the
roofline maximum of compute and HBM traffic, plus a fixed per-kernel cost:

.. math:: t = \max\left(\frac{2bmnk}{\eta P},\ \frac{2b(mk + kn + mn)}{\eta_\mathrm{HBM} B_\mathrm{HBM}}\right) + t_\mathrm{kernel}
"""

from numba import njit

from .layout import (C_ATTN_BWD_EFF, C_ATTN_EFF, C_ATTN_EXP_FLOPS, C_CAST_BYTES, C_GEMM_PEAK_EFF, C_HBM_EFF, C_KERNEL_S,
                     C_TILE_M, C_TILE_N)


@njit(cache=True)
def gemm_efficiency(m, n, batch, sms, peak_eff, tile_m, tile_n):
    """Achievable fraction of peak FLOP/s for a (batched) GEMM of shape m x n x k."""
    tiles_m = (m + tile_m - 1) // tile_m
    tiles_n = (n + tile_n - 1) // tile_n
    tiles = batch * tiles_m * tiles_n
    waves = (tiles + sms - 1) // sms
    quantisation = (batch * m * n) / (waves * sms * tile_m * tile_n)
    return peak_eff * quantisation


@njit(cache=True)
def gemm_time(m, n, k, batch, peak_flops, hbm_bw, sms, calib):
    """Seconds for a (batched) GEMM of shape m x n x k with 16-bit operands."""
    if m <= 0 or n <= 0 or k <= 0 or batch <= 0:
        return 0.0
    eff = gemm_efficiency(m, n, batch, sms, calib[C_GEMM_PEAK_EFF], calib[C_TILE_M], calib[C_TILE_N])
    flops = 2.0 * batch * m * n * k
    t_compute = flops / (eff * peak_flops)
    t_memory = 2.0 * batch * (m * k + k * n + m * n) / (calib[C_HBM_EFF] * hbm_bw)
    t = t_compute if t_compute > t_memory else t_memory
    return t + calib[C_KERNEL_S]


@njit(cache=True)
def gemm_fwd_bwd_time(m, n, k, batch, peak_flops, hbm_bw, sms, calib):
    """(forward, backward) seconds: backward is the data gradient (m x k x n) and the weight
    gradient (k x n x m)."""
    fwd = gemm_time(m, n, k, batch, peak_flops, hbm_bw, sms, calib)
    bwd = gemm_time(m, k, n, batch, peak_flops, hbm_bw, sms, calib) + gemm_time(
        k, n, m, batch, peak_flops, hbm_bw, sms, calib)
    return fwd, bwd


@njit(cache=True)
def memory_bound_time(nbytes, kernels, hbm_bw, calib):
    """Seconds for element-wise kernels that stream ``nbytes`` through HBM."""
    return nbytes / (calib[C_HBM_EFF] * hbm_bw) + kernels * calib[C_KERNEL_S]


@njit(cache=True)
def cast_time(elements, kernels, hbm_bw, calib):
    r"""Seconds to quantize ``elements`` 16-bit values to the plan's low precision (amax or block
    scales, the cast, and the transposed copy where the recipe needs one), at ``calib[C_CAST_BYTES]``
    bytes of HBM traffic per element (0 in bf16: no time):

    .. math:: t = \frac{B_\mathrm{cast}\, n}{\eta_\mathrm{HBM} B_\mathrm{HBM}} + k\, t_\mathrm{kernel}"""
    if calib[C_CAST_BYTES] <= 0.0:
        return 0.0
    return memory_bound_time(calib[C_CAST_BYTES] * elements, kernels, hbm_bw, calib)


@njit(cache=True)
def fused_attention_fwd_bwd_time(s_q, s_k, d, batch, peak_flops, hbm_bw, sms, calib):
    r"""(forward, backward) seconds of one of the two batched products inside a fused (flash)
    attention kernel, ``Q K^T`` or ``P V``, for ``batch`` (heads x sequences) of ``s_q`` queries
    against ``s_k`` keys of head width ``d``.

    The same roofline as :func:`gemm_time`, except that the ``s_q x s_k`` scores never reach HBM:
    each product moves only its width-``d`` operands and output (``2 b (s_q + s_k) d`` bytes in
    16 bits), so at long sequences it is compute-bound instead of bound by writing an
    ``s_q x s_k`` matrix. The backward computes two products of the same size (``dQ, dK`` or
    ``dP, dV``), twice the FLOPs and operand traffic, at ``r`` times the forward's efficiency
    (``calib[C_ATTN_BWD_EFF]``: the backward kernels are harder to keep busy; the FlashAttention
    papers measure about 0.85 for every kernel on A100 and H100). The kernel reaches ``a`` times the
    generation's GEMM efficiency (``calib[C_ATTN_EFF]``: 1 for a kernel written for the
    generation, less for an older kernel, e.g. FlashAttention-2 on Hopper):

    .. math:: t_\mathrm{fwd} = \max\left(\frac{2 b s_q s_k d}{a \eta P},\
              \frac{2 b (s_q + s_k) d}{\eta_\mathrm{HBM} B_\mathrm{HBM}}\right) + t_\mathrm{kernel},
          \qquad t_\mathrm{bwd} = 2 (t_\mathrm{fwd} - t_\mathrm{kernel}) / r + t_\mathrm{kernel}
    """
    if s_q <= 0 or s_k <= 0 or d <= 0 or batch <= 0:
        return 0.0, 0.0
    eff = calib[C_ATTN_EFF] * gemm_efficiency(s_q, s_k, batch, sms, calib[C_GEMM_PEAK_EFF], calib[C_TILE_M],
                                              calib[C_TILE_N])
    t_compute = 2.0 * batch * s_q * s_k * d / (eff * peak_flops)
    t_memory = 2.0 * batch * (s_q + s_k) * d / (calib[C_HBM_EFF] * hbm_bw)
    fwd = max(t_compute, t_memory)
    return fwd + calib[C_KERNEL_S], 2.0 * fwd / calib[C_ATTN_BWD_EFF] + calib[C_KERNEL_S]


@njit(cache=True)
def attention_exp_time(scores, peak_flops, calib):
    r"""Seconds of the exponentials of a fused attention's softmax over ``scores`` query-key pairs
    (heads x sequences included), once: the forward's ``P = exp(S - m)``, and again where the backward
    recomputes ``P`` from the saved log-sum-exp. They run on the special-function units
    (``MUFU.EX2``), 16 per streaming multiprocessor per clock on Ampere, Hopper and Blackwell, while
    the tensor cores compute many times more: ``F = calib[C_ATTN_EXP_FLOPS]`` dense 16-bit FLOPs in
    the time of one exponential (128 on A100, 256 on H100, 512 on B200). The second product waits for
    the softmax of its block, so the time adds to the products' (NVIDIA: on GB200 the tensor cores
    idle while the SFUs normalise the scores):

    .. math:: t_\mathrm{exp} = \frac{n_\mathrm{scores}\, F}{P}

    0 where ``F`` is 0 (not priced)."""
    return scores * calib[C_ATTN_EXP_FLOPS] / peak_flops
