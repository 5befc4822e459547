"""Distributed optimisers on the synthetic problems of :mod:`trainscale.kernels.objectives`, simulated on
the real numbers (asynchronous local SGD, flat or hierarchical: :mod:`trainscale.kernels.hierarchical`).

Every sum runs in a fixed order (examples in index order, then workers ``0..W-1``), so results do
not depend on the number of threads.

Optimisers (``opt``), one step ``t = 1, 2, ...`` on gradient ``g``:

* ``SGD``: ``w -= lr g``;
* ``MOMENTUM`` (heavy ball, PyTorch convention): ``m = beta1 m + g``; ``w -= lr m``;
* ``ADAM``: ``m = beta1 m + (1-beta1) g``; ``v = beta2 v + (1-beta2) g^2``;
  ``w -= lr (m / (1-beta1^t)) / (sqrt(v / (1-beta2^t)) + eps)``.

Distributed loops over ``W`` workers, worker ``k`` drawing mini-batches from its own shard
(``batches[s, k, :]``, drawn before the loop from per-worker random streams):

* :func:`run_sync`: synchronous data parallelism. Every step each worker computes ``g_k`` on its
  batch and sends it (through the compressor); the mean ``g = (1/W) sum_k g_k`` drives the
  optimiser. Bits sent per worker per step: those of one message (``32 p`` uncompressed).
* :func:`run_local`: local SGD / DiLoCo (Douillard et al. 2023, arXiv 2311.08105). Each round,
  every worker starts from the global ``x``, runs ``H`` inner steps of the inner optimiser (whose
  state persists across rounds), and sends its pseudo-gradient ``D_k = x - x_k``; the outer step is
  Nesterov momentum on ``D = (1/W) sum_k D_k``: ``u = mu u + D``; ``x -= outer_lr (D + mu u)``.
  With ``H = 1``, inner SGD, ``outer_lr = 1`` and ``mu = 0`` this is synchronous SGD (up to the
  rounding of ``x - (x - lr g_k)``). With ``delayed`` the outer step of round ``r`` applies the
  pseudo-gradient of round ``r - 1`` (none in round 0; the last round's is still in flight at the
  end), so its all-reduce overlaps round ``r``'s compute.
* :func:`run_async`: asynchronous SGD through a parameter server, simulated by an event loop over
  per-gradient durations (worker ``k``'s ``j``-th gradient on ``batches[j, k]``): each arriving
  gradient is applied at once (``opt`` is the server's optimiser) and its worker restarts from the
  new parameters; staleness is the number of server updates between read and apply. Sequential
  and deterministic; with ``W = 1`` it is :func:`run_sync` bit for bit.

Compression: every message (a gradient or a pseudo-gradient) passes through
:func:`trainscale.kernels.compress.compress` (``code``, ``params``: the compressor's code and
``float64[NPARAM]`` parameter array), ``bits = compress(code, msg, out, state[k], params, key)``
with worker ``k``'s own state row (``state``: ``float64[W, state_size]``, set up by
``init_state``: the error-feedback buffer and PowerSGD's ``Q``) and output row, and
``key = call_key(seed, k, t)`` with ``t`` the step (sync) or round (local). The averaged
message is the mean of the outputs ``C(msg_k)`` in worker order, after every worker's message; each
worker's returned bits accumulate in ``bits_out``. Code ``NONE`` copies the message, so
uncompressed runs are bitwise what they were before compression existed.

Serial: the workers of a step run one after another (each writes only its own rows), reductions over
workers afterwards, in worker order. The loops were ``prange`` loops (``parallel=True``): compiling
:func:`run_sync` and :func:`run_local` took 2.4x as long (35 s against 15 s on 2 cores) for at most 5% less
run time on the studies' problem sizes (8 workers, 256 parameters, 3,000 steps; 4 workers, 10,201 parameters,
1,500 steps), where the full-dataset evaluation and the step's serial update dominate. The evaluation records the full-dataset loss and gradient
norm of the global parameters at step 0 and every ``eval_every`` steps.
"""

import numpy as np
from numba import njit

from .compress import call_key, compress, uniform
from .objectives import batch_grad, batch_loss

SGD = 0
MOMENTUM = 1
ADAM = 2

BITS_PER_FLOAT = 32


