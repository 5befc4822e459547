r"""The planner's question: how many GPUs to train a token budget on, trading time against GPU-hours and energy.

For each cluster size :func:`cluster_front` takes the best plan :func:`trainscale.model.planner.search` finds that the
stack runs (its rules, ``data/stack_rules.yaml``, respected), re-prices it with :func:`~trainscale.model.perfmodel.predict`
and turns that plan's throughput and energy per token into what the whole budget of ``T`` tokens costs:

.. math:: t = T / r, \qquad \mathrm{GPU\,h} = N\,t / 3600, \qquad E = e\,T

with ``r`` the plan's predicted tokens/s, ``N`` the GPUs and ``e`` its predicted energy per token: the
accelerators' (``energy_J_per_token``, the calibrated power draw over the step) and, for ``energy_MWh``, the
accelerators plus each node's overhead power from ``systems.yaml`` (``node_overhead_W``; the model's
``node_energy_J_per_token``). The time is the token budget at the predicted throughput, in steps of the
global batch taken as continuous (the last partial step is not rounded up); nothing is added for start-up,
checkpoints or failures.

A size is on the **Pareto front** (``on_front``) of (time to train, GPU-hours, energy) when no other size is no
worse in all three and better in at least one (:func:`pareto_front`): the sizes a planner chooses among; the
rest cost more on every count than some other size.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping

import numpy as np
import xarray as xr

from ..common.checks import parse_gpu_counts
from .specs import DEFAULT_STACK, SpecError

__all__ = ["pareto_front", "parse_gpus", "parse_tokens", "cluster_front", "front_figure", "save_front_figure",
           "front_rows", "MAX_GPUS", "OBJECTIVES", "KNOBS"]

MAX_GPUS = 2**20  # a cluster size up to about a million GPUs
SECONDS_PER_DAY = 86400.0
J_PER_MWH = 3.6e9

# the front's three costs, all minimised
OBJECTIVES = ("time_to_train_days", "gpu_hours", "energy_MWh")

# the chosen plan's knobs kept per size: (name, units, long_name); all float (NaN where no plan fits)
KNOBS = (
    ("tp", "GPUs", "tensor-parallel degree"),
    ("pp", "GPUs", "pipeline-parallel degree (stages)"),
    ("dp", "GPUs", "data-parallel degree"),
    ("cp", "GPUs", "context-parallel degree"),
    ("ep", "ranks", "expert-parallel degree"),
    ("interleave", "chunks", "model chunks per pipeline device"),
    ("micro_batch", "sequences", "micro-batch"),
    ("zero", "1", "ZeRO stage (0-3)"),
    ("shard_group", "ranks", "data-parallel ranks sharing one copy of the sharded state (0: all of dp)"),
    ("sequence_parallel", "1", "sequence parallelism on (1) or not (0)"),
    ("overlap_grad_reduce", "1", "gradient reduction overlapped with the backward (1) or not (0)"),
    ("flash_attention", "1", "fused attention (1) or not (0)"),
    ("tp_comm_overlap", "1", "tensor-parallel communication overlapped with the GEMMs (1) or not (0)"),
    ("zero3_per_tensor", "1", "ZeRO-3 fetches each weight matrix apart (1) or not (0)"),
)


# --------------------------------------------------------------------------- Pareto front
def pareto_front(points) -> np.ndarray:
    """Which rows of ``points`` (``n x k``, every column a cost to minimise) are on the Pareto front.

    Row ``i`` is on the front when no other row ``j`` dominates it: ``j`` no worse in every column and
    strictly better in at least one. Equal rows do not dominate each other (both on the front, or neither).
    A row with a NaN is never on the front and dominates nothing. Returns a boolean array of length ``n``."""
    pts = np.asarray(points, dtype=np.float64)
    if pts.ndim == 1:
        pts = pts[:, None]
    if pts.ndim != 2:
        raise SpecError("points", pts.shape, "expected an n x k array of costs")
    valid = ~np.isnan(pts).any(axis=1)
    p = pts[valid]
    # dominated[i]: some j with p[j] <= p[i] everywhere and p[j] < p[i] somewhere
    no_worse = (p[:, None, :] <= p[None, :, :]).all(axis=2)  # [j, i]
    better = (p[:, None, :] < p[None, :, :]).any(axis=2)
    dominated = (no_worse & better).any(axis=0)
    out = np.zeros(len(pts), dtype=bool)
    out[np.flatnonzero(valid)] = ~dominated
    return out


# --------------------------------------------------------------------------- input
def parse_gpus(value, name: str = "gpus") -> list[int]:
    """Cluster sizes, ascending (:func:`trainscale.common.checks.parse_gpu_counts`, up to :data:`MAX_GPUS`)."""
    return parse_gpu_counts(value, name, MAX_GPUS)


def parse_tokens(value, name: str = "tokens") -> float:
    """A positive finite token budget (text such as ``"1e12"`` accepted)."""
    valid, given = "expected a positive finite number of tokens, e.g. 1e12", value
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise SpecError(name, given, valid) from None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or value <= 0:
        raise SpecError(name, given, valid)
    return float(value)


# --------------------------------------------------------------------------- the sizes
def _no_plan_reason(summary: xr.Dataset, stack: str, gpus: int, global_batch: int) -> str:
    """Why a size has no plan, from the search's summary (plans counted by reason)."""
    from ..kernels import layout as K

    plans = summary["plans"]
    unrunnable = int(plans.sel(reason=K.REASONS[K.R_STACK_RULE]))
    memory = int(plans.sel(reason=K.REASONS[K.R_MEMORY]))
    if unrunnable:
        return (f"no plan the {stack} stack runs fits in memory (its rules refuse {unrunnable} more)" if memory else
                f"the {stack} stack runs none of the {unrunnable} valid plans (data/stack_rules.yaml)")
    if memory:
        return "no plan fits in memory"
    counts = sorted(((int(n), str(r)) for r, n in zip(plans["reason"].values, plans.values) if n > 0),
                    key=lambda c: -c[0])
    why = counts[0][1] if counts else "the space is empty"
    return f"no valid plan for {gpus} GPUs and a global batch of {global_batch}: mostly {why}"


