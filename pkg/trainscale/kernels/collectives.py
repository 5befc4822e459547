r"""Alpha-beta costs of NCCL-style collectives over a two-tier network.

A group of ``n`` GPUs whose consecutive members are ``stride`` ranks apart is laid over
scale-up domains of ``D`` GPUs (NVLink/NVSwitch): ``n_in`` members share a domain and the
group spans ``n_out`` domains (:func:`group_split`).

Ring (NCCL's ring with one channel per NIC): every byte crosses every GPU once, so for an
all-gather or reduce-scatter of a buffer of ``S`` bytes

.. math:: T_\mathrm{ring} = (n - n_\mathrm{out})\,\alpha_\mathrm{up} + (n_\mathrm{out} - 1)\,\alpha_\mathrm{out}
          + \frac{n-1}{n}\,\frac{S}{\eta\,B}

with ``B`` the bus bandwidth of the slowest tier, ``min(B_up, n_in B_out)`` once the ring leaves
the domain (the ``n_in`` GPUs of a domain each drive their own NIC), and the latencies of the
``n - 1`` hops a piece travels: ``n_out - 1`` of them cross the network, the others stay inside a
domain (NCCL's tuning model counts ring steps the same way). An all-reduce
is a reduce-scatter then an all-gather. Because the latency term grows with the step count, the
achieved bus bandwidth ``(n-1)/n * S / T`` rises with message size: that is the size-dependent bus
efficiency.

Tree (NCCL's double binary tree across domains, a chain inside each): latency grows with the
depth, not the size, of the group, and every byte is sent up and down once:

.. math:: T_\mathrm{tree} = 2\left((n_\mathrm{in}-1)\,\alpha_\mathrm{up}
          + \lceil\log_2 n_\mathrm{out}\rceil\,\alpha_\mathrm{out}\right) + \frac{2S}{\eta\,B}

Hierarchical (2D) all-reduce: reduce-scatter inside the domain, all-reduce of ``S / n_in``
across domains (one ring per local rank, each on its own NIC), all-gather inside:

.. math:: T_\mathrm{hier} = 2 T_\mathrm{up}(n_\mathrm{in}, S) + 2 T_\mathrm{out}(n_\mathrm{out}, S/n_\mathrm{in})

The tree moves its bytes at :data:`TREE_BUS_FACTOR` (0.9) of the ring's bus bandwidth: NCCL's
tuning model discounts the tree so (``busBw = std::min(busBw*.9, maxTreeBw)``, NVIDIA/nccl
``src/graph/tuning.cc``, v2.8-2.18), so that at large messages the ring wins, and the tree only
where the ring's ``2(n-1)`` latencies cost more than the tree's extra tenth of bandwidth time,
i.e. at many ranks.
An all-reduce takes the fastest of the three, as NCCL's tuner does.

PAT (NCCL's Parallel Aggregated Trees, default since NCCL 2.23 where every rank of the group is on
its own node: ``ncclPatEnable``, ``comm->nNodes != comm->nRanks`` disables it): an all-gather or
reduce-scatter of a group with one member per node (:func:`node_allgather_time`, which the plans'
data-parallel and ZeRO-3 collectives use) takes the faster of the ring and PAT, whose latency grows
with the logarithm of the group, not its size, and whose bus bandwidth is three quarters of the
ring's (NVIDIA/nccl 5067397 ``src/graph/tuning.cc``:
``busBw *= .75``; latency ``log2i(nNodes) * (interLat / 3.5) + nRanks * 2.8`` us):

.. math:: T_\mathrm{PAT} = \lfloor\log_2 n\rfloor\,\frac{\alpha_\mathrm{out}}{3.5} + 2.8\,\mu\mathrm{s}\cdot n
          + \frac{n-1}{n}\,\frac{S}{0.75\,\eta\,B_\mathrm{out}}

NVLS (NVLink SHARP: the third-generation NVSwitch reduces in the switch, :func:`nvls_allreduce_time`):
in an all-reduce inside one scale-up domain whose switches do it (``S_NVLS_EFF`` > 0 in the system
vector) every GPU sends its buffer to the switches once and receives the sum once, so the time
does not grow with the group; the switches' reduction runs at a share ``e`` of the links' achieved
rate, after a 25 us start (``hwLatencies`` NVLink NVLS Simple in ``tuning.cc``):

.. math:: T_\mathrm{NVLS} = 25\,\mu\mathrm{s} + \frac{S}{e\,\eta\,B_\mathrm{up}}

On 8 H100 the ring's bus bandwidth is ~370 GB/s and NVLS's algorithm bandwidth ~275 GB/s (its
nccl-tests bus bandwidth ~480 GB/s, "a 30% improvement"; NCCL's maintainers in NVIDIA/nccl-tests#212
and NVIDIA/nccl#1442), so ``e`` = 275 / 370 = 0.74 (systems.yaml); with 2-4 GPUs the ring is as fast
or faster (as measured in NVIDIA/nccl#1455), and the faster one is taken.

:func:`domain_allreduce_time` takes the faster of it and :func:`allreduce_time`; the plans' tensor- and
data-parallel all-reduces use it. NVLS across domains (NCCL's NVLS-tree) is not priced.

All-to-all (expert-parallel dispatch and combine; pairwise exchange, as NCCL's grouped
send/receive): every GPU holds ``S`` bytes, ``S/n`` for each member. The ``n_in - 1`` peers in
its domain are reached over the scale-up links, the ``n - n_in`` others through its own NIC, both
at once, one latency per peer:

.. math:: T_\mathrm{a2a} = (n_\mathrm{in}-1)\,\alpha_\mathrm{up} + (n-n_\mathrm{in})\,\alpha_\mathrm{out}
          + \max\left(\frac{n_\mathrm{in}-1}{n}\frac{S}{\eta B_\mathrm{up}},\
          \frac{n-n_\mathrm{in}}{n}\frac{S}{\eta B_\mathrm{out}}\right)

Scale-out topology (:func:`tier_link`): the scale-out network is either one flat tier (every NIC
on one switch layer, e.g. a high-radix optical fabric) or a two-tier fat-tree whose leaf switches
each serve ``L`` GPUs and are ``r : 1`` oversubscribed towards the spine. A group laid
contiguously over ``n * stride`` ranks stays under one leaf when that span is at most ``L``
(2 link hops per message: NIC - leaf - NIC); otherwise its traffic crosses the spine (4 hops)
and gets the spine's share of the NIC bandwidth:

.. math:: B_\mathrm{out}' = B_\mathrm{out} / r,\qquad
          \alpha_\mathrm{out}' = \alpha_\mathrm{out} + h\,\alpha_\mathrm{hop},\quad h \in \{2, 4\}

With the defaults (``L = 0``: one tier, ``r = 1``, ``alpha_hop = 0``) the link is unchanged.
"""

