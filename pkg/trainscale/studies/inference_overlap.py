"""Tensor-parallel prefill with intra-sequence overlap (ISO, Xiao & Su 2024, arXiv 2409.11155).

ISO splits one prompt in two chunks so that one chunk's tensor-parallel all-reduce runs while the
other chunk computes (chunk 2's attention reads chunk 1's keys and values, so chunk 1 goes first).
The paper reports about 35% less prefill time on RTX 4090s and about 15% on A800s (30B and 70B
models). It does not say, in the abstract we could read, how its A800s were connected; the A800 was
sold mostly as the SXM4 part on 8-GPU HGX boards (NVSwitch, NVLink limited to 400 GB/s), and the
paper's ordering (a smaller saving on the A800) points to a link much faster than the 4090's PCIe.
The paper's setting is therefore modelled as ``rtx4090-pcie`` vs ``a800-sxm`` (an assumption, stated
in the records); ``a800-pcie`` (the PCIe card, all-reduce over PCIe) is a labelled alternative.

:func:`inference_overlap` prices, with :mod:`trainscale.model.inference`, the prefill of one model on
several systems for every tensor-parallel degree, prompt length and split ratio
(ratio 0 or 1 is the serial execution), keeps the best split per configuration, adds the decode
step for context (latency-bound all-reduces, nothing to split), and sweeps the all-reduce
bandwidth of each system at one reference configuration to show where overlap pays: savings peak
where compute and communication are equal and vanish when either dominates.
:func:`compare` reads the saved dataset and returns the paper-vs-ours records.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import numpy as np
import xarray as xr

from ..common import comparison
from ..model import inference
from ..common import figurecheck
from ..common import io as tsio
from ..common.checks import check_float, check_floats, check_int
from ..common.io import provenance
from ..model.specs import SpecError, resolve_model, resolve_system

__all__ = ["PAPER", "OUTPUTS", "RESOURCES", "PAPER_SAVINGS", "PAPER_SYSTEMS", "compare", "inference_overlap", "FIGURES"]

PAPER = "Xiao & Su, ISO: Overlap of Computation and Communication within Sequence for LLM Inference (arXiv 2024)"
OUTPUTS = ("inference_overlap.nc", "savings.png", "split_ratio.png", "bandwidth.png", "comm_share.png")
RESOURCES = {"mem_mb": 2000, "runtime_quick_min": 10, "runtime_full_min": 30}
STUDY = "inference-overlap"

#: The paper's prefill savings (abstract: "approximately 35% on 4090 GPU and roughly 15% on A800 GPU").
PAPER_SAVINGS = {"rtx4090": 0.35, "a800": 0.15}
#: The catalog systems that stand for the paper's: the A800 as the HGX A800 SXM4 board (NVLink 400 GB/s),
#: an assumption (the paper's abstract names the GPU only).
PAPER_SYSTEMS = {"rtx4090": "rtx4090-pcie", "a800": "a800-sxm"}
#: The labelled alternative for the A800: the PCIe card with its all-reduce over PCIe.
ALTERNATIVE_A800 = "a800-pcie"
#: Tensor-parallel degree of the comparison: the only one at which a 70B model's weights fit on 24 GB 4090s.
COMPARE_TP = 8


def _ints(name, values, minimum=1):
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)) or len(values) == 0:
        raise SpecError(name, values, f"expected a non-empty list of integers >= {minimum}")
    out = [check_int(name, int(v) if isinstance(v, np.integer) else v, minimum) for v in values]
    if len(set(out)) != len(out):
        raise SpecError(name, values, "expected distinct values")
    return sorted(out)


def inference_overlap(*, model: str = "llama2-70b",
                      systems: Sequence[str] = ("rtx4090-pcie", "a800-sxm", "a800-pcie", "dgx-a100-80gb"),
                      tps: Sequence[int] = (2, 4, 8), prompt_tokens: Sequence[int] = (512, 1024, 2048, 4096),
                      split_ratios: Sequence[float] = tuple(np.round(np.linspace(0.0, 1.0, 21), 6)),
                      batch: int = 1, overlap_slowdown: float = 0.0,
                      bandwidths_GBps: Sequence[float] = (5, 10, 20, 50, 100, 200, 300, 600),
                      sweep_tp: int = 8, sweep_prompt_tokens: int = 2048) -> xr.Dataset:
    """Serial and ISO prefill latency over ``system x tp x prompt_tokens x split_ratio``.

    Variables: ``prefill_s`` (every split; ratio 0 and 1 are serial), ``savings_by_ratio``;
    per ``system x tp x prompt_tokens``: ``serial_s``, ``iso_s`` and ``best_ratio`` (best split),
    ``savings`` (``1 - iso_s / serial_s``), ``compute_s`` and ``comm_s`` (serial execution,
    per GPU), ``comm_share``, ``decode_s`` and ``decode_comm_share`` (one decode step after the
    prompt), ``fits`` (weights + KV cache + reserve in memory); per ``system x bandwidth_GBps``
    (the system with its scale-up bandwidth replaced, at ``sweep_tp`` and ``sweep_prompt_tokens``):
    ``sweep_savings``, ``sweep_comm_to_compute``; per system: ``link_GBps``.
    """
    model_spec = resolve_model(model, "inference_overlap")
    if isinstance(systems, (str, bytes)) or not isinstance(systems, Sequence) or len(systems) == 0:
        raise SpecError("systems", systems, "expected a non-empty list of catalog system names")
    specs = [resolve_system(s, "inference_overlap") for s in systems]
    if len({s.name for s in specs}) != len(specs):
        raise SpecError("systems", list(systems), "expected distinct systems")
    tp_list = _ints("tps", tps)
    for t in tp_list:
        inference.check_tp(model_spec, t, "tps")
    prompts = _ints("prompt_tokens", prompt_tokens)
    ratios = sorted(set(check_floats("split_ratios", list(split_ratios), 0.0, 1.0)))
    if ratios[0] != 0.0:
        raise SpecError("split_ratios", list(split_ratios), "expected a list that includes 0 (the serial execution)")
    b = check_int("batch", batch, 1)
    slow = check_float("overlap_slowdown", overlap_slowdown, 0.0, 10.0)
    bws = sorted(set(check_floats("bandwidths_GBps", list(bandwidths_GBps), 0.0, 1e5, open_min=True)))
    sweep_tp = inference.check_tp(model_spec, sweep_tp, "sweep_tp")
    sweep_s = check_int("sweep_prompt_tokens", sweep_prompt_tokens, 1)

    ns, nt, npr, nr = len(specs), len(tp_list), len(prompts), len(ratios)
    grid = {name: np.empty((ns, nt, npr, nr)) for name in inference.PREFILL_FIELDS}
    decode = np.empty((ns, nt, npr, 2))
    fits = np.zeros((ns, nt, npr), dtype=bool)
    sweep = np.empty((ns, len(bws), 4))
    for i, spec in enumerate(specs):
        for name, values in inference.prefill_table(model_spec, spec, tp_list, prompts, ratios, b, slow).items():
            grid[name][i] = values
        for j, t in enumerate(tp_list):
            for k, s in enumerate(prompts):
                d = inference.decode(model_spec, spec, t, s, b)
                decode[i, j, k] = d.time_s, d.comm_s / d.time_s
                fits[i, j, k] = inference.memory_fits(model_spec, spec, t, s + 1, b)
        for w, bw in enumerate(bws):
            varied = resolve_system({"name": spec.name, "scale_up_GBps_per_gpu": bw})
            g = {k: v[0, 0] for k, v in inference.prefill_table(model_spec, varied, [sweep_tp], [sweep_s], ratios, b,
                                                                 slow).items()}
            times = g["time_s"]
            sweep[i, w] = 1.0 - times.min() / times[0], g["comm_s"][0] / g["compute_s"][0], times[0], times.min()

    times = grid["time_s"]
    serial = times[..., 0]
    best_idx = times.argmin(axis=-1)
    iso = np.take_along_axis(times, best_idx[..., None], axis=-1)[..., 0]
    compute = grid["compute_s"][..., 0]
    comm = grid["comm_s"][..., 0]

    dims3 = ("system", "tp", "prompt_tokens")

    def var(dims, values, units, long_name):
        return (dims, values, {"units": units, "long_name": long_name})

    ds = xr.Dataset(
        {
            "prefill_s": var(dims3 + ("split_ratio",), times, "s", "prefill latency"),
            "savings_by_ratio": var(dims3 + ("split_ratio",), 1.0 - times / serial[..., None], "1",
                                    "prefill time saved over serial execution"),
            "serial_s": var(dims3, serial, "s", "prefill latency, serial (compute then all-reduce)"),
            "iso_s": var(dims3, iso, "s", "prefill latency, ISO at the best split ratio"),
            "best_ratio": var(dims3, np.asarray(ratios)[best_idx], "1",
                              "best split ratio (share of the prompt in the first chunk)"),
            "savings": var(dims3, 1.0 - iso / serial, "1", "prefill time saved by ISO at the best split"),
            "compute_s": var(dims3, compute, "s", "prefill compute per GPU, serial execution"),
            "comm_s": var(dims3, comm, "s", "prefill all-reduce time per GPU, serial execution"),
            "comm_share": var(dims3, comm / serial, "1", "share of serial prefill spent in all-reduces"),
            "decode_s": var(dims3, decode[..., 0], "s", "decode step latency after the prompt"),
            "decode_comm_share": var(dims3, decode[..., 1], "1", "share of a decode step spent in all-reduces"),
            "fits": var(dims3, fits, "1", "weights, KV cache and reserve fit in GPU memory"),
            "sweep_savings": var(("system", "bandwidth_GBps"), sweep[..., 0], "1",
                                 "prefill time saved by ISO at the best split, scale-up bandwidth varied"),
            "sweep_comm_to_compute": var(("system", "bandwidth_GBps"), sweep[..., 1], "1",
                                         "all-reduce time over compute time, serial prefill"),
            "sweep_serial_s": var(("system", "bandwidth_GBps"), sweep[..., 2], "s",
                                  "prefill latency, serial, scale-up bandwidth varied"),
            "sweep_iso_s": var(("system", "bandwidth_GBps"), sweep[..., 3], "s",
                               "prefill latency, ISO at the best split, scale-up bandwidth varied"),
            "link_GBps": var(("system",), np.array([s.scale_up_GBps_per_gpu for s in specs]), "GB/s",
                             "scale-up (all-reduce) bandwidth per GPU, one direction"),
            "peak_tflops": var(("system",), np.array([s.peak_flops_bf16 / 1e12 for s in specs]), "TFLOP/s",
                               "peak dense 16-bit tensor throughput per GPU"),
        },
        coords={
            "system": ("system", [s.name for s in specs], {"units": "1", "long_name": "system"}),
            "tp": ("tp", np.asarray(tp_list, dtype=np.int64), {"units": "1", "long_name": "tensor-parallel GPUs"}),
            "prompt_tokens": ("prompt_tokens", np.asarray(prompts, dtype=np.int64),
                              {"units": "tokens", "long_name": "prompt length"}),
            "split_ratio": ("split_ratio", np.asarray(ratios), {"units": "1",
                                                                "long_name": "share of the prompt in the first chunk"}),
            "bandwidth_GBps": ("bandwidth_GBps", np.asarray(bws), {"units": "GB/s",
                                                                   "long_name": "scale-up bandwidth per GPU"}),
        },
    )
    ds.attrs.update(provenance({
        "model": model_spec.name, "systems": [s.name for s in specs], "tps": tp_list, "prompt_tokens": prompts,
        "split_ratios": ratios, "batch": b, "overlap_slowdown": slow, "bandwidths_GBps": bws,
        "sweep_tp": sweep_tp, "sweep_prompt_tokens": sweep_s}))
    return ds


def _savings_over_prompts(ds: xr.Dataset, system: str, tp: int) -> np.ndarray:
    """ISO's savings at the best split for each prompt length at which the model fits (NaN elsewhere)."""
    if system not in ds["system"].values.tolist() or tp not in ds["tp"].values.tolist():
        return np.full(ds.sizes["prompt_tokens"], np.nan)
    sav = ds["savings"].sel(system=system, tp=tp).values.astype(float)
    return np.where(ds["fits"].sel(system=system, tp=tp).values, sav, np.nan)


