"""The curtailment study's figures, each drawn from the saved datasets alone (:data:`.curtailment.FIGURES` maps
the PNG files to these functions; ``trainscale verify`` redraws them from the committed datasets). A private
module (``_``) of :mod:`.curtailment`, which imports the functions: not a study of its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ._curtailment_paper import PAPER_NUMBERS, PAPER_POLICY, paper_policy_run
from ..common import figurecheck
from ..common import io as tsio
from ..workloads import curtailment as C

__all__ = ["draw_paper_timeline", "draw_timeline", "draw_emissions", "draw_sweeps", "draw_averaging"]


_REGION_NAMES = {"CA": "California", "TX": "Texas", "SA": "South Australia", "DE": "Germany"}


def draw_paper_timeline(folder):
    """The paper's setting on its own trace (``paper.nc``): when each region is curtailed (shaded) and when each
    site trains (bar), the model's step at micro-batch 8 without round overhead, with our and the paper's end of
    training; a one-line note when the paper's trace was not on the machine."""
    import matplotlib.pyplot as plt

    paper = tsio.read_dataset(Path(folder) / "paper.nc")
    if "missing" in paper.attrs:
        fig = plt.figure(figsize=(6, 1.2))  # a note, no axes
        fig.text(0.5, 0.5, "the paper's trace is not on this machine: trainscale fetch-trace", ha="center",
                 va="center")
        return fig
    case = ("model, micro-batch 8" if "model, micro-batch 8" in paper["step_case"].values
            else str(paper["step_case"].values[0]))
    run = paper.sel(step_case=case, round_overhead_s=0.0)
    rows = list(paper["site"].values)
    fig, ax = plt.subplots(figsize=(8, 0.7 * len(rows) + 1.4))
    for k, site in enumerate(rows):
        below = paper["curtailed"].sel(trace_site=site).values.astype(bool)
        ax.fill_between(paper["slot"].values + 5 / 120, k - 0.4, k + 0.4, where=below, step="mid", color="C2",
                        alpha=0.25, lw=0, label="below 100 gCO2/kWh" if k == 0 else None)
        on = run["training"].sel(site=site).values.astype(bool)
        ax.fill_between(paper["minute"].values, k - 0.15, k + 0.15, where=on, step="post", color="C0", lw=0,
                        label="training" if k == 0 else None)
    end = float(run["elapsed_h"])
    ax.axvline(end, color="C3", ls="--", lw=1, label=f"ours done: {end:.1f} h")
    ax.axvline(PAPER_NUMBERS["multi_wall_h"], color="0.3", ls=":", lw=1,
               label=f"paper done: {PAPER_NUMBERS['multi_wall_h']:g} h")
    ax.set_yticks(range(len(rows)), [_REGION_NAMES.get(str(s), str(s)) for s in rows])
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlim(0, float(paper["slot"].values[-1]) + 5 / 60)
    ax.set_xlabel("hours since 2026-01-11 17:00 UTC (the paper's trace, mci.csv)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4, fontsize=8, frameon=False)
    ax.set_title(f"paper's setting, {case}: {float(run['emissions_kg']):.2f} kgCO2 (paper 1.38)", fontsize=9)
    return fig


def draw_timeline(folder):
    """The paper's policy (threshold 100, all sites, 600 s rounds) on the first trace seed and start hour: each
    site's intensity and when it trains, re-simulated from the saved traces and parameters (``traces.nc``,
    ``runs.nc``; the controller is deterministic)."""
    import matplotlib.pyplot as plt

    folder = Path(folder)
    runs = tsio.read_dataset(folder / "runs.nc")
    traces = tsio.read_dataset(folder / "traces.nc")
    p = json.loads(runs.attrs["parameters"])
    seed0, hour0 = int(runs["seed"].values[0]), int(runs["start_hour"].values[0])
    tr, r = paper_policy_run(traces, p, seed0, hour0)
    n = len(p["sites"])
    end_h = r["end_s"] / 3600 if np.isfinite(r["end_s"]) else 48.0
    horizon = min(48.0, max(24.0, end_h + 2))
    fig, axes = plt.subplots(n, 1, figsize=(8, 1.6 * n + 0.6), sharex=True, squeeze=False)
    hours = np.arange(tr.sizes["time"]) * C.SLOT_S / 3600
    polls = np.arange(r["states"].shape[1]) * p["poll_s"] / 3600
    for ax, (s, site) in zip(axes[:, 0], enumerate(p["sites"])):
        keep = hours <= horizon
        ax.plot(hours[keep], tr["intensity"].sel(site=site).values[keep], color="0.3", lw=0.8, label="intensity")
        ax.axhline(PAPER_POLICY["threshold"], color="C3", lw=0.8, ls="--", label="threshold")
        on = (r["states"][s] == 2) & (polls <= min(horizon, end_h))
        ax.fill_between(polls, 0, 1, where=on, transform=ax.get_xaxis_transform(), color="C2", alpha=0.3,
                        label="training")
        ax.set_ylabel(f"{site}\ngCO2/kWh")
    # one key over every site's panel (each draws the three)
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside upper right", fontsize=7, ncols=3)
    axes[-1, 0].set_xlabel(f"hours from the start ({hour0:02d}:00 UTC, seed {seed0})")
    axes[-1, 0].set_xlim(0, horizon)
    return fig


def draw_emissions(folder):
    """Emissions of the paper's policy against one site without pause in each region, over every trace seed and
    start hour (box: quartiles), with the paper's values (diamonds)."""
    import matplotlib.pyplot as plt

    folder = Path(folder)
    runs = tsio.read_dataset(folder / "runs.nc")
    base = tsio.read_dataset(folder / "baselines.nc")
    p = json.loads(runs.attrs["parameters"])
    point = runs.sel(threshold=100.0, sites=len(p["sites"]), round_s=600.0)
    labels = ["multi-site"] + [f"one site {r}" for r in base["region"].values]
    data = [point["emissions_kg"].values.ravel()] + [base["emissions_kg"].sel(region=r).values.ravel()
                                                     for r in base["region"].values]
    paper = [PAPER_NUMBERS["multi_emissions_kg"]] + [PAPER_NUMBERS["single_emissions_kg"].get(str(r), np.nan)
                                                     for r in base["region"].values]
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    boxes = ax.boxplot([d[np.isfinite(d)] for d in data], widths=0.5)
    ours = "ours: seeds x start hours (box: quartiles, line: median)"
    for part in boxes.values():
        for artist in part:
            artist.set_label(ours)
    ax.set_xticks(np.arange(1, len(labels) + 1), labels, rotation=20)
    (mark,) = ax.plot(np.arange(1, len(labels) + 1), paper, "D", color="C3", label="paper")
    ax.set_ylabel("emissions (kgCO2)")
    ax.legend(handles=[boxes["boxes"][0], mark])
    return fig


def draw_sweeps(folder):
    """Emissions and wall time around the paper's policy against the threshold, the number of sites and the
    round length (median over trace seeds and start hours, bars: the range)."""
    import matplotlib.pyplot as plt

    from ..common import plotting

    runs = tsio.read_dataset(Path(folder) / "runs.nc")
    p = json.loads(runs.attrs["parameters"])

    def stat(da):
        flat = da.stack(run=("start_hour", "seed"))
        return flat.median("run"), flat.min("run"), flat.max("run")

    paper_sel = {"threshold": 100.0, "sites": len(p["sites"]), "round_s": 600.0}
    # emissions on one scale across the row; wall time on each panel's own (one site waits days for its windows)
    fig, axes = plt.subplots(2, 3, figsize=(10, 5.4))
    for ax in axes[0, 1:]:
        ax.sharey(axes[0, 0])
        ax.tick_params(labelleft=False)
    for col, dim in enumerate(("threshold", "sites", "round_s")):
        others = {k: v for k, v in paper_sel.items() if k != dim and v in runs[k].values}
        if len(others) < 2:
            others = {k: runs[k].values[-1] for k in paper_sel if k != dim}
        sub = runs.sel(others)
        x = sub[dim].values
        for row, var in enumerate(("emissions_kg", "wall_time_h")):
            med, lo, hi = stat(sub[var])
            ax = axes[row, col]
            ax.errorbar(x, med, yerr=[med - lo, hi - med], marker="o", capsize=3)
            ax.set_xlabel(plotting.label(runs[dim]))
            if dim == "sites":
                ax.set_xticks(x)
            if col == 0:
                ax.set_ylabel({"emissions_kg": "emissions [kgCO2]", "wall_time_h": "wall time [h]"}[var])
    return fig


def draw_averaging(folder):
    """The final loss of the multi-site run (averaged every round) over one site taking the same steps in
    sequence, per batch size and condition number (median over trace seeds and start hours, bars: the range),
    with the paper's log-perplexity ratio."""
    import matplotlib.pyplot as plt

    from ..common import plotting

    avg = tsio.read_dataset(Path(folder) / "averaging.nc")
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for i, kappa in enumerate(avg["kappa"].values):
        flat = avg["loss_ratio"].sel(kappa=kappa).stack(run=("start_hour", "seed"))
        med, lo, hi = flat.median("run"), flat.min("run"), flat.max("run")
        x = np.arange(avg.sizes["batch_size"]) + (i - (avg.sizes["kappa"] - 1) / 2) * 0.12
        ax.errorbar(x, med, yerr=[med - lo, hi - med], marker="o", capsize=3, label=f"kappa {kappa:g}")
    figurecheck.guide(ax.axhline(1.0, color="0.3", lw=0.8))  # parity: the axis label says what 1 means
    ax.axhline(np.log(PAPER_NUMBERS["multi_perplexity"]) / np.log(PAPER_NUMBERS["single_perplexity"]),
               color="C3", ls="--", lw=1, label="paper (log perplexity ratio)")
    ax.set_xticks(np.arange(avg.sizes["batch_size"]), [str(int(b)) for b in avg["batch_size"].values])
    ax.set_xlabel(plotting.label(avg["batch_size"]))
    ax.set_ylabel("final loss, multi-site / one site")
    ax.legend(fontsize=8)
    return fig
