"""Data-centre design for dense and mixture-of-experts training (Tithi et al., "Scaling Intelligence:
Designing Data Centers for Next-Gen Language Models", arXiv 2506.15006, 2025).

Every design point is one system (a catalog entry with overrides: scale-up domain size, HBM capacity
and bandwidth, scale-out bandwidth and latency, and the scale-out topology) on which the model is
trained at its best plan, found by :func:`trainscale.model.planner.search` over tensor, pipeline, data
and (for a mixture of experts) expert parallelism, micro-batch, interleaving and recomputation.

Two scale-out networks, with the same NIC bandwidth per GPU:

- ``two-tier``: a fat-tree whose leaf switches each serve ``leaf_gpus`` GPUs and are
  ``oversubscription : 1`` oversubscribed towards the spine; traffic that leaves a leaf gets
  ``1 / oversubscription`` of the NIC bandwidth and crosses 4 link hops instead of 2;
- ``flat``: one tier of switches (e.g. a high-radix optical fabric, the paper's "FullFlat"): every
  pair of GPUs is 2 hops apart at the full NIC bandwidth.

The sweeps (each a group of variables in one Dataset):

- ``*_domain``: model x network x scale-up domain size;
- ``*_hbm_capacity`` and ``*_hbm_bandwidth``: model x HBM capacity / bandwidth (two-tier network,
  base domain);
- ``*_link_bandwidth`` and ``*_link_latency``: model x network x scale-out bandwidth / latency per
  step (base domain);
- ``mfu_fat_tree``: model x fat-tree oversubscription x leaf size (two-tier network, base domain), and
  ``mfu_flat_base`` the flat network at the same point: the fat-tree's shape is a free choice (the paper's
  two-tier network is not specified to this level here), so the flat network's gain is read over it.

:func:`compare` reads Tithi et al.'s quantity, MFU at the best plan, for each of the paper's claims. The
paper's MFU values are not carried here (its findings are used as directions: wider scale-up domains,
FullFlat over two-tier, more HBM raise MFU), so every record is directional, and labelled as a different
setting: a GB200-class catalog system, not the paper's modelled future systems.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import xarray as xr

from ..common import comparison, figurecheck
from ..common import io as tsio
from ..model import perfmodel
from ..model import planner
from ..common.checks import check_float, check_floats, check_int
from ..common.io import provenance
from ..model.specs import SpecError, SystemSpec, resolve_model, resolve_system

PAPER = ("Tithi et al., Scaling Intelligence: Designing Data Centers for Next-Gen Language Models "
         "(arXiv 2506.15006, 2025)")
OUTPUTS = ("datacenter_design.nc", "mfu_vs_domain.png", "mfu_vs_hbm.png", "fat_tree_vs_flat.png")
RESOURCES = {"mem_mb": 2000, "runtime_quick_min": 10, "runtime_full_min": 20}
STUDY = "datacenter-design"
NETWORKS = ("two-tier", "flat")
PLAN_FIELDS = ("tp", "pp", "dp", "ep", "micro_batch", "interleave")


def network_overrides(network: str, leaf_gpus: int, oversubscription: float, hop_latency_s: float) -> dict:
    """System overrides of a scale-out network (see the module docstring)."""
    if network == "two-tier":
        return {"scale_out_leaf_gpus": int(leaf_gpus), "scale_out_oversubscription": float(oversubscription),
                "scale_out_hop_latency_s": float(hop_latency_s)}
    if network == "flat":
        return {"scale_out_leaf_gpus": 0, "scale_out_oversubscription": 1.0,
                "scale_out_hop_latency_s": float(hop_latency_s)}
    raise SpecError("network", network, f"expected one of {', '.join(NETWORKS)}")


def design_space(model, gpus: int) -> dict:
    """The plans searched at every design point: Megatron-style 3D (+ expert) parallelism with
    sequence parallelism, the distributed optimizer (ZeRO-1), flash attention and overlapped
    gradient reduction; tp, pp and ep over powers of two."""
    model = resolve_model(model)
    pow2 = [2**i for i in range(0, 8)]
    space = {
        "tp": [t for t in pow2 if 2 <= t <= 32 and model.heads % t == 0 and model.kv_heads % t == 0],
        "pp": [p for p in pow2 if 2 <= p <= min(64, model.layers) and gpus % p == 0],
        "interleave": [1, 2],
        "micro_batch": [1, 2, 4],
        "recompute": ["selective", "full"],
        "sequence_parallel": [1],
        "zero": [1],
        "flash_attention": [1],
        "overlap_grad_reduce": [1],
    }
    if model.is_moe:
        space["ep"] = [e for e in pow2 if model.experts % e == 0 and e <= model.experts]
    return space


def best_point(model, system, gpus: int, global_batch: int, rerank: int = 8) -> dict:
    """The best plan's MFU, throughput, step time and breakdown at one design point (NaN where
    no plan fits)."""
    model, system = resolve_model(model), resolve_system(system)
    _, ranked = planner.search(model, system, gpus, global_batch, top=1, space=design_space(model, gpus),
                                 rerank=rerank)
    if not ranked:
        return {"mfu": np.nan, "tokens_per_s": np.nan, "step_time_s": np.nan, "ep_comm_s": np.nan,
                "dp_comm_s": np.nan, "memory_gib_per_gpu": np.nan, **{k: 0 for k in PLAN_FIELDS}}
    best = ranked[0]
    plan = perfmodel.plan_from_grid_entry(best["plan"], global_batch)
    p = perfmodel.predict(perfmodel.RunSpec(id="best", model=model, system=system, plan=plan))
    return {"mfu": p.mfu, "tokens_per_s": p.tokens_per_s, "step_time_s": p.step_time_s,
            "ep_comm_s": p.breakdown.get("ep_comm", 0.0), "dp_comm_s": p.breakdown["dp_comm"],
            "memory_gib_per_gpu": p.memory_gib_per_gpu, **{k: int(getattr(plan, k)) for k in PLAN_FIELDS}}


def datacenter_design(models: Sequence[str] = ("gpt3-175b", "moe-1.8t"), system: str = "gb200-nvl72",
                      gpus: int = 4096, global_batch_tokens: int = 2**23,
                      domains: Sequence[int] = (8, 72, 576), base_domain: int = 72,
                      hbm_capacities_GiB: Sequence[float] = (96.0, 185.0, 288.0),
                      hbm_bandwidths_GBps: Sequence[float] = (4000.0, 8000.0, 16000.0),
                      scale_out_bandwidths_GBps: Sequence[float] = (25.0, 50.0, 100.0, 200.0),
                      link_latencies_s: Sequence[float] = (1e-6, 5e-6, 20e-6),
                      leaf_gpus: int = 32, oversubscription: float = 2.0, hop_latency_s: float = 2.5e-7,
                      rerank: int = 8, leaf_gpus_sweep: Sequence[int] = (8, 32, 128),
                      oversubscription_sweep: Sequence[float] = (1.0, 2.0, 4.0)) -> xr.Dataset:
    """MFU and throughput at the best plan across the design sweeps (module docstring)."""
    if isinstance(models, str) or not models:
        raise SpecError("models", models, "expected a non-empty list of catalog model names")
    specs = [resolve_model(m) for m in models]
    base = resolve_system(system)
    gpus = check_int("gpus", gpus, minimum=base.gpus_per_node)
    tokens = check_int("global_batch_tokens", global_batch_tokens)
    rerank = check_int("rerank", rerank)
    domains = [check_int("domains", d, minimum=1) for d in domains]
    if not domains:
        raise SpecError("domains", domains, "expected at least one scale-up domain size")
    for d in domains + [base_domain]:
        if d % base.gpus_per_node:
            raise SpecError("domains", d, f"expected multiples of gpus_per_node = {base.gpus_per_node} of {system}")
    base_domain = check_int("base_domain", base_domain)
    leaf_gpus = check_int("leaf_gpus", leaf_gpus)
    if leaf_gpus % base.gpus_per_node:
        raise SpecError("leaf_gpus", leaf_gpus, f"expected a multiple of gpus_per_node = {base.gpus_per_node}")
    oversubscription = check_float("oversubscription", oversubscription, minimum=1.0)
    hop_latency_s = check_float("hop_latency_s", hop_latency_s)
    caps = check_floats("hbm_capacities_GiB", hbm_capacities_GiB, open_min=True)
    bws = check_floats("hbm_bandwidths_GBps", hbm_bandwidths_GBps, open_min=True)
    links = check_floats("scale_out_bandwidths_GBps", scale_out_bandwidths_GBps, open_min=True)
    leaves = [check_int("leaf_gpus_sweep", n) for n in leaf_gpus_sweep]
    if not leaves or any(n % base.gpus_per_node for n in leaves):
        raise SpecError("leaf_gpus_sweep", list(leaf_gpus_sweep),
                        f"expected a non-empty list of multiples of gpus_per_node = {base.gpus_per_node}")
    oversubs = check_floats("oversubscription_sweep", oversubscription_sweep, minimum=1.0)
    lats = check_floats("link_latencies_s", link_latencies_s)
    batches = {}
    for m in specs:
        if tokens % m.seq_len or tokens // m.seq_len < 1:
            raise SpecError("global_batch_tokens", tokens, f"expected a multiple of {m.name}'s seq_len = {m.seq_len}")
        batches[m.name] = tokens // m.seq_len

    def point(m, network, leaf=leaf_gpus, oversub=oversubscription, **overrides):
        net = network_overrides(network, leaf, oversub, hop_latency_s)
        sysm = SystemSpec.from_catalog(system, {**net, **overrides})
        return best_point(m, sysm, gpus, batches[m.name], rerank)

    def sweep(values, coords, fn):
        """Run ``fn(model, *coord)`` over the product of ``coords`` for every model."""
        shape = (len(specs),) + tuple(len(c) for c in coords)
        out = {k: np.full(shape, np.nan) for k in values}
        for i, m in enumerate(specs):
            for idx in np.ndindex(shape[1:]):
                r = fn(m, *(c[j] for c, j in zip(coords, idx)))
                for k in values:
                    out[k][(i,) + idx] = r[k]
        return out

    names = ["mfu", "tokens_per_s", "step_time_s", "ep_comm_s", "dp_comm_s", "memory_gib_per_gpu", *PLAN_FIELDS]
    dom = sweep(names, [NETWORKS, domains], lambda m, n, d: point(m, n, scale_up_domain=d))
    cap = sweep(["mfu", "tokens_per_s"], [caps],
                lambda m, c: point(m, "two-tier", scale_up_domain=base_domain, hbm_capacity_GiB=c))
    bw = sweep(["mfu", "tokens_per_s"], [bws],
               lambda m, b: point(m, "two-tier", scale_up_domain=base_domain, hbm_bandwidth_GBps=b))
    link = sweep(["mfu", "tokens_per_s"], [NETWORKS, links],
                 lambda m, n, b: point(m, n, scale_up_domain=base_domain, scale_out_GBps_per_gpu=b))
    lat = sweep(["mfu", "tokens_per_s"], [NETWORKS, lats],
                lambda m, n, a: point(m, n, scale_up_domain=base_domain, scale_out_latency_s=a))
    tree = sweep(["mfu"], [oversubs, leaves],
                 lambda m, o, n: point(m, "two-tier", leaf=n, oversub=o, scale_up_domain=base_domain))
    flat = sweep(["mfu"], [], lambda m: point(m, "flat", scale_up_domain=base_domain))

    D = ("model", "network", "domain")
    data = {
        "mfu_domain": (D, dom["mfu"], {"units": "1", "long_name": "model FLOPs utilisation at the best plan"}),
        "tokens_per_s_domain": (D, dom["tokens_per_s"], {"units": "tokens/s", "long_name": "cluster throughput"}),
        "step_time_s_domain": (D, dom["step_time_s"], {"units": "s", "long_name": "step time"}),
        "ep_comm_s_domain": (D, dom["ep_comm_s"], {"units": "s", "long_name": "step time: expert all-to-all"}),
        "dp_comm_s_domain": (D, dom["dp_comm_s"], {"units": "s", "long_name": "step time: data-parallel communication"}),
        "memory_gib_domain": (D, dom["memory_gib_per_gpu"], {"units": "GiB", "long_name": "memory per GPU"}),
        "mfu_hbm_capacity": (("model", "hbm_capacity_GiB"), cap["mfu"],
                             {"units": "1", "long_name": "model FLOPs utilisation at the best plan"}),
        "tokens_per_s_hbm_capacity": (("model", "hbm_capacity_GiB"), cap["tokens_per_s"],
                                      {"units": "tokens/s", "long_name": "cluster throughput"}),
        "mfu_hbm_bandwidth": (("model", "hbm_bandwidth_GBps"), bw["mfu"],
                              {"units": "1", "long_name": "model FLOPs utilisation at the best plan"}),
        "tokens_per_s_hbm_bandwidth": (("model", "hbm_bandwidth_GBps"), bw["tokens_per_s"],
                                       {"units": "tokens/s", "long_name": "cluster throughput"}),
        "mfu_link_bandwidth": (("model", "network", "bandwidth_GBps"), link["mfu"],
                               {"units": "1", "long_name": "model FLOPs utilisation at the best plan"}),
        "tokens_per_s_link_bandwidth": (("model", "network", "bandwidth_GBps"), link["tokens_per_s"],
                                        {"units": "tokens/s", "long_name": "cluster throughput"}),
        "mfu_link_latency": (("model", "network", "link_latency_s"), lat["mfu"],
                             {"units": "1", "long_name": "model FLOPs utilisation at the best plan"}),
        "tokens_per_s_link_latency": (("model", "network", "link_latency_s"), lat["tokens_per_s"],
                                      {"units": "tokens/s", "long_name": "cluster throughput"}),
        "mfu_fat_tree": (("model", "oversubscription", "leaf_gpus"), tree["mfu"],
                         {"units": "1", "long_name": "model FLOPs utilisation at the best plan, two-tier fat-tree "
                                                     "at the base domain"}),
        "mfu_flat_base": (("model",), flat["mfu"],
                          {"units": "1", "long_name": "model FLOPs utilisation at the best plan, flat network "
                                                      "at the base domain"}),
    }
    for k in PLAN_FIELDS:
        data[f"best_{k}_domain"] = (D, dom[k].astype(np.int64), {"units": "1", "long_name": f"best plan: {k}"})
    coords = {
        "model": ("model", [m.name for m in specs], {"long_name": "model (catalog name)"}),
        "network": ("network", list(NETWORKS), {"long_name": "scale-out network"}),
        "domain": ("domain", domains, {"units": "GPUs", "long_name": "scale-up domain size"}),
        "hbm_capacity_GiB": ("hbm_capacity_GiB", caps, {"units": "GiB", "long_name": "HBM capacity per GPU"}),
        "hbm_bandwidth_GBps": ("hbm_bandwidth_GBps", bws, {"units": "GB/s", "long_name": "HBM bandwidth per GPU"}),
        "bandwidth_GBps": ("bandwidth_GBps", links, {"units": "GB/s", "long_name": "scale-out bandwidth per GPU"}),
        "link_latency_s": ("link_latency_s", lats, {"units": "s", "long_name": "scale-out latency per step"}),
        "oversubscription": ("oversubscription", oversubs,
                             {"units": "1", "long_name": "fat-tree oversubscription (leaf downlink : uplink)"}),
        "leaf_gpus": ("leaf_gpus", leaves, {"units": "GPUs", "long_name": "GPUs under one leaf switch"}),
    }
    ds = xr.Dataset(data, coords=coords)
    params = {"models": [m.name for m in specs], "system": system, "gpus": gpus, "global_batch_tokens": tokens,
              "domains": domains, "base_domain": base_domain, "hbm_capacities_GiB": caps,
              "hbm_bandwidths_GBps": bws, "scale_out_bandwidths_GBps": links, "link_latencies_s": lats, "leaf_gpus": leaf_gpus,
              "oversubscription": oversubscription, "hop_latency_s": hop_latency_s, "rerank": rerank,
              "leaf_gpus_sweep": leaves, "oversubscription_sweep": oversubs}
    ds.attrs.update(provenance(params))
    ds.attrs["global_batch_sequences"] = [int(batches[m.name]) for m in specs]
    ds.attrs["peak_flops_bf16"] = base.peak_flops_bf16
    return ds


# --------------------------------------------------------------------------- paper vs ours
PAPER_SETTING = ("Tithi et al.: GPT-3 175B and a GPT-4-like 1.8T MoE on modelled future systems (an extended "
                 "Calculon), scale-up domain 8 -> 72 -> 576, two-tier vs FullFlat optical network; MFU at the best "
                 "plan. The paper's findings are read as directions (their MFU values are not carried here)")


def _setting(ds: xr.Dataset, what: str) -> str:
    p = json.loads(ds.attrs["parameters"])
    return (f"{what}; {p['system']}-class catalog system, {p['gpus']} GPUs, {p['global_batch_tokens'] / 2**20:g}M "
            f"tokens per step, fat-tree {p['leaf_gpus']} GPUs per leaf at {p['oversubscription']:g}:1; "
            f"MoE shape assumed (catalog moe-1.8t)")


def _domain_record(ds: xr.Dataset, model: str) -> comparison.Record:
    mfu = ds["mfu_domain"].sel(model=model)
    lo, hi = int(ds["domain"].min()), int(ds["domain"].max())
    ratios = (mfu.sel(domain=hi) / mfu.sel(domain=lo)).values
    return comparison.directional(
        STUDY, f"{model}: MFU at scale-up domain {hi} over domain {lo} (two-tier network)", "x", paper_direction=1,
        paper_setting=PAPER_SETTING, our_value=float(ratios[ds["network"].values.tolist().index("two-tier")]),
        our_setting=_setting(ds, "best plan at every domain"), neutral=1.0,
        free_parameter="scale-out network (two-tier, flat)", sweep=ratios,
        note="the paper's systems are not ours; the record checks the direction only")


def _flat_record(ds: xr.Dataset, model: str) -> comparison.Record:
    p = json.loads(ds.attrs["parameters"])
    base = ds["mfu_domain"].sel(model=model, domain=p["base_domain"])
    ours = float(base.sel(network="flat") / base.sel(network="two-tier"))
    tree = ds["mfu_fat_tree"].sel(model=model)
    over_tree = (ds["mfu_flat_base"].sel(model=model) / tree).values.ravel()
    bw = ds["mfu_link_bandwidth"].sel(model=model)
    lat = ds["mfu_link_latency"].sel(model=model)
    dom = ds["mfu_domain"].sel(model=model)
    others = [(x.sel(network="flat") / x.sel(network="two-tier")).values.ravel() for x in (bw, lat, dom)]
    sweep = np.concatenate([over_tree, *others])
    o, n = ds["oversubscription"].values, ds["leaf_gpus"].values
    leaf_spread = float(np.nanmax(tree.max("leaf_gpus") - tree.min("leaf_gpus")))
    leaf_note = ("; the leaf size changes no MFU here (the best plans' scale-out groups span several leaves at "
                 "every leaf size swept)" if leaf_spread == 0 else "")
    return comparison.directional(
        STUDY, f"{model}: MFU on the flat network over the two-tier fat-tree (domain {p['base_domain']})", "x",
        paper_direction=1, paper_setting=PAPER_SETTING, our_value=ours,
        our_setting=_setting(ds, f"same NIC bandwidth per GPU on both networks, domain {p['base_domain']}"),
        neutral=1.0, sweep=sweep,
        free_parameter=(f"fat-tree oversubscription {o.min():g}-{o.max():g}:1 and leaf size {n.min()}-{n.max()} "
                        f"GPUs; scale-out bandwidth {float(ds['bandwidth_GBps'].min()):g}-"
                        f"{float(ds['bandwidth_GBps'].max()):g} GB/s; latency; scale-up domain"),
        note=("at 1:1 oversubscription the fat-tree differs from the flat network only by two hops of latency, "
              "so the low end of the range is the no-effect point" + leaf_note))


def _hbm_record(ds: xr.Dataset, model: str) -> comparison.Record:
    mfu = ds["mfu_hbm_capacity"].sel(model=model)
    lo, hi = float(ds["hbm_capacity_GiB"].min()), float(ds["hbm_capacity_GiB"].max())
    ratio = float(mfu.sel(hbm_capacity_GiB=hi) / mfu.sel(hbm_capacity_GiB=lo))
    p = json.loads(ds.attrs["parameters"])
    return comparison.directional(
        STUDY, f"{model}: MFU at {hi:g} GiB HBM over {lo:g} GiB", "x", paper_direction=1,
        paper_setting=PAPER_SETTING, our_value=ratio, neutral=1.0,
        our_setting=_setting(ds, f"two-tier network, domain {p['base_domain']}, best plan at each capacity"),
        note="the capacity range is ours, not the paper's")


def compare(folder) -> list[comparison.Record]:
    """Paper-vs-ours records from ``datacenter_design.nc`` in ``folder``: per model, the MFU gain from the
    smallest to the largest scale-up domain, the flat network's MFU over the two-tier fat-tree (with its range
    over the fat-tree's shape, bandwidth, latency and domain), and the MFU gain from more HBM capacity."""
    ds = tsio.read_dataset(Path(folder) / "datacenter_design.nc")
    models = ds["model"].values.tolist()
    return ([_domain_record(ds, m) for m in models] + [_flat_record(ds, m) for m in models]
            + [_hbm_record(ds, m) for m in models])


