"""Discrete-event simulator of pipeline-parallel schedules.

A pipeline has ``S = p * v`` virtual stages; virtual stage ``k`` lives on device ``k % p``.
Every device runs its operations strictly in its schedule's order, one at a time; an operation
starts at ``max(device free, dependency ready)``:

* ``F(k, i)`` needs ``F(k-1, i)`` plus ``send[k-1]`` (nothing for ``k = 0``);
* ``B(S-1, i)`` needs ``F(S-1, i)``; ``B(k, i)`` needs ``B(k+1, i)`` plus ``send[k]``;
* ``W(k, i)`` (zero-bubble only) needs ``B(k, i)``.

Transfers do not occupy the devices; they only delay the consumer. Outside ZB-H1 the backward
op lasts ``bwd + wgrad`` (input and weight gradients in one pass); in ZB-H1 ``B`` lasts ``bwd``
and ``W`` lasts ``wgrad``.

Activation memory: a micro-batch's ``act_bytes[k]`` is counted on virtual stage ``k`` from the
start of its ``F`` to the end of its ``B``. For ZB-H1 this follows the paper's accounting
(Qi et al. 2023, sec. 3 and Table 1): the activations ``M_B`` needed by the input-gradient pass
are freed by ``B``; the deferred ``W`` needs only the stashed layer inputs and output gradients
(``M_W``, counted separately there and not modelled here), so ZB-H1's peak equals 1F1B's.

Schedules (per-device op orders, :func:`build_orders`):

* ``GPIPE``: all forwards, then all backwards in reverse micro-batch order;
* ``ONE_F_ONE_B``: PipeDream-flush: ``min(p-d-1, m)`` warm-up forwards, then F/B pairs, then the
  cool-down backwards;
* ``INTERLEAVED``: Megatron-LM's ``forward_backward_pipelining_with_interleaving``: warm-up of
  ``2(p-d-1) + (v-1)p`` forward micro-steps (capped at ``m v``); micro-step ``j`` is chunk
  ``(j // p) % v`` (reversed for backward) and micro-batch ``(j // (p v)) p + j % p``;
* ``ZB_H1``: zero-bubble H1 (Qi et al. 2023, arXiv 2401.10241; the order of the authors'
  DeepSpeed ``ZeroBubbleH1Pipeline``): the 1F1B warm-up, then ``d`` F/B pairs whose ``W`` is
  deferred, then F/B/W triples, then B/W pairs, then the ``d`` deferred ``W`` passes, which fill
  the cool-down bubble.

All kernels take plain arrays; :func:`simulate_one` resolves one pipeline with a work-list over
the devices (O(number of ops)); :func:`simulate_rows` resolves a range of a batch, one pipeline after
another, and :func:`simulate_many` runs ranges of a batch in threads.
"""

from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from numba import njit

GPIPE = 0
ONE_F_ONE_B = 1
INTERLEAVED = 2
ZB_H1 = 3

OP_F = 0
OP_B = 1
OP_W = 2

OK = 0
DEADLOCK = 1


@njit(cache=True)
def ops_per_device(schedule, v, m):
    """Number of operations each device runs (the same on every device)."""
    return v * m * (3 if schedule == ZB_H1 else 2)


@njit(cache=True, inline="always")  # inlined: its literal arguments made ten specialisations
def _put(kind, stage, mb, d, pos, op, virtual_stage, micro_batch):
    """Append one op to device ``d``'s order; returns the next position."""
    kind[d, pos] = op
    stage[d, pos] = virtual_stage
    mb[d, pos] = micro_batch
    return pos + 1