import math

from numba import njit

from .layout import (S_GPUS_PER_NODE, S_HOP_LAT, S_LEAF_GPUS, S_NVLS_EFF, S_OVERSUB, S_SCALE_OUT_BW,
                     S_SCALE_OUT_LAT, S_SCALE_UP_BW, S_SCALE_UP_DOMAIN, S_SCALE_UP_LAT)

TREE_BUS_FACTOR = 0.9  # NCCL tuning.cc: a tree's bus bandwidth is 0.9 of the ring's
# NCCL's PAT and NVLS constants (NVIDIA/nccl 5067397, src/graph/tuning.cc)
PAT_BUS_FACTOR = 0.75  # if (a == NCCL_ALGO_PAT) busBw *= .75
PAT_LOG_LATENCY_DIVISOR = 3.5  # log2i(nNodes) * (interLat / 3.5)
PAT_RANK_LATENCY_S = 2.8e-6  # + nRanks * 2.8 us ("still a linear part")
NVLS_LATENCY_S = 25e-6  # hwLatencies[NVLINK][NVLS][SIMPLE] = 25 us


@njit(cache=True)
def group_split(n, stride, domain):
    """(members per scale-up domain, domains spanned) for a group of ``n`` with ``stride``."""
    if n <= 1:
        return 1, 1
    if stride >= domain:
        return 1, n
    n_in = domain // stride
    if n_in > n:
        n_in = n
    n_out = (n + n_in - 1) // n_in
    return n_in, n_out


