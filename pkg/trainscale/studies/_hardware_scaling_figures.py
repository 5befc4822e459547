"""The hardware-scaling study's figures, each drawn from the saved datasets alone
(:data:`.hardware_scaling.FIGURES` maps the PNG files to these functions; ``trainscale verify`` redraws them from
the committed datasets). A private module (``_``) of :mod:`.hardware_scaling`, which imports the functions: not a
study of its own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ._hardware_scaling_paper import PAPER_SYSTEM
from ..common import io as tsio

__all__ = ["draw_throughput_per_gpu", "draw_mfu", "draw_total_throughput", "draw_energy_per_token",
           "draw_power_per_gpu", "draw_allreduce_busbw", "draw_published_scaling"]


def draw_published_scaling(folder):
    """One panel per published series: throughput per GPU relative to its smallest GPU count, measured (solid,
    dots) and predicted for the same published plans (dashed, crosses), against GPUs on a log2 axis."""
    import matplotlib.pyplot as plt

    ds = tsio.read_dataset(Path(folder) / "published_scaling.nc")
    names = list(dict.fromkeys(ds["series"].values.tolist()))
    cols = min(4, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.1 * cols, 2.6 * rows), squeeze=False)
    for ax, name in zip(axes.ravel(), names):
        sel = ds["series"].values == name
        gpus = ds["gpus"].values[sel]
        ax.plot(gpus, ds["measured_relative"].values[sel], "o-", color="#0072B2", label="measured")
        ax.plot(gpus, ds["predicted_relative"].values[sel], "x--", color="#D55E00", label="predicted")
        ax.axhline(1.0, color="0.6", lw=0.8, label="smallest count")
        ax.set_xscale("log", base=2)
        ax.set_xticks(gpus, [str(g) for g in gpus], fontsize=7)
        ax.minorticks_off()
        ax.set_title(name.replace(" (", "\n("), fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[len(names):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("per-GPU throughput\n/ at the smallest count", fontsize=8)
    for ax in axes[-1, :]:
        ax.set_xlabel("GPUs", fontsize=8)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle("published scaling curves: measured vs predicted for the published plans "
                 "(in-sample where the dataset is fitted)", fontsize=9)
    return fig


_LINESTYLES = ["-", "--", ":", "-."]


def _gpu_axis(ax, data) -> None:
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log", base=2)
    ax.set_xticks(data["gpus"].values, [str(int(g)) for g in data["gpus"].values])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.tick_params(axis="x", labelrotation=45 if data.sizes["gpus"] > 6 else 0)


def _scaling_figure(folder, var, *, scale=1.0, ylabel=None, logy=False, batch_row=False):
    """``var`` of hardware_scaling.nc against the GPU count: a panel per model, a colour per system, a line style
    per strategy; with ``batch_row``, a second row of FSDP on the paper's system at every batch of
    batch_sweep.nc."""
    import matplotlib.pyplot as plt

    from ..common import plotting

    data = tsio.read_dataset(Path(folder) / "hardware_scaling.nc")
    model_names = data["model"].values.tolist()
    system_names = data["system"].values.tolist()
    strategy_names = data["strategy"].values.tolist()
    rows = 2 if batch_row else 1
    fig, axes = plt.subplots(rows, len(model_names), figsize=(3.4 * len(model_names) + 1.6, 3.2 * rows),
                             squeeze=False)
    drawn = {}  # legend label -> a line drawn with it (each system and strategy once, whatever the panel)
    for ax, model in zip(axes[0], model_names):
        for i, system in enumerate(system_names):
            for j, strategy in enumerate(strategy_names):
                y = data[var].sel(model=model, system=system, strategy=strategy)
                if not np.isfinite(y.values).any():  # no plan of this strategy fits at any count: nothing to draw
                    continue
                label = f"{system}, {strategy}"
                drawn[label] = ax.plot(data["gpus"], y * scale, color=f"C{i}",
                                       linestyle=_LINESTYLES[j % len(_LINESTYLES)], marker="o", label=label)[0]
        _gpu_axis(ax, data)
        if logy:
            ax.set_yscale("log")
        ax.set(title=model, xlabel=plotting.label(data["gpus"], "GPUs"))
    axes[0, 0].set_ylabel(ylabel or plotting.label(data[var]))
    batch_handles = _batch_panels(folder, axes[1], var, scale) if batch_row else []
    # one entry per system and strategy drawn (colour: system, line style: strategy), in the grid's order
    handles = [drawn[f"{system}, {strategy}"] for system in system_names for strategy in strategy_names
               if f"{system}, {strategy}" in drawn]
    fig.legend(handles=handles, loc="outside right upper" if batch_row else "outside right center", fontsize=7)
    if batch_handles:
        fig.legend(handles=batch_handles, title="fixed global batch", loc="outside right lower")
    return fig


def _batch_panels(folder, axes, var, scale):
    """Second row: FSDP on the paper's system at every swept batch (a grey shade and marker per batch).
    Returns the legend handles; a batch without a plan at some GPU count says so in its label."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from ..common import plotting

    sweep = tsio.read_dataset(Path(folder) / "batch_sweep.nc")
    batches = sweep["global_batch_tokens"].values
    shades = plt.cm.Greys(np.linspace(0.45, 0.95, len(batches)))
    markers = ["o", "s", "^", "D", "v", "P"]
    fsdp = sweep[var].sel(system=PAPER_SYSTEM, strategy="fsdp")
    handles = []
    for k, (shade, b) in enumerate(zip(shades, batches)):
        size = 9 - 6 * k / max(len(batches) - 1, 1)  # larger markers behind smaller ones: overlaps stay visible
        missing = [int(g) for g in sweep["gpus"].values
                   if not np.isfinite(fsdp.sel(global_batch_tokens=b, gpus=g)).any()]
        label = f"{b / 2**20:g}M tokens" + (f" (no plan at {', '.join(map(str, missing))})" if missing else "")
        for ax, model in zip(axes, sweep["model"].values.tolist()):
            ax.plot(sweep["gpus"], fsdp.sel(model=model, global_batch_tokens=b) * scale, color=shade,
                    marker=markers[k % len(markers)], markersize=size, linestyle=_LINESTYLES[k % len(_LINESTYLES)])
        handles.append(Line2D([], [], color=shade, marker=markers[k % len(markers)], markersize=size,
                              linestyle=_LINESTYLES[k % len(_LINESTYLES)], label=label))
    for ax, model in zip(axes, sweep["model"].values.tolist()):
        _gpu_axis(ax, sweep)
        ax.set(title=f"{model}: fsdp on {PAPER_SYSTEM}", xlabel=plotting.label(sweep["gpus"], "GPUs"))
    axes[0].set_ylabel(plotting.label(sweep[var]))
    return handles


