"""Heterogeneous clusters and the pipeline planner.

A cluster is a set of device groups (each a catalog system, possibly overridden, and a node
count) and the links between groups. The planner chooses how many data-parallel replicas of the
pipeline to run, how many stages each replica has, which group runs each stage (one node per
stage, tensor parallel inside it), and how many layers each stage gets, minimising the predicted
step time under every stage's memory:

.. math::
    T = (m - 1) \\max_i t_i + \\sum_i t_i + \\max_i r_i

with ``t_i`` the forward+backward time of one micro-batch on stage ``i`` (its layers, the output
layer on the last stage, and receiving its activations and sending back their gradients over the
link from the previous stage), ``m`` the micro-batches per replica, and ``r_i`` the stage's
data-parallel gradient reduction across replicas (a sharded optimizer: reduce-scatter plus
all-gather). The first two terms are the 1F1B pipeline's bottleneck form.

The search is exact. For each replica count, the stage costs are tabulated from
``Problem.stage`` and a dynamic programme (the Numba kernel ``kernels.planner``) places the stages
from the last one backwards, so a stage's micro-batches in flight depend only on its position from
the end and one pass serves every stage count. For every (layers placed, group of the stage before
them, stages per group) state it keeps the Pareto front of (max t, sum t, max r); ``T`` grows
with each, so the optimum is on a front. A partial plan whose lower bound on ``T`` is already above
the best plan found so far is dropped, which cannot lose the optimum; replica counts are tried
from the largest down, whose short pipelines are cheap to plan and give that bound early.
``plan_brute_force`` enumerates the same space plan by plan, for tests.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from . import perfmodel
from ..common.progress import progress
from ..kernels import layout as K
from ..kernels import planner
from ..kernels.collectives import BYTES, allgather_time
from ..kernels.layer import layer_costs, layer_fwd_bwd
from ..kernels.memory import OPTIMIZER_BYTES_PER_PARAM
from .specs import RECOMPUTE_MODES, ModelSpec, SpecError, SystemSpec, resolve_model, resolve_system

GiB = 2.0**30


@dataclass(frozen=True)
class DeviceGroup:
    name: str
    system: SystemSpec
    nodes: int


@dataclass(frozen=True)
class Link:
    a: str
    b: str
    bandwidth_GBps: float  # node to node, one direction
    latency_s: float


@dataclass(frozen=True)
class Cluster:
    groups: tuple[DeviceGroup, ...]
    links: tuple[Link, ...] = ()

    def group(self, name: str) -> DeviceGroup:
        for g in self.groups:
            if g.name == name:
                return g
        raise SpecError("group", name, f"expected one of {', '.join(g.name for g in self.groups)}")

    def link(self, a: int, b: int) -> tuple[float, float]:
        """(bandwidth bytes/s, latency s) between a node of group ``a`` and one of group ``b``."""
        ga, gb = self.groups[a], self.groups[b]
        if a == b:
            s = ga.system
            return s.scale_out_GBps_per_gpu * s.gpus_per_node * 1e9, s.scale_out_latency_s
        for link in self.links:
            if {link.a, link.b} == {ga.name, gb.name}:
                return link.bandwidth_GBps * 1e9, link.latency_s
        raise SpecError("links", f"{ga.name}-{gb.name}", "every pair of groups needs a link")

    @classmethod
    def from_dict(cls, d: Mapping, where: str = "cluster") -> "Cluster":
        if not isinstance(d, Mapping) or "groups" not in d:
            raise SpecError("groups", None, "a cluster needs `groups:` (name, system, nodes) and `links:`", where)
        unknown = set(d) - {"groups", "links"}
        if unknown:
            key = sorted(unknown)[0]
            raise SpecError(key, d[key], "unknown cluster field; valid fields: groups, links", where)
        for key in ("groups", "links"):
            if d.get(key) is not None and not isinstance(d[key], (list, tuple)):
                raise SpecError(key, d[key], f"expected a list of {key[:-1]} mappings", where)
        groups = []
        for i, g in enumerate(d["groups"] or []):
            w = f"{where} group {i}"
            if not isinstance(g, Mapping):
                raise SpecError("groups", g, "each group is a mapping with name, system and nodes", w)
            bad = set(g) - {"name", "system", "nodes"}
            if bad:
                key = sorted(bad)[0]
                raise SpecError(key, g[key], "unknown group field; valid fields: name, system, nodes", w)
            name = g.get("name")
            if not isinstance(name, str) or not name:
                raise SpecError("name", name, "expected a non-empty string", w)
            nodes = g.get("nodes")
            if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
                raise SpecError("nodes", nodes, "expected an integer >= 1", w)
            groups.append(DeviceGroup(name, resolve_system(g.get("system"), w), nodes))
        if not groups:
            raise SpecError("groups", d["groups"], "expected at least one group", where)
        names = [g.name for g in groups]
        if len(set(names)) != len(names):
            raise SpecError("groups", names, "group names must be unique", where)
        links = []
        for i, link in enumerate(d.get("links") or []):
            w = f"{where} link {i}"
            if not isinstance(link, Mapping):
                raise SpecError("links", link, "each link is {between: [a, b], bandwidth_GBps, latency_s}", w)
            bad = set(link) - {"between", "bandwidth_GBps", "latency_s"}
            if bad:
                key = sorted(bad)[0]
                raise SpecError(key, link[key], "unknown link field; valid fields: between, bandwidth_GBps, latency_s", w)
            between = link.get("between")
            if not isinstance(between, (list, tuple)) or len(between) != 2 or any(b not in names for b in between):
                raise SpecError("between", between, f"expected two group names of {', '.join(names)}", w)
            if between[0] == between[1]:
                raise SpecError("between", between, "a link joins two different groups (inside a group the "
                                "system's own network is used)", w)
            pair = frozenset(between)
            if any(frozenset((l.a, l.b)) == pair for l in links):
                raise SpecError("between", between, "this pair is linked twice; give one link per pair", w)
            bw, lat = link.get("bandwidth_GBps"), link.get("latency_s", 0.0)
            if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not math.isfinite(bw) or not 0 < bw <= 1e6:
                raise SpecError("bandwidth_GBps", bw, "expected a finite number in (0, 1e6] (GB/s)", w)
            if isinstance(lat, bool) or not isinstance(lat, (int, float)) or not math.isfinite(lat) or not 0 <= lat <= 10:
                raise SpecError("latency_s", lat, "expected a finite number in [0, 10] (seconds)", w)
            links.append(Link(between[0], between[1], float(bw), float(lat)))
        cluster = cls(tuple(groups), tuple(links))
        for a, b in itertools.combinations(range(len(groups)), 2):
            cluster.link(a, b)  # every pair must be linked
        return cluster

    @classmethod
    def from_yaml(cls, path) -> "Cluster":
        from ..common.inputs import load_yaml  # strict: duplicate keys, deep nesting and alias bombs refused

        return cls.from_dict(load_yaml(path), where=str(path))


# --------------------------------------------------------------------------- stage costs
@dataclass(frozen=True)
class GroupCosts:
    """Per-micro-batch costs of one layer (and the output layer) on a node of a group."""

    tp: int
    layer_fwd_s: float
    layer_bwd_s: float  # with recomputation
    head_fwd_s: float
    head_bwd_s: float
    layer_param_bytes: float  # 16-bit weights of one layer on one GPU
    embed_param_bytes: float
    head_param_bytes: float
    act_bytes: float  # activations one micro-batch keeps per layer
    head_act_bytes: float
    work_bytes: float
    hbm_bytes: float
    reserved_bytes: float
    activation_msg_bytes: float  # one micro-batch's activations crossing a stage boundary
    dp_bw: float
    dp_lat: float
    net_eff: float
    domain: int


def tensor_parallel_degree(model: ModelSpec, system: SystemSpec) -> int:
    """Largest power of two up to the node size dividing both head counts."""
    t = 1
    while t * 2 <= system.gpus_per_node and model.heads % (t * 2) == 0 and model.kv_heads % (t * 2) == 0:
        t *= 2
    return t


def group_costs(model: ModelSpec, system: SystemSpec, micro_batch: int = 1, recompute: str = "full",
                flash_attention: bool = True) -> GroupCosts:
    t = tensor_parallel_degree(model, system)
    mvec, svec = perfmodel.model_vector(model), perfmodel.system_vector(system)
    calib = perfmodel.calibration_vector(system.generation)
    lc = np.empty(K.L_SIZE)
    layer_costs(mvec, svec, calib, t, 1, micro_batch, RECOMPUTE_MODES.index(recompute), True, flash_attention, lc,
                1, False, 0)  # every argument given: the specialization predict compiles
    layer_fwd, layer_bwd = layer_fwd_bwd(lc)
    return GroupCosts(
        tp=t, layer_fwd_s=layer_fwd, layer_bwd_s=layer_bwd, head_fwd_s=lc[K.L_HEAD_FWD],
        head_bwd_s=lc[K.L_HEAD_BWD],
        layer_param_bytes=BYTES * mvec[K.M_PARAMS_LAYER] / t,
        embed_param_bytes=BYTES * mvec[K.M_PARAMS_EMBED] / t,
        head_param_bytes=BYTES * mvec[K.M_PARAMS_HEAD] / t,
        act_bytes=lc[K.L_ACT_BYTES], head_act_bytes=lc[K.L_HEAD_BYTES], work_bytes=lc[K.L_WORK_BYTES],
        hbm_bytes=svec[K.S_HBM_BYTES], reserved_bytes=calib[K.C_RESERVED_BYTES],
        activation_msg_bytes=BYTES * micro_batch * model.seq_len * model.hidden,
        dp_bw=svec[K.S_SCALE_OUT_BW], dp_lat=svec[K.S_SCALE_OUT_LAT], net_eff=calib[K.C_NET_EFF],
        domain=system.scale_up_domain,
    )


@dataclass(frozen=True)
class Problem:
    """Everything the planner needs, precomputed per group."""

    model: ModelSpec
    cluster: Cluster
    global_batch: int
    costs: tuple[GroupCosts, ...]
    link_bw: np.ndarray  # [G, G] bytes/s
    link_lat: np.ndarray
    max_stages: int

    def send(self, a: int, b: int) -> float:
        """One micro-batch's activations from a stage of group ``a`` to one of group ``b``."""
        msg = self.costs[b].activation_msg_bytes
        return self.link_lat[a, b] + msg / (self.costs[b].net_eff * self.link_bw[a, b])

    def transfer(self, a: int, b: int) -> float:
        """Forward activations a -> b plus their gradients back, per micro-batch."""
        return 2.0 * self.send(a, b)

    def stage_fwd_bwd(self, g: int, layers: int, last: bool) -> tuple[float, float]:
        """A stage's forward and backward time per micro-batch, transfers excluded."""
        c = self.costs[g]
        return (layers * c.layer_fwd_s + (c.head_fwd_s if last else 0.0),
                layers * c.layer_bwd_s + (c.head_bwd_s if last else 0.0))

    def stage(self, g: int, layers: int, first: bool, last: bool, prev: int, in_flight: int, dp: int):
        """(time per micro-batch, gradient-sync time, fits) of a stage."""
        c = self.costs[g]
        fwd, bwd = self.stage_fwd_bwd(g, layers, last)
        t = fwd + bwd + (0.0 if first else self.transfer(prev, g))
        params = layers * c.layer_param_bytes + (c.embed_param_bytes if first else 0.0) \
            + (c.head_param_bytes if last else 0.0)
        # weights + gradients (16-bit) + optimizer state sharded over the replicas (ZeRO-1)
        state = params * (2.0 + OPTIMIZER_BYTES_PER_PARAM / BYTES / dp)
        act = c.act_bytes * layers * in_flight + (c.head_act_bytes if last else 0.0) + c.work_bytes
        fits = state + act + c.reserved_bytes <= c.hbm_bytes
        sync = 2.0 * allgather_time(params, dp, c.domain, c.domain, c.dp_bw, c.dp_lat, c.dp_bw, c.dp_lat,
                                    c.net_eff) if dp > 1 else 0.0
        return t, sync, fits