@njit(cache=True)
def ring_phase_time(nbytes, n, bandwidth, latency, efficiency):
    """One ring pass (an all-gather or a reduce-scatter) of a buffer of ``nbytes`` over ``n``."""
    if n <= 1 or nbytes <= 0.0:
        return 0.0
    return (n - 1) * latency + (n - 1) / n * nbytes / (efficiency * bandwidth)


@njit(cache=True)
def allgather_time(nbytes, n, stride, domain, bw_up, lat_up, bw_out, lat_out, efficiency):
    """Ring all-gather (equally: reduce-scatter) of a buffer of ``nbytes`` (the gathered size)."""
    if n <= 1 or nbytes <= 0.0:
        return 0.0
    n_in, n_out = group_split(n, stride, domain)
    if n_out == 1:
        return ring_phase_time(nbytes, n, bw_up, lat_up, efficiency)
    bus = n_in * bw_out
    if bw_up < bus:
        bus = bw_up
    latency = (n - n_out) * lat_up + (n_out - 1) * lat_out
    return latency + (n - 1) / n * nbytes / (efficiency * bus)


@njit(cache=True)
def node_allgather_time(system, nbytes, n, stride, bw_out, lat_out, efficiency):
    """All-gather (equally: reduce-scatter) of ``nbytes`` over ``n`` GPUs ``stride`` apart on the system
    vector's links (``bw_out``, ``lat_out``: the group's scale-out link, :func:`out_link`): the ring
    (:func:`allgather_time`), or PAT where it is faster and every member is on its own node
    (``stride`` at least the GPUs of a node, NCCL's ``nNodes == nRanks``)."""
    domain = int(system[S_SCALE_UP_DOMAIN])
    ring = allgather_time(nbytes, n, stride, domain, system[S_SCALE_UP_BW], system[S_SCALE_UP_LAT], bw_out, lat_out,
                          efficiency)
    if n > 1 and nbytes > 0.0 and stride >= system[S_GPUS_PER_NODE] and stride >= domain:
        pat = pat_phase_time(nbytes, n, bw_out, lat_out, efficiency)
        if pat < ring:
            return pat
    return ring


@njit(cache=True)
def pat_phase_time(nbytes, n, bandwidth, latency, efficiency):
    """NCCL's PAT all-gather (or reduce-scatter) of ``nbytes`` over ``n`` ranks, one per node:
    ``floor(log2 n)`` network latencies over 3.5, 2.8 us per rank, and the ring's bytes at 0.75
    of its bus bandwidth."""
    if n <= 1 or nbytes <= 0.0:
        return 0.0
    steps = 0
    m = n
    while m > 1:
        m >>= 1
        steps += 1
    return (steps * latency / PAT_LOG_LATENCY_DIVISOR + n * PAT_RANK_LATENCY_S
            + (n - 1) / n * nbytes / (PAT_BUS_FACTOR * efficiency * bandwidth))


@njit(cache=True)
def nvls_allreduce_time(nbytes, n, bw_up, efficiency, nvls_efficiency):
    """All-reduce of ``nbytes`` over ``n`` GPUs of one NVSwitch domain by NVLink SHARP (the switch
    sums): NCCL's start latency and the buffer once at ``nvls_efficiency`` of the links' achieved
    rate, whatever ``n``; infinite where the switches cannot (``nvls_efficiency`` 0)."""
    if n <= 1 or nbytes <= 0.0:
        return 0.0
    if nvls_efficiency <= 0.0:
        return math.inf
    return NVLS_LATENCY_S + nbytes / (nvls_efficiency * efficiency * bw_up)


@njit(cache=True)
def domain_allreduce_time(system, nbytes, n, stride, bw_out, lat_out, efficiency):
    """All-reduce of ``nbytes`` over ``n`` GPUs ``stride`` apart on the system vector's links
    (``bw_out``, ``lat_out``: the group's scale-out link, :func:`out_link`): the fastest of
    :func:`allreduce_time`'s algorithms and, inside one domain whose switches reduce, NVLS."""
    domain = int(system[S_SCALE_UP_DOMAIN])
    best = allreduce_time(nbytes, n, stride, domain, system[S_SCALE_UP_BW], system[S_SCALE_UP_LAT], bw_out, lat_out,
                          efficiency)
    if system[S_NVLS_EFF] > 0.0 and group_split(n, stride, domain)[1] == 1:
        nvls = nvls_allreduce_time(nbytes, n, system[S_SCALE_UP_BW], efficiency, system[S_NVLS_EFF])
        if nvls < best:
            best = nvls
    return best