def draw_throughput_per_gpu(folder):
    """Throughput per GPU against GPUs per model, system and strategy at the fixed batch (top) and FSDP on the
    paper's system at every swept batch (bottom): falling lines are the diminishing returns."""
    return _scaling_figure(folder, "tokens_per_s_per_gpu", batch_row=True)


def draw_mfu(folder):
    """Model FLOP utilisation against GPUs per model, system and strategy at the fixed batch."""
    return _scaling_figure(folder, "mfu", scale=100, ylabel="MFU [%]")


def draw_total_throughput(folder):
    """Total throughput of the cluster against GPUs (log-log: a slope below 1 is sub-linear scaling)."""
    return _scaling_figure(folder, "tokens_per_s", logy=True)


def draw_energy_per_token(folder):
    """Energy per token of the GPUs against GPUs per model, system and strategy at the fixed batch."""
    return _scaling_figure(folder, "energy_J_per_token")


def draw_power_per_gpu(folder):
    """Accelerator power per GPU at the chosen plan against GPUs per model, system and strategy."""
    return _scaling_figure(folder, "power_W_per_gpu")


def _binary_bytes(x, _pos=None):
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if x >= size:
            return f"{x / size:g} {unit}"
    return f"{x:g} B"


def draw_allreduce_busbw(folder):
    """Ring all-reduce bus bandwidth against message size, one line per node count, one panel per system."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from ..common import plotting

    bw = tsio.read_dataset(Path(folder) / "allreduce_busbw.nc")
    system_names = bw["system"].values.tolist()
    node_counts = bw["nodes"].values.tolist()
    colors = plt.cm.viridis(np.linspace(0.0, 0.9, len(node_counts)))
    fig, axes = plt.subplots(1, len(system_names), figsize=(3.6 * len(system_names) + 1.4, 3.2), squeeze=False,
                             sharey=True)
    for ax, system in zip(axes[0], system_names):
        for color, n in zip(colors, node_counts):
            ax.plot(bw["message_bytes"], bw["busbw_GBps"].sel(system=system, nodes=n), color=color,
                    label=f"{n} node{'s' if n > 1 else ''}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(_binary_bytes))
        ax.tick_params(axis="x", labelrotation=45)
        ax.set(title=system, xlabel="message size")
    axes[0, 0].set_ylabel(plotting.label(bw["busbw_GBps"], "bus bandwidth"))
    # one legend for every panel (each draws the same node counts), right of the panels
    fig.legend(*axes[0, -1].get_legend_handles_labels(), loc="outside right upper")
    return fig
