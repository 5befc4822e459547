"""Asynchronous local SGD, flat or hierarchical (HALoS, Kim et al. 2025), simulated on the real numbers.

Workers run ``H`` inner steps of an inner optimiser from the model they read from their server and send
their pseudo-gradient, which the server applies at once with a Nesterov outer step. Flat (``K = 0``): one
server, the global one. Hierarchical: every region has a server that, every ``K`` worker updates, pushes
what it accumulated to a global server; the global server applies its own Nesterov step and returns its
model, which the region merges. :func:`hierarchical_schedule` orders the events (timing only, no numbers);
:func:`run_hierarchical` replays them on the real numbers, with the problems of
:mod:`trainscale.kernels.objectives`, the optimisers, compression and evaluation of
:mod:`trainscale.kernels.optim`. Sequential, hence deterministic.
"""

import numpy as np
from numba import njit

from .compress import call_key, compress
from .objectives import batch_grad
from .optim import BITS_PER_FLOAT, _evaluate, opt_update

EV_WORKER = 0   # a worker's pseudo-gradient reaches its server, which applies it
EV_PUSH = 1     # a regional server sends its accumulated update to the global server
EV_GLOBAL = 2   # the global server applies a region's accumulated update
EV_MERGE = 3    # a regional server receives the global model and merges it


@njit(cache=True)
def hierarchical_schedule(durations, worker_comm_s, region_of, region_comm_s, K, messages):
    """Event order of hierarchical (or flat) asynchronous local SGD; timing only, no numbers.

    Worker ``k`` (in region ``region_of[k]``) starts at time 0 from its server's model, computes
    round ``j`` in ``durations[j, k]`` seconds (``H`` inner steps), and its pseudo-gradient reaches
    the server ``worker_comm_s[k]`` later (event ``EV_WORKER``); the worker receives the updated
    model ``worker_comm_s[k]`` after that and starts round ``j + 1``. With ``K = 0`` there is one
    server, the global one (flat asynchronous local SGD). With ``K >= 1`` every region has a
    server that, once it has applied ``K`` worker updates since its last push and has no push in
    flight, sends its accumulated update (``EV_PUSH``, at once); it reaches the global server
    ``region_comm_s[r]`` later (``EV_GLOBAL``) and the global model returned from there reaches
    the region after another ``region_comm_s[r]`` (``EV_MERGE``), when the region may push again.

    Events are processed in time order, ties broken by kind (``EV_GLOBAL``, ``EV_MERGE``,
    ``EV_WORKER``), then by index. The schedule stops at the ``messages``-th ``EV_WORKER``.
    ``durations`` must have at least ``messages`` rows. Returns ``(kind, who, round, time)``
    arrays, one entry per event: ``who`` a worker (``EV_WORKER``) or a region; ``round`` the
    worker's round ``j`` (``EV_WORKER``), else -1.
    """
    W = durations.shape[1]
    R = region_comm_s.shape[0]
    cap = 4 * messages + 4
    kind = np.empty(cap, np.int64)
    who = np.empty(cap, np.int64)
    rnd = np.empty(cap, np.int64)
    when = np.empty(cap)
    arrive = np.empty(W)
    rounds = np.zeros(W, np.int64)
    for k in range(W):
        arrive[k] = durations[0, k] + worker_comm_s[k]
    global_at = np.full(R, np.inf)
    merge_at = np.full(R, np.inf)
    in_flight = np.zeros(R, np.bool_)
    count = np.zeros(R, np.int64)
    n = 0
    done = 0
    while done < messages:
        # the earliest pending event: global arrivals, then merges, then workers (ties by index)
        best_t = np.inf
        best_kind = -1
        best_who = -1
        for r in range(R):
            if global_at[r] < best_t:
                best_t, best_kind, best_who = global_at[r], EV_GLOBAL, r
        for r in range(R):
            if merge_at[r] < best_t:
                best_t, best_kind, best_who = merge_at[r], EV_MERGE, r
        for k in range(W):
            if arrive[k] < best_t:
                best_t, best_kind, best_who = arrive[k], EV_WORKER, k
        kind[n] = best_kind
        who[n] = best_who
        when[n] = best_t
        rnd[n] = -1
        n += 1
        if best_kind == EV_GLOBAL:
            global_at[best_who] = np.inf
            merge_at[best_who] = best_t + region_comm_s[best_who]
            continue
        r = best_who if best_kind == EV_MERGE else region_of[best_who]
        if best_kind == EV_MERGE:
            merge_at[r] = np.inf
            in_flight[r] = False
        else:
            k = best_who
            rnd[n - 1] = rounds[k]
            rounds[k] += 1
            done += 1
            if done < messages:
                arrive[k] = best_t + 2.0 * worker_comm_s[k] + durations[rounds[k], k]
            else:
                arrive[k] = np.inf
            count[r] += 1
        if K > 0 and count[r] >= K and not in_flight[r] and done < messages:
            kind[n] = EV_PUSH
            who[n] = r
            rnd[n] = -1
            when[n] = best_t
            n += 1
            count[r] = 0
            in_flight[r] = True
            global_at[r] = best_t + region_comm_s[r]
    return kind[:n].copy(), who[:n].copy(), rnd[:n].copy(), when[:n].copy()


@njit(cache=True)
def _outer_step(x, u, delta, lr, momentum, change):
    """Nesterov outer step on pseudo-gradient ``delta``: ``u = mu u + delta``,
    ``x -= lr (delta + mu u)``; ``change`` receives the amount subtracted from ``x``."""
    for j in range(x.shape[0]):
        u[j] = momentum * u[j] + delta[j]
        c = lr * (delta[j] + momentum * u[j])
        change[j] = c
        x[j] -= c


