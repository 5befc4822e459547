"""Synthetic training problems and distributed optimisers, simulated on the real numbers.

Problems (``kind``; the parameters are always one flat ``float64`` vector ``w`` of length
:func:`n_params`, so every kernel stays monomorphic). With ``n`` examples ``(x_i, y_i)`` of a
mini-batch ``I`` (an index array into ``X``, ``y``) the objective is

    f_I(w) = (1/|I|) sum_{i in I} l(w; x_i, y_i) + (lam/2) |w|^2

* ``LEAST_SQUARES``: ``l = (x_i . w - y_i)^2 / 2``, gradient ``(x_i . w - y_i) x_i``;
* ``LOGISTIC`` (labels ``y_i = +-1``): ``l = log(1 + exp(-y_i x_i . w))``, gradient
  ``-y_i s(-y_i x_i . w) x_i`` with ``s`` the logistic function (evaluated without overflow);
* ``TWO_LAYER``: ``out(x) = sum_j a_j tanh(W1_j . x + b1_j) + b2`` with ``h = hidden`` units,
  ``w = [W1 (h x d, row-major), b1 (h), a (h), b2]``, ``l = (out(x_i) - y_i)^2 / 2``, gradient by
  back-propagation: ``r = out - y``, ``d a_j = r t_j``, ``d b2 = r``,
  ``d b1_j = r a_j (1 - t_j^2)``, ``d W1_j = d b1_j x`` with ``t_j = tanh(W1_j . x + b1_j)``.

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
message is the mean of the outputs ``C(msg_k)`` in worker order, outside the ``prange``; each
worker's returned bits accumulate in ``bits_out``. Code ``NONE`` copies the message, so
uncompressed runs are bitwise what they were before compression existed.

Parallelism: ``prange`` over workers (each writes only its own rows); reductions over workers run
afterwards, serially, in worker order. The evaluation records the full-dataset loss and gradient
norm of the global parameters at step 0 and every ``eval_every`` steps.
"""

import numpy as np
from numba import njit, prange

from .compress import call_key, compress

LEAST_SQUARES = 0
LOGISTIC = 1
TWO_LAYER = 2

SGD = 0
MOMENTUM = 1
ADAM = 2

BITS_PER_FLOAT = 32


@njit(cache=True)
def n_params(kind, dim, hidden):
    """Length of the flat parameter vector: ``d`` for linear models, ``h d + 2 h + 1`` for the network."""
    if kind == TWO_LAYER:
        return hidden * dim + 2 * hidden + 1
    return dim


@njit(cache=True)
def _dot_row(X, i, w, start):
    """``X[i] . w[start:start+d]``, summed in index order."""
    s = 0.0
    for j in range(X.shape[1]):
        s += X[i, j] * w[start + j]
    return s


@njit(cache=True)
def _log1p_exp_neg(m):
    """``log(1 + exp(-m))`` without overflow."""
    if m > 0.0:
        return np.log1p(np.exp(-m))
    return -m + np.log1p(np.exp(m))


@njit(cache=True)
def _sigmoid_neg(m):
    """``1 / (1 + exp(m))`` without overflow."""
    if m >= 0.0:
        e = np.exp(-m)
        return e / (1.0 + e)
    return 1.0 / (1.0 + np.exp(m))


@njit(cache=True)
def _mlp_forward(hidden, w, X, i, act):
    """Hidden activations ``act[j] = tanh(W1_j . x_i + b1_j)``; returns the network output."""
    d = X.shape[1]
    b1 = hidden * d
    a = b1 + hidden
    out = w[a + hidden]
    for j in range(hidden):
        t = np.tanh(_dot_row(X, i, w, j * d) + w[b1 + j])
        act[j] = t
        out += w[a + j] * t
    return out


@njit(cache=True)
def example_loss(kind, hidden, w, X, y, i, work):
    """Loss ``l(w; x_i, y_i)`` of one example (no regulariser); ``work``: ``hidden`` floats."""
    if kind == LEAST_SQUARES:
        r = _dot_row(X, i, w, 0) - y[i]
        return 0.5 * r * r
    if kind == LOGISTIC:
        return _log1p_exp_neg(y[i] * _dot_row(X, i, w, 0))
    r = _mlp_forward(hidden, w, X, i, work) - y[i]
    return 0.5 * r * r


@njit(cache=True)
def example_grad_add(kind, hidden, w, X, y, i, out, work):
    """``out += grad l(w; x_i, y_i)`` (no regulariser); ``work``: ``hidden`` floats."""
    d = X.shape[1]
    if kind == LEAST_SQUARES:
        r = _dot_row(X, i, w, 0) - y[i]
        for j in range(d):
            out[j] += r * X[i, j]
    elif kind == LOGISTIC:
        c = -y[i] * _sigmoid_neg(y[i] * _dot_row(X, i, w, 0))
        for j in range(d):
            out[j] += c * X[i, j]
    else:
        r = _mlp_forward(hidden, w, X, i, work) - y[i]
        b1 = hidden * d
        a = b1 + hidden
        for k in range(hidden):
            t = work[k]
            out[a + k] += r * t
            db = r * w[a + k] * (1.0 - t * t)
            out[b1 + k] += db
            for j in range(d):
                out[k * d + j] += db * X[i, j]
        out[a + hidden] += r


@njit(cache=True)
def batch_loss(kind, hidden, lam, w, X, y, idx, work):
    """``f_I(w)``: mean example loss over ``idx`` plus ``lam/2 |w|^2``."""
    s = 0.0
    for t in range(idx.shape[0]):
        s += example_loss(kind, hidden, w, X, y, idx[t], work)
    reg = 0.0
    for j in range(w.shape[0]):
        reg += w[j] * w[j]
    return s / idx.shape[0] + 0.5 * lam * reg


@njit(cache=True)
def batch_grad(kind, hidden, lam, w, X, y, idx, out, work):
    """``out = grad f_I(w)``: the sum of example gradients in ``idx`` order, over ``|I|``, plus ``lam w``."""
    p = w.shape[0]
    for j in range(p):
        out[j] = 0.0
    for t in range(idx.shape[0]):
        example_grad_add(kind, hidden, w, X, y, idx[t], out, work)
    m = idx.shape[0]
    for j in range(p):
        out[j] = out[j] / m + lam * w[j]


@njit(cache=True)
def _norm(v):
    s = 0.0
    for j in range(v.shape[0]):
        s += v[j] * v[j]
    return np.sqrt(s)


@njit(parallel=True, cache=True)
def per_example_grads(kind, hidden, lam, w, X, y, idx, out):
    """``out[t] = grad l(w; x_{idx[t]}) + lam w`` (one row per example, rows in ``prange``)."""
    p = w.shape[0]
    for t in prange(idx.shape[0]):
        work = np.empty(max(hidden, 1))
        for j in range(p):
            out[t, j] = 0.0
        example_grad_add(kind, hidden, w, X, y, idx[t], out[t], work)
        for j in range(p):
            out[t, j] += lam * w[j]


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


@njit(parallel=True, cache=True)
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
        for k in prange(W):
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


@njit(parallel=True, cache=True)
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
        for k in prange(W):
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
