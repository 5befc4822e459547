"""Evaluate a whole grid of plans, side by side on every core.

The grid is the Cartesian product of per-axis value arrays, flattened in C order over
``(tp, pp, cp, interleave, micro_batch, recompute, sequence_parallel, zero, shard_group,
overlap_grad_reduce, flash_attention, zero3_per_tensor, tp_comm_overlap, ep)``; ``dp`` follows from
the GPU count. Layer costs depend on only eight of the axes, so they are priced once per distinct combination
(:func:`layer_cost_table`, the search's kernel), then every plan is assembled from its row of that table
(:func:`price_grid_rows`, ranges of plans in threads: the kernel releases the GIL). Each plan writes its own
output row: no reductions, so results do not depend on the thread count. :func:`evaluate_grid` is the dense
grid (``ep = 1``, the last axis left out).
"""

from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from numba import njit, prange

from .layout import L_SIZE, O_MEM_BYTES, O_REASON, O_SIZE, O_STEP, R_GPUS, R_MEMORY, R_OK, R_STACK_RULE
from .layer import layer_costs
from .memory import SHAPE_STAGES
from .plan import plan_costs, plan_time, shaped_plan_memory, structural_reason

@njit(cache=True)
def grid_plan_costs(model, system, calib, lc, gpus, global_batch, tp, pp, cp, v, mb, rc, zero, shard, overlap,
                    per_tensor, out, ep=1, ends=0, etp=0):
    """One grid entry: ``dp`` follows from the GPU count; returns it (0 when tp*pp*cp does not
    divide the GPUs, the plan then carrying the first structural reason, else ``R_GPUS``). ``ends``:
    the embedding / loss counted in the pipeline split (:func:`~trainscale.kernels.pipesplit.split_reason`;
    a plan with pp 1 takes 0); ``etp`` the experts' tensor-parallel degree (0: ``tp``)."""
    ways = tp * pp * cp
    dp = gpus // ways if gpus % ways == 0 else 0
    plan_costs(model, system, calib, lc, gpus, tp, pp, dp if dp > 0 else 1, cp, v, mb, global_batch, rc, zero,
               shard, overlap, per_tensor, out, ep, np.int64(0), np.int64(0), ends if pp > 1 else 0, etp)
    if dp == 0:
        reason = out[O_REASON]
        out[:] = np.nan
        out[O_REASON] = reason if reason != R_OK else R_GPUS
    return dp


@njit(cache=True, nogil=True)
def price_grid_rows(model, system, calib, table, gpus, global_batch, tp_v, pp_v, cp_v, v_v, mb_v, rc_v, sp_v, zero_v,
                    shard_v, ovl_v, flash_v, tensor_v, tpo_v, ep_v, etp_v, ends, results, dps, start, stop):
    """Price the flattened grid's plans ``start <= i < stop`` into ``results[i]`` and ``dps[i]`` from the layer
    table of :func:`layer_cost_table` (its keys every ``(tp, cp, micro_batch)`` of the axes, in C order). Each
    plan writes its own row: no reductions, so the result does not depend on how the range is cut."""
    n_tp, n_cp, n_mb = tp_v.shape[0], cp_v.shape[0], mb_v.shape[0]
    n_rc, n_sp, n_fl, n_ep = rc_v.shape[0], sp_v.shape[0], flash_v.shape[0], ep_v.shape[0]
    n_tpo = tpo_v.shape[0]
    n_pp, n_v, n_zero = pp_v.shape[0], v_v.shape[0], zero_v.shape[0]
    n_shard, n_ovl, n_ten = shard_v.shape[0], ovl_v.shape[0], tensor_v.shape[0]
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
    for i in range(start, stop):
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
                                 ovl_v[i_ovl] != 0, tensor_v[i_ten] != 0, results[i], ep_v[i_ep], ends,
                                 etp_v[i_ep])


# a grid smaller than this many plans per thread is priced in one call (a thread costs more than it saves)
MIN_PLANS_PER_THREAD = 16384


