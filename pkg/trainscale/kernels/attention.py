r"""The attention block's shapes: multi-head (and grouped-query) attention, and multi-head latent attention.

Multi-head attention projects the hidden state (width ``h``) to the queries (``a`` heads of ``d`` channels:
``q_w = a d``) and to ``kv`` = ``a_kv d`` channels each of keys and values; each head scores and returns
``d`` channels.

Multi-head latent attention (DeepSeek-V2/V3, Megatron-Core's ``MLASelfAttention`` at NVIDIA/Megatron-LM
d98e8a6, ``megatron/core/transformer/multi_latent_attention.py``) projects the hidden state down to a query
latent of ``r_q`` channels and a key-value latent of ``r_kv`` channels plus one rotary key of ``d_r``
channels shared by the heads, then up again, per head, to ``d_n + d_r`` query channels and ``d_n`` key and
``d_v`` value channels. Each head scores with ``d_{qk} = d_n + d_r`` channels and returns ``d_v``:

.. math:: \mathrm{FLOPs/token} = 2\,[\,h r_q + r_q a d_{qk} + h (r_{kv} + d_r) + r_{kv} a (d_n + d_v)\,]
          \quad(\text{projections in}), \qquad 2\, a d_v h \quad(\text{out})

The two down projections are duplicated on every tensor-parallel rank (``parallel_mode='duplicated'``), run
on the rank's ``m / t`` tokens under sequence parallelism (on all ``m`` without); the up projections are
column-parallel. With sequence parallelism the up projections' inputs (the latents) are gathered instead of
the hidden state; that smaller gather is not priced apart (the layer's two all-gathers stay ``m h`` each).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .compute import gemm_fwd_bwd_time
from .layout import M_HEAD_DIM, M_HEADS, M_HIDDEN, M_KV_HEADS, M_KV_LORA, M_Q_LORA, M_QK_HEAD, M_QK_POS, M_V_HEAD


FLASH_BLOCK = 128.0  # key/value block of FlashAttention-2 and cuDNN's fused attention on Ampere/Hopper


@njit(cache=True)
def is_latent_attention(model):
    return model[M_KV_LORA] > 0.0


@njit(cache=True)
def attention_widths(model):
    """(``d_qk``, ``d_v``, ``q_w``, ``kv``) of one layer: the channels per head its scores use and its values
    return, the width of the attention output (the output projection's input) and the width of its keys (and of
    its values; under latent attention every head has its own keys and values, and ``kv`` is their mean width
    ``a (d_qk + d_v) / 2``, so that keys and values together are ``2 kv`` channels as in multi-head attention)."""
    h = model[M_HIDDEN]
    a = model[M_HEADS]
    if is_latent_attention(model):
        d_qk = model[M_QK_HEAD] + model[M_QK_POS]
        d_v = model[M_V_HEAD]
        return d_qk, d_v, a * d_v, 0.5 * a * (d_qk + d_v)
    d = h / a
    qw = h
    if model[M_HEAD_DIM] > 0.0:
        d = model[M_HEAD_DIM]
        qw = a * d
    return d, d, qw, model[M_KV_HEADS] * d


@njit(cache=True)
def qkv_projection_flops(model, tokens, qw, kv):
    """Forward FLOPs of the projections into the attention core for ``tokens`` tokens, all tensor-parallel
    ranks together (module docstring); ``qw``, ``kv`` from :func:`attention_widths`."""
    h = model[M_HIDDEN]
    if not is_latent_attention(model):
        return 2.0 * tokens * h * (qw + 2.0 * kv)
    down = h * model[M_Q_LORA] + h * (model[M_KV_LORA] + model[M_QK_POS])  # no query latent: h * 0
    return 2.0 * tokens * down + up_projection_flops(model, tokens)


@njit(cache=True)
def qkv_projection_time(model, m, tp, sp, qw, kv, peak, hbm_bw, sms, calib):
    """(forward, backward) seconds of the projections into the attention core on one GPU for ``m`` tokens:
    one fused QKV GEMM of ``(q_w + 2 kv) / t`` columns, or latent attention's four (module docstring)."""
    h = int(model[M_HIDDEN])
    one = np.int64(1)
    if not is_latent_attention(model):
        return gemm_fwd_bwd_time(m, (int(qw) + 2 * int(kv)) // tp, h, one, peak, hbm_bw, sms, calib)
    q_lora = int(model[M_Q_LORA])
    rows_down = m // tp if sp else m  # duplicated down projections, on the sequence shard where there is one
    f_qd, b_qd = 0.0, 0.0
    if q_lora > 0:
        f_qd, b_qd = gemm_fwd_bwd_time(rows_down, q_lora, h, one, peak, hbm_bw, sms, calib)
    f_kd, b_kd = gemm_fwd_bwd_time(rows_down, int(model[M_KV_LORA] + model[M_QK_POS]), h, one, peak, hbm_bw, sms,
                                   calib)
    f_up, b_up = up_projection_time(model, m, tp, peak, hbm_bw, sms, calib)
    return f_qd + f_kd + f_up, b_qd + b_kd + b_up


@njit(cache=True)
def up_projection_time(model, m, tp, peak, hbm_bw, sms, calib):
    """(forward, backward) seconds of latent attention's two column-parallel up projections on one GPU for ``m``
    tokens, from the query latent (or the hidden state where there is none) and the key-value latent; their forward
    is what Megatron-Core's ``recompute_modules=["mla_up_proj"]`` re-runs (:mod:`trainscale.kernels.activations`)."""
    one = np.int64(1)
    a = int(model[M_HEADS])
    q_in = int(model[M_Q_LORA]) if model[M_Q_LORA] > 0.0 else int(model[M_HIDDEN])
    d_qk = int(model[M_QK_HEAD] + model[M_QK_POS])
    f_qu, b_qu = gemm_fwd_bwd_time(m, a * d_qk // tp, q_in, one, peak, hbm_bw, sms, calib)
    up = a * int(model[M_QK_HEAD] + model[M_V_HEAD]) // tp
    f_ku, b_ku = gemm_fwd_bwd_time(m, up, int(model[M_KV_LORA]), one, peak, hbm_bw, sms, calib)
    return f_qu + f_ku, b_qu + b_ku


@njit(cache=True)
def up_projection_flops(model, tokens):
    """Forward FLOPs of latent attention's two up projections for ``tokens`` tokens, all tensor-parallel ranks."""
    a = model[M_HEADS]
    q_in = model[M_Q_LORA] if model[M_Q_LORA] > 0.0 else model[M_HIDDEN]
    d_qk = model[M_QK_HEAD] + model[M_QK_POS]
    return 2.0 * tokens * (q_in * a * d_qk + model[M_KV_LORA] * a * (model[M_QK_HEAD] + model[M_V_HEAD]))


@njit(cache=True)
def rotary_widths(model, h, kv):
    """(query, key) channels per token that a rotary embedding rotates: ``h`` and ``kv``, or latent attention's
    ``a d_r`` query channels and its one shared rotary key of ``d_r``."""
    if not is_latent_attention(model):
        return h, kv
    return model[M_HEADS] * model[M_QK_POS], model[M_QK_POS]


@njit(cache=True)
def linear_input_width(model, h, qw):
    """Channels per token entering the attention block's linear layers (what a low-precision recipe casts):
    ``h`` and ``q_w``, and under latent attention also the two latents."""
    if not is_latent_attention(model):
        return h + qw
    return h + qw + model[M_Q_LORA] + model[M_KV_LORA]


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