def cluster_front(model, system, gpus, tokens, global_batch: int, stack: str = DEFAULT_STACK,
                  calibration: Mapping | None = None,
                  progress: Callable[[Iterable, int, str], Iterable] | None = None) -> xr.Dataset:
    """Across cluster sizes ``gpus``, each size's best runnable plan and what training ``tokens`` tokens on it costs.

    ``model`` and ``system``: catalog names, mappings or specs; ``gpus``: sizes (:func:`parse_gpus`: a list or
    ``"256..8192"``); ``tokens``: the token budget; ``global_batch``: sequences per optimizer step (the same at
    every size); ``stack``: the software that runs the plans (its rules respected); ``calibration``: parameter
    overrides, as :func:`trainscale.model.planner.search` takes them; ``progress``: wraps the loop over sizes.

    Returns a Dataset on dim ``gpus``: ``time_to_train_days``, ``gpu_hours``, ``energy_MWh`` (accelerators and
    node overhead), ``accelerator_energy_MWh``, the plan's ``step_time_s``, ``tokens_per_s``, ``mfu``,
    ``power_W_per_gpu``, ``memory_gib_per_gpu``, its knobs (:data:`KNOBS`, and ``recompute``), ``has_plan``,
    ``on_front`` (the Pareto front over :data:`OBJECTIVES`) and ``reason`` (why a size has no plan). Every
    number is NaN where no plan fits."""
    from . import perfmodel
    from . import planner
    from .specs import RunSpec, resolve_model, resolve_system
    from .stackrules import broken_rules

    model = resolve_model(model, where="model")
    system = resolve_system(system, where="system")
    sizes = parse_gpus(gpus)
    tokens = parse_tokens(tokens)
    if isinstance(global_batch, (bool, np.bool_)) or not isinstance(global_batch, (int, np.integer)) \
            or not 1 <= global_batch <= 2**40:
        raise SpecError("global_batch", global_batch, "expected a positive integer number of sequences (at most 2^40)")
    global_batch = int(global_batch)
    perfmodel.calibration_parameters(system.generation, calibration, stack)  # a bad stack: one line, before searching

    n = len(sizes)
    num = {name: np.full(n, np.nan) for name in
           ("step_time_s", "tokens_per_s", "mfu", "power_W_per_gpu", "memory_gib_per_gpu",
            "energy_J_per_token", "node_energy_J_per_token") + tuple(k for k, _, _ in KNOBS)}
    recompute = [""] * n
    reasons = [""] * n
    loop = progress(list(enumerate(sizes)), n, "cluster sizes") if progress else enumerate(sizes)
    for i, size in loop:
        summary, ranked = planner.search(model, system, size, global_batch, top=1, stack=stack,
                                           calibration=calibration)
        if not ranked:
            reasons[i] = _no_plan_reason(summary, stack, size, global_batch)
            continue
        entry = dict(ranked[0]["plan"])
        plan = perfmodel.plan_from_grid_entry(entry, global_batch)
        broken = broken_rules(plan, system)
        if broken:  # never: search masks what the stack refuses
            raise AssertionError(f"{size} GPUs: the search chose a plan the {stack} stack refuses ({broken[0].id})")
        p = perfmodel.predict(RunSpec(id=f"{size}-gpus", model=model, system=system, plan=plan), calibration,
                              warn=False)
        if not p.fits:
            reasons[i] = f"the chosen plan does not fit when re-priced: {p.reason}"
            continue
        for name in ("step_time_s", "tokens_per_s", "mfu", "power_W_per_gpu", "memory_gib_per_gpu",
                     "energy_J_per_token", "node_energy_J_per_token"):
            num[name][i] = getattr(p, name)
        for name, _, _ in KNOBS:
            num[name][i] = float(getattr(plan, name))
        recompute[i] = plan.recompute

    g = np.asarray(sizes, dtype=np.int64)
    time_s = tokens / num["tokens_per_s"]
    costs = {
        "time_to_train_days": time_s / SECONDS_PER_DAY,
        "gpu_hours": g * time_s / 3600.0,
        "energy_MWh": num["node_energy_J_per_token"] * tokens / J_PER_MWH,
    }
    has_plan = np.isfinite(num["tokens_per_s"])
    on_front = pareto_front(np.column_stack([costs[name] for name in OBJECTIVES]))

    def var(data, units, long_name):
        return ("gpus", data, {"units": units, "long_name": long_name})

    data = {
        "time_to_train_days": var(costs["time_to_train_days"], "days",
                                  "time to train the token budget at the plan's predicted throughput"),
        "gpu_hours": var(costs["gpu_hours"], "GPU h", "GPU-hours to train the token budget"),
        "energy_MWh": var(costs["energy_MWh"], "MWh",
                          "energy to train the token budget: accelerators and node overhead"),
        "accelerator_energy_MWh": var(num["energy_J_per_token"] * tokens / J_PER_MWH, "MWh",
                                      "energy of the accelerators alone to train the token budget"),
        "on_front": var(on_front, "1", "on the Pareto front of time, GPU-hours and energy (1) or not (0)"),
        "has_plan": var(has_plan, "1", "a runnable plan fits (1) or not (0)"),
        "step_time_s": var(num["step_time_s"], "s", "step time of the plan"),
        "tokens_per_s": var(num["tokens_per_s"], "tokens/s", "cluster throughput of the plan"),
        "mfu": var(num["mfu"], "1", "model FLOPs utilisation of the plan"),
        "power_W_per_gpu": var(num["power_W_per_gpu"], "W", "accelerator power of the plan"),
        "memory_gib_per_gpu": var(num["memory_gib_per_gpu"], "GiB", "memory of the plan's most loaded GPU"),
    }
    for name, units, long_name in KNOBS:
        data[name] = var(num[name], units, f"plan: {long_name}")
    data["recompute"] = ("gpus", np.array(recompute, dtype=object),
                         {"long_name": "plan: activation recomputation (none, selective, full; empty: no plan)"})
    data["reason"] = ("gpus", np.array(reasons, dtype=object), {"long_name": "why no plan fits (empty: one does)"})
    ds = xr.Dataset(data, coords={"gpus": ("gpus", g, {"units": "GPUs", "long_name": "GPUs in the cluster"})})
    ds.attrs.update({
        "model": model.name, "system": system.name, "stack": stack, "tokens": float(tokens),
        "global_batch": global_batch, "seq_len": int(model.seq_len),
        "tokens_per_step": int(global_batch * model.seq_len),
        "front": "Pareto front over " + ", ".join(OBJECTIVES) + ": no other size is no worse in all three and "
                 "better in one",
        "energy": "energy_MWh: the plan's node_energy_J_per_token (accelerator power from the calibrated model plus "
                  "systems.yaml node_overhead_W per node) times the tokens; accelerator_energy_MWh: "
                  "energy_J_per_token times the tokens",
        "time": "tokens / tokens_per_s of the best runnable plan (planner.search, re-priced by predict); "
                "no start-up, checkpoint or failure time",
    })
    return ds