__all__ = ["PAPER", "OUTPUTS", "RESOURCES", "NETWORKS", "PLAN_FIELDS", "FIGURES", "best_point", "compare",
           "datacenter_design", "design_space", "network_overrides"]


# ---------------------------------------------------------------------------------------------- figures

_COLORS = lambda ds: {m: f"C{i}" for i, m in enumerate(ds["model"].values.tolist())}  # noqa: E731
_NET_STYLE = {"two-tier": ("--", "s"), "flat": ("-", "o")}


def _figure_setting(folder):
    """The saved dataset, its parameters, the percent formatter and the setting every title names."""
    from matplotlib.ticker import FuncFormatter

    ds = tsio.read_dataset(Path(folder) / "datacenter_design.nc")
    setting = json.loads(ds.attrs["parameters"])
    percent = FuncFormatter(lambda v, _: f"{100 * v:.3g}%")
    where = (f"{setting['gpus']} GPUs ({setting['system']}-class), "
             f"{setting['global_batch_tokens'] / 2**20:g}M tokens per step")
    return ds, setting, percent, where


def draw_mfu_vs_domain(folder):
    """MFU at the best plan of each model on both networks as the scale-up (NVLink) domain grows."""
    import matplotlib.pyplot as plt

    ds, _, percent, where = _figure_setting(folder)
    colors = _COLORS(ds)
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    dom = ds["domain"].values
    for model in ds["model"].values.tolist():
        for net in ds["network"].values.tolist():
            ls, marker = _NET_STYLE[net]
            ax.plot(dom, ds["mfu_domain"].sel(model=model, network=net), color=colors[model], linestyle=ls,
                    marker=marker, label=f"{model}, {net}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(dom, [str(d) for d in dom])
    ax.yaxis.set_major_formatter(percent)
    ax.set(xlabel="scale-up domain (GPUs)", ylabel="MFU at the best plan", title=where)
    ax.legend(loc="lower right")
    return fig


def draw_mfu_vs_hbm(folder):
    """MFU at the best plan of each model against the HBM capacity (left) and bandwidth (right) per GPU, on the
    two-tier network at the base domain."""
    import matplotlib.pyplot as plt

    ds, setting, percent, where = _figure_setting(folder)
    colors = _COLORS(ds)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8.4, 3.6), sharey=True)
    for model in ds["model"].values.tolist():
        a1.plot(ds["hbm_capacity_GiB"], ds["mfu_hbm_capacity"].sel(model=model), marker="o", color=colors[model],
                label=model)
        a2.plot(ds["hbm_bandwidth_GBps"] / 1e3, ds["mfu_hbm_bandwidth"].sel(model=model), marker="o",
                color=colors[model], label=model)
    a1.yaxis.set_major_formatter(percent)
    a1.set(xlabel="HBM capacity per GPU (GiB)", ylabel="MFU at the best plan")
    a2.set(xlabel="HBM bandwidth per GPU (TB/s)")
    fig.legend(*a1.get_legend_handles_labels(), loc="outside lower center", ncol=2)  # names both panels' lines
    fig.suptitle(f"{where}; domain {setting['base_domain']}, two-tier network", fontsize=9)
    return fig


