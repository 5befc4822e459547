r"""Numba kernels of a small DLRM-style recommender trained by first-order MAML (G-Meta, Xiao et al.,
arXiv 2401.04338). Called through :mod:`trainscale.workloads.metarec`.

The model: ``F`` sparse fields, each looked up in its own embedding table (rows of ``E`` values; the
tables are stacked into one array of ``F R`` rows, global row ``f R + r``), the ``F`` vectors
concatenated into :math:`x \in \mathbb{R}^{FE}`, one hidden layer and a logistic output:

.. math:: h = \tanh(W_1 x + c_1),\qquad z = w_2^\top h + c_2,\qquad
          \ell = \log(1 + e^{z}) - y z\quad(\text{binary cross-entropy of } p = \sigma(z))

The dense parameters are one flat vector ``[W_1 (H x FE, row-major), c_1 (H), w_2 (H), c_2 (1)]``.
Gradients of the mean loss over ``n`` examples, with :math:`\delta = (\sigma(z) - y)/n`:

.. math:: \partial w_2 = \delta h,\ \partial c_2 = \delta,\ a = \delta\,w_2 \odot (1 - h^2),\
          \partial W_1 = a x^\top,\ \partial c_1 = a,\ \partial x = W_1^\top a

and :math:`\partial x` is added to the rows the example looked up (an embedding row gets the sum over
the examples and fields that read it).

First-order MAML (Finn et al. 2017, Sec. 5.2) for one task: start from the shared parameters
:math:`\theta` (the dense vector and the task's looked-up rows, a local copy), take ``k`` gradient
steps on the support set, :math:`\theta' \leftarrow \theta' - \alpha \nabla L_\mathrm{sup}(\theta')`,
and return :math:`g = \nabla L_\mathrm{query}(\theta'_k)` (the first-order meta-gradient; the
second-order term through the inner steps is dropped). The outer update is
:math:`\theta \leftarrow \theta - \beta\,\frac{1}{N}\sum_\mathrm{tasks} g`.

A task's rows are held locally as ``rows[off[t]:off[t+1]]`` and its examples index them
(``idx[i, f]`` is a local row), so the same kernel serves both schedules; only where the rows come
from (a replicated table or the shards by all-to-all) and where their gradients go differ.
``prange`` runs over tasks, each writing only its own output slice; sums over tasks are done
serially afterwards (no float reduction crosses ``prange`` iterations).
"""

import math

import numpy as np
from numba import njit, prange


@njit(cache=True)
def softplus(z):
    """``log(1 + exp(z))`` without overflow."""
    if z > 0.0:
        return z + math.log1p(math.exp(-z))
    return math.log1p(math.exp(z))


@njit(cache=True)
def forward_backward(rows, idx, y, dense, H, g_rows, g_dense):
    """Mean binary cross-entropy over the examples ``idx`` (n x F local rows), labels ``y``; the gradients
    of the mean are ADDED to ``g_rows`` (rows' shape) and ``g_dense`` (the dense vector's). Returns the loss."""
    n, F = idx.shape
    E = rows.shape[1]
    D = F * E
    o_c1, o_w2 = H * D, H * D + H
    o_c2 = o_w2 + H
    x = np.empty(D)
    h = np.empty(H)
    dx = np.empty(D)
    loss = 0.0
    for i in range(n):
        for f in range(F):
            for e in range(E):
                x[f * E + e] = rows[idx[i, f], e]
        z = dense[o_c2]
        for j in range(H):
            a = dense[o_c1 + j]
            for k in range(D):
                a += dense[j * D + k] * x[k]
            h[j] = math.tanh(a)
            z += dense[o_w2 + j] * h[j]
        loss += softplus(z) - y[i] * z
        delta = (1.0 / (1.0 + math.exp(-z)) - y[i]) / n
        g_dense[o_c2] += delta
        for k in range(D):
            dx[k] = 0.0
        for j in range(H):
            g_dense[o_w2 + j] += delta * h[j]
            a = delta * dense[o_w2 + j] * (1.0 - h[j] * h[j])
            g_dense[o_c1 + j] += a
            for k in range(D):
                g_dense[j * D + k] += a * x[k]
                dx[k] += dense[j * D + k] * a
        for f in range(F):
            for e in range(E):
                g_rows[idx[i, f], e] += dx[f * E + e]
    return loss / n


