"""hardware-scaling: Fernandez et al. 2024 (arXiv 2411.13055), Llama-2 models on growing GPU counts at a fixed
global batch, comparing the paper's parallelisation strategies, each at its best plan found by the performance
model's search (:func:`trainscale.model.planner.search` over the strategy's plan space):

- ``fsdp``: fully sharded data parallelism (ZeRO-3 over all GPUs), PyTorch-FSDP flat layer gathers with
  prefetch overlap;
- ``hsdp``: hybrid sharding, ZeRO-3 inside a group of nodes and data-parallel replicas across groups;
- ``tp-pp``: tensor parallelism inside the node, pipeline parallelism across nodes, data parallelism with a
  sharded optimizer (3D parallelism): ZeRO-1 where the stack has an optimizer-only sharding (Megatron's
  distributed optimizer), ZeRO-2 where it shards gradients with the states (FSDP beside pipelines), as the
  stack's rules (``data/stack_rules.yaml``) say it runs.

None of them splits a sequence (no context parallelism: the paper's strategies do not), so a fixed batch with
fewer sequences than data-parallel ranks has no plan. FlashAttention is offered only where it runs (Ampere and
newer); a V100 runs plain attention.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import xarray as xr

from ..common import comparison
from ..model import perfmodel, validation
from ..model import planner
from ..common import io as tsio
from ..common.io import provenance
from ..model.specs import RECOMPUTE_MODES, STACKS, RunSpec, SpecError, resolve_model, resolve_system
from ._hardware_scaling_figures import (draw_allreduce_busbw, draw_energy_per_token, draw_mfu,
                                        draw_power_per_gpu, draw_published_scaling, draw_throughput_per_gpu,
                                        draw_total_throughput)
from ._hardware_scaling_paper import (PAPER_FSDP_CHANGE, PAPER_GPUS, PAPER_MFU, PAPER_POWER_CHANGE,
                                      PAPER_SETTING, PAPER_SYSTEM, SECOND_HAND)

PAPER = ("Fernandez et al., Hardware Scaling Trends and Diminishing Returns in Large-Scale Distributed Training "
         "(arXiv 2411.13055)")
OUTPUTS = ("hardware_scaling.nc", "batch_sweep.nc", "throughput_per_gpu.png", "mfu.png", "total_throughput.png",
           "energy_per_token.png", "power_per_gpu.png", "allreduce_busbw.nc", "allreduce_busbw.png",
           "published_scaling.nc", "published_scaling.png")
RESOURCES = {"mem_mb": 4000, "runtime_quick_min": 10, "runtime_full_min": 30}
STUDY = "hardware-scaling"

STRATEGIES = ("fsdp", "hsdp", "tp-pp")
#: accelerator generations without FlashAttention (its kernels need Ampere or newer)
NO_FLASH_GENERATIONS = ("volta",)
FLOATS = {
    "step_time_s": ("s", "step time"),
    "tokens_per_s": ("tokens/s", "cluster throughput"),
    "tokens_per_s_per_gpu": ("tokens/s", "throughput per GPU"),
    "mfu": ("1", "model FLOPs utilisation"),
    "power_W_per_gpu": ("W", "accelerator power per GPU"),
    "energy_J_per_token": ("J/token", "accelerator energy per token"),
    "memory_gib_per_gpu": ("GiB", "memory of the most loaded GPU"),
    "compute_s": ("s", "step time: compute and recomputation on the critical stage"),
    "exposed_comm_s": ("s", "step time: communication not hidden behind compute"),
}
PLAN_INTS = ("tp", "pp", "dp", "micro_batch", "flash_attention", "recompute")
SWEPT = ("tokens_per_s_per_gpu", "mfu", "power_W_per_gpu", "energy_J_per_token", "exposed_comm_s", "fits")


def _pow2_upto(n: int) -> list[int]:
    return [2**i for i in range(0, 20) if 2**i <= n]


def strategy_space(strategy: str, model, system, gpus: int, global_batch: int) -> dict:
    """The plan axes a strategy may choose from (its best plan is searched within them): whole sequences only
    (``cp`` 1), FlashAttention where the GPU runs it."""
    micro = [b for b in (1, 2, 4, 8, 16) if b <= global_batch]
    flash = [0] if system.generation in NO_FLASH_GENERATIONS else [1]
    common = {"micro_batch": micro, "recompute": list(RECOMPUTE_MODES), "flash_attention": flash,
              "overlap_grad_reduce": [1], "cp": [1]}
    if strategy == "fsdp":
        return {**common, "zero": [3], "shard_group": [0]}
    if strategy == "hsdp":  # shard over one node, or a few when a node cannot hold the states
        node = system.gpus_per_node
        shard = [node * k for k in (1, 2, 4, 8) if gpus > node * k]
        return {**common, "zero": [3], "shard_group": shard or [0]}
    if strategy == "tp-pp":
        tp = [t for t in _pow2_upto(system.gpus_per_node) if model.heads % t == 0 and model.kv_heads % t == 0]
        pp = [p for p in _pow2_upto(min(gpus, model.layers)) if gpus % p == 0]
        # a sharded optimizer: ZeRO-1 where the stack has one (Megatron's distributed optimizer), ZeRO-2 where it
        # shards gradients with the states (FSDP beside pipelines); the search keeps what the stack's rules run
        return {**common, "tp": tp, "pp": pp, "interleave": [1, 2], "sequence_parallel": [1], "zero": [1, 2]}
    raise SpecError("strategy", strategy, f"expected one of {', '.join(STRATEGIES)}")


def _check(models, systems, gpus, strategies, global_batch_tokens, stack) -> None:
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
    for name in models:
        seq = resolve_model(name).seq_len
        if int(global_batch_tokens) % seq:
            raise SpecError("global_batch_tokens", global_batch_tokens, f"must be a multiple of {name}'s seq_len = {seq}")


def best_plan(model, system, gpus: int, global_batch: int, strategy: str, stack: str) -> dict | None:
    """The strategy's fastest plan that fits (``planner.search``, pipelines simulated), with its step
    breakdown (compute vs exposed communication) from ``perfmodel.predict``; None if no plan fits."""
    space = strategy_space(strategy, model, system, gpus, global_batch)
    _, ranked = planner.search(model, system, gpus, global_batch, top=1, space=space, stack=stack)
    if not ranked:
        return None
    best = ranked[0]
    run = RunSpec(id="best", model=model, system=system,
                            plan=perfmodel.plan_from_grid_entry(best["plan"], global_batch))
    parts = perfmodel.predict(run).breakdown
    best["compute_s"] = parts["compute"] + parts["recompute"]
    best["exposed_comm_s"] = sum(parts[k] for k in ("tp_comm", "cp_comm", "pp_comm", "dp_comm"))
    return best


def _plan_value(plan: dict, name: str) -> int:
    if name == "recompute":
        return RECOMPUTE_MODES.index(plan["recompute"])
    return int(plan.get(name, 1))


def hardware_scaling(models: Sequence[str], systems: Sequence[str], gpus: Sequence[int],
                     strategies: Sequence[str] = STRATEGIES, global_batch_tokens: int = 8 * 2**20,
                     stack: str = "fsdp") -> xr.Dataset:
    """Best plan per (model, system, strategy, GPU count) at a fixed global batch in tokens, every plan run by
    the software ``stack`` (the paper's: PyTorch, ``fsdp``; its fitted efficiency is the performance model's)."""
    _check(models, systems, gpus, strategies, global_batch_tokens, stack)
    shape = (len(models), len(systems), len(strategies), len(gpus))
    floats = {name: np.full(shape, np.nan) for name in FLOATS}
    ints = {name: np.full(shape, -1, dtype=np.int64) for name in PLAN_INTS}
    fits = np.zeros(shape, dtype=bool)
    for i, model_name in enumerate(models):
        model = resolve_model(model_name)
        batch = int(global_batch_tokens) // model.seq_len
        for j, system_name in enumerate(systems):
            system = resolve_system(system_name)
            for k, strategy in enumerate(strategies):
                for g, n in enumerate(gpus):
                    best = best_plan(model, system, int(n), batch, strategy, stack)
                    if best is None:
                        continue
                    idx = (i, j, k, g)
                    fits[idx] = True
                    for name in FLOATS:
                        floats[name][idx] = best["tokens_per_s"] / int(n) if name == "tokens_per_s_per_gpu" \
                            else best[name]
                    for name in PLAN_INTS:
                        ints[name][idx] = _plan_value(best["plan"], name)
    return _grid_dataset(models, systems, strategies, gpus, floats, ints, fits, global_batch_tokens, stack)


def _grid_dataset(models, systems, strategies, gpus, floats, ints, fits, global_batch_tokens, stack) -> xr.Dataset:
    dims = ("model", "system", "strategy", "gpus")
    data = {name: (dims, arr, {"units": FLOATS[name][0], "long_name": FLOATS[name][1]}) for name, arr in floats.items()}
    for name, arr in ints.items():
        what = f"0-2: {', '.join(RECOMPUTE_MODES)}" if name == "recompute" else name.replace("_", " ")
        data[name] = (dims, arr, {"units": "1", "long_name": f"best plan: {what} (-1: none fits)"})
    data["fits"] = (dims, fits, {"units": "1", "long_name": "a plan of this strategy fits in memory"})
    ds = xr.Dataset(data, coords={"model": list(models), "system": list(systems), "strategy": list(strategies),
                                  "gpus": np.asarray(gpus, dtype=np.int64)})
    ds["gpus"].attrs.update({"units": "1", "long_name": "GPUs"})
    ds["model"].attrs.update({"long_name": "model"})
    ds["system"].attrs.update({"long_name": "system (catalog name)"})
    ds["strategy"].attrs.update({"long_name": "parallelisation strategy"})
    ds["peak_flops_per_gpu"] = ("system", [resolve_system(n).peak_flops_bf16 for n in systems],
                                {"units": "FLOP/s", "long_name": "peak dense 16-bit FLOP/s per GPU (catalog)"})
    ds["global_batch_sequences"] = ("model", [int(global_batch_tokens) // resolve_model(m).seq_len for m in models],
                                    {"units": "1", "long_name": "global batch in sequences"})
    ds.attrs.update(provenance({"models": list(models), "systems": list(systems), "gpus": [int(g) for g in gpus],
                                "strategies": list(strategies), "global_batch_tokens": int(global_batch_tokens),
                                "stack": stack}))
    return ds


def batch_sweep(models: Sequence[str], systems: Sequence[str], gpus: Sequence[int], strategies: Sequence[str],
                batches_tokens: Sequence[int], stack: str = "fsdp") -> xr.Dataset:
    """:func:`hardware_scaling` at each fixed global batch (the paper's size is a free choice here), the
    variables the comparison reads, along ``global_batch_tokens``."""
    if not len(batches_tokens):
        raise SpecError("batch_sweep_tokens", list(batches_tokens), "expected at least one batch")
    parts = [hardware_scaling(models, systems, gpus, strategies, int(b), stack)[list(SWEPT)]
             for b in batches_tokens]
    ds = xr.concat(parts, dim="global_batch_tokens", combine_attrs="drop")
    for name in ds.variables:
        if name in parts[0].variables:
            ds[name].attrs = dict(parts[0][name].attrs)
    ds = ds.assign_coords(global_batch_tokens=np.asarray(batches_tokens, dtype=np.int64))
    ds["global_batch_tokens"].attrs.update({"units": "tokens", "long_name": "fixed global batch"})
    ds.attrs.update(provenance({"models": list(models), "systems": list(systems), "gpus": [int(g) for g in gpus],
                                "strategies": list(strategies),
                                "batch_sweep_tokens": [int(b) for b in batches_tokens], "stack": stack}))
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


# --------------------------------------------------------------------------- published scaling curves
#: a published scaling series: the runs of one dataset, model, system, stack and metric at this many GPU counts
MIN_SERIES_POINTS = 3


def _per_gpu_rate(value: float, metric: str, run: RunSpec) -> float:
    """A run's throughput per GPU in its metric's terms: the metric itself where it is per GPU, else the tokens
    per second per GPU of a step time."""
    if metric == "step_time_s":
        return run.plan.global_batch * run.model.seq_len / (value * run.gpus)
    return float(value)


def _split(runs: list) -> list[tuple[str, list]]:
    """A group's runs as scaling series: those at one global batch (strong scaling) or one batch per GPU (weak),
    each over ``MIN_SERIES_POINTS`` or more GPU counts. Runs whose batch varies otherwise are no curve."""
    out, used = [], set()
    for kind, key in (("strong", lambda m: m.run.plan.global_batch),
                      ("weak", lambda m: m.run.plan.global_batch / m.run.gpus)):
        for value in dict.fromkeys(key(m) for m in runs):
            part = [m for m in runs if key(m) == value and m.run.id not in used]
            if len({m.run.gpus for m in part}) >= MIN_SERIES_POINTS:
                out.append((kind, part))
                used.update(m.run.id for m in part)
    return out


def _series(runs) -> dict[tuple, list]:
    """Published scaling series: ``{(dataset, model, system, kind): runs by GPU count}``."""
    groups: dict[tuple, list] = {}
    for m in runs:
        key = (m.dataset, m.run.model.name, m.run.system.name, m.run.plan.stack, m.metric)
        groups.setdefault(key, []).append(m)
    return {(*key[:3], kind): sorted(part, key=lambda m: m.run.gpus)
            for key, group in groups.items() for kind, part in _split(group)}


def published_scaling() -> xr.Dataset:
    """The published scaling curves the project carries (:func:`trainscale.model.validation.measured_runs`: every
    series of one dataset, model, system and stack at one global batch (strong) or one batch per GPU (weak),
    measured at ``MIN_SERIES_POINTS`` or more GPU counts (:func:`_split`), each
    run with its published plan) against the performance model's prediction of the same runs: throughput per
    GPU relative to the series' smallest GPU count, measured and predicted (dim ``run``; ``series`` names the
    curve). Where the runs were fitted (:data:`trainscale.model.validation.NOT_FITTED` says which were not), the
    comparison is in-sample: it shows the shape of the curve, not a held-out test."""
    rows = []
    for key, runs in sorted(_series(validation.measured_runs(None)).items()):
        measured = [_per_gpu_rate(m.measured, m.metric, m.run) for m in runs]
        predicted = [_per_gpu_rate(validation.metric_value(perfmodel.predict(m.run), m.metric, m.run.gpus),
                                   m.metric, m.run) for m in runs]
        for m, meas, pred in zip(runs, measured, predicted):
            rows.append((m, f"{' '.join(key[:3])} ({key[3]})", meas / measured[0], pred / predicted[0],
                         pred / meas - 1.0))
    runs = [r[0] for r in rows]
    ds = xr.Dataset(
        {"measured_relative": ("run", [r[2] for r in rows], {"units": "1", "long_name": "measured throughput per "
                               "GPU over the series' first (smallest GPU count) point"}),
         "predicted_relative": ("run", [r[3] for r in rows], {"units": "1", "long_name": "predicted throughput per "
                                "GPU over the series' first point (the published plans priced by the model)"}),
         "rel_error": ("run", [r[4] for r in rows], {"units": "1", "long_name": "relative error of the run's "
                       "prediction, (predicted - measured) / measured"})},
        coords={"run": [m.run.id for m in runs],
                "series": ("run", [r[1] for r in rows]),
                "gpus": ("run", np.array([m.run.gpus for m in runs], dtype=np.int64)),
                "global_batch": ("run", np.array([m.run.plan.global_batch for m in runs], dtype=np.int64)),
                "fitted": ("run", np.array([m.dataset not in validation.NOT_FITTED for m in runs]))})
    for name, long_name, units in (("run", "measured run (id)", None), ("series", "dataset, model and system "
                                   "of the scaling series (strong: one global batch; weak: one batch per GPU)", None), ("gpus", "GPUs", "1"),
                                   ("global_batch", "global batch (sequences per step)", "1"),
                                   ("fitted", "the run's dataset is used to fit the calibration", "1")):
        ds[name].attrs.update({"long_name": long_name, **({"units": units} if units else {})})
    ds.attrs.update(provenance({"min_series_points": MIN_SERIES_POINTS}))
    return ds


#: the figures drawn from the saved datasets alone (file name -> function of the output folder; the functions are
#: in _hardware_scaling_figures)
FIGURES = {"throughput_per_gpu.png": draw_throughput_per_gpu, "mfu.png": draw_mfu,
           "total_throughput.png": draw_total_throughput, "energy_per_token.png": draw_energy_per_token,
           "power_per_gpu.png": draw_power_per_gpu, "allreduce_busbw.png": draw_allreduce_busbw,
           "published_scaling.png": draw_published_scaling}


# --------------------------------------------------------------------------- paper vs ours
def _finite(values) -> np.ndarray:
    values = np.asarray(values, dtype=float).ravel()
    return values[np.isfinite(values)]


def _median(values) -> float:
    values = _finite(values)
    return float(np.median(values)) if values.size else float("nan")


def _change(var: xr.DataArray, g0: int, g1: int) -> xr.DataArray:
    """Relative change of ``var`` from ``g0`` to ``g1`` GPUs."""
    return var.sel(gpus=g1) / var.sel(gpus=g0) - 1


def _load(folder) -> tuple[xr.Dataset, xr.Dataset, xr.Dataset, dict]:
    folder = Path(folder)
    ds = tsio.read_dataset(folder / "hardware_scaling.nc")
    sweep = tsio.read_dataset(folder / "batch_sweep.nc")
    bw = tsio.read_dataset(folder / "allreduce_busbw.nc")
    grid = ds["gpus"].values.tolist()
    if not set(PAPER_GPUS) <= set(grid) or not set(PAPER_GPUS) <= set(sweep["gpus"].values.tolist()):
        raise ValueError(f"hardware_scaling.nc: gpus {grid} lacks the paper's {PAPER_GPUS[0]} and {PAPER_GPUS[1]}: "
                         f"no comparison")
    if PAPER_SYSTEM not in ds["system"].values.tolist():
        raise ValueError(f"hardware_scaling.nc: systems lack the paper's {PAPER_SYSTEM}: no comparison")
    return ds, sweep, bw, json.loads(ds.attrs["parameters"])


def _unsplittable(sweep: xr.Dataset, strategy: str) -> str:
    """The swept batches at which the strategy has no plan on the paper's largest GPU count."""
    fits = sweep["fits"].sel(strategy=strategy, gpus=PAPER_GPUS[1], system=PAPER_SYSTEM).any("model")
    missing = [f"{b / 2**20:g}M" for b, ok in zip(sweep["global_batch_tokens"].values, fits.values) if not ok]
    if not missing:
        return ""
    return (f"at {', '.join(missing)} tokens {strategy} has no plan on {PAPER_GPUS[1]} GPUs: fewer sequences than "
            f"data-parallel ranks, and the paper's strategies do not split sequences (context parallelism)")