# --------------------------------------------------------------------------- presentation
def front_rows(ds: xr.Dataset) -> list[dict]:
    """One row per size for a table or JSON: front mark, GPUs, the plan's knobs and the costs."""
    rows = []
    moe = bool(np.nanmax(ds["ep"].values, initial=1.0) > 1) if ds["has_plan"].values.any() else False
    for i, size in enumerate(ds["gpus"].values.tolist()):
        has = bool(ds["has_plan"].values[i])
        row = {"front": "*" if bool(ds["on_front"].values[i]) else "", "gpus": int(size)}
        for name in ("tp", "pp", "dp", "cp") + (("ep",) if moe else ()) + ("interleave", "micro_batch", "zero"):
            value = float(ds[name].values[i])
            row[name] = int(value) if has else math.nan
        row["recompute"] = str(ds["recompute"].values[i]) if has else "-"
        row.update({"step_s": float(ds["step_time_s"].values[i]), "MFU": float(ds["mfu"].values[i]),
                    "days": float(ds["time_to_train_days"].values[i]), "GPU_h": float(ds["gpu_hours"].values[i]),
                    "MWh": float(ds["energy_MWh"].values[i])})
        if not has:
            row["reason"] = str(ds["reason"].values[i])
        rows.append(row)
    return rows


