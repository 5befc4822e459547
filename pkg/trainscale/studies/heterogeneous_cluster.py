"""heterogeneous-cluster: a job planned over two accelerator types in a ratio (HETHUB-style)."""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np
import xarray as xr

from pathlib import Path

from ..common import comparison
from ..common import io as tsio
from ..common.io import provenance
from ..model.specs import SpecError, resolve_model

PAPER = "Xu et al., HETHUB: A Distributed Training System with Heterogeneous Cluster for Large-Scale Models (arXiv 2405.16256)"
OUTPUTS = ("mix.nc", "fraction_of_sum.png", "throughput.png", "layers_on_first.png")
RESOURCES = {"mem_mb": 2000, "runtime_quick_min": 10, "runtime_full_min": 30}
STUDY = "heterogeneous-cluster"
#: HETHUB's best fraction of the sum of the homogeneous throughputs (768 accelerators, Llama-140B)
PAPER_FRACTION = 0.9749
PAPER_SETTING = "768 accelerators of several types, a 140B-parameter Llama model (HETHUB)"

APPROACHES = ("mixed", "even-split", "first-alone", "second-alone")


def _mix_point(model, systems: Sequence[str], counts: tuple[int, int], bandwidth_GBps: float, global_batch: int,
               max_stages: int, link_latency_s: float) -> tuple[list[float], float, list[bool]]:
    """One mix: throughput of each approach, the share of layers on the first type and whether each part
    trains alone (an empty part counts as training alone, with 0)."""
    from ..model import hetero

    tput = [float("nan")] * len(APPROACHES)
    groups = [{"name": f"g{k}", "system": s, "nodes": n} for k, (s, n) in enumerate(zip(systems, counts)) if n > 0]
    links = [{"between": ["g0", "g1"], "bandwidth_GBps": float(bandwidth_GBps), "latency_s": float(link_latency_s)}] \
        if len(groups) == 2 else []
    cluster = hetero.Cluster.from_dict({"groups": groups, "links": links})
    p = hetero.problem(model, cluster, global_batch, max_stages=max_stages)
    best = hetero.plan(p)
    layers_first = float("nan")
    if best is not None:
        tput[0] = hetero.throughput_tokens_per_s(p, best)
        tput[1] = hetero.throughput_tokens_per_s(p, hetero.even_split_plan(p, best.dp, list(best.groups)))
        first = counts[0] > 0  # group 0 is the first type when it has nodes
        layers_first = sum(l for g, l in zip(best.groups, best.layers) if g == 0 and first) / model.layers
    trains = [True, True]
    for k in range(2):
        if counts[k] == 0:
            tput[2 + k] = 0.0
            continue
        part = hetero.Cluster.from_dict({"groups": [{"name": "g", "system": systems[k], "nodes": counts[k]}]})
        q = hetero.problem(model, part, global_batch, max_stages=max_stages)
        alone = hetero.plan(q)
        trains[k] = alone is not None
        tput[2 + k] = hetero.throughput_tokens_per_s(q, alone) if alone is not None else 0.0
    return tput, layers_first, trains


