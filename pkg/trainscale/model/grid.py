"""Grids of plans: every combination of the plan axes priced in one Numba ``prange`` call
(:func:`evaluate_grid`, an xarray Dataset with one dimension per axis and ``fits`` / ``reason`` masks), the
default search space (:func:`default_space`: every degree, micro-batch and interleave depth that can be valid),
and a grid's ranking (:func:`rank`, equivalent spellings of one plan counted once, :func:`canonical_plan`).
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np
import xarray as xr

from ..common.checks import check_float
from ..kernels import layout as K
from ..kernels.grid import evaluate_grid_ep as _grid_kernel
from .specs import DEFAULT_STACK, RECOMPUTE_MODES, ModelSpec, PlanSpec, SpecError, SystemSpec, resolve_model, \
    resolve_system
from .vectors import GiB, calibration_vector, model_vector, precision_choices, system_vector, with_precision


# --------------------------------------------------------------------------- grids
GRID_AXES = ("tp", "pp", "cp", "interleave", "micro_batch", "recompute", "sequence_parallel", "zero",
             "shard_group", "overlap_grad_reduce", "flash_attention", "zero3_per_tensor", "tp_comm_overlap")
BOOLEAN_AXES = ("sequence_parallel", "overlap_grad_reduce", "flash_attention", "zero3_per_tensor", "tp_comm_overlap")
# the expert axes: a grid has them (last, in this order) only when the caller asks for them. ``etp`` is the
# experts' tensor-parallel degree (Megatron-Core's --expert-tensor-parallel-size), 0 meaning "as tp"
EP_AXIS = "ep"
ETP_AXIS = "etp"
EXPERT_AXES = (EP_AXIS, ETP_AXIS)


def grid_axes(grid: xr.Dataset) -> tuple[str, ...]:
    """The plan axes of an evaluated grid, in order (``GRID_AXES``, then ``ep`` and ``etp`` if swept)."""
    return tuple(grid["step_time_s"].dims)


def expert_axes(values: Mapping) -> tuple[str, ...]:
    """The expert axes a space or grid has (:data:`EXPERT_AXES` in order)."""
    return tuple(name for name in EXPERT_AXES if name in values)


def expert_pairs(arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The kernels' expert layout: ``(ep_v, etp_v)`` of equal length, the product of the ``ep`` and ``etp``
    axes in C order (etp fastest), so a grid's flat index over ``(..., ep, etp)`` is the kernels' over
    ``(..., pair)``; an axis the space lacks is ``[1]`` (ep) or ``[0]`` (etp: as tp)."""
    ep = np.asarray(arrays.get(EP_AXIS, np.ones(1, dtype=np.int64)), dtype=np.int64)
    etp = np.asarray(arrays.get(ETP_AXIS, np.zeros(1, dtype=np.int64)), dtype=np.int64)
    return (np.ascontiguousarray(np.repeat(ep, etp.shape[0])),
            np.ascontiguousarray(np.tile(etp, ep.shape[0])))


def _axis(values, name: str) -> np.ndarray:
    if name == "recompute":
        codes = []
        for v in values:
            if v not in RECOMPUTE_MODES:
                raise SpecError(name, v, f"expected one of {', '.join(RECOMPUTE_MODES)}")
            codes.append(RECOMPUTE_MODES.index(v))
        return np.asarray(codes, dtype=np.int64)
    arr = np.asarray([int(v) for v in values], dtype=np.int64)
    if arr.size == 0:
        raise SpecError(name, list(values), "expected at least one value")
    minimum = 0 if name in BOOLEAN_AXES + ("zero", "shard_group", ETP_AXIS) else 1
    if (arr < minimum).any():
        raise SpecError(name, list(values), f"expected integers >= {minimum}")
    return arr


def _check_split_ends(split_ends) -> None:
    if split_ends not in (0, 1, 2, 3):
        raise SpecError("split_ends", split_ends, "expected 0 (none), 1 (embedding), 2 (loss) or 3 (both)")


