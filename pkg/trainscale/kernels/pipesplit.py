r"""Pipeline splits: the layers of every pipeline device and model chunk, and the most layer-micro-batches
of activations a device holds at once. Integer arithmetic only; the time and memory of the stages are priced
in :mod:`trainscale.kernels.plan` and :mod:`trainscale.kernels.memory`.

The stack's default split (:func:`stage_layers`, :func:`chunk_layers`) gives every chunk ``L / (p v)``
layers and the extra layers to the middle devices first, leaving room for the embedding and the logits.
A split given explicitly (``first`` / ``last``: the layers of the first and last device, or ``ends``: the
embedding and the loss counted as layers) follows Megatron-Core's rules (:func:`split_reason`,
:func:`split_chunk_layers`, :func:`split_stage_layers`). :func:`held_layers` counts the activations a device
holds in 1F1B and Megatron's interleaved 1F1B (Korthikanti et al. 2022, Sec. 4.2.3, and the warm-up of the
interleaved schedule, replayed).
"""

import numpy as np
from numba import njit

from .layout import R_OK, R_UNEVEN_CHUNKS


@njit(cache=True)
def stage_layers(layers, pp, v):
    """Layers on (first, middle-most loaded, last) device: chunks differ by at most one layer
    and the extra layers go to middle stages first, leaving room for embedding and logits."""
    chunks = pp * v
    base = layers // chunks
    rem = layers - base * chunks
    even = v * base
    if pp == 1:
        return layers, layers, layers
    if pp == 2:
        return even + (rem + 1) // 2, even + (rem + 1) // 2, even + rem // 2
    capacity = (pp - 2) * v
    if rem <= capacity:
        middle = even + (rem + pp - 3) // (pp - 2)
        return even, middle, even
    left = rem - capacity
    return even + (left + 1) // 2, even + v, even + left // 2


