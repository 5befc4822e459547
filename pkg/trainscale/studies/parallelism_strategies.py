"""PTD-P vs ZeRO-3, and tensor vs pipeline parallelism (Narayanan et al. 2021, arXiv 2104.04473).

Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (SC21), combine tensor parallelism inside a DGX A100 node, pipeline parallelism
across nodes and data parallelism (PTD-P). Two of their results are reproduced here with the
performance model (:mod:`trainscale.model.perfmodel`):

* Table 2 / Fig. 10 (Sec. 5.2): at a fixed global batch, doubling the GPU count keeps PTD-P's
  per-GPU throughput nearly flat, while ZeRO-3 without model parallelism loses about half of its
  per-GPU throughput per doubling, because each GPU's share of the batch halves while every
  GPU still gathers every layer's weights: PTD-P outperforms ZeRO-3 by 70% for 175B and 530B
  when the GPU count doubles (Table 2: 149 vs 88 TFLOP/s at 768 GPUs, 167 vs 98 at 1120).
* Fig. 13 (Sec. 5.4.1): for a 161B GPT (32 layers, hidden 20480, 128 heads) on 64 GPUs, of the
  (pipeline, tensor) splits of the 64 GPUs, tensor parallelism equal to the GPUs per node (8)
  gives the highest throughput.

:func:`strategy_scaling` searches the best plan of each strategy (:func:`strategy_space`) at each
GPU count ``base_gpus * 2**k`` (``k < doublings``) with :func:`trainscale.model.planner.search`:

* ``ptd-p``: tensor parallelism within the node (powers of two up to the GPUs per node),
  pipeline parallelism across nodes (any degree dividing the GPU count that is a power of two or
  divides the layers), interleaved schedules, micro-batch, data parallelism with or without a
  sharded optimizer (ZeRO-1);
* ``ptd-p-node-tp``: the same with the tensor-parallel degree fixed at the GPUs per node, the
  paper's rule;
* ``zero-3``: no model parallelism (tp = pp = 1), ZeRO-3 over all GPUs with DeepSpeed's
  per-tensor parameter fetches, micro-batch searched.

Every plan runs the paper's 2021 software (:data:`PAPER_SOFTWARE`): full activation
recomputation, no FlashAttention, no sequence parallelism, the data-parallel reduction after the
backward pass (not overlapped; ZeRO-3 excepted, whose DeepSpeed defaults prefetch and overlap), the backward's
tensor-parallel all-reduces not overlapped (:data:`PAPER_TP_ASYNC_BACKWARD`) - the
settings under which the published runs are validated
(:mod:`trainscale.model.validation`). Throughput is reported as the paper does, in hardware TFLOP/s per
GPU (Megatron's eq. 3 counts the recomputed forward pass).

:func:`tp_pp_sweep` prices every (tp, pp) pair of powers of two on a fixed GPU count (dp fills
the rest) at each global batch, each at its best micro-batch. :func:`published_comparison`
predicts the paper's own runs from ``data/published_runs.csv`` and marks those that coincide with
a point of the strategy sweep.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import xarray as xr

from ..common import comparison
from ..model import perfmodel
from ..model import planner
from ..common import io as tsio
from ..common.checks import check_choice, check_int
from ..common.io import provenance
from ..model.specs import ModelSpec, PlanSpec, RunSpec, SpecError, resolve_model, resolve_system
from ..model.validation import published_runs

STRATEGIES = ("ptd-p", "ptd-p-node-tp", "zero-3")

PAPER = ("Narayanan et al., Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM "
         "(SC 2021)")
OUTPUTS = ("strategies.nc", "tp_pp_sweep.nc", "published.nc", "tflops_vs_gpus.png", "tp_pp_heatmap.png")
RESOURCES = {"mem_mb": 2000, "runtime_quick_min": 10, "runtime_full_min": 30}
STUDY = "parallelism-strategies"
#: The paper's Fig. 13 (161B GPT on 64 GPUs): tensor parallelism = GPUs per node (8) is best, at the
#: batch sizes the figure shows (32 and 128, as we read it).
PAPER_FIG13_BEST_TP = 8
PAPER_FIG13_BATCHES = (32, 128)

#: The software of the paper's runs (Megatron-LM and DeepSpeed, 2021), applied to every plan.
PAPER_SOFTWARE = {"recompute": ["full"], "flash_attention": [0], "sequence_parallel": [0],
                  "overlap_grad_reduce": [0]}
#: Megatron-LM of the paper's runs (commit 6985e58, August 2021) all-reduced the backward's tensor-parallel
#: gradients synchronously; the asynchronous backward (``tp_async_backward``) came a month later.
PAPER_TP_ASYNC_BACKWARD = False

#: Models of the paper that the catalog does not hold, by name (shapes exact from the paper).
STUDY_MODELS = {
    "gpt-161b": ModelSpec(
        name="gpt-161b", layers=32, hidden=20480, heads=128, kv_heads=128, ffn_hidden=4 * 20480,
        ffn_type="gelu", vocab=51200, seq_len=2048,
        source="Narayanan et al. 2021 (arXiv 2104.04473) Sec. 5.4.1 / Fig. 13: 161-billion-parameter GPT, "
               "32 transformer layers, 128 attention heads, hidden size 20480; GPT architecture as in "
               "Megatron-LM (ffn = 4 x hidden, vocab padded to 51200, sequence 2048)"),
}

#: Narayanan et al. 2021, Table 2 (achieved hardware TFLOP/s per GPU), for the printed comparison
#: only (figures show model numbers). Keyed by (layers, hidden): 174.6B and 529.6B GPT.
#: The ZeRO-3 rows of 175B are also in ``data/published_runs.csv``. ``model_parallel`` is the PTD-P
#: runs' (tp, pp): model-parallel size 96 and 280 with tp = 8 (Sec. 5.2), micro-batch 1.
#: ``zero3_micro_batch``: Table 2's micro-batch of each ZeRO-3 row (one micro-batch per GPU per step:
#: global batch / GPUs), as ``data/published_runs.csv`` carries it for 175B.
PAPER_TABLE2 = {
    (96, 12288): {"label": "175B", "global_batch": 1536,
                  "ptd-p": {384: 153.0, 768: 149.0, 1536: 141.0},
                  "zero-3": {384: 144.0, 768: 88.0, 1536: 44.0},
                  "zero3_micro_batch": {384: 4, 768: 2, 1536: 1},
                  "doubled_gpus": 768, "model_parallel": (8, 12)},
    (105, 20480): {"label": "530B", "global_batch": 2240,
                   "ptd-p": {560: 171.0, 1120: 167.0, 2240: 159.0},
                   "zero-3": {640: 138.0, 1120: 98.0, 2240: 48.0},  # 640 GPUs at batch 2560
                   "zero3_micro_batch": {640: 4, 1120: 2, 2240: 1},
                   "doubled_gpus": 1120, "model_parallel": (8, 35)},
}
PAPER_SOURCE = "Narayanan et al. 2021 (arXiv 2104.04473) Table 2 and Sec. 5.2"
PAPER_RATIO_AT_DOUBLE = 1.7  # "PTD-P outperforms ZeRO-3 by 70% for both models" (Sec. 5.2)


def study_model(value) -> ModelSpec:
    """A model by catalog name, or one of :data:`STUDY_MODELS`."""
    if isinstance(value, str) and value in STUDY_MODELS:
        return STUDY_MODELS[value]
    return resolve_model(value)


def _pow2_upto(n: int) -> list[int]:
    return [2**i for i in range(0, 24) if 2**i <= n]


def _pipeline_degrees(model: ModelSpec, gpus: int) -> list[int]:
    return [p for p in range(1, min(gpus, model.layers) + 1)
            if gpus % p == 0 and (p & (p - 1) == 0 or model.layers % p == 0)]


def strategy_space(strategy: str, model, system, gpus: int, global_batch: int) -> dict:
    """The plan axes a strategy may choose from (its best plan is searched within them)."""
    model, system = study_model(model), resolve_system(system)
    check_choice("strategy", strategy, STRATEGIES)
    micro = [b for b in (1, 2, 4, 8) if b <= global_batch]
    common = {**{k: list(v) for k, v in PAPER_SOFTWARE.items()}, "micro_batch": micro}
    if strategy == "zero-3":
        # DeepSpeed's ZeRO-3 prefetches parameters and overlaps its reduction (overlap_comm
        # defaults to true at stage 3), as the published ZeRO-3 runs are validated
        return {**common, "tp": [1], "pp": [1], "zero": [3], "zero3_per_tensor": [1], "overlap_grad_reduce": [1]}
    if strategy == "ptd-p-node-tp":
        tp = [system.gpus_per_node]
    else:
        tp = [t for t in _pow2_upto(system.gpus_per_node) if model.heads % t == 0 and model.kv_heads % t == 0]
    return {**common, "tp": tp, "pp": _pipeline_degrees(model, gpus), "interleave": [1, 2, 3, 4],
            "zero": [0, 1]}


def strategy_stack(strategy: str) -> str:
    """The software the paper ran a strategy with: DeepSpeed for ZeRO-3, Megatron-LM for PTD-P."""
    return "deepspeed" if strategy == "zero-3" else "megatron"


def best_plan(model, system, gpus: int, global_batch: int, space: dict, rerank: int = 8,
              stack: str = "megatron") -> dict | None:
    """The best feasible plan of ``space`` run by ``stack`` (pipelines simulated), with its
    hardware and model TFLOP/s per GPU; None when no plan fits."""
    model, system = study_model(model), resolve_system(system)
    _, ranked = planner.search(model, system, int(gpus), int(global_batch), top=1, space=space, rerank=rerank,
                                 stack=stack, tp_async_backward=PAPER_TP_ASYNC_BACKWARD)
    if not ranked:
        return None
    plan = ranked[0]["plan"]
    p = perfmodel.predict(RunSpec(id="best", model=model, system=system,
                                  plan=perfmodel.plan_from_grid_entry(plan, int(global_batch))))
    return {"plan": plan, "step_time_s": p.step_time_s, "tokens_per_s": p.tokens_per_s,
            "hardware_tflops_per_gpu": p.hardware_tflops_per_gpu, "model_tflops_per_gpu": p.model_tflops_per_gpu,
            "memory_gib_per_gpu": p.memory_gib_per_gpu}


PLAN_FIELDS = ("tp", "pp", "dp", "interleave", "micro_batch", "zero")
FLOAT_META = {
    "hardware_tflops_per_gpu": ("TFLOP/s", "hardware TFLOP/s per GPU"),
    "model_tflops_per_gpu": ("TFLOP/s", "model FLOP rate per GPU"),
    "tokens_per_s": ("tokens/s", "cluster throughput"),
    "step_time_s": ("s", "step time"),
    "memory_gib_per_gpu": ("GiB", "memory of the most loaded GPU"),
}


def _check_lists(models, base_gpus, global_batch):
    if isinstance(models, str) or len(models) == 0:
        raise SpecError("models", models, "expected a non-empty list of model names")
    for name in ("base_gpus", "global_batch"):
        values = base_gpus if name == "base_gpus" else global_batch
        if isinstance(values, (str, int)) or len(values) != len(models):
            raise SpecError(name, values, f"expected a list of {len(models)} positive integers, one per model")
    return ([check_int("base_gpus", g) for g in base_gpus], [check_int("global_batch", b) for b in global_batch])


def strategy_scaling(models: Sequence[str], base_gpus: Sequence[int], global_batch: Sequence[int],
                     doublings: int = 3, system: str = "dgx-a100-80gb",
                     strategies: Sequence[str] = STRATEGIES) -> xr.Dataset:
    """Best plan of each strategy as the GPU count doubles at a fixed global batch.

    Model ``i`` runs on ``base_gpus[i] * 2**k`` GPUs (``k = 0 .. doublings-1``, dim ``doubling``;
    the 2-D coord ``gpus`` holds the counts) with ``global_batch[i]`` sequences per step. Returns
    per (model, strategy, doubling) the best plan's rates, memory and plan fields (-1 where no plan
    of the strategy fits), and ``speedup_vs_zero3``: throughput over ZeRO-3's at the same count.
    """
    base, batch = _check_lists(models, base_gpus, global_batch)
    doublings = check_int("doublings", doublings, 1, 10)
    system_spec = resolve_system(system)
    if isinstance(strategies, str) or len(strategies) == 0:
        raise SpecError("strategies", strategies, f"expected a non-empty subset of {', '.join(STRATEGIES)}")
    for s in strategies:
        check_choice("strategies", s, STRATEGIES)
    specs = [study_model(m) for m in models]
    shape = (len(models), len(strategies), doublings)
    floats = {name: np.full(shape, np.nan) for name in FLOAT_META}
    ints = {name: np.full(shape, -1, dtype=np.int64) for name in PLAN_FIELDS}
    gpus = np.array([[b * 2**k for k in range(doublings)] for b in base], dtype=np.int64)
    for i, model in enumerate(specs):
        for j, strategy in enumerate(strategies):
            for k in range(doublings):
                n = int(gpus[i, k])
                best = best_plan(model, system_spec, n, batch[i],
                                 strategy_space(strategy, model, system_spec, n, batch[i]),
                                 stack=strategy_stack(strategy))
                if best is None:
                    continue
                for name in FLOAT_META:
                    floats[name][i, j, k] = best[name]
                for name in PLAN_FIELDS:
                    ints[name][i, j, k] = int(best["plan"][name])
    dims = ("model", "strategy", "doubling")
    data = {name: (dims, arr, {"units": FLOAT_META[name][0], "long_name": FLOAT_META[name][1]})
            for name, arr in floats.items()}
    for name, arr in ints.items():
        data[name] = (dims, arr, {"units": "1", "long_name": f"best plan: {name.replace('_', ' ')} (-1: none fits)"})
    data["fits"] = (dims, ints["tp"] > 0, {"units": "1", "long_name": "a plan of this strategy fits in memory"})
    ds = xr.Dataset(data, coords={
        "model": [m.name for m in specs], "strategy": list(strategies), "doubling": np.arange(doublings),
        "gpus": (("model", "doubling"), gpus, {"units": "1", "long_name": "GPUs"}),
        "global_batch": ("model", np.asarray(batch, dtype=np.int64),
                         {"units": "sequences", "long_name": "global batch (fixed as GPUs double)"}),
    })
    ds["doubling"].attrs.update({"units": "1", "long_name": "doublings of the GPU count"})
    ds["model"].attrs.update({"long_name": "model"})
    ds["strategy"].attrs.update({"long_name": "parallelisation strategy"})
    paper_plan = np.full((len(models), doublings), np.nan)
    for i, model in enumerate(specs):
        ref = paper_reference(model)
        if ref is None:
            continue
        tp, pp = ref["model_parallel"]
        for k in range(doublings):
            n = int(gpus[i, k])
            if n % (tp * pp) or batch[i] % (n // (tp * pp)):
                continue
            plan = PlanSpec(tp=tp, pp=pp, dp=n // (tp * pp), micro_batch=1, global_batch=batch[i],
                            recompute=PAPER_SOFTWARE["recompute"][0], flash_attention=False,
                            tp_async_backward=PAPER_TP_ASYNC_BACKWARD)
            p = perfmodel.predict(RunSpec(id="paper-plan", model=model, system=system_spec, plan=plan))
            if p.fits:
                paper_plan[i, k] = p.hardware_tflops_per_gpu
    ds["paper_plan_tflops_per_gpu"] = (("model", "doubling"), paper_plan, {
        "units": "TFLOP/s", "long_name": "PTD-P with the paper's plan (Table 2: tp 8, its pp, micro-batch 1), "
                                         "hardware FLOP rate per GPU (NaN: no Table 2 plan)"})
    if "zero-3" in strategies:
        ds["paper_zero3_tflops_per_gpu"] = (("model", "doubling"), _paper_zero3(specs, system_spec, gpus, batch), {
            "units": "TFLOP/s", "long_name": "ZeRO-3 at Table 2's micro-batch (tp = pp = 1, the zero-3 strategy's "
                                             "software), hardware FLOP rate per GPU (NaN: no Table 2 row)"})
        ref = ds["tokens_per_s"].sel(strategy="zero-3")
        ds["speedup_vs_zero3"] = (ds["tokens_per_s"] / ref).assign_attrs(
            units="1", long_name="throughput over ZeRO-3's at the same GPU count")
    ds.attrs.update(provenance({"models": [m.name for m in specs], "base_gpus": base, "global_batch": batch,
                                "doublings": doublings, "system": system_spec.name,
                                "strategies": list(strategies), "software": PAPER_SOFTWARE}))
    ds.attrs["system"] = system_spec.name
    ds.attrs["gpus_per_node"] = int(system_spec.gpus_per_node)
    return ds


def _paper_zero3(specs, system, gpus, batch) -> np.ndarray:
    """ZeRO-3's hardware TFLOP/s per GPU at Table 2's micro-batch, per (model, doubling), in the zero-3
    strategy's plan space otherwise; NaN where Table 2 has no ZeRO-3 row at that GPU count and batch,
    or the plan does not fit."""
    out = np.full(gpus.shape, np.nan)
    for i, model in enumerate(specs):
        ref = paper_reference(model)
        if ref is None or batch[i] != ref["global_batch"]:
            continue
        for k, n in enumerate(gpus[i]):
            micro = ref["zero3_micro_batch"].get(int(n))
            if micro is None:
                continue
            space = strategy_space("zero-3", model, system, int(n), batch[i])
            entry = {"cp": 1, "interleave": 1, **{name: values[0] for name, values in space.items()},
                     "dp": int(n), "micro_batch": micro, "stack": strategy_stack("zero-3")}
            plan = perfmodel.plan_from_grid_entry(entry, batch[i])
            p = perfmodel.predict(RunSpec(id="paper-zero3", model=model, system=system, plan=plan))
            if p.fits:
                out[i, k] = p.hardware_tflops_per_gpu
    return out


def tp_pp_sweep(model: str = "gpt-161b", gpus: int = 64, global_batches: Sequence[int] = (32, 128),
                system: str = "dgx-a100-80gb") -> xr.Dataset:
    """Hardware TFLOP/s per GPU of every (tp, pp) pair of powers of two with ``tp * pp <= gpus``
    (data parallelism ``gpus / (tp * pp)``), at each global batch, at the best micro-batch and
    optimizer sharding (PTD-P space, no interleaving, the paper's software)."""
    model_spec, system_spec = study_model(model), resolve_system(system)
    gpus = check_int("gpus", gpus, 1)
    if gpus & (gpus - 1):
        raise SpecError("gpus", gpus, "expected a power of two")
    if isinstance(global_batches, (str, int)) or len(global_batches) == 0:
        raise SpecError("global_batches", global_batches, "expected a non-empty list of positive integers")
    batches = [check_int("global_batches", b) for b in global_batches]
    degrees = _pow2_upto(gpus)
    shape = (len(batches), len(degrees), len(degrees))
    tflops, mtflops, tokens = np.full(shape, np.nan), np.full(shape, np.nan), np.full(shape, np.nan)
    micro, dp = np.full(shape, -1, dtype=np.int64), np.full(shape, -1, dtype=np.int64)
    base = strategy_space("ptd-p", model_spec, system_spec, gpus, max(batches))
    for b, batch in enumerate(batches):
        for i, tp in enumerate(degrees):
            for j, pp in enumerate(degrees):
                if tp * pp > gpus or pp > model_spec.layers or model_spec.heads % tp:
                    continue
                space = {**base, "tp": [tp], "pp": [pp], "interleave": [1],
                         "micro_batch": [m for m in (1, 2, 4, 8) if m <= batch]}
                best = best_plan(model_spec, system_spec, gpus, batch, space, rerank=4)
                if best is None:
                    continue
                tflops[b, i, j] = best["hardware_tflops_per_gpu"]
                mtflops[b, i, j] = best["model_tflops_per_gpu"]
                tokens[b, i, j] = best["tokens_per_s"]
                micro[b, i, j] = best["plan"]["micro_batch"]
                dp[b, i, j] = best["plan"]["dp"]
    dims = ("global_batch", "tp", "pp")
    ds = xr.Dataset({
        "hardware_tflops_per_gpu": (dims, tflops, {"units": "TFLOP/s", "long_name": FLOAT_META[
            "hardware_tflops_per_gpu"][1]}),
        "model_tflops_per_gpu": (dims, mtflops, {"units": "TFLOP/s", "long_name": "model FLOP rate per GPU"}),
        "tokens_per_s": (dims, tokens, {"units": "tokens/s", "long_name": "cluster throughput"}),
        "micro_batch": (dims, micro, {"units": "1", "long_name": "best micro-batch (-1: no plan fits)"}),
        "dp": (dims, dp, {"units": "1", "long_name": "data-parallel degree (-1: no plan fits)"}),
        "fits": (dims, micro > 0, {"units": "1", "long_name": "a plan with this tp and pp fits in memory"}),
    }, coords={"global_batch": np.asarray(batches, dtype=np.int64), "tp": np.asarray(degrees, dtype=np.int64),
               "pp": np.asarray(degrees, dtype=np.int64)})
    ds["global_batch"].attrs.update({"units": "sequences", "long_name": "global batch"})
    ds["tp"].attrs.update({"units": "1", "long_name": "tensor-parallel degree"})
    ds["pp"].attrs.update({"units": "1", "long_name": "pipeline-parallel degree"})
    ds.attrs.update(provenance({"model": model_spec.name, "gpus": gpus, "global_batches": batches,
                                "system": system_spec.name, "software": PAPER_SOFTWARE}))
    ds.attrs.update({"model": model_spec.name, "system": system_spec.name, "gpus": gpus,
                     "gpus_per_node": int(system_spec.gpus_per_node), "params": float(model_spec.params())})
    return ds


def best_tp(sweep: xr.Dataset, fixed_model_parallel: bool = True) -> xr.DataArray:
    """The tensor-parallel degree of the highest-throughput cell, per global batch; with
    ``fixed_model_parallel`` only among the cells with ``tp * pp`` = the GPU count (dp = 1), the
    comparison of the paper's Fig. 13, else over the whole grid."""
    rate = sweep["hardware_tflops_per_gpu"]
    if fixed_model_parallel:
        rate = rate.where(sweep["tp"] * sweep["pp"] == int(sweep.attrs["gpus"]))
    flat = rate.fillna(-1.0).stack(cell=("tp", "pp"))
    best = flat["tp"].values[flat.argmax("cell").values]
    return xr.DataArray(np.asarray(best, dtype=np.int64), coords={"global_batch": sweep["global_batch"].values},
                        dims="global_batch", name="best_tp")


def paper_reference(model) -> dict | None:
    """The paper's Table 2 entry for a model of the same shape, or None."""
    m = study_model(model)
    return PAPER_TABLE2.get((m.layers, m.hidden))


def published_comparison(scaling: xr.Dataset | None = None) -> xr.Dataset:
    """Predicted vs measured hardware TFLOP/s per GPU for the paper's runs (Narayanan et al. 2021
    rows of ``data/published_runs.csv``), each priced with its published plan; with ``scaling``
    (from :func:`strategy_scaling`), ``study_tflops_per_gpu`` is the study's best plan of the same
    strategy at the same model shape, GPU count and batch (NaN where the sweep has no such point)."""
    runs = [m for m in published_runs() if "Narayanan et al. 2021" in m.source
            and m.metric == "hardware_tflops_per_gpu"]
    n = len(runs)
    measured, predicted, study = np.empty(n), np.empty(n), np.full(n, np.nan)
    strategy, gpus, model = [], np.empty(n, dtype=np.int64), []
    shapes = {}
    if scaling is not None:
        shapes = {(study_model(name).layers, study_model(name).hidden, study_model(name).heads): name
                  for name in scaling["model"].values.tolist()}
    for r, m in enumerate(runs):
        measured[r] = m.measured
        predicted[r] = perfmodel.predict(m.run).hardware_tflops_per_gpu
        plan, spec = m.run.plan, m.run.model
        strat = "zero-3" if plan.zero == 3 and plan.tp == plan.pp == 1 else "ptd-p"
        strategy.append(strat)
        gpus[r] = m.run.gpus
        model.append(spec.name)
        name = shapes.get((spec.layers, spec.hidden, spec.heads))
        if name is not None and strat in scaling["strategy"].values:
            row = scaling.sel(model=name)
            hit = np.flatnonzero(row["gpus"].values == m.run.gpus)
            if hit.size and int(row["global_batch"]) == plan.global_batch:
                study[r] = float(row["hardware_tflops_per_gpu"].sel(strategy=strat).isel(doubling=int(hit[0])))
    ds = xr.Dataset({
        "measured_tflops_per_gpu": ("run", measured, {"units": "TFLOP/s",
                                                      "long_name": "published hardware FLOP rate per GPU"}),
        "predicted_tflops_per_gpu": ("run", predicted, {"units": "TFLOP/s",
                                                        "long_name": "predicted, with the published plan"}),
        "study_tflops_per_gpu": ("run", study, {"units": "TFLOP/s",
                                                "long_name": "predicted, the study's best plan of the strategy"}),
        "rel_error": ("run", predicted / measured - 1.0, {"units": "1",
                                                          "long_name": "predicted / published - 1"}),
    }, coords={"run": [m.run.id for m in runs],
               "strategy": ("run", strategy, {"units": "1", "long_name": "strategy of the published run"}),
               "gpus": ("run", gpus, {"units": "1", "long_name": "GPUs"}),
               "model": ("run", model, {"units": "1", "long_name": "model"})})
    ds["run"].attrs.update({"long_name": "published run (data/published_runs.csv id)"})
    ds.attrs.update(provenance({"source": "data/published_runs.csv, Narayanan et al. 2021 rows",
                                "scaling_models": [] if scaling is None else scaling["model"].values.tolist()}))
    return ds


__all__ = ["PAPER", "OUTPUTS", "RESOURCES", "compare", "STRATEGIES", "PAPER_SOFTWARE", "PAPER_TP_ASYNC_BACKWARD", "PAPER_TABLE2", "PAPER_RATIO_AT_DOUBLE", "STUDY_MODELS", "best_plan",
           "best_tp", "paper_reference", "published_comparison", "strategy_scaling", "strategy_space", "study_model",
           "tp_pp_sweep", "FIGURES", "draw_tflops_vs_gpus", "draw_tp_pp_heatmap"]


def compare(folder) -> list[comparison.Record]:
    """Paper-vs-ours records from the saved datasets in ``folder`` (``strategies.nc``, ``tp_pp_sweep.nc``):

    * PTD-P over ZeRO-3 at twice the GPUs (Table 2's 768 and 1120 GPUs), PTD-P with the paper's own plan
      (tp 8, its pp, micro-batch 1) against ZeRO-3 at Table 2's micro-batch (global batch / GPUs);
    * every Table 2 point the sweep holds: PTD-P with the paper's plan, ZeRO-3 at Table 2's micro-batch
      (the searched best of each in the note);
    * the best tensor-parallel degree of Fig. 13's split of 64 GPUs, per global batch.
    """
    folder = Path(folder)
    ds = tsio.read_dataset(folder / "strategies.nc")
    sweep = tsio.read_dataset(folder / "tp_pp_sweep.nc")
    records = []
    rate = ds["hardware_tflops_per_gpu"]
    system = ds.attrs.get("system", "?")
    for model in ds["model"].values.tolist():
        ref = paper_reference(model)
        if ref is None:
            continue
        label = ref["label"]
        gpus = ds["gpus"].sel(model=model).values.tolist()
        same_batch = int(ds["global_batch"].sel(model=model)) == ref["global_batch"]
        where = f"{system}, batch {int(ds['global_batch'].sel(model=model))}, the paper's 2021 software"
        g2 = ref["doubled_gpus"]
        if g2 in gpus and "zero-3" in ds["strategy"].values:
            k = gpus.index(g2)
            zero3 = float(ds["paper_zero3_tflops_per_gpu"].sel(model=model).isel(doubling=k))
            ours = float(ds["paper_plan_tflops_per_gpu"].sel(model=model).isel(doubling=k)) / zero3
            best_zero3 = float(rate.sel(model=model, strategy="zero-3", doubling=k))
            searched = float(rate.sel(model=model, strategy="ptd-p", doubling=k)) / best_zero3 if "ptd-p" in \
                ds["strategy"].values else float("nan")
            records.append(comparison.numeric(
                STUDY, f"PTD-P over ZeRO-3 throughput at {g2} GPUs, {label}", "x",
                paper_value=ref["ptd-p"][g2] / ref["zero-3"][g2],
                paper_setting=(f"Table 2: {ref['ptd-p'][g2]:.0f} vs {ref['zero-3'][g2]:.0f} TFLOP/s per GPU at {g2} "
                               f"A100s, batch {ref['global_batch']} (twice the GPUs of the first PTD-P row)"),
                our_value=ours, our_setting=f"PTD-P with the paper's plan (tp {ref['model_parallel'][0]}, pp "
                                            f"{ref['model_parallel'][1]}, micro-batch 1) over ZeRO-3 at Table 2's "
                                            f"micro-batch ({ref['zero3_micro_batch'][g2]}), {where}",
                same_setting=same_batch, neutral=1.0,
                note=(f"the study's searched best plans (PTD-P: micro-batch, interleaving; ZeRO-3: micro-batch) "
                      f"give {searched:.2f}x")))
        for strategy in ("ptd-p", "zero-3"):
            if strategy == "zero-3" and "zero-3" not in ds["strategy"].values:
                continue
            for g, measured in ref[strategy].items():
                if g not in gpus:
                    continue
                k = gpus.index(g)
                if strategy == "ptd-p":
                    ours = float(ds["paper_plan_tflops_per_gpu"].sel(model=model).isel(doubling=k))
                    how = f"the paper's plan (tp {ref['model_parallel'][0]}, pp {ref['model_parallel'][1]}, micro-batch 1)"
                    note = ("the performance model's calibration is fitted jointly to every stack and GPU generation; "
                            "it overestimates the large Megatron runs (within 0-5% when fitted to Ampere only)")
                else:
                    ours = float(ds["paper_zero3_tflops_per_gpu"].sel(model=model).isel(doubling=k))
                    best_zero3 = float(rate.sel(model=model, strategy="zero-3", doubling=k))
                    how = (f"ZeRO-3 (tp = pp = 1, DeepSpeed's per-tensor fetches) at Table 2's micro-batch "
                           f"({ref['zero3_micro_batch'][g]})")
                    note = (f"the study's searched best ZeRO-3 micro-batch "
                            f"({int(ds['micro_batch'].sel(model=model, strategy='zero-3').isel(doubling=k))}) "
                            f"gives {best_zero3:.0f} TFLOP/s")
                records.append(comparison.numeric(
                    STUDY, f"{'PTD-P' if strategy == 'ptd-p' else 'ZeRO-3'} TFLOP/s per GPU, {label}, {g} GPUs",
                    "TFLOP/s", paper_value=measured,
                    paper_setting=f"Table 2, {label} on {g} A100s, batch {ref['global_batch']}",
                    our_value=ours, our_setting=f"{how}, {where}", same_setting=same_batch, note=note))
    gpn = int(sweep.attrs["gpus_per_node"])
    best = best_tp(sweep)
    diag = sweep["hardware_tflops_per_gpu"].where(sweep["tp"] * sweep["pp"] == int(sweep.attrs["gpus"])).max("pp")
    for b in sweep["global_batch"].values.tolist():
        t = int(best.sel(global_batch=b))
        row = diag.sel(global_batch=b)
        at_node = float(row.sel(tp=gpn)) if gpn in row["tp"].values else float("nan")
        in_paper = b in PAPER_FIG13_BATCHES
        records.append(comparison.numeric(
            STUDY, f"best tensor-parallel degree, {sweep.attrs['model']} on {sweep.attrs['gpus']} GPUs, batch {b}",
            "GPUs", paper_value=PAPER_FIG13_BEST_TP,
            paper_setting=(f"Fig. 13: 161B GPT (32 layers, hidden 20480) on 64 A100s, (pp, tp) splits with "
                           f"tp x pp = 64, batch {' and '.join(str(x) for x in PAPER_FIG13_BATCHES)}: tp = 8 best"),
            our_value=t, our_setting=(f"the best of the tp x pp = {sweep.attrs['gpus']} splits at batch {b}, "
                                      f"each at its best micro-batch, {sweep.attrs['system']}"),
            same_setting=in_paper,
            note=(f"tp = {gpn} reaches {at_node:.0f} TFLOP/s per GPU, {at_node / float(row.max()) - 1:+.1%} from the "
                  f"best split ({float(row.max()):.0f})" + ("" if in_paper else
                                                             f"; batch {b} is not among Fig. 13's batch sizes"))))
    return records


# ---------------------------------------------------------------------------------------------- figures

_STYLES = {"ptd-p": ("C0", "-", "o", "PTD-P (best plan)"), "ptd-p-node-tp": ("C2", "--", "s", "PTD-P, tp = GPUs per node"),
           "zero-3": ("C3", "-", "v", "ZeRO-3 (tp = pp = 1)")}


def draw_tflops_vs_gpus(folder):
    """Hardware TFLOP/s per GPU of each strategy at its best plan as the GPU count doubles at a fixed global
    batch, one panel per model, with PTD-P at the paper's own plan dotted (a flat line: perfect strong
    scaling)."""
    import matplotlib.pyplot as plt

    from ..common import plotting

    ds = tsio.read_dataset(Path(folder) / "strategies.nc")
    names = ds["model"].values.tolist()
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.8), squeeze=False)
    for ax, model in zip(axes[0], names):
        sel = ds.sel(model=model)
        gpus = sel["gpus"].values
        for strategy in ds["strategy"].values.tolist():
            color, ls, marker, label = _STYLES.get(strategy, ("0.5", "-", "o", strategy))
            ax.plot(gpus, sel["hardware_tflops_per_gpu"].sel(strategy=strategy), color=color, linestyle=ls,
                    marker=marker, label=label)
        if np.isfinite(sel["paper_plan_tflops_per_gpu"].values).any():
            ax.plot(gpus, sel["paper_plan_tflops_per_gpu"], color="0.4", linestyle=":", marker="x",
                    label="PTD-P, the paper's plan (tp 8, micro-batch 1)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(gpus, [str(g) for g in gpus])
        ax.minorticks_off()
        ax.set(xlabel="GPUs", ylabel=plotting.label(ds["hardware_tflops_per_gpu"]), ylim=(0, None),
               title=f"{model}, batch {int(sel['global_batch'])}, {ds.attrs['system']}")
    entries = {}  # one entry per series any panel draws, under the panels
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    fig.legend(entries.values(), entries.keys(), loc="outside lower center", ncol=min(len(entries), 4))
    return fig


def draw_tp_pp_heatmap(folder):
    """Hardware TFLOP/s per GPU of every (tp, pp) split of the sweep's GPUs (data parallelism takes the rest),
    each at its best micro-batch, one panel per global batch; blank: does not fit. Outlined red: tp x pp = all
    GPUs (the paper's Fig. 13 comparison); thick orange frame and star: the best of those."""
    import matplotlib.pyplot as plt

    from ..common import plotting

    sweep = tsio.read_dataset(Path(folder) / "tp_pp_sweep.nc")
    tps, pps = sweep["tp"].values, sweep["pp"].values
    batches = sweep["global_batch"].values.tolist()
    vmax = float(sweep["hardware_tflops_per_gpu"].max())
    fig, axes = plt.subplots(1, len(batches), figsize=(4.4 * len(batches), 4.2), squeeze=False)
    best = best_tp(sweep)
    for ax, b in zip(axes[0], batches):
        grid = sweep["hardware_tflops_per_gpu"].sel(global_batch=b).values
        im = ax.imshow(grid, origin="lower", cmap="viridis", vmin=0, vmax=vmax)
        ax.grid(False)
        for i in range(len(tps)):
            for j in range(len(pps)):
                if np.isfinite(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.0f}", ha="center", va="center", fontsize=7,
                            color="white" if grid[i, j] < 0.6 * vmax else "black")
                if tps[i] * pps[j] == sweep.attrs["gpus"]:
                    ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.2))
        t = int(best.sel(global_batch=b))
        bi, bj = list(tps).index(t), list(pps).index(sweep.attrs["gpus"] // t)
        ax.add_patch(plt.Rectangle((bj - 0.5, bi - 0.5), 1, 1, fill=False, edgecolor="orange", linewidth=3.0,
                                   zorder=3))
        ax.plot(bj + 0.32, bi + 0.3, marker="*", color="orange", markersize=7, markeredgecolor="k",
                markeredgewidth=0.4, zorder=4)
        ax.set_xticks(range(len(pps)), [str(p) for p in pps])
        ax.set_yticks(range(len(tps)), [str(t) for t in tps])
        ax.set(xlabel="pipeline-parallel degree pp", ylabel="tensor-parallel degree tp",
               title=f"{sweep.attrs['model']}, {sweep.attrs['gpus']} GPUs, batch {b}")
    fig.colorbar(im, ax=axes[0].tolist(), label=plotting.label(sweep["hardware_tflops_per_gpu"]), shrink=0.85)
    return fig


#: the figures drawn from the saved datasets alone (file name -> function of the output folder)
FIGURES = {"tflops_vs_gpus.png": draw_tflops_vs_gpus, "tp_pp_heatmap.png": draw_tp_pp_heatmap}