def heterogeneous_mix(model, systems: Sequence[str], total_nodes: int, fractions: Sequence[float],
                      bandwidth_GBps: Sequence[float], global_batch: int, max_stages: int = 8,
                      link_latency_s: float = 1e-5, reference_bandwidth_GBps: float | None = None) -> xr.Dataset:
    """HETHUB's question: a cluster of two accelerator types in a ratio; the planner's mixed-cluster
    throughput as a fraction of the sum of what each part achieves alone, by the share of nodes
    of the first type and the bandwidth between the types; with an even layer split over the same stages as the
    naive baseline.

    HETHUB's metric presumes that each homogeneous part trains the model on its own. A part that cannot hold the
    model trains nothing alone: the sum of the parts is then no reference (the mixed cluster would "exceed"
    it), so ``fraction_of_sum`` is NaN there (``alone_fits`` says which part); ``tokens_per_s`` keeps every value."""
    if len(systems) != 2:
        raise SpecError("systems", list(systems), "expected exactly two systems")
    bws = [float(b) for b in bandwidth_GBps]
    reference = bws[len(bws) // 2] if reference_bandwidth_GBps is None else float(reference_bandwidth_GBps)
    if reference not in bws:
        raise SpecError("reference_bandwidth_GBps", reference, f"expected one of bandwidth_GBps {bws}")
    model = resolve_model(model)
    tput = np.full((len(bws), len(fractions), len(APPROACHES)), np.nan)
    layers_first = np.full((len(bws), len(fractions)), np.nan)
    alone_fits = np.zeros((len(fractions), 2), dtype=bool)
    for i, f in enumerate(fractions):
        if not 0.0 <= float(f) <= 1.0:
            raise SpecError("fractions", f, "expected shares between 0 and 1")
        n0 = int(round(float(f) * total_nodes))
        for b, bw in enumerate(bws):
            tput[b, i], layers_first[b, i], trains = _mix_point(model, systems, (n0, total_nodes - n0), bw,
                                                                global_batch, max_stages, link_latency_s)
        alone_fits[i] = trains  # the parts alone do not use the link between the types
    # the sum of the parts is a reference only where every non-empty part trains on its own
    upper = np.where(alone_fits.all(axis=1), tput[..., 2] + tput[..., 3], np.nan)
    dims = ("bandwidth_GBps", "fraction")
    ds = xr.Dataset({
        "tokens_per_s": (dims + ("approach",), tput, {"units": "tokens/s", "long_name": "throughput"}),
        "fraction_of_sum": (dims, tput[..., 0] / upper,
                            {"units": "1", "long_name": "mixed throughput / sum of the parts alone (NaN: a part cannot train alone)"}),
        "even_fraction_of_sum": (dims, tput[..., 1] / upper,
                                 {"units": "1", "long_name": "even split / sum of the parts alone (NaN: a part cannot train alone)"}),
        "layers_on_first": (dims, layers_first,
                            {"units": "1", "long_name": "share of layers on the first accelerator type"}),
        "alone_fits": (("fraction", "part"), alone_fits,
                       {"units": "1", "long_name": "the part trains on its own (an empty part counts; else it adds 0 to the sum)"}),
    }, coords={"bandwidth_GBps": np.asarray(bws, dtype=float), "fraction": np.asarray(fractions, dtype=float),
               "approach": list(APPROACHES), "part": list(systems)})
    ds["bandwidth_GBps"].attrs.update({"units": "GB/s", "long_name": "link between a node of one type and one of the "
                                                                     "other, per direction"})
    ds["fraction"].attrs.update({"units": "1", "long_name": f"share of nodes that are {systems[0]}"})
    ds["approach"].attrs.update({"long_name": "plan: mixed (planner), even split, or one part alone"})
    ds["part"].attrs.update({"long_name": "accelerator type of the part"})
    ds.attrs.update(provenance({"model": model.name, "systems": list(systems), "total_nodes": int(total_nodes),
                                "fractions": [float(f) for f in fractions], "bandwidth_GBps": bws,
                                "reference_bandwidth_GBps": reference,
                                "global_batch": int(global_batch), "max_stages": int(max_stages)}))
    return ds


def _mixed(ds: xr.Dataset) -> np.ndarray:
    """Shares where the cluster is truly mixed and the sum of the parts is defined (each part trains alone)."""
    share = ds["fraction"].values
    return (share > 0) & (share < 1) & ds["alone_fits"].values.all(axis=1)


def compare(folder) -> list[comparison.Record]:
    """HETHUB's best fraction of the sum of the parts against ours (the best over the truly mixed shares where
    each part trains alone, at the reference bandwidth between the types; the range over those shares and every
    swept bandwidth recorded), and the planner's direction against an even layer split (the paper splits layers
    by speed and memory)."""
    ds = tsio.read_dataset(Path(folder) / "mix.nc")
    setting = json.loads(ds.attrs["parameters"])
    ref = setting["reference_bandwidth_GBps"]
    ours = (f"{setting['model']} on {setting['total_nodes']} nodes of {' + '.join(setting['systems'])}, "
            f"global batch {setting['global_batch']}, {ref:g} GB/s per node between the types")
    ok = _mixed(ds)
    frac = ds["fraction_of_sum"].values[:, ok]
    at_ref = ds["fraction_of_sum"].sel(bandwidth_GBps=ref).values[ok]
    best = float(at_ref.max()) if at_ref.size else float("nan")
    tput = ds["tokens_per_s"]
    gain = (tput.sel(approach="mixed") / tput.sel(approach="even-split")).values[:, ok]
    gain_ref = (tput.sel(approach="mixed") / tput.sel(approach="even-split")).sel(bandwidth_GBps=ref).values[ok]
    return [
        comparison.numeric(
            STUDY, "best mixed throughput / sum of the parts alone", "1", paper_value=PAPER_FRACTION,
            paper_setting=PAPER_SETTING, our_value=best, same_setting=False, neutral=float("nan"),
            our_setting=ours + "; best over the mixes where each part trains alone",
            free_parameter="share of nodes of the first type (mixes where each part trains alone) and bandwidth "
                           "between the types [GB/s]", sweep=frac.ravel(),
            note=(f"{int(ok.sum())} of {ds.sizes['fraction']} shares qualify; where a part cannot hold the model "
                  "alone the ratio is undefined (HETHUB's parts each train alone)")),
        comparison.directional(
            STUDY, "planner (layers by speed and memory) / even layer split, mean over mixes", "1",
            paper_direction=1, paper_setting=PAPER_SETTING + ": layers split in proportion to speed and memory",
            our_value=float(np.mean(gain_ref)) if gain_ref.size else float("nan"), our_setting=ours, neutral=1.0,
            free_parameter="share of nodes of the first type and bandwidth between the types [GB/s]",
            sweep=gain.ravel()),
    ]


# ---------------------------------------------------------------------------------------------
# figures (drawn from the saved dataset alone; `trainscale verify` redraws and checks them)

#: HETHUB's best fraction, as the figure's reference line says it
_HETHUB_TEXT = "HETHUB: 97.49% (768 accelerators, Llama-140B)"
#: how each approach is drawn: colour, line style, marker and the legend's words ({first}/{second}: the types)
_APPROACH_STYLES = {"mixed": ("C0", "-", "o", "mixed (planner)"), "even-split": ("C1", "--", "s", "even split"),
                    "first-alone": ("C2", "-.", "^", "{first} alone"),
                    "second-alone": ("C3", "-.", "v", "{second} alone")}


def system_label(system: str) -> str:
    """A catalog system's readable name for a legend or an axis: its accelerator (``dgx-v100`` ->
    ``V100-SXM2-32GB``); the key itself when the catalog does not know it."""
    from ..model.specs import resolve_system

    try:
        return str(resolve_system(system).accelerator)
    except SpecError:
        return system


def _figure_setting(folder):
    """The dataset at its reference bandwidth, the two types' readable names and the figures' title."""
    swept = tsio.read_dataset(Path(folder) / "mix.nc")
    setting = json.loads(swept.attrs["parameters"])
    ds = swept.sel(bandwidth_GBps=setting["reference_bandwidth_GBps"])
    first, second = (system_label(s) for s in setting["systems"])
    title = (f"{setting['model']}, {setting['total_nodes']} nodes ({first} + {second}),\n"
             f"{setting['reference_bandwidth_GBps']:g} GB/s per node between the types")
    return ds, first, second, title


def _percent_axes(ax, share, first, *, y=True):
    from matplotlib.ticker import FuncFormatter

    percent = FuncFormatter(lambda v, _: f"{100 * v:.4g}%")  # 12.5% stays 12.5%
    ax.xaxis.set_major_formatter(percent)
    if y:
        ax.yaxis.set_major_formatter(percent)
    ax.set(xlabel=f"share of nodes that are {first} [%]", xticks=share)
    ax.tick_params(axis="x", labelrotation=45 if len(share) > 6 else 0)


def draw_fraction_of_sum(folder):
    """The mixed cluster's and the even split's throughput over the sum of the parts alone, HETHUB's best for
    reference; shaded: the shares where a part cannot train alone (the ratio is undefined there)."""
    import matplotlib.pyplot as plt

    ds, first, _, title = _figure_setting(folder)
    share = ds["fraction"].values
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    ax.plot(share, ds["fraction_of_sum"], marker="o", color="C0", label="mixed (planner: layers by speed and memory)")
    ax.plot(share, ds["even_fraction_of_sum"], marker="s", linestyle="--", color="C1", label="even split of the layers")
    for k, s in enumerate(share[~np.isfinite(ds["fraction_of_sum"].values)]):
        ax.axvspan(s - 0.03, s + 0.03, color="0.85", lw=0, zorder=0,
                   label="a part cannot train alone (ratio undefined)" if k == 0 else None)
    ax.axhline(PAPER_FRACTION, color="0.3", linestyle=":", linewidth=1, label=_HETHUB_TEXT)
    _percent_axes(ax, share, first)
    ax.set(ylabel="throughput / sum of the parts alone [%]", title=title,
           ylim=(min(0.5, float(np.nanmin(ds["even_fraction_of_sum"])) - 0.05),
                 max(1.04, float(np.nanmax(ds["fraction_of_sum"])) + 0.05)))
    ax.legend(loc="lower left")
    return fig


def draw_throughput(folder):
    """Throughput of each approach (the mixed cluster, the even split, each part alone) and the sum of the parts
    alone, against the share of first-type nodes."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from ..common import plotting

    ds, first, second, title = _figure_setting(folder)
    share, tput = ds["fraction"].values, ds["tokens_per_s"]
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    for approach in ds["approach"].values.tolist():
        color, ls, marker, label = _APPROACH_STYLES.get(approach, ("0.5", "-", "o", approach))
        ax.plot(share, tput.sel(approach=approach), color=color, linestyle=ls, marker=marker,
                label=label.format(first=first, second=second))
    ax.plot(share, tput.sel(approach="first-alone") + tput.sel(approach="second-alone"), color="0.3", linestyle=":",
            marker=".", label="sum of the parts alone")
    _percent_axes(ax, share, first, y=False)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1e3:g}k"))
    ax.set(ylabel=plotting.label(tput), title=title, ylim=(0, None))
    ax.legend(loc="upper left")
    return fig


def draw_layers_on_first(folder):
    """The share of the layers the planner puts on the first type against its share of the nodes, with the
    diagonal of layers in proportion to nodes."""
    import matplotlib.pyplot as plt

    ds, first, _, title = _figure_setting(folder)
    share = ds["fraction"].values
    fig, ax = plt.subplots(figsize=(5.2, 5.0))
    ax.plot([0, 1], [0, 1], color="0.5", linestyle="--", linewidth=1, label="in proportion to the nodes")
    ax.plot(share, ds["layers_on_first"], marker="o", color="C0", label="planner")
    _percent_axes(ax, share, first)
    ax.set(ylabel=f"share of layers on {first} [%]", xlim=(-0.03, 1.03), ylim=(-0.03, 1.03), aspect="equal",
           title=title)
    ax.legend(loc="upper left")
    return fig


#: the figures drawn from the saved dataset alone (file name -> function of the output folder)
FIGURES = {"fraction_of_sum.png": draw_fraction_of_sum, "throughput.png": draw_throughput,
           "layers_on_first.png": draw_layers_on_first}
