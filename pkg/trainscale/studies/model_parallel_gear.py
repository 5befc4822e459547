"""model-parallel-gear: parts of a model-parallel network updated at different rates (Dong et al., "Gear
Training", arXiv 1806.03925).

Gear training lets part ``p`` of a model-parallel network change only every ``k_p`` steps (its staleness
``k_p - 1``), instead of asynchronous SGD over the whole model, so that the parts whose synchronisation is
expensive synchronise less often. The paper publishes no numbers that could be found: every setting here is the
project's own, and the records give directions only.

Here (:mod:`trainscale.workloads.gear`): (1) a real run in Numba of a generated regression learnt by a 4-part tanh
network (documented in :func:`trainscale.workloads.gear.make_problem`; widths 16-32-32-16-1, 4,096 training and 1,024
held-out examples, mini-batches of 16), by synchronous SGD, gear training with several period vectors and
asynchronous SGD with several delays, all from the same start on the same mini-batches, the learning rate
swept; (2) the wall time per step of each method from the performance model (the same network deployed
``width_scale`` times wider, one GPU per part, replicated over data-parallel groups; compute by the GEMM model,
all-reduces by the ring collective on the catalog link or a swept slower one), and from it the loss each
method reaches in the wall time synchronous SGD needs for ``budget_steps`` steps.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xarray as xr

from ..common import comparison
from ..workloads import gear as G
from ..common import io as tsio
from ..common.checks import check_float, check_floats, check_int, check_ints
from ..common.io import provenance
from ..model.specs import SpecError, resolve_system

__all__ = ["PAPER", "OUTPUTS", "RESOURCES", "compare", "methods", "walltime_study", "training_study",
           "loss_at_budget", "FIGURES", "draw_convergence", "draw_equal_time", "draw_staleness"]

PAPER = "Dong et al., Gear Training (arXiv 1806.03925)"
OUTPUTS = ("training.nc", "walltime.nc", "convergence.png", "equal_time.png", "staleness.png")
RESOURCES = {"mem_mb": 1000, "runtime_quick_min": 1, "runtime_full_min": 2}
STUDY = "model-parallel-gear"
NO_NUMBERS = ("the paper publishes no numbers that could be found (STUDIES.md): the direction is the one its "
              "method is proposed for, the size cannot be compared and the setting is the project's own")
PAPER_SETTING = ("gear training (arXiv 1806.03925): parts of a model-parallel network updated at different "
                 "rates instead of asynchronous SGD over the whole model")


def _attrs(da, units, long_name):
    da.attrs.update({"units": units, "long_name": long_name})
    return da


def _periods(name, value, parts):
    k = check_ints(name, value, 1, 64, distinct=False)
    if len(k) != parts:
        raise SpecError(name, value, f"expected one period per part ({parts} parts)")
    return k


def methods(parts: int, gear_periods: Sequence[Sequence[int]], async_delays: Sequence[int]) -> list[dict]:
    """The runs: synchronous SGD, gear training with each period vector, asynchronous SGD with each delay."""
    if isinstance(gear_periods, (str, bytes)) or not gear_periods:
        raise SpecError("gear_periods", gear_periods, "expected a non-empty list of period vectors")
    out = [{"name": "synchronous", "periods": [1] * parts, "delays": [0] * parts, "kind": "synchronous"}]
    for k in gear_periods:
        k = _periods("gear_periods", k, parts)
        out.append({"name": "gear " + "-".join(map(str, k)), "periods": k, "delays": [0] * parts, "kind": "gear"})
    for tau in sorted(set(check_ints("async_delays", async_delays, 1, 1000))):
        out.append({"name": f"asynchronous tau={tau}", "periods": [1] * parts, "delays": [tau] * parts,
                    "kind": "asynchronous"})
    names = [m["name"] for m in out]
    if len(set(names)) != len(names):
        raise SpecError("gear_periods", gear_periods, "expected distinct period vectors")
    return out


def walltime_study(dims, gear_periods, system: str = "dgx-a100-80gb", width_scale: int = 256,
                   tokens: int = 8192, replicas: int = 16, bandwidths_GBps: Sequence[float] = (1.25,),
                   budget_steps: int = 1000) -> xr.Dataset:
    """Step time of every method at each bandwidth (the catalog system's own always included), the staleness
    asynchronous SGD has when its all-reduces overlap compute, and the wall-time budget (synchronous SGD's
    ``budget_steps`` steps)."""
    sysx = resolve_system(system)
    parts = len(dims) - 1
    bws = sorted({float(sysx.scale_out_GBps_per_gpu)} | set(check_floats("bandwidths_GBps", bandwidths_GBps, 0.0,
                                                                           1e4, open_min=True)))
    gears = [_periods("gear_periods", k, parts) for k in gear_periods]
    names = ["synchronous", *("gear " + "-".join(map(str, k)) for k in gears), "asynchronous"]
    step = np.zeros((len(bws), len(names)))
    ar = np.zeros((len(bws), parts))
    compute, delay = np.zeros(len(bws)), np.zeros(len(bws), dtype=np.int64)
    for b, bw in enumerate(bws):
        st = G.step_times(dims, width_scale, tokens, replicas, system, bw)
        compute[b], ar[b] = st["compute_s"], st["allreduce_s"]
        step[b, 0] = G.gear_step_s(compute[b], ar[b], [1] * parts)
        for g, k in enumerate(gears):
            step[b, 1 + g] = G.gear_step_s(compute[b], ar[b], k)
        step[b, -1], delay[b] = G.async_step_s(compute[b], ar[b])
    budget = check_int("budget_steps", budget_steps, 1, 10**6) * step[:, 0]
    ds = xr.Dataset({"step_s": (("bandwidth_GBps", "schedule"), step), "compute_s": (("bandwidth_GBps",), compute),
                     "allreduce_s": (("bandwidth_GBps", "part"), ar), "async_delay": (("bandwidth_GBps",), delay),
                     "budget_s": (("bandwidth_GBps",), budget),
                     "part_params": (("part",), G.step_times(dims, width_scale, tokens, replicas, system,
                                                             bws[0])["params"].astype(float))},
                    coords={"bandwidth_GBps": bws, "schedule": names, "part": np.arange(parts)})
    _attrs(ds["step_s"], "s", "mean wall time per step (gear: over a full cycle of its periods)")
    _attrs(ds["compute_s"], "s", "compute per step: the slowest part's forward and backward GEMMs")
    _attrs(ds["allreduce_s"], "s", "ring all-reduce of one part's gradient over the data-parallel replicas")
    _attrs(ds["async_delay"], "1", "staleness of asynchronous SGD: ceil(slowest all-reduce / compute), at least 1")
    _attrs(ds["budget_s"], "s", f"wall-time budget: synchronous SGD's {budget_steps} steps")
    _attrs(ds["part_params"], "1", "parameters of each part of the deployed network")
    _attrs(ds["bandwidth_GBps"], "GB/s", "scale-out bandwidth per GPU")
    ds["schedule"].attrs["long_name"] = "method (gear: its periods k_p per part)"
    _attrs(ds["part"], "1", "part of the model-parallel network (layer)")
    ds.attrs.update(provenance({"dims": list(dims), "gear_periods": gears, "system": system,
                                "width_scale": width_scale, "tokens": tokens, "replicas": replicas,
                                "bandwidths_GBps": bws, "catalog_bandwidth_GBps": float(sysx.scale_out_GBps_per_gpu),
                                "budget_steps": budget_steps, "bytes_per_value": 2}))
    return ds


def training_study(dims, runs: list[dict], lrs: Sequence[float], seeds: Sequence[int], steps: int, batch: int,
                   eval_every: int, n_train: int = 4096, n_eval: int = 1024, noise: float = 0.1,
                   problem_seed: int = 0) -> xr.Dataset:
    """Held-out loss every ``eval_every`` steps of every run (:func:`methods`), learning rate and seed (the
    seed draws the student's start and the mini-batches, the same for every method); a diverged run's loss is
    stored as it came (inf or NaN)."""
    lrs = sorted(check_floats("lrs", lrs, 0.0, 100.0, open_min=True))
    seeds = check_ints("seeds", seeds, 0, 2**31)
    steps = check_int("train_steps", steps, 1, 10**6)
    eval_every = check_int("eval_every", eval_every, 1, steps)
    prob = G.make_problem(dims, n_train, n_eval, noise, problem_seed)
    n_eval_pts = steps // eval_every + 1
    loss = np.zeros((len(lrs), len(runs), len(seeds), n_eval_pts))
    with np.errstate(over="ignore", invalid="ignore"):
        for e, seed in enumerate(seeds):
            theta0 = G.init_params(dims, seed + 1)
            batches = G.schedule(prob, steps, batch, seed)
            for a, lr in enumerate(lrs):
                for m, run in enumerate(runs):
                    loss[a, m, e] = G.train(prob, theta0, batches, lr, run["periods"], run["delays"], eval_every)["loss"]
    staleness = [max(k - 1 + t for k, t in zip(r["periods"], r["delays"])) for r in runs]
    ds = xr.Dataset({"loss": (("lr", "schedule", "seed", "step"), loss),
                     "periods": (("schedule", "part"), np.array([r["periods"] for r in runs], dtype=np.int64)),
                     "delays": (("schedule", "part"), np.array([r["delays"] for r in runs], dtype=np.int64)),
                     "max_staleness": (("schedule",), np.array(staleness, dtype=np.int64))},
                    coords={"lr": lrs, "schedule": [r["name"] for r in runs], "seed": seeds,
                            "step": np.arange(n_eval_pts) * eval_every, "part": np.arange(len(dims) - 1),
                            "kind": ("schedule", [r["kind"] for r in runs])})
    _attrs(ds["loss"], "1", "held-out mean-squared loss (1/2 mean squared error)")
    _attrs(ds["periods"], "1", "k_p: part p is updated every k_p steps")
    _attrs(ds["delays"], "1", "tau_p: part p's gradients are applied tau_p steps after they are computed")
    _attrs(ds["max_staleness"], "1", "oldest gradient applied, in steps: max_p (k_p - 1 + tau_p)")
    _attrs(ds["lr"], "1", "learning rate (the same for every method)")
    _attrs(ds["seed"], "1", "seed of the student's start and of the mini-batches")
    _attrs(ds["step"], "1", "training step (0: before the first)")
    _attrs(ds["part"], "1", "part of the model-parallel network (layer)")
    ds["schedule"].attrs["long_name"] = "synchronous SGD, gear training (periods), asynchronous SGD (delay)"
    ds["kind"].attrs["long_name"] = "kind of method"
    ds.attrs.update(provenance({"dims": list(dims), "lrs": lrs, "seeds": seeds, "train_steps": steps,
                                "batch": batch, "eval_every": eval_every, "n_train": n_train, "n_eval": n_eval,
                                "noise": noise, "problem_seed": problem_seed,
                                "parameters": int(G.part_offsets(dims)[-1])}))
    return ds


def required_steps(wt: xr.Dataset, eval_every: int) -> int:
    """Training steps every method needs to fill the largest wall-time budget, rounded up to a multiple of
    ``eval_every`` (the last evaluation must reach it)."""
    need = int(np.ceil(float((wt["budget_s"] / wt["step_s"]).max()) - 1e-9))
    every = check_int("eval_every", eval_every, 1, 10**6)
    return -(-need // every) * every


def _loss_at(curve: np.ndarray, steps: np.ndarray, at_step: float) -> float:
    """Loss after ``at_step`` steps (linear between evaluations); a diverged run counts as infinite loss."""
    if at_step > steps[-1]:
        return np.nan
    value = float(np.interp(at_step, steps, curve))
    return value if np.isfinite(value) else np.inf


def loss_at_budget(tr: xr.Dataset, wt: xr.Dataset) -> xr.Dataset:
    """Median over seeds of each schedule's held-out loss at the wall-time budget, per learning rate and
    bandwidth (asynchronous SGD at the staleness its overlap implies there; that run must be in ``tr``)."""
    steps = tr["step"].values.astype(float)
    out = np.full((tr.sizes["lr"], wt.sizes["bandwidth_GBps"], wt.sizes["schedule"]), np.nan)
    for b, bw in enumerate(wt["bandwidth_GBps"].values):
        for s, name in enumerate(wt["schedule"].values):
            run = f"asynchronous tau={int(wt['async_delay'][b])}" if name == "asynchronous" else str(name)
            if run not in tr["schedule"].values:
                raise SpecError("async_delays", tr["schedule"].values.tolist(),
                                f"expected a run named {run!r} (the staleness at {bw:g} GB/s)")
            n = float(wt["budget_s"][b] / wt["step_s"][b, s])
            for a in range(tr.sizes["lr"]):
                vals = [_loss_at(tr["loss"].sel(schedule=run).values[a, e], steps, n) for e in range(tr.sizes["seed"])]
                out[a, b, s] = float(np.median(vals))
    return xr.Dataset({"loss": (("lr", "bandwidth_GBps", "schedule"), out)},
                      coords={"lr": tr["lr"].values, "bandwidth_GBps": wt["bandwidth_GBps"].values,
                              "schedule": wt["schedule"].values})


# ---------------------------------------------------------------------------------------------
# paper vs ours


def _ratio(num: xr.DataArray, den: xr.DataArray) -> xr.DataArray:
    """num / den, 0 where den is infinite (a diverged run) and num finite."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (num / den).where(~(np.isinf(den) & np.isfinite(num)), 0.0)


def compare(folder) -> list[comparison.Record]:
    """Records from the saved training and wall-time datasets."""
    folder = Path(folder)
    tr = tsio.read_dataset(folder / "training.nc")
    wt = tsio.read_dataset(folder / "walltime.nc")
    p, q = json.loads(tr.attrs["parameters"]), json.loads(wt.attrs["parameters"])
    at = loss_at_budget(tr, wt)["loss"]
    bw = q["catalog_bandwidth_GBps"]
    lr_ref = float(np.median(tr["lr"].values))
    lr_ref = float(tr["lr"].values[np.argmin(np.abs(tr["lr"].values - lr_ref))])
    gears = [s for s in wt["schedule"].values if str(s).startswith("gear")]
    size = (f"a {'-'.join(map(str, p['dims']))} tanh network ({p['parameters']} parameters, one part per layer) on a "
            f"generated regression ({p['n_train']} training examples, batch {p['batch']}), seeds {p['seeds']}; wall "
            f"time: {q['width_scale']}x wider, one {q['system']} GPU per part, {q['replicas']} data-parallel replicas, "
            f"budget = synchronous SGD's {q['budget_steps']} steps")
    ref = f"{gears[0]}, lr {lr_ref:g}, {bw:g} GB/s (the catalog link)"
    gear_sync = _ratio(at.sel(schedule=gears), at.sel(schedule="synchronous"))
    gear_async = _ratio(at.sel(schedule=gears), at.sel(schedule="asynchronous"))
    # Gear synchronises fewer parts per step, so its throughput over synchronous SGD exceeds 1 by construction:
    # a test (tests/test_study_model_parallel_gear.py), not a record.
    sweep = "learning rate, bandwidth_GBps and gear periods"
    return [
        comparison.directional(
            STUDY, "held-out loss at equal wall time, gear / synchronous SGD", "1", paper_direction=-1,
            paper_setting=PAPER_SETTING + ": faster than synchronous SGD at little cost in convergence",
            our_value=float(gear_sync.sel(schedule=gears[0], lr=lr_ref, bandwidth_GBps=bw)), neutral=1.0,
            our_setting=f"{ref}; {size}", free_parameter=sweep, sweep=gear_sync.values.ravel(), note=NO_NUMBERS),
        comparison.directional(
            STUDY, "held-out loss at equal wall time, gear / asynchronous SGD", "1", paper_direction=-1,
            paper_setting=PAPER_SETTING + ": converging better than asynchronous SGD over the whole model",
            our_value=float(gear_async.sel(schedule=gears[0], lr=lr_ref, bandwidth_GBps=bw)), neutral=1.0,
            our_setting=f"{ref}; asynchronous SGD at the staleness its overlap implies; {size}", free_parameter=sweep,
            sweep=gear_async.values.ravel(),
            note="a diverged asynchronous run counts as infinite loss (ratio 0); " + NO_NUMBERS),
    ]


# ---------------------------------------------------------------------------------------------
# figures (drawn from the saved datasets alone; `trainscale verify` redraws and checks them)

#: a mean loss above this multiple of the largest initial loss is a diverged run: cut from there on
DIVERGED_FACTOR = 3.0
_LINESTYLE = {"synchronous": "-", "gear": "--", "asynchronous": ":"}


def _cut_diverged(curve: np.ndarray, ceiling: float) -> np.ndarray:
    """``curve`` with NaN from its first value above ``ceiling`` (or non-finite) on."""
    bad = ~np.isfinite(curve) | (curve > ceiling)
    return np.where(np.cumsum(bad) > 0, np.nan, curve)


def _cut_at(y: np.ndarray, x: np.ndarray):
    """Where a drawn curve was cut (its first NaN after a finite value, see :func:`_cut_diverged`), else None."""
    cut = np.flatnonzero(np.isnan(y))
    return x[cut[0]] if cut.size and np.isfinite(y[:cut[0]]).any() else None


def _diverged_note(ax, names: list[str], cut: list[str] = (), y: float = 0.97) -> None:
    """Name the runs that diverged in the panel: those not drawn at all and those whose curve ends where they
    diverge (``cut``: "name: cut from ... on" lines), so that no curve stops without a word."""
    lines = [f"{name}: not drawn" for name in names] + list(cut)
    if lines:
        ax.text(0.98, y, "diverged (loss > {:g}x start):\n".format(DIVERGED_FACTOR) + "\n".join(lines),
                transform=ax.transAxes, ha="right", va="top", fontsize=6.5, color="0.35",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1.5})


def draw_convergence(folder):
    """Held-out loss (mean over seeds) against steps, one panel per learning rate; runs cut where they diverge."""
    import matplotlib.pyplot as plt

    tr = tsio.read_dataset(Path(folder) / "training.nc")
    mean = tr["loss"].mean("seed")
    ceiling = DIVERGED_FACTOR * float(tr["loss"].isel(step=0).max())
    fig, axes = plt.subplots(1, tr.sizes["lr"], figsize=(4.2 * tr.sizes["lr"], 3.8), squeeze=False, sharey=True)
    for ax, lr in zip(axes[0], tr["lr"].values):
        diverged, cut = [], []
        for m, name in enumerate(tr["schedule"].values):
            y = _cut_diverged(mean.sel(lr=lr, schedule=name).values, ceiling)
            if np.isfinite(y).sum() < 2:
                diverged.append(str(name))
                continue
            if (at := _cut_at(y, tr["step"].values)) is not None:
                cut.append(f"{name}: cut from step {at:g} on")
            ax.semilogy(tr["step"].values, y, _LINESTYLE[str(tr["kind"].values[m])], color=f"C{m % 10}",
                        label=str(name))
        _diverged_note(ax, diverged, cut)
        ax.set_title(f"lr {lr:g}")
        ax.set_xlabel("step")
    axes[0, 0].set_ylabel("held-out loss (mean over seeds)")
    fig.legend(*_unique_handles(axes[0]), loc="outside right upper", fontsize=7)
    return fig


def _unique_handles(axes) -> tuple[list, list]:
    handles, labels = [], []
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    return handles, labels


def draw_equal_time(folder):
    """Each method's loss against its wall time at the middle learning rate, one panel per bandwidth (asynchronous
    SGD at the staleness its overlap implies there, named in the panel's own legend); dotted: the budget."""
    import matplotlib.pyplot as plt

    folder = Path(folder)
    tr, wt = tsio.read_dataset(folder / "training.nc"), tsio.read_dataset(folder / "walltime.nc")
    mean = tr["loss"].mean("seed")
    ceiling = DIVERGED_FACTOR * float(tr["loss"].isel(step=0).max())
    lr_mid = float(tr["lr"].values[len(tr["lr"]) // 2])
    n = wt.sizes["bandwidth_GBps"]
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), squeeze=False)
    for ax, bw in zip(axes[0], wt["bandwidth_GBps"].values):
        diverged, cut, budget = [], [], float(wt["budget_s"].sel(bandwidth_GBps=bw))
        for s, name in enumerate(wt["schedule"].values):
            run = f"asynchronous tau={int(wt['async_delay'].sel(bandwidth_GBps=bw))}" if name == "asynchronous" \
                else str(name)
            y = _cut_diverged(mean.sel(lr=lr_mid, schedule=run).values, ceiling)
            if np.isfinite(y).sum() < 2:
                diverged.append(run)
                continue
            t = tr["step"].values * float(wt["step_s"].sel(bandwidth_GBps=bw, schedule=name))
            shown = t <= 1.2 * budget
            if (at := _cut_at(y[shown], t[shown])) is not None:
                cut.append(f"{run}: cut from {at:.3g} s on")
            ax.semilogy(t[shown], y[shown], color=f"C{s}", label=run)
        ax.axvline(budget, color="0.4", ls=":", lw=1, label="budget")
        ax.set_xlim(0, 1.2 * budget)
        _diverged_note(ax, diverged, cut, y=0.62)  # below the legend
        ax.set_title(f"{bw:g} GB/s")
        ax.set_xlabel("wall time (s)")
        ax.legend(fontsize=6.5, loc="upper right")
    axes[0, 0].set_ylabel(f"held-out loss (lr {lr_mid:g})")
    return fig


def draw_staleness(folder):
    """The held-out loss after the budget's steps (median over seeds; a diverged run at the ceiling of
    ``DIVERGED_FACTOR`` times the initial loss) against the oldest gradient a method applies (gear: max k_p - 1;
    asynchronous: tau), one colour per learning rate; thin lines: synchronous SGD at each learning rate."""
    import matplotlib.pyplot as plt

    folder = Path(folder)
    tr, wt = tsio.read_dataset(folder / "training.nc"), tsio.read_dataset(folder / "walltime.nc")
    budget_steps = int(json.loads(wt.attrs["parameters"])["budget_steps"])
    eval_every = int(json.loads(tr.attrs["parameters"])["eval_every"])
    top = DIVERGED_FACTOR * float(tr["loss"].isel(step=0).max())
    at_steps = tr["loss"].sel(step=budget_steps // eval_every * eval_every).median("seed")
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(8.0, 3.6))
    synchronous = "synchronous (thin line, colour of its lr)"
    capped = False
    for a, lr in enumerate(tr["lr"].values):
        for kind, marker in (("gear", "s"), ("asynchronous", "o")):
            sel = tr["kind"].values == kind
            x = tr["max_staleness"].values[sel]
            loss = at_steps.sel(lr=lr).values[sel]
            capped |= bool((~np.isfinite(loss) | (loss > top)).any())
            y = np.minimum(loss, top)
            order = np.argsort(x)
            ax.plot(x[order], y[order], marker=marker, ls="-" if kind == "gear" else ":", color=f"C{a}",
                    label=f"{kind}, lr {lr:g}")
        ax.axhline(float(at_steps.sel(lr=lr, schedule="synchronous")), color=f"C{a}", lw=0.8, alpha=0.6,
                   label=synchronous)
    handles, labels = ax.get_legend_handles_labels()
    keep = [k for k, label in enumerate(labels) if label != synchronous]
    handles, labels = [handles[k] for k in keep], [labels[k] for k in keep]
    handles.append(Line2D([], [], color="0.4", lw=0.8, alpha=0.6))
    labels.append(synchronous)
    if capped:  # a diverged run is drawn at the ceiling, not at its loss
        handles.append(ax.axhline(top, color="0.3", ls="--", lw=0.8))
        labels.append(f"diverged (loss > {DIVERGED_FACTOR:g}x start): drawn here")
        handles[-1].set_label(labels[-1])
    ax.set_yscale("log")
    ax.set_xlabel("oldest gradient applied (steps)")
    ax.set_ylabel(f"held-out loss after {budget_steps} steps")
    ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside: no line under it
    return fig


#: the figures drawn from the saved datasets alone (file name -> function of the output folder)
FIGURES = {"convergence.png": draw_convergence, "equal_time.png": draw_equal_time, "staleness.png": draw_staleness}
