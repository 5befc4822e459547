"""Synthetic training problems: the loss and gradient of a mini-batch, simulated on the real numbers
(the distributed optimisers that train them: :mod:`trainscale.kernels.optim`).

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

Every sum runs in a fixed order (examples in index order), so results do not depend on the number
of threads.
"""

import numpy as np
from numba import njit, prange

LEAST_SQUARES = 0
LOGISTIC = 1
TWO_LAYER = 2


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
