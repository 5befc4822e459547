r"""Training a transformer on a 2D mesh of chiplets: hop counts, collectives, step time and energy.

The package is an ``n x n`` mesh of ``N = n^2`` identical chiplets (Huang et al., "Hecaton",
arXiv 2407.05784). Chiplet ``(r, c)`` (row ``r``, column ``c``, index ``r n + c``) has a
bidirectional die-to-die link to each of its 4 neighbours, of bandwidth ``B`` per direction; a
message crossing ``d`` links pays ``d`` hop latencies ``alpha`` (cut-through routing) and
``d`` times the link energy per bit. Every chiplet has its own DRAM channel (bandwidth
``B_DRAM``) and a compute die of peak ``P`` FLOP/s reaching a fraction ``eta`` of it on GEMMs.

**Hop counts.** With XY routing, the hops between two chiplets are the Manhattan distance

.. math:: d\big((r_1, c_1), (r_2, c_2)\big) = |r_1 - r_2| + |c_1 - c_2|

(:func:`mesh_hops`; a breadth-first search over the mesh graph gives the same, see the tests).

**A ring over the whole mesh** (1D tensor parallelism over all ``N`` chiplets). For ``n`` even a
Hamiltonian cycle exists (row 0 left to right, the other rows snaking over columns ``n-1..1``,
back up column 0): ``N`` ring edges of 1 hop each. For ``n`` odd the mesh is bipartite with an
odd number of vertices, so no cycle of 1-hop edges visits every chiplet; the best ring has one
2-hop edge: ``N + 1`` hops in all (:func:`mesh_ring_max_hops`, :func:`mesh_ring_total_hops`;
the construction is :func:`trainscale.workloads.chiplet.mesh_ring`). Each directed link carries at most
one ring edge, so a ring running one way round gets the full link bandwidth at every step. A
*bidirectional* ring (half of every chunk each way round, as NCCL's two rings) doubles the
bandwidth when no directed link carries two edges: true for ``n`` even; for ``n`` odd the 2-hop
edge shares one directed link with the reverse ring's edge (congestion 2,
:func:`mesh_ring_congestion`).

**A ring along a row (or column) of ``p`` chiplets** (2D scheme). A line has no wrap-around
link; the *folded* ring ``0, 2, 4, ..., (evens up), ..., 5, 3, 1`` uses every directed link of the
line exactly once, each edge at most 2 hops long:

.. math:: h_\max^\mathrm{line}(p) = \begin{cases}0 & p = 1\\ 1 & p = 2\\ 2 & p \ge 3\end{cases},\qquad
          H^\mathrm{line}(p) = 2(p - 1)

(:func:`line_ring_max_hops`, :func:`line_ring_total_hops`). All ``n`` rows (or columns) run
their collectives at once on disjoint links.

**Ring collective on the mesh.** An all-gather (equally a reduce-scatter) of a buffer of ``S``
bytes (the gathered size) over ``p`` members takes ``p - 1`` steps; at each step every member
passes a chunk of ``S/p`` bytes to its ring successor, which is ``h_max`` hops away at worst and
shares its busiest directed link with ``c - 1`` other edges; with ``k`` directions (2 for the
bidirectional ring, each direction carrying half of every chunk):

.. math:: T_\mathrm{ring}(S, p) = (p-1)\,h_\max\,\alpha + \frac{p-1}{p}\,\frac{S\,c}{k\,B}

— the ring formula of :func:`trainscale.kernels.collectives.ring_phase_time` with per-step
latency ``h_max alpha`` and bandwidth ``k B / c`` (:func:`mesh_ring_phase_time`). An all-reduce
is two phases. The bytes moved over links, summed over every link of the group (what the link
energy is paid on), are

.. math:: V_\mathrm{ring}(S, p) = \frac{p-1}{p}\,S\,H

with ``H`` the ring's total hop count (:func:`ring_phase_link_bytes`).

**Local work (roofline).** A GEMM of ``F`` FLOPs that moves ``D`` bytes to or from DRAM (each
operand read once and the result written once: ``D = w(mk + kn + mn)`` for an ``m x k`` by
``k x n`` product with ``w``-byte elements) takes

.. math:: t = \max\left(\frac{F}{\eta P},\ \frac{D}{B_\mathrm{DRAM}}\right)

(:func:`roofline_time`; ``kernels/compute.py`` models a GPU's tiles and waves, which a chiplet's
systolic array does not have, so the chiplet keeps the plain roofline). Backward is the data
gradient and the weight gradient, two GEMMs of the forward's FLOPs and bytes: 3 in all.

**The two schemes**, per transformer layer, per chiplet, for ``T`` tokens, hidden ``h``, key/value
width ``h_kv``, FFN width ``f`` with ``g`` FFN matrices, linear layers ``(in, out)``: QKV
``(h, h + 2h_kv)``, output ``(h, h)``, FFN in ``(h, (g-1) f)``, FFN out ``(f, h)``:

- ``1D`` (Megatron tensor parallelism over all ``N``): QKV and FFN-in split by output columns
  (``m, k, n = T, in, out/N``), output and FFN-out by input rows (``T, in/N, out``); every chiplet
  holds the whole activation. Four all-reduces of ``T h w`` bytes per layer (two forward, after
  the output projection and FFN-out; two backward, on the input gradients of QKV and FFN-in) over
  the bidirectional mesh ring.
- ``2D`` (Hecaton): every weight cut into ``n x n`` blocks, chiplet ``(r, c)`` holding block
  ``(r, c)``; activations cut over tokens along one mesh axis and features along the other. A
  linear layer all-gathers its input along one axis (``T in / n`` gathered bytes per group),
  multiplies (``m, k, n = T, in/n, out/n``) and reduce-scatters the partial sums along the other
  axis (``T out / n``); its output lands with the axes swapped, which the next layer's block
  layout expects. Backward mirrors it: all-gather of the output gradient, reduce-scatter of the
  input gradient; the weight gradient reuses the gathered input and output gradient. Four ring
  phases per linear layer, on rows and columns at once:

.. math:: T^\mathrm{2D}_\mathrm{comm} = \sum_\mathrm{linear}
          2\,T_\mathrm{ring}\!\left(\tfrac{T\,\mathrm{in}\,w}{n}, n\right)
          + 2\,T_\mathrm{ring}\!\left(\tfrac{T\,\mathrm{out}\,w}{n}, n\right)
          \qquad\text{vs}\qquad T^\mathrm{1D}_\mathrm{comm} = 8\,T_\mathrm{ring}(T h w, N)

  so per chiplet the 2D scheme moves ``~ T h / sqrt(N)`` bytes where 1D moves ``~ T h``, while
  both do ``~ T h^2 / N`` FLOPs. Under weak scaling (``h`` grown with ``n``, so the FLOPs per
  chiplet stay fixed) the 2D compute/communication ratio is constant up to the ``(n-1)/n`` ring
  factor and the latency, and the 1D ratio falls like ``1/n``.

The attention core (scores and weighted values, ``4 T s h`` forward FLOPs for sequences of ``s``
tokens, heads split over the chiplets; Q, K, V and the output read or written once) is local in
both schemes: in 2D each token block holds whole sequences. Norms, residuals and the optimizer
update are left out (small and the same for both schemes).

**Step.** ``t_step = t_local + t_comm`` (no overlap of communication with compute, for both
schemes). **Energy** of a step, over the whole mesh, is additive:

.. math:: E = N F e_\mathrm{FLOP} + 8 N D e_\mathrm{DRAM} + 8 V e_\mathrm{link} + N P_\mathrm{static}\,t_\mathrm{step}

with ``e`` in joules per FLOP or per bit, ``V`` the link byte-hops of every collective.
"""