def grid_layer_table(model, system, calib, tp_v, cp_v, mb_v, rc_v, sp_v, flash_v, tpo_v, ep_v, etp_v) -> np.ndarray:
    """The dense grid's layer costs: :func:`layer_cost_table` of every ``(tp, cp, micro_batch)`` of the axes in
    C order (the search's kernel, with its argument types: one compiled table for both); rows of a tp or cp
    below 1 are NaN."""
    keys = np.ascontiguousarray(np.stack(np.meshgrid(tp_v, cp_v, mb_v, indexing="ij"), axis=-1).reshape(-1, 3),
                                dtype=np.int64)
    per_key = rc_v.shape[0] * sp_v.shape[0] * flash_v.shape[0] * tpo_v.shape[0] * ep_v.shape[0]
    valid = (keys[:, 0] >= 1) & (keys[:, 1] >= 1)
    if valid.all():
        return layer_cost_table(model, system, calib, keys, rc_v, sp_v, flash_v, tpo_v, ep_v, etp_v)
    table = np.full((keys.shape[0], per_key, L_SIZE), np.nan)
    if valid.any():
        priced = layer_cost_table(model, system, calib, np.ascontiguousarray(keys[valid]), rc_v, sp_v, flash_v,
                                  tpo_v, ep_v, etp_v)
        table[valid] = priced.reshape(-1, per_key, L_SIZE)
    return table.reshape(-1, L_SIZE)