def problem(model, cluster: Cluster, global_batch: int, max_stages: int = 8, micro_batch: int = 1,
            recompute: str = "full") -> Problem:
    model = resolve_model(model)
    if not 1 <= global_batch <= 2**40:
        raise SpecError("global_batch", global_batch, "expected an integer in [1, 2^40]")
    costs = tuple(group_costs(model, g.system, micro_batch, recompute) for g in cluster.groups)
    n = len(cluster.groups)
    bw, lat = np.zeros((n, n)), np.zeros((n, n))
    for a in range(n):
        for b in range(n):
            bw[a, b], lat[a, b] = cluster.link(a, b)
    return Problem(model, cluster, int(global_batch), costs, bw, lat, int(max_stages))


# --------------------------------------------------------------------------- plans
@dataclass(frozen=True)
class PipelinePlan:
    dp: int
    groups: tuple[int, ...]  # group index of each stage
    layers: tuple[int, ...]
    micro_batches: int
    step_time_s: float
    stage_times_s: tuple[float, ...]
    sync_s: float

    def describe(self, cluster: Cluster) -> list[dict]:
        return [{"stage": i, "group": cluster.groups[g].name, "layers": l, "time_per_micro_batch_s": t}
                for i, (g, l, t) in enumerate(zip(self.groups, self.layers, self.stage_times_s))]