import numpy as np
from numba import njit, prange

from .collectives import ring_phase_time

SCHEME_1D = 0
SCHEME_2D = 1

# fields of the per-step cost vector (step_costs)
S_COMPUTE = 0        # s, FLOPs / (eta P) per chiplet
S_DRAM = 1           # s, DRAM bytes / B_DRAM per chiplet
S_LOCAL = 2          # s, sum of per-GEMM roofline maxima
S_COMM = 3           # s, collectives
S_STEP = 4           # s, local + comm
S_FLOPS = 5          # FLOPs per chiplet per step
S_DRAM_BYTES = 6     # DRAM bytes per chiplet per step
S_COMM_BYTES = 7     # bytes each chiplet sends per step
S_LINK_BYTE_HOPS = 8  # bytes x links over the whole mesh per step
S_ACT_BYTES = 9      # stored GEMM inputs per chiplet (for the weight gradients)
S_WEIGHT_BYTES = 10  # weight bytes per chiplet
S_E_COMPUTE = 11     # J, whole mesh
S_E_DRAM = 12
S_E_LINK = 13
S_E_STATIC = 14
S_E_TOTAL = 15
S_SIZE = 16

# hardware vector (step_costs)
H_PEAK_FLOPS = 0     # FLOP/s per chiplet
H_EFF = 1            # achievable fraction of peak on GEMMs
H_DRAM_BW = 2        # B/s per chiplet
H_LINK_BW = 3        # B/s per link per direction
H_HOP_LATENCY = 4    # s per hop
H_FLOP_J = 5         # J per FLOP
H_DRAM_J_BIT = 6     # J per bit
H_LINK_J_BIT = 7     # J per bit per hop
H_STATIC_W = 8       # W per chiplet
H_SIZE = 9

