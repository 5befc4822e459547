r"""Data-parallel gradient synchronisation, once per step (:func:`dp_sync_time`).

ZeRO 0 all-reduces the gradients; ZeRO 1-2 reduce-scatter them in the shard group and, after the
optimizer step, all-gather the updated 16-bit weights; hybrid sharding all-reduces the shards across
the replicas as well. The collectives are :mod:`trainscale.kernels.collectives`' over the group's link
(:func:`~trainscale.kernels.collectives.out_link`), as NCCL picks them: PAT for the reduce-scatter and
all-gather of a group with one GPU per node, NVLS for an all-reduce inside one NVSwitch domain.

The stack sends the gradients in buckets (:func:`dp_buckets`), each its own collectives, so each pays
the collective's latency: Megatron-Core buckets ``max(40M, 1M x dp)`` parameters when the gradient
reduction is overlapped, and sends one bucket otherwise; DeepSpeed 500M elements; FSDP one wrapped
block (a layer) at a time. The bytes are the
same however they are cut, so the buckets change only the latency term, which grows with the group.
ZeRO-3 gathers and reduces per layer instead (:mod:`trainscale.kernels.zero3`); what of the
synchronisation hides behind the last micro-batch's backward and the next step's first forward is
priced by :func:`trainscale.kernels.plan.plan_time`.
"""

import math

from numba import njit

from .collectives import BYTES, domain_allreduce_time, node_allgather_time, out_link
from .layout import (C_BF16_OPTIMIZER, C_DP_BUCKET_FLOOR, C_DP_BUCKET_OVERLAP_ONLY, C_DP_BUCKET_PER_BLOCK,
                     C_DP_BUCKET_PER_RANK, C_NET_EFF)


@njit(cache=True)
def dp_buckets(calib, params, layer_params, group_ranks, overlap):
    """How many buckets the stack cuts ``params`` gradients into over ``group_ranks`` data-parallel
    ranks: ``ceil(params / max(floor, per_rank x group_ranks))`` (``calib``'s ``C_DP_BUCKET_*``), one
    where the stack buckets only with overlapped reduction and ``overlap`` is off, and one per layer
    (``layer_params`` each) where the stack reduces per wrapped block (``C_DP_BUCKET_PER_BLOCK``: FSDP)."""
    if params <= 0.0:
        return 1.0
    if calib[C_DP_BUCKET_OVERLAP_ONLY] > 0.0 and not overlap:
        return 1.0
    if calib[C_DP_BUCKET_PER_BLOCK] > 0.0:
        size = layer_params
    else:
        size = max(calib[C_DP_BUCKET_FLOOR], calib[C_DP_BUCKET_PER_RANK] * group_ranks)
    if size <= 0.0:
        return 1.0
    return float(math.ceil(params / size))


@njit(cache=True)
def dp_sync_time(system, calib, params, layer_params, grad_bytes, group_ranks, stride, n_shard, dp_replicas, zero,
                 overlap):
    """Gradient synchronisation of one step for ``params`` parameters over ``group_ranks``
    data-parallel ranks ``stride`` apart: ``(reduce_s, gather_s)``.

    ZeRO 0: an all-reduce of the gradients (``grad_bytes`` each). ZeRO 1-2: a reduce-scatter of the
    gradients and, after the optimizer step, an all-gather of the updated 16-bit weights, in the
    shard group of ``n_shard`` ranks (ZeRO 3 gathers and reduces per layer instead, see
    :func:`~trainscale.kernels.zero3.zero3_layer_time`). An optimizer that shards its states but reduces every gradient
    everywhere (``calib[C_BF16_OPTIMIZER]`` = 1: DeepSpeed's BF16_Optimizer, whose engine passes
    ``get_grads_for_reduction()`` to ``buffered_allreduce_fallback``) all-reduces instead of
    reduce-scattering, twice the bytes on the wire. With hybrid sharding (``dp_replicas`` > 1) the
    shards are also all-reduced across the replicas (counted with the reduction). Each collective
    runs once per bucket (:func:`dp_buckets`; ``layer_params``: one layer's parameters on this GPU;
    ``overlap``: the plan's overlapped gradient reduction)."""
    eff = calib[C_NET_EFF]
    buckets = dp_buckets(calib, params, layer_params, group_ranks, overlap)
    per_bucket = params / buckets
    if zero == 0:
        bw_d, lat_d = out_link(system, group_ranks, stride)
        return buckets * domain_allreduce_time(system, grad_bytes * per_bucket, group_ranks, stride, bw_d, lat_d,
                                               eff), 0.0
    shard_ranks = group_ranks // dp_replicas if dp_replicas > 0 else group_ranks
    reduce = 0.0
    gather = 0.0
    if zero <= 2:
        bw_d, lat_d = out_link(system, shard_ranks, stride)
        if calib[C_BF16_OPTIMIZER] > 0.0:
            reduce = domain_allreduce_time(system, grad_bytes * per_bucket, shard_ranks, stride, bw_d, lat_d, eff)
        else:
            reduce = node_allgather_time(system, grad_bytes * per_bucket, shard_ranks, stride, bw_d, lat_d, eff)
        gather = node_allgather_time(system, BYTES * per_bucket, shard_ranks, stride, bw_d, lat_d, eff)
    if dp_replicas > 1:
        rstride = stride * shard_ranks
        bw_d, lat_d = out_link(system, dp_replicas, rstride)
        reduce += domain_allreduce_time(system, grad_bytes * per_bucket / n_shard, dp_replicas, rstride, bw_d, lat_d,
                                        eff)
    return buckets * reduce, buckets * gather