def evaluate_grid_ep(model, system, calib, gpus, global_batch, tp_v, pp_v, cp_v, v_v, mb_v, rc_v, sp_v,
                     zero_v, shard_v, ovl_v, flash_v, tensor_v, tpo_v, ep_v, etp_v, ends=0, threads=None):
    """Return ``(results[n_plans, O_SIZE], dp[n_plans])`` for the flattened grid, the expert layout last:
    ``(ep_v[i], etp_v[i])`` pairs (the caller lays out the product of the ep and etp axes, etp fastest);
    ``ends`` (one per call) the pipeline split of every plan with pp > 1.

    Plain Python over two serial kernels: the layer costs once per distinct combination
    (:func:`grid_layer_table`), then :func:`price_grid_rows` in ``threads`` contiguous ranges side by side (it
    releases the GIL; default Numba's thread count). A ``parallel=True`` kernel did the same in two ``prange``
    loops, but compiling it took 40 s on 2 cores against a few seconds for these (issue 38; the standard's
    6-minute ``make test``)."""
    table = grid_layer_table(model, system, calib, tp_v, cp_v, mb_v, rc_v, sp_v, flash_v, tpo_v, ep_v, etp_v)
    n = 1
    for axis in (tp_v, pp_v, cp_v, v_v, mb_v, rc_v, sp_v, zero_v, shard_v, ovl_v, flash_v, tensor_v, tpo_v, ep_v):
        n *= axis.shape[0]
    results = np.empty((n, O_SIZE))
    dps = np.zeros(n, dtype=np.int64)
    n_threads = max(1, min(int(threads or numba.get_num_threads()), n // MIN_PLANS_PER_THREAD))
    bounds = [n * c // n_threads for c in range(n_threads + 1)]

    def price(c):
        price_grid_rows(model, system, calib, table, gpus, global_batch, tp_v, pp_v, cp_v, v_v, mb_v, rc_v, sp_v,
                        zero_v, shard_v, ovl_v, flash_v, tensor_v, tpo_v, ep_v, etp_v, ends, results, dps,
                        bounds[c], bounds[c + 1])

    if n_threads == 1:
        price(0)
    else:
        with ThreadPoolExecutor(n_threads) as pool:
            list(pool.map(price, range(n_threads)))
    return results, dps


def evaluate_grid(model, system, calib, gpus, global_batch, tp_v, pp_v, cp_v, v_v, mb_v, rc_v, sp_v,
                  zero_v, shard_v, ovl_v, flash_v, tensor_v, tpo_v):
    """Return ``(results[n_plans, O_SIZE], dp[n_plans])`` for the flattened dense grid (``ep = 1``)."""
    return evaluate_grid_ep(model, system, calib, gpus, global_batch, tp_v, pp_v, cp_v, v_v, mb_v, rc_v, sp_v,
                            zero_v, shard_v, ovl_v, flash_v, tensor_v, tpo_v, np.ones(1, dtype=np.int64),
                            np.zeros(1, dtype=np.int64))


# --------------------------------------------------------------------------- layouts: the search's sparse grid
# The search's space is the grid above with its five leading axes (tp, pp, cp, interleave, micro_batch: the
# *layout*) kept only where the layout is structurally valid. Most layouts of a broad space are not (a
# micro-batch that does not divide the local batch, a split that does not divide the GPUs), so they are never
# visited; the plans of a valid layout are the Cartesian product of the knob axes (recompute, sequence_parallel,
# zero, shard_group, overlap_grad_reduce, flash_attention, zero3_per_tensor, tp_comm_overlap, ep), priced by
# the same ``grid_plan_costs``, in the same order as the dense grid.
@njit(cache=True)
def layout_reason(model, gpus, global_batch, tp, pp, cp, v, mb, even_split, ends=0):
    """``(reason, dp)`` of one layout as the dense grid gives it (``shard_group`` 0, ``ep`` 1, the pipeline
    split ``ends``): the first structural reason (``R_GPUS`` when tp*pp*cp does not divide the GPUs), else
    ``R_OK``; dp 0 if invalid."""
    ways = tp * pp * cp
    dp = gpus // ways if gpus % ways == 0 else 0
    none, one = np.int64(0), np.int64(1)  # not literals: one compiled structural_reason for every caller
    reason = structural_reason(model, gpus, tp, pp, dp if dp > 0 else 1, cp, v, mb, global_batch, none, one,
                               even_split, none, none, ends if pp > 1 else 0, none)
    if dp == 0 and reason == R_OK:
        reason = R_GPUS
    return reason, (dp if reason == R_OK else 0)


@njit(cache=True)
def layout_reasons(model, gpus, global_batch, tp_v, pp_v, cp_v, v_v, mb_v, even_split, ends=0):
    """``(reason[n], dp[n])`` of every layout of the product ``tp x pp x cp x interleave x micro_batch`` (C order)."""
    n_pp, n_cp, n_v, n_mb = pp_v.shape[0], cp_v.shape[0], v_v.shape[0], mb_v.shape[0]
    n = tp_v.shape[0] * n_pp * n_cp * n_v * n_mb
    reasons = np.empty(n, dtype=np.int64)
    dps = np.zeros(n, dtype=np.int64)
    for i in range(n):
        i_mb = i % n_mb
        i_v = (i // n_mb) % n_v
        i_cp = (i // (n_mb * n_v)) % n_cp
        i_pp = (i // (n_mb * n_v * n_cp)) % n_pp
        i_tp = i // (n_mb * n_v * n_cp * n_pp)
        reasons[i], dps[i] = layout_reason(model, gpus, global_batch, tp_v[i_tp], pp_v[i_pp], cp_v[i_cp], v_v[i_v],
                                           mb_v[i_mb], even_split, ends)
    return reasons, dps


@njit(cache=True)
def invalid_plan_counts(model, gpus, global_batch, layouts, shard_v, ep_v, etp_v, even_split, n_reasons, ends=0):
    """Plans of the invalid ``layouts[n, 5]`` by the reason the dense grid gives each, per combination of
    the knobs other than ``shard_group`` and the expert layout (``(ep_v[i], etp_v[i])`` pairs: the only knobs
    :func:`plan_reason` reads): ``counts[n_reasons]``."""
    counts = np.zeros(n_reasons, dtype=np.int64)
    none = np.int64(0)  # not a literal: one compiled structural_reason for every caller
    for n in range(layouts.shape[0]):
        tp, pp, cp, v, mb = layouts[n, 0], layouts[n, 1], layouts[n, 2], layouts[n, 3], layouts[n, 4]
        ways = tp * pp * cp
        dp = gpus // ways if gpus % ways == 0 else 0
        for i_shard in range(shard_v.shape[0]):
            for i_ep in range(ep_v.shape[0]):
                reason = structural_reason(model, gpus, tp, pp, dp if dp > 0 else 1, cp, v, mb, global_batch,
                                           shard_v[i_shard], ep_v[i_ep], even_split, none, none,
                                           ends if pp > 1 else 0, etp_v[i_ep])
                counts[reason if reason != R_OK else R_GPUS] += 1
    return counts


@njit(cache=True, nogil=True)
def layer_cost_table(model, system, calib, keys, rc_v, sp_v, flash_v, tpo_v, ep_v, etp_v):
    """Layer costs of every ``(tp, cp, micro_batch)`` row of ``keys`` and every knob they depend on (the
    expert layout as ``(ep_v[i], etp_v[i])`` pairs):
    ``table[((((k * n_rc + rc) * n_sp + sp) * n_fl + fl) * n_tpo + tpo) * n_ep + ep, L_SIZE]``. Serial: a few
    thousand rows, milliseconds; not a ``parallel=True`` kernel, whose compilation alone takes seconds."""
    n_rc, n_sp, n_fl, n_tpo, n_ep = rc_v.shape[0], sp_v.shape[0], flash_v.shape[0], tpo_v.shape[0], ep_v.shape[0]
    per_key = n_rc * n_sp * n_fl * n_tpo * n_ep
    table = np.empty((keys.shape[0] * per_key, L_SIZE))
    for j in range(table.shape[0]):
        i_ep = j % n_ep
        i_tpo = (j // n_ep) % n_tpo
        i_fl = (j // (n_ep * n_tpo)) % n_fl
        i_sp = (j // (n_ep * n_tpo * n_fl)) % n_sp
        i_rc = (j // (n_ep * n_tpo * n_fl * n_sp)) % n_rc
        k = j // per_key
        layer_costs(model, system, calib, keys[k, 0], keys[k, 1], keys[k, 2], rc_v[i_rc], sp_v[i_sp] != 0,
                    flash_v[i_fl] != 0, table[j], ep_v[i_ep], tpo_v[i_tpo] != 0, etp_v[i_ep])
    return table


@njit(cache=True)
def _price_layout_block(model, system, calib, table_base, gpus, global_batch, layout, rc, sp_row, zero,
                        shard_v, ovl_v, flash_v, tensor_v, tpo_v, ep_v, etp_v, scratch, step_s, mem_bytes, reasons,
                        first, ends=0):
    """Price one block of plans (one layout, recompute, sequence_parallel and zero; the remaining knob axes
    in C order) into ``step_s``, ``mem_bytes`` and ``reasons`` from index ``first``."""
    n_ovl, n_fl, n_ten, n_tpo, n_ep = ovl_v.shape[0], flash_v.shape[0], tensor_v.shape[0], tpo_v.shape[0], ep_v.shape[0]
    i = first
    for i_shard in range(shard_v.shape[0]):
        for i_ovl in range(n_ovl):
            for i_fl in range(n_fl):
                for i_ten in range(n_ten):
                    for i_tpo in range(n_tpo):
                        for i_ep in range(n_ep):
                            lc = table_base[((sp_row * n_fl + i_fl) * n_tpo + i_tpo) * n_ep + i_ep]
                            grid_plan_costs(model, system, calib, lc, gpus, global_batch, layout[0], layout[1],
                                            layout[2], layout[3], layout[4], rc, zero, shard_v[i_shard],
                                            ovl_v[i_ovl] != 0, tensor_v[i_ten] != 0, scratch, ep_v[i_ep], ends,
                                            etp_v[i_ep])
                            step_s[i] = scratch[O_STEP]
                            mem_bytes[i] = scratch[O_MEM_BYTES]
                            reasons[i] = int(scratch[O_REASON])
                            i += 1


@njit(parallel=True, cache=True)
def evaluate_layouts(model, system, calib, gpus, global_batch, layouts, layout_key, table, rc_v, sp_v, zero_v,
                     shard_v, ovl_v, flash_v, tensor_v, tpo_v, ep_v, etp_v, ends=0):
    """Price every plan of the valid ``layouts[n, 5]`` (tp, pp, cp, interleave, micro_batch) times the knob axes.

    ``layout_key[n]`` is each layout's row of :func:`layer_cost_table`'s ``keys``. Returns ``(step_s, mem_bytes,
    reason)``, each ``[n * n_knob_plans]`` in the dense grid's C order (layout first). One parallel iteration
    prices one block (layout, recompute, sequence_parallel, zero) into its own slots, with its own scratch row:
    no reductions, so results do not depend on the thread count."""
    n_rc, n_sp, n_zero = rc_v.shape[0], sp_v.shape[0], zero_v.shape[0]
    n_fl, n_tpo, n_ep = flash_v.shape[0], tpo_v.shape[0], ep_v.shape[0]
    block = shard_v.shape[0] * ovl_v.shape[0] * n_fl * tensor_v.shape[0] * n_tpo * n_ep
    n_blocks = layouts.shape[0] * n_rc * n_sp * n_zero
    step_s = np.empty(n_blocks * block)
    mem_bytes = np.empty(n_blocks * block)
    reasons = np.empty(n_blocks * block, dtype=np.int8)
    for b in prange(n_blocks):
        i_zero = b % n_zero
        i_sp = (b // n_zero) % n_sp
        i_rc = (b // (n_zero * n_sp)) % n_rc
        n = b // (n_zero * n_sp * n_rc)
        table_base = table[(layout_key[n] * n_rc + i_rc) * n_sp * n_fl * n_tpo * n_ep:]
        _price_layout_block(model, system, calib, table_base, gpus, global_batch, layouts[n], rc_v[i_rc], i_sp,
                            zero_v[i_zero], shard_v, ovl_v, flash_v, tensor_v, tpo_v, ep_v, etp_v, np.empty(O_SIZE),
                            step_s, mem_bytes, reasons, b * block, ends)
    return step_s, mem_bytes, reasons


# --------------------------------------------------------------------------- the search's one pass
@njit(cache=True)
def _heap_above(top_s, top_i, a, b):
    """Whether entry ``a`` ranks above entry ``b`` in the max-heap: :math:`(s_a, i_a) > (s_b, i_b)`
    lexicographically (the slower step first; on a tie, the later index)."""
    return top_s[a] > top_s[b] or (top_s[a] == top_s[b] and top_i[a] > top_i[b])


@njit(cache=True)
def _heap_swap(top_s, top_i, top_m, a, b):
    """Swap entries ``a`` and ``b`` of the heap's three parallel arrays."""
    top_s[a], top_s[b] = top_s[b], top_s[a]
    top_i[a], top_i[b] = top_i[b], top_i[a]
    top_m[a], top_m[b] = top_m[b], top_m[a]


@njit(cache=True)
def _heap_sift_down(top_s, top_i, top_m, n, pos):
    """Restore the max-heap (by ``(step, index)``; ``top_m`` carried along) of ``top_s[:n]``, ``top_i[:n]``
    below ``pos``."""
    while True:
        child = 2 * pos + 1
        if child >= n:
            return
        if child + 1 < n and _heap_above(top_s, top_i, child + 1, child):
            child += 1
        if not _heap_above(top_s, top_i, child, pos):
            return
        _heap_swap(top_s, top_i, top_m, pos, child)
        pos = child


@njit(cache=True)
def _heap_sift_up(top_s, top_i, top_m, pos):
    """Move entry ``pos`` up the max-heap until its parent ranks above it."""
    while pos > 0:
        parent = (pos - 1) // 2
        if not _heap_above(top_s, top_i, pos, parent):
            return
        _heap_swap(top_s, top_i, top_m, pos, parent)
        pos = parent


@njit(cache=True)
def _heap_offer(top_s, top_i, top_m, n, k, step, index, mem):
    """Offer ``(step, index)`` to the max-heap of the ``k`` smallest keys seen; returns its new size."""
    if n < k:
        top_s[n] = step
        top_i[n] = index
        top_m[n] = mem
        _heap_sift_up(top_s, top_i, top_m, n)
        return n + 1
    if step < top_s[0] or (step == top_s[0] and index < top_i[0]):
        top_s[0] = step
        top_i[0] = index
        top_m[0] = mem
        _heap_sift_down(top_s, top_i, top_m, n, np.int64(0))
    return n


@njit(cache=True, nogil=True)
def scan_layouts(model, system, calib, gpus, global_batch, layouts, layout_key, table, rc_v, sp_v, zero_v,
                 shard_v, ovl_v, flash_v, tensor_v, tpo_v, ep_v, etp_v, ends, rule_id, n_rules, n_reasons, chunk,
                 n_chunks,
                 k, after_step, after_index):
    """The search's one pass over the plans of the valid ``layouts`` (as :func:`evaluate_layouts` prices them, same
    order and flat index), keeping no per-plan array: chunk ``chunk`` of ``n_chunks`` takes the blocks
    ``chunk, chunk + n_chunks, ...`` (one block: a layout, recompute, sequence_parallel and zero).

    Each plan's reason and memory come first (:func:`~trainscale.kernels.plan.plan_memory`, the pipeline's part of
    the memory computed once per layout: :func:`~trainscale.kernels.plan.shaped_plan_memory`); only a plan that
    fits and that the stack runs is timed (:func:`~trainscale.kernels.plan.plan_time`). ``rule_id[i]`` (int8;
    empty: no stack rules) is the first stack rule plan ``i`` breaks, 1-based (0: none); a plan that fits or
    does not fit only for memory and breaks one gets ``R_STACK_RULE``, counted per rule. Returns ``(counts
    [n_reasons], feasible, by_rule[n_rules + 1], top_step[:n], top_index[:n], top_mem_bytes[:n])``: plans by
    reason, feasible plans (``R_OK``, finite step time), and the ``k`` feasible plans of smallest ``(step, flat
    index)`` after ``(after_step, after_index)`` with their memory (a max-heap, unsorted). The result does not depend on the chunking."""
    n_rc, n_sp, n_zero = rc_v.shape[0], sp_v.shape[0], zero_v.shape[0]
    n_shard, n_ovl, n_fl, n_ten, n_tpo, n_ep = (shard_v.shape[0], ovl_v.shape[0], flash_v.shape[0],
                                                tensor_v.shape[0], tpo_v.shape[0], ep_v.shape[0])
    block = n_shard * n_ovl * n_fl * n_ten * n_tpo * n_ep
    n_blocks = layouts.shape[0] * n_rc * n_sp * n_zero
    ruled = rule_id.shape[0] > 0
    counts = np.zeros(n_reasons, dtype=np.int64)
    by_rule = np.zeros(n_rules + 1, dtype=np.int64)
    feasible = 0
    top_s = np.empty(k)
    top_i = np.empty(k, dtype=np.int64)
    top_m = np.empty(k)
    n_top = np.int64(0)  # not a literal: one compiled _heap_offer
    out = np.empty(O_SIZE)
    first = last = np.int64(0)  # not literals: the same compiled plan_memory / plan_time as predict's
    shape = np.empty((SHAPE_STAGES, 3), dtype=np.int64)  # the pipeline's memory shape, once per layout
    shape_layout = -1
    for b in range(chunk, n_blocks, n_chunks):
        i_zero = b % n_zero
        i_sp = (b // n_zero) % n_sp
        i_rc = (b // (n_zero * n_sp)) % n_rc
        n = b // (n_zero * n_sp * n_rc)
        if n != shape_layout:
            shape[0, 0] = -1  # computed by the layout's first plan that is structurally valid
            shape_layout = n
        base = (layout_key[n] * n_rc + i_rc) * n_sp * n_fl * n_tpo * n_ep
        tp, pp, cp, v, mb = layouts[n, 0], layouts[n, 1], layouts[n, 2], layouts[n, 3], layouts[n, 4]
        dp = gpus // (tp * pp * cp)  # a valid layout: tp*pp*cp divides the GPUs
        plan_ends = ends if pp > 1 else 0
        rc = rc_v[i_rc]
        zero = zero_v[i_zero]
        i = b * block
        for i_shard in range(n_shard):
            for i_ovl in range(n_ovl):
                for i_fl in range(n_fl):
                    for i_ten in range(n_ten):
                        for i_tpo in range(n_tpo):
                            for i_ep in range(n_ep):
                                lc = table[base + ((i_sp * n_fl + i_fl) * n_tpo + i_tpo) * n_ep + i_ep]
                                overlap = ovl_v[i_ovl] != 0
                                per_tensor = tensor_v[i_ten] != 0
                                reason = shaped_plan_memory(model, system, calib, lc, gpus, tp, pp, dp, cp, v, mb,
                                                            global_batch, rc, zero, shard_v[i_shard], overlap,
                                                            per_tensor, out, ep_v[i_ep], first, last, plan_ends,
                                                            etp_v[i_ep],
                                                            shape)
                                rule = rule_id[i] if ruled else 0
                                if rule > 0 and (reason == R_OK or reason == R_MEMORY):
                                    counts[R_STACK_RULE] += 1
                                    by_rule[rule] += 1
                                elif reason != R_OK:
                                    counts[reason] += 1
                                else:
                                    counts[R_OK] += 1
                                    plan_time(model, system, calib, lc, gpus, tp, pp, dp, cp, v, mb, global_batch,
                                              rc, zero, shard_v[i_shard], overlap, per_tensor, out, ep_v[i_ep],
                                              first, last, plan_ends, etp_v[i_ep])
                                    step = out[O_STEP]
                                    if np.isfinite(step):
                                        feasible += 1
                                        if step > after_step or (step == after_step and i > after_index):
                                            n_top = _heap_offer(top_s, top_i, top_m, n_top, k, step, i,
                                                                           out[O_MEM_BYTES])
                                i += 1
    return counts, feasible, by_rule, top_s[:n_top].copy(), top_i[:n_top].copy(), top_m[:n_top].copy()