def _mean(values: np.ndarray) -> float:
    ok = values[np.isfinite(values)]
    return float(ok.mean()) if ok.size else math.nan


def compare(folder) -> list[comparison.Record]:
    """Paper-vs-ours records from ``inference_overlap.nc`` in ``folder``: ISO's prefill savings on the
    paper's two systems (mean over the swept prompt lengths at tp 8; the prompt length is a free
    choice, its range is recorded) and the ordering of the two (4090 saving minus A800 saving)."""
    ds = tsio.read_dataset(Path(folder) / "inference_overlap.nc")
    model = json_model(ds)
    prompts = ds["prompt_tokens"].values
    span = f"prompt length {int(prompts.min())}–{int(prompts.max())} tokens"
    tp = COMPARE_TP
    sav = {key: _savings_over_prompts(ds, name, tp) for key, name in PAPER_SYSTEMS.items()}
    alt = _savings_over_prompts(ds, ALTERNATIVE_A800, tp)
    ours = f"{model}, tp {tp}, best split ratio, mean over the swept prompt lengths where the model fits"
    a800_note = (f"the paper does not state its A800 interconnect in the abstract: modelled as HGX A800 SXM4 "
                 f"(NVSwitch, NVLink 400 GB/s bidirectional; an assumption); as a PCIe card without NVLink "
                 f"({ALTERNATIVE_A800}) ISO would save {_mean(alt):.0%} here")
    records = [
        comparison.numeric(
            STUDY, "ISO prefill time saved, RTX 4090 (fraction)", "", paper_value=PAPER_SAVINGS["rtx4090"],
            paper_setting="30B/70B models, tensor parallelism on RTX 4090s (PCIe), prefill (abstract: ~35%)",
            our_value=_mean(sav["rtx4090"]), our_setting=f"{PAPER_SYSTEMS['rtx4090']}: {ours}",
            same_setting=True, neutral=0.0,
            note=("at tp 8 the all-reduce over the 4090's host-staged PCIe takes about three quarters of the serial "
                  "prefill, so hiding it behind the remaining compute saves at most about a quarter"),
            free_parameter=span, sweep=sav["rtx4090"]),
        comparison.numeric(
            STUDY, "ISO prefill time saved, A800 (fraction)", "", paper_value=PAPER_SAVINGS["a800"],
            paper_setting="30B/70B models, tensor parallelism on A800s, prefill (abstract: ~15%)",
            our_value=_mean(sav["a800"]), our_setting=f"{PAPER_SYSTEMS['a800']}: {ours}",
            same_setting=False, neutral=0.0, note=a800_note, free_parameter=span, sweep=sav["a800"]),
        comparison.numeric(
            STUDY, "ISO saving on RTX 4090 minus saving on A800 (fraction)", "",
            paper_value=PAPER_SAVINGS["rtx4090"] - PAPER_SAVINGS["a800"],
            paper_setting="the paper's two systems (35% vs 15%): larger savings on the 4090",
            our_value=_mean(sav["rtx4090"]) - _mean(sav["a800"]),
            our_setting=f"{PAPER_SYSTEMS['rtx4090']} minus {PAPER_SYSTEMS['a800']}, {ours}",
            same_setting=False, neutral=0.0,
            note=(f"the A800's NVLink is assumed (see the A800 record); with the A800 as a PCIe card ({ALTERNATIVE_A800}) the ordering reverses "
                  f"({_mean(sav['rtx4090']) - _mean(alt):+.0%}): the paper's ordering needs the A800's fast link"),
            free_parameter=span, sweep=sav["rtx4090"] - sav["a800"]),
    ]
    return records