def draw_fat_tree_vs_flat(folder):
    """Two-tier fat-tree vs flat network at the base domain: MFU against the scale-out bandwidth per GPU (left)
    and the latency per collective step (middle), and the flat network's MFU over the fat-tree's against the
    fat-tree's oversubscription, per leaf size (right; 1 = no gain)."""
    import matplotlib.pyplot as plt

    ds, setting, percent, where = _figure_setting(folder)
    colors = _COLORS(ds)
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(12.0, 3.8))  # each panel on its own MFU scale
    for model in ds["model"].values.tolist():
        for net in ds["network"].values.tolist():
            ls, marker = _NET_STYLE[net]
            a1.plot(ds["bandwidth_GBps"], ds["mfu_link_bandwidth"].sel(model=model, network=net),
                    color=colors[model], linestyle=ls, marker=marker, label=f"{model}, {net}")
            a2.plot(ds["link_latency_s"] * 1e6, ds["mfu_link_latency"].sel(model=model, network=net),
                    color=colors[model], linestyle=ls, marker=marker, label=f"{model}, {net}")
    a1.set_xscale("log", base=2)
    a1.set_xticks(ds["bandwidth_GBps"].values, [f"{v:g}" for v in ds["bandwidth_GBps"].values])
    a2.set_xscale("log")
    a1.yaxis.set_major_formatter(percent)
    a1.set(xlabel="scale-out bandwidth per GPU (GB/s)", ylabel="MFU at the best plan")
    a2.yaxis.set_major_formatter(percent)
    a2.set(xlabel="scale-out latency per step (µs)", ylabel="MFU at the best plan")
    # one legend for the left and middle panels' lines (the right panel keeps its own)
    fig.legend(*a1.get_legend_handles_labels(), loc="outside lower center", ncol=4, fontsize=7)
    for model in ds["model"].values.tolist():
        gain = ds["mfu_flat_base"].sel(model=model) / ds["mfu_fat_tree"].sel(model=model)
        leaves = ds["leaf_gpus"].values.tolist()
        if float((gain.max("leaf_gpus") - gain.min("leaf_gpus")).max()) == 0 or len(leaves) == 1:
            # the leaf size changes nothing here: one line, not identical lines drawn over each other
            a3.plot(ds["oversubscription"], gain.isel(leaf_gpus=0), color=colors[model], marker="o",
                    label=f"{model}, any leaf of {', '.join(map(str, leaves))} GPUs")
            continue
        for k, leaf in enumerate(leaves):
            a3.plot(ds["oversubscription"], gain.sel(leaf_gpus=leaf), color=colors[model], marker="os^"[k % 3],
                    linestyle=["-", "--", ":"][k % 3], label=f"{model}, {leaf} GPUs per leaf")
    figurecheck.guide(a3.axhline(1.0, color="0.5", linewidth=0.8))  # no gain
    a3.set_xscale("log", base=2)
    a3.set_xticks(ds["oversubscription"].values, [f"{v:g}:1" for v in ds["oversubscription"].values])
    a3.set(xlabel="fat-tree oversubscription", ylabel="MFU flat / MFU two-tier")
    a3.legend(loc="upper left", fontsize=7)
    fig.suptitle(f"{where}; domain {setting['base_domain']}; fat-tree: {setting['leaf_gpus']} GPUs per leaf, "
                 f"{setting['oversubscription']:g}:1", fontsize=9)
    return fig


#: the figures drawn from the saved dataset alone (file name -> function of the output folder)
FIGURES = {"mfu_vs_domain.png": draw_mfu_vs_domain, "mfu_vs_hbm.png": draw_mfu_vs_hbm,
           "fat_tree_vs_flat.png": draw_fat_tree_vs_flat}
