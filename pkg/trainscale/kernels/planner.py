"""The heterogeneous pipeline planner's dynamic programme (see ``trainscale.model.hetero``).

Stages are placed from the last one backwards, so stage ``j`` from the end (``j = 1`` is the last
stage) always keeps ``min(j, m)`` micro-batches in flight, whatever the stage count: one pass over
``j`` serves every stage count, the pipeline being closed (its first stage placed) at any ``j``.

A state after ``j`` stages is ``(layers placed, group of the stage before them, stages per group)``;
the group before is chosen when a stage is placed, since that stage's link cost depends on it, and
the next stage placed must then be of that group. Each state keeps the Pareto front of
``(max t, sum t, max sync)`` of its partial plans; the step time grows with each. A partial plan is
dropped when even its lower bound, ``(m - 1) max t + sum t + max sync`` plus the cheapest possible
time for the layers still to place, is above the best step time found so far.

Stage costs come in as tables ``[j, group, layers, k]``: ``k < G`` is the previous stage's group,
``k = G`` marks the first stage. Stage-count vectors are indexed in order of their stage count,
those with ``j`` stages being ``cstart[j]`` to ``cstart[j + 1] - 1``: ``cnext[c, g]`` is ``c`` plus one
stage of group ``g`` (``-1`` past a group's node cap), ``cprev`` the inverse.
"""

import numpy as np
from numba import njit

_SLACK = 1e-9  # relative margin on the pruning bound, far above rounding, so pruning stays exact
_TIE = 1e-15  # a new optimum must beat the old by this much (as ``plan_brute_force``)


@njit(cache=True)
def _grow_f(a, n):
    b = np.empty(max(n, 2 * a.shape[0]), a.dtype)
    b[:a.shape[0]] = a
    return b


