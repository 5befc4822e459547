"""Study-level sweeps: each returns the xarray Dataset that one study's figures are drawn from.

``hardware_scaling`` follows Fernandez et al. 2024 (arXiv 2411.13055): Llama-2-style models on
growing GPU counts at a fixed global batch (in tokens), comparing parallelisation strategies,
each at its best plan found by the performance model's grid search:

- ``fsdp``: fully sharded data parallelism (ZeRO-3 over all GPUs), PyTorch-FSDP flat layer
  gathers with prefetch overlap;
- ``hsdp``: hybrid sharding, ZeRO-3 inside each node and data-parallel replicas across nodes;
- ``tp-pp``: tensor parallelism inside the node, pipeline parallelism across nodes, data
  parallelism with a sharded optimizer (Megatron-style 3D parallelism).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import xarray as xr

from .. import perfmodel
from ..io import provenance
from ..specs import RECOMPUTE_MODES, SpecError, resolve_model, resolve_system

STRATEGIES = ("fsdp", "hsdp", "tp-pp")


def _pow2_upto(n: int) -> list[int]:
    return [2**i for i in range(0, 20) if 2**i <= n]


def strategy_space(strategy: str, model, system, gpus: int, global_batch: int) -> dict:
    """The plan axes a strategy may choose from (its best plan is searched within them)."""
    micro = [b for b in (1, 2, 4, 8, 16) if b <= global_batch]
    common = {"micro_batch": micro, "recompute": list(RECOMPUTE_MODES), "flash_attention": [1],
              "overlap_grad_reduce": [1]}
    # sharded data parallelism may split sequences over a node's GPUs (context parallelism)
    # once the fixed global batch has fewer sequences than there are GPUs
    cp = [c for c in _pow2_upto(system.gpus_per_node) if model.seq_len % c == 0]
    if strategy == "fsdp":
        return {**common, "cp": cp, "zero": [3], "shard_group": [0]}
    if strategy == "hsdp":  # shard over one node, or a few when a node cannot hold the states
        node = system.gpus_per_node
        shard = [node * k for k in (1, 2, 4, 8) if gpus > node * k]
        return {**common, "cp": cp, "zero": [3], "shard_group": shard or [0]}
    if strategy == "tp-pp":
        tp = [t for t in _pow2_upto(system.gpus_per_node) if model.heads % t == 0 and model.kv_heads % t == 0]
        pp = [p for p in _pow2_upto(min(gpus, model.layers)) if gpus % p == 0]
        return {**common, "tp": tp, "pp": pp, "interleave": [1, 2], "sequence_parallel": [1], "zero": [1]}
    raise SpecError("strategy", strategy, f"expected one of {', '.join(STRATEGIES)}")


def hardware_scaling(models: Sequence[str], systems: Sequence[str], gpus: Sequence[int],
                     strategies: Sequence[str] = STRATEGIES, global_batch_tokens: int = 4 * 2**20) -> xr.Dataset:
    """Best plan per (model, system, strategy, GPU count) at a fixed global batch in tokens."""
    if int(global_batch_tokens) <= 0:
        raise SpecError("global_batch_tokens", global_batch_tokens, "expected a positive integer")
    for s in strategies:
        if s not in STRATEGIES:
            raise SpecError("strategies", s, f"expected a subset of {', '.join(STRATEGIES)}")
    for g in gpus:
        if int(g) < 1:
            raise SpecError("gpus", g, "expected positive integers")
    shape = (len(models), len(systems), len(strategies), len(gpus))
    floats = {name: np.full(shape, np.nan) for name in (
        "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "power_W_per_gpu",
        "energy_J_per_token", "memory_gib_per_gpu")}
    ints = {name: np.full(shape, -1, dtype=np.int64) for name in ("tp", "pp", "dp", "micro_batch")}
    fits = np.zeros(shape, dtype=bool)
    for i, model_name in enumerate(models):
        model = resolve_model(model_name)
        if global_batch_tokens % model.seq_len:
            raise SpecError("global_batch_tokens", global_batch_tokens,
                            f"must be a multiple of {model.name}'s seq_len = {model.seq_len}")
        batch = global_batch_tokens // model.seq_len
        for j, system_name in enumerate(systems):
            system = resolve_system(system_name)
            for k, strategy in enumerate(strategies):
                for g, n in enumerate(gpus):
                    space = strategy_space(strategy, model, system, int(n), batch)
                    grid = perfmodel.evaluate_grid(model, system, int(n), batch, **space)
                    best = perfmodel.rank(grid, 1)
                    if not best:
                        continue
                    b = best[0]
                    idx = (i, j, k, g)
                    fits[idx] = True
                    floats["step_time_s"][idx] = b["step_time_s"]
                    floats["tokens_per_s"][idx] = b["tokens_per_s"]
                    floats["tokens_per_s_per_gpu"][idx] = b["tokens_per_s"] / n
                    floats["mfu"][idx] = b["mfu"]
                    floats["memory_gib_per_gpu"][idx] = b["memory_gib_per_gpu"]
                    floats["power_W_per_gpu"][idx] = b["power_W_per_gpu"]
                    floats["energy_J_per_token"][idx] = b["energy_J_per_token"]
                    for name in ("tp", "pp", "dp", "micro_batch"):
                        ints[name][idx] = b["plan"][name]
    dims = ("model", "system", "strategy", "gpus")
    meta = {
        "step_time_s": ("s", "step time"),
        "tokens_per_s": ("tokens/s", "cluster throughput"),
        "tokens_per_s_per_gpu": ("tokens/s", "throughput per GPU"),
        "mfu": ("1", "model FLOPs utilisation"),
        "power_W_per_gpu": ("W", "accelerator power per GPU"),
        "energy_J_per_token": ("J/token", "accelerator energy per token"),
        "memory_gib_per_gpu": ("GiB", "memory of the most loaded GPU"),
    }
    data = {name: (dims, arr, {"units": meta[name][0], "long_name": meta[name][1]}) for name, arr in floats.items()}
    for name, arr in ints.items():
        data[name] = (dims, arr, {"units": "1", "long_name": f"best plan: {name.replace('_', ' ')} (-1: none fits)"})
    data["fits"] = (dims, fits, {"units": "1", "long_name": "a plan of this strategy fits in memory"})
    ds = xr.Dataset(data, coords={"model": list(models), "system": list(systems), "strategy": list(strategies),
                                  "gpus": np.asarray(gpus, dtype=np.int64)})
    ds["gpus"].attrs.update({"units": "1", "long_name": "GPUs"})
    ds.attrs.update(provenance({"models": list(models), "systems": list(systems), "gpus": [int(g) for g in gpus],
                                "strategies": list(strategies), "global_batch_tokens": int(global_batch_tokens)}))
    return ds


def allreduce_busbw(systems: Sequence[str], nodes: Sequence[int], message_bytes: Sequence[int]) -> xr.Dataset:
    """nccl-tests-style all-reduce bus bandwidth ``2(n-1)/n * S / T`` over whole nodes."""
    busbw = np.full((len(systems), len(nodes), len(message_bytes)), np.nan)
    for i, name in enumerate(systems):
        system = resolve_system(name)
        for j, n_nodes in enumerate(nodes):
            n = int(n_nodes) * system.gpus_per_node
            for k, size in enumerate(message_bytes):
                t = perfmodel.collective_time_s(system, "allreduce", float(size), n)
                busbw[i, j, k] = 2.0 * (n - 1) / n * size / t / 1e9
    ds = xr.Dataset(
        {"busbw_GBps": (("system", "nodes", "message_bytes"), busbw,
                        {"units": "GB/s", "long_name": "all-reduce bus bandwidth"})},
        coords={"system": list(systems), "nodes": np.asarray(nodes, dtype=np.int64),
                "message_bytes": np.asarray(message_bytes, dtype=np.int64)})
    ds["message_bytes"].attrs.update({"units": "B", "long_name": "message size"})
    ds["nodes"].attrs.update({"units": "1", "long_name": "nodes"})
    ds.attrs.update(provenance({"systems": list(systems), "nodes": [int(n) for n in nodes],
                                "message_bytes": [int(m) for m in message_bytes]}))
    return ds


# --------------------------------------------------------------------------- pipeline-planning
SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved", "zb-h1")


def pipeline_stage_times(model, system, pp: int, tp: int = 8, interleave: int = 1, micro_batch: int = 1,
                         recompute: str = "full", flash_attention: bool = False) -> dict:
    """Per-virtual-stage times of the pipeline alone (dp = 1) for the schedules study, from
    :func:`trainscale.perfmodel.pipeline_stage_times`."""
    from ..specs import PlanSpec

    plan = PlanSpec(tp=tp, pp=pp, dp=1, interleave=interleave, micro_batch=micro_batch, global_batch=micro_batch * pp,
                    recompute=recompute, sequence_parallel=tp > 1, flash_attention=flash_attention)
    return perfmodel.pipeline_stage_times(model, system, plan)


def pipeline_schedules(model, system, pp: int, micro_batches: Sequence[int], tp: int = 8, interleave: int = 2,
                       gantt_micro_batches: int = 8) -> tuple[xr.Dataset, xr.Dataset]:
    """Throughput and peak activation memory of GPipe, 1F1B, interleaved 1F1B and ZB-H1 for one
    model on a ``pp``-stage pipeline of ``tp``-way tensor-parallel nodes, by micro-batch count;
    and the timeline of each schedule at ``gantt_micro_batches`` (for Gantt charts)."""
    from .. import pipeline

    model, system = resolve_model(model), resolve_system(system)
    for m in micro_batches:
        if int(m) < 1 or int(m) % pp:
            raise SpecError("micro_batches", m, f"expected positive multiples of pp = {pp} (interleaving needs them)")
    shape = (len(SCHEDULE_NAMES), len(micro_batches))
    makespan, bubble, peak = np.full(shape, np.nan), np.full(shape, np.nan), np.full(shape, np.nan)
    timelines = {}
    for i, name in enumerate(SCHEDULE_NAMES):
        v = interleave if name == "interleaved" else 1
        st = pipeline_stage_times(model, system, pp, tp=tp, interleave=v)
        fused = name != "zb-h1"
        bwd = st["bwd"] + st["wgrad"] if fused else st["bwd"]
        wgrad = np.zeros_like(bwd) if fused else st["wgrad"]
        for j, m in enumerate(micro_batches):
            r = pipeline.simulate(name, st["fwd"], bwd, wgrad, st["send"], st["act_bytes"], micro_batches=int(m),
                                  interleave=v)
            makespan[i, j], bubble[i, j], peak[i, j] = r.makespan_s, r.bubble_fraction, r.peak_activation_bytes.max()
        r = pipeline.simulate(name, st["fwd"], bwd, wgrad, st["send"], st["act_bytes"],
                              micro_batches=int(gantt_micro_batches), interleave=v)
        timelines[name] = r.timeline
    tokens = np.asarray(micro_batches, dtype=float)[None, :] * model.seq_len
    coords = {"schedule": list(SCHEDULE_NAMES), "micro_batches": np.asarray(micro_batches, dtype=np.int64)}
    dims = ("schedule", "micro_batches")
    ds = xr.Dataset({
        "makespan_s": (dims, makespan, {"units": "s", "long_name": "pipeline makespan of one step"}),
        "tokens_per_s": (dims, tokens / makespan, {"units": "tokens/s", "long_name": "pipeline throughput"}),
        "bubble_fraction": (dims, bubble, {"units": "1", "long_name": "idle fraction of the devices"}),
        "peak_activation_gib": (dims, peak / 2**30, {"units": "GiB",
                                                     "long_name": "peak activation memory of the most loaded GPU"}),
    }, coords=coords)
    ds["micro_batches"].attrs.update({"units": "1", "long_name": "micro-batches per step"})
    ds.attrs.update(provenance({"model": model.name, "system": system.name, "pp": pp, "tp": tp,
                                "interleave": interleave, "micro_batches": [int(m) for m in micro_batches],
                                "gantt_micro_batches": int(gantt_micro_batches)}))
    n_ops = max(len(t) for t in timelines.values())
    arrays = {k: np.full((len(SCHEDULE_NAMES), n_ops), np.nan) for k in ("device", "stage", "micro_batch", "op",
                                                                          "start_s", "end_s")}
    for i, name in enumerate(SCHEDULE_NAMES):
        t = timelines[name].sort_values(["device", "start_s"], kind="stable")
        n = len(t)
        arrays["device"][i, :n] = t["device"].to_numpy()
        arrays["stage"][i, :n] = t["stage"].to_numpy()
        arrays["micro_batch"][i, :n] = t["micro_batch"].to_numpy()
        arrays["op"][i, :n] = t["op"].cat.codes.to_numpy()
        arrays["start_s"][i, :n] = t["start_s"].to_numpy()
        arrays["end_s"][i, :n] = t["end_s"].to_numpy()
    meta = {"device": ("1", "device (pipeline rank)"), "stage": ("1", "virtual stage"),
            "micro_batch": ("1", "micro-batch"), "op": ("1", "operation: 0 forward, 1 backward, 2 weight gradient"),
            "start_s": ("s", "start"), "end_s": ("s", "end")}
    tl = xr.Dataset({k: (("schedule", "op_index"), v, {"units": meta[k][0], "long_name": meta[k][1]})
                     for k, v in arrays.items()},
                    coords={"schedule": list(SCHEDULE_NAMES), "op_index": np.arange(n_ops)})
    tl.attrs.update(ds.attrs)
    return ds, tl


def _single_group(system, nodes: int, scale_out_GBps_per_node: float):
    from .. import hetero

    base = resolve_system(system)
    sys_over = {"name": base.name, "scale_out_GBps_per_gpu": scale_out_GBps_per_node / base.gpus_per_node}
    return hetero.Cluster.from_dict({"groups": [{"name": base.name, "system": sys_over, "nodes": int(nodes)}]})


def pipeline_planner(model, system, nodes: int, global_batch: int, network_GBps_per_node: Sequence[float],
                     max_stages: int = 8) -> xr.Dataset:
    """DAPPLE's question on servers with fast links inside and a slow network between: the
    planner's best replicas x stages x layer split vs data parallelism alone (one node per replica,
    if the model fits) and vs one pipeline over all nodes with layers split evenly."""
    from .. import hetero

    model = resolve_model(model)
    names = ("planner", "data-parallel", "even-pipeline")
    tput = np.full((len(network_GBps_per_node), len(names)), np.nan)
    dp_best, pp_best = np.full(len(network_GBps_per_node), -1), np.full(len(network_GBps_per_node), -1)
    for i, bw in enumerate(network_GBps_per_node):
        p = hetero.problem(model, _single_group(system, nodes, float(bw)), global_batch, max_stages=max_stages)
        best = hetero.plan(p)
        if best is not None:
            tput[i, 0] = hetero.throughput_tokens_per_s(p, best)
            dp_best[i], pp_best[i] = best.dp, len(best.groups)
        if global_batch % nodes == 0:
            tput[i, 1] = hetero.throughput_tokens_per_s(p, hetero.evaluate(p, nodes, [0], [model.layers]))
        stages = min(nodes, max_stages, model.layers)
        tput[i, 2] = hetero.throughput_tokens_per_s(p, hetero.even_split_plan(p, 1, [0] * stages))
    ds = xr.Dataset({
        "tokens_per_s": (("network_GBps", "approach"), tput, {"units": "tokens/s", "long_name": "cluster throughput"}),
        "dp": ("network_GBps", dp_best, {"units": "1", "long_name": "planner: pipeline replicas (-1: none fits)"}),
        "pp": ("network_GBps", pp_best, {"units": "1", "long_name": "planner: pipeline stages"}),
    }, coords={"network_GBps": np.asarray(network_GBps_per_node, dtype=float), "approach": list(names)})
    ds["network_GBps"].attrs.update({"units": "GB/s", "long_name": "network bandwidth per node"})
    ds.attrs.update(provenance({"model": model.name, "system": str(system), "nodes": int(nodes),
                                "global_batch": int(global_batch), "max_stages": int(max_stages),
                                "network_GBps_per_node": [float(b) for b in network_GBps_per_node]}))
    return ds


# --------------------------------------------------------------------------- heterogeneous-cluster
def heterogeneous_mix(model, systems: Sequence[str], total_nodes: int, fractions: Sequence[float],
                      link_GBps: float, global_batch: int, max_stages: int = 8,
                      link_latency_s: float = 1e-5) -> xr.Dataset:
    """HETHUB's question: a cluster of two accelerator types in a ratio; the planner's mixed-cluster
    throughput as a fraction of the sum of what each part achieves alone, by the share of nodes
    of the first type; with an even layer split over the same stages as the naive baseline.

    A part that cannot hold the model on its own trains nothing alone: it adds 0 to the sum (and
    ``alone_fits`` says so), so the mixed cluster can then exceed the sum of its parts."""
    from .. import hetero

    if len(systems) != 2:
        raise SpecError("systems", list(systems), "expected exactly two systems")
    model = resolve_model(model)
    names = ("mixed", "even-split", "first-alone", "second-alone")
    tput = np.full((len(fractions), len(names)), np.nan)
    layers_first = np.full(len(fractions), np.nan)
    alone_fits = np.zeros((len(fractions), 2), dtype=bool)
    for i, f in enumerate(fractions):
        if not 0.0 <= float(f) <= 1.0:
            raise SpecError("fractions", f, "expected shares between 0 and 1")
        n0 = int(round(float(f) * total_nodes))
        counts = (n0, total_nodes - n0)
        groups = [{"name": f"g{k}", "system": s, "nodes": n} for k, (s, n) in enumerate(zip(systems, counts)) if n > 0]
        links = [{"between": ["g0", "g1"], "bandwidth_GBps": float(link_GBps), "latency_s": float(link_latency_s)}] \
            if len(groups) == 2 else []
        cluster = hetero.Cluster.from_dict({"groups": groups, "links": links})
        p = hetero.problem(model, cluster, global_batch, max_stages=max_stages)
        best = hetero.plan(p)
        if best is not None:
            tput[i, 0] = hetero.throughput_tokens_per_s(p, best)
            tput[i, 1] = hetero.throughput_tokens_per_s(p, hetero.even_split_plan(p, best.dp, list(best.groups)))
            first = [g for g in cluster.groups if g.name == "g0"]
            if first:
                layers_first[i] = sum(l for g, l in zip(best.groups, best.layers) if g == 0) / model.layers
            else:
                layers_first[i] = 0.0
        for k in range(2):
            if counts[k] == 0:
                tput[i, 2 + k] = 0.0
                continue
            part = hetero.Cluster.from_dict({"groups": [{"name": "g", "system": systems[k], "nodes": counts[k]}]})
            q = hetero.problem(model, part, global_batch, max_stages=max_stages)
            alone = hetero.plan(q)
            alone_fits[i, k] = alone is not None
            tput[i, 2 + k] = hetero.throughput_tokens_per_s(q, alone) if alone is not None else 0.0
    upper = tput[:, 2] + tput[:, 3]
    ds = xr.Dataset({
        "tokens_per_s": (("fraction", "approach"), tput, {"units": "tokens/s", "long_name": "throughput"}),
        "fraction_of_sum": ("fraction", tput[:, 0] / upper,
                            {"units": "1", "long_name": "mixed throughput / sum of the parts alone"}),
        "even_fraction_of_sum": ("fraction", tput[:, 1] / upper,
                                 {"units": "1", "long_name": "even split / sum of the parts alone"}),
        "layers_on_first": ("fraction", layers_first,
                            {"units": "1", "long_name": "share of layers on the first accelerator type"}),
        "alone_fits": (("fraction", "part"), alone_fits,
                       {"units": "1", "long_name": "the part holds the model on its own (else it adds 0 to the sum)"}),
    }, coords={"fraction": np.asarray(fractions, dtype=float), "approach": list(names), "part": list(systems)})
    ds["fraction"].attrs.update({"units": "1", "long_name": f"share of nodes that are {systems[0]}"})
    ds.attrs.update(provenance({"model": model.name, "systems": list(systems), "total_nodes": int(total_nodes),
                                "fractions": [float(f) for f in fractions], "link_GBps": float(link_GBps),
                                "global_batch": int(global_batch), "max_stages": int(max_stages)}))
    return ds
