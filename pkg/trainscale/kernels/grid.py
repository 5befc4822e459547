"""Evaluate a whole grid of plans in parallel.

The grid is the Cartesian product of per-axis value arrays, flattened in C order over
``(tp, pp, cp, interleave, micro_batch, recompute, sequence_parallel, zero, shard_group,
overlap_grad_reduce, flash_attention, zero3_per_tensor, tp_comm_overlap, ep)``; ``dp`` follows from
the GPU count. Layer costs depend on only eight of the axes, so they are priced once per distinct combination
(first ``prange``), then every plan is assembled from its row of that table (second ``prange``).
Each iteration writes its own output row: no reductions, so results do not depend on the thread
count. :func:`evaluate_grid` is the dense grid (``ep = 1``, the last axis left out).
"""

import numpy as np
from numba import njit, prange

from .layout import L_SIZE, O_REASON, O_SIZE, R_GPUS, R_OK
from .plan import layer_costs, plan_costs

@njit(cache=True)
def grid_plan_costs(model, system, calib, lc, gpus, global_batch, tp, pp, cp, v, mb, rc, zero, shard, overlap,
                    per_tensor, out, ep=1, ends=0):
    """One grid entry: ``dp`` follows from the GPU count; returns it (0 when tp*pp*cp does not
    divide the GPUs, the plan then carrying the first structural reason, else ``R_GPUS``). ``ends``:
    the embedding / loss counted in the pipeline split (:func:`~trainscale.kernels.plan.split_reason`;
    a plan with pp 1 takes 0)."""
    ways = tp * pp * cp
    dp = gpus // ways if gpus % ways == 0 else 0
    plan_costs(model, system, calib, lc, gpus, tp, pp, dp if dp > 0 else 1, cp, v, mb, global_batch, rc, zero,
               shard, overlap, per_tensor, out, ep, 0, 0, ends if pp > 1 else 0)
    if dp == 0:
        reason = out[O_REASON]
        out[:] = np.nan
        out[O_REASON] = reason if reason != R_OK else R_GPUS
    return dp


@njit(parallel=True, cache=True)
def evaluate_grid_ep(model, system, calib, gpus, global_batch, tp_v, pp_v, cp_v, v_v, mb_v, rc_v, sp_v,
                     zero_v, shard_v, ovl_v, flash_v, tensor_v, tpo_v, ep_v, ends=0):
    """Return ``(results[n_plans, O_SIZE], dp[n_plans])`` for the flattened grid, ``ep`` last;
    ``ends`` (one per call) the pipeline split of every plan with pp > 1."""
    n_tp, n_cp, n_mb = tp_v.shape[0], cp_v.shape[0], mb_v.shape[0]
    n_rc, n_sp, n_fl, n_ep = rc_v.shape[0], sp_v.shape[0], flash_v.shape[0], ep_v.shape[0]
    n_tpo = tpo_v.shape[0]
    n_layer = n_tp * n_cp * n_mb * n_rc * n_sp * n_fl * n_tpo * n_ep
    table = np.empty((n_layer, L_SIZE))
    for j in prange(n_layer):
        i_ep = j % n_ep
        i_tpo = (j // n_ep) % n_tpo
        i_fl = (j // (n_ep * n_tpo)) % n_fl
        i_sp = (j // (n_ep * n_tpo * n_fl)) % n_sp
        i_rc = (j // (n_ep * n_tpo * n_fl * n_sp)) % n_rc
        i_mb = (j // (n_ep * n_tpo * n_fl * n_sp * n_rc)) % n_mb
        i_cp = (j // (n_ep * n_tpo * n_fl * n_sp * n_rc * n_mb)) % n_cp
        i_tp = j // (n_ep * n_tpo * n_fl * n_sp * n_rc * n_mb * n_cp)
        tp = tp_v[i_tp]
        cp = cp_v[i_cp]
        if tp < 1 or cp < 1:
            table[j, :] = np.nan
            continue
        layer_costs(model, system, calib, tp, cp, mb_v[i_mb], rc_v[i_rc], sp_v[i_sp] != 0,
                    flash_v[i_fl] != 0, table[j], ep_v[i_ep], tpo_v[i_tpo] != 0)

    n_pp, n_v, n_zero = pp_v.shape[0], v_v.shape[0], zero_v.shape[0]
    n_shard, n_ovl, n_ten = shard_v.shape[0], ovl_v.shape[0], tensor_v.shape[0]
    n = n_tp * n_pp * n_cp * n_v * n_mb * n_rc * n_sp * n_zero * n_shard * n_ovl * n_fl * n_ten * n_tpo * n_ep
    results = np.empty((n, O_SIZE))
    dps = np.zeros(n, dtype=np.int64)
    # C-order strides of (tp, pp, cp, v, mb, rc, sp, zero, shard, ovl, flash, per_tensor, tpo, ep), last fastest
    s_tpo = n_ep
    s_ten = s_tpo * n_tpo
    s_fl = s_ten * n_ten
    s_ovl = s_fl * n_fl
    s_shard = s_ovl * n_ovl
    s_zero = s_shard * n_shard
    s_sp = s_zero * n_zero
    s_rc = s_sp * n_sp
    s_mb = s_rc * n_rc
    s_v = s_mb * n_mb
    s_cp = s_v * n_v
    s_pp = s_cp * n_cp
    s_tp = s_pp * n_pp
    for i in prange(n):
        # decoded with scalars: no allocation inside the parallel loop
        i_ep = i % n_ep
        i_tpo = (i // s_tpo) % n_tpo
        i_ten = (i // s_ten) % n_ten
        i_fl = (i // s_fl) % n_fl
        i_ovl = (i // s_ovl) % n_ovl
        i_shard = (i // s_shard) % n_shard
        i_zero = (i // s_zero) % n_zero
        i_sp = (i // s_sp) % n_sp
        i_rc = (i // s_rc) % n_rc
        i_mb = (i // s_mb) % n_mb
        i_v = (i // s_v) % n_v
        i_cp = (i // s_cp) % n_cp
        i_pp = (i // s_pp) % n_pp
        i_tp = i // s_tp
        j = ((((((i_tp * n_cp + i_cp) * n_mb + i_mb) * n_rc + i_rc) * n_sp + i_sp) * n_fl + i_fl) * n_tpo
             + i_tpo) * n_ep + i_ep
        dps[i] = grid_plan_costs(model, system, calib, table[j], gpus, global_batch, tp_v[i_tp], pp_v[i_pp],
                                 cp_v[i_cp], v_v[i_v], mb_v[i_mb], rc_v[i_rc], zero_v[i_zero], shard_v[i_shard],
                                 ovl_v[i_ovl] != 0, tensor_v[i_ten] != 0, results[i], ep_v[i_ep], ends)
    return results, dps


def evaluate_grid(model, system, calib, gpus, global_batch, tp_v, pp_v, cp_v, v_v, mb_v, rc_v, sp_v,
                  zero_v, shard_v, ovl_v, flash_v, tensor_v, tpo_v):
    """Return ``(results[n_plans, O_SIZE], dp[n_plans])`` for the flattened dense grid (``ep = 1``).

    A plain Python function on purpose: Numba's on-disk cache of a function that calls a
    ``parallel=True`` kernel compiled in another process can crash when it is loaded (a cached
    caller linked against the cached parfor), so no cached kernel calls a parallel one."""
    return evaluate_grid_ep(model, system, calib, gpus, global_batch, tp_v, pp_v, cp_v, v_v, mb_v, rc_v, sp_v,
                            zero_v, shard_v, ovl_v, flash_v, tensor_v, tpo_v, np.ones(1, dtype=np.int64))
