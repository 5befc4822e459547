r"""Scaling curves: the best plan at each GPU count of a fixed global batch, and what scale costs, by cause.

:func:`scaling_curve` runs :func:`trainscale.model.planner.search` at every GPU count (same stack rules and
options), prices its best plan with :func:`trainscale.model.perfmodel.predict` and returns, along ``gpus``,
throughput per GPU, MFU, step time, the plan, and the **loss by cause** along ``cause`` (the components of
:attr:`trainscale.model.perfmodel.Prediction.breakdown`, which add up to the step).

The loss is measured against linear scaling from the baseline, the smallest count with a plan (``g_0``):
there the per-GPU throughput is ``x_0``; at ``g`` GPUs the global batch would take
``s_0 g_0 / g`` if every component shrank as ``1/g``. What component ``k`` adds over that is

.. math:: \Delta_k(g) = t_k(g) - t_k(g_0)\,\frac{g_0}{g}, \qquad
          \sum_k \Delta_k(g) = s(g) - s(g_0)\,\frac{g_0}{g},

and ``\Delta_k / s(g)`` is the share of ``x_0`` lost to it: the shares add up to
``1 - x(g) / x_0``, one minus the scaling efficiency. A negative share is a component that shrank faster
than ``1/g`` (a pipeline bubble gone because the larger count runs without pipelining, say).

Each count's best plan also carries :mod:`trainscale.model.confidence`'s reading of how far it lies from what was
measured: ``left_out_error`` (the left-out MAPE of the dataset of the nearest measured run of the plan's stack and
generation), ``best_measured_mfu`` (the highest MFU measured on the generation) and ``above_best_measured`` (the
plan's predicted MFU above that by more than the error: an optimum no measurement supports).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np
import xarray as xr

from . import perfmodel

from . import planner
from ..common.checks import check_int, check_ints, parse_gpu_counts
from ..common.io import provenance
from ..kernels.layout import BREAKDOWN, BREAKDOWN_MOE
from .searchspace import space_values
from .specs import DEFAULT_STACK, RECOMPUTE_MODES, RunSpec, SpecError, resolve_model, resolve_system

__all__ = ["parse_gpus", "scaling_curve", "best_plan", "PLAN_KNOBS"]

MAX_GPUS = 2**40  # as the CLI's other GPU counts
#: the plan knobs stored along ``gpus`` (booleans as 0/1, recompute as its index in RECOMPUTE_MODES)
PLAN_KNOBS = ("tp", "pp", "dp", "cp", "ep", "interleave", "micro_batch", "recompute", "sequence_parallel", "zero",
              "shard_group", "overlap_grad_reduce", "flash_attention", "zero3_per_tensor", "tp_comm_overlap")
NO_PLAN = -1
FLOATS = {
    "step_time_s": ("s", "step time of the best plan"),
    "tokens_per_s": ("tokens/s", "cluster throughput of the best plan"),
    "tokens_per_s_per_gpu": ("tokens/s", "throughput per GPU of the best plan"),
    "mfu": ("1", "model FLOPs utilisation of the best plan"),
    "memory_gib_per_gpu": ("GiB", "memory of the most loaded GPU of the best plan"),
    "scaling_efficiency": ("1", "throughput per GPU relative to the baseline (the smallest count with a plan)"),
    "left_out_error": ("1", "left-out MAPE of the dataset of the measured run nearest the best plan "
                            "(same stack and generation; NaN: none)"),
    "best_measured_mfu": ("1", "highest MFU measured on the system's GPU generation (NaN: none)"),
}


def parse_gpus(text) -> list[int]:
    """GPU counts, ascending (:func:`trainscale.common.checks.parse_gpu_counts`, up to :data:`MAX_GPUS`)."""
    return parse_gpu_counts(text, "gpus", MAX_GPUS)


def _space_at(space, model, system, gpus: int, global_batch: int) -> dict:
    """The plan space searched at ``gpus``: ``space(gpus)`` if callable, the mapping itself, or the default."""
    if callable(space):
        return dict(space(gpus))
    return dict(space) if space is not None else perfmodel.default_space(model, system, gpus, global_batch)


def check_batch_splits(gpus: int, global_batch: int, space: Mapping) -> None:
    """Refuse a global batch that no data-parallel degree of ``gpus`` divides: ``dp = gpus / (tp pp cp)`` over
    the space's tp, pp and cp degrees (every plan of the space would be invalid)."""
    values = space_values(space)
    dps = sorted({gpus // (t * p * c) for t in values["tp"] for p in values["pp"] for c in values["cp"]
                  if gpus % (t * p * c) == 0}, reverse=True)
    if not any(global_batch % dp == 0 for dp in dps):
        valid = (f"a multiple of one of the data-parallel degrees the space's tp, pp, cp leave there "
                 f"({', '.join(map(str, dps[-6:]))})" if dps else f"none: no tp*pp*cp of the space divides {gpus}")
        raise SpecError("global_batch", global_batch, f"no data-parallel degree at {gpus} GPUs divides it; "
                        f"valid: {valid}")