@njit(cache=True)
def _norm(v):
    s = 0.0
    for j in range(v.shape[0]):
        s += v[j] * v[j]
    return np.sqrt(s)


@njit(cache=True)
def opt_update(opt, lr, beta1, beta2, eps, t, x, g, m, v):
    """One optimiser step ``t`` (from 1) on ``x`` with gradient ``g``; state ``m``, ``v`` in place."""
    p = x.shape[0]
    if opt == SGD:
        for j in range(p):
            x[j] -= lr * g[j]
    elif opt == MOMENTUM:
        for j in range(p):
            m[j] = beta1 * m[j] + g[j]
            x[j] -= lr * m[j]
    else:
        c1 = 1.0 - beta1 ** t
        c2 = 1.0 - beta2 ** t
        for j in range(p):
            m[j] = beta1 * m[j] + (1.0 - beta1) * g[j]
            v[j] = beta2 * v[j] + (1.0 - beta2) * g[j] * g[j]
            x[j] -= lr * (m[j] / c1) / (np.sqrt(v[j] / c2) + eps)


@njit(cache=True)
def _evaluate(kind, hidden, lam, x, X, y, all_idx, gbuf, work, e, loss_out, gnorm_out,
              sent, bits_out):
    loss_out[e] = batch_loss(kind, hidden, lam, x, X, y, all_idx, work)
    batch_grad(kind, hidden, lam, x, X, y, all_idx, gbuf, work)
    gnorm_out[e] = _norm(gbuf)
    for k in range(sent.shape[0]):
        bits_out[e, k] = sent[k]


@njit(cache=True)
def _mean_rows(A, out):
    """``out = (1/W) sum_k A[k]``, workers summed in order ``0..W-1``."""
    W = A.shape[0]
    for j in range(A.shape[1]):
        out[j] = 0.0
    for k in range(W):
        for j in range(A.shape[1]):
            out[j] += A[k, j]
    for j in range(A.shape[1]):
        out[j] /= W


@njit(cache=True)
def run_sync(kind, hidden, lam, X, y, x0, batches, opt, lr, beta1, beta2, eps, eval_every,
             comp_code, comp_params, comp_seed, comp_state, x_out, loss_out, gnorm_out, bits_out):
    """Synchronous data-parallel training for ``batches.shape[0]`` steps.

    ``batches``: ``int64[steps, W, B]`` example indices. Compression (module docstring):
    ``comp_code``, ``comp_params``, ``comp_seed`` (int64 >= 0; keys ``call_key(comp_seed, k, s)``
    for step ``s`` from 0) and ``comp_state`` (``float64[W, state_size]``, updated in place).
    Outputs: final parameters ``x_out`` (``p``); ``loss_out``/``gnorm_out``
    (``steps // eval_every + 1``) and cumulative bits sent per worker ``bits_out`` (``[.., W]``)
    at steps ``0, eval_every, 2 eval_every, ...``.
    """
    steps = batches.shape[0]
    W = batches.shape[1]
    p = x0.shape[0]
    n = X.shape[0]
    hw = max(hidden, 1)
    x = x0.copy()
    m = np.zeros(p)
    v = np.zeros(p)
    g = np.empty(p)
    gbuf = np.empty(p)
    G = np.empty((W, p))
    C = np.empty((W, p))
    work = np.empty((W, hw))
    ework = np.empty(hw)
    sent = np.zeros(W)
    all_idx = np.arange(n)
    _evaluate(kind, hidden, lam, x, X, y, all_idx, gbuf, ework, 0, loss_out, gnorm_out, sent, bits_out)
    for s in range(steps):
        for k in range(W):
            batch_grad(kind, hidden, lam, x, X, y, batches[s, k], G[k], work[k])
            key = call_key(comp_seed, k, s)
            sent[k] += compress(comp_code, G[k], C[k], comp_state[k], comp_params, key)
        _mean_rows(C, g)
        opt_update(opt, lr, beta1, beta2, eps, s + 1, x, g, m, v)
        if (s + 1) % eval_every == 0:
            _evaluate(kind, hidden, lam, x, X, y, all_idx, gbuf, ework, (s + 1) // eval_every,
                      loss_out, gnorm_out, sent, bits_out)
    for j in range(p):
        x_out[j] = x[j]


