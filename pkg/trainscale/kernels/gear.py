r"""Numba kernels of gear training (Dong et al., arXiv 1806.03925): a model-parallel network whose parts are
updated at different rates. Called through :mod:`trainscale.workloads.gear`.

The network is a multi-layer perceptron, part ``p`` = layer ``p`` (weights :math:`W_p` of
:math:`d_{p+1} \times d_p` and bias :math:`b_p`), tanh on the hidden layers, linear output:

.. math:: h_0 = x,\quad h_{p+1} = \tanh(W_p h_p + b_p)\ (p < P-1),\quad f(x) = W_{P-1} h_{P-1} + b_{P-1}

with the loss :math:`\ell = \frac{1}{2B}\sum_{b}\|f(x_b) - y_b\|^2` of a mini-batch of ``B`` examples and its
gradient by back-propagation. All parameters live in one flat vector ``theta``; part ``p`` owns
``theta[off[p]:off[p+1]]`` (its weights row-major, then its bias).

**Update rule** (one step ``t``, the same for every method; :func:`train_steps`):

1. :math:`g_t = \nabla\ell(\theta_t; \text{batch}_t)` at the current parameters;
2. :math:`g_t` is written to slot :math:`t \bmod (D+1)` of a ring of ``D + 1`` gradients (``D`` the largest
   delay);
3. every part ``p`` adds the gradient that *arrives* now, :math:`g_{t - \tau_p}` (its slice; nothing while
   :math:`t < \tau_p`), to its accumulator :math:`a_p`;
4. if :math:`(t + 1) \bmod k_p = 0`: :math:`\theta_p \leftarrow \theta_p - \eta\,a_p`, :math:`a_p \leftarrow 0`.

Synchronous SGD is :math:`k_p = 1, \tau_p = 0` (then :math:`a_p = 0 + g_t` and the update is exactly
:math:`\theta \leftarrow \theta - \eta g_t`); **gear training** gives part ``p`` its own period
:math:`k_p` (``tau = 0``): it changes only every :math:`k_p` steps, by the sum of its last :math:`k_p`
gradients, the oldest computed :math:`k_p - 1` steps before the update (staleness :math:`k_p - 1`), and it
communicates (its gradient all-reduce) only then; **asynchronous SGD** updates every part every step with a
gradient :math:`\tau` steps old (:math:`k_p = 1, \tau_p = \tau`). The sums are plain sequential loops (no
``prange``): a run is one sequential chain of steps.
"""

import numpy as np
from numba import njit


@njit(cache=True)
def forward_backward(theta, dims, off, X, Y, idx, acts, deltas, grad, want_grad):
    """Mean-squared loss of the examples ``idx``; with ``want_grad`` its gradient into ``grad`` (overwritten).

    ``acts[p]`` holds :math:`h_p` (``B x max(dims)``); ``deltas`` (``2 x B x max(dims)``) the back-propagated
    errors of the current layer and the one below."""
    P = dims.size - 1
    B = idx.size
    for b in range(B):
        for j in range(dims[0]):
            acts[0, b, j] = X[idx[b], j]
    for p in range(P):
        n_in, n_out, w0 = dims[p], dims[p + 1], off[p]
        bias0 = w0 + n_in * n_out
        for b in range(B):
            for o in range(n_out):
                z = theta[bias0 + o]
                for i in range(n_in):
                    z += theta[w0 + o * n_in + i] * acts[p, b, i]
                acts[p + 1, b, o] = np.tanh(z) if p < P - 1 else z
    loss = 0.0
    n_y = dims[P]
    cur = 0
    for b in range(B):
        for o in range(n_y):
            r = acts[P, b, o] - Y[idx[b], o]
            loss += 0.5 * r * r
            deltas[cur, b, o] = r / B
    if not want_grad:
        return loss / B
    for q in range(grad.size):
        grad[q] = 0.0
    for p in range(P - 1, -1, -1):
        n_in, n_out, w0 = dims[p], dims[p + 1], off[p]
        bias0 = w0 + n_in * n_out
        for b in range(B):
            for o in range(n_out):
                d = deltas[cur, b, o]
                grad[bias0 + o] += d
                for i in range(n_in):
                    grad[w0 + o * n_in + i] += d * acts[p, b, i]
        if p > 0:  # error of the layer below: (W_p^T delta) * tanh'(z) = (W_p^T delta) * (1 - h^2)
            nxt = 1 - cur
            for b in range(B):
                for i in range(n_in):
                    s = 0.0
                    for o in range(n_out):
                        s += theta[w0 + o * n_in + i] * deltas[cur, b, o]
                    h = acts[p, b, i]
                    deltas[nxt, b, i] = s * (1.0 - h * h)
            cur = nxt
    return loss / B


@njit(cache=True)
def mean_loss(theta, dims, off, X, Y, acts, deltas, grad, idx):
    """Mean-squared loss over the examples ``idx`` (the evaluation set), in chunks of the scratch size."""
    B = acts.shape[1]
    total = 0.0
    n = idx.size
    start = 0
    while start < n:
        stop = min(start + B, n)
        total += forward_backward(theta, dims, off, X, Y, idx[start:stop], acts, deltas, grad, False) * (stop - start)
        start = stop
    return total / n


@njit(cache=True)
def train_steps(theta, dims, off, X, Y, batches, t0, t1, lr, periods, delays, ring, acc, grad, acts, deltas,
                eval_idx, eval_every, losses):
    """Steps ``t0 .. t1 - 1`` of the update rule (module docstring), in place on ``theta``, the gradient
    ``ring`` (``(D + 1) x n``) and the per-parameter accumulators ``acc``. ``batches[t]``: the examples of
    step ``t``. After every step ``t`` with ``(t + 1) % eval_every == 0`` the loss on ``eval_idx`` is stored in
    ``losses[(t + 1) // eval_every]`` (``losses[0]``: before the first step, written when ``t0 == 0``)."""
    P = dims.size - 1
    slots = ring.shape[0]
    n = theta.size
    if t0 == 0 and eval_every > 0:
        losses[0] = mean_loss(theta, dims, off, X, Y, acts, deltas, grad, eval_idx)
    for t in range(t0, t1):
        forward_backward(theta, dims, off, X, Y, batches[t], acts, deltas, grad, True)
        slot = t % slots
        for q in range(n):
            ring[slot, q] = grad[q]
        for p in range(P):
            tau = delays[p]
            if t >= tau:
                src = (t - tau) % slots
                for q in range(off[p], off[p + 1]):
                    acc[q] += ring[src, q]
            if (t + 1) % periods[p] == 0:
                for q in range(off[p], off[p + 1]):
                    theta[q] -= lr * acc[q]
                    acc[q] = 0.0
        if eval_every > 0 and (t + 1) % eval_every == 0:
            losses[(t + 1) // eval_every] = mean_loss(theta, dims, off, X, Y, acts, deltas, grad, eval_idx)
