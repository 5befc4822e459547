"""overlap: compute-communication overlap with contention (Lee et al., "Characterizing
Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning: Performance and Power
Implications", arXiv 2507.03114, 2025).

The paper runs GPT and Llama models data-parallel on 4 GPUs (A100, H100, MI250, MI210) and
compares each step executed sequentially, overlapped, and in an ideal overlap whose compute is as
fast as alone: overlapped compute is 18.9% slower on average (up to 40%), and sequential execution
is still 10.2% slower than overlapped (up to 26.6%). Here the same three modes come from the
contention model of :mod:`trainscale.model.overlap` for FSDP-style sharded data parallelism (ZeRO-3 with
prefetch, the common way to overlap for models of this size, priced as the ``fsdp`` stack runs it) on 4 GPUs of one node, by model,
accelerator, precision and power cap; and the contention slowdown against the collective's message
size. The paper's numbers are comparison targets only: nothing here is fitted to them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xarray as xr

from ..common import comparison
from ..common import figurecheck
from ..common import io as tsio
from ..model import overlap as ov
from ..model import perfmodel
from ..common.checks import check_choice, check_floats, check_int
from ..common.io import provenance
from ..model.specs import RECOMPUTE_MODES, PlanSpec, RunSpec, SpecError, resolve_model, resolve_system

__all__ = ["PAPER", "OUTPUTS", "RESOURCES", "PAPER_NUMBERS", "PAPER_SYSTEMS", "compare", "message_size_sweep",
           "overlap_study", "plan_for", "FIGURES"]

PAPER = ("Lee et al., Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning: "
         "Performance and Power Implications (arXiv 2025)")
OUTPUTS = ("overlap.nc", "message_size.nc", "step_time.png", "compute_slowdown.png", "power_cap.png",
           "message_size.png")
#: the software the study's plans run on: PyTorch FSDP (its stack rules and calibration)
STACK = "fsdp"
RESOURCES = {"mem_mb": 2000, "runtime_quick_min": 10, "runtime_full_min": 30}
STUDY = "overlap"

# the comparison targets (Lee et al. 2025, abstract): never used in a computation
PAPER_NUMBERS = {"slowdown_mean": 0.189, "slowdown_max": 0.40, "sequential_mean": 0.102, "sequential_max": 0.266}
#: The paper's accelerators that the catalog holds (the paper also measured MI250 and MI210).
PAPER_SYSTEMS = ("dgx-a100-80gb", "dgx-h100")


def _names(name, values, resolve) -> list:
    if isinstance(values, str) or not isinstance(values, Sequence) or len(values) == 0:
        raise SpecError(name, values, "expected a non-empty list of catalog names")
    if len(set(values)) != len(values):
        raise SpecError(name, list(values), "expected distinct names")
    for v in values:
        resolve(v)
    return [str(v) for v in values]


def _precisions(precisions) -> list[str]:
    if isinstance(precisions, str) or not isinstance(precisions, Sequence) or len(precisions) == 0:
        raise SpecError("precisions", precisions, f"expected a non-empty list of {', '.join(ov.PRECISIONS)}")
    for p in precisions:
        check_choice("precisions", p, ov.PRECISIONS)
    if len(set(precisions)) != len(precisions):
        raise SpecError("precisions", list(precisions), "expected distinct precisions")
    return list(precisions)


def plan_for(gpus: int, global_batch: int, micro_batch: int, recompute: str, zero: int) -> PlanSpec:
    """The data-parallel plan every point of the study uses (overlap is set per mode), run by PyTorch FSDP
    (``zero`` 3: fully sharded, 2: gradients and states, 0: replicated; FSDP has no ZeRO-1)."""
    gpus = check_int("gpus", gpus, 2, 4096)
    micro_batch = check_int("micro_batch", micro_batch, 1, 1024)
    global_batch = check_int("global_batch", global_batch, 1)
    check_choice("recompute", recompute, RECOMPUTE_MODES)
    zero = check_int("zero", zero, 0, 3)
    if global_batch % (gpus * micro_batch):
        raise SpecError("global_batch", global_batch, f"expected a multiple of gpus * micro_batch = {gpus * micro_batch}")
    return PlanSpec(dp=gpus, micro_batch=micro_batch, global_batch=global_batch, recompute=recompute, zero=zero,
                    flash_attention=True, overlap_grad_reduce=True, stack=STACK)


def overlap_study(models: Sequence[str], systems: Sequence[str], precisions: Sequence[str] = ("bf16", "fp8"),
                  power_caps: Sequence[float] = (1.0,), gpus: int = 4, global_batch: int = 32, micro_batch: int = 2,
                  recompute: str = "selective", zero: int = 3) -> xr.Dataset:
    """Sequential, overlapped and ideal step of each (model, system, precision) at each power cap
    (a fraction of the accelerator's TDP), with the contention behind the overlapped slowdown.

    Points a system cannot run (FP8 without FP8 tensor cores, a model that does not fit) are NaN
    with ``valid`` false."""
    models = _names("models", models, resolve_model)
    systems = _names("systems", systems, resolve_system)
    precisions = _precisions(precisions)
    caps = check_floats("power_caps", power_caps, 0.0, 1.0, open_min=True)
    plan = plan_for(gpus, global_batch, micro_batch, recompute, zero)
    for name in systems:
        s = resolve_system(name)
        low = [c for c in caps if c * s.tdp_W <= s.idle_W]
        if low:
            raise SpecError("power_caps", low[0], f"a cap must exceed {name}'s idle power, {s.idle_W / s.tdp_W:.3f} of TDP")
    nm, ns, npr, nc, nmode = len(models), len(systems), len(precisions), len(caps), len(ov.MODES)
    mode_shape = (nm, ns, npr, nc, nmode)
    point = (nm, ns, npr)
    per_mode = {name: np.full(mode_shape, np.nan) for name in ("step_time_s", "tokens_per_s", "power_mean_W",
                                                               "power_peak_W", "compute_time_s")}
    per_cap = {name: np.full((nm, ns, npr, nc), np.nan) for name in ("compute_slowdown", "clock_alone",
                                                                    "clock_overlapped", "sequential_over_overlapped",
                                                                    "overlapped_over_ideal")}
    scalars = {name: np.full(point, np.nan) for name in ("contention_slowdown", "sm_share", "hbm_share", "channels",
                                                         "message_bytes", "wire_GBps", "compute_s", "comm_s",
                                                         "overlappable_s", "rest_s", "memory_gib_per_gpu")}
    valid = np.zeros(point, dtype=bool)
    for i, model_name in enumerate(models):
        model = resolve_model(model_name)
        for j, system_name in enumerate(systems):
            system = resolve_system(system_name)
            run = RunSpec(id=f"{model_name}@{system_name}", model=model, system=system, plan=plan)
            run.plan.check_against(model)
            for k, precision in enumerate(precisions):
                if precision == "fp8" and system.peak_flops_fp8 is None:
                    continue
                fit = perfmodel.predict(RunSpec(id=run.id, model=model, plan=plan,
                                                system=ov.precision_system(system, precision)))
                scalars["memory_gib_per_gpu"][i, j, k] = fit.memory_gib_per_gpu
                if not fit.fits:
                    continue
                valid[i, j, k] = True
                inputs = ov.overlap_inputs(run, precision)
                for name, key in (("contention_slowdown", "slowdown"), ("sm_share", "sm_share"),
                                  ("hbm_share", "hbm_share"), ("channels", "channels"),
                                  ("message_bytes", "message_bytes"), ("compute_s", "compute_s"),
                                  ("comm_s", "comm_s"), ("overlappable_s", "overlappable_s"), ("rest_s", "rest_s")):
                    scalars[name][i, j, k] = inputs[key]
                scalars["wire_GBps"][i, j, k] = inputs["wire_Bps"] / 1e9
                for c, cap in enumerate(caps):
                    modes = ov.overlap_modes(inputs, cap * system.tdp_W)
                    for m, mode in enumerate(ov.MODES):
                        r = modes[mode]
                        per_mode["step_time_s"][i, j, k, c, m] = r["step_time_s"]
                        per_mode["tokens_per_s"][i, j, k, c, m] = inputs["tokens"] / r["step_time_s"]
                        per_mode["power_mean_W"][i, j, k, c, m] = r["power_mean_W"]
                        per_mode["power_peak_W"][i, j, k, c, m] = r["power_peak_W"]
                        per_mode["compute_time_s"][i, j, k, c, m] = r["compute_time_s"]
                    o = modes["overlapped"]
                    per_cap["compute_slowdown"][i, j, k, c] = o["compute_slowdown"]
                    per_cap["clock_alone"][i, j, k, c] = o["clock_alone"]
                    per_cap["clock_overlapped"][i, j, k, c] = o["clock_overlapped"]
                    per_cap["sequential_over_overlapped"][i, j, k, c] = (
                        modes["sequential"]["step_time_s"] / o["step_time_s"] - 1.0)
                    per_cap["overlapped_over_ideal"][i, j, k, c] = o["step_time_s"] / modes["ideal"]["step_time_s"] - 1.0

    dims_mode = ("model", "system", "precision", "power_cap", "mode")
    dims_cap = dims_mode[:-1]
    dims_point = dims_mode[:3]
    meta = {
        "step_time_s": ("s", "step time"),
        "tokens_per_s": ("tokens/s", "cluster throughput"),
        "power_mean_W": ("W", "mean accelerator power over the step"),
        "power_peak_W": ("W", "accelerator power of the most demanding phase"),
        "compute_time_s": ("s", "time the compute takes in the step"),
        "compute_slowdown": ("1", "overlapped compute slowdown vs alone"),
        "clock_alone": ("1", "clock fraction, compute alone"),
        "clock_overlapped": ("1", "clock fraction, compute overlapped"),
        "sequential_over_overlapped": ("1", "sequential step over overlapped step, minus 1"),
        "overlapped_over_ideal": ("1", "overlapped step over ideal step, minus 1"),
        "contention_slowdown": ("1", "compute slowdown from SM and HBM contention at full clock"),
        "sm_share": ("1", "share of the SMs the collective holds"),
        "hbm_share": ("1", "share of achievable HBM bandwidth the collective demands"),
        "channels": ("1", "collective channels (SMs)"),
        "message_bytes": ("B", "collective message size"),
        "wire_GBps": ("GB/s", "bytes a GPU receives per second of the collective"),
        "compute_s": ("s", "compute per step, alone at full clock"),
        "comm_s": ("s", "data-parallel communication per step"),
        "overlappable_s": ("s", "compute that can overlap the communication"),
        "rest_s": ("s", "step time that overlaps nothing (optimizer)"),
        "memory_gib_per_gpu": ("GiB", "memory of the most loaded GPU"),
    }
    data = {}
    for name, arr in per_mode.items():
        data[name] = (dims_mode, arr, {"units": meta[name][0], "long_name": meta[name][1]})
    for name, arr in per_cap.items():
        data[name] = (dims_cap, arr, {"units": meta[name][0], "long_name": meta[name][1]})
    for name, arr in scalars.items():
        data[name] = (dims_point, arr, {"units": meta[name][0], "long_name": meta[name][1]})
    data["valid"] = (dims_point, valid, {"units": "1", "long_name": "the system runs this precision and the model fits"})
    ds = xr.Dataset(data, coords={"model": models, "system": systems, "precision": precisions,
                                  "power_cap": np.asarray(caps, dtype=float), "mode": list(ov.MODES)})
    ds["power_cap"].attrs.update({"units": "1", "long_name": "power cap (fraction of TDP)"})
    ds["mode"].attrs.update({"units": "1", "long_name": "execution mode"})
    for name in ("model", "system", "precision"):
        ds[name].attrs.update({"units": "1", "long_name": name})
    ds.attrs.update(provenance({"models": models, "systems": systems, "precisions": precisions,
                                "power_caps": caps, "gpus": int(gpus), "global_batch": int(global_batch),
                                "micro_batch": int(micro_batch), "recompute": recompute, "zero": int(zero)}))
    return ds


def message_size_sweep(model: str, systems: Sequence[str], precisions: Sequence[str], message_bytes: Sequence[float],
                       gpus: int = 4, global_batch: int = 32, micro_batch: int = 2, recompute: str = "selective") -> xr.Dataset:
    """Contention slowdown of one model's compute overlapped with a collective of each message size
    (an FSDP-style all-gather / reduce-scatter mix over ``gpus`` GPUs of one node): channels, HBM
    share and the compute slowdown at full clock."""
    model_spec = resolve_model(model)
    systems = _names("systems", systems, resolve_system)
    precisions = _precisions(precisions)
    sizes = check_floats("message_bytes", message_bytes, 1.0, 1e12)
    plan = plan_for(gpus, global_batch, micro_batch, recompute, 3)
    shape = (len(systems), len(precisions), len(sizes))
    out = {name: np.full(shape, np.nan) for name in ("contention_slowdown", "sm_share", "hbm_share", "channels",
                                                     "wire_GBps")}
    for j, name in enumerate(systems):
        system = resolve_system(name)
        run = RunSpec(id=name, model=model_spec, system=system, plan=plan)
        run.plan.check_against(model_spec)
        profile = ov.collective_profile(run)
        n = int(gpus)
        for k, precision in enumerate(precisions):
            if precision == "fp8" and system.peak_flops_fp8 is None:
                continue
            psys = ov.precision_system(system, precision)
            seq = RunSpec(id=name, model=model_spec, system=psys, plan=dataclasses.replace(plan, overlap_grad_reduce=False))
            alone = perfmodel.predict(seq)
            base = alone.breakdown["compute"] + alone.breakdown["recompute"]
            for s, size in enumerate(sizes):
                t = perfmodel.collective_time_s(system, "allgather", size, n)
                wire = (n - 1) / n * size / t
                cont = ov.contention(psys, size, wire, profile["hbm_bytes_per_wire_byte"])
                busy = perfmodel.predict(RunSpec(id=name, model=model_spec, plan=seq.plan,
                                                 system=ov.contended_system(psys, cont["channels"], cont["hbm_share"])))
                out["contention_slowdown"][j, k, s] = (busy.breakdown["compute"] + busy.breakdown["recompute"]) / base - 1
                out["sm_share"][j, k, s] = cont["sm_share"]
                out["hbm_share"][j, k, s] = cont["hbm_share"]
                out["channels"][j, k, s] = cont["channels"]
                out["wire_GBps"][j, k, s] = wire / 1e9
    dims = ("system", "precision", "message_bytes")
    meta = {"contention_slowdown": ("1", "compute slowdown from SM and HBM contention at full clock"),
            "sm_share": ("1", "share of the SMs the collective holds"),
            "hbm_share": ("1", "share of achievable HBM bandwidth the collective demands"),
            "channels": ("1", "collective channels (SMs)"),
            "wire_GBps": ("GB/s", "bytes a GPU receives per second of the collective")}
    ds = xr.Dataset({name: (dims, arr, {"units": meta[name][0], "long_name": meta[name][1]}) for name, arr in out.items()},
                    coords={"system": systems, "precision": precisions, "message_bytes": np.asarray(sizes, dtype=float)})
    ds["message_bytes"].attrs.update({"units": "B", "long_name": "collective message size"})
    for name in ("system", "precision"):
        ds[name].attrs.update({"units": "1", "long_name": name})
    ds.attrs.update(provenance({"model": model, "systems": systems, "precisions": precisions,
                                "message_bytes": sizes, "gpus": int(gpus), "global_batch": int(global_batch),
                                "micro_batch": int(micro_batch), "recompute": recompute}))
    ds.attrs["model"] = model
    return ds


def compare(folder) -> list[comparison.Record]:
    """Paper-vs-ours records from ``overlap.nc`` in ``folder``, at the default power limit, over every valid
    (model, precision) point on the paper's accelerators that the catalog holds (A100, H100): the mean and
    maximum overlapped compute slowdown and how much slower sequential execution is than overlapped."""
    ds = tsio.read_dataset(Path(folder) / "overlap.nc")
    full = ds.sel(power_cap=float(ds["power_cap"].max()))
    systems = [s for s in ds["system"].values.tolist() if s in PAPER_SYSTEMS]
    sub = full.sel(system=systems)
    valid = sub["valid"].values
    everywhere = full["valid"].values
    models = ", ".join(ds["model"].values.tolist())
    precisions = ", ".join(ds["precision"].values.tolist())
    ours = (f"{', '.join(systems)}; {models}; {precisions}; FSDP (ZeRO-3) on {json_parameters(ds)['gpus']} GPUs, "
            f"contention model, default power limit; every valid point")
    paper = ("GPT and Llama models, data parallel on 4 GPUs of A100, H100, MI250 and MI210 nodes "
             "(abstract, over all its experiments)")
    records = []
    for key, var, stat, what in (
            ("slowdown_mean", "compute_slowdown", "mean", "overlapped compute slowdown vs compute alone"),
            ("slowdown_max", "compute_slowdown", "max", "overlapped compute slowdown vs compute alone"),
            ("sequential_mean", "sequential_over_overlapped", "mean", "sequential step over overlapped step, minus 1"),
            ("sequential_max", "sequential_over_overlapped", "max", "sequential step over overlapped step, minus 1")):
        values = sub[var].values[valid]
        every = full[var].values[everywhere]
        reduce = np.mean if stat == "mean" else np.max
        records.append(comparison.numeric(
            STUDY, f"{what}, {stat} (fraction)", "", paper_value=PAPER_NUMBERS[key], paper_setting=paper,
            our_value=float(reduce(values)) if values.size else float("nan"),
            our_setting=f"{ours} ({values.size} points)", same_setting=False, neutral=0.0,
            note=(f"our models, batch and accelerators are not the paper's (no MI250/MI210 in the catalog); with "
                  f"every catalog accelerator (MI300X too) the {stat} is {float(reduce(every)):.1%}")))
    return records


def json_parameters(ds: xr.Dataset) -> dict:
    return json.loads(ds.attrs["parameters"])


# ---------------------------------------------------------------------------------------------- figures

def _figure_data(folder):
    """``overlap.nc`` from ``folder``, its default-power-limit slice and the (system, precision) points where
    some model fits."""
    ds = tsio.read_dataset(Path(folder) / "overlap.nc")
    full = ds.sel(power_cap=1.0)
    points = [(s, p) for s in ds["system"].values for p in ds["precision"].values
              if bool(ds["valid"].sel(system=s, precision=p).any())]
    return ds, full, points


def _percent():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: f"{100 * v:.4g}%")


def draw_step_time(folder):
    """Step time of each mode (sequential, overlapped with contention, ideal overlap) at the default power limit,
    per model, for every accelerator and precision; points whose model does not fit are marked, not drawn."""
    import matplotlib.pyplot as plt

    from ..common import plotting

    ds, full, points = _figure_data(folder)
    setting = json_parameters(ds)
    fig, axes = plt.subplots(1, len(ds["model"]), figsize=(3.4 * len(ds["model"]), 3.6), squeeze=False, sharey=False)
    width = 0.27
    colors = {"sequential": "C1", "overlapped": "C0", "ideal": "C2"}
    for ax, model in zip(axes[0], ds["model"].values):
        x = np.arange(len(points))
        for m, mode in enumerate(ds["mode"].values):
            y = [float(full["step_time_s"].sel(model=model, system=s, precision=p, mode=mode)) for s, p in points]
            ax.bar(x + (m - 1) * width, y, width, color=colors.get(mode, "0.5"), label=mode)
        for xi, (s, p) in zip(x, points):
            if not bool(full["valid"].sel(model=model, system=s, precision=p)):
                ax.text(xi, 0, "does not fit", rotation=90, ha="center", va="bottom", fontsize=7, color="0.4")
        ax.set_xticks(x, [f"{s}\n{p}" for s, p in points], rotation=45, ha="right", fontsize=7)
        ax.set(title=f"{model}, {setting['gpus']} GPUs FSDP", ylabel=plotting.label(ds["step_time_s"]))
        ax.set_xlim(-0.6, len(points) - 0.4)
    # one key for every panel (each panel draws the three modes)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside upper center", ncols=len(ds["mode"]))
    return fig


def draw_compute_slowdown(folder):
    """Overlapped compute slowdown against compute alone (default power limit) per model, accelerator and
    precision, with the paper's mean and maximum as reference lines."""
    import matplotlib.pyplot as plt

    ds, full, points = _figure_data(folder)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    nmod = len(ds["model"])
    width = 0.8 / nmod
    x = np.arange(len(points))
    for i, model in enumerate(ds["model"].values):
        y = [float(full["compute_slowdown"].sel(model=model, system=s, precision=p)) for s, p in points]
        ax.bar(x + (i - (nmod - 1) / 2) * width, y, width, label=model)
    # the paper's mean and maximum: reference lines named by the text beside them
    figurecheck.guide(ax.axhline(PAPER_NUMBERS["slowdown_mean"], color="0.3", linestyle="--", linewidth=1),
                      ax.axhline(PAPER_NUMBERS["slowdown_max"], color="0.3", linestyle=":", linewidth=1))
    ax.text(1.0, PAPER_NUMBERS["slowdown_mean"], "paper: mean 18.9%", transform=ax.get_yaxis_transform(), ha="right",
            va="bottom", fontsize=7)
    ax.text(1.0, PAPER_NUMBERS["slowdown_max"], "paper: max 40%", transform=ax.get_yaxis_transform(), ha="right",
            va="bottom", fontsize=7)
    ax.set_xticks(x, [f"{s}\n{p}" for s, p in points], rotation=45, ha="right", fontsize=7)
    ax.yaxis.set_major_formatter(_percent())
    ax.set(ylabel="overlapped compute slowdown", ylim=(0, max(0.45, float(full["compute_slowdown"].max()) + 0.05)))
    ax.legend(loc="upper left", ncol=nmod)
    return fig


def draw_power_cap(folder):
    """Against the power cap (bf16, the largest model that fits on every accelerator): overlapped compute
    slowdown, each mode's step time over the uncapped ideal step, and mean and peak accelerator power; colour is
    the accelerator, line style the mode (or the power statistic)."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from ..common import plotting

    ds, _, _ = _figure_data(folder)
    fits_all = [m for m in ds["model"].values.tolist()
                if bool(ds["valid"].sel(model=m, precision="bf16").all())] if "bf16" in ds["precision"].values else []
    model = fits_all[-1] if fits_all else str(ds["model"].values[0])
    caps = ds["power_cap"].values
    drawn = [s for s in ds["system"].values.tolist() if bool(ds["valid"].sel(model=model, system=s, precision="bf16"))]
    mode_style = {"sequential": "--", "overlapped": "-", "ideal": ":"}
    fig, axes = plt.subplots(1, 3, figsize=(11.5, 3.6))
    for j, system in enumerate(ds["system"].values.tolist()):
        if system not in drawn:
            continue
        sel = ds.sel(model=model, system=system, precision="bf16")
        color = f"C{j}"
        axes[0].plot(caps, sel["compute_slowdown"], marker="o", color=color)
        ref = float(sel["step_time_s"].sel(power_cap=1.0, mode="ideal"))
        for mode, ls in mode_style.items():
            axes[1].plot(caps, sel["step_time_s"].sel(mode=mode) / ref, color=color, linestyle=ls, marker=".",
                         label=mode)
        axes[2].plot(caps, sel["power_peak_W"].sel(mode="overlapped"), color=color, marker="o",
                     label="peak, overlapped")
        axes[2].plot(caps, sel["power_mean_W"].sel(mode="sequential"), color=color, linestyle="--", marker=".",
                     label="mean, sequential")
        axes[2].plot(caps, sel["power_mean_W"].sel(mode="overlapped"), color=color, linestyle=":", marker=".",
                     label="mean, overlapped")
    axes[0].yaxis.set_major_formatter(_percent())
    axes[0].set(xlabel=plotting.label(ds["power_cap"]), ylabel="overlapped compute slowdown", title=f"{model}, bf16")
    axes[1].set(xlabel=plotting.label(ds["power_cap"]), ylabel="step time / uncapped ideal step",
                title="step time by mode")
    axes[2].set(xlabel=plotting.label(ds["power_cap"]), ylabel="accelerator power [W]", title="power per accelerator")
    for ax in axes:  # the cap falls to the right: tighter to the right
        figurecheck.invert_on_purpose(ax, "x")
    # colour is the accelerator (left key), line style the mode or power statistic (middle and right keys, in grey:
    # they name every accelerator's line of that style)
    systems_legend = [Line2D([], [], color=f"C{j}", marker="o", label=s)
                      for j, s in enumerate(ds["system"].values.tolist()) if s in drawn]
    axes[0].legend(handles=systems_legend, loc="upper left", fontsize=7)
    axes[1].legend(handles=[Line2D([], [], color="0.3", linestyle=ls, label=mode) for mode, ls in mode_style.items()],
                   loc="upper left", fontsize=7)
    axes[2].legend(handles=[Line2D([], [], color="0.3", marker="o", label="peak, overlapped"),
                            Line2D([], [], color="0.3", linestyle="--", label="mean, sequential"),
                            Line2D([], [], color="0.3", linestyle=":", label="mean, overlapped")],
                   loc="upper right", fontsize=7)
    return fig


def draw_message_size(folder):
    """The sweep model's compute slowdown next to a collective of each message size (full clock), with the SM
    and HBM shares the collective takes, per accelerator (and precision)."""
    import matplotlib.pyplot as plt

    from ..common import plotting

    sweep = tsio.read_dataset(Path(folder) / "message_size.nc")
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.4))
    for j, system in enumerate(sweep["system"].values):
        for precision, ls in (("bf16", "-"), ("fp8", "--")):
            if precision not in sweep["precision"].values:
                continue
            y = sweep["contention_slowdown"].sel(system=system, precision=precision)
            if np.isnan(y.values).all():
                continue
            axes[0].plot(sweep["message_bytes"], y, color=f"C{j}", linestyle=ls, marker=".",
                         label=f"{system} {precision}")
        axes[1].plot(sweep["message_bytes"], sweep["hbm_share"].sel(system=system, precision="bf16"), color=f"C{j}",
                     marker=".", label=f"{system} HBM share")
        axes[1].plot(sweep["message_bytes"], sweep["sm_share"].sel(system=system, precision="bf16"), color=f"C{j}",
                     linestyle=":", label=f"{system} SM share")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel(plotting.label(sweep["message_bytes"]))
        ax.yaxis.set_major_formatter(_percent())
    axes[0].set(ylabel="compute slowdown (full clock)", title=f"{sweep.attrs['model']}: contention vs message size")
    axes[1].set(ylabel="share taken by the collective", title="HBM share (solid), SM share (dotted)")
    axes[0].legend(loc="upper left", fontsize=6)
    axes[1].legend(loc="upper left", fontsize=6)
    return fig


#: the figures drawn from the saved datasets alone (file name -> function of the output folder)
FIGURES = {"step_time.png": draw_step_time, "compute_slowdown.png": draw_compute_slowdown,
           "power_cap.png": draw_power_cap, "message_size.png": draw_message_size}
