"""A PETALS-style swarm of heterogeneous GPUs serving a model block by block (Borzunov et al. 2023).

Servers have a GPU (a catalog system: its memory, memory bandwidth and FLOP/s), a link (bandwidth, round-trip
time to the client) and hold a contiguous span of blocks; clients send a step through a chain of servers. The
formulas and PETALS' own rules (placement, routing) are in :mod:`trainscale.kernels.swarm`; this module prices
the servers and searches placements.

**Per-block cost.** A block's decode step (one token after ``context_tokens``) and forward pass (a batch of
prompts of ``seq_tokens``) on a server's GPU come from the performance model
(:func:`trainscale.model.inference.block_time_s`, 16-bit ``t16``) as ``c + k t16``: PETALS serves 8-bit weights
(LLM.int8 with outlier decomposition), which halves the bytes but adds per-matrix work (quantising the
activations, extracting and multiplying the outlier columns) that 16-bit does not have: a fixed cost ``c``
(``int8_overhead_s``) and a factor ``k`` (``int8_slowdown``). Both are fitted to one of PETALS' settings
(:func:`fit_int8`: three A100s at 1 Gbit/s, its inference step and its batch-64 forward pass); every other
number is a prediction.

**Memory.** A server holds ``n_s = floor((M - R) / (w + c))`` blocks: ``w`` = one byte per block parameter
(8-bit), ``c`` = the attention cache it keeps free per block for ``cache_tokens`` tokens (``2 h`` values of
2 bytes per token), ``R`` the catalog's reserve. A server flagged ``cache_full`` has no room for a new
session: PETALS' router adds ``CACHE_PENALTY_S`` to its hops.

**Search.** :func:`pareto_search` runs NSGA-II (pymoo) over placements (the servers' span starts) and chains
(for each placement, the chain of least step latency, found exactly by the router with the true hop cost), for
two objectives: the client's inference step latency and the swarm's forward throughput (its weakest block's);
:func:`petals_choice` is PETALS' own single point (its placement, its router).

**Chain search** (:func:`chain_search`, Hakim & Hasan's search): the placement fixed (PETALS' own), NSGA-II
over one client's chain (the sequence of servers its request passes through for the blocks; genome: one gene
per block choosing among the servers that hold it), for the step latency and the chain's pipelined forward
throughput (its slowest hop); PETALS' router's chain is one member of the first generation.

**Offloading.** :func:`offload_rates` prices PETALS' baseline, one GPU streaming every block's weights from
host memory for each pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..model import catalog, inference
from ..common.checks import check_float, check_int
from ..common.inputs import load_yaml
from ..kernels import swarm as K
from ..model.specs import SpecError, resolve_model, resolve_system

__all__ = ["Server", "SwarmSpec", "CACHE_PENALTY_S", "server_arrays", "petals_choice", "evaluate_placement",
           "pareto_search", "fit_int8", "load_swarm", "offload_rates", "reference_evaluate", "route_costs",
           "make_swarm", "dominates_or_equals", "CHAINS", "chain_search", "chain_genes", "chain_point",
           "reference_chain_evaluate"]

CACHE_PENALTY_S = 10.0  # PETALS' router effectively avoids a server without cache room: a large constant
BYTES_16 = 2.0
#: bytes per hidden-state value on the wire: PETALS compresses the activations it sends with dynamic blockwise
#: 8-bit quantization (Borzunov et al. 2023, arXiv 2209.01188, Sec. 3.3)
WIRE_BYTES = 1.0


@dataclass(frozen=True)
class Server:
    """One swarm server: a catalog ``gpu`` (system name), its link and whether its cache is full."""

    gpu: str
    bandwidth_Mbps: float
    rtt_ms: float
    cache_full: bool = False

    def check(self, where: str = "server", sep: str = ".") -> "Server":
        try:
            resolve_system(self.gpu)
        except SpecError as err:
            raise SpecError(f"{where}{sep}gpu", self.gpu, "expected a catalog system (trainscale systems)") from err
        check_float(f"{where}{sep}bandwidth_Mbps", self.bandwidth_Mbps, 0.0, 1e6, open_min=True)
        check_float(f"{where}{sep}rtt_ms", self.rtt_ms, 0.0, 1e5)
        return self


@dataclass(frozen=True)
class SwarmSpec:
    """A swarm: the ``model`` served, its ``servers`` (joining in order) and how sessions are priced."""

    servers: tuple
    model: str = "bloom-176b"
    int8_slowdown: float = 1.0
    int8_overhead_s: float = 0.0
    seq_tokens: int = 128
    context_tokens: int = 128
    forward_batch: int = 1
    cache_tokens: int = 4096

    def check(self) -> "SwarmSpec":
        if not self.servers:
            raise SpecError("servers", [], "expected at least one server")
        for i, s in enumerate(self.servers):
            s.check(f"servers[{i}]")
        resolve_model(self.model)
        check_float("int8_slowdown", self.int8_slowdown, 0.0, 100.0, open_min=True)
        check_float("int8_overhead_s", self.int8_overhead_s, 0.0, 10.0)
        for name in ("seq_tokens", "forward_batch", "cache_tokens"):
            check_int(name, getattr(self, name), 1)
        check_int("context_tokens", self.context_tokens, 0)
        return self


def make_swarm(gpus: Sequence[str], bandwidth_Mbps, rtt_ms, **kwargs) -> SwarmSpec:
    """A swarm of servers with the given GPUs; ``bandwidth_Mbps`` and ``rtt_ms`` one value or one per server."""
    n = len(gpus)
    bw = np.broadcast_to(np.asarray(bandwidth_Mbps, dtype=float), (n,))
    rtt = np.broadcast_to(np.asarray(rtt_ms, dtype=float), (n,))
    return SwarmSpec(tuple(Server(g, float(b), float(r)) for g, b, r in zip(gpus, bw, rtt)), **kwargs).check()


SWARM_FIELDS = ("model", "int8_slowdown", "seq_tokens", "context_tokens", "cache_tokens")
SERVER_FIELDS = ("gpu", "bandwidth_Mbps", "rtt_ms", "count", "cache_full")


def load_swarm(path) -> SwarmSpec:
    """A swarm from a file a user writes, YAML or CSV (by suffix). Bad entries get one line naming the field.

    YAML: ``model``, ``int8_slowdown``, ``seq_tokens``, ``context_tokens``, ``cache_tokens`` (all optional) and
    ``servers``, a list of ``{gpu, bandwidth_Mbps, rtt_ms, count (default 1), cache_full (default false)}``;
    errors name e.g. ``servers[2].rtt_ms``. CSV: a header row naming the server columns (``gpu``,
    ``bandwidth_Mbps``, ``rtt_ms`` required; ``count``, ``cache_full`` optional), one server per row; errors
    name the line and column, e.g. ``line 3, rtt_ms``. ``gpu`` is a catalog system (``trainscale systems``)."""
    where = str(path)
    if Path(path).suffix.lower() == ".csv":
        rows, names = _csv_rows(path)
        doc = {"servers": rows}
    else:
        doc = load_yaml(path)
        if not isinstance(doc, dict) or "servers" not in doc:
            raise SpecError("servers", None, "expected a mapping with a list 'servers'", where)
        unknown = sorted(set(doc) - {*SWARM_FIELDS, "servers"})
        if unknown:
            raise SpecError(unknown[0], doc[unknown[0]], f"unknown field; valid: servers, {', '.join(SWARM_FIELDS)}",
                            where)
        if not isinstance(doc["servers"], list) or not doc["servers"]:
            raise SpecError("servers", doc["servers"], "expected a non-empty list", where)
        names = [f"servers[{i}]" for i in range(len(doc["servers"]))]
    servers = []
    for name, row in zip(names, doc["servers"]):
        servers.extend(_server_row(name, row, where))
    kwargs = {k: doc[k] for k in SWARM_FIELDS if k in doc}
    return SwarmSpec(tuple(servers), **kwargs).check()


def _csv_rows(path) -> tuple[list, list]:
    """The rows of a CSV swarm file as YAML-like mappings (numbers parsed) and their names ``line N``."""
    import csv

    p = Path(path)
    if not p.is_file():
        raise SpecError("path", str(path), "no such file")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError("path", str(path), f"cannot read: {type(exc).__name__}") from None
    table = list(csv.reader(lines))
    if not table or not [c for c in table[0] if c.strip()]:
        raise SpecError("header", None, f"expected a header row with columns {', '.join(SERVER_FIELDS)}", str(path))
    header = [c.strip() for c in table[0]]
    for col in header:
        if col not in SERVER_FIELDS:
            raise SpecError("header", col, f"unknown column; valid: {', '.join(SERVER_FIELDS)}", str(path))
    rows, names = [], []
    for n, cells in enumerate(table[1:], start=2):
        if not any(c.strip() for c in cells):
            continue
        name = f"line {n}"
        if len(cells) != len(header):
            raise SpecError(name, ",".join(cells), f"expected {len(header)} cells ({', '.join(header)})", str(path))
        row = {}
        for col, cell in zip(header, (c.strip() for c in cells)):
            row[col] = cell if col == "gpu" else _csv_value(cell, f"{name}, {col}", str(path))
        rows.append(row)
        names.append(name)
    if not rows:
        raise SpecError("servers", [], "expected at least one server row after the header", str(path))
    return rows, names


def _csv_value(cell: str, field_name: str, where: str):
    low = cell.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        value = float(cell)
    except ValueError:
        raise SpecError(field_name, cell, "expected a number (or true/false for cache_full)", where) from None
    return int(value) if value.is_integer() and "count" in field_name else value


def _server_row(name: str, row, where: str) -> list:
    """One server entry checked (``count`` copies of it)."""
    sep = ", " if name.startswith("line") else "."
    if not isinstance(row, dict):
        raise SpecError(name, row, "expected a mapping with gpu, bandwidth_Mbps, rtt_ms", where)
    for key in ("gpu", "bandwidth_Mbps", "rtt_ms"):
        if key not in row:
            raise SpecError(f"{name}{sep}{key}", None, "missing", where)
    extra = sorted(set(row) - set(SERVER_FIELDS))
    if extra:
        raise SpecError(f"{name}{sep}{extra[0]}", row[extra[0]], f"unknown field; valid: {', '.join(SERVER_FIELDS)}",
                        where)
    try:
        count = check_int(f"{name}{sep}count", row.get("count", 1), 1, 10_000)
    except SpecError as err:
        raise SpecError(err.field, err.value, err.valid, where) from None
    if not isinstance(row.get("cache_full", False), bool):
        raise SpecError(f"{name}{sep}cache_full", row["cache_full"], "expected true or false", where)
    for key in ("bandwidth_Mbps", "rtt_ms"):
        if isinstance(row[key], bool) or not isinstance(row[key], (int, float)):
            raise SpecError(f"{name}{sep}{key}", row[key], "expected a number", where)
    try:
        server = Server(str(row["gpu"]), float(row["bandwidth_Mbps"]), float(row["rtt_ms"]),
                        bool(row.get("cache_full", False))).check(name, sep)
    except SpecError as err:
        raise SpecError(err.field, err.value, err.valid, where) from None
    return [server] * count


def _block_costs(gpu: str, spec: SwarmSpec) -> tuple[float, float]:
    dec = inference.block_time_s(spec.model, gpu, 1, spec.context_tokens, 1)
    fwd = inference.block_time_s(spec.model, gpu, spec.seq_tokens, 0, spec.forward_batch)
    k, c = spec.int8_slowdown, spec.int8_overhead_s
    return c + k * dec, c + k * fwd


def server_arrays(spec: SwarmSpec) -> dict:
    """The kernel's inputs: per server ``spans`` (blocks held), ``rtt_s``, ``dec_s`` and ``fwd_s`` (per block),
    ``bw_Bps``, ``penalty_s``, ``tput`` (forward passes per second of one block); and ``L``, ``act_bytes``
    (one token's hidden state), ``fwd_bytes`` (one forward pass's hidden states)."""
    spec = spec.check()
    model = resolve_model(spec.model)
    block_bytes = 1.0 * model.params_per_layer()  # 8-bit weights
    cache_bytes = 2.0 * model.kv_heads * model.head_dim * BYTES_16 * spec.cache_tokens
    reserve = float(catalog.calibration()["common"]["reserved_GiB"]["value"]) * 2**30
    costs = {g: _block_costs(g, spec) for g in {s.gpu for s in spec.servers}}
    S = len(spec.servers)
    out = {"spans": np.empty(S, np.int64), "rtt_s": np.empty(S), "dec_s": np.empty(S), "fwd_s": np.empty(S),
           "bw_Bps": np.empty(S), "penalty_s": np.empty(S), "tput": np.empty(S)}
    act = WIRE_BYTES * model.hidden
    fwd_bytes = act * spec.seq_tokens * spec.forward_batch
    for i, s in enumerate(spec.servers):
        memory = resolve_system(s.gpu).hbm_capacity_GiB * 2**30
        out["spans"][i] = max(0, min(model.layers, int((memory - reserve) // (block_bytes + cache_bytes))))
        out["rtt_s"][i] = s.rtt_ms / 1e3
        out["dec_s"][i], out["fwd_s"][i] = costs[s.gpu]
        out["bw_Bps"][i] = s.bandwidth_Mbps * 1e6 / 8.0
        out["penalty_s"][i] = CACHE_PENALTY_S if s.cache_full else 0.0
        out["tput"][i] = K.server_throughput(out["fwd_s"][i], out["bw_Bps"][i], fwd_bytes)
    out.update({"L": int(model.layers), "act_bytes": act, "fwd_bytes": fwd_bytes})
    return out


CHAINS = ("petals", "optimal")


def route_costs(a: dict, chain: str = "petals") -> tuple[float, np.ndarray]:
    """The router's ``(rtt_weight, hop_s)`` (:func:`trainscale.kernels.swarm.route`): ``"petals"``, PETALS'
    rule (RTT/2 + compute + cache penalty); ``"optimal"``, the chain of least step latency (RTT + compute +
    the hidden states' transfer both ways, + cache penalty)."""
    if chain == "petals":
        return 0.5, a["penalty_s"]
    if chain == "optimal":
        return 1.0, a["penalty_s"] + 2.0 * a["act_bytes"] / a["bw_Bps"]
    raise SpecError("chain", chain, f"expected one of {', '.join(CHAINS)}")


def evaluate_placement(spec: SwarmSpec, starts, arrays: dict | None = None, chain: str = "petals") -> dict:
    """A placement routed by ``chain`` (:func:`route_costs`; PETALS' rule by default): ``latency_s`` (one
    inference step), ``steps_per_s``, the forward
    pass of the routed chain (``forward_s``, ``forward_tokens_per_s`` for ``forward_batch`` prompts of
    ``seq_tokens``), ``swarm_tokens_per_s`` (the weakest block's forward throughput in tokens/s) and the
    ``chain`` as (server, first block, end block) hops."""
    a = arrays or server_arrays(spec)
    starts = np.asarray(starts, dtype=np.int64)
    L = a["L"]
    hs, hf, ht = (np.empty(L, np.int64) for _ in range(3))
    weight, hop_s = route_costs(a, chain)
    n = K.route(starts, a["spans"], a["rtt_s"], a["dec_s"], hop_s, weight, L, hs, hf, ht)
    tokens = spec.seq_tokens * spec.forward_batch
    if n == 0:
        return {"latency_s": math.inf, "steps_per_s": 0.0, "forward_s": math.inf, "forward_tokens_per_s": 0.0,
                "swarm_tokens_per_s": 0.0, "chain": []}
    latency = K.chain_time(hs, hf, ht, n, a["rtt_s"], a["dec_s"], a["bw_Bps"], a["act_bytes"])
    fwd = K.chain_time(hs, hf, ht, n, a["rtt_s"], a["fwd_s"], a["bw_Bps"], a["fwd_bytes"])
    swarm = K.swarm_throughput(starts, a["spans"], a["tput"], L) * tokens
    return {"latency_s": float(latency), "steps_per_s": float(1.0 / latency), "forward_s": float(fwd),
            "forward_tokens_per_s": float(tokens / fwd), "swarm_tokens_per_s": float(swarm),
            "chain": [(int(hs[h]), int(hf[h]), int(ht[h])) for h in range(n)]}


def petals_choice(spec: SwarmSpec, arrays: dict | None = None) -> dict:
    """PETALS' own placement (:func:`trainscale.kernels.swarm.petals_placement`) and route."""
    a = arrays or server_arrays(spec)
    starts = np.empty(len(spec.servers), np.int64)
    K.petals_placement(a["spans"], a["tput"], a["L"], starts)
    return {"starts": starts, **evaluate_placement(spec, starts, a)}


def offload_rates(model: str, gpu: str, host_GBps: float, int8_slowdown: float = 1.0, int8_overhead_s: float = 0.0,
                  seq_tokens: int = 128, context_tokens: int = 128, forward_batch: int = 1) -> dict:
    """One GPU running the whole model by RAM offloading, PETALS' baseline: every pass streams each block's
    8-bit weights from host memory over a ``host_GBps`` link while the previous block computes, so a block
    costs ``max(w / B_host, c + k t16)`` (perfect overlap: the best case) and a pass ``L`` times that.
    Returns ``steps_per_s`` (one token after ``context_tokens``) and ``forward_tokens_per_s`` (a forward pass
    of ``forward_batch`` prompts of ``seq_tokens``)."""
    m = resolve_model(model)
    host = check_float("host_GBps", host_GBps, 0.0, 1e6, open_min=True) * 1e9
    load_s = 1.0 * m.params_per_layer() / host  # 8-bit weights
    spec = SwarmSpec((Server(gpu, 1.0, 0.0),), model, int8_slowdown, int8_overhead_s, seq_tokens, context_tokens,
                     forward_batch).check()
    dec_s, fwd_s = _block_costs(gpu, spec)
    step_s, forward_s = m.layers * max(load_s, dec_s), m.layers * max(load_s, fwd_s)
    return {"steps_per_s": 1.0 / step_s, "forward_tokens_per_s": seq_tokens * forward_batch / forward_s,
            "load_s_per_block": load_s}


def fit_int8(spec: SwarmSpec, steps_per_s: float, forward_tokens_per_s: float, forward_batch: int) -> tuple:
    """``(int8_slowdown, int8_overhead_s)`` at which PETALS' placement of ``spec`` runs ``steps_per_s``
    inference steps and a forward pass of ``forward_batch`` prompts at ``forward_tokens_per_s``. Both times are
    linear in ``(k, c)`` (network terms plus ``sum_hops (j - i)(c + k t16)``): a 2 x 2 solve."""
    rows, rhs = [], []
    for b, target in ((1, 1.0 / check_float("steps_per_s", steps_per_s, 0.0, open_min=True)),
                      (forward_batch, None)):
        base = SwarmSpec(spec.servers, spec.model, 1.0, 0.0, spec.seq_tokens, spec.context_tokens, b, spec.cache_tokens)
        a = server_arrays(base)
        chain = petals_choice(base, a)
        if target is None:
            target = spec.seq_tokens * b / check_float("forward_tokens_per_s", forward_tokens_per_s, 0.0, open_min=True)
            per_block, total = a["fwd_s"], chain["forward_s"]
        else:
            per_block, total = a["dec_s"], chain["latency_s"]
        blocks = sum(j - i for _, i, j in chain["chain"])
        t16 = sum((j - i) * per_block[s] for s, i, j in chain["chain"])
        rows.append([t16, blocks])
        rhs.append(target - (total - t16))
    k, c = np.linalg.solve(np.array(rows), np.array(rhs))
    if k <= 0 or c < 0:
        raise SpecError("int8 fit", (k, c), "expected a positive slowdown and a non-negative overhead")
    return float(k), float(c)


def reference_evaluate(starts, a: dict, chain: str = "petals") -> tuple[float, float]:
    """Plain Python of the same model as :func:`trainscale.kernels.swarm.evaluate`: the route (``chain``, see
    :func:`route_costs`) by a forward sweep over block boundaries, the chain's step latency and the weakest
    block's throughput."""
    weight, hop_s = route_costs(a, chain)
    L, S = a["L"], len(starts)
    dist = [math.inf] * (L + 1)
    prev = [None] * (L + 1)
    dist[0] = 0.0
    for i in range(L):
        if dist[i] == math.inf:
            continue
        for s in range(S):
            lo, n = int(starts[s]), int(a["spans"][s])
            if lo < 0 or not lo <= i < lo + n:
                continue
            for j in range(i + 1, min(L, lo + n) + 1):
                c = dist[i] + weight * a["rtt_s"][s] + (j - i) * a["dec_s"][s] + hop_s[s]
                if c < dist[j] - 1e-15:
                    dist[j], prev[j] = c, (s, i)
    if dist[L] == math.inf:
        return math.inf, 0.0
    latency, j = 0.0, L
    while j > 0:
        s, i = prev[j]
        latency += a["rtt_s"][s] + (j - i) * a["dec_s"][s] + 2.0 * a["act_bytes"] / a["bw_Bps"][s]
        j = i
    blocks = [0.0] * L
    for s in range(S):
        lo = int(starts[s])
        if lo >= 0:
            for k in range(lo, min(L, lo + int(a["spans"][s]))):
                blocks[k] += a["tput"][s]
    return latency, min(blocks)


def pareto_search(spec: SwarmSpec, population: int = 40, generations: int = 30, seed: int = 0,
                  arrays: dict | None = None, chain: str = "optimal") -> dict:
    """NSGA-II (pymoo) over placements and chains: the genome is the servers' span starts, and each placement's
    chain is the one of least step latency (``chain="optimal"``, exact by the same shortest-path sweep; or
    ``"petals"``, PETALS' router). Objectives: the inference step latency (minimised) and the swarm's forward
    throughput (maximised), every block held as a constraint. Seeded (``seed``); the first generation is random
    placements that tile the model in a random server order plus one member, PETALS' own placement, so the
    front is never worse than PETALS' choice. Returns the non-dominated ``latency_s``, ``swarm_tokens_per_s``
    and ``starts`` of the final population (sorted by latency) and ``evaluations``."""
    from pymoo.algorithms.moo.nsga2 import NSGA2
    from pymoo.core.problem import Problem
    from pymoo.operators.crossover.sbx import SBX
    from pymoo.operators.mutation.pm import PM
    from pymoo.operators.repair.rounding import RoundingRepair
    from pymoo.optimize import minimize

    a = arrays or server_arrays(spec)
    weight, hop_s = route_costs(a, chain)
    population = check_int("population", population, 4, 10_000)
    generations = check_int("generations", generations, 1, 10_000)
    seed = check_int("seed", seed, 0)
    L = a["L"]
    upper = np.maximum(0, L - np.minimum(a["spans"], L)).astype(float)
    tokens = spec.seq_tokens * spec.forward_batch
    count = [0]

    class Placement(Problem):
        def __init__(self):
            super().__init__(n_var=len(upper), n_obj=2, n_ieq_constr=1, xl=np.zeros(len(upper)), xu=upper,
                             vtype=int)

        def _evaluate(self, x, out, *args, **kwargs):
            pop = np.ascontiguousarray(np.rint(x).astype(np.int64))
            res = np.empty((pop.shape[0], 3))
            K.evaluate_many(pop, a["spans"], a["rtt_s"], a["dec_s"], a["bw_Bps"], hop_s, weight, a["tput"], L,
                            a["act_bytes"], res)
            count[0] += pop.shape[0]
            latency = np.where(res[:, 0] >= K.INF, 1e9, res[:, 0])
            out["F"] = np.column_stack([latency, -res[:, 1] * tokens])
            out["G"] = res[:, 2:3]  # blocks nobody holds: feasible at 0

    rng = np.random.default_rng(seed)
    start = np.stack([_random_tiling(rng, a["spans"], L) for _ in range(population)])
    start[0] = petals_choice(spec, a)["starts"]  # PETALS' own placement is one of the first generation
    algorithm = NSGA2(pop_size=population, sampling=start.astype(float),
                      crossover=SBX(prob=0.9, eta=15, vtype=float, repair=RoundingRepair()),
                      mutation=PM(eta=20, vtype=float, repair=RoundingRepair()), eliminate_duplicates=True)
    res = minimize(Placement(), algorithm, ("n_gen", generations), seed=seed, verbose=False)
    if res.X is None:  # no placement holds every block: the swarm cannot serve the model
        return {"latency_s": np.empty(0), "swarm_tokens_per_s": np.empty(0),
                "starts": np.empty((0, len(upper)), np.int64), "evaluations": count[0]}
    F = np.atleast_2d(res.F)
    X = np.atleast_2d(res.X).astype(np.int64)
    order = np.lexsort((F[:, 1], F[:, 0]))
    F, X = F[order], X[order]
    keep = F[:, 0] < 1e9
    return {"latency_s": F[keep, 0], "swarm_tokens_per_s": -F[keep, 1], "starts": X[keep], "evaluations": count[0]}


def _random_tiling(rng: np.random.Generator, spans: np.ndarray, L: int) -> np.ndarray:
    """A random placement that holds every block when the spans add up to ``L``: the servers in a random
    order, each starting where the previous ended (wrapping to the start of the model, clipped to fit)."""
    starts = np.empty(spans.size, np.int64)
    pos = int(rng.integers(0, L))
    for s in rng.permutation(spans.size):
        n = min(int(spans[s]), L)
        starts[s] = min(pos, L - n)
        pos = (starts[s] + n) % L
    return starts


def dominates_or_equals(front_latency, front_tput, latency: float, tput: float, rtol: float = 1e-12) -> bool:
    """Whether some point of the front is at least as good as ``(latency, tput)`` in both objectives."""
    lat, thr = np.asarray(front_latency), np.asarray(front_tput)
    return bool(np.any((lat <= latency * (1 + rtol)) & (thr >= tput * (1 - rtol))))



# --------------------------------------------------------------------------- the GA over client chains
def _holders(a: dict, starts) -> tuple[np.ndarray, np.ndarray]:
    starts = np.asarray(starts, dtype=np.int64)
    holders = np.full((a["L"], max(1, starts.size)), -1, np.int64)
    n_holders = np.zeros(a["L"], np.int64)
    K.block_holders(starts, a["spans"], a["L"], holders, n_holders)
    return holders, n_holders


def chain_genes(chain, holders: np.ndarray, L: int) -> np.ndarray:
    """The genome of a chain given as (server, first block, end block) hops: per block, the server's index
    among the block's holders."""
    genes = np.zeros(L, np.int64)
    for s, i, j in chain:
        for k in range(i, j):
            genes[k] = int(np.flatnonzero(holders[k] == s)[0])
    return genes


def chain_point(spec: SwarmSpec, chain, a: dict) -> dict:
    """A chain's ``latency_s`` (one inference step) and ``chain_tokens_per_s`` (its pipelined forward
    throughput: ``seq_tokens * forward_batch`` over its slowest hop, :func:`trainscale.kernels.swarm.chain_stage_s`)."""
    if not chain:
        return {"latency_s": math.inf, "chain_tokens_per_s": 0.0}
    hs, hf, ht = (np.array([h[k] for h in chain], np.int64) for k in range(3))
    lat = K.chain_time(hs, hf, ht, len(chain), a["rtt_s"], a["dec_s"], a["bw_Bps"], a["act_bytes"])
    stage = K.chain_stage_s(hs, hf, ht, len(chain), a["fwd_s"], a["bw_Bps"], a["fwd_bytes"])
    return {"latency_s": float(lat), "chain_tokens_per_s": float(spec.seq_tokens * spec.forward_batch / stage)}


def reference_chain_evaluate(genes, starts, a: dict) -> tuple[float, float, int]:
    """Plain Python of :func:`trainscale.kernels.swarm.evaluate_chains` for one genome: (step latency, slowest
    forward stage in s, hops)."""
    L = a["L"]
    hops = []
    for k in range(L):
        held = [s for s in range(len(starts)) if starts[s] >= 0 and starts[s] <= k < starts[s] + a["spans"][s]]
        if not held:
            return math.inf, math.inf, 0
        s = held[int(genes[k]) % len(held)]
        if hops and hops[-1][0] == s and hops[-1][2] == k:
            hops[-1][2] = k + 1
        else:
            hops.append([s, k, k + 1])
    latency = sum(a["rtt_s"][s] + (j - i) * a["dec_s"][s] + 2.0 * a["act_bytes"] / a["bw_Bps"][s] for s, i, j in hops)
    stage = max((j - i) * a["fwd_s"][s] + 2.0 * a["fwd_bytes"] / a["bw_Bps"][s] for s, i, j in hops)
    return latency, stage, len(hops)


def chain_search(spec: SwarmSpec, population: int = 40, generations: int = 30, seed: int = 0,
                 arrays: dict | None = None, starts=None) -> dict:
    """NSGA-II (pymoo) over one client's chain on a fixed placement (``starts``; PETALS' own by default), as
    Hakim & Hasan search it: the genome is one gene per block, choosing among the servers that hold it
    (:func:`trainscale.kernels.swarm.decode_chain`); objectives the inference step latency (minimised) and the
    chain's pipelined forward throughput (maximised). Seeded (``seed``); the first generation is random chains
    plus PETALS' router's chain, so the front is never worse than PETALS' route. Returns the non-dominated
    ``latency_s``, ``chain_tokens_per_s``, ``genes`` (sorted by latency), ``evaluations`` and PETALS' own point
    (``petals``: its ``latency_s``, ``chain_tokens_per_s``, ``chain``)."""
    from pymoo.algorithms.moo.nsga2 import NSGA2
    from pymoo.core.problem import Problem
    from pymoo.operators.crossover.sbx import SBX
    from pymoo.operators.mutation.pm import PM
    from pymoo.operators.repair.rounding import RoundingRepair
    from pymoo.optimize import minimize

    a = arrays or server_arrays(spec)
    population = check_int("population", population, 4, 10_000)
    generations = check_int("generations", generations, 1, 10_000)
    seed = check_int("seed", seed, 0)
    L = a["L"]
    if starts is None:
        starts = np.empty(len(spec.servers), np.int64)
        K.petals_placement(a["spans"], a["tput"], L, starts)
    starts = np.asarray(starts, dtype=np.int64)
    petals = evaluate_placement(spec, starts, a)
    petals_pt = {**chain_point(spec, petals["chain"], a), "chain": petals["chain"]}
    empty = {"latency_s": np.empty(0), "chain_tokens_per_s": np.empty(0), "genes": np.empty((0, L), np.int64),
             "evaluations": 0, "petals": petals_pt}
    if not petals["chain"]:  # a block nobody holds: no chain exists
        return empty
    holders, n_holders = _holders(a, starts)
    tokens = spec.seq_tokens * spec.forward_batch
    count = [0]
    upper = float(n_holders.max() - 1)

    class Chains(Problem):
        def __init__(self):
            super().__init__(n_var=L, n_obj=2, xl=np.zeros(L), xu=np.full(L, max(upper, 1.0)), vtype=int)

        def _evaluate(self, x, out, *args, **kwargs):
            pop = np.ascontiguousarray(np.rint(x).astype(np.int64))
            res = np.empty((pop.shape[0], 3))
            K.evaluate_chains(pop, holders, n_holders, a["rtt_s"], a["dec_s"], a["fwd_s"], a["bw_Bps"],
                              a["act_bytes"], a["fwd_bytes"], L, res)
            count[0] += pop.shape[0]
            out["F"] = np.column_stack([res[:, 0], -tokens / res[:, 1]])

    rng = np.random.default_rng(seed)
    start = np.stack([_random_chain(rng, holders, n_holders) for _ in range(population)])
    start[0] = chain_genes(petals["chain"], holders, L)  # PETALS' router's chain is one of the first generation
    algorithm = NSGA2(pop_size=population, sampling=start.astype(float),
                      crossover=SBX(prob=0.9, eta=15, vtype=float, repair=RoundingRepair()),
                      mutation=PM(eta=20, vtype=float, repair=RoundingRepair()), eliminate_duplicates=True)
    res = minimize(Chains(), algorithm, ("n_gen", generations), seed=seed, verbose=False)
    F = np.atleast_2d(res.F)
    X = np.atleast_2d(res.X).astype(np.int64) % np.maximum(n_holders, 1)  # the gene as decoded
    _, first = np.unique(F, axis=0, return_index=True)  # genomes decoding to the same point: one of them
    F, X = F[first], X[first]
    order = np.lexsort((F[:, 1], F[:, 0]))
    return {"latency_s": F[order, 0], "chain_tokens_per_s": -F[order, 1], "genes": X[order],
            "evaluations": count[0], "petals": petals_pt}


def _random_chain(rng: np.random.Generator, holders: np.ndarray, n_holders: np.ndarray) -> np.ndarray:
    """A random chain with few hops: stay on the current server while it holds the next block, else move to a
    random holder of it."""
    L = n_holders.size
    genes = np.zeros(L, np.int64)
    current = -1
    for k in range(L):
        held = holders[k, :n_holders[k]]
        if current not in held:
            current = int(held[rng.integers(0, held.size)])
        genes[k] = int(np.flatnonzero(held == current)[0])
    return genes
