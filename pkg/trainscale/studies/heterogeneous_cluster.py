"""heterogeneous-cluster: a job planned over two accelerator types in a ratio (HETHUB-style)."""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np
import xarray as xr

from pathlib import Path

from .. import comparison
from .. import io as tsio
from ..io import provenance
from ..specs import SpecError, resolve_model

PAPER = "Xu et al., HETHUB: A Distributed Training System with Heterogeneous Cluster for Large-Scale Models (arXiv 2405.16256)"
OUTPUTS = ("mix.nc", "fraction_of_sum.png", "throughput.png", "layers_on_first.png")
RESOURCES = {"mem_mb": 2000, "runtime_quick_min": 10, "runtime_full_min": 30}
STUDY = "heterogeneous-cluster"
#: HETHUB's best fraction of the sum of the homogeneous throughputs (768 accelerators, Llama-140B)
PAPER_FRACTION = 0.9749
PAPER_SETTING = "768 accelerators of several types, a 140B-parameter Llama model (HETHUB)"

def heterogeneous_mix(model, systems: Sequence[str], total_nodes: int, fractions: Sequence[float],
                      link_GBps: float, global_batch: int, max_stages: int = 8,
                      link_latency_s: float = 1e-5) -> xr.Dataset:
    """HETHUB's question: a cluster of two accelerator types in a ratio; the planner's mixed-cluster
    throughput as a fraction of the sum of what each part achieves alone, by the share of nodes
    of the first type; with an even layer split over the same stages as the naive baseline.

    A part that cannot hold the model on its own trains nothing alone: the sum of the parts is then no
    reference (the mixed cluster would "exceed" it), so ``fraction_of_sum`` is NaN there (``alone_fits``
    says which part); ``tokens_per_s`` keeps every value."""
    from .. import hetero

    if len(systems) != 2:
        raise SpecError("systems", list(systems), "expected exactly two systems")
    model = resolve_model(model)
    names = ("mixed", "even-split", "first-alone", "second-alone")
    tput = np.full((len(fractions), len(names)), np.nan)
    layers_first = np.full(len(fractions), np.nan)
    alone_fits = np.zeros((len(fractions), 2), dtype=bool)
    empty = np.zeros((len(fractions), 2), dtype=bool)
    for i, f in enumerate(fractions):
        if not 0.0 <= float(f) <= 1.0:
            raise SpecError("fractions", f, "expected shares between 0 and 1")
        n0 = int(round(float(f) * total_nodes))
        counts = (n0, total_nodes - n0)
        groups = [{"name": f"g{k}", "system": s, "nodes": n} for k, (s, n) in enumerate(zip(systems, counts)) if n > 0]
        links = [{"between": ["g0", "g1"], "bandwidth_GBps": float(link_GBps), "latency_s": float(link_latency_s)}] \
            if len(groups) == 2 else []
        cluster = hetero.Cluster.from_dict({"groups": groups, "links": links})
        p = hetero.problem(model, cluster, global_batch, max_stages=max_stages)
        best = hetero.plan(p)
        if best is not None:
            tput[i, 0] = hetero.throughput_tokens_per_s(p, best)
            tput[i, 1] = hetero.throughput_tokens_per_s(p, hetero.even_split_plan(p, best.dp, list(best.groups)))
            first = [g for g in cluster.groups if g.name == "g0"]
            if first:
                layers_first[i] = sum(l for g, l in zip(best.groups, best.layers) if g == 0) / model.layers
            else:
                layers_first[i] = 0.0
        for k in range(2):
            if counts[k] == 0:
                tput[i, 2 + k] = 0.0
                empty[i, k] = True
                continue
            part = hetero.Cluster.from_dict({"groups": [{"name": "g", "system": systems[k], "nodes": counts[k]}]})
            q = hetero.problem(model, part, global_batch, max_stages=max_stages)
            alone = hetero.plan(q)
            alone_fits[i, k] = alone is not None
            tput[i, 2 + k] = hetero.throughput_tokens_per_s(q, alone) if alone is not None else 0.0
    # the sum of the parts is a reference only where every non-empty part trains on its own
    upper = np.where((alone_fits | empty).all(axis=1), tput[:, 2] + tput[:, 3], np.nan)
    ds = xr.Dataset({
        "tokens_per_s": (("fraction", "approach"), tput, {"units": "tokens/s", "long_name": "throughput"}),
        "fraction_of_sum": ("fraction", tput[:, 0] / upper,
                            {"units": "1", "long_name": "mixed throughput / sum of the parts alone (NaN: a part cannot train alone)"}),
        "even_fraction_of_sum": ("fraction", tput[:, 1] / upper,
                                 {"units": "1", "long_name": "even split / sum of the parts alone (NaN: a part cannot train alone)"}),
        "layers_on_first": ("fraction", layers_first,
                            {"units": "1", "long_name": "share of layers on the first accelerator type"}),
        "alone_fits": (("fraction", "part"), alone_fits,
                       {"units": "1", "long_name": "the part holds the model on its own (else it adds 0 to the sum)"}),
    }, coords={"fraction": np.asarray(fractions, dtype=float), "approach": list(names), "part": list(systems)})
    ds["fraction"].attrs.update({"units": "1", "long_name": f"share of nodes that are {systems[0]}"})
    ds["approach"].attrs.update({"long_name": "plan: mixed (planner), even split, or one part alone"})
    ds["part"].attrs.update({"long_name": "accelerator type of the part"})
    ds.attrs.update(provenance({"model": model.name, "systems": list(systems), "total_nodes": int(total_nodes),
                                "fractions": [float(f) for f in fractions], "link_GBps": float(link_GBps),
                                "global_batch": int(global_batch), "max_stages": int(max_stages)}))
    return ds


