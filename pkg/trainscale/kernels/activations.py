r"""What one layer keeps for its backward, per token, in units of ``h`` bytes (Korthikanti et al. 2022, eq. 1-2:
``34`` for GPT), with the linear layers' saved inputs in the plan's precision and the modules that Megatron-Core's
selective recomputation discards.

**Saved linear inputs.** A linear layer keeps its input for the weight gradient. In bf16 that is the 16-bit input
itself (2 bytes per element), shared with whatever else keeps the same tensor. Under a low-precision recipe
Transformer Engine keeps the quantized copy it made for the GEMM, only its column-wise part (``q`` bytes per
element: ``saved_input_bytes_per_element`` of the recipe in ``data/calibration.yaml``), and the 16-bit input is
freed unless something else keeps it (NVIDIA/TransformerEngine d0067d0, ``transformer_engine/pytorch/module/
linear.py`` ``_Linear.forward``: "Discard row-wise data since it is not needed in backward pass",
``inputmat.update_usage(rowwise_usage=False, columnwise_usage=True)``; ``saved_inputmat = inputmat``; the same in
``layernorm_linear.py`` for the normed input and ``grouped_linear.py`` for the experts). The attention core's
output is kept in 16 bits by the fused attention for its own backward, so there the quantized copy is extra.
Writing ``q_i`` for what a saved linear input costs (``q``, or 2 in bf16), per token:

.. math:: \text{MHA/GQA: } 5 + \frac{4 h_{kv}}{h} + q_i + [q]\frac{q_w}{h},\qquad
          \text{MLP: } 1 + q_i + \frac{2(n_f-1) f + q_i f}{h},\qquad
          \text{MoE: } 3 + R\Bigl(q_i + \frac{2(n_f-1) f + q_i f}{h}\Bigr) + [q] + \frac{2(n_f-1) f_s + q_i f_s}{h}

(``[q]``: the extra quantized copy, 0 in bf16; ``R = c k \rho`` routed copies per token on the busiest rank; the
last two terms for shared experts of total width ``f_s``; 1 byte each of the dropout masks, 0 for a model without
dropout: :func:`dropout_mask_units`). Latent attention: see
:func:`attention_saved_units`. In bf16 these are :mod:`trainscale.kernels.layer`'s former counts, plus the shared
experts' activations, which were not counted before.

**Selective recomputation of named modules** (Megatron-Core's ``recompute_granularity="selective"`` with
``recompute_modules``; NVIDIA/Megatron-LM d98e8a6 ``megatron/core/transformer/transformer_config.py``,
``transformer_layer.py``, ``multi_latent_attention.py``, ``moe/experts.py``): a bitmask
(``calib[C_RECOMPUTE_MODULES]``, bits ``RM_*`` of :mod:`.layout`) of

* ``core_attn``: the attention core (the default; with a fused attention nothing of it is kept anyway);
* ``mla_up_proj``: latent attention's up projections, whose outputs (the per-head Q, K, V) are discarded and
  re-made before the core's backward: ``2 a (2 d_{qk} + d_v)`` bytes per token;
* ``layernorm``: the norms that are modules of their own (not fused into the next linear layer): a MoE layer's
  pre-MLP norm (its 16-bit output, the router's input: 2) and latent attention's input norm (its output, which in
  bf16 is the down projections' saved input: 2; under a low precision they keep their own copies);
* ``moe_act``: the routed experts' activation function: its output, the second expert GEMM's saved input
  (``R q_i f / h``);
* ``mlp``: a dense layer's whole MLP (MoE layers ignore it): all of the MLP's activations but the dropout mask;
* ``moe``: a MoE layer's whole MoE block: everything but its input (the norm's output) and the mask;
* ``shared_experts``: the shared experts' activations.

Discarded bytes are re-made one layer at a time in the backward (the layer's transient memory); their forward is
re-run (:func:`trainscale.kernels.layer.layer_costs`). Without sequence parallelism the discarded bytes are taken
from the tensor-parallel shard.
"""

import numpy as np
from numba import njit

from .layout import (
    C_RECOMPUTE_MODULES, C_SAVED_INPUT_BYTES, M_ATTENTION_DROPOUT, M_CAPACITY, M_EXPERTS, M_HEADS, M_HIDDEN_DROPOUT,
    M_KV_LORA, M_Q_LORA, M_QK_HEAD, M_QK_POS, M_SHARED_FFN, M_TOP_K, M_V_HEAD, RM_LAYERNORM, RM_MLA_UP_PROJ, RM_MLP,
    RM_MOE, RM_MOE_ACT, RM_SHARED_EXPERTS,
)


@njit(cache=True)
def recomputes(calib, bit):
    """Whether the plan's selective recomputation includes the module ``bit`` (``RM_*``)."""
    return (int(calib[C_RECOMPUTE_MODULES]) & bit) != 0