@njit(cache=True)
def loss_only(rows, idx, y, dense, H):
    """Mean binary cross-entropy (no gradients)."""
    n, F = idx.shape
    E = rows.shape[1]
    D = F * E
    o_c1, o_w2 = H * D, H * D + H
    loss = 0.0
    for i in range(n):
        z = dense[o_w2 + H]
        for j in range(H):
            a = dense[o_c1 + j]
            for f in range(F):
                for e in range(E):
                    a += dense[j * D + f * E + e] * rows[idx[i, f], e]
            z += dense[o_w2 + j] * math.tanh(a)
        loss += softplus(z) - y[i] * z
    return loss / n


@njit(cache=True)
def task_meta_gradient(rows0, sup_idx, sup_y, qry_idx, qry_y, dense0, H, inner_lr, inner_steps, g_rows, g_dense):
    """First-order MAML for one task: ``inner_steps`` SGD steps of size ``inner_lr`` on the support set from
    (``rows0``, ``dense0``), then the query gradient at the adapted parameters, WRITTEN to ``g_rows`` and
    ``g_dense``. Returns (support loss before adaptation, query loss after adaptation)."""
    rows = rows0.copy()
    dense = dense0.copy()
    t_rows = np.zeros_like(rows)
    t_dense = np.zeros_like(dense)
    support_loss = loss_only(rows, sup_idx, sup_y, dense, H)
    for _ in range(inner_steps):
        t_rows[:] = 0.0
        t_dense[:] = 0.0
        forward_backward(rows, sup_idx, sup_y, dense, H, t_rows, t_dense)
        rows -= inner_lr * t_rows
        dense -= inner_lr * t_dense
    g_rows[:] = 0.0
    g_dense[:] = 0.0
    query_loss = forward_backward(rows, qry_idx, qry_y, dense, H, g_rows, g_dense)
    return support_loss, query_loss


@njit(cache=True, parallel=True)
def tasks_meta_gradients(rows, row_off, sup_idx, sup_y, qry_idx, qry_y, dense, H, inner_lr, inner_steps,
                         g_rows, g_dense, losses):
    """:func:`task_meta_gradient` for every task ``t`` (``prange``): its rows ``rows[row_off[t]:row_off[t+1]]``,
    examples ``sup_idx[t]`` / ``qry_idx[t]`` (local to its rows); gradients to ``g_rows`` (same slices) and
    ``g_dense[t]``; ``losses[t] = (support loss before, query loss after adaptation)``."""
    for t in prange(row_off.shape[0] - 1):
        a, b = row_off[t], row_off[t + 1]
        s, q = task_meta_gradient(rows[a:b], sup_idx[t], sup_y[t], qry_idx[t], qry_y[t], dense, H, inner_lr,
                                  inner_steps, g_rows[a:b], g_dense[t])
        losses[t, 0] = s
        losses[t, 1] = q


@njit(cache=True)
def scatter_add_rows(target, ids, values):
    """``target[ids[i]] += values[i]`` in the order of ``i`` (rows of ``E`` values)."""
    for i in range(ids.shape[0]):
        for e in range(values.shape[1]):
            target[ids[i], e] += values[i, e]


@njit(cache=True)
def gather_rows(source, ids, out):
    """``out[i] = source[ids[i]]``."""
    for i in range(ids.shape[0]):
        for e in range(source.shape[1]):
            out[i, e] = source[ids[i], e]


@njit(cache=True)
def sum_in_order(parts, out):
    """``out = parts[0] + parts[1] + ...`` summed in the order of the first axis (an all-reduce's result)."""
    out[:] = 0.0
    for p in range(parts.shape[0]):
        for k in range(parts.shape[1]):
            out[k] += parts[p, k]


@njit(cache=True)
def sgd_apply(param, grad, scale):
    """``param -= scale * grad`` (element-wise, any shape flattened)."""
    p = param.ravel()
    g = grad.ravel()
    for k in range(p.shape[0]):
        p[k] -= scale * g[k]
