r"""A PETALS-style swarm: block placement, routing and chain costs (Borzunov et al. 2023, arXiv 2209.01188).

Plain arrays in, numbers out; the model layer is :mod:`trainscale.workloads.swarm`. A model of ``L`` blocks is served by
``S`` servers; server ``s`` holds the contiguous span ``[a_s, a_s + n_s)`` of blocks (``n_s`` fixed by its memory)
and has a round-trip time ``r_s`` to the client, a link of ``B_s`` bytes/s, a per-block decode time ``d_s`` and a
per-block forward time ``f_s`` (one batch of prompts).

**Chains.** A client runs a step through a chain of hops ``(s, i, j)``: server ``s`` computes blocks ``i..j-1``
(``a_s <= i < j <= a_s + n_s``), the hops covering ``0..L`` in order. PETALS routes from the client: the hidden
states go to a server and come back before the next hop, so one hop of an inference step costs

.. math:: c_s(i, j) = r_s + (j - i)\,d_s + 2\,b_\mathrm{act} / B_s,

with ``b_act`` the bytes of one token's hidden state (``2 h``); a forward pass of ``m`` tokens costs the same with
``f_s`` and ``m b_act``. The chain's latency is the sum over its hops.

**PETALS' router** picks the chain with a shortest path whose edge ``(s, i, j)`` costs ``r_s / 2 + (j - i) d_s``,
plus a penalty ``p`` when the server has no room left for the client's attention cache. The graph's nodes are
the block boundaries ``0..L`` and every edge goes forward, so Dijkstra's algorithm settles the nodes in index
order: :func:`route` is that sweep (exact on this DAG; ties go to the longer hop, then the lower server index).
:func:`route` takes the edge cost in general form ``w r_s + (j - i) d_s + e_s``: PETALS' rule is ``w = 1/2``,
``e_s = p_s``; the latency-optimal chain (the search's) is ``w = 1``, ``e_s = p_s + 2 b_act / B_s``, whose path
cost is :func:`chain_time` itself (plus any penalty).

**PETALS' placement** (:func:`petals_placement`): servers join in order and each takes the span that maximises
the swarm's weakest block throughput after it joins (ties: the span over the least-served blocks, then the
lowest start). A block's throughput is the sum of
the throughputs of the servers holding it; a server's is ``min(1 / f_s, B_s / b_fwd)`` forward passes per second
(compute or its link), as PETALS measures both and keeps the smaller.
"""

import numpy as np
from numba import njit

INF = 1e300


@njit(cache=True)
def server_throughput(fwd_s, bw_Bps, fwd_bytes):
    """Forward passes per second of one block on a server: ``min(1 / f_s, B_s / b_fwd)``."""
    compute = 1.0 / fwd_s if fwd_s > 0.0 else INF
    link = bw_Bps / fwd_bytes if fwd_bytes > 0.0 else INF
    return compute if compute < link else link


@njit(cache=True)
def block_throughputs(starts, spans, tput, L, out):
    """``out[k]``: the summed throughput of the servers holding block ``k``."""
    for k in range(L):
        out[k] = 0.0
    for s in range(starts.shape[0]):
        if starts[s] < 0:
            continue
        for k in range(starts[s], min(L, starts[s] + spans[s])):
            out[k] += tput[s]


@njit(cache=True)
def swarm_throughput(starts, spans, tput, L):
    """The swarm's forward throughput: its weakest block's (0 when a block is not served)."""
    blocks = np.empty(L)
    block_throughputs(starts, spans, tput, L, blocks)
    return blocks.min()