@njit(cache=True)
def allreduce_time(nbytes, n, stride, domain, bw_up, lat_up, bw_out, lat_out, efficiency):
    """All-reduce of ``nbytes``: the fastest of ring, tree and hierarchical."""
    if n <= 1 or nbytes <= 0.0:
        return 0.0
    best = 2.0 * allgather_time(nbytes, n, stride, domain, bw_up, lat_up, bw_out, lat_out, efficiency)
    n_in, n_out = group_split(n, stride, domain)
    if n_out == 1:
        tree = 2.0 * ((n - 1) * lat_up + nbytes / (TREE_BUS_FACTOR * efficiency * bw_up))
        return tree if tree < best else best
    bus = n_in * bw_out
    if bw_up < bus:
        bus = bw_up
    depth = math.ceil(math.log2(n_out))
    tree = 2.0 * ((n_in - 1) * lat_up + depth * lat_out) + 2.0 * nbytes / (TREE_BUS_FACTOR * efficiency * bus)
    if tree < best:
        best = tree
    if n_in > 1:
        hier = 2.0 * ring_phase_time(nbytes, n_in, bw_up, lat_up, efficiency) + 2.0 * ring_phase_time(
            nbytes / n_in, n_out, bw_out, lat_out, efficiency)
        if hier < best:
            best = hier
    return best


@njit(cache=True)
def tier_link(n, stride, bw_out, lat_out, leaf_gpus, oversubscription, hop_latency):
    """(bandwidth, per-step latency) of the scale-out network for a group of ``n`` GPUs whose
    members are ``stride`` ranks apart: crossing the spine of a two-tier fat-tree divides the
    bandwidth by the oversubscription and doubles the link hops."""
    crosses = leaf_gpus > 0 and n * stride > leaf_gpus
    if crosses:
        bw = bw_out / oversubscription if oversubscription > 1.0 else bw_out
        return bw, lat_out + 4.0 * hop_latency
    return bw_out, lat_out + 2.0 * hop_latency


@njit(cache=True)
def alltoall_time(nbytes, n, stride, domain, bw_up, lat_up, bw_out, lat_out, efficiency):
    """All-to-all in which every GPU holds ``nbytes`` (``nbytes / n`` for each member)."""
    if n <= 1 or nbytes <= 0.0:
        return 0.0
    n_in, n_out = group_split(n, stride, domain)
    if n_out == 1:
        return (n - 1) * lat_up + (n - 1) / n * nbytes / (efficiency * bw_up)
    inside = (n_in - 1) / n * nbytes / (efficiency * bw_up)
    outside = (n - n_in) / n * nbytes / (efficiency * bw_out)
    latency = (n_in - 1) * lat_up + (n - n_in) * lat_out
    return latency + (inside if inside > outside else outside)