def _mixed(ds: xr.Dataset) -> np.ndarray:
    """Shares where the cluster is truly mixed and the sum of the parts is defined."""
    share = ds["fraction"].values
    return (share > 0) & (share < 1) & np.isfinite(ds["fraction_of_sum"].values)


def compare(folder) -> list[comparison.Record]:
    """HETHUB's best fraction of the sum of the parts against ours (the best over the truly mixed shares where
    each part trains alone; the range over those shares recorded), and the planner's direction against an
    even layer split (the paper splits layers by speed and memory)."""
    ds = tsio.read_dataset(Path(folder) / "mix.nc")
    setting = json.loads(ds.attrs["parameters"])
    ours = (f"{setting['model']} on {setting['total_nodes']} nodes of {' + '.join(setting['systems'])}, "
            f"global batch {setting['global_batch']}")
    ok = _mixed(ds)
    frac = ds["fraction_of_sum"].values[ok]
    best = float(frac.max()) if frac.size else float("nan")
    tput = ds["tokens_per_s"]
    gain = (tput.sel(approach="mixed") / tput.sel(approach="even-split")).values[ok]
    return [
        comparison.numeric(
            STUDY, "best mixed throughput / sum of the parts alone", "1", paper_value=PAPER_FRACTION,
            paper_setting=PAPER_SETTING, our_value=best, same_setting=False, neutral=float("nan"),
            our_setting=ours + "; best over the mixes where each part trains alone",
            free_parameter="share of nodes of the first type (mixes where each part trains alone)", sweep=frac,
            note=f"{int(ok.sum())} mixes qualify; where a part cannot hold the model alone the ratio is undefined"),
        comparison.directional(
            STUDY, "planner (layers by speed and memory) / even layer split, mean over mixes", "1",
            paper_direction=1, paper_setting=PAPER_SETTING + ": layers split in proportion to speed and memory",
            our_value=float(np.mean(gain)) if gain.size else float("nan"), our_setting=ours, neutral=1.0,
            free_parameter="share of nodes of the first type", sweep=gain),
    ]