def step_time(max_t: float, sum_t: float, max_sync: float, micro_batches: int) -> float:
    return (micro_batches - 1) * max_t + sum_t + max_sync


def _replica_counts(p: Problem) -> list[int]:
    """The divisors of the global batch, found up to its square root (a huge batch stays fast)."""
    n = p.global_batch
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def evaluate(p: Problem, dp: int, groups: Sequence[int], layers: Sequence[int]) -> PipelinePlan | None:
    """Price one plan; None if it breaks node counts, layer counts or memory."""
    S = len(groups)
    if S == 0 or sum(layers) != p.model.layers or min(layers) < 1:
        return None
    for g in set(groups):
        if dp * groups.count(g) > p.cluster.groups[g].nodes:
            return None
    m = p.global_batch // dp
    times, syncs = [], []
    for i, (g, l) in enumerate(zip(groups, layers)):
        t, sync, fits = p.stage(g, l, i == 0, i == S - 1, groups[i - 1] if i else g, min(S - i, m), dp)
        if not fits:
            return None
        times.append(t)
        syncs.append(sync)
    return PipelinePlan(dp, tuple(groups), tuple(layers), m, step_time(max(times), sum(times), max(syncs), m),
                        tuple(times), max(syncs))


def _stage_tables(p: Problem, dp: int, smax: int):
    """``Problem.stage`` for every stage the planner can place with ``dp`` replicas, as arrays
    ``[j, group, layers, k]``: ``j`` the stage's position from the end (1 = last), ``k < G`` the
    previous stage's group, ``k = G`` for the first stage (which has none)."""
    G, L = len(p.cluster.groups), p.model.layers
    m = p.global_batch // dp
    shape = (smax + 1, G, L + 1, G + 1)
    t, sync, fits = np.zeros(shape), np.zeros(shape), np.zeros(shape, dtype=np.bool_)
    for j in range(1, smax + 1):
        for g in range(G):
            for layers in range(1, L - j + 2):  # the j - 1 stages after it need a layer each
                for k in range(G + 1):
                    first = k == G
                    t[j, g, layers, k], sync[j, g, layers, k], fits[j, g, layers, k] = p.stage(
                        g, layers, first, j == 1, g if first else k, min(j, m), dp)
    return t, sync, fits