@njit(cache=True)
def _weighted_average(XS, weight, members, out):
    """``out = sum_k w_k x_k / sum_k w_k`` over the sites ``k`` with ``members[k]`` (site order)."""
    total = 0.0
    for j in range(out.shape[0]):
        out[j] = 0.0
    for k in range(XS.shape[0]):
        if members[k] and weight[k] > 0.0:
            total += weight[k]
            for j in range(out.shape[0]):
                out[j] += weight[k] * XS[k, j]
    if total > 0.0:
        for j in range(out.shape[0]):
            out[j] /= total
    return total


@njit(cache=True)
def run_rounds(kind, hidden, lam, X, y, x0, batches, steps, joins, averages, lr, x_out):
    r"""SGD on ``S`` sites over a schedule of ``R`` rounds, averaging weighted by batches (the
    curtailment runs' statistics; :func:`trainscale.workloads.curtailment.averaging_cost`).

    Site ``k`` holds parameters ``x_k``; ``x_g`` is the last average (``x0`` at first). Round ``r``:
    a site with ``joins[r, k]`` starts from ``x_g``; site ``k`` takes ``steps[r, k]`` SGD steps of
    ``lr`` (its mini-batches are the next rows of ``batches``, ``int64[sum(steps), B]``, sites in
    order, so the draws never depend on the schedule's shape); ``n_k`` counts its steps since it
    last took part in an average (a site that joins restarts from ``x_g`` with ``n_k = 0``: what it
    trained after the last average it took part in is lost). At the end of round ``r`` the sites
    with ``averages[r, k]`` (those training when the round closes) take the average

    .. math:: \bar x = \sum_k n_k x_k \big/ \sum_k n_k,

    and ``x_g = x_k = \bar x``, ``n_k = 0`` for them. After the last round the pending sites
    (``n_k > 0``) are averaged with the same weights into ``x_out`` (``x_g`` if none is pending).
    A schedule with one site and no average is plain sequential SGD."""
    R, S = steps.shape
    p = x0.shape[0]
    hw = max(hidden, 1)
    XS = np.empty((S, p))
    xg = x0.copy()
    for k in range(S):
        for j in range(p):
            XS[k, j] = x0[j]
    pending = np.zeros(S)
    g = np.empty(p)
    work = np.empty(hw)
    row = 0
    members = np.zeros(S, dtype=np.bool_)
    for r in range(R):
        for k in range(S):
            if joins[r, k]:
                pending[k] = 0.0
                for j in range(p):
                    XS[k, j] = xg[j]
            for t in range(steps[r, k]):
                batch_grad(kind, hidden, lam, XS[k], X, y, batches[row], g, work)
                for j in range(p):
                    XS[k, j] -= lr * g[j]
                row += 1
            pending[k] += steps[r, k]
        any_member = False
        for k in range(S):
            members[k] = averages[r, k] and pending[k] > 0.0
            any_member = any_member or members[k]
        if any_member:
            if _weighted_average(XS, pending, members, xg) > 0.0:
                for k in range(S):
                    if members[k]:
                        pending[k] = 0.0
                        for j in range(p):
                            XS[k, j] = xg[j]
    for k in range(S):
        members[k] = pending[k] > 0.0
    if _weighted_average(XS, pending, members, x_out) == 0.0:
        for j in range(p):
            x_out[j] = xg[j]


