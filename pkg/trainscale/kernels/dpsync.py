r"""Data-parallel gradient synchronisation, once per step (:func:`dp_sync_time`).

ZeRO 0 all-reduces the gradients; ZeRO 1-2 reduce-scatter them in the shard group and, after the
optimizer step, all-gather the updated 16-bit weights; hybrid sharding all-reduces the shards across
the replicas as well. The collectives are :mod:`trainscale.kernels.collectives`' over the group's link
(:func:`~trainscale.kernels.collectives.out_link`). ZeRO-3 gathers and reduces per layer instead
(:mod:`trainscale.kernels.zero3`); what of the synchronisation hides behind the last micro-batch's
backward and the next step's first forward is priced by :func:`trainscale.kernels.plan.plan_time`.
"""

from numba import njit

from .collectives import BYTES, allgather_time, allreduce_time, out_link
from .layout import C_BF16_OPTIMIZER, C_NET_EFF, S_SCALE_UP_BW, S_SCALE_UP_DOMAIN, S_SCALE_UP_LAT


@njit(cache=True)
def dp_sync_time(system, calib, params, grad_bytes, group_ranks, stride, n_shard, dp_replicas, zero):
    """Gradient synchronisation of one step for ``params`` parameters over ``group_ranks``
    data-parallel ranks ``stride`` apart: ``(reduce_s, gather_s)``.

    ZeRO 0: an all-reduce of the gradients (``grad_bytes`` each). ZeRO 1-2: a reduce-scatter of the
    gradients and, after the optimizer step, an all-gather of the updated 16-bit weights, in the
    shard group of ``n_shard`` ranks (ZeRO 3 gathers and reduces per layer instead, see
    :func:`~trainscale.kernels.zero3.zero3_layer_time`). An optimizer that shards its states but reduces every gradient
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