def evaluate_grid(model, system, gpus: int, global_batch: int, calibration: Mapping | None = None,
                  stack: str = DEFAULT_STACK, compiled: bool = False, grad_reduce_fp32: bool = False,
                  recompute_share: float | None = None, rotary_kernel: str = "",
                  tp_async_backward: bool | None = None, split_ends: int = 0, precision: str = "bf16",
                  fp8_recipe: str = "", **axes: Iterable) -> xr.Dataset:
    """Evaluate every combination of the plan axes (``GRID_AXES``; each a list of values, default
    ``[1]`` / ``[0]`` / ``["full"]``) for one model, system, GPU count and global batch.

    Returns a Dataset with one dimension per axis; ``dp`` follows from the GPU count. Invalid or
    non-fitting plans stay in the grid with ``fits`` false and ``reason`` saying why; structurally
    invalid ones have NaN times. ``stack``, ``compiled``, ``grad_reduce_fp32``, ``recompute_share``,
    ``rotary_kernel``, ``tp_async_backward``, ``precision`` and ``fp8_recipe`` (one per grid; the share acts on
    the selective plans) are those fields of every plan
    (:class:`~trainscale.model.specs.PlanSpec`). ``split_ends`` counts the embedding (1), the loss (2) or
    both (3) as layers of every pipelined plan's split (``embedding_in_split`` / ``loss_in_split``,
    Megatron-Core's ``--account-for-*-in-pipeline-split``); a plan whose layers do not split so is
    masked (``R_UNEVEN_CHUNKS``).
    """
    _check_split_ends(split_ends)
    model = resolve_model(model)
    system = resolve_system(system)
    unknown = set(axes) - set(GRID_AXES) - set(EXPERT_AXES)
    if unknown:
        name = sorted(unknown)[0]
        raise SpecError(name, axes[name], f"unknown grid axis; valid axes: {', '.join(GRID_AXES + EXPERT_AXES)}")
    defaults = {"recompute": ["full"], "zero": [0], "shard_group": [0], **{name: [0] for name in BOOLEAN_AXES}}
    names = GRID_AXES + expert_axes(axes)
    values = {name: list(axes.get(name, defaults.get(name, [1]))) for name in names}
    arrays = [_axis(values[name], name) for name in GRID_AXES]
    ep, etp = expert_pairs({name: _axis(values[name], name) for name in expert_axes(axes)})
    if recompute_share is not None:
        recompute_share = check_float("recompute_share", recompute_share, 0.0, 1.0)
    ((precision, recipe),) = _one_precision(system, precision, fp8_recipe)
    calib = with_precision(calibration_vector(system.generation, calibration, stack, compiled, grad_reduce_fp32,
                                              recompute_share, rotary_kernel, tp_async_backward),
                           system, calibration, stack, precision, recipe)
    results, dps = _grid_kernel(model_vector(model), system_vector(system), calib, int(gpus), int(global_batch),
                                *arrays, ep, etp, int(split_ends))
    ds = grid_dataset(results, dps, values, model, system, gpus, global_batch, calibration)
    ds.attrs["stack"] = stack
    ds.attrs["compiled"] = int(compiled)
    ds.attrs["grad_reduce_fp32"] = int(grad_reduce_fp32)
    ds.attrs["recompute_share"] = "stack default" if recompute_share is None else float(recompute_share)
    if split_ends:
        ds.attrs["split_ends"] = int(split_ends)
    if precision != "bf16":
        ds.attrs.update(precision=precision, fp8_recipe=recipe)
    return ds


def _one_precision(system: SystemSpec, precision, fp8_recipe: str) -> list[tuple[str, str]]:
    choices = precision_choices(system, precision, fp8_recipe)
    if len(choices) > 1:
        raise SpecError("precision", precision, "expected one precision per grid (a search takes several)")
    return choices


def grid_dataset(results: np.ndarray, dps: np.ndarray, values: Mapping[str, list], model: ModelSpec,
                 system: SystemSpec, gpus: int, global_batch: int,
                 calibration: Mapping | None = None) -> xr.Dataset:
    dims = GRID_AXES + expert_axes(values)
    shape = tuple(len(values[name]) for name in dims)
    res = results.reshape(shape + (K.O_SIZE,))
    step = res[..., K.O_STEP]
    tokens = global_batch * model.seq_len
    peak = system.peak_flops_bf16
    reason = np.nan_to_num(res[..., K.O_REASON], nan=K.R_GPUS).astype(np.int8)
    coords = {name: values[name] for name in dims}

    def var(data, units, long_name):
        return xr.Variable(dims, data, {"units": units, "long_name": long_name})

    data = {
        "step_time_s": var(step, "s", "step time"),
        "tokens_per_s": var(tokens / step, "tokens/s", "cluster throughput"),
        "mfu": var(res[..., K.O_MODEL_FLOPS] / step / peak, "1", "model FLOPs utilisation"),
        "hfu": var(res[..., K.O_HW_FLOPS] / step / peak, "1", "hardware FLOPs utilisation"),
        "memory_gib_per_gpu": var(res[..., K.O_MEM_BYTES] / GiB, "GiB", "memory of the most loaded GPU"),
        "power_W_per_gpu": var(res[..., K.O_POWER_W], "W", "accelerator power"),
        "energy_J_per_token": var(res[..., K.O_ENERGY_J] * gpus / tokens, "J/token",
                                  "accelerator energy per token"),
        "dp": var(dps.reshape(shape).astype(np.int64), "1", "data-parallel degree"),
        "fits": var(reason == K.R_OK, "1", "valid and fits in memory"),
        "reason": var(reason, "1", "why masked: index into the attribute reasons"),
    }
    for name, slot in zip(K.BREAKDOWN_MOE, K.BREAKDOWN_SLOTS):
        if name in K.MOE_BREAKDOWN and not model.is_moe:
            continue
        data[f"time_{name}_s"] = var(res[..., slot], "s", f"step time: {name.replace('_', ' ')}")
    ds = xr.Dataset(data, coords=coords)
    ds["reason"].attrs["reasons"] = list(K.REASONS)
    ds.attrs.update({"model": model.name, "system": system.name, "gpus": int(gpus),
                     "global_batch": int(global_batch), "seq_len": model.seq_len})
    return ds


