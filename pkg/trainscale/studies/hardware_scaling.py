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