def _hinge(ds: xr.Dataset) -> str:
    """Where FSDP's fall happens on the paper's system: per model, the change to g1 and the share of it left at
    g1 / 2, with the exposed communication at g1."""
    g0, g1 = PAPER_GPUS
    fsdp = ds.sel(strategy="fsdp", system=PAPER_SYSTEM)
    change = _change(fsdp["tokens_per_s_per_gpu"], g0, g1)
    exposed = (fsdp["exposed_comm_s"] / fsdp["step_time_s"]).sel(gpus=g1)
    half = g1 // 2 if g1 // 2 in ds["gpus"].values.tolist() else None
    parts = []
    for model in ds["model"].values.tolist():
        text = f"{model} {float(change.sel(model=model)):+.0%}"
        if half is not None:
            text += f" ({float(_change(fsdp['tokens_per_s_per_gpu'], g0, half).sel(model=model)):+.0%} at {half})"
        parts.append(text + f", exposed communication {float(exposed.sel(model=model)):.0%} of the step at {g1}")
    return ("per model: " + "; ".join(parts) + ". The model's FSDP decline is a hinge, not the paper's gradual "
            "fall: gathers stay hidden until a GPU's share of the batch computes faster than FSDP's per-step "
            "communication")


def _scaling_records(ds, sweep, ours) -> list[comparison.Record]:
    g0, g1 = PAPER_GPUS
    per_gpu, swept = ds["tokens_per_s_per_gpu"], sweep["tokens_per_s_per_gpu"]
    fsdp = _change(per_gpu.sel(strategy="fsdp", system=PAPER_SYSTEM), g0, g1)
    best = _change(per_gpu.sel(system=PAPER_SYSTEM).max("strategy"), g0, g1)
    note = "; ".join(filter(None, [_hinge(ds), _unsplittable(sweep, "fsdp")]))
    return [
        comparison.numeric(
            STUDY, f"FSDP per-GPU throughput change, {g0} -> {g1} GPUs", "1", paper_value=PAPER_FSDP_CHANGE,
            paper_setting=PAPER_SETTING + ", FSDP (about -37%, approximate)", our_value=_median(fsdp),
            same_setting=False, neutral=0.0, our_setting=ours + f"; {PAPER_SYSTEM}, FSDP, median over the models",
            free_parameter="model, system and global batch",
            sweep=_finite(_change(swept.sel(strategy="fsdp"), g0, g1)), note=note),
        comparison.directional(
            STUDY, f"best strategy's per-GPU throughput change, {g0} -> {g1} GPUs", "1", paper_direction=-1,
            paper_setting=PAPER_SETTING + ": returns diminish even with the best strategy",
            our_value=_median(best), neutral=0.0,
            our_setting=ours + f"; {PAPER_SYSTEM}, the fastest of {', '.join(ds['strategy'].values)}, median over "
            "the models", free_parameter="model, system and global batch",
            sweep=_finite(_change(swept.max("strategy"), g0, g1))),
        comparison.directional(
            STUDY, f"TP/PP over FSDP per-GPU throughput at {g1} GPUs", "1", paper_direction=1,
            paper_setting=PAPER_SETTING + ": model parallelism becomes preferable at scale",
            our_value=_median(per_gpu.sel(strategy="tp-pp", gpus=g1, system=PAPER_SYSTEM)
                              / per_gpu.sel(strategy="fsdp", gpus=g1, system=PAPER_SYSTEM)), neutral=1.0,
            our_setting=ours + f"; {PAPER_SYSTEM}, median over the models (where FSDP has a plan)",
            free_parameter="model, system and global batch",
            sweep=_finite(swept.sel(strategy="tp-pp", gpus=g1) / swept.sel(strategy="fsdp", gpus=g1)), note=note),
    ]