# --------------------------------------------------------------------------- search
def divisors(n: int) -> list[int]:
    """Every positive divisor of ``n``, ascending."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


# the experts' tensor-parallel degrees a default space offers: as the attention's (0: Megatron-Core's default,
# megatron/core/parallel_state.py initialize_model_parallel(expert_tensor_parallel_size=None), which takes the
# tensor-parallel size) or none (1: each expert whole on its GPU, expert_tensor_parallel_size=1, as MoE training
# configs commonly set it: Megatron-Bridge's workload base configs, veRL's Megatron examples; read in the code
# corpus, 2026-12-06). Any etp with ep x etp dividing tp x dp is priced (--fix etp=N, a space's etp axis)
EXPERT_TP_CHOICES = (0, 1)

# interleave depths kept besides the divisors of the layers: uneven splits, which stacks that balance uneven
# chunks (NeMo, DeepSpeed) can run; Megatron-LM's even split refuses them (R_UNEVEN_CHUNKS), never priced
UNEVEN_INTERLEAVE = (3, 6)


def default_space(model: ModelSpec, system: SystemSpec, gpus: int, global_batch: int) -> dict:
    """A broad plan space: every power-of-two (and node-size) degree, every micro-batch and interleave depth
    that can be valid, all options.

    ``micro_batch``: every divisor of the global batch that divides some local batch (``global_batch / dp``
    for a ``dp`` the tp, pp and cp degrees leave); ``interleave``: every divisor of the layers that leaves a
    pipeline of at least two stages (and ``UNEVEN_INTERLEAVE``). ``shard_group`` adds hybrid sharding (HSDP)
    for ZeRO >= 1: besides sharding over all of dp (0), shard groups of one node (8 GPUs) up to 512 ranks in
    powers of two (below the GPU count). A mixture-of-experts model adds the ``ep`` axis, every power of two
    dividing its experts, and the ``etp`` axis, the experts' tensor-parallel degree: as ``tp`` (0) or 1
    (:data:`EXPERT_TP_CHOICES`). Most of its layouts are invalid; :func:`search` prices only the valid ones.
    """
    pow2 = [2**i for i in range(0, 14) if 2**i <= gpus]
    pp = sorted({p for p in pow2 + [3, 5, 6, 12, 24] if p <= model.layers and gpus % p == 0})
    tp = [t for t in pow2 if t <= min(model.heads, 64)]
    cp = [c for c in pow2 if c <= 16]
    shard = [0] + [g for g in pow2 if 8 <= g <= min(512, gpus // 2)]
    moe = ({EP_AXIS: [e for e in pow2 if model.experts % e == 0], ETP_AXIS: list(EXPERT_TP_CHOICES)}
           if model.is_moe else {})
    return {**moe,
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "interleave": [v for v in sorted(set(divisors(model.layers)) | {1, *UNEVEN_INTERLEAVE})
                       if v == 1 or 2 * v <= model.layers],
        "micro_batch": local_batch_divisors(gpus, global_batch, tp, pp, cp),
        "recompute": list(RECOMPUTE_MODES),
        "sequence_parallel": [0, 1],
        "zero": [0, 1, 2, 3],
        "shard_group": shard,
        "overlap_grad_reduce": [0, 1],
        "flash_attention": [0, 1],
        "tp_comm_overlap": [0, 1],
    }


def local_batch_divisors(gpus: int, global_batch: int, tp: Sequence[int], pp: Sequence[int],
                         cp: Sequence[int]) -> list[int]:
    """Every micro-batch that divides the local batch ``global_batch / dp`` of some split of ``gpus`` into
    the given tp, pp and cp degrees (``dp = gpus / (tp pp cp)``), ascending."""
    ways = {t * p * c for t in tp for p in pp for c in cp if gpus % (t * p * c) == 0}
    local = {global_batch // (gpus // w) for w in ways if global_batch % (gpus // w) == 0}
    return sorted({d for b in local for d in divisors(b)}) or [1]


def canonical_plan(plan: Mapping) -> tuple:
    """A key equal for plans that are the same plan: ``shard_group`` 0 and ``dp`` (or any shard
    group without ZeRO), TP overlap without sequence parallelism, sequence parallelism without tensor
    parallelism (tp 1: no TP group to split the sequence over), per-tensor fetches without ZeRO-3."""
    p = dict(plan)
    if p.get("zero", 0) == 0 or p.get("shard_group", 0) in (0, p.get("dp")):
        p["shard_group"] = 0
    if p.get("tp", 1) == 1:
        p["sequence_parallel"] = False
    if not p.get("sequence_parallel"):
        p["tp_comm_overlap"] = False
    if p.get("zero", 0) != 3:
        p["zero3_per_tensor"] = False
    if p.get(ETP_AXIS, 0) == p.get("tp", 1):
        p[ETP_AXIS] = 0
    return tuple(sorted(p.items()))


def rank(grid: xr.Dataset, top: int) -> list[dict]:
    """The ``top`` fastest distinct feasible plans of a grid (equivalent spellings of one plan,
    :func:`canonical_plan`, count once)."""
    step = grid["step_time_s"].values
    ok = grid["fits"].values & np.isfinite(step)
    flat = np.flatnonzero(ok.ravel())
    if flat.size == 0:
        return []
    order = flat[np.argsort(step.ravel()[flat], kind="stable")]
    ranked = []
    seen = set()
    axes = grid_axes(grid)
    for index in order:
        if len(ranked) >= top:
            break
        idx = np.unravel_index(index, step.shape)
        plan = {name: grid[name].values[i].item() for name, i in zip(axes, idx)}
        plan["dp"] = int(grid["dp"].values[idx])
        for key in BOOLEAN_AXES:
            plan[key] = bool(plan[key])
        key = canonical_plan(plan)
        if key in seen:
            continue
        seen.add(key)
        ranked.append({
            "plan": plan,
            "step_time_s": float(step[idx]),
            "tokens_per_s": float(grid["tokens_per_s"].values[idx]),
            "mfu": float(grid["mfu"].values[idx]),
            "memory_gib_per_gpu": float(grid["memory_gib_per_gpu"].values[idx]),
            "power_W_per_gpu": float(grid["power_W_per_gpu"].values[idx]),
            "energy_J_per_token": float(grid["energy_J_per_token"].values[idx]),
        })
    return ranked


def grid_size(space: Mapping[str, Sequence]) -> int:
    return int(np.prod([len(v) for v in space.values()]))


def plan_from_grid_entry(entry: Mapping, global_batch: int) -> PlanSpec:
    p = dict(entry)
    return PlanSpec(tp=p["tp"], pp=p["pp"], dp=p["dp"], cp=p["cp"], interleave=p["interleave"],
                    micro_batch=p["micro_batch"], global_batch=global_batch, recompute=p["recompute"],
                    sequence_parallel=bool(p["sequence_parallel"]), zero=p["zero"],
                    shard_group=p.get("shard_group", 0), overlap_grad_reduce=bool(p["overlap_grad_reduce"]),
                    flash_attention=bool(p["flash_attention"]),
                    zero3_per_tensor=bool(p.get("zero3_per_tensor", False)), ep=int(p.get("ep", 1)),
                    etp=int(p.get(ETP_AXIS, 0)),
                    tp_comm_overlap=bool(p.get("tp_comm_overlap", False)) and bool(p["sequence_parallel"]),
                    stack=p.get("stack", DEFAULT_STACK), compiled=bool(p.get("compiled", False)),
                    grad_reduce_fp32=bool(p.get("grad_reduce_fp32", False)),
                    recompute_share=p.get("recompute_share"), rotary_kernel=p.get("rotary_kernel", ""),
                    tp_async_backward=p.get("tp_async_backward"),
                    first_stage_layers=int(p.get("first_stage_layers", 0)),
                    last_stage_layers=int(p.get("last_stage_layers", 0)),
                    embedding_in_split=bool(p.get("embedding_in_split", False)),
                    loss_in_split=bool(p.get("loss_in_split", False)),
                    precision=p.get("precision", "bf16"), fp8_recipe=p.get("fp8_recipe", ""),
                    moe_imbalance=float(p.get("moe_imbalance", 1.0)),
                    overlap_moe_expert_parallel_comm=bool(p.get("overlap_moe_expert_parallel_comm", False)),
                    moe_dispatcher=p.get("moe_dispatcher", "alltoall"),
                    recompute_modules=p.get("recompute_modules", ""),
                    cuda_graph_impl=p.get("cuda_graph_impl", "none"),
                    fused_grouped_mlp=bool(p.get("fused_grouped_mlp", False)))