def best_plan(model, system, gpus: int, global_batch: int, stack: str = DEFAULT_STACK, space: Mapping | None = None,
              calibration: Mapping | None = None, **options) -> tuple[dict, perfmodel.Prediction, dict] | None:
    """The best plan :func:`planner.search` finds at ``gpus`` (``options``: its keyword arguments), its
    :func:`perfmodel.predict` prediction and its confidence fields
    (:func:`trainscale.model.confidence.plan_confidence`), or None where no plan is valid and fits."""
    _, ranked = planner.search(model, system, gpus, global_batch, top=1, space=space, calibration=calibration,
                                 stack=stack, **options)
    if not ranked:
        return None
    plan = ranked[0]["plan"]
    run = RunSpec(id=f"scale-{gpus}", model=model, system=system,
                  plan=perfmodel.plan_from_grid_entry(plan, global_batch))
    allow = bool(options.get("allow_unrunnable", False))
    return plan, perfmodel.predict(run, calibration, allow_unrunnable=allow, warn=False), ranked[0]["confidence"]


def scaling_curve(model, system, gpus: Sequence[int], global_batch: int, stack: str = DEFAULT_STACK,
                  space: Mapping | Callable[[int], Mapping] | None = None, calibration: Mapping | None = None,
                  progress=None, **options) -> xr.Dataset:
    """The best plan at each GPU count for a fixed ``global_batch`` (sequences) and the loss by cause.

    ``space``: the plan space at every count (a mapping), a function of the count returning it, or None for
    :func:`perfmodel.default_space` at each count; ``stack``, ``calibration`` and ``options`` (``compiled``,
    ``grad_reduce_fp32``, ``recompute_share``, ``rotary_kernel``, ``tp_async_backward``, ``split_ends``,
    ``allow_unrunnable``) go to :func:`planner.search`. ``progress`` (optional) wraps the loop over counts.
    Returns a Dataset with dims ``gpus`` and ``cause`` (see the module docstring); a count without a plan has
    NaN numbers, plan knobs ``-1`` and ``has_plan`` false."""
    model, system = resolve_model(model), resolve_system(system)
    counts = sorted(check_ints("gpus", list(gpus), 1, MAX_GPUS))
    global_batch = check_int("global_batch", global_batch, 1)
    spaces = {g: _space_at(space, model, system, g, global_batch) for g in counts}
    for g in counts:
        check_batch_splits(g, global_batch, spaces[g])
    loop = progress(counts, len(counts), "scale") if progress else counts
    best = [best_plan(model, system, g, global_batch, stack, spaces[g], calibration, **options) for g in loop]
    causes = list(BREAKDOWN_MOE if model.is_moe else BREAKDOWN)
    ds = _dataset(counts, causes, best)
    ds.attrs.update({"model": model.name, "system": system.name, "global_batch": global_batch,
                     "seq_len": model.seq_len, "stack": stack, "baseline_gpus": _baseline(ds)})
    ds.attrs.update(provenance({"model": model.name, "system": system.name, "gpus": counts,
                                "global_batch": global_batch, "stack": stack, "calibration": dict(calibration or {}),
                                "options": dict(options),
                                "space": "default" if space is None else "given"}))
    return ds


