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

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import xarray as xr

from .. import comparison, perfmodel
from .. import io as tsio
from ..io import provenance
from ..specs import RECOMPUTE_MODES, STACKS, SpecError, resolve_model, resolve_system

PAPER = ("Fernandez et al., Hardware Scaling Trends and Diminishing Returns in Large-Scale Distributed Training "
         "(arXiv 2411.13055)")
OUTPUTS = ("hardware_scaling.nc", "throughput_per_gpu.png", "mfu.png", "total_throughput.png", "energy_per_token.png",
           "power_per_gpu.png", "allreduce_busbw.nc", "allreduce_busbw.png")
RESOURCES = {"mem_mb": 4000, "runtime_quick_min": 15, "runtime_full_min": 120}
STUDY = "hardware-scaling"
#: STUDIES.md: FSDP's per-GPU throughput from 128 to 2048 GPUs, about -37% (approximate, second-hand)
PAPER_FSDP_CHANGE = -0.37
PAPER_GPUS = (128, 2048)
PAPER_SYSTEM = "dgx-h100"
PAPER_SETTING = "Llama-2 7B-70B on up to 2048 H100 GPUs, FSDP / HSDP / TP-PP at a fixed global batch (Fernandez et al.)"

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
                     strategies: Sequence[str] = STRATEGIES, global_batch_tokens: int = 4 * 2**20,
                     stack: str = "fsdp") -> xr.Dataset:
    """Best plan per (model, system, strategy, GPU count) at a fixed global batch in tokens, every plan run by
    the software ``stack`` (the paper's: PyTorch, ``fsdp``; its fitted efficiency is the performance model's)."""
    if stack not in STACKS:
        raise SpecError("stack", stack, f"expected one of {', '.join(STACKS)}")
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
    ints = {name: np.full(shape, -1, dtype=np.int64) for name in ("tp", "pp", "dp", "cp", "micro_batch")}
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
                    grid = perfmodel.evaluate_grid(model, system, int(n), batch, stack=stack, **space)
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
                    for name in ints:
                        ints[name][idx] = b["plan"].get(name, 1)
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
    ds["model"].attrs.update({"long_name": "model"})
    ds["system"].attrs.update({"long_name": "system (catalog name)"})
    ds["strategy"].attrs.update({"long_name": "parallelisation strategy"})
    ds["peak_flops_per_gpu"] = ("system", [resolve_system(n).peak_flops_bf16 for n in systems],
                                {"units": "FLOP/s", "long_name": "peak dense 16-bit FLOP/s per GPU (catalog)"})
    ds.attrs.update(provenance({"models": list(models), "systems": list(systems), "gpus": [int(g) for g in gpus],
                                "strategies": list(strategies), "global_batch_tokens": int(global_batch_tokens),
                                "stack": stack}))
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
    ds["system"].attrs.update({"long_name": "system (catalog name)"})
    ds.attrs.update(provenance({"systems": list(systems), "nodes": [int(n) for n in nodes],
                                "message_bytes": [int(m) for m in message_bytes]}))
    return ds


def _finite(values) -> np.ndarray:
    values = np.asarray(values, dtype=float).ravel()
    return values[np.isfinite(values)]


def compare(folder) -> list[comparison.Record]:
    """The paper's three findings against the saved grid: FSDP's per-GPU throughput change from 128 to 2048 GPUs
    (on H100, median over the models; range over models and systems), TP/PP ahead of FSDP at 2048 GPUs, and a
    newer GPU's per-GPU gain below its peak-FLOP ratio (H100 over A100)."""
    ds = tsio.read_dataset(Path(folder) / "hardware_scaling.nc")
    setting = json.loads(ds.attrs["parameters"])
    per_gpu = ds["tokens_per_s_per_gpu"]
    g0, g1 = PAPER_GPUS
    ours = (f"{', '.join(setting['models'])} on the {setting['stack']} stack at a fixed "
            f"{setting['global_batch_tokens'] / 2**20:g}M-token batch (the paper's batch is not known here: assumed)")
    grid = ds["gpus"].values.tolist()
    if g0 not in grid or g1 not in grid:
        raise ValueError(f"hardware_scaling.nc: gpus {grid} lacks the paper's {g0} and {g1}: no comparison")
    fsdp = per_gpu.sel(strategy="fsdp")
    change = fsdp.sel(gpus=g1) / fsdp.sel(gpus=g0) - 1
    cp = ds["cp"].sel(strategy="fsdp", gpus=g1, system=PAPER_SYSTEM).values
    cliff = (f"FSDP's best plan at {g1} GPUs splits sequences (context parallelism "
             f"{', '.join(str(int(c)) for c in cp)}: the batch has fewer sequences than GPUs)")
    if g1 // 2 in grid:
        before = float(np.median(_finite((fsdp.sel(gpus=g1 // 2) / fsdp.sel(gpus=g0) - 1).sel(system=PAPER_SYSTEM))))
        cliff = f"at {g1 // 2} GPUs the change is {before:+.0%}; " + cliff
    tp_pp = (per_gpu.sel(strategy="tp-pp", gpus=g1) / fsdp.sel(gpus=g1))
    gain = None
    if {"dgx-h100", "dgx-a100-80gb"} <= set(ds["system"].values.tolist()):
        peak = ds["peak_flops_per_gpu"]
        gain = (per_gpu.sel(system="dgx-h100") / per_gpu.sel(system="dgx-a100-80gb")) / float(
            peak.sel(system="dgx-h100") / peak.sel(system="dgx-a100-80gb"))
    records = [
        comparison.numeric(
            STUDY, f"FSDP per-GPU throughput change, {g0} -> {g1} GPUs", "1", paper_value=PAPER_FSDP_CHANGE,
            paper_setting=PAPER_SETTING + " (about -37%, approximate)",
            our_value=float(np.median(_finite(change.sel(system=PAPER_SYSTEM)))), same_setting=False, neutral=0.0,
            our_setting=ours + f"; {PAPER_SYSTEM}, median over the models",
            free_parameter="model and system", sweep=_finite(change),
            note=cliff),
        comparison.directional(
            STUDY, f"TP/PP over FSDP per-GPU throughput at {g1} GPUs", "1", paper_direction=1,
            paper_setting=PAPER_SETTING + ": model parallelism becomes preferable at scale",
            our_value=float(np.median(_finite(tp_pp.sel(system=PAPER_SYSTEM)))), neutral=1.0,
            our_setting=ours + f"; {PAPER_SYSTEM}, median over the models", free_parameter="model and system",
            sweep=_finite(tp_pp)),
    ]
    if gain is not None:
        records.append(comparison.directional(
            STUDY, "H100 / A100 per-GPU throughput over their peak-FLOP ratio", "1", paper_direction=-1,
            paper_setting=PAPER_SETTING + ": newer GPUs gain less than their FLOP ratio",
            our_value=float(np.median(_finite(gain))), neutral=1.0,
            our_setting=ours + "; median over models, strategies and GPU counts",
            free_parameter="model, strategy and GPU count", sweep=_finite(gain)))
    return records
