"""Weak scaling on a 2D mesh of chiplets: 1D tensor parallelism vs Hecaton's 2D scheme.

Huang et al., "Hecaton: Training and Finetuning LLMs with Scalable Chiplet Systems" (arXiv
2407.05784) train a transformer on an ``n x n`` mesh of chiplets with weights partitioned on the
2D grid and collectives along mesh rows and columns, so that the communication per chiplet
shrinks like ``1/sqrt(N)`` of the problem while the compute shrinks like ``1/N``. Under weak
scaling (model width grown with the mesh side, see :func:`trainscale.workloads.chiplet.weak_scaled_model`)
the compute/communication ratio of the 2D scheme stays nearly constant while that of Megatron's
1D tensor parallelism (an all-reduce of the whole activation over a ring through all ``N``
chiplets) falls like ``1/sqrt(N)``. They report 4.98x performance and 2.35x energy reduction
against Megatron TP on Llama2-70B.

:func:`chiplet_scaling` evaluates both schemes for every chiplet package and mesh side through the
model API (:func:`trainscale.workloads.chiplet.step_costs_grid`, which documents the formulas) and returns the Dataset the study's figures are drawn from.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from collections.abc import Sequence

import numpy as np
import xarray as xr

from ..workloads import chiplet as C
from ..common import comparison, figurecheck
from ..common import io as tsio
from ..common.checks import check_int
from ..common.io import provenance
from ..model.specs import SpecError, resolve_model

__all__ = ["chiplet_scaling", "compare", "PAPER", "OUTPUTS", "RESOURCES", "FIGURES"]

PAPER = "Huang et al., Hecaton: Training and Finetuning LLMs with Scalable Chiplet Systems (arXiv 2407.05784)"
OUTPUTS = ("chiplet_scaling.nc", "compute_comm_ratio.png", "throughput.png", "energy.png", "gain.png",
           "step_breakdown.png")
RESOURCES = {"mem_mb": 2000, "runtime_quick_min": 10, "runtime_full_min": 20}
STUDY = "chiplet-scaling"
#: Hecaton's abstract: 4.98x performance and 2.35x energy reduction against Megatron TP on Llama2-70B
PAPER_SPEEDUP, PAPER_ENERGY_REDUCTION = 4.98, 2.35
PAPER_SETTING = "Llama2-70B on Hecaton's chiplet packages, 2D scheme vs Megatron 1D TP (Huang et al.)"

_META = {  # variable: (units, long_name)
    "compute_s": ("s", "compute time per step (FLOPs / achievable FLOP/s)"),
    "dram_s": ("s", "DRAM transfer time per step (bytes / DRAM bandwidth)"),
    "local_s": ("s", "local time per step (roofline: max of compute and DRAM, per GEMM)"),
    "comm_s": ("s", "mesh communication time per step"),
    "step_s": ("s", "step time (local + communication)"),
    "flops_per_chiplet": ("FLOP", "FLOPs per chiplet per step"),
    "dram_bytes_per_chiplet": ("B", "DRAM bytes per chiplet per step"),
    "comm_bytes_per_chiplet": ("B", "bytes each chiplet sends per step"),
    "link_byte_hops": ("B", "bytes times links crossed, whole mesh, per step"),
    "activation_bytes_per_chiplet": ("B", "stored GEMM inputs per chiplet (for the weight gradients)"),
    "weight_bytes_per_chiplet": ("B", "weight bytes per chiplet"),
    "energy_compute_J": ("J", "compute energy per step, whole mesh"),
    "energy_dram_J": ("J", "DRAM energy per step, whole mesh"),
    "energy_link_J": ("J", "die-to-die link energy per step, whole mesh"),
    "energy_static_J": ("J", "static energy per step, whole mesh"),
    "energy_J": ("J", "energy per step, whole mesh"),
}


def chiplet_scaling(model: str = "llama2-70b", chiplets: Sequence[str] = ("hecaton-standard",),
                    mesh_sides: Sequence[int] = (2, 4, 8, 16), reference_side: int = 16,
                    tokens_per_step: int = 131072) -> xr.Dataset:
    """Both schemes on every chiplet package and mesh side, the model weakly scaled.

    ``model`` runs at its catalog shape on the ``reference_side x reference_side`` mesh; a mesh of
    side ``n`` runs it with every width times ``n / reference_side``. ``tokens_per_step`` stays
    fixed and must hold a multiple of each mesh side in whole sequences (the 2D scheme computes
    attention on whole sequences).
    """
    spec = resolve_model(model)
    if isinstance(chiplets, (str, bytes)) or len(chiplets) == 0:
        raise SpecError("chiplets", chiplets, "expected a non-empty list of catalog chiplet names")
    hws = [C.resolve_chiplet(c) for c in chiplets]
    if len(set(chiplets)) != len(chiplets):
        raise SpecError("chiplets", list(chiplets), "expected distinct names")
    if isinstance(mesh_sides, (str, bytes)) or len(mesh_sides) == 0:
        raise SpecError("mesh_sides", mesh_sides, "expected a non-empty list of integers >= 1")
    sides = [check_int("mesh_sides", s, 2, 64) for s in mesh_sides]
    if any(b <= a for a, b in itertools.pairwise(sides)):
        raise SpecError("mesh_sides", list(mesh_sides), "expected strictly increasing sides")
    reference_side = check_int("reference_side", reference_side, 1, 64)
    tokens = check_int("tokens_per_step", tokens_per_step, 1)
    shapes = [C.weak_scaled_model(spec, s, reference_side, tokens) for s in sides]
    for shape, s in zip(shapes, sides):
        C.check_attention_local(shape, s)

    side_arr = np.asarray(sides, dtype=np.int64)
    grids = [C.step_costs_grid(side_arr, shapes, hw) for hw in hws]
    costs = {name: np.stack([g[name] for g in grids]) for name in C.COST_FIELDS}

    dims = ("chiplet", "scheme", "side")
    data = {}
    for name in C.COST_FIELDS:
        units, long_name = _META[name]
        data[name] = (dims, costs[name], {"units": units, "long_name": long_name})
    n_chiplets = side_arr**2
    step = costs["step_s"]
    flops_total = costs["flops_per_chiplet"] * n_chiplets
    peak = np.array([hw.peak_flops for hw in hws])[:, None, None]
    data["compute_comm_ratio"] = (dims, costs["compute_s"] / costs["comm_s"],
                                  {"units": "1", "long_name": "compute / communication time"})
    data["tokens_per_s"] = (dims, tokens / step, {"units": "tokens/s", "long_name": "throughput"})
    data["flops_per_s"] = (dims, flops_total / step,
                           {"units": "FLOP/s", "long_name": "achieved FLOP rate, whole mesh"})
    data["flops_utilisation"] = (dims, flops_total / step / (peak * n_chiplets),
                                 {"units": "1", "long_name": "achieved / peak FLOP/s"})
    data["energy_per_flop_J"] = (dims, costs["energy_J"] / flops_total,
                                 {"units": "J/FLOP", "long_name": "energy per FLOP of the step"})
    one_d = C.SCHEMES.index("1d-tp")
    two_d = C.SCHEMES.index("2d")
    data["speedup_2d"] = (("chiplet", "side"), step[:, one_d] / step[:, two_d],
                          {"units": "1", "long_name": "step time 1D TP / step time 2D"})
    energy = costs["energy_J"]
    data["energy_reduction_2d"] = (("chiplet", "side"), energy[:, one_d] / energy[:, two_d],
                                   {"units": "1", "long_name": "energy per step 1D TP / 2D"})
    data["hidden"] = (("side",), np.array([s["hidden"] for s in shapes]),
                      {"units": "1", "long_name": "hidden width of the weakly scaled model"})
    data["params"] = (("side",), np.array([s["params"] for s in shapes]),
                      {"units": "1", "long_name": "parameters of the transformer layers"})
    data["flops_per_step"] = (("side",), flops_total[0, 0],
                              {"units": "FLOP", "long_name": "FLOPs per step, whole mesh"})
    catalog_shapes = [C.weak_scaled_model(spec, s, s, tokens) for s in sides]  # the model itself on each mesh
    catalog = [C.step_costs_grid(side_arr, catalog_shapes, hw) for hw in hws]
    cat_step = np.stack([g["step_s"] for g in catalog])
    cat_energy = np.stack([g["energy_J"] for g in catalog])
    data["speedup_2d_catalog_shape"] = (
        ("chiplet", "side"), cat_step[:, one_d] / cat_step[:, two_d],
        {"units": "1", "long_name": f"step time 1D TP / 2D, {spec.name} at its catalog shape on this mesh "
                                    "(the reference side swept)"})
    data["energy_reduction_2d_catalog_shape"] = (
        ("chiplet", "side"), cat_energy[:, one_d] / cat_energy[:, two_d],
        {"units": "1", "long_name": f"energy 1D TP / 2D, {spec.name} at its catalog shape on this mesh"})
    ds = xr.Dataset(data, coords={"chiplet": list(chiplets), "scheme": list(C.SCHEMES), "side": side_arr,
                                  "chiplets": ("side", n_chiplets)})
    ds["side"].attrs.update({"units": "1", "long_name": "mesh side n (n x n chiplets)"})
    ds["chiplets"].attrs.update({"units": "1", "long_name": "chiplets N = n^2"})
    ds["chiplet"].attrs.update({"long_name": "chiplet package (catalog name)"})
    ds["scheme"].attrs.update({"long_name": "tensor-parallel scheme"})
    ds.attrs.update(provenance({"model": spec.name, "chiplets": list(chiplets), "mesh_sides": sides,
                                "reference_side": reference_side, "tokens_per_step": tokens}))
    return ds


def compare(folder) -> list[comparison.Record]:
    """Hecaton's 4.98x speed-up and 2.35x energy reduction against ours for Llama2-70B (the model at its catalog
    shape) on the configured reference mesh, per chiplet package; the paper's mesh size is not carried, so the
    range over every mesh side (the reference side swept) is recorded."""
    ds = tsio.read_dataset(Path(folder) / "chiplet_scaling.nc")
    setting = json.loads(ds.attrs["parameters"])
    ref = int(setting["reference_side"])
    records = []
    for chip in ds["chiplet"].values.tolist():
        ours = (f"{setting['model']} on a {ref} x {ref} mesh of {chip} (the paper's mesh size is not carried here: "
                f"reference side assumed), {setting['tokens_per_step']} tokens per step")
        for var, quantity, paper in (("speedup_2d_catalog_shape", "2D / 1D TP speed-up", PAPER_SPEEDUP),
                                     ("energy_reduction_2d_catalog_shape", "1D TP / 2D energy", PAPER_ENERGY_REDUCTION)):
            values = ds[var].sel(chiplet=chip)
            at_ref = float(values.sel(side=ref)) if ref in ds["side"].values else float("nan")
            records.append(comparison.numeric(
                STUDY, f"{quantity}, {chip}", "1", paper_value=paper, paper_setting=PAPER_SETTING,
                our_value=at_ref, our_setting=ours, same_setting=False, neutral=1.0,
                free_parameter="mesh side holding the model at its catalog shape (reference side)",
                sweep=values.values))
    return records


# ---------------------------------------------------------------------------------------------- figures

_STYLES = {"1d-tp": ("--", "s", "1D TP (Megatron)"), "2d": ("-", "o", "2D (Hecaton)")}


def _figure_setting(folder):
    """The saved dataset, its parameters, the chiplet counts N, the reference side, the title and a colour per
    package."""
    ds = tsio.read_dataset(Path(folder) / "chiplet_scaling.nc")
    setting = json.loads(ds.attrs["parameters"])
    ref = int(setting["reference_side"])
    title = f"{setting['model']} at {ref}x{ref}, widths x n/{ref}; {setting['tokens_per_step']} tokens/step"
    colors = {c: f"C{i}" for i, c in enumerate(ds["chiplet"].values.tolist())}
    return ds, setting, ds["chiplets"].values, ref, title, colors


def _log_n_axis(ax, n):
    ax.set_xscale("log", base=2)
    ax.set_xticks(n)
    ax.set_xticklabels([str(int(v)) for v in n])
    ax.set_xlabel("chiplets N = n x n")


def _scheme_lines(ax, ds, variable: str, n, colors) -> None:
    """One line of ``variable`` against the chiplet count per package (colour) and scheme (line style)."""
    for chip in ds["chiplet"].values.tolist():
        for scheme in ds["scheme"].values.tolist():
            ls, marker, name = _STYLES[scheme]
            ax.plot(n, ds[variable].sel(chiplet=chip, scheme=scheme), linestyle=ls, marker=marker,
                    color=colors[chip], label=f"{name}, {chip}")


def draw_compute_comm_ratio(folder):
    """The compute/communication time ratio of each scheme (solid 2D, dashed 1D TP) on each package against the
    number of chiplets, under weak scaling; dotted: a ratio of 1."""
    import matplotlib.pyplot as plt

    ds, _, n, _, title, colors = _figure_setting(folder)
    fig, ax = plt.subplots(figsize=(6.2, 4.0))
    _scheme_lines(ax, ds, "compute_comm_ratio", n, colors)
    figurecheck.guide(ax.axhline(1.0, color="0.5", linewidth=0.8, linestyle=":"))  # compute = communication
    ax.set_yscale("log")
    _log_n_axis(ax, n)
    ax.set(ylabel="compute time / communication time", title=title)
    ax.legend(fontsize=7)
    return fig


def draw_step_breakdown(folder):
    """Where the step of the first package goes, per scheme: compute at the achievable FLOP rate, the DRAM stall
    on top of it (roofline minus compute) and mesh communication, stacked, against the number of chiplets."""
    import matplotlib.pyplot as plt

    from ..common import plotting

    ds, _, n, _, _, _ = _figure_setting(folder)
    chip = ds["chiplet"].values.tolist()[0]
    fig, axes = plt.subplots(1, 2, figsize=(8.0, 3.8))  # each scheme on its own scale: 2D's bars are far lower
    x = np.arange(len(n))
    for ax, scheme in zip(axes, ds["scheme"].values.tolist()):
        sel = ds.sel(chiplet=chip, scheme=scheme)
        compute = sel["compute_s"].values
        stall = sel["local_s"].values - compute
        comm = sel["comm_s"].values
        ax.bar(x, compute, color="C0", label="compute")
        ax.bar(x, stall, bottom=compute, color="C1", label="DRAM stall")
        ax.bar(x, comm, bottom=compute + stall, color="C3", label="mesh communication")
        ax.set_xticks(x)
        ax.set_xticklabels([str(int(v)) for v in n])
        ax.set(xlabel="chiplets N", title=f"{_STYLES[scheme][2]}, {chip}")
    for ax in axes:
        ax.set_ylabel(plotting.label(ds["step_s"]))
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=4, fontsize=7)  # both panels
    return fig


def draw_throughput(folder):
    """Achieved over peak FLOP/s of the whole mesh for each scheme and package against the number of chiplets
    (an ideal system stays flat under weak scaling)."""
    import matplotlib.pyplot as plt

    ds, _, n, _, title, colors = _figure_setting(folder)
    fig, ax = plt.subplots(figsize=(6.2, 4.0))
    _scheme_lines(ax, ds, "flops_utilisation", n, colors)
    _log_n_axis(ax, n)
    ax.set(ylabel="achieved / peak FLOP/s", ylim=(0, 1), title=title)
    ax.legend(fontsize=7)
    return fig


def draw_energy(folder):
    """Energy per FLOP of the step of the first package, per scheme, by component (compute, DRAM, die-to-die
    links, static power over the step time), stacked, against the number of chiplets."""
    import matplotlib.pyplot as plt

    ds, _, n, _, _, _ = _figure_setting(folder)
    chip = ds["chiplet"].values.tolist()[0]
    parts = [("energy_compute_J", "compute", "C0"), ("energy_dram_J", "DRAM", "C1"),
             ("energy_link_J", "links", "C3"), ("energy_static_J", "static", "0.6")]
    fig, axes = plt.subplots(1, 2, figsize=(8.0, 3.8))  # each scheme on its own scale: 2D's bars are far lower
    x = np.arange(len(n))
    flops = ds["flops_per_step"].values
    for ax, scheme in zip(axes, ds["scheme"].values.tolist()):
        sel = ds.sel(chiplet=chip, scheme=scheme)
        bottom = np.zeros(len(n))
        for var, name, color in parts:
            pj = sel[var].values / flops * 1e12
            ax.bar(x, pj, bottom=bottom, color=color, label=name)
            bottom += pj
        ax.set_xticks(x)
        ax.set_xticklabels([str(int(v)) for v in n])
        ax.set(xlabel="chiplets N", title=f"{_STYLES[scheme][2]}, {chip}")
    for ax in axes:
        ax.set_ylabel("energy per FLOP [pJ]")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=4, fontsize=7)  # both panels
    return fig


def draw_gain(folder):
    """The 2D scheme's speed-up and energy reduction over 1D TP per package against the number of chiplets, the
    model at its catalog shape on each mesh (thin dotted), and Hecaton's Llama2-70B figures at the reference
    mesh; dotted grey: no gain."""
    import matplotlib.pyplot as plt

    ds, setting, n, ref, title, colors = _figure_setting(folder)
    fig, ax = plt.subplots(figsize=(6.2, 4.0))
    for chip in ds["chiplet"].values.tolist():
        ax.plot(n, ds["speedup_2d"].sel(chiplet=chip), marker="o", color=colors[chip], label=f"speed-up, {chip}")
        ax.plot(n, ds["energy_reduction_2d"].sel(chiplet=chip), marker="^", linestyle="--", color=colors[chip],
                label=f"energy reduction, {chip}")
    for chip in ds["chiplet"].values.tolist():
        ax.plot(n, ds["speedup_2d_catalog_shape"].sel(chiplet=chip), linestyle=":", linewidth=1, color=colors[chip],
                label=f"speed-up, {setting['model']} on each mesh, {chip}")
    # markers drawn as lines without a line (not scatter), so that the legend tells them apart by their marker
    ax.plot([ref**2], [PAPER_SPEEDUP], marker="*", markersize=11, linestyle="none", color="k", zorder=5,
            label=f"Hecaton: {PAPER_SPEEDUP:g}x speed-up")
    ax.plot([ref**2], [PAPER_ENERGY_REDUCTION], marker="P", markersize=9.5, linestyle="none", color="k", zorder=5,
            label=f"Hecaton: {PAPER_ENERGY_REDUCTION:g}x energy")
    figurecheck.guide(ax.axhline(1.0, color="0.5", linewidth=0.8, linestyle=":"))  # no gain
    _log_n_axis(ax, n)
    ax.set(ylabel="1D TP / 2D", title=title)
    ax.set_yscale("log")
    ax.legend(fontsize=6.5, loc="upper left")
    return fig


#: the figures drawn from the saved dataset alone (file name -> function of the output folder)
FIGURES = {"compute_comm_ratio.png": draw_compute_comm_ratio, "step_breakdown.png": draw_step_breakdown,
           "throughput.png": draw_throughput, "energy.png": draw_energy, "gain.png": draw_gain}