@njit(cache=True)
def pipeline_dp(t_tab, sync_tab, fit_tab, cnext, cprev, cstart, m, n_layers, smax, best_in, min_time_per_layer):
    """Best step time below ``best_in`` (by more than the tie margin) and its stages.

    Returns ``(found, step_time, groups, layers)``; the stage arrays run first stage to last.
    """
    G = t_tab.shape[1]
    L = n_layers
    # fronts of the states after j - 1 and j stages: offset into the pool and size, by
    # state (layers placed, group before, count vector - cstart[level])
    width = 1
    for j in range(smax + 1):
        width = max(width, cstart[j + 1] - cstart[j])
    NS = (L + 1) * G * width
    off_prev = np.zeros(NS, np.int64)
    cnt_prev = np.zeros(NS, np.int64)
    off_cur = np.zeros(NS, np.int64)
    cnt_cur = np.zeros(NS, np.int64)

    # pool of partial plans (all levels, for backtracking)
    cap = 1024
    p_mt = np.empty(cap)
    p_st = np.empty(cap)
    p_ms = np.empty(cap)
    p_par = np.empty(cap, np.int64)
    p_g = np.empty(cap, np.int64)
    p_l = np.empty(cap, np.int64)
    n = 0
    for g in range(G):  # nothing placed yet; the last stage will be of group g
        s = g  # used = 0, the all-zero count vector (the only one with 0 stages)
        off_prev[s] = n
        cnt_prev[s] = 1
        p_mt[n] = 0.0
        p_st[n] = 0.0
        p_ms[n] = 0.0
        p_par[n] = -1
        p_g[n] = -1
        p_l[n] = 0
        n += 1

    # one state's front while it is built
    fcap = 256
    f_mt = np.empty(fcap)
    f_st = np.empty(fcap)
    f_ms = np.empty(fcap)
    f_par = np.empty(fcap, np.int64)
    f_g = np.empty(fcap, np.int64)
    f_l = np.empty(fcap, np.int64)

    best = best_in
    found = False
    best_e, best_g, best_l = -1, -1, -1
    for j in range(1, smax + 1):
        in_m1 = m - 1
        c0, nc0 = cstart[j - 1], cstart[j] - cstart[j - 1]
        # ---- close the pipeline: stage j from the end is the first stage
        for s in range((L + 1) * G * nc0):
            k = cnt_prev[s]
            if k == 0:
                continue
            c = c0 + s % nc0
            g = (s // nc0) % G
            used = s // (nc0 * G)
            l = L - used
            if l < 1 or cnext[c, g] < 0 or not fit_tab[j, g, l, G]:
                continue
            t = t_tab[j, g, l, G]
            sy = sync_tab[j, g, l, G]
            o = off_prev[s]
            for e in range(o, o + k):
                T = in_m1 * max(p_mt[e], t) + (p_st[e] + t) + max(p_ms[e], sy)
                if T < best - _TIE:
                    best = T
                    found = True
                    best_e, best_g, best_l = e, g, l
        if j == smax:
            break
        thr = best * (1.0 + _SLACK)
        # ---- extend: place stage j from the end (not the first), pulling into each target state
        nc2 = cstart[j + 1] - cstart[j]
        cnt_cur[:(L + 1) * G * nc2] = 0
        for c2 in range(cstart[j], cstart[j + 1]):
            for used2 in range(j, L):  # at least one layer left for the first stage
                lb_rest = (L - used2) * min_time_per_layer
                for pg in range(G):
                    nf = 0
                    for g in range(G):
                        c = cprev[c2, g]
                        if c < 0:
                            continue
                        for l in range(1, used2 - (j - 1) + 1):
                            used = used2 - l
                            s = (used * G + g) * nc0 + (c - c0)
                            k = cnt_prev[s]
                            if k == 0 or not fit_tab[j, g, l, pg]:
                                continue
                            t = t_tab[j, g, l, pg]
                            sy = sync_tab[j, g, l, pg]
                            o = off_prev[s]
                            for e in range(o, o + k):
                                a0 = max(p_mt[e], t)
                                a1 = p_st[e] + t
                                a2 = max(p_ms[e], sy)
                                if in_m1 * a0 + a1 + a2 + lb_rest > thr:
                                    continue
                                # Pareto insert: skip if dominated, drop what it dominates
                                dominated = False
                                for q in range(nf):
                                    if f_mt[q] <= a0 and f_st[q] <= a1 and f_ms[q] <= a2:
                                        dominated = True
                                        break
                                if dominated:
                                    continue
                                w = 0
                                for q in range(nf):
                                    if not (a0 <= f_mt[q] and a1 <= f_st[q] and a2 <= f_ms[q]):
                                        if w != q:
                                            f_mt[w] = f_mt[q]
                                            f_st[w] = f_st[q]
                                            f_ms[w] = f_ms[q]
                                            f_par[w] = f_par[q]
                                            f_g[w] = f_g[q]
                                            f_l[w] = f_l[q]
                                        w += 1
                                nf = w
                                if nf == f_mt.shape[0]:
                                    f_mt = _grow_f(f_mt, nf + 1)
                                    f_st = _grow_f(f_st, nf + 1)
                                    f_ms = _grow_f(f_ms, nf + 1)
                                    f_par = _grow_f(f_par, nf + 1)
                                    f_g = _grow_f(f_g, nf + 1)
                                    f_l = _grow_f(f_l, nf + 1)
                                f_mt[nf] = a0
                                f_st[nf] = a1
                                f_ms[nf] = a2
                                f_par[nf] = e
                                f_g[nf] = g
                                f_l[nf] = l
                                nf += 1
                    if nf == 0:
                        continue
                    if n + nf > p_mt.shape[0]:
                        p_mt = _grow_f(p_mt, n + nf)
                        p_st = _grow_f(p_st, n + nf)
                        p_ms = _grow_f(p_ms, n + nf)
                        p_par = _grow_f(p_par, n + nf)
                        p_g = _grow_f(p_g, n + nf)
                        p_l = _grow_f(p_l, n + nf)
                    s2 = (used2 * G + pg) * nc2 + (c2 - cstart[j])
                    off_cur[s2] = n
                    cnt_cur[s2] = nf
                    p_mt[n:n + nf] = f_mt[:nf]
                    p_st[n:n + nf] = f_st[:nf]
                    p_ms[n:n + nf] = f_ms[:nf]
                    p_par[n:n + nf] = f_par[:nf]
                    p_g[n:n + nf] = f_g[:nf]
                    p_l[n:n + nf] = f_l[:nf]
                    n += nf
        off_prev, off_cur = off_cur, off_prev
        cnt_prev, cnt_cur = cnt_cur, cnt_prev

    S = 0
    if found:
        S = 1
        e = best_e
        while p_g[e] >= 0:
            S += 1
            e = p_par[e]
    groups = np.empty(S, np.int64)
    layers = np.empty(S, np.int64)
    if found:
        groups[0] = best_g
        layers[0] = best_l
        e = best_e
        i = 1
        while p_g[e] >= 0:
            groups[i] = p_g[e]
            layers[i] = p_l[e]
            i += 1
            e = p_par[e]
    return found, best, groups, layers
