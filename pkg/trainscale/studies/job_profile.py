"""Job-profile study (Lawenda et al., "Profiling and optimization of multi-card GPU machine learning
jobs", arXiv 2505.22905): the datasets behind its three figures.

- :func:`decomposition`: iteration time by component (compute, all-reduce, optimizer, host-to-device
  copy, data loading, launch, synchronisation) vs GPU count on one node, at each precision;
- :func:`overheads`: the overhead inputs swept: loader workers x bytes per sample x pinned or
  pageable host memory (data loading and copy), and the micro-batch (kernel launches);
- :func:`finetuning`: memory and step time of full fine-tuning, LoRA and QLoRA by adapter rank.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import numpy as np
import xarray as xr

from ..common import comparison
from ..common import io as tsio
from ..workloads import jobprofile as J
from ..common.checks import check_choice, check_float, check_int
from ..common.io import provenance
from ..model.specs import SpecError, resolve_system

__all__ = ["PAPER", "OUTPUTS", "RESOURCES", "compare", "decomposition", "overheads", "finetuning", "FIGURES"]

PAPER = "Lawenda et al., Profiling and optimization of multi-card GPU machine learning jobs (CCPE 2025)"
OUTPUTS = ("decomposition.nc", "decomposition.png", "overheads.nc", "overheads.png", "finetuning.nc", "finetuning.png")
RESOURCES = {"mem_mb": 2000, "runtime_quick_min": 10, "runtime_full_min": 30}
STUDY = "job-profile"
#: "A significant part of LLM tuning time" (kernel launches and synchronisation) is not quantified by the
#: paper; we read it as at least this share of the step (our threshold, stated in the record).
SIGNIFICANT_SHARE = 0.01


def _ints(name: str, values, minimum: int) -> list[int]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or len(values) == 0:
        raise SpecError(name, values, f"expected a non-empty list of integers >= {minimum}")
    out = [check_int(name, v, minimum) for v in values]
    if len(set(out)) != len(out):
        raise SpecError(name, list(values), "expected distinct values")
    return out


def _var(dims, data, units, long_name):
    return (dims, data, {"units": units, "long_name": long_name})


def _common(model, system, micro_batch, workers, pinned, bytes_per_sample, decode_MBps_per_worker, seq_len):
    return {"model": model if isinstance(model, str) else J.resolve_workload(model).name, "system": str(system),
            "micro_batch": int(micro_batch), "workers": int(workers), "pinned": bool(pinned),
            "bytes_per_sample": float(bytes_per_sample),
            "decode_MBps_per_worker": None if decode_MBps_per_worker is None else float(decode_MBps_per_worker),
            "seq_len": None if seq_len is None else int(seq_len)}


def decomposition(model, system, gpus: Sequence[int], micro_batch: int, workers: int = 4, pinned: bool = True,
                  bytes_per_sample: float = 602112.0, precisions: Sequence[str] = J.PRECISIONS,
                  decode_MBps_per_worker: float | None = None, seq_len: int | None = None) -> xr.Dataset:
    """Iteration time by component vs GPU count (data parallel, ``micro_batch`` samples per GPU)."""
    gpus = _ints("gpus", gpus, 1)
    if isinstance(precisions, str) or len(precisions) == 0:
        raise SpecError("precisions", precisions, f"expected a non-empty list from {', '.join(J.PRECISIONS)}")
    precisions = [check_choice("precisions", p, J.PRECISIONS) for p in precisions]
    shape = (len(precisions), len(gpus))
    parts = np.zeros(shape + (len(J.COMPONENTS),))
    step, mem, tput, busy = (np.zeros(shape) for _ in range(4))
    fits = np.zeros(shape, dtype=bool)
    for i, p in enumerate(precisions):
        for j, g in enumerate(gpus):
            r = J.profile(model, system, g, micro_batch, precision=p, workers=workers, pinned=pinned,
                          bytes_per_sample=bytes_per_sample, decode_MBps_per_worker=decode_MBps_per_worker,
                          seq_len=seq_len)
            parts[i, j] = [r.components[c] for c in J.COMPONENTS]
            step[i, j], mem[i, j], tput[i, j], busy[i, j], fits[i, j] = (r.step_time_s, r.memory_gib_per_gpu,
                                                                          r.samples_per_s, r.gpu_busy_s, r.fits)
    dims = ("precision", "gpus")
    ds = xr.Dataset({
        "time_s": _var(dims + ("component",), parts, "s", "iteration time by component"),
        "step_time_s": _var(dims, step, "s", "iteration time"),
        "gpu_busy_s": _var(dims, busy, "s", "time the GPU works per step (model step + host-to-device copy)"),
        "samples_per_s": _var(dims, tput, "samples/s", "throughput of all GPUs"),
        "memory_gib_per_gpu": _var(dims, mem, "GiB", "memory per GPU"),
        "fits": _var(dims, fits, "1", "fits in GPU memory"),
    }, coords={"precision": list(precisions), "gpus": np.asarray(gpus, dtype=np.int64),
               "component": list(J.COMPONENTS)})
    ds["gpus"].attrs.update({"units": "1", "long_name": "GPUs (data parallel, one node)"})
    ds["precision"].attrs.update({"long_name": "training precision"})
    ds["component"].attrs.update({"long_name": "component of the iteration time"})
    params = _common(model, system, micro_batch, workers, pinned, bytes_per_sample, decode_MBps_per_worker, seq_len)
    params.update({"gpus": gpus, "precisions": list(precisions)})
    ds.attrs.update(provenance(params))
    return ds


def overheads(model, system, gpus: int, micro_batch: int, workers: Sequence[int], bytes_per_sample: Sequence[float],
              micro_batches: Sequence[int], decode_MBps_per_worker: float | None = None,
              seq_len: int | None = None) -> xr.Dataset:
    """The overhead inputs swept on ``gpus`` GPUs (bf16 mixed precision).

    Data loading: exposed loader time and host-to-device copy over ``host_memory`` (pinned,
    pageable) x ``workers`` x ``bytes_per_sample``, at ``micro_batch`` samples per GPU.
    Launches: the exposed launch time over the micro-batch sizes ``micro_batches`` (4 workers,
    pinned memory, the first ``bytes_per_sample``)."""
    workers = _ints("workers", workers, 0)
    sizes = [check_float("bytes_per_sample", b, 0.0, open_min=True) for b in
             (bytes_per_sample if hasattr(bytes_per_sample, "__len__") and not isinstance(bytes_per_sample, str)
              else [bytes_per_sample])]
    if not sizes:
        raise SpecError("bytes_per_sample", bytes_per_sample, "expected a non-empty list of sizes > 0")
    mbs = _ints("micro_batches", micro_batches, 1)
    sys_ = resolve_system(system)
    decode = J.coefficients("loader")["decode_MBps_per_worker"] if decode_MBps_per_worker is None else \
        check_float("decode_MBps_per_worker", decode_MBps_per_worker, 0.0, open_min=True)
    # the GPU's own step at this micro-batch (compute, all-reduce, optimizer; launch and
    # synchronisation do not depend on the loader)
    base = J.profile(model, system, gpus, micro_batch, bytes_per_sample=sizes[0], seq_len=seq_len)
    c = base.components
    gpu_step = c["compute"] + c["all_reduce"] + c["optimizer"]
    load, copy = J.data_loading_grid(sys_, gpus, micro_batch, workers, sizes, decode, gpu_step)
    other = c["launch"] + c["synchronisation"]
    step = gpu_step + other + copy + load
    launch = np.zeros(len(mbs))
    launch_total = np.zeros(len(mbs))
    busy = np.zeros(len(mbs))
    step_mb = np.zeros(len(mbs))
    hc = J.coefficients("host")
    for k, mb in enumerate(mbs):
        r = J.profile(model, system, gpus, mb, workers=4, pinned=True, bytes_per_sample=sizes[0],
                      decode_MBps_per_worker=decode, seq_len=seq_len)
        launch[k], busy[k], step_mb[k] = r.components["launch"], r.gpu_busy_s, r.step_time_s
        launch_total[k] = r.launched_kernels * hc["launch_latency_s"]
    dims = ("host_memory", "workers", "bytes_per_sample")
    ds = xr.Dataset({
        "data_loading_s": _var(dims, load, "s", "exposed data-loading time per step"),
        "h2d_copy_s": _var(dims, copy, "s", "host-to-device copy time per step"),
        "step_time_s": _var(dims, step, "s", "iteration time"),
        "samples_per_s": _var(dims, gpus * micro_batch / step, "samples/s", "throughput of all GPUs"),
        "launch_s": _var(("micro_batch",), launch, "s", "exposed kernel-launch time per step"),
        "launch_host_s": _var(("micro_batch",), launch_total, "s", "host time to launch a step's kernels"),
        "gpu_busy_s": _var(("micro_batch",), busy, "s", "time the GPU works per step"),
        "step_time_by_micro_batch_s": _var(("micro_batch",), step_mb, "s", "iteration time"),
        "launch_share": _var(("micro_batch",), launch / step_mb, "1", "share of the step spent waiting for launches"),
    }, coords={"host_memory": ["pinned", "pageable"], "workers": np.asarray(workers, dtype=np.int64),
               "bytes_per_sample": np.asarray(sizes), "micro_batch": np.asarray(mbs, dtype=np.int64)})
    ds["workers"].attrs.update({"units": "1", "long_name": "loader workers per GPU"})
    ds["host_memory"].attrs.update({"long_name": "host memory of the input batches (pinned or pageable)"})
    ds["bytes_per_sample"].attrs.update({"units": "B", "long_name": "decoded bytes per sample"})
    ds["micro_batch"].attrs.update({"units": "samples", "long_name": "samples per GPU per step"})
    ds.attrs.update(provenance({"model": model if isinstance(model, str) else J.resolve_workload(model).name,
                                "system": str(system), "gpus": int(gpus), "micro_batch": int(micro_batch),
                                "workers": workers, "bytes_per_sample": sizes, "micro_batches": mbs,
                                "decode_MBps_per_worker": float(decode),
                                "seq_len": None if seq_len is None else int(seq_len)}))
    return ds


def finetuning(model, system, ranks: Sequence[int], targets: Sequence[str] = J.LORA_TARGETS, gpus: int = 1,
               micro_batch: int = 4, seq_len: int | None = 512, recompute: str = "none",
               reference_rank: int | None = None) -> xr.Dataset:
    """Memory per GPU (by part) and step time (by part) of full fine-tuning, LoRA and QLoRA, by rank
    (full fine-tuning does not depend on the rank). ``reference_rank`` (one of ``ranks``, default the
    middle one) is the rank the comparison is stated at (attribute ``reference_rank``)."""
    ranks = _ints("ranks", ranks, 1)
    if reference_rank is None:
        reference_rank = ranks[len(ranks) // 2]
    if reference_rank not in ranks:
        raise SpecError("reference_rank", reference_rank, f"expected one of ranks = {ranks}")
    shape = (len(J.METHODS), len(ranks))
    mem = np.zeros(shape + (len(J.MEMORY_PARTS),))
    tim = np.zeros(shape + (len(J.FT_TIME_PARTS),))
    trainable = np.zeros(shape, dtype=np.int64)
    fits = np.zeros(shape, dtype=bool)
    for i, method in enumerate(J.METHODS):
        for j, r in enumerate(ranks):
            f = J.finetune(model, system, method, rank=r, targets=targets, gpus=gpus, micro_batch=micro_batch,
                           seq_len=seq_len, recompute=recompute)
            mem[i, j] = [f.memory_bytes[p] / 2**30 for p in J.MEMORY_PARTS]
            tim[i, j] = [f.time_s[p] for p in J.FT_TIME_PARTS]
            trainable[i, j], fits[i, j] = f.trainable_params, f.fits
    spec = J.resolve_workload(model, seq_len)
    dims = ("tuning", "rank")
    tokens = gpus * micro_batch * spec.seq_len
    step = tim.sum(axis=-1)
    ds = xr.Dataset({
        "memory_gib": _var(dims + ("memory_part",), mem, "GiB", "memory per GPU by part"),
        "time_s": _var(dims + ("time_part",), tim, "s", "step time by part"),
        "total_memory_gib": _var(dims, mem.sum(axis=-1), "GiB", "memory per GPU"),
        "step_time_s": _var(dims, step, "s", "step time"),
        "tokens_per_s": _var(dims, tokens / step, "tokens/s", "fine-tuning throughput of all GPUs"),
        "trainable_params": _var(dims, trainable, "1", "trainable parameters"),
        "fits": _var(dims, fits, "1", "fits in GPU memory"),
    }, coords={"tuning": list(J.METHODS), "rank": np.asarray(ranks, dtype=np.int64),
               "memory_part": list(J.MEMORY_PARTS), "time_part": list(J.FT_TIME_PARTS)})
    ds["rank"].attrs.update({"units": "1", "long_name": "LoRA rank"})
    ds["memory_part"].attrs.update({"long_name": "part of the memory per GPU"})
    ds["time_part"].attrs.update({"long_name": "part of the step time"})
    ds["tuning"].attrs.update({"long_name": "fine-tuning method (named tuning: 'method' is a keyword of sel)"})
    ds.attrs.update(provenance({"model": model if isinstance(model, str) else spec.name, "system": str(system),
                                "ranks": ranks, "targets": list(targets), "gpus": int(gpus),
                                "micro_batch": int(micro_batch), "seq_len": spec.seq_len, "recompute": recompute,
                                "reference_rank": int(reference_rank)}))
    ds.attrs["total_params"] = int(spec.params())
    ds.attrs["reference_rank"] = int(reference_rank)
    ds.attrs["hbm_capacity_GiB"] = float(resolve_system(system).hbm_capacity_GiB)
    return ds


def compare(folder) -> list[comparison.Record]:
    """Paper-vs-ours records from the saved datasets in ``folder``. Lawenda et al. state their findings as
    directions (their tables are for their own scripts and models, which we do not have): each record is a
    ratio whose no-effect value is 1 (or a share), built with :func:`trainscale.common.comparison.directional`."""
    folder = Path(folder)
    dec = tsio.read_dataset(folder / "decomposition.nc")
    ovh = tsio.read_dataset(folder / "overheads.nc")
    ft = tsio.read_dataset(folder / "finetuning.nc")
    d, o, f = (json.loads(x.attrs["parameters"]) for x in (dec, ovh, ft))
    r0 = int(ft.attrs["reference_rank"])
    full, lora, qlora = (ft.sel(tuning=m, rank=r0) for m in ("full", "lora", "qlora"))
    llm = (f"{f['model']} on {f['gpus']} GPU(s) of {f['system']}, {f['micro_batch']}x{f['seq_len']} tokens, "
           f"LoRA rank {r0} on every linear matrix")
    paper_llm = "LLM tuning on H100 GPUs with DPO, LoRA, QLoRA and QAT (the authors' summary of their results)"
    fits = "" if bool(full["fits"]) else (f"; full fine-tuning needs {float(full['total_memory_gib']):.0f} GiB and "
                                          f"does not fit in {ft.attrs['hbm_capacity_GiB']:.0f} GiB")
    ranks = ft["rank"].values
    records = [
        comparison.directional(STUDY, "full fine-tuning step time over LoRA's", "x", paper_direction=1,
                    paper_setting=f"{paper_llm}: LoRA tunes faster than DPO", neutral=1.0,
                    our_value=float(full["step_time_s"]) / float(lora["step_time_s"]),
                    our_setting=f"full fine-tuning vs LoRA (not DPO), {llm}",
                    note="DPO trains the full policy against a reference model; ours compares full fine-tuning",
                    free_parameter=f"LoRA rank {int(ranks.min())}–{int(ranks.max())}",
                    sweep=(ft["step_time_s"].sel(tuning="full") / ft["step_time_s"].sel(tuning="lora")).values),
        comparison.directional(STUDY, "full fine-tuning memory over LoRA's", "x", paper_direction=1,
                    paper_setting=f"{paper_llm}: LoRA uses less VRAM than DPO", neutral=1.0,
                    our_value=float(full["total_memory_gib"]) / float(lora["total_memory_gib"]),
                    our_setting=f"full fine-tuning vs LoRA (not DPO), {llm}", note="as above" + fits,
                    free_parameter=f"LoRA rank {int(ranks.min())}–{int(ranks.max())}",
                    sweep=(ft["total_memory_gib"].sel(tuning="full") / ft["total_memory_gib"].sel(tuning="lora")).values),
        comparison.directional(STUDY, "LoRA memory over QLoRA's", "x", paper_direction=1,
                    paper_setting=f"{paper_llm}: QLoRA is the memory-efficient adaptation", neutral=1.0,
                    our_value=float(lora["total_memory_gib"]) / float(qlora["total_memory_gib"]),
                    our_setting=f"4-bit base weights vs bf16, {llm}",
                    free_parameter=f"LoRA rank {int(ranks.min())}–{int(ranks.max())}",
                    sweep=(ft["total_memory_gib"].sel(tuning="lora") / ft["total_memory_gib"].sel(tuning="qlora")).values),
    ]
    parts = ft["time_s"].sel(tuning="lora", rank=r0)
    share = float(parts.sel(time_part=["launch", "synchronisation"]).sum()) / float(lora["step_time_s"])
    records.append(comparison.directional(
        STUDY, "share of LoRA's step in kernel launches and synchronisation", "", paper_direction=1,
        paper_setting=f"{paper_llm}: a significant part of the tuning time goes to kernel launches and thread "
                      f"synchronisation", neutral=SIGNIFICANT_SHARE, our_value=share,
        our_setting=f"LoRA, {llm}; launches the host cannot issue ahead of the GPU, host-device synchronisation",
        note=(f"'significant' is not quantified by the paper: read here as at least {SIGNIFICANT_SHARE:.0%} of the "
              f"step (our threshold); the 7B model's kernels are long enough for the host to launch ahead")))
    g_max = int(dec["gpus"].max())
    p0 = "bf16-mixed" if "bf16-mixed" in dec["precision"].values else str(dec["precision"].values[0])
    if "fp32" in dec["precision"].values:
        ratio = dec["step_time_s"].sel(precision="fp32") / dec["step_time_s"].sel(precision=p0)
        records.append(comparison.directional(
            STUDY, f"FP32 iteration time over {p0}'s", "x", paper_direction=1,
            paper_setting="image recognition under DDP on H100s: mixed precision shortens the iteration",
            neutral=1.0, our_value=float(ratio.sel(gpus=g_max)),
            our_setting=(f"{d['model']}, {d['micro_batch']} samples/GPU, {d['workers']} loader workers, "
                         f"{g_max} GPUs of {d['system']}"),
            free_parameter=f"GPUs {int(dec['gpus'].min())}–{g_max}", sweep=ratio.values))
    w_max = int(ovh["workers"].max())
    b_ref = float(d["bytes_per_sample"]) if float(d["bytes_per_sample"]) in ovh["bytes_per_sample"].values else \
        float(ovh["bytes_per_sample"].max())
    gain = ovh["step_time_s"].sel(host_memory="pageable") / ovh["step_time_s"].sel(host_memory="pinned")
    where = f"{o['model']} on {o['gpus']} GPUs of {o['system']}, {o['micro_batch']} samples/GPU"
    records.append(comparison.directional(
        STUDY, "pageable over pinned host memory, iteration time", "x", paper_direction=1,
        paper_setting="image recognition under DDP on H100s: pin_memory gives a gain",
        neutral=1.0, our_value=float(gain.sel(workers=w_max, bytes_per_sample=b_ref)),
        our_setting=f"{where}, {w_max} loader workers (loading hidden), {b_ref / 1e3:.0f} kB per sample",
        note="with few workers the loader dominates and hides the copy: no gain there (the range's low end)",
        free_parameter=(f"loader workers {int(ovh['workers'].min())}–{w_max} x sample size "
                        f"{float(ovh['bytes_per_sample'].min()) / 1e3:.0f}–{float(ovh['bytes_per_sample'].max()) / 1e3:.0f} kB"),
        sweep=gain.values.ravel()))
    few = int(ovh["workers"].values[ovh["workers"].values > 0].min())
    tput = ovh["samples_per_s"].sel(host_memory="pinned")
    more = tput.sel(workers=w_max) / tput.sel(workers=few)
    records.append(comparison.directional(
        STUDY, f"throughput with {w_max} loader workers over {few}", "x", paper_direction=1,
        paper_setting="image recognition under DDP on H100s: the DataLoader configuration decides the throughput",
        neutral=1.0, our_value=float(more.sel(bytes_per_sample=b_ref)),
        our_setting=f"{where}, pinned memory, {b_ref / 1e3:.0f} kB per sample",
        free_parameter=(f"sample size {float(ovh['bytes_per_sample'].min()) / 1e3:.0f}–"
                        f"{float(ovh['bytes_per_sample'].max()) / 1e3:.0f} kB"), sweep=more.values))
    return records


# ---------------------------------------------------------------------------------------------- figures

def draw_decomposition(folder):
    """The iteration by component against the GPU count at the first precision (stacked; components below 0.1%
    of the iteration left out), and the iteration time at each precision (``decomposition.nc``)."""
    import matplotlib.pyplot as plt

    dec = tsio.read_dataset(Path(folder) / "decomposition.nc")
    setting = json.loads(dec.attrs["parameters"])
    g = dec["gpus"].values
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10.0, 3.8))
    bottom = np.zeros(len(g))
    ref = dec["precision"].values[0]
    for k, comp in enumerate(dec["component"].values):
        v = 1e3 * dec["time_s"].sel(precision=ref, component=comp).values
        if np.all(v < 1e-3 * 1e3 * float(dec["step_time_s"].sel(precision=ref).max())):
            continue  # invisible at this scale (e.g. launches hidden behind the GPU): no legend entry
        ax.bar(np.arange(len(g)), v, bottom=bottom, label=comp.replace("_", " "), color=f"C{k}")
        bottom += v
    ax.set_xticks(np.arange(len(g)), [str(x) for x in g])
    ax.set(xlabel="GPUs (data parallel, one node)", ylabel="iteration time (ms)",
           title=f"{setting['model']}, {setting['micro_batch']} samples/GPU, {setting['workers']} workers, {ref}")
    ax.set_ylim(0, 1.35 * float(bottom.max()))
    ax.legend(loc="upper left", fontsize=7, ncol=3)
    for k, p in enumerate(dec["precision"].values):
        bx.plot(g, 1e3 * dec["step_time_s"].sel(precision=p), marker="o", label=p, color=f"C{k}")
    bx.set(xlabel="GPUs", ylabel="iteration time (ms)", yscale="log", title=f"precision on {setting['system']}",
           xticks=g)
    bx.legend()
    return fig


def draw_overheads(folder):
    """The overhead inputs swept (``overheads.nc``): throughput against loader workers per GPU for each sample
    size, pinned and pageable host memory; and the host's kernel-launch time, the GPU's busy time and the exposed
    launch time against the micro-batch."""
    import matplotlib.pyplot as plt

    ovh = tsio.read_dataset(Path(folder) / "overheads.nc")
    o = json.loads(ovh.attrs["parameters"])
    w = ovh["workers"].values
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10.0, 3.8))
    for k, b in enumerate(ovh["bytes_per_sample"].values):
        for mem, ls in (("pinned", "-"), ("pageable", "--")):
            ax.plot(w, ovh["samples_per_s"].sel(host_memory=mem, bytes_per_sample=b), linestyle=ls, marker="o",
                    color=f"C{k}", label=f"{b / 1e3:.0f} kB/sample, {mem}")
    ax.set(xlabel="loader workers per GPU", ylabel="samples/s (all GPUs)", xscale="symlog", xticks=w,
           xticklabels=[str(x) for x in w], title=f"{o['model']} on {o['gpus']} GPUs, {o['micro_batch']} samples/GPU",
           ylim=(0, None))
    ax.legend(fontsize=7)
    mb = ovh["micro_batch"].values
    bx.plot(mb, 1e3 * ovh["launch_host_s"], marker="s", color="C3", label="host time to launch the kernels")
    bx.plot(mb, 1e3 * ovh["gpu_busy_s"], marker="o", color="C0", label="GPU busy time")
    bx.plot(mb, 1e3 * ovh["launch_s"], marker="^", color="C1", label="exposed launch time")
    bx.set(xlabel="samples per GPU per step", ylabel="ms per step", xscale="log", ylim=(0, None),
           xticks=mb, xticklabels=[str(x) for x in mb], title="kernel launches vs GPU work per step")
    bx.legend(fontsize=7)
    return fig


def draw_finetuning(folder):
    """Fine-tuning (``finetuning.nc``): memory per GPU and step time of full fine-tuning, LoRA and QLoRA at the
    comparison rank, stacked by part (parts below 0.1% of the largest bar left out; dotted: the GPU's memory),
    and the trainable parameters by LoRA rank."""
    import matplotlib.pyplot as plt

    ft = tsio.read_dataset(Path(folder) / "finetuning.nc")
    f = json.loads(ft.attrs["parameters"])
    r0 = int(ft.attrs["reference_rank"])
    methods = ft["tuning"].values
    fig, axes = plt.subplots(1, 3, figsize=(12.0, 3.8))
    for ax, var, parts, unit, scale in ((axes[0], "memory_gib", "memory_part", "GiB", 1.0),
                                        (axes[1], "time_s", "time_part", "ms", 1e3)):
        bottom = np.zeros(len(methods))
        total = var.replace("memory_gib", "total_memory_gib").replace("time_s", "step_time_s")
        for k, part in enumerate(ft[parts].values):
            v = scale * ft[var].sel(rank=r0, **{parts: part}).values
            if np.all(v < 1e-3 * scale * float(ft[total].max())):
                continue  # invisible at this scale: no legend entry
            ax.bar(np.arange(len(methods)), v, bottom=bottom, label=part.replace("_", " "), color=f"C{k}")
            bottom += v
        ax.set_xticks(np.arange(len(methods)), [str(m) for m in methods])
    axes[0].axhline(ft.attrs["hbm_capacity_GiB"], color="0.3", linestyle=":", linewidth=1,
                    label=f"GPU memory ({float(ft.attrs['hbm_capacity_GiB']):g} GiB)")
    for ax in axes[:2]:
        ax.legend(fontsize=7)
    axes[0].set(ylabel="memory per GPU (GiB)",
                title=f"{f['model']}, rank {r0}, {f['micro_batch']}x{f['seq_len']} tokens")
    axes[1].set(ylabel="step time (ms)", title=f"{f['gpus']} GPU(s), bf16")
    for k, m in enumerate(methods):
        axes[2].plot(ft["rank"], ft["trainable_params"].sel(tuning=m), marker="os^"[k % 3],
                     linestyle=["-", "-", ":"][k % 3], color=f"C{k}", label=m)
    axes[2].xaxis.set_minor_formatter(plt.NullFormatter())
    axes[2].set(xlabel="LoRA rank", ylabel="trainable parameters", xscale="log", yscale="log",
                xticks=ft["rank"].values, xticklabels=[str(x) for x in ft["rank"].values])
    axes[2].legend(fontsize=7)
    return fig


#: the figures drawn from the saved datasets alone (file name -> function of the output folder)
FIGURES = {"decomposition.png": draw_decomposition, "overheads.png": draw_overheads, "finetuning.png": draw_finetuning}