def _count_vectors(caps: Sequence[int], smax: int):
    """Stages-per-group vectors within the node caps and ``smax`` stages in all, in order of their
    stage count: ``(cnext[c, g], cprev[c, g], cstart[j])``, -1 where adding/removing a stage of
    ``g`` leaves the set, ``cstart[j]`` the first vector with ``j`` stages."""
    vectors: list[tuple[int, ...]] = []

    def walk(prefix: tuple[int, ...], left: int) -> None:
        if len(prefix) == len(caps):
            vectors.append(prefix)
            return
        for c in range(min(caps[len(prefix)], left) + 1):
            walk(prefix + (c,), left - c)

    walk((), smax)
    vectors.sort(key=sum)
    index = {v: i for i, v in enumerate(vectors)}
    G = len(caps)
    cnext = np.full((len(vectors), G), -1, dtype=np.int64)
    cprev = np.full((len(vectors), G), -1, dtype=np.int64)
    for i, v in enumerate(vectors):
        for g in range(G):
            cnext[i, g] = index.get(v[:g] + (v[g] + 1,) + v[g + 1:], -1)
            if v[g] > 0:
                cprev[i, g] = index[v[:g] + (v[g] - 1,) + v[g + 1:]]
    cstart = np.searchsorted([sum(v) for v in vectors], np.arange(smax + 2)).astype(np.int64)
    return cnext, cprev, cstart