@njit(cache=True)
def petals_placement(spans, tput, L, starts):
    """Fill ``starts`` with PETALS' greedy choice: servers join in index order, each taking the span that
    maximises the weakest block's throughput once it holds it (then the lowest start)."""
    S = spans.shape[0]
    blocks = np.zeros(L)
    for s in range(S):
        starts[s] = -1
    for s in range(S):
        n = min(spans[s], L)
        best_start, best_min, best_sum = 0, -1.0, -1.0
        for a in range(L - n + 1):
            low = INF
            for k in range(L):
                v = blocks[k] + (tput[s] if a <= k < a + n else 0.0)
                if v < low:
                    low = v
            covered = 0.0  # tie-break on the weakest blocks covered: prefer the span over the thinnest blocks
            for k in range(a, a + n):
                covered -= blocks[k]
            if low > best_min + 1e-12 or (abs(low - best_min) <= 1e-12 and covered > best_sum + 1e-12):
                best_start, best_min, best_sum = a, low, covered
        starts[s] = best_start
        for k in range(best_start, best_start + n):
            blocks[k] += tput[s]


@njit(cache=True)
def route(starts, spans, rtt_s, block_s, hop_s, rtt_weight, L, hop_server, hop_from, hop_to):
    """The shortest path from block 0 to ``L``, edge cost ``rtt_weight r_s + (j - i) d_s + hop_s[s]`` (PETALS:
    ``rtt_weight`` = 1/2, ``hop_s`` = the cache penalty); writes its hops and returns their number (0: no chain
    covers the model)."""
    S = starts.shape[0]
    dist = np.full(L + 1, INF)
    prev_s = -np.ones(L + 1, dtype=np.int64)
    prev_i = -np.ones(L + 1, dtype=np.int64)
    dist[0] = 0.0
    for i in range(L):  # nodes settle in index order: every edge goes forward
        if dist[i] >= INF:
            continue
        for s in range(S):
            a = starts[s]
            if a < 0 or i < a or i >= a + spans[s]:
                continue
            end = min(L, a + spans[s])
            for j in range(i + 1, end + 1):
                c = dist[i] + rtt_weight * rtt_s[s] + (j - i) * block_s[s] + hop_s[s]
                if c < dist[j] - 1e-15:
                    dist[j] = c
                    prev_s[j] = s
                    prev_i[j] = i
    if dist[L] >= INF:
        return 0
    n = 0
    j = L
    while j > 0:
        n += 1
        j = prev_i[j]
    j = L
    for h in range(n - 1, -1, -1):
        hop_server[h] = prev_s[j]
        hop_from[h] = prev_i[j]
        hop_to[h] = j
        j = prev_i[j]
    return n


@njit(cache=True)
def chain_time(hop_server, hop_from, hop_to, n_hops, rtt_s, per_block_s, bw_Bps, act_bytes):
    """Seconds of one pass through a chain: ``sum_hops r_s + (j - i) t_s + 2 b / B_s`` (the client relays
    the hidden states, so each hop sends them to the server and back)."""
    total = 0.0
    for h in range(n_hops):
        s = hop_server[h]
        total += rtt_s[s] + (hop_to[h] - hop_from[h]) * per_block_s[s] + 2.0 * act_bytes / bw_Bps[s]
    return total


@njit(cache=True)
def evaluate(starts, spans, rtt_s, dec_s, bw_Bps, hop_s, rtt_weight, tput, L, act_bytes):
    """One placement: (inference step latency of the chain routed with edge costs ``rtt_weight``, ``hop_s``,
    swarm throughput, hops); the latency is infinite when no chain covers the model."""
    hs = np.empty(L, dtype=np.int64)
    hf = np.empty(L, dtype=np.int64)
    ht = np.empty(L, dtype=np.int64)
    n = route(starts, spans, rtt_s, dec_s, hop_s, rtt_weight, L, hs, hf, ht)
    if n == 0:
        return INF, 0.0, 0
    latency = chain_time(hs, hf, ht, n, rtt_s, dec_s, bw_Bps, act_bytes)
    return latency, swarm_throughput(starts, spans, tput, L), n


@njit(cache=True)
def uncovered_blocks(starts, spans, L):
    """How many of the ``L`` blocks no server holds."""
    held = np.zeros(L, dtype=np.bool_)
    for s in range(starts.shape[0]):
        if starts[s] >= 0:
            for k in range(starts[s], min(L, starts[s] + spans[s])):
                held[k] = True
    return L - held.sum()


