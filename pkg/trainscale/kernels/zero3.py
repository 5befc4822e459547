r"""ZeRO-3 / FSDP communication of one layer and micro-batch: the layer's parameters all-gathered before
every use (forward, backward, the recomputed forward) and its gradients reduce-scattered.

PyTorch FSDP gathers a layer as one flat buffer and prefetches the next layer behind this layer's pass
(:func:`zero3_layer_time`, exposed through :func:`~trainscale.kernels.collectives.overlapped_exposed` in
:func:`trainscale.kernels.plan.plan_time`). DeepSpeed's ZeRO-3 of 2021 (``per_tensor``) fetches each weight
matrix (:func:`zero3_tensor_params`) separately, at one NIC's bandwidth plus a host cost per fetch
(:func:`zero3_tensor_gather_time`), one matrix ahead (:func:`zero3_tensor_windows`). The gathered buffers
a GPU holds are counted in :func:`trainscale.kernels.memory.shaped_memory_components`; ZeRO 0-2's
synchronisation once per step is :mod:`trainscale.kernels.dpsync`.
"""

from numba import njit

from .collectives import BYTES, allgather_time, group_split, node_allgather_time, out_link, overlapped_exposed
from .layout import (
    C_FETCH_S, C_GRAD_BYTES, C_NET_EFF, M_EXPERTS, M_FFN, M_FFN_MATS, M_HEADS, M_HIDDEN, M_KV_HEADS, M_PARAMS_EMBED,
    M_PARAMS_EXPERTS, M_PARAMS_LAYER, M_TENSORS_LAYER, S_SCALE_UP_BW, S_SCALE_UP_DOMAIN, S_SCALE_UP_LAT,
)


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
    (:func:`zero3_tensor_gather_time`). The flat gathers and the reduce-scatters are NCCL's ring, or PAT
    where the group has one GPU per node (:func:`~trainscale.kernels.collectives.node_allgather_time`).
    This form scales with bytes: the published 175B ZeRO-3
    runs (Narayanan et al. 2021, 384-1536 A100) take about as long as every GPU receiving its
    full share of the parameters through its own NIC in each pass, while a cost per tensor
    alone (the form used until 2026-12) fits those three runs but cannot carry to other sizes.
    """
    if n_shard * cp <= 1:
        return 0.0, 0.0, 0.0
    eff = calib[C_NET_EFF]
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
        gather = node_allgather_time(system, layer_bytes, group, tp, bw_z, lat_z, eff)
    scatter = node_allgather_time(system, grad_scale * layer_bytes, group, tp, bw_z, lat_z, eff)
    if model[M_EXPERTS] > 1.0 and e_shard * cp > 1:  # local experts, over the expert-data-parallel ranks
        e_group = e_shard * cp
        e_bytes = BYTES * model[M_PARAMS_EXPERTS] / (t * ep)
        bw_e, lat_e = out_link(system, e_group, tp * ep)
        gather += node_allgather_time(system, e_bytes, e_group, tp * ep, bw_e, lat_e, eff)
        scatter += node_allgather_time(system, grad_scale * e_bytes, e_group, tp * ep, bw_e, lat_e, eff)
    embed_bytes = BYTES * model[M_PARAMS_EMBED] / t
    per_end = 3.0 * node_allgather_time(system, embed_bytes, group, tp, bw_z, lat_z, eff)
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
    ``exposed`` :func:`~trainscale.kernels.collectives.overlapped_exposed` and ``h`` the host cost of a fetch (paid
    after the synchronisation, while the GPU waits). ``recomp_s``: the recomputed forward inside the backward (0
    without full recomputation), priced as a forward. Exact where every matrix holds at least the bucket's 5e7
    elements (GPT's projection, h^2: hidden 7,072 and up); for smaller models a bucket spans several matrices, which
    this prices pessimistically. Not modelled: ``stage3_max_live_parameters`` (1e9 by default) skips the prefetch
    while more is gathered, which would expose the fetches beside 530B's 1.3-1.7e9-element matrices; the never-fitted
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