def plan(p: Problem) -> PipelinePlan | None:
    """The exact optimum over replica counts, stage counts, stage groups and layer splits."""
    L = p.model.layers
    best = None  # (step time, dp, groups, layers)
    counts = list(reversed(_replica_counts(p)))  # fewest stages first: a cheap, often good bound
    for dp in progress(counts, total=len(counts), desc="plan: replica counts"):
        caps = [g.nodes // dp for g in p.cluster.groups]
        smax = min(p.max_stages, L, sum(caps))
        if smax < 1:  # more replicas than nodes
            continue
        t, sync, fits = _stage_tables(p, dp, smax)
        if not fits.any():  # no stage fits in memory
            continue
        # no stage is faster per layer than this: a lower bound on the time of layers not yet placed
        per_layer = (t[:, :, 1:, :] / np.arange(1, L + 1)[:, None])[fits[:, :, 1:, :]].min()
        cnext, cprev, cstart = _count_vectors(caps, smax)
        found, T, groups, stage_layers = planner.pipeline_dp(
            t, sync, fits, cnext, cprev, cstart, p.global_batch // dp, L, smax,
            np.inf if best is None else best[0], max(float(per_layer), 0.0))
        if found:
            best = (T, dp, groups.tolist(), stage_layers.tolist())
    if best is None:
        return None
    _, dp, groups, layers = best
    return evaluate(p, dp, groups, layers)


#: PipeDream's objective is put to the DAPPLE kernel as ``SCALE * (m max t + max r) + sum t``: the steady state first,
#: the pipeline's fill and drain only as a tie-break (a generous baseline)
_PIPEDREAM_SCALE = 10**6


def pipedream_objective_s(pl: PipelinePlan) -> float:
    """PipeDream's planning objective of a plan, per step: the slowest stage's time for every micro-batch plus the
    gradient synchronisation, i.e. the steady state of an asynchronous pipeline, without the synchronous
    pipeline's fill and drain (``sum t - max t``) that :func:`step_time` charges."""
    return pl.micro_batches * max(pl.stage_times_s) + pl.sync_s


def plan_pipedream(p: Problem) -> PipelinePlan | None:
    """PipeDream's planner (Narayanan et al., SOSP 2019) as DAPPLE (Fan et al. 2021) describes it, over the same
    plans and costs as :func:`plan`: it balances the stages for the steady state of an asynchronous pipeline
    (:func:`pipedream_objective_s`) and ignores the warm-up and ending phases that a synchronous pipeline pays
    once per step. Among plans equal on that objective it takes the one with the shortest fill and drain.
    The returned plan is priced like any other, by the synchronous step time of :func:`evaluate`."""
    L = p.model.layers
    best = None  # (PipeDream objective, step time, plan)
    for dp in _replica_counts(p):
        caps = [g.nodes // dp for g in p.cluster.groups]
        smax = min(p.max_stages, L, sum(caps))
        if smax < 1:
            continue
        t, sync, fits = _stage_tables(p, dp, smax)
        if not fits.any():
            continue
        m = p.global_batch // dp
        cnext, cprev, cstart = _count_vectors(caps, smax)
        found, _, groups, stage_layers = planner.pipeline_dp(
            t, sync * _PIPEDREAM_SCALE, fits, cnext, cprev, cstart, m * _PIPEDREAM_SCALE + 1, L, smax, np.inf, 0.0)
        if not found:
            continue
        pl = evaluate(p, dp, groups.tolist(), stage_layers.tolist())
        key = (pipedream_objective_s(pl), pl.step_time_s)
        if best is None or key[0] < best[0][0] * (1 - 1e-12) or (key[0] <= best[0][0] * (1 + 1e-12)
                                                                  and key[1] < best[0][1]):
            best = (key, pl)
    return None if best is None else best[1]


def plan_brute_force(p: Problem) -> PipelinePlan | None:
    """Every plan of the same space, one by one (small instances only)."""
    G, L = len(p.cluster.groups), p.model.layers
    best = None
    for dp in _replica_counts(p):
        for S in range(1, min(p.max_stages, L) + 1):
            for groups in itertools.product(range(G), repeat=S):
                for cuts in itertools.combinations(range(1, L), S - 1):
                    bounds = (0,) + cuts + (L,)
                    layers = [bounds[i + 1] - bounds[i] for i in range(S)]
                    pl = evaluate(p, dp, list(groups), layers)
                    if pl is not None and (best is None or pl.step_time_s < best.step_time_s - 1e-15):
                        best = pl
    return best


def even_split_plan(p: Problem, dp: int, groups: Sequence[int]) -> PipelinePlan | None:
    """Layers split as evenly as possible over the given stages (the naive baseline)."""
    S, L = len(groups), p.model.layers
    layers = [L // S + (1 if i < L % S else 0) for i in range(S)]
    return evaluate(p, dp, list(groups), layers)


def simulate(p: Problem, pl: PipelinePlan):
    """Run a plan's pipeline (1F1B) through the discrete-event simulator: transfers delay the
    next stage instead of being charged to it. Returns ``(PipelineResult, step time)``, the step
    being the makespan plus the gradient synchronisation."""
    from . import pipeline

    S = len(pl.groups)
    fwd, bwd = np.empty(S), np.empty(S)
    for i, (g, l) in enumerate(zip(pl.groups, pl.layers)):
        fwd[i], bwd[i] = p.stage_fwd_bwd(g, l, i == S - 1)
    send = np.array([p.send(pl.groups[i], pl.groups[i + 1]) for i in range(S - 1)])
    result = pipeline.simulate("1f1b", fwd, bwd, send=send, micro_batches=pl.micro_batches)
    return result, result.makespan_s + pl.sync_s


def throughput_tokens_per_s(p: Problem, pl: PipelinePlan | None) -> float:
    if pl is None:
        return float("nan")
    return p.global_batch * p.model.seq_len / pl.step_time_s


def homogeneous_part(cluster: Cluster, index: int) -> Cluster:
    return Cluster((cluster.groups[index],), ())


__all__ = ["Cluster", "DeviceGroup", "Link", "Problem", "PipelinePlan", "problem", "plan", "plan_brute_force",
           "evaluate", "even_split_plan", "plan_pipedream", "pipedream_objective_s", "throughput_tokens_per_s", "homogeneous_part", "group_costs",
           "tensor_parallel_degree", "GiB"]