def _baseline(ds: xr.Dataset) -> int:
    with_plan = ds["gpus"].values[ds["has_plan"].values]
    return int(with_plan[0]) if with_plan.size else NO_PLAN


def _knob(plan: Mapping, name: str) -> int:
    if name == "recompute":
        return RECOMPUTE_MODES.index(plan["recompute"])
    return int(plan.get(name, 1 if name == "ep" else 0))


def _dataset(counts: list[int], causes: list[str], best: list) -> xr.Dataset:
    n = len(counts)
    floats = {name: np.full(n, np.nan) for name in FLOATS}
    knobs = {name: np.full(n, NO_PLAN, dtype=np.int64) for name in PLAN_KNOBS}
    times = np.full((n, len(causes)), np.nan)
    above = np.zeros(n, dtype=bool)
    for i, (g, found) in enumerate(zip(counts, best)):
        if found is None:
            continue
        plan, p, conf = found
        floats["step_time_s"][i], floats["tokens_per_s"][i] = p.step_time_s, p.tokens_per_s
        floats["tokens_per_s_per_gpu"][i], floats["mfu"][i] = p.tokens_per_s / g, p.mfu
        floats["memory_gib_per_gpu"][i] = p.memory_gib_per_gpu
        times[i] = [p.breakdown[c] for c in causes]
        for name in PLAN_KNOBS:
            knobs[name][i] = _knob(plan, name)
        for name in ("left_out_error", "best_measured_mfu"):
            floats[name][i] = np.nan if conf.get(name) is None else float(conf[name])
        above[i] = bool(conf.get("above_best_measured"))
    has_plan = np.isfinite(floats["step_time_s"])
    added = np.full_like(times, np.nan)
    if has_plan.any():
        b = int(np.flatnonzero(has_plan)[0])
        ratio = counts[b] / np.asarray(counts, dtype=float)
        floats["scaling_efficiency"] = floats["tokens_per_s_per_gpu"] / floats["tokens_per_s_per_gpu"][b]
        added = times - times[b][None, :] * ratio[:, None]
    data = {name: ("gpus", arr, {"units": FLOATS[name][0], "long_name": FLOATS[name][1]})
            for name, arr in floats.items()}
    data["time_s"] = (("gpus", "cause"), times, {
        "units": "s", "long_name": "step time by cause (exposed on the critical stage; adds up to the step)"})
    data["added_time_s"] = (("gpus", "cause"), added, {
        "units": "s", "long_name": "step time each cause adds over linear scaling from the baseline: "
        "t(g) - t(baseline) * baseline / g"})
    data["throughput_loss"] = (("gpus", "cause"), added / floats["step_time_s"][:, None], {
        "units": "1", "long_name": "share of the baseline's throughput per GPU lost to each cause "
        "(adds up to 1 - scaling_efficiency)"})
    for name, arr in knobs.items():
        what = f"0-2: {', '.join(RECOMPUTE_MODES)}" if name == "recompute" else name.replace("_", " ")
        data[name] = ("gpus", arr, {"units": "1", "long_name": f"best plan: {what} (-1: no plan)"})
    data["above_best_measured"] = ("gpus", above, {
        "units": "1", "long_name": "the best plan's predicted MFU exceeds the generation's best measured MFU by "
        "more than left_out_error (false where either is unknown)"})
    data["has_plan"] = ("gpus", has_plan, {"units": "1", "long_name": "a plan is valid and fits in memory"})
    ds = xr.Dataset(data, coords={"gpus": np.asarray(counts, dtype=np.int64), "cause": causes})
    ds["gpus"].attrs.update({"units": "1", "long_name": "GPUs"})
    ds["cause"].attrs.update({"long_name": "component of the step time (Prediction.breakdown)"})
    return ds