@njit(cache=True)
def run_hierarchical(kind, hidden, lam, X, y, x0, batches, ev_kind, ev_who, ev_round, ev_time, region_of,
                     n_regions, flat, H, opt, lr, beta1, beta2, eps, outer_lr, outer_momentum,
                     global_lr, global_momentum, merge_weight, eval_every,
                     comp_code, comp_params, comp_seed, comp_state,
                     x_out, loss_out, gnorm_out, bits_out, time_out, stale_out, worker_out, region_bits_out):
    """Replay a :func:`hierarchical_schedule` on the real numbers (HALoS, Kim et al. 2025, Alg. 1).

    Worker ``k``'s round ``j``: from the model ``s_k`` it read from its server, ``H`` inner steps
    of ``opt`` (state kept across rounds, Adam's step ``t = j H + h + 1``) on
    ``batches[j H + h, k]``, then the pseudo-gradient ``delta = s_k - x_k`` is compressed (key
    ``call_key(comp_seed, k, j)``) and sent. Its server (the region's with ``flat = False``, the one
    global server with ``flat = True``) applies a Nesterov outer step (``outer_lr``,
    ``outer_momentum``; ``_outer_step``) at once, adds what it subtracted to its accumulator, and
    the worker reads the new server model. ``EV_PUSH``: the region's accumulated update ``A_r`` is
    sent and the accumulator reset; ``EV_GLOBAL``: the global server applies its own Nesterov step
    (``global_lr``, ``global_momentum``) on ``A_r`` and sends back a copy of its model ``g``;
    ``EV_MERGE``: the region merges it, ``x_r = (1 - alpha) x_r + alpha g`` with
    ``alpha = merge_weight``. Sequential, hence deterministic.

    Outputs at every ``eval_every``-th worker message (``u`` from 0, evaluation after message
    ``u`` when ``(u + 1) % eval_every == 0``): loss and gradient norm of the global model (the
    global server's; with ``flat`` the server's), cumulative bits per worker, plus per message
    ``time_out`` (arrival), ``stale_out`` (server updates between the read and the apply) and
    ``worker_out``; ``region_bits_out[r]``: bits region ``r`` sent to the global server
    (``32 p`` per push).
    """
    W = batches.shape[1]
    p = x0.shape[0]
    n = X.shape[0]
    hw = max(hidden, 1)
    R = n_regions
    XS = np.empty((W, p))       # the model each worker read
    XK = np.empty((W, p))
    M = np.zeros((W, p))
    V = np.zeros((W, p))
    G = np.empty(p)
    D = np.empty(p)
    Cm = np.empty((W, p))
    change = np.empty(p)
    XR = np.empty((R, p))       # regional models (flat: row 0 is the global model)
    UR = np.zeros((R, p))
    ACC = np.zeros((R, p))
    PUSHED = np.empty((R, p))
    RETURNED = np.empty((R, p))
    xg = x0.copy()
    ug = np.zeros(p)
    upd = np.zeros(R, np.int64)      # updates applied by each regional server
    read_ver = np.zeros(W, np.int64)
    gbuf = np.empty(p)
    work = np.empty(hw)
    sent = np.zeros(W)
    all_idx = np.arange(n)
    for r in range(R):
        for j in range(p):
            XR[r, j] = x0[j]
        region_bits_out[r] = 0.0
    for k in range(W):
        for j in range(p):
            XS[k, j] = x0[j]
    _evaluate(kind, hidden, lam, x0, X, y, all_idx, gbuf, work, 0, loss_out, gnorm_out, sent, bits_out)
    u = 0
    for e in range(ev_kind.shape[0]):
        ek = ev_kind[e]
        if ek == EV_WORKER:
            k = ev_who[e]
            jr = ev_round[e]
            r = 0 if flat else region_of[k]
            xk = XK[k]
            for j in range(p):
                xk[j] = XS[k, j]
            for h in range(H):
                s = jr * H + h
                batch_grad(kind, hidden, lam, xk, X, y, batches[s, k], G, work)
                opt_update(opt, lr, beta1, beta2, eps, s + 1, xk, G, M[k], V[k])
            for j in range(p):
                D[j] = XS[k, j] - xk[j]
            key = call_key(comp_seed, k, jr)
            sent[k] += compress(comp_code, D, Cm[k], comp_state[k], comp_params, key)
            _outer_step(XR[r], UR[r], Cm[k], outer_lr, outer_momentum, change)
            for j in range(p):
                ACC[r, j] += change[j]
            time_out[u] = ev_time[e]
            stale_out[u] = upd[r] - read_ver[k]
            worker_out[u] = k
            upd[r] += 1
            read_ver[k] = upd[r]
            for j in range(p):
                XS[k, j] = XR[r, j]
            if (u + 1) % eval_every == 0:
                model = XR[0] if flat else xg
                _evaluate(kind, hidden, lam, model, X, y, all_idx, gbuf, work, (u + 1) // eval_every,
                          loss_out, gnorm_out, sent, bits_out)
            u += 1
        elif ek == EV_PUSH:
            r = ev_who[e]
            for j in range(p):
                PUSHED[r, j] = ACC[r, j]
                ACC[r, j] = 0.0
            region_bits_out[r] += BITS_PER_FLOAT * p
        elif ek == EV_GLOBAL:
            r = ev_who[e]
            _outer_step(xg, ug, PUSHED[r], global_lr, global_momentum, change)
            for j in range(p):
                RETURNED[r, j] = xg[j]
        else:
            r = ev_who[e]
            for j in range(p):
                XR[r, j] = (1.0 - merge_weight) * XR[r, j] + merge_weight * RETURNED[r, j]
    model = XR[0] if flat else xg
    for j in range(p):
        x_out[j] = model[j]
