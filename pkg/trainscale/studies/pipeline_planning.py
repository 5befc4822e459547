"""pipeline-planning: pipeline schedules (GPipe, 1F1B, interleaved, ZB-H1) priced by the performance model, and
the exact pipeline planner on servers joined by a slow network (DAPPLE-style)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import xarray as xr

from .. import perfmodel
from ..io import provenance
from ..specs import RECOMPUTE_MODES, SpecError, resolve_model, resolve_system

SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved", "zb-h1")


def pipeline_stage_times(model, system, pp: int, tp: int = 8, interleave: int = 1, micro_batch: int = 1,
                         recompute: str = "full", flash_attention: bool = False) -> dict:
    """Per-virtual-stage times of the pipeline alone (dp = 1) for the schedules study, from
    :func:`trainscale.perfmodel.pipeline_stage_times`."""
    from ..specs import PlanSpec

    plan = PlanSpec(tp=tp, pp=pp, dp=1, interleave=interleave, micro_batch=micro_batch, global_batch=micro_batch * pp,
                    recompute=recompute, sequence_parallel=tp > 1, flash_attention=flash_attention)
    return perfmodel.pipeline_stage_times(model, system, plan)


def pipeline_schedules(model, system, pp: int, micro_batches: Sequence[int], tp: int = 8, interleave: int = 2,
                       gantt_micro_batches: int = 8) -> tuple[xr.Dataset, xr.Dataset]:
    """Throughput and peak activation memory of GPipe, 1F1B, interleaved 1F1B and ZB-H1 for one
    model on a ``pp``-stage pipeline of ``tp``-way tensor-parallel nodes, by micro-batch count;
    and the timeline of each schedule at ``gantt_micro_batches`` (for Gantt charts)."""
    from .. import pipeline

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
    tl.attrs.update(ds.attrs)
    return ds, tl


def _single_group(system, nodes: int, scale_out_GBps_per_node: float):
    from .. import hetero

    base = resolve_system(system)
    sys_over = {"name": base.name, "scale_out_GBps_per_gpu": scale_out_GBps_per_node / base.gpus_per_node}
    return hetero.Cluster.from_dict({"groups": [{"name": base.name, "system": sys_over, "nodes": int(nodes)}]})


def pipeline_planner(model, system, nodes: int, global_batch: int, network_GBps_per_node: Sequence[float],
                     max_stages: int = 8) -> xr.Dataset:
    """DAPPLE's question on servers with fast links inside and a slow network between: the
    planner's best replicas x stages x layer split vs data parallelism alone (one node per replica,
    if the model fits) and vs one pipeline over all nodes with layers split evenly."""
    from .. import hetero

    model = resolve_model(model)
    names = ("planner", "data-parallel", "even-pipeline")
    tput = np.full((len(network_GBps_per_node), len(names)), np.nan)
    dp_best, pp_best = np.full(len(network_GBps_per_node), -1), np.full(len(network_GBps_per_node), -1)
    for i, bw in enumerate(network_GBps_per_node):
        p = hetero.problem(model, _single_group(system, nodes, float(bw)), global_batch, max_stages=max_stages)
        best = hetero.plan(p)
        if best is not None:
            tput[i, 0] = hetero.throughput_tokens_per_s(p, best)
            dp_best[i], pp_best[i] = best.dp, len(best.groups)
        if global_batch % nodes == 0:
            tput[i, 1] = hetero.throughput_tokens_per_s(p, hetero.evaluate(p, nodes, [0], [model.layers]))
        stages = min(nodes, max_stages, model.layers)
        tput[i, 2] = hetero.throughput_tokens_per_s(p, hetero.even_split_plan(p, 1, [0] * stages))
    ds = xr.Dataset({
        "tokens_per_s": (("network_GBps", "approach"), tput, {"units": "tokens/s", "long_name": "cluster throughput"}),
        "dp": ("network_GBps", dp_best, {"units": "1", "long_name": "planner: pipeline replicas (-1: none fits)"}),
        "pp": ("network_GBps", pp_best, {"units": "1", "long_name": "planner: pipeline stages"}),
    }, coords={"network_GBps": np.asarray(network_GBps_per_node, dtype=float), "approach": list(names)})
    ds["network_GBps"].attrs.update({"units": "GB/s", "long_name": "network bandwidth per node"})
    ds.attrs.update(provenance({"model": model.name, "system": str(system), "nodes": int(nodes),
                                "global_batch": int(global_batch), "max_stages": int(max_stages),
                                "network_GBps_per_node": [float(b) for b in network_GBps_per_node]}))
    return ds