# model vector (step_costs); widths may be non-integer (scaled shapes)
M_HIDDEN = 0
M_KV = 1             # key/value width kv_heads * head_dim
M_FFN = 2
M_FFN_MATRICES = 3   # 2 (GELU) or 3 (SwiGLU)
M_LAYERS = 4
M_SEQ = 5
M_TOKENS = 6         # tokens per step
M_BYTES = 7          # bytes per element (2 for bf16)
M_SIZE = 8


@njit(cache=True)
def mesh_hops(a, b, n):
    """Links crossed between chiplets ``a`` and ``b`` (indices ``r n + c``) of an ``n x n`` mesh."""
    ra, ca = a // n, a % n
    rb, cb = b // n, b % n
    return abs(ra - rb) + abs(ca - cb)


@njit(cache=True)
def mesh_ring_max_hops(n):
    """Longest edge (in hops) of the best ring through all ``n^2`` chiplets."""
    if n <= 1:
        return 0
    return 1 if n % 2 == 0 else 2


@njit(cache=True)
def mesh_ring_total_hops(n):
    """Hops summed over the edges of that ring: ``N`` (n even), ``N + 1`` (n odd)."""
    if n <= 1:
        return 0
    return n * n if n % 2 == 0 else n * n + 1


@njit(cache=True)
def mesh_ring_congestion(n, bidirectional):
    """Most ring edges sharing one directed link (1, or 2 for a bidirectional ring with n odd)."""
    if n <= 1:
        return 1
    if bidirectional and n % 2 == 1:
        return 2
    return 1


@njit(cache=True)
def line_ring_max_hops(p):
    """Longest edge of the folded ring on a line of ``p`` chiplets."""
    if p <= 1:
        return 0
    return 1 if p == 2 else 2


@njit(cache=True)
def line_ring_total_hops(p):
    """Hops summed over the folded ring's edges: ``2 (p - 1)``."""
    if p <= 1:
        return 0
    return 2 * (p - 1)


@njit(cache=True)
def mesh_ring_phase_time(nbytes, p, max_hops, congestion, directions, link_bw, hop_latency):
    """One ring pass (all-gather or reduce-scatter) of ``nbytes`` (gathered size) over ``p``."""
    return ring_phase_time(nbytes, p, directions * link_bw / congestion, max_hops * hop_latency, 1.0)


@njit(cache=True)
def ring_phase_link_bytes(nbytes, p, total_hops):
    """Bytes x links of one ring pass, summed over the group's links."""
    if p <= 1 or nbytes <= 0.0:
        return 0.0
    return (p - 1) / p * nbytes * total_hops


@njit(cache=True)
def roofline_time(flops, dram_bytes, peak_flops, efficiency, dram_bw):
    """max(compute, DRAM) seconds of one GEMM-like kernel."""
    t_compute = flops / (efficiency * peak_flops)
    t_dram = dram_bytes / dram_bw
    return max(t_dram, t_compute)


@njit(cache=True)
def _linear_shape(scheme, i, n, tokens, fan_in, fan_out):
    """(m, k, n) of the local GEMM of linear layer ``i`` (0 QKV, 1 output, 2 FFN-in, 3 FFN-out)."""
    big_n = n * n
    if scheme == SCHEME_1D:
        if i == 0 or i == 2:  # column-parallel
            return tokens, fan_in, fan_out / big_n
        return tokens, fan_in / big_n, fan_out  # row-parallel
    return tokens, fan_in / n, fan_out / n