@njit(cache=True)
def deduplicated_alltoall_time(nbytes, n, stride, domain, bw_up, lat_up, bw_out, lat_out, efficiency, top_k):
    r"""All-to-all of routed token copies (``nbytes`` per GPU, ``top_k`` copies per token spread evenly over the
    ``n`` members) by a dispatcher that sends a token once to each remote scale-up domain that holds any of its
    experts and forwards it there over the scale-up links (DeepEP's internode kernels: "removes redundant tokens
    during cross-node communication", NVIDIA/Megatron-LM d98e8a6 ``megatron/core/transformer/moe/README.md``; one
    RDMA copy per node carrying a bitmask of its GPUs, ``SourceMeta.is_token_in_nvl_rank_bits`` in
    deepseek-ai/DeepEP ``csrc/kernels/internode.cu``). With ``D`` domains spanned, a token's ``k (D - 1) / D``
    remote copies become the ``(D - 1)(1 - (1 - 1/D)^k)`` remote domains it reaches (experts uniform, as under the
    tables' forced balancing), so the NIC carries that share ``s = D (1 - (1 - 1/D)^k) / k`` of
    :func:`alltoall_time`'s outside bytes, one message per remote domain; the scale-up links carry every copy
    but the GPU's own (the forwarded ones too):

    .. math:: T = (n_\mathrm{in}-1)\,\alpha_\mathrm{up} + (D-1)\,\alpha_\mathrm{out}
              + \max\left(\frac{n-1}{n}\frac{S}{\eta B_\mathrm{up}},\
              s\,\frac{n-n_\mathrm{in}}{n}\frac{S}{\eta B_\mathrm{out}}\right)

    Inside one domain it is :func:`alltoall_time`."""
    if n <= 1 or nbytes <= 0.0:
        return 0.0
    n_in, n_out = group_split(n, stride, domain)
    if n_out == 1:
        return alltoall_time(nbytes, n, stride, domain, bw_up, lat_up, bw_out, lat_out, efficiency)
    d = float(n_out)
    share = d * (1.0 - (1.0 - 1.0 / d) ** top_k) / top_k if top_k >= 1.0 else 1.0
    inside = (n - 1) / n * nbytes / (efficiency * bw_up)
    outside = share * (n - n_in) / n * nbytes / (efficiency * bw_out)
    latency = (n_in - 1) * lat_up + (n_out - 1) * lat_out
    return latency + (inside if inside > outside else outside)


@njit(cache=True)
def p2p_time(nbytes, crosses_domain, bw_up, lat_up, bw_out, lat_out, efficiency):
    """Point-to-point send of ``nbytes`` inside the scale-up domain or across the scale-out network."""
    if nbytes <= 0.0:
        return 0.0
    if crosses_domain:
        return lat_out + nbytes / (efficiency * bw_out)
    return lat_up + nbytes / (efficiency * bw_up)


def allreduce_busbw_GBps(nbytes, n, stride, domain, bw_up, lat_up, bw_out, lat_out, efficiency):
    """Bus bandwidth that nccl-tests would report, ``2(n-1)/n * S / T``, in GB/s."""
    t = allreduce_time(nbytes, n, stride, domain, bw_up, lat_up, bw_out, lat_out, efficiency)
    return 2.0 * (n - 1) / n * nbytes / t / 1e9 if t > 0 else math.nan


# --------------------------------------------------------------------------- on the system vector
# (what every step kernel shares: the 16-bit values it moves, the scale-out link a group gets from the
# system vector's topology, and the exposed time of a collective run beside computation)
BYTES = 2.0  # 16-bit activations, weights and gradients


@njit(cache=True)
def out_link(system, n, stride):
    """(bandwidth, per-step latency) of the scale-out network for a group of ``n`` GPUs
    ``stride`` ranks apart, from the system vector's topology (:func:`tier_link`)."""
    return tier_link(n, stride, system[S_SCALE_OUT_BW], system[S_SCALE_OUT_LAT], system[S_LEAF_GPUS],
                     system[S_OVERSUB], system[S_HOP_LAT])


@njit(cache=True)
def overlapped_exposed(comm_s, work_s, slowdown):
    """Exposed time of a collective of ``comm_s`` run beside ``work_s`` of computation.

    While the collective runs, the computation beside it is slowed by ``1 + slowdown``: NCCL's
    kernels occupy SMs and HBM bandwidth (Lee et al. 2025, arXiv 2507.03114: 18.9% on average
    on A100, H100 and MI250). Of the computation, ``comm_s / (1 + slowdown)`` gets done while the
    collective runs, so the pair takes ``max(comm_s, work_s + comm_s * slowdown / (1 + slowdown))``
    and the time beyond the computation alone is

    .. math:: \\max\\left(c - w,\\; c\\,\\frac{\\sigma}{1 + \\sigma}\\right).

    With ``slowdown`` 0 this is the ideal overlap, ``max(0, c - w)``."""
    if comm_s <= 0.0:
        return 0.0
    return max(comm_s - work_s, comm_s * slowdown / (1.0 + slowdown))