@njit(cache=True)
def dropout_mask_units(model):
    """The 1-byte mask a block's output dropout keeps per element, in units of ``h`` bytes per token: 1, or 0 for
    a model that trains without dropout (``model[M_HIDDEN_DROPOUT] == 0``: PyTorch makes no mask at p = 0)."""
    return 1.0 if model[M_HIDDEN_DROPOUT] > 0.0 else 0.0


@njit(cache=True)
def unfused_score_bytes(model):
    r"""Bytes an attention core without a fused kernel keeps per ``s x s`` score and head (Korthikanti et al. 2022:
    ``5 a s^2 b``): the softmax's 16-bit output, and where the model has an attention dropout its 1-byte mask and
    16-bit output (5); without one the softmax's output is the values' input (2)."""
    return 5.0 if model[M_ATTENTION_DROPOUT] > 0.0 else 2.0


@njit(cache=True)
def saved_input_bytes(calib):
    """(``q_i``, ``q_copy``): bytes per element of a linear layer's saved input (2 in bf16), and of the extra
    quantized copy a linear keeps beside a 16-bit tensor kept anyway (0 in bf16)."""
    q = calib[C_SAVED_INPUT_BYTES]
    if q > 0.0:
        return q, q
    return 2.0, 0.0


@njit(cache=True)
def attention_saved_units(model, h, kv, qw, calib):
    """(kept, discarded) bytes per token of the attention block, in units of ``h`` (module docstring).

    Latent attention keeps the normed hidden state (the down projections' input), the query latent before its
    norm and after it (the up projection's input), the key-value latent and rotary key before the norm and the
    latent after it, the expanded per-head Q, K and V and the core's output (16 bits), and the dropout mask:

    .. math:: 1 + q_i + \\frac{(2 + q_i) r_q + 2 (r_{kv} + d_r) + q_i r_{kv} + 2a(2 d_{qk} + d_v) + (2 + [q]) a d_v}{h}"""
    q_i, q_copy = saved_input_bytes(calib)
    mask = dropout_mask_units(model)
    discarded = 0.0
    if model[M_KV_LORA] <= 0.0:
        return 4.0 + mask + 4.0 * kv / h + q_i + q_copy * qw / h, discarded
    a = model[M_HEADS]
    q_lora = model[M_Q_LORA]
    kv_lora = model[M_KV_LORA]
    d_qk = model[M_QK_HEAD] + model[M_QK_POS]
    expanded = 2.0 * a * (2.0 * d_qk + model[M_V_HEAD])
    latents = (2.0 + q_i) * q_lora + 2.0 * (kv_lora + model[M_QK_POS]) + q_i * kv_lora
    kept = mask + q_i + (latents + expanded + (2.0 + q_copy) * a * model[M_V_HEAD]) / h
    if recomputes(calib, np.int64(RM_MLA_UP_PROJ)):
        discarded += expanded / h
    if recomputes(calib, np.int64(RM_LAYERNORM)) and q_copy == 0.0:  # bf16: the norm's output is the down projections' input
        discarded += 2.0
    return kept - discarded, discarded


@njit(cache=True)
def mlp_saved_units(model, h, f, nf, calib, imbalance):
    """(kept, discarded) bytes per token of the MLP or MoE block, in units of ``h`` (module docstring)."""
    q_i, q_copy = saved_input_bytes(calib)
    mask = dropout_mask_units(model)
    inner = 2.0 * (nf - 1.0) * f + q_i * f  # the first GEMM's output and the activation's (the second's input)
    if model[M_EXPERTS] <= 1.0:
        kept = mask + q_i + inner / h
        if recomputes(calib, np.int64(RM_MLP)):
            return mask, kept - mask
        return kept, 0.0
    routed = model[M_CAPACITY] * model[M_TOP_K] * imbalance
    experts = routed * (q_i + inner / h)
    shared = 0.0
    fs = model[M_SHARED_FFN]
    if fs > 0.0:
        shared = q_copy + (2.0 * (nf - 1.0) * fs + q_i * fs) / h
    kept = 2.0 + mask + experts + shared  # the norm's 16-bit output (the router's input) and the mask
    if recomputes(calib, np.int64(RM_MOE)):
        return 2.0 + mask, kept - 2.0 - mask
    discarded = 0.0
    if recomputes(calib, np.int64(RM_MOE_ACT)):
        discarded += routed * q_i * f / h
    if recomputes(calib, np.int64(RM_SHARED_EXPERTS)):
        discarded += shared
    if recomputes(calib, np.int64(RM_LAYERNORM)):  # the pre-MLP norm's output, the router's 16-bit input
        discarded += 2.0
    return kept - discarded, discarded