def json_model(ds: xr.Dataset) -> str:
    return str(json.loads(ds.attrs["parameters"]).get("model", "?"))


# ---------------------------------------------------------------------------------------------- figures

def _figure_setting(folder):
    """``inference_overlap.nc`` from ``folder``, its parameters, system names, prompt lengths, one colour per
    system and each system's link kind (PCIe below 100 GB/s, else NVLink)."""
    ds = tsio.read_dataset(Path(folder) / "inference_overlap.nc")
    names = ds["system"].values.tolist()
    colors = {name: f"C{i}" for i, name in enumerate(names)}
    kinds = {name: "PCIe" if float(ds["link_GBps"].sel(system=name)) < 100 else "NVLink" for name in names}
    return ds, json.loads(ds.attrs["parameters"]), names, ds["prompt_tokens"].values, colors, kinds


def _percent():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: f"{100 * v:.4g}%")


def draw_savings(folder):
    """Prefill time saved by ISO at the best split against the prompt length, one panel per tensor-parallel
    degree, per system (hollow: weights and KV cache do not fit), with the paper's two numbers."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator

    ds, setting, names, prompts, colors, kinds = _figure_setting(folder)
    hollow = "does not fit in GPU memory (hollow)"
    tp_values = ds["tp"].values
    fig, axes = plt.subplots(1, len(tp_values), figsize=(3.4 * len(tp_values), 3.6), sharey=True, squeeze=False)
    for ax, tp in zip(axes[0], tp_values):
        for name in names:
            sav = ds["savings"].sel(system=name, tp=tp).values
            fit = ds["fits"].sel(system=name, tp=tp).values
            ax.plot(prompts, sav, color=colors[name], label=f"{name} ({kinds[name]})")
            ax.scatter(prompts[fit], sav[fit], color=colors[name], zorder=3, s=18, label=f"{name} ({kinds[name]})")
            ax.scatter(prompts[~fit], sav[~fit], facecolors="none", edgecolors=colors[name], zorder=3, s=18,
                       label=hollow)
        for value, text in ((PAPER_SAVINGS["rtx4090"], "paper: RTX 4090 ~35%"),
                            (PAPER_SAVINGS["a800"], "paper: A800 ~15%")):
            figurecheck.guide(ax.axhline(value, color="0.4", linestyle=":", linewidth=1))  # named by its text
            ax.text(prompts[0], value, text, fontsize=7, color="0.3", va="bottom")
        ax.set(xscale="log", xlabel="prompt length [tokens]", title=f"{setting['model']}, tp = {tp}")
        ax.set_xticks(prompts, [str(p) for p in prompts])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(_percent())
    axes[0][0].set_ylabel("prefill time saved by ISO")
    # one key for every panel: the systems' lines (filled markers: the model fits), and the hollow markers
    handles = [Line2D([], [], color=colors[name], marker="o", markersize=np.sqrt(18), label=f"{name} ({kinds[name]})")
               for name in names]
    handles.append(Line2D([], [], color="0.3", marker="o", markersize=np.sqrt(18), markerfacecolor="none",
                          linestyle="none", label=hollow))
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=7)
    return fig


def draw_split_ratio(folder):
    """Prefill latency against the share of the prompt in the first chunk, relative to the serial execution,
    per system, at the sweep's tensor-parallel degree and prompt length."""
    import matplotlib.pyplot as plt

    ds, setting, names, prompts, colors, kinds = _figure_setting(folder)
    tp_values = ds["tp"].values
    tp_ref = setting["sweep_tp"] if setting["sweep_tp"] in tp_values else int(tp_values[-1])
    s_ref = setting["sweep_prompt_tokens"] if setting["sweep_prompt_tokens"] in prompts else int(prompts[-1])
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    for name in names:
        rel = ds["prefill_s"].sel(system=name, tp=tp_ref, prompt_tokens=s_ref) / ds["serial_s"].sel(
            system=name, tp=tp_ref, prompt_tokens=s_ref)
        ax.plot(ds["split_ratio"], rel, marker=".", color=colors[name], label=f"{name} ({kinds[name]})")
    figurecheck.guide(ax.axhline(1.0, color="0.5", linestyle="--", linewidth=1))  # serial: the axis label's 1
    ax.xaxis.set_major_formatter(_percent())
    ax.set(xlabel="share of the prompt in the first chunk", ylabel="prefill time / serial",
           title=f"{setting['model']}, tp = {tp_ref}, {s_ref}-token prompt")
    ax.legend(loc="lower left", fontsize=8)
    return fig