@njit(cache=True)
def run_local(kind, hidden, lam, X, y, x0, batches, H, opt, lr, beta1, beta2, eps,
              outer_lr, outer_momentum, delayed, eval_every,
              comp_code, comp_params, comp_seed, comp_state, x_out, loss_out, gnorm_out, bits_out):
    """Local SGD / DiLoCo: ``batches.shape[0] // H`` rounds of ``H`` inner steps per worker.

    ``batches``: ``int64[steps, W, B]`` (``steps`` a multiple of ``H``); ``eval_every`` a
    multiple of ``H``; compression as :func:`run_sync`, one message per worker per round ``r``
    with key ``call_key(comp_seed, k, r)``. Outputs as :func:`run_sync`, the loss and gradient
    norm being those of the global parameters after each evaluated round.
    """
    steps = batches.shape[0]
    W = batches.shape[1]
    p = x0.shape[0]
    n = X.shape[0]
    hw = max(hidden, 1)
    rounds = steps // H
    x = x0.copy()
    u = np.zeros(p)
    delta = np.empty(p)
    prev = np.zeros(p)
    apply = np.empty(p)
    gbuf = np.empty(p)
    XW = np.empty((W, p))
    G = np.empty((W, p))
    M = np.zeros((W, p))
    V = np.zeros((W, p))
    D = np.empty((W, p))
    C = np.empty((W, p))
    work = np.empty((W, hw))
    ework = np.empty(hw)
    sent = np.zeros(W)
    all_idx = np.arange(n)
    _evaluate(kind, hidden, lam, x, X, y, all_idx, gbuf, ework, 0, loss_out, gnorm_out, sent, bits_out)
    for r in range(rounds):
        for k in range(W):
            xk = XW[k]
            for j in range(p):
                xk[j] = x[j]
            for h in range(H):
                s = r * H + h
                batch_grad(kind, hidden, lam, xk, X, y, batches[s, k], G[k], work[k])
                opt_update(opt, lr, beta1, beta2, eps, s + 1, xk, G[k], M[k], V[k])
            for j in range(p):
                D[k, j] = x[j] - xk[j]
            key = call_key(comp_seed, k, r)
            sent[k] += compress(comp_code, D[k], C[k], comp_state[k], comp_params, key)
        _mean_rows(C, delta)
        if delayed:
            for j in range(p):
                apply[j] = prev[j]
                prev[j] = delta[j]
        else:
            for j in range(p):
                apply[j] = delta[j]
        for j in range(p):
            u[j] = outer_momentum * u[j] + apply[j]
            x[j] -= outer_lr * (apply[j] + outer_momentum * u[j])
        done = (r + 1) * H
        if done % eval_every == 0:
            _evaluate(kind, hidden, lam, x, X, y, all_idx, gbuf, ework, done // eval_every,
                      loss_out, gnorm_out, sent, bits_out)
    for j in range(p):
        x_out[j] = x[j]


@njit(cache=True)
def run_async(kind, hidden, lam, X, y, x0, batches, durations, opt, lr, beta1, beta2, eps, eval_every,
              comp_code, comp_params, comp_seed, comp_state, x_out, loss_out, gnorm_out, bits_out,
              time_out, stale_out, worker_out):
    """Asynchronous SGD (parameter server), event-driven, for ``batches.shape[0]`` server updates.

    ``W = batches.shape[1]`` workers; worker ``k``'s ``j``-th gradient (``j`` from 0) uses
    ``batches[j, k]`` and takes ``durations[j, k]`` simulated seconds (``float64[steps, W]``,
    > 0). At time 0 every worker reads the parameters and starts its first gradient. Events
    are processed in order of finish time, ties to the lower worker index: the server applies
    the arriving (compressed) gradient as update ``u`` (from 0; optimiser step ``u + 1``), and
    the worker at once reads the new parameters and starts its next gradient (none after the
    last update). The gradient is computed on the parameters read at the start; staleness of
    update ``u`` is ``u`` minus the number of updates applied when its worker read them.
    Compression as :func:`run_sync`, applied when the message is sent, with key
    ``call_key(comp_seed, k, j)``. Sequential (no ``prange``), hence deterministic.

    Outputs as :func:`run_sync` (evaluations after updates ``0, eval_every, ...``), plus per update
    ``u``: ``time_out[u]`` (arrival time), ``stale_out[u]`` and ``worker_out[u]``.
    With ``W = 1`` this is :func:`run_sync` with one worker, bit for bit.
    """
    steps = batches.shape[0]
    W = batches.shape[1]
    p = x0.shape[0]
    n = X.shape[0]
    hw = max(hidden, 1)
    x = x0.copy()
    m = np.zeros(p)
    v = np.zeros(p)
    gbuf = np.empty(p)
    G = np.empty((W, p))
    Cm = np.empty((W, p))
    work = np.empty(hw)
    sent = np.zeros(W)
    finish = np.empty(W)
    read_ver = np.zeros(W, np.int64)
    count = np.zeros(W, np.int64)
    all_idx = np.arange(n)
    _evaluate(kind, hidden, lam, x, X, y, all_idx, gbuf, work, 0, loss_out, gnorm_out, sent, bits_out)
    for k in range(W):
        batch_grad(kind, hidden, lam, x, X, y, batches[0, k], G[k], work)
        finish[k] = durations[0, k]
        count[k] = 1
    for u in range(steps):
        k = 0
        for q in range(1, W):
            if finish[q] < finish[k]:
                k = q
        now = finish[k]
        key = call_key(comp_seed, k, count[k] - 1)
        sent[k] += compress(comp_code, G[k], Cm[k], comp_state[k], comp_params, key)
        opt_update(opt, lr, beta1, beta2, eps, u + 1, x, Cm[k], m, v)
        time_out[u] = now
        stale_out[u] = u - read_ver[k]
        worker_out[u] = k
        if (u + 1) % eval_every == 0:
            _evaluate(kind, hidden, lam, x, X, y, all_idx, gbuf, work, (u + 1) // eval_every,
                      loss_out, gnorm_out, sent, bits_out)
        if u + 1 < steps:
            j = count[k]
            batch_grad(kind, hidden, lam, x, X, y, batches[j, k], G[k], work)
            read_ver[k] = u + 1
            finish[k] = now + durations[j, k]
            count[k] = j + 1
    for j in range(p):
        x_out[j] = x[j]