@njit(cache=True)
def build_orders(schedule, p, v, m):
    """Per-device op orders: ``(kind, stage, micro_batch)``, each an ``int64[p, n]`` array."""
    n = ops_per_device(schedule, v, m)
    kind = np.empty((p, n), np.int64)
    stage = np.empty((p, n), np.int64)
    mb = np.empty((p, n), np.int64)
    for d in range(p):
        pos = 0
        if schedule == GPIPE:
            for i in range(m):
                pos = _put(kind, stage, mb, d, pos, OP_F, d, i)
            for i in range(m - 1, -1, -1):
                pos = _put(kind, stage, mb, d, pos, OP_B, d, i)
        elif schedule == ONE_F_ONE_B:
            warm = min(p - d - 1, m)
            for i in range(warm):
                pos = _put(kind, stage, mb, d, pos, OP_F, d, i)
            for j in range(m - warm):
                pos = _put(kind, stage, mb, d, pos, OP_F, d, warm + j)
                pos = _put(kind, stage, mb, d, pos, OP_B, d, j)
            for i in range(m - warm, m):
                pos = _put(kind, stage, mb, d, pos, OP_B, d, i)
        elif schedule == INTERLEAVED:
            total = m * v
            warm = min(2 * (p - d - 1) + (v - 1) * p, total)
            remaining = total - warm
            for j in range(2 * total):
                # positions: warm forwards, then (F, B) pairs, then cool-down backwards
                if j < warm:
                    is_f = True
                    step = j
                elif j < warm + 2 * remaining:
                    r = j - warm
                    is_f = r % 2 == 0
                    step = warm + r // 2 if is_f else r // 2
                else:
                    is_f = False
                    step = j - warm - remaining
                chunk = (step // p) % v
                if not is_f:
                    chunk = v - 1 - chunk
                pos = _put(kind, stage, mb, d, pos, OP_F if is_f else OP_B, chunk * p + d,
                           (step // (p * v)) * p + step % p)
        else:  # ZB_H1
            nf = 0
            nb = 0
            nw = 0
            warm = min(p - d - 1, m)
            for _ in range(warm):
                pos = _put(kind, stage, mb, d, pos, OP_F, d, nf)
                nf += 1
            for _ in range(d):  # F, B with W deferred
                if nf == m:
                    break
                pos = _put(kind, stage, mb, d, pos, OP_F, d, nf)
                pos = _put(kind, stage, mb, d, pos, OP_B, d, nb)
                nf += 1
                nb += 1
            while nf < m:  # F, B, W
                pos = _put(kind, stage, mb, d, pos, OP_F, d, nf)
                pos = _put(kind, stage, mb, d, pos, OP_B, d, nb)
                pos = _put(kind, stage, mb, d, pos, OP_W, d, nw)
                nf += 1
                nb += 1
                nw += 1
            while nb < m:  # B, W
                pos = _put(kind, stage, mb, d, pos, OP_B, d, nb)
                pos = _put(kind, stage, mb, d, pos, OP_W, d, nw)
                nb += 1
                nw += 1
            while nw < m:  # the deferred W passes fill the cool-down
                pos = _put(kind, stage, mb, d, pos, OP_W, d, nw)
                nw += 1
    return kind, stage, mb


@njit(cache=True)
def simulate_one(split_w, p, m, kind, stage, mb, fwd, bwd, wgrad, send, act,
                 fend, bend, ptr, free, held_b, blocked, stack,
                 busy, peak, start_out, end_out, want_timeline):
    """Resolve one pipeline; returns ``(status, makespan)``.

    ``kind``/``stage``/``mb`` are the per-device orders from :func:`build_orders`; ``split_w``
    says whether ``W`` is a separate op (ZB-H1) or folded into ``B``. Work arrays (overwritten):
    ``fend``/``bend`` (``S*m``, end times of F and B), ``ptr``/``free``/``held_b``/``blocked``/
    ``stack`` (``p``). Outputs: ``busy``/``peak`` (``p``), and when ``want_timeline`` the start and end of
    every op in ``start_out``/``end_out`` (``[p, n]``, in each device's order).
    """
    n = kind.shape[1]
    S = fwd.shape[0]
    for k in range(S * m):
        fend[k] = -1.0
        bend[k] = -1.0
    for d in range(p):
        ptr[d] = 0
        free[d] = 0.0
        held_b[d] = 0.0
        blocked[d] = False
        stack[d] = d
        busy[d] = 0.0
        peak[d] = 0.0
    top = p
    done = 0
    makespan = 0.0
    while top > 0:
        top -= 1
        d = stack[top]
        j = ptr[d]
        t = free[d]
        b = busy[d]
        held = held_b[d]  # activation bytes held on device d before its op j
        pk = peak[d]
        while j < n:
            op = kind[d, j]
            k = stage[d, j]
            i = mb[d, j]
            if op == OP_F:
                if k == 0:
                    ready = 0.0
                else:
                    e = fend[(k - 1) * m + i]
                    if e < 0.0:
                        break
                    ready = e + send[k - 1]
                dur = fwd[k]
            elif op == OP_B:
                if k == S - 1:
                    e = fend[k * m + i]
                    if e < 0.0:
                        break
                    ready = e
                else:
                    e = bend[(k + 1) * m + i]
                    if e < 0.0:
                        break
                    ready = e + send[k]
                dur = bwd[k] if split_w else bwd[k] + wgrad[k]
            else:
                e = bend[k * m + i]
                if e < 0.0:
                    break
                ready = e
                dur = wgrad[k]
            s = max(t, ready)
            t = s + dur
            b += dur
            if want_timeline:
                start_out[d, j] = s
                end_out[d, j] = t
            j += 1
            if op == OP_F:
                held += act[k]
                pk = max(pk, held)
                fend[k * m + i] = t
                if k + 1 < S:
                    c = (k + 1) % p
                    if blocked[c]:
                        blocked[c] = False
                        stack[top] = c
                        top += 1
            elif op == OP_B:
                held -= act[k]
                bend[k * m + i] = t
                if k > 0:
                    c = (k - 1) % p
                    if blocked[c]:
                        blocked[c] = False
                        stack[top] = c
                        top += 1
        done += j - ptr[d]
        ptr[d] = j
        free[d] = t
        busy[d] = b
        held_b[d] = held
        peak[d] = pk
        makespan = max(makespan, t)
        if j < n:
            blocked[d] = True
    if done < p * n:
        return DEADLOCK, makespan
    return OK, makespan


@njit(cache=True, nogil=True)
def simulate_rows(schedule, p, v, m, fwd, bwd, wgrad, send, act,
                  makespan, status, busy, peak, start_out, end_out, want_timeline, first, stop):
    """Resolve the independent pipelines ``first <= r < stop`` of a batch (same ``schedule``, ``p``,
    ``v``, ``m``), one after another; it releases the GIL, so ranges of one batch can run in threads
    (:func:`simulate_many`).

    Inputs are ``[batch, S]`` (``send``: ``[batch, S-1]``); outputs ``makespan``/``status``
    (``[batch]``), ``busy``/``peak`` (``[batch, p]``) and, when ``want_timeline``,
    ``start_out``/``end_out`` (``[batch, p, n]``; pass ``[1, 1, 1]`` arrays otherwise). Each
    row writes only its own outputs.
    """
    kind, stage, mb = build_orders(schedule, p, v, m)
    split_w = schedule == ZB_H1
    S = p * v
    fend = np.empty(S * m)
    bend = np.empty(S * m)
    ptr = np.empty(p, np.int64)
    free = np.empty(p)
    held = np.empty(p)
    blocked = np.empty(p, np.bool_)
    stack = np.empty(p, np.int64)
    for r in range(first, stop):
        row = r if want_timeline else 0
        st, ms = simulate_one(split_w, p, m, kind, stage, mb, fwd[r], bwd[r], wgrad[r], send[r], act[r],
                              fend, bend, ptr, free, held, blocked, stack,
                              busy[r], peak[r], start_out[row], end_out[row], want_timeline)
        status[r] = st
        makespan[r] = ms


MIN_ROWS_PER_THREAD = 64  # below this a range is not worth a thread


def simulate_many(schedule, p, v, m, fwd, bwd, wgrad, send, act,
                  makespan, status, busy, peak, start_out, end_out, want_timeline, threads=None):
    """Resolve ``fwd.shape[0]`` independent pipelines: :func:`simulate_rows` over ``threads``
    contiguous ranges side by side (default Numba's thread count; one range below
    :data:`MIN_ROWS_PER_THREAD` rows a thread). Arguments and outputs as :func:`simulate_rows`.

    Plain Python, not a ``parallel=True`` kernel: one pipeline (what every prediction with pipeline
    parallelism simulates, twice) took milliseconds to start the thread pool's parallel region on a
    busy machine, against tens of microseconds to simulate; the rows are independent, so any cut
    gives the same numbers."""
    n = fwd.shape[0]
    n_threads = max(1, min(int(threads or numba.get_num_threads()), n // MIN_ROWS_PER_THREAD))
    bounds = [n * c // n_threads for c in range(n_threads + 1)]

    def run(c):
        simulate_rows(schedule, p, v, m, fwd, bwd, wgrad, send, act, makespan, status, busy, peak,
                      start_out, end_out, want_timeline, bounds[c], bounds[c + 1])

    if n_threads == 1:
        run(0)
    else:
        with ThreadPoolExecutor(n_threads) as pool:
            list(pool.map(run, range(n_threads)))
