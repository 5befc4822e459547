"""pipeline-planning: pipeline schedules (GPipe, 1F1B, interleaved, ZB-H1) priced by the performance model, and
the exact pipeline planner on servers joined by a slow network (DAPPLE-style)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import xarray as xr

from ..common import comparison, figurecheck
from ..model import perfmodel
from ..common import io as tsio
from ..common.io import provenance
from ..model.specs import RECOMPUTE_MODES, PlanSpec, SpecError, resolve_model, resolve_system

PAPER = "Fan et al., DAPPLE: A Pipelined Data Parallel Approach for Training Large Models (PPoPP 2021, arXiv 2007.01045)"
OUTPUTS = ("schedules.nc", "timelines.nc", "planner.nc", "memory_limited.nc", "gantt.png",
           "memory_vs_throughput.png", "memory_limited.png", "planner.png")
RESOURCES = {"mem_mb": 2000, "runtime_quick_min": 10, "runtime_full_min": 30}
STUDY = "pipeline-planning"
#: DAPPLE's abstract: runtime 1.6x GPipe's throughput with 12% less memory; planner up to 3.23x PipeDream's
PAPER_SCHEDULE_SPEEDUP = 1.6
PAPER_MEMORY_RATIO = 0.88
PAPER_PLANNER_SPEEDUP = 3.23
ETHERNET_GBps = 3.125  # 25 Gb/s Ethernet between servers, DAPPLE's slow cluster
PAPER_SETTING = "DAPPLE's benchmark models on V100 servers (NVLink inside, 25 Gb/s Ethernet between)"

SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved", "zb-h1")


def pipeline_stage_times(model, system, pp: int, tp: int = 8, interleave: int = 1, micro_batch: int = 1,
                         recompute: str = "full", flash_attention: bool = False) -> dict:
    """Per-virtual-stage times of the pipeline alone (dp = 1) for the schedules study, from
    :func:`trainscale.model.perfmodel.pipeline_stage_times`."""
    plan = PlanSpec(tp=tp, pp=pp, dp=1, interleave=interleave, micro_batch=micro_batch, global_batch=micro_batch * pp,
                    recompute=recompute, sequence_parallel=tp > 1, flash_attention=flash_attention)
    return perfmodel.pipeline_stage_times(model, system, plan)


def pipeline_schedules(model, system, pp: int, micro_batches: Sequence[int], tp: int = 8, interleave: int = 2,
                       gantt_micro_batches: int = 8) -> tuple[xr.Dataset, xr.Dataset]:
    """Throughput and peak activation memory of GPipe, 1F1B, interleaved 1F1B and ZB-H1 for one
    model on a ``pp``-stage pipeline of ``tp``-way tensor-parallel nodes, by micro-batch count;
    and the timeline of each schedule at ``gantt_micro_batches`` (for Gantt charts)."""
    from ..model import pipeline

    model, system = resolve_model(model), resolve_system(system)
    for m in micro_batches:
        if int(m) < 1 or int(m) % pp:
            raise SpecError("micro_batches", m, f"expected positive multiples of pp = {pp} (interleaving needs them)")
    shape = (len(SCHEDULE_NAMES), len(micro_batches))
    makespan, bubble, peak = np.full(shape, np.nan), np.full(shape, np.nan), np.full(shape, np.nan)
    timelines = {}
    for i, name in enumerate(SCHEDULE_NAMES):
        v = interleave if name == "interleaved" else 1
        st = pipeline_stage_times(model, system, pp, tp=tp, interleave=v)
        fused = name != "zb-h1"
        bwd = st["bwd"] + st["wgrad"] if fused else st["bwd"]
        wgrad = np.zeros_like(bwd) if fused else st["wgrad"]
        for j, m in enumerate(micro_batches):
            r = pipeline.simulate(name, st["fwd"], bwd, wgrad, st["send"], st["act_bytes"], micro_batches=int(m),
                                  interleave=v)
            makespan[i, j], bubble[i, j], peak[i, j] = r.makespan_s, r.bubble_fraction, r.peak_activation_bytes.max()
        r = pipeline.simulate(name, st["fwd"], bwd, wgrad, st["send"], st["act_bytes"],
                              micro_batches=int(gantt_micro_batches), interleave=v)
        timelines[name] = r.timeline
    tokens = np.asarray(micro_batches, dtype=float)[None, :] * model.seq_len
    coords = {"schedule": list(SCHEDULE_NAMES), "micro_batches": np.asarray(micro_batches, dtype=np.int64)}
    dims = ("schedule", "micro_batches")
    ds = xr.Dataset({
        "makespan_s": (dims, makespan, {"units": "s", "long_name": "pipeline makespan of one step"}),
        "tokens_per_s": (dims, tokens / makespan, {"units": "tokens/s", "long_name": "pipeline throughput"}),
        "bubble_fraction": (dims, bubble, {"units": "1", "long_name": "idle fraction of the devices"}),
        "peak_activation_gib": (dims, peak / 2**30, {"units": "GiB",
                                                     "long_name": "peak activation memory of the most loaded GPU"}),
    }, coords=coords)
    ds["micro_batches"].attrs.update({"units": "1", "long_name": "micro-batches per step"})
    ds["schedule"].attrs.update({"long_name": "pipeline schedule"})
    ds.attrs.update(provenance({"model": model.name, "system": system.name, "pp": pp, "tp": tp,
                                "interleave": interleave, "micro_batches": [int(m) for m in micro_batches],
                                "gantt_micro_batches": int(gantt_micro_batches)}))
    n_ops = max(len(t) for t in timelines.values())
    arrays = {k: np.full((len(SCHEDULE_NAMES), n_ops), np.nan) for k in ("device", "stage", "micro_batch", "op",
                                                                          "start_s", "end_s")}
    for i, name in enumerate(SCHEDULE_NAMES):
        t = timelines[name].sort_values(["device", "start_s"], kind="stable")
        n = len(t)
        arrays["device"][i, :n] = t["device"].to_numpy()
        arrays["stage"][i, :n] = t["stage"].to_numpy()
        arrays["micro_batch"][i, :n] = t["micro_batch"].to_numpy()
        arrays["op"][i, :n] = t["op"].cat.codes.to_numpy()
        arrays["start_s"][i, :n] = t["start_s"].to_numpy()
        arrays["end_s"][i, :n] = t["end_s"].to_numpy()
    meta = {"device": ("1", "device (pipeline rank)"), "stage": ("1", "virtual stage"),
            "micro_batch": ("1", "micro-batch"), "op": ("1", "operation: 0 forward, 1 backward, 2 weight gradient"),
            "start_s": ("s", "start"), "end_s": ("s", "end")}
    tl = xr.Dataset({k: (("schedule", "op_index"), v, {"units": meta[k][0], "long_name": meta[k][1]})
                     for k, v in arrays.items()},
                    coords={"schedule": list(SCHEDULE_NAMES), "op_index": np.arange(n_ops)})
    tl["schedule"].attrs.update({"long_name": "pipeline schedule"})
    tl["op_index"].attrs.update({"units": "1", "long_name": "operation (sorted by device and start)"})
    tl.attrs.update(ds.attrs)
    return ds, tl


MEMORY_SCHEDULES = ("gpipe", "1f1b")


def _static_memory_gib(model, system, plan: PlanSpec) -> float:
    """Per-GPU memory other than stored activations (weights, gradients, optimizer, transient, buffers, reserve)
    of the most loaded GPU, from the performance model's memory breakdown."""
    run = {"id": "memory", "model": model.name, "system": system.name, "gpus": plan.tp * plan.pp,
           "plan": {"tp": plan.tp, "pp": plan.pp, "dp": 1, "micro_batch": plan.micro_batch,
                    "global_batch": plan.global_batch, "recompute": plan.recompute,
                    "sequence_parallel": plan.sequence_parallel, "flash_attention": plan.flash_attention}}
    parts = perfmodel.predict(run).memory_breakdown_gib
    return sum(v for k, v in parts.items() if k != "activations")