@njit(cache=True)
def step_costs(scheme, n, model, hw):
    """Per-step costs of one training step of ``model`` on an ``n x n`` mesh (fields ``S_*``)."""
    out = np.zeros(S_SIZE)
    h = model[M_HIDDEN]
    kv = model[M_KV]
    f = model[M_FFN]
    g = model[M_FFN_MATRICES]
    layers = model[M_LAYERS]
    s = model[M_SEQ]
    tokens = model[M_TOKENS]
    w = model[M_BYTES]
    big_n = n * n
    peak, eff, dram_bw = hw[H_PEAK_FLOPS], hw[H_EFF], hw[H_DRAM_BW]
    link_bw, alpha = hw[H_LINK_BW], hw[H_HOP_LATENCY]

    fan_in = np.array([h, h, h, f])
    fan_out = np.array([h + 2.0 * kv, h, (g - 1.0) * f, h])
    flops = 0.0
    dram = 0.0
    local = 0.0
    act = 0.0
    weights = 0.0
    for i in range(4):
        m, k, nn = _linear_shape(scheme, i, n, tokens, fan_in[i], fan_out[i])
        f_gemm = 2.0 * m * k * nn
        d_gemm = w * (m * k + k * nn + m * nn)
        flops += 3.0 * f_gemm
        dram += 3.0 * d_gemm
        local += 3.0 * roofline_time(f_gemm, d_gemm, peak, eff, dram_bw)
        act += w * m * k
        weights += w * k * nn
    # attention core: heads split over all chiplets in both schemes
    f_attn = 4.0 * tokens * s * h / big_n
    d_attn = w * tokens * (2.0 * h + 2.0 * kv) / big_n
    flops += 3.0 * f_attn
    dram += 3.0 * d_attn
    local += 3.0 * roofline_time(f_attn, d_attn, peak, eff, dram_bw)
    act += w * tokens * (h + 2.0 * kv) / big_n

    comm = 0.0
    sent = 0.0
    link_bytes = 0.0
    if scheme == SCHEME_1D:
        hops = mesh_ring_max_hops(n)
        cong = mesh_ring_congestion(n, True)
        total = mesh_ring_total_hops(n)
        size = tokens * h * w
        comm = 8.0 * mesh_ring_phase_time(size, big_n, hops, cong, 2.0, link_bw, alpha)
        sent = 8.0 * (big_n - 1) / big_n * size if big_n > 1 else 0.0
        link_bytes = 8.0 * ring_phase_link_bytes(size, big_n, total)
    else:
        hops = line_ring_max_hops(n)
        total = line_ring_total_hops(n)
        for i in range(4):
            for width in (fan_in[i], fan_out[i]):
                size = tokens * width * w / n
                comm += 2.0 * mesh_ring_phase_time(size, n, hops, 1, 1.0, link_bw, alpha)
                if n > 1:
                    sent += 2.0 * (n - 1) / n * size
                # n groups (rows or columns) at once
                link_bytes += 2.0 * n * ring_phase_link_bytes(size, n, total)

    out[S_COMPUTE] = layers * flops / (eff * peak)
    out[S_DRAM] = layers * dram / dram_bw
    out[S_LOCAL] = layers * local
    out[S_COMM] = layers * comm
    out[S_STEP] = out[S_LOCAL] + out[S_COMM]
    out[S_FLOPS] = layers * flops
    out[S_DRAM_BYTES] = layers * dram
    out[S_COMM_BYTES] = layers * sent
    out[S_LINK_BYTE_HOPS] = layers * link_bytes
    out[S_ACT_BYTES] = layers * act
    out[S_WEIGHT_BYTES] = layers * weights
    out[S_E_COMPUTE] = big_n * out[S_FLOPS] * hw[H_FLOP_J]
    out[S_E_DRAM] = big_n * 8.0 * out[S_DRAM_BYTES] * hw[H_DRAM_J_BIT]
    out[S_E_LINK] = 8.0 * out[S_LINK_BYTE_HOPS] * hw[H_LINK_J_BIT]
    out[S_E_STATIC] = big_n * hw[H_STATIC_W] * out[S_STEP]
    out[S_E_TOTAL] = out[S_E_COMPUTE] + out[S_E_DRAM] + out[S_E_LINK] + out[S_E_STATIC]
    return out


@njit(cache=True, parallel=True)
def step_costs_grid(schemes, sides, models, hw):
    """``step_costs`` for every (scheme, mesh side); ``models[j]`` is the model run on ``sides[j]``."""
    out = np.empty((schemes.shape[0], sides.shape[0], S_SIZE))
    for idx in prange(schemes.shape[0] * sides.shape[0]):
        i = idx // sides.shape[0]
        j = idx % sides.shape[0]
        out[i, j, :] = step_costs(schemes[i], sides[j], models[j], hw)
    return out
