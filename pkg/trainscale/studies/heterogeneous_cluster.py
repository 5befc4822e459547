"""heterogeneous-cluster: a job planned over two accelerator types in a ratio (HETHUB-style)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import xarray as xr

from .. import perfmodel
from ..io import provenance
from ..specs import RECOMPUTE_MODES, SpecError, resolve_model, resolve_system

def heterogeneous_mix(model, systems: Sequence[str], total_nodes: int, fractions: Sequence[float],
                      link_GBps: float, global_batch: int, max_stages: int = 8,
                      link_latency_s: float = 1e-5) -> xr.Dataset:
    """HETHUB's question: a cluster of two accelerator types in a ratio; the planner's mixed-cluster
    throughput as a fraction of the sum of what each part achieves alone, by the share of nodes
    of the first type; with an even layer split over the same stages as the naive baseline.

    A part that cannot hold the model on its own trains nothing alone: it adds 0 to the sum (and
    ``alone_fits`` says so), so the mixed cluster can then exceed the sum of its parts."""
    from .. import hetero

    if len(systems) != 2:
        raise SpecError("systems", list(systems), "expected exactly two systems")
    model = resolve_model(model)
    names = ("mixed", "even-split", "first-alone", "second-alone")
    tput = np.full((len(fractions), len(names)), np.nan)
    layers_first = np.full(len(fractions), np.nan)
    alone_fits = np.zeros((len(fractions), 2), dtype=bool)
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
                continue
            part = hetero.Cluster.from_dict({"groups": [{"name": "g", "system": systems[k], "nodes": counts[k]}]})
            q = hetero.problem(model, part, global_batch, max_stages=max_stages)
            alone = hetero.plan(q)
            alone_fits[i, k] = alone is not None
            tput[i, 2 + k] = hetero.throughput_tokens_per_s(q, alone) if alone is not None else 0.0
    upper = tput[:, 2] + tput[:, 3]
    ds = xr.Dataset({
        "tokens_per_s": (("fraction", "approach"), tput, {"units": "tokens/s", "long_name": "throughput"}),
        "fraction_of_sum": ("fraction", tput[:, 0] / upper,
                            {"units": "1", "long_name": "mixed throughput / sum of the parts alone"}),
        "even_fraction_of_sum": ("fraction", tput[:, 1] / upper,
                                 {"units": "1", "long_name": "even split / sum of the parts alone"}),
        "layers_on_first": ("fraction", layers_first,
                            {"units": "1", "long_name": "share of layers on the first accelerator type"}),
        "alone_fits": (("fraction", "part"), alone_fits,
                       {"units": "1", "long_name": "the part holds the model on its own (else it adds 0 to the sum)"}),
    }, coords={"fraction": np.asarray(fractions, dtype=float), "approach": list(names), "part": list(systems)})
    ds["fraction"].attrs.update({"units": "1", "long_name": f"share of nodes that are {systems[0]}"})
    ds.attrs.update(provenance({"model": model.name, "systems": list(systems), "total_nodes": int(total_nodes),
                                "fractions": [float(f) for f in fractions], "link_GBps": float(link_GBps),
                                "global_batch": int(global_batch), "max_stages": int(max_stages)}))
    return ds