@njit(cache=True)
def evaluate_many(population, spans, rtt_s, dec_s, bw_Bps, hop_s, rtt_weight, tput, L, act_bytes, out):
    """``out[p] = (latency, throughput, uncovered blocks)`` for every placement (row) of ``population``, each
    routed with edge costs ``rtt_weight``, ``hop_s`` (see :func:`route`)."""
    for p in range(population.shape[0]):
        lat, thr, _ = evaluate(population[p], spans, rtt_s, dec_s, bw_Bps, hop_s, rtt_weight, tput, L, act_bytes)
        out[p, 0] = lat
        out[p, 1] = thr
        out[p, 2] = uncovered_blocks(population[p], spans, L)


# --------------------------------------------------------------------------- client chains (the GA's genome)
# Hakim & Hasan (arXiv 2510.11211) search a client's chain of servers, the placement fixed. A chain is written
# as one gene per block: gene ``g_k`` picks server ``holders[k, g_k mod n_k]`` among the ``n_k`` servers holding
# block ``k``; consecutive blocks on the same server form one hop. Every genome is a valid chain.


@njit(cache=True)
def block_holders(starts, spans, L, holders, n_holders):
    """``holders[k, :n_holders[k]]``: the servers holding block ``k``, by index."""
    for k in range(L):
        n_holders[k] = 0
    for s in range(starts.shape[0]):
        if starts[s] < 0:
            continue
        for k in range(starts[s], min(L, starts[s] + spans[s])):
            holders[k, n_holders[k]] = s
            n_holders[k] += 1


@njit(cache=True)
def decode_chain(genes, holders, n_holders, L, hop_server, hop_from, hop_to):
    """The hops of the chain a genome encodes; returns their number (0 when a block has no holder)."""
    n = 0
    for k in range(L):
        if n_holders[k] == 0:
            return 0
        s = holders[k, genes[k] % n_holders[k]]
        if n > 0 and hop_server[n - 1] == s and hop_to[n - 1] == k:
            hop_to[n - 1] = k + 1
        else:
            hop_server[n] = s
            hop_from[n] = k
            hop_to[n] = k + 1
            n += 1
    return n


@njit(cache=True)
def chain_stage_s(hop_server, hop_from, hop_to, n_hops, per_block_s, bw_Bps, fwd_bytes):
    """The slowest hop of a chain in a pipelined parallel forward pass: ``max_hops (j - i) f_s + 2 b / B_s``
    (the RTT is hidden by pipelining; compute and the relayed transfer are not)."""
    worst = 0.0
    for h in range(n_hops):
        s = hop_server[h]
        t = (hop_to[h] - hop_from[h]) * per_block_s[s] + 2.0 * fwd_bytes / bw_Bps[s]
        if t > worst:
            worst = t
    return worst


@njit(cache=True)
def evaluate_chains(population, holders, n_holders, rtt_s, dec_s, fwd_s, bw_Bps, act_bytes, fwd_bytes, L, out):
    """``out[p] = (step latency, slowest forward stage in s, hops)`` of every chain (row of genes) of
    ``population``; latency ``INF`` when the chain does not cover the model."""
    hs = np.empty(L, dtype=np.int64)
    hf = np.empty(L, dtype=np.int64)
    ht = np.empty(L, dtype=np.int64)
    for p in range(population.shape[0]):
        n = decode_chain(population[p], holders, n_holders, L, hs, hf, ht)
        if n == 0:
            out[p, 0], out[p, 1], out[p, 2] = INF, INF, 0.0
            continue
        out[p, 0] = chain_time(hs, hf, ht, n, rtt_s, dec_s, bw_Bps, act_bytes)
        out[p, 1] = chain_stage_s(hs, hf, ht, n, fwd_s, bw_Bps, fwd_bytes)
        out[p, 2] = n