def draw_bandwidth(folder):
    """Prefill time saved by ISO at the best split against the all-reduce bandwidth, each system's compute with
    its scale-up bandwidth replaced (star: its own bandwidth)."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    ds, setting, names, prompts, colors, kinds = _figure_setting(folder)
    bw = ds["bandwidth_GBps"].values
    own_text = "the system's own bandwidth"
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    for name in names:
        ax.plot(bw, ds["sweep_savings"].sel(system=name), marker=".", color=colors[name], label=name)
        own = float(ds["link_GBps"].sel(system=name))
        own_sav = np.interp(np.log(own), np.log(bw), ds["sweep_savings"].sel(system=name).values)
        ax.scatter([own], [own_sav], marker="*", s=120, color=colors[name], zorder=4, edgecolors="k", linewidths=0.5,
                   label=own_text)
    ax.set(xscale="log", xlabel="scale-up (all-reduce) bandwidth per GPU [GB/s]", ylabel="prefill time saved by ISO",
           title=f"{setting['model']}, tp = {setting['sweep_tp']}, {setting['sweep_prompt_tokens']}-token prompt")
    ax.yaxis.set_major_formatter(_percent())
    handles = [Line2D([], [], color=colors[name], marker=".", label=name) for name in names]
    handles.append(Line2D([], [], color="0.6", marker="*", markersize=np.sqrt(120), markeredgecolor="k",
                          markeredgewidth=0.5, linestyle="none", label=own_text))
    ax.legend(handles=handles, loc="upper left", fontsize=8)  # upper right: its grey star would sit on the curves
    return fig


def draw_comm_share(folder):
    """Share of time in all-reduces of the serial prefill and of one decode step against the prompt length, per
    system, at the largest tensor-parallel degree."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    ds, setting, names, prompts, colors, kinds = _figure_setting(folder)
    tp_max = int(ds["tp"].values[-1])
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    for name in names:
        ax.plot(prompts, ds["comm_share"].sel(system=name, tp=tp_max), color=colors[name], marker="o",
                label=f"{name}: prefill")
        ax.plot(prompts, ds["decode_comm_share"].sel(system=name, tp=tp_max), color=colors[name], marker="s",
                linestyle="--", label=f"{name}: decode")
    ax.set(xscale="log", xlabel="prompt length [tokens]", ylabel="share of time in all-reduces", ylim=(0, 1),
           title=f"{setting['model']}, tp = {tp_max}, serial execution")
    ax.set_xticks(prompts, [str(p) for p in prompts])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(_percent())
    ax.legend(loc="upper right", fontsize=7, ncol=2)
    return fig


#: the figures drawn from the saved dataset alone (file name -> function of the output folder)
FIGURES = {"savings.png": draw_savings, "split_ratio.png": draw_split_ratio, "bandwidth.png": draw_bandwidth,
           "comm_share.png": draw_comm_share}