@njit(cache=True)
def chunk_layers(layers, pp, v):
    """Layers of every model chunk, ``[v, pp]`` (chunk c of device d is virtual stage c*pp + d).

    The extra layers of an uneven split go one per chunk to the middle devices first, round
    robin, then to the first and last devices: the per-device totals are :func:`stage_layers`'."""
    out = np.full((v, pp), layers // (pp * v), dtype=np.int64)
    rem = layers - (layers // (pp * v)) * pp * v
    order = np.empty(pp, dtype=np.int64)  # devices in the order they take extra layers
    k = 0
    for d in range(1, pp - 1):
        order[k] = d
        k += 1
    if pp == 1:
        order[0] = 0
    else:
        order[k] = 0
        order[k + 1] = pp - 1
    # middle devices: round robin over devices, one extra per chunk
    n_mid = pp - 2 if pp > 2 else 0
    i = 0
    while rem > 0 and i < n_mid * v:
        out[i // n_mid, order[i % n_mid]] += 1
        rem -= 1
        i += 1
    # then the ends (first gets the odd one), one extra per chunk
    j = 0
    n_end = pp - n_mid
    while rem > 0:
        out[j // n_end, order[n_mid + j % n_end]] += 1
        rem -= 1
        j += 1
    return out


# ``ends`` bits of a split: the embedding (1) and the loss (2) counted as layers in the split
ENDS_EMBEDDING = 1
ENDS_LOSS = 2


@njit(cache=True)
def split_reason(layers, pp, v, first, last, ends):
    r"""Whether Megatron-Core builds the split ``first`` / ``last`` (layers of the first and last
    device, 0: not given) or ``ends`` (:data:`ENDS_EMBEDDING` | :data:`ENDS_LOSS`: the embedding and
    the loss each counted as one layer of the split): ``R_OK`` or ``R_UNEVEN_CHUNKS``.

    The rules of NVIDIA/Megatron-LM d98e8a6 (2026-08), ``TransformerConfig.__post_init__`` in
    megatron/core/transformer/transformer_config.py: a given end count is ``> 0`` and, interleaved, a
    multiple of ``v``; the ``L_mid = L - first - last`` other layers split evenly over the ``p_mid``
    other devices (none left over when there are none), ``L_mid / p_mid`` a multiple of ``v``. With
    ``ends``, ``(L + e + l) / p`` layers per device, a multiple of ``v``, and the end counts may not be
    given as well; no chunk may be left with fewer than one layer (Megatron allows an empty one; a
    chunk without layers is not priced here)."""
    if pp <= 1:
        return R_OK if first == 0 and last == 0 and ends == 0 else R_UNEVEN_CHUNKS
    if ends != 0:
        if first != 0 or last != 0:
            return R_UNEVEN_CHUNKS
        total = layers + (1 if ends & ENDS_EMBEDDING else 0) + (1 if ends & ENDS_LOSS else 0)
        if total % pp != 0 or (total // pp) % v != 0 or total // (pp * v) < 2:
            return R_UNEVEN_CHUNKS
        return R_OK
    rest = layers - first - last
    devices = pp - (1 if first > 0 else 0) - (1 if last > 0 else 0)
    if first < 0 or last < 0 or first % v != 0 or last % v != 0 or rest < 0:
        return R_UNEVEN_CHUNKS
    if devices == 0:
        return R_OK if rest == 0 else R_UNEVEN_CHUNKS
    if rest == 0 or rest % devices != 0 or (rest // devices) % v != 0:
        return R_UNEVEN_CHUNKS
    return R_OK


@njit(cache=True)
def split_chunk_layers(layers, pp, v, first, last, ends):
    """Layers of every model chunk, ``[v, pp]`` (chunk c of device d is virtual stage c*pp + d), of a
    valid split (:func:`split_reason`).

    Without a split (all 0) the stack's default: :func:`chunk_layers`. Otherwise Megatron-Core's
    ``get_num_layers_to_build`` (megatron/core/transformer/transformer_block.py, d98e8a6): every
    chunk of a device holds its device's layers / ``v``; the first device ``first`` layers, the last
    ``last``, the others an even share of the rest; with ``ends``, ``(L + e + l) / (p v)`` layers per
    chunk, one fewer in the first chunk of the first device (the embedding) and in the last chunk of
    the last device (the loss)."""
    if first == 0 and last == 0 and ends == 0:
        return chunk_layers(layers, pp, v)
    out = np.empty((v, pp), dtype=np.int64)
    if ends != 0:
        total = layers + (1 if ends & ENDS_EMBEDDING else 0) + (1 if ends & ENDS_LOSS else 0)
        out[:, :] = total // (pp * v)
        if ends & ENDS_EMBEDDING:
            out[0, 0] -= 1
        if ends & ENDS_LOSS:
            out[v - 1, pp - 1] -= 1
        return out
    devices = pp - (1 if first > 0 else 0) - (1 if last > 0 else 0)
    middle = (layers - first - last) // devices if devices > 0 else 0
    for d in range(pp):
        n = middle
        if d == 0 and first > 0:
            n = first
        elif d == pp - 1 and last > 0:
            n = last
        out[:, d] = n // v
    return out


@njit(cache=True)
def device_layers(chunks):
    """Layers each device holds: the column sums of a (chunk x device) split, in a loop (integers, exact):
    ``chunks.sum(axis=0)`` compiles Numba's generic axis reduction with its error formatting, about 1.5 s of a
    search's compilation from an empty cache, on its critical path."""
    out = np.zeros(chunks.shape[1], dtype=chunks.dtype)
    for c in range(chunks.shape[0]):
        for d in range(chunks.shape[1]):
            out[d] += chunks[c, d]
    return out


@njit(cache=True)
def split_stage_layers(layers, pp, v, first, last, ends):
    """(first, most loaded middle, last) device's layers of a split (:func:`stage_layers` without
    one); the middle is the first device with the most layers among devices 1..p-2."""
    if first == 0 and last == 0 and ends == 0:
        return stage_layers(layers, pp, v)
    per_device = device_layers(split_chunk_layers(layers, pp, v, first, last, ends))
    mid = per_device[0]
    for d in range(1, pp - 1):
        if d == 1 or per_device[d] > mid:
            mid = per_device[d]
    return per_device[0], mid, per_device[pp - 1]


@njit(cache=True, inline="always")
def interleaved_op(p, v, d, step, forward):
    """(chunk, micro-batch) of forward or backward micro-step ``step`` of device ``d`` in Megatron's
    interleaved schedule (the order of :func:`trainscale.kernels.pipeline.build_orders`)."""
    chunk = (step // p) % v
    if not forward:
        chunk = v - 1 - chunk
    return chunk, (step // (p * v)) * p + step % p


@njit(cache=True)
def held_layers(chunks, p, v, m, d):
    r"""Most layer-micro-batches of activations device ``d`` holds at once (``chunks``: layers per
    chunk, ``[v, p]``), in 1F1B (``v`` = 1) or Megatron's interleaved 1F1B.

    1F1B: device ``d`` runs ``min(m, p - d)`` forwards before its first backward, so it holds
    ``min(m, p - d) L_d`` (Korthikanti et al. 2022, Sec. 4.2.3). Interleaved: ``w_d = \min(mv,
    2(p - d - 1) + (v - 1) p)`` warm-up forwards of chunks ``(j // p) mod v``, then forward/backward
    pairs whose backward chunks run in reverse: the peak is reached within the warm-up, its first
    pair and one period of ``p v`` pairs (both chunk sequences repeat with that period, each chunk
    ``p`` times), which this replays. With equal chunks the warm-up gives

    .. math:: \frac{L_d}{v} \min\left(mv,\; pv + p - 2d - 1\right),

    for ``d = 0`` Megatron's ``p L_0 (1 + (p-1)/(pv))`` (megatron/training/theoretical_memory_usage.py)."""
    if v == 1:
        return (m if m < p - d else p - d) * chunks[0, d]
    total = m * v
    warm = 2 * (p - d - 1) + (v - 1) * p
    warm = warm if warm < total else total
    held = 0
    for j in range(warm):
        held += chunks[interleaved_op(p, v, d, j, True)[0], d]
    peak = held
    pairs = total - warm
    pairs = pairs if pairs < p * v + 1 else p * v + 1
    for i in range(pairs):
        held += chunks[interleaved_op(p, v, d, warm + i, True)[0], d]
        peak = held if held > peak else peak
        held -= chunks[interleaved_op(p, v, d, i, False)[0], d]
    return peak