def _hardware_records(ds, sweep, ours) -> list[comparison.Record]:
    records = []
    systems = ds["system"].values.tolist()
    if "dgx-a100-80gb" in systems:
        peak = ds["peak_flops_per_gpu"]
        flops = float(peak.sel(system=PAPER_SYSTEM) / peak.sel(system="dgx-a100-80gb"))
        gain = lambda d: d["tokens_per_s_per_gpu"].sel(system=PAPER_SYSTEM) / d["tokens_per_s_per_gpu"].sel(  # noqa: E731
            system="dgx-a100-80gb") / flops
        records.append(comparison.directional(
            STUDY, "H100 / A100 per-GPU throughput over their peak-FLOP ratio", "1", paper_direction=-1,
            paper_setting=PAPER_SETTING + ": newer GPUs gain less than their FLOP ratio",
            our_value=_median(gain(ds)), neutral=1.0,
            our_setting=ours + "; median over models, strategies and GPU counts",
            free_parameter="model, strategy, GPU count and global batch", sweep=_finite(gain(sweep))))
    for system, paper_mfu in PAPER_MFU.items():
        if system not in systems:
            continue
        records.append(comparison.numeric(
            STUDY, f"MFU on {system}", "1", paper_value=paper_mfu,
            paper_setting=f"Fernandez et al.'s measured MFU on {system.removeprefix('dgx-')} ({SECOND_HAND}; "
            "model and GPU count of that number not known here)",
            our_value=_median(ds["mfu"].sel(system=system, strategy="fsdp")), same_setting=False,
            our_setting=ours + f"; {system}, FSDP, median over models and GPU counts",
            free_parameter="model, strategy, GPU count and global batch",
            sweep=_finite(sweep["mfu"].sel(system=system)),
            note="MFU is the performance model's level (its fitted GEMM efficiency; issue 10's calibration), "
                 "not set by this study"))
    return records