# ---------------------------------------------------------------------------------------------
# independent subnetwork training (IST)


@njit(cache=True)
def ist_owners(p, W, key, owner):
    """``owner[j]``: the worker whose sub-network holds coordinate ``j`` this step.

    A uniformly random permutation ``pi`` of ``0..p-1`` (Fisher–Yates on ``uniform(key, i)``) is
    cut into ``W`` consecutive blocks of (nearly) equal size: coordinate ``pi[i]`` goes to worker
    ``i W // p``. Every coordinate has exactly one owner (a permutation sketch)."""
    perm = np.arange(p)
    for i in range(p - 1, 0, -1):
        jj = int(uniform(key, i) * (i + 1))
        if jj > i:
            jj = i
        t = perm[i]
        perm[i] = perm[jj]
        perm[jj] = t
    for i in range(p):
        owner[perm[i]] = i * W // p


@njit(cache=True)
def run_ist(kind, hidden, lam, X, y, x0, batches, lr, eval_every, perm_seed,
            x_out, loss_out, gnorm_out, bits_out):
    """Independent subnetwork training with permutation sketches (Shulgin & Richtárik 2024, IST).

    Step ``s``: :func:`ist_owners` with key ``call_key(perm_seed, 0, s)`` splits the coordinates
    among the ``W`` workers; worker ``k`` gets the sub-model ``C_k x`` with
    ``C_k = W diag(1[owner = k])`` (so ``(1/W) sum_k C_k = I``), computes the gradient
    ``g_k = grad f_{I_k}(C_k x)`` of its own mini-batch at that point and sends back its block,
    ``C_k g_k``. The update is ``x <- x - lr (1/W) sum_k C_k g_k``, i.e. coordinate ``j`` moves by
    ``-lr g_{owner(j)}[j]``. Bits sent by worker ``k``: ``32`` per coordinate of its block.
    """
    steps = batches.shape[0]
    W = batches.shape[1]
    p = x0.shape[0]
    n = X.shape[0]
    hw = max(hidden, 1)
    x = x0.copy()
    owner = np.empty(p, np.int64)
    Z = np.empty((W, p))
    G = np.empty((W, p))
    work = np.empty((W, hw))
    ework = np.empty(hw)
    gbuf = np.empty(p)
    sent = np.zeros(W)
    all_idx = np.arange(n)
    _evaluate(kind, hidden, lam, x, X, y, all_idx, gbuf, ework, 0, loss_out, gnorm_out, sent, bits_out)
    for s in range(steps):
        ist_owners(p, W, call_key(perm_seed, 0, s), owner)
        for k in range(W):
            for j in range(p):
                Z[k, j] = W * x[j] if owner[j] == k else 0.0
            batch_grad(kind, hidden, lam, Z[k], X, y, batches[s, k], G[k], work[k])
        for j in range(p):
            x[j] -= lr * G[owner[j], j]
            sent[owner[j]] += BITS_PER_FLOAT
        if (s + 1) % eval_every == 0:
            _evaluate(kind, hidden, lam, x, X, y, all_idx, gbuf, ework, (s + 1) // eval_every,
                      loss_out, gnorm_out, sent, bits_out)
    for j in range(p):
        x_out[j] = x[j]