def _schedule_point(model, system, plan: PlanSpec, schedule: str) -> tuple[float, float]:
    """(tokens/s, peak memory GiB of the most loaded GPU) of one schedule at one plan."""
    from ..model import pipeline

    st = perfmodel.pipeline_stage_times(model, system, plan)
    micro_batches = plan.global_batch // plan.micro_batch
    r = pipeline.simulate(schedule, st["fwd"], st["bwd"] + st["wgrad"], None, st["send"], st["act_bytes"],
                          micro_batches=micro_batches)
    memory = _static_memory_gib(model, system, plan) + float(r.peak_activation_bytes.max()) / 2**30
    return plan.global_batch * model.seq_len / r.makespan_s, memory


def memory_limited_schedules(model, system, pp: int, tp: int, global_batches: Sequence[int],
                             micro_batch_sizes: Sequence[int] = (1, 2, 4, 8),
                             reference_global_batch: int | None = None) -> xr.Dataset:
    """DAPPLE's GPipe-vs-1F1B comparison under a memory limit: at a fixed global batch (sequences per step of
    one pipeline), each schedule runs every micro-batch size and recompute mode; a point counts only if the most
    loaded GPU's memory (the model's static memory + the schedule's peak stored activations: GPipe holds all
    micro-batches in flight, 1F1B at most pp) fits the GPU. Each schedule's best fitting point is what it
    achieves: GPipe must recompute or shrink its micro-batches where 1F1B need not."""
    model, system = resolve_model(model), resolve_system(system)
    reference = int(global_batches[len(global_batches) // 2]) if reference_global_batch is None \
        else int(reference_global_batch)
    if reference not in [int(b) for b in global_batches]:
        raise SpecError("reference_global_batch", reference, f"expected one of global_batches {list(global_batches)}")
    dims = ("global_batch", "schedule", "recompute", "micro_batch_size")
    shape = (len(global_batches), len(MEMORY_SCHEDULES), len(RECOMPUTE_MODES), len(micro_batch_sizes))
    tput, mem = np.full(shape, np.nan), np.full(shape, np.nan)
    for i, batch in enumerate(global_batches):
        for k, rc in enumerate(RECOMPUTE_MODES):
            for m, mb in enumerate(micro_batch_sizes):
                if int(batch) % int(mb):
                    continue
                plan = PlanSpec(tp=tp, pp=pp, dp=1, micro_batch=int(mb), global_batch=int(batch), recompute=rc,
                                sequence_parallel=tp > 1, flash_attention=True)
                for j, schedule in enumerate(MEMORY_SCHEDULES):
                    tput[i, j, k, m], mem[i, j, k, m] = _schedule_point(model, system, plan, schedule)
    fits = mem <= system.hbm_capacity_GiB
    ds = xr.Dataset({
        "tokens_per_s": (dims, tput, {"units": "tokens/s", "long_name": "pipeline throughput"}),
        "memory_gib": (dims, mem, {"units": "GiB", "long_name": "memory of the most loaded GPU (static + peak "
                                                                "stored activations of the schedule)"}),
        "fits": (dims, fits, {"units": "1", "long_name": f"fits the GPU's {system.hbm_capacity_GiB:g} GiB"}),
    }, coords={"global_batch": np.asarray(global_batches, dtype=np.int64), "schedule": list(MEMORY_SCHEDULES),
               "recompute": list(RECOMPUTE_MODES), "micro_batch_size": np.asarray(micro_batch_sizes, dtype=np.int64)})
    ds["global_batch"].attrs.update({"units": "sequences", "long_name": "global batch of one pipeline"})
    ds["micro_batch_size"].attrs.update({"units": "sequences", "long_name": "micro-batch size"})
    ds["schedule"].attrs.update({"long_name": "pipeline schedule"})
    ds["recompute"].attrs.update({"long_name": "activation recomputation"})
    ds.attrs.update(provenance({"model": model.name, "system": system.name, "pp": int(pp), "tp": int(tp),
                                "global_batches": [int(b) for b in global_batches],
                                "micro_batch_sizes": [int(b) for b in micro_batch_sizes],
                                "hbm_capacity_GiB": float(system.hbm_capacity_GiB),
                                "reference_global_batch": reference}))
    return ds


def best_fitting(ds: xr.Dataset) -> xr.Dataset:
    """Per global batch and schedule: the best fitting point's throughput and memory (NaN: nothing fits)."""
    tput = ds["tokens_per_s"].where(ds["fits"])
    stacked = tput.stack(point=("recompute", "micro_batch_size"))
    best = stacked.fillna(-1.0).argmax("point")
    mem = ds["memory_gib"].stack(point=("recompute", "micro_batch_size"))
    out = xr.Dataset({"tokens_per_s": stacked.isel(point=best).drop_vars(["point", "recompute", "micro_batch_size"]),
                      "memory_gib": mem.isel(point=best).drop_vars(["point", "recompute", "micro_batch_size"])})
    return out.where(np.isfinite(out["tokens_per_s"]))


def _single_group(system, nodes: int, scale_out_GBps_per_node: float):
    from ..model import hetero

    base = resolve_system(system)
    sys_over = {"name": base.name, "scale_out_GBps_per_gpu": scale_out_GBps_per_node / base.gpus_per_node}
    return hetero.Cluster.from_dict({"groups": [{"name": base.name, "system": sys_over, "nodes": int(nodes)}]})


PLANNER_APPROACHES = ("planner", "pipedream", "data-parallel", "even-pipeline")


def _planner_row(p, model, nodes: int, global_batch: int, max_stages: int) -> list:
    """(plan or None) of each approach on one problem: DAPPLE's planner (the exact optimum of the synchronous
    step), PipeDream's planner on the same plans and costs, one replica per node, one evenly split pipeline."""
    from ..model import hetero

    dp_only = hetero.evaluate(p, nodes, [0], [model.layers]) if global_batch % nodes == 0 else None
    stages = min(nodes, max_stages, model.layers)
    return [hetero.plan(p), hetero.plan_pipedream(p), dp_only, hetero.even_split_plan(p, 1, [0] * stages)]


def pipeline_planner(model, system, nodes: int, global_batches: Sequence[int], bandwidth_GBps: Sequence[float],
                     max_stages: int = 8, reference_global_batch: int | None = None) -> xr.Dataset:
    """DAPPLE's question on servers with fast links inside and a slow network between: the throughput of
    DAPPLE's planner (the best replicas x stages x layer split for the synchronous step) against PipeDream's
    planner (the same plans and costs, balanced for the asynchronous steady state: ``hetero.plan_pipedream``),
    data parallelism alone (one node per replica, if the model fits) and one pipeline over all nodes with the
    layers split evenly; by global batch (the micro-batches per replica) and network bandwidth per node."""
    from ..model import hetero

    model = resolve_model(model)
    batches = [int(b) for b in global_batches]
    reference = batches[len(batches) // 2] if reference_global_batch is None else int(reference_global_batch)
    if reference not in batches:
        raise SpecError("planner_global_batch", reference, f"expected one of planner_global_batches {batches}")
    shape = (len(batches), len(bandwidth_GBps), len(PLANNER_APPROACHES))
    tput, dp, pp = np.full(shape, np.nan), np.full(shape, -1, dtype=np.int64), np.full(shape, -1, dtype=np.int64)
    for i, batch in enumerate(batches):
        for j, bw in enumerate(bandwidth_GBps):
            p = hetero.problem(model, _single_group(system, nodes, float(bw)), batch, max_stages=max_stages)
            for k, pl in enumerate(_planner_row(p, model, nodes, batch, max_stages)):
                if pl is not None:
                    tput[i, j, k] = hetero.throughput_tokens_per_s(p, pl)
                    dp[i, j, k], pp[i, j, k] = pl.dp, len(pl.groups)
    dims = ("global_batch", "bandwidth_GBps", "approach")
    ds = xr.Dataset({
        "tokens_per_s": (dims, tput, {"units": "tokens/s", "long_name": "cluster throughput (synchronous 1F1B step)"}),
        "dp": (dims, dp, {"units": "1", "long_name": "pipeline replicas of the plan (-1: none fits)"}),
        "pp": (dims, pp, {"units": "1", "long_name": "pipeline stages of the plan (-1: none fits)"}),
    }, coords={"global_batch": np.asarray(batches, dtype=np.int64),
               "bandwidth_GBps": np.asarray(bandwidth_GBps, dtype=float), "approach": list(PLANNER_APPROACHES)})
    ds["global_batch"].attrs.update({"units": "sequences", "long_name": "global batch (sequences per step)"})
    ds["bandwidth_GBps"].attrs.update({"units": "GB/s", "long_name": "network bandwidth per node"})
    ds["approach"].attrs.update({"long_name": "plan: DAPPLE's planner, PipeDream's planner, data parallel only, "
                                              "or one even pipeline"})
    ds.attrs.update(provenance({"model": model.name, "system": str(system), "nodes": int(nodes),
                                "global_batches": batches, "reference_global_batch": reference,
                                "max_stages": int(max_stages), "bandwidth_GBps": [float(b) for b in bandwidth_GBps]}))
    return ds


def _planner_record(pl: xr.Dataset) -> comparison.Record:
    """DAPPLE's planner over PipeDream's on 25 Gb/s Ethernet at the reference global batch, with the range over
    every swept global batch and bandwidth."""
    tput = pl["tokens_per_s"]
    gain = tput.sel(approach="planner") / tput.sel(approach="pipedream")
    params = json.loads(pl.attrs["parameters"])
    bws = pl["bandwidth_GBps"].values
    at = np.flatnonzero(np.isclose(bws, ETHERNET_GBps))
    ours = (float(gain.sel(global_batch=params["reference_global_batch"]).values[at[0]]) if at.size
            else float("nan"))
    return comparison.numeric(
        STUDY, "DAPPLE's planner / PipeDream's planner, throughput on 25 Gb/s Ethernet", "1",
        paper_value=PAPER_PLANNER_SPEEDUP, paper_setting=PAPER_SETTING + "; up to, over its benchmark models",
        our_value=ours,
        our_setting=(f"{params['model']} (not one of DAPPLE's models) on {params['nodes']} x {params['system']}, "
                     f"tp inside a server, one server per stage, global batch {params['reference_global_batch']}; "
                     "both planners over the same plans and costs, each plan priced by its synchronous step"),
        same_setting=False, neutral=1.0, free_parameter="global batch (micro-batches) and network bandwidth per node",
        sweep=gain.values.ravel(),
        note=("PipeDream's planner balances the asynchronous steady state and ignores the pipeline's fill and drain; "
              "with one server per stage every stage boundary crosses the same network, so stage placement (the "
              "other half of DAPPLE's planner) cannot differ here, and at 16+ micro-batches per replica the fill "
              "and drain changes the plan chosen little"))


def compare(folder) -> list[comparison.Record]:
    """DAPPLE's three numbers against ours: 1F1B over GPipe in throughput and in memory when each runs its best
    plan that fits the GPU (range over the swept global batches), and its planner's speed-up over PipeDream's
    planner on 25 Gb/s Ethernet (range over global batches and bandwidths)."""
    folder = Path(folder)
    lim = tsio.read_dataset(folder / "memory_limited.nc")
    best = best_fitting(lim)
    speed = (best["tokens_per_s"].sel(schedule="1f1b") / best["tokens_per_s"].sel(schedule="gpipe")).values
    memory = (best["memory_gib"].sel(schedule="1f1b") / best["memory_gib"].sel(schedule="gpipe")).values
    setting = json.loads(lim.attrs["parameters"])
    batches = lim["global_batch"].values
    ref = int(np.flatnonzero(batches == setting["reference_global_batch"])[0])
    ours = (f"{setting['model']}, {setting['pp']} stages x tp {setting['tp']} on {setting['system']}, global batch "
            f"{int(batches[ref])}; each schedule at its best fitting micro-batch size and recompute mode")
    planner = _planner_record(tsio.read_dataset(folder / "planner.nc"))
    return [
        comparison.numeric(STUDY, "1F1B / GPipe throughput under the GPU memory limit", "1",
                           paper_value=PAPER_SCHEDULE_SPEEDUP, paper_setting=PAPER_SETTING,
                           our_value=float(speed[ref]), our_setting=ours, same_setting=False, neutral=1.0,
                           free_parameter="global batch", sweep=speed),
        comparison.numeric(STUDY, "1F1B / GPipe memory under the GPU memory limit", "1",
                           paper_value=PAPER_MEMORY_RATIO, paper_setting=PAPER_SETTING,
                           our_value=float(memory[ref]), our_setting=ours, same_setting=False, neutral=1.0,
                           free_parameter="global batch", sweep=memory,
                           note="GPipe recomputes to fit, 1F1B keeps pp micro-batches' activations"),
        planner,
    ]


# ---------------------------------------------------------------------------------------------- figures

SCHEDULE_LABELS = {"gpipe": "GPipe", "1f1b": "1F1B (DAPPLE)", "interleaved": "interleaved 1F1B", "zb-h1": "ZB-H1"}
_MARKERS = {"gpipe": "o", "1f1b": "s", "interleaved": "^", "zb-h1": "D"}
_APPROACH_LABELS = {"planner": "DAPPLE's planner", "pipedream": "PipeDream's planner",
                    "data-parallel": "data parallel only", "even-pipeline": "one pipeline, even split"}
_APPROACH_MARKERS = {"planner": "o", "pipedream": "x", "data-parallel": "s", "even-pipeline": "^"}


def draw_gantt(folder):
    """The timeline of each schedule at the same number of micro-batches, on a common time axis: one panel per
    schedule, one row per device; forward (F), backward (B; input gradient only for ZB-H1) and weight-gradient (W)
    passes, each bar labelled with its micro-batch and shaded lighter for later micro-batches; hatched: the
    interleaved schedule's second model chunk."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    folder = Path(folder)
    tl = tsio.read_dataset(folder / "timelines.nc")
    setting = json.loads(tl.attrs["parameters"])
    op_cmaps = [plt.cm.Blues, plt.cm.Oranges, plt.cm.Greens]
    op_labels = ["F: forward", "B: backward", "W: weight gradient"]
    n_dev = int(np.nanmax(tl["device"].values)) + 1
    n_mb = int(np.nanmax(tl["micro_batch"].values)) + 1
    t_end = float(np.nanmax(tl["end_s"].values))
    schedules = tl["schedule"].values.tolist()
    fig, axes = plt.subplots(len(schedules), 1, figsize=(10.0, 1.0 + 0.42 * n_dev * len(schedules)), sharex=True,
                             squeeze=False)
    for ax, name in zip(axes[:, 0], schedules):
        row = tl.sel(schedule=name)
        keep = np.isfinite(row["start_s"].values)
        dev, stage, mb, op, start, end = (row[v].values[keep] for v in ("device", "stage", "micro_batch", "op",
                                                                         "start_s", "end_s"))
        for d, s, m, o, t0, t1 in zip(dev.astype(int), stage.astype(int), mb.astype(int), op.astype(int), start, end):
            color = op_cmaps[o](0.85 - 0.5 * m / max(n_mb - 1, 1))
            second_chunk = s >= n_dev  # virtual stages n_dev.. are the devices' second chunks
            ax.barh(d, t1 - t0, left=t0, height=0.8, color=color, edgecolor="white", linewidth=0.4,
                    hatch="////" if second_chunk else None, label="second chunk" if second_chunk else op_labels[o])
            if t1 - t0 > 0.009 * t_end:
                ax.text((t0 + t1) / 2, d, str(m), ha="center", va="center", fontsize=6,
                        color="white" if m < n_mb / 2 else "black")
        makespan = float(np.nanmax(end))
        ax.set_yticks(range(n_dev), [f"GPU {d}" for d in range(n_dev)])
        ax.set_ylim(-0.5, n_dev - 0.5)
        figurecheck.invert_on_purpose(ax, "y")  # GPU 0 on top
        ax.grid(axis="y", visible=False)
        ax.set_title(f"{SCHEDULE_LABELS.get(name, name)}: makespan {makespan:.2f} s", loc="left")
    axes[-1, 0].set_xlabel("time [s]")
    axes[-1, 0].set_xlim(0, t_end * 1.01)
    handles = [Patch(color=cmap(0.7), label=label) for cmap, label in zip(op_cmaps, op_labels)]
    handles.append(Patch(facecolor="white", edgecolor="0.4", hatch="////", label="second chunk"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles))
    fig.suptitle(f"{setting['model']}, {n_dev} stages × tp {setting['tp']} on {setting['system']}, "
                 f"{n_mb} micro-batches (bar labels: micro-batch)", fontsize=9)
    return fig


def draw_memory_vs_throughput(folder):
    """Peak activation memory of the most loaded GPU against pipeline throughput, one series per schedule, each
    point labelled with its number of micro-batches."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    from ..common import plotting

    ds = tsio.read_dataset(Path(folder) / "schedules.nc")
    setting = json.loads(ds.attrs["parameters"])
    fig, ax = plt.subplots(figsize=(7.4, 4.4))
    # label placement (offset in points, horizontal alignment) per schedule, so coinciding points stay readable
    offsets = {"gpipe": ((7, -3), "left"), "1f1b": ((0, -13), "center"), "interleaved": ((0, 7), "center"),
               "zb-h1": ((0, 7), "center")}
    for i, name in enumerate(ds["schedule"].values.tolist()):
        x = ds["tokens_per_s"].sel(schedule=name).values
        y = ds["peak_activation_gib"].sel(schedule=name).values
        ax.plot(x, y, marker=_MARKERS.get(name, "o"), markersize=6, color=f"C{i}",
                label=SCHEDULE_LABELS.get(name, name), alpha=0.85)
        offset, align = offsets.get(name, ((4, 4), "left"))
        for m, xi, yi in zip(ds["micro_batches"].values, x, y):
            ax.annotate(f"m={int(m)}", (xi, yi), textcoords="offset points", xytext=offset, fontsize=6.5,
                        color=f"C{i}", ha=align)
    ax.set_yscale("log")
    ax.margins(x=0.08, y=0.15)
    lo, hi = ax.get_ylim()
    ticks = [t for t in 2.0 ** np.arange(-6, 10) if lo <= t <= hi]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set(xlabel=plotting.label(ds["tokens_per_s"]), ylabel=plotting.label(ds["peak_activation_gib"]))
    ax.set_title(f"{setting['model']}, {setting['pp']} stages × tp {setting['tp']} on {setting['system']}; "
                 "m: micro-batches", loc="left")
    ax.legend(loc="upper left")
    return fig


def draw_planner(folder):
    """Throughput of DAPPLE's planner, PipeDream's planner, pure data parallelism and an evenly split pipeline
    against the network bandwidth per server, at the reference global batch; the planners' points labelled with
    their plans (replicas x stages), 25 Gb/s Ethernet dotted."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullLocator

    from ..common import plotting

    pl = tsio.read_dataset(Path(folder) / "planner.nc")
    params = json.loads(pl.attrs["parameters"])
    ref_pl = pl.sel(global_batch=params["reference_global_batch"])
    bw = pl["bandwidth_GBps"].values
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, approach in enumerate(pl["approach"].values.tolist()):
        ax.plot(bw, ref_pl["tokens_per_s"].sel(approach=approach), marker=_APPROACH_MARKERS.get(approach, "o"),
                color=f"C{i}", linestyle="-" if approach in ("planner", "pipedream") else "--",
                label=_APPROACH_LABELS.get(approach, approach))
    for k, (approach, dy) in enumerate((("planner", 7), ("pipedream", -12))):
        r = ref_pl.sel(approach=approach)
        for b, y, dp, pp_ in zip(bw, r["tokens_per_s"].values, r["dp"].values, r["pp"].values):
            if dp > 0:
                ax.annotate(f"{int(dp)}×{int(pp_)}", (b, y), textcoords="offset points", xytext=(0, dy),
                            ha="center", fontsize=7, color=f"C{k}")
    if bw.min() <= ETHERNET_GBps <= bw.max():
        figurecheck.guide(ax.axvline(ETHERNET_GBps, color="0.4", linestyle=":", linewidth=1))  # labelled below
        ax.text(ETHERNET_GBps, 0.02, " 25 Gb/s Ethernet", transform=ax.get_xaxis_transform(), fontsize=7,
                color="0.3")
    ax.set_xscale("log")
    ax.set_xticks(bw, [f"{b:g}" for b in bw])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1e3:g}k"))
    ax.set(xlabel=plotting.label(pl["bandwidth_GBps"]), ylabel=plotting.label(pl["tokens_per_s"]), ylim=(0, None))
    ax.set_title(f"{params['model']} on {params['nodes']} × {params['system']}, global batch "
                 f"{params['reference_global_batch']}; labels: replicas × stages", loc="left")
    ax.legend(loc="lower right")
    return fig


def draw_memory_limited(folder):
    """GPipe against 1F1B under the GPU's memory: each schedule's best plan that fits, by global batch (left:
    throughput, each point labelled with the plan chosen; right: memory of the most loaded GPU, with the GPU's
    capacity dashed)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    from ..common import plotting

    lim = tsio.read_dataset(Path(folder) / "memory_limited.nc")
    best = best_fitting(lim)
    setting = json.loads(lim.attrs["parameters"])
    batches = lim["global_batch"].values
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(9.6, 3.8))
    for i, name in enumerate(best["schedule"].values.tolist()):
        fitting = lim["tokens_per_s"].sel(schedule=name).where(lim["fits"].sel(schedule=name))
        stacked = fitting.stack(point=("recompute", "micro_batch_size"))
        choice = stacked.fillna(-1.0).argmax("point").values
        labels = [f"{stacked['recompute'].values[c]}, mb {int(stacked['micro_batch_size'].values[c])}"
                  for c in choice]
        for ax, var in ((ax_t, "tokens_per_s"), (ax_m, "memory_gib")):
            y = best[var].sel(schedule=name).values
            ax.plot(batches, y, marker=_MARKERS.get(name, "o"), color=f"C{i}", label=SCHEDULE_LABELS.get(name, name))
            if ax is ax_t:
                for x, yi, text in zip(batches, y, labels):
                    ax.annotate(text, (x, yi), textcoords="offset points", xytext=(0, 7 if i else -12),
                                ha="center", fontsize=6.5, color=f"C{i}")
    ax_m.axhline(setting["hbm_capacity_GiB"], color="0.4", linestyle="--", linewidth=1, label="GPU memory")
    for ax in (ax_t, ax_m):
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(int(b)) for b in batches])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel(plotting.label(lim["global_batch"]))
        ax.margins(y=0.15)
    ax_t.set_ylabel(plotting.label(lim["tokens_per_s"]))
    ax_m.set_ylabel("memory of the most loaded GPU [GiB]")
    ax_t.legend(loc="lower right")
    ax_m.legend(loc="lower right")
    fig.suptitle(f"{setting['model']}, {setting['pp']} stages x tp {setting['tp']} on {setting['system']}: "
                 "each schedule's best plan that fits", fontsize=9)
    return fig


#: the figures drawn from the saved datasets alone (file name -> function of the output folder)
FIGURES = {"gantt.png": draw_gantt, "memory_vs_throughput.png": draw_memory_vs_throughput,
           "planner.png": draw_planner, "memory_limited.png": draw_memory_limited}