def _power_records(ds, sweep, bw, ours) -> list[comparison.Record]:
    g0, g1 = PAPER_GPUS
    fsdp = ds.sel(strategy="fsdp", system=PAPER_SYSTEM)
    energy = fsdp["energy_J_per_token"].sel(gpus=g1) / fsdp["energy_J_per_token"].sel(gpus=g0)
    swept_energy = sweep["energy_J_per_token"].sel(gpus=g1) / sweep["energy_J_per_token"].sel(gpus=g0)
    multi = [int(n) for n in bw["nodes"].values if n > 1]  # across the network, as the paper's 4-512-node scan
    if len(multi) < 2:
        raise ValueError(f"allreduce_busbw.nc: nodes {bw['nodes'].values.tolist()} has fewer than two multi-node "
                         "counts: no comparison")
    n0, n1 = min(multi), max(multi)
    busbw = bw["busbw_GBps"].sel(nodes=n1) / bw["busbw_GBps"].sel(nodes=n0)
    return [
        comparison.numeric(
            STUDY, f"FSDP power per GPU change, {g0} -> {g1} GPUs", "1", paper_value=PAPER_POWER_CHANGE,
            paper_setting=PAPER_SETTING + f", FSDP ({SECOND_HAND})",
            our_value=_median(_change(fsdp["power_W_per_gpu"], g0, g1)), same_setting=False, neutral=0.0,
            our_setting=ours + f"; {PAPER_SYSTEM}, FSDP, median over the models",
            free_parameter="model, system, strategy and global batch",
            sweep=_finite(_change(sweep["power_W_per_gpu"], g0, g1))),
        comparison.directional(
            STUDY, f"FSDP energy per token, {g1} over {g0} GPUs", "1", paper_direction=1,
            paper_setting=PAPER_SETTING + ": poorer marginal performance per unit of power at scale",
            our_value=_median(energy), neutral=1.0,
            our_setting=ours + f"; {PAPER_SYSTEM}, FSDP, median over the models",
            free_parameter="model, system, strategy and global batch", sweep=_finite(swept_energy)),
        comparison.directional(
            STUDY, f"all-reduce bus bandwidth, {n1} over {n0} nodes", "1", paper_direction=-1,
            paper_setting="Fernandez et al.'s NCCL all-reduce scan: bus bandwidth falls as nodes are added",
            our_value=_median(busbw.sel(system=PAPER_SYSTEM)), neutral=1.0,
            our_setting=f"ring all-reduce priced by the performance model; {PAPER_SYSTEM}, median over message sizes",
            free_parameter="system and message size", sweep=_finite(busbw)),
    ]


def compare(folder) -> list[comparison.Record]:
    """The paper's findings against the saved grids: per-GPU throughput from 128 to 2048 GPUs (FSDP's number, the
    best strategy's direction), TP/PP over FSDP at 2048 GPUs, H100 over A100 against their FLOP ratio, MFU,
    power and energy per token with scale, and the all-reduce bus bandwidth over nodes. Headline values at the
    dataset's batch on H100; ranges over models, systems and the swept global batch."""
    ds, sweep, bw, setting = _load(folder)
    seqs = sorted(set(ds["global_batch_sequences"].values.tolist()))
    ours = (f"{', '.join(setting['models'])} on the {setting['stack']} stack at a fixed "
            f"{setting['global_batch_tokens'] / 2**20:g}M-token batch ({'/'.join(map(str, seqs))} sequences; "
            "the paper's batch size is not carried here)")
    return _scaling_records(ds, sweep, ours) + _hardware_records(ds, sweep, ours) + _power_records(ds, sweep, bw, ours)
