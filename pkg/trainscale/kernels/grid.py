"""Evaluate a whole grid of plans in parallel.

The grid is the Cartesian product of per-axis value arrays, flattened in C order over
``(tp, pp, cp, interleave, micro_batch, recompute, sequence_parallel, zero, shard_group,
overlap_grad_reduce, flash_attention, zero3_per_tensor)``; ``dp`` follows from the GPU count. Layer costs depend on
only six of the axes, so they are priced once per distinct combination (first ``prange``), then
every plan is assembled from its row of that table (second ``prange``). Each iteration writes its
own output row: no reductions, so results do not depend on the thread count.
"""

import numpy as np
from numba import njit, prange

from .layout import L_SIZE, O_REASON, O_SIZE, R_GPUS
from .plan import layer_costs, plan_costs

N_AXES = 12


@njit(cache=True)
def _unravel(index, sizes, idx):
    for axis in range(sizes.shape[0] - 1, -1, -1):
        idx[axis] = index % sizes[axis]
        index //= sizes[axis]


@njit(parallel=True, cache=True)
def evaluate_grid(model, system, calib, gpus, global_batch, tp_v, pp_v, cp_v, v_v, mb_v, rc_v, sp_v,
                  zero_v, shard_v, ovl_v, flash_v, tensor_v):
    """Return ``(results[n_plans, O_SIZE], dp[n_plans])`` for the flattened grid."""
    n_tp, n_cp, n_mb = tp_v.shape[0], cp_v.shape[0], mb_v.shape[0]
    n_rc, n_sp, n_fl = rc_v.shape[0], sp_v.shape[0], flash_v.shape[0]
    n_layer = n_tp * n_cp * n_mb * n_rc * n_sp * n_fl
    table = np.empty((n_layer, L_SIZE))
    for j in prange(n_layer):
        i_fl = j % n_fl
        i_sp = (j // n_fl) % n_sp
        i_rc = (j // (n_fl * n_sp)) % n_rc
        i_mb = (j // (n_fl * n_sp * n_rc)) % n_mb
        i_cp = (j // (n_fl * n_sp * n_rc * n_mb)) % n_cp
        i_tp = j // (n_fl * n_sp * n_rc * n_mb * n_cp)
        tp = tp_v[i_tp]
        cp = cp_v[i_cp]
        if tp < 1 or cp < 1:
            table[j, :] = np.nan
            continue
        layer_costs(model, system, calib, tp, cp, mb_v[i_mb], rc_v[i_rc], sp_v[i_sp] != 0,
                    flash_v[i_fl] != 0, table[j])

    sizes = np.array([tp_v.shape[0], pp_v.shape[0], cp_v.shape[0], v_v.shape[0], mb_v.shape[0],
                      rc_v.shape[0], sp_v.shape[0], zero_v.shape[0], shard_v.shape[0], ovl_v.shape[0],
                      flash_v.shape[0], tensor_v.shape[0]], dtype=np.int64)
    n = 1
    for k in range(N_AXES):
        n *= sizes[k]
    results = np.empty((n, O_SIZE))
    dps = np.zeros(n, dtype=np.int64)
    for i in prange(n):
        idx = np.empty(N_AXES, dtype=np.int64)
        _unravel(i, sizes, idx)
        tp = tp_v[idx[0]]
        pp = pp_v[idx[1]]
        cp = cp_v[idx[2]]
        ways = tp * pp * cp
        dp = gpus // ways if gpus % ways == 0 else 0
        dps[i] = dp
        j = ((((idx[0] * n_cp + idx[2]) * n_mb + idx[4]) * n_rc + idx[5]) * n_sp + idx[6]) * n_fl + idx[10]
        plan_costs(model, system, calib, table[j], gpus, tp, pp, dp if dp > 0 else 1, cp, v_v[idx[3]],
                   mb_v[idx[4]], global_batch, rc_v[idx[5]], zero_v[idx[7]], shard_v[idx[8]],
                   ovl_v[idx[9]] != 0, tensor_v[idx[11]] != 0, results[i])
        if dp == 0:
            results[i, :] = np.nan
            results[i, O_REASON] = R_GPUS
    return results, dps