def front_figure(ds: xr.Dataset):
    """Time to train against GPU-hours, one point per size coloured and labelled by its GPUs (with its energy),
    the Pareto front's sizes joined in order of GPU-hours."""
    import matplotlib as mpl
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedFormatter, FixedLocator, LogFormatter, NullLocator

    from ..common.plotting import STYLE

    has = ds["has_plan"].values.astype(bool)
    sub = ds.isel(gpus=np.flatnonzero(has))
    with mpl.rc_context(STYLE):
        fig = Figure(figsize=(6.0, 4.2))  # not pyplot's: no backend, no global figure state
        ax = fig.add_subplot()
        x, y = sub["gpu_hours"].values, sub["time_to_train_days"].values
        g = sub["gpus"].values
        if len(g):
            front = sub["on_front"].values.astype(bool)
            order = np.argsort(x[front], kind="stable")
            ax.plot(x[front][order], y[front][order], color="#555555", lw=1.0, zorder=1)
            norm = LogNorm(vmin=float(g.min()), vmax=float(max(g.max(), g.min() * 2)))
            points = ax.scatter(x, y, c=g, cmap="viridis", norm=norm, s=36, zorder=2, edgecolors="black",
                                linewidths=np.where(front, 1.2, 0.0))
            for xi, yi, gi, ei, fi in zip(x, y, g, sub["energy_MWh"].values, front):
                ax.annotate(f"{int(gi)}{'*' if fi else ''}\n{ei:.3g} MWh", (xi, yi), textcoords="offset points",
                            xytext=(5, 3), fontsize=7)
            bar = fig.colorbar(points, ax=ax, label="GPUs")
            bar.ax.yaxis.set_major_locator(FixedLocator([float(v) for v in g]))
            bar.ax.yaxis.set_major_formatter(FixedFormatter([str(int(v)) for v in g]))
            bar.ax.yaxis.set_minor_locator(NullLocator())
            ax.set_yscale("log")  # sizes double: time halves, GPU-hours move little
            for axis_formatter in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
                axis_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
            ax.margins(x=0.15, y=0.15)
        else:
            ax.text(0.5, 0.5, "no cluster size has a plan that fits", ha="center", va="center",
                    transform=ax.transAxes)
        ax.set_xlabel(f"GPU-hours to train [{ds['gpu_hours'].attrs['units']}]")
        ax.set_ylabel(f"time to train [{ds['time_to_train_days'].attrs['units']}]")
        missing = [int(v) for v in ds["gpus"].values[~has]]
        note = f"; no plan on {', '.join(map(str, missing))} GPUs" if missing else ""
        ax.set_title(f"{ds.attrs['model']} on {ds.attrs['system']} ({ds.attrs['stack']}), "
                     f"{ds.attrs['tokens']:.3g} tokens{note}\n"
                     "* and line: the Pareto front of time, GPU-hours and energy",
                     fontsize=9)
    return fig


def save_front_figure(ds: xr.Dataset, path) -> "object":
    """Draw :func:`front_figure` and save it with :func:`trainscale.common.io.save_figure` (to a temporary name, moved into
    place; no ``Software`` metadata, so a rerun writes identical bytes). Returns the path."""
    from ..common import io as tsio

    return tsio.save_figure(front_figure(ds), path)
