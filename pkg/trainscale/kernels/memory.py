r"""Per-GPU memory of a plan's most loaded pipeline stage, by component (``O_MEM_*``: weights, gradients,
optimizer states, activations, the transient of one layer's backward, buffers, reserved).

Model states per parameter (:func:`state_bytes_per_param`): 16-bit weights, gradients of the stack's
precision and 12 bytes of fp32 master weights and Adam moments (the ZeRO paper's ``2 + 2 + K``, K = 12),
divided over the shard ranks as ZeRO's stage shards them. Activations: the layer's bytes per micro-batch
(``L_ACT_BYTES``, Korthikanti et al. 2022: :func:`trainscale.kernels.layer.layer_costs`) times the
layer-micro-batches the device holds at its peak (:func:`trainscale.kernels.pipesplit.held_layers`). Of the
first, the most loaded middle and the last device (:func:`shaped_memory_components`), with ``P_d`` dense
and ``P^e_d`` expert parameters and ``A_d`` activation bytes,

.. math:: M = \max_d \left[P_d (w + g + o) + P^e_d (w_e + g_e + o_e) + A_d\right]
          + M_\mathrm{transient} + M_\mathrm{buffers} + M_\mathrm{reserved}.
"""

import numpy as np
from numba import njit

from .collectives import BYTES
from .layout import (
    C_BF16_OPTIMIZER, C_GRAD_BYTES, C_LP_WEIGHT_BYTES, C_RESERVED_BYTES, L_ACT_BYTES, L_HEAD_BYTES, L_WORK_BYTES,
    M_EXPERTS, M_LAYERS, M_MTP_LAYERS, M_PARAMS_EMBED, M_PARAMS_EXPERTS, M_PARAMS_HEAD, M_PARAMS_LAYER,
    M_TENSORS_LAYER,
    O_MEM_ACTIVATIONS, O_MEM_BUFFERS, O_MEM_GRADS, O_MEM_OPTIMIZER, O_MEM_RESERVED, O_MEM_TRANSIENT, O_MEM_WEIGHTS,
)
from .pipesplit import device_layers, held_layers, split_chunk_layers, split_stage_layers
from .zero3 import zero3_tensor_params

OPTIMIZER_BYTES_PER_PARAM = 12.0  # fp32 master weights, Adam m and v (ZeRO paper's K = 12)


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
    per_device = device_layers(chunks)
    best = 1
    for d in range(2, chunks.shape[1] - 1):
        if per_device[d] > per_device[best]:
            best = d
    return best


@njit(cache=True)
def stage_activation_bytes(act, chunks, pp, v, micro, d):
    """Activation bytes device ``d`` holds at its peak: ``act`` bytes per layer and micro-batch
    times :func:`~trainscale.kernels.pipesplit.held_layers` (in 1F1B written ``act L_d min(m, p - d)``, the order of
    operations of the closed form before uneven splits, so that even plans price to the bit as before)."""
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
    shape[k, 1]`` interleaved (:func:`~trainscale.kernels.pipesplit.held_layers`). It depends on the layout only
    (layers, pp, v, micro-batches and the split), so the search computes it once per layout, not once per plan
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
    ``last``, ``ends``: :func:`~trainscale.kernels.pipesplit.split_chunk_layers`). Device ``d`` holds the activations
    of :func:`~trainscale.kernels.pipesplit.held_layers` layer-micro-batches: ``min(m, p - d)`` micro-batches of its
    layers in 1F1B (Korthikanti et al. 2022 Sec. 4.2.3), its warm-up's chunks in interleaved 1F1B (the first device
    ``1 + (p-1)/(p v)`` times ``p``, the last ``(v - 1) p + 1`` chunks, not one micro-batch). The last device keeps
    the logits of one micro-batch of its last chunk in flight. Expert parameters (mixture of experts) are sharded over
    the expert-data-parallel ranks. DeepSpeed's BF16_Optimizer (``calib[C_BF16_OPTIMIZER]`` = 1, ZeRO 0-1) holds the
    16-bit gradients of every parameter as well as its fp32 accumulation buffer: its pipeline engine only zeroes them
    between micro-batches (``clear_lp_grads``, then ``update_hp_grads(clear_lp_grads=False)``), 2 more bytes per
    parameter. ZeRO-3 holds gathered weights beyond its shard: FSDP the layer in use and the prefetched next one;
    DeepSpeed (``per_tensor``, dense layers) the weight matrix in use and the next one
    (:func:`~trainscale.kernels.zero3.zero3_tensor_windows`). Experts are split over ``ep x etp`` GPUs (``etp`` 0:
    ``tp``). A low-precision plan holds its quantized weight copies beside the 16-bit weights
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
    mtp = model[M_MTP_LAYERS]  # multi-token prediction: its layers and a copy of the embedding on the last stage
    mtp_dense = mtp * p_layer + (model[M_PARAMS_EMBED] / t if mtp > 0 else 0.0)
    best = -1.0
    # candidate stages: first, middle-most loaded, last (one stage when pp == 1)
    n_stages = 1 if pp == 1 else (3 if pp > 2 else 2)
    for k in range(n_stages):
        if pp == 1:
            n_l = layers
            dense = layers * p_layer + (model[M_PARAMS_EMBED] + model[M_PARAMS_HEAD]) / t + mtp * p_layer
            a = act * layers + lc[L_HEAD_BYTES]
            k_shape = 0
            n_e = n_l + mtp
        else:  # the same operations, in the same order, as stage_activation_bytes
            k_shape = k if pp > 2 or k == 0 else 2
            n_l = shape[k_shape, 0]
            n_e = n_l
            a = act * shape[k_shape, 1] * shape[k_shape, 2] if v == 1 else act * shape[k_shape, 1]
            if k_shape == 0:
                dense = n_l * p_layer + model[M_PARAMS_EMBED] / t
            elif k_shape == 1:
                dense = n_l * p_layer
            else:
                dense = n_l * p_layer + model[M_PARAMS_HEAD] / t + mtp_dense
                a = a + lc[L_HEAD_BYTES]
                n_e = n_l + mtp
        experts = n_e * pe_layer
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
