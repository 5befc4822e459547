"""pruning: distributionally robust data mixing after pruning (Deng et al., "DRPruning: Efficient Large Language
Model Pruning through Distributionally Robust Optimization", ACL 2025, arXiv 2411.14055).

DRPruning prunes Llama-2-7B to smaller sizes (Sheared-LLaMA's 2.7B, 1.3B, 370M shapes) and, during pruning and
continued pretraining, samples the seven RedPajama domains by a distributionally robust mix: more of the domains
whose loss lags a reference the most, within a chi-square ball of rho = 0.1 around the base mix, the base mix
following after 20% of training. The reference is dynamic: a scaling law fitted during training to each domain's
losses predicts its end-of-training loss. Its baseline is Sheared-LLaMA's dynamic batch loading (DBL), which
reweights the domains by ``exp`` of their excess over a fixed scaling-law reference.

**What was read.** The paper's abstract and a third-party summary (arxiv.org/html/2411.14055v2 and
en.papernotes.org/ACL2025/model_compression/drpruning_robust_pruning/, through the search tool; the paper's tables
were not reachable here); DRPruning's code (github hexuandeng/DRPruning at ac442bb:
``drpruning/callbacks/DRO_loading_callback.py``, ``DRO_server.py``, ``dynamic_loading_callback.py``,
``drpruning/scripts/continue_pretrain.sh``, ``prune.sh``); Sheared-LLaMA's (github princeton-nlp/LLM-Shearing:
``llmshearing/callbacks/dynamic_loading_callback.py``, ``llmshearing/scripts/pruning.sh``,
``continue_pretrain.sh``). The one number of the paper used, a 5.59% lower perplexity than Sheared-LLaMA
(monolingual), is quoted from that summary ("surpasses Sheared LLaMA by -5.59% PPL and +2.95% on downstream tasks in
monolingual and multilingual settings, respectively"), not from the paper's table.

Here training is **modelled, not run** (:mod:`trainscale.workloads.pruning`): per-domain loss curves with uneven
pruning damage, anchored at Sheared-LLaMA's reference losses; every mix (fixed, DRPruning with a static or its
dynamic reference, DBL from the same start mix, DBL from Sheared-LLaMA's continued-pretraining start mix) spends
the same tokens; the curves' exponent, the damage's size and unevenness, rho and the steps between mix updates are
swept. The pruned sizes' inference cost (decode latency, FLOPs and weight memory on one A100) comes from the
performance model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xarray as xr

from ..common import comparison, figurecheck
from ..model import inference
from ..common import io as tsio
from ..workloads import pruning as P
from ..common.checks import check_float, check_floats, check_int
from ..common.io import provenance
from ..model.specs import SpecError

__all__ = ["PAPER", "OUTPUTS", "RESOURCES", "FIGURES", "compare", "mixing_study", "inference_costs"]

PAPER = ("Deng et al., DRPruning: Efficient Large Language Model Pruning through Distributionally Robust "
         "Optimization (ACL 2025)")
OUTPUTS = ("mixing.nc", "inference.nc", "losses.png", "sweep.png", "inference.png")
RESOURCES = {"mem_mb": 1000, "runtime_quick_min": 2, "runtime_full_min": 15}
STUDY = "pruning"
PAPER_RHO = 0.1
#: mix updates over continued pretraining in both codes: an evaluation every 400 of 48,000 batches
#: (continue_pretrain.sh: eval_interval=400ba, max_duration=48000ba)
PAPER_UPDATES = 120
#: the paper's perplexity reduction of DRPruning against Sheared-LLaMA, percent (quoted from the summary, see above)
PAPER_PPL_REDUCTION = 5.59
STORED_POINTS = 40  # about this many points of each loss and mix trajectory are stored


def _attrs(da, units, long_name):
    da.attrs.update({"units": units, "long_name": long_name})


def mixing_study(size: str = "1.3b", alphas: Sequence[float] = (0.3,), damages: Sequence[float] = (1.0,),
                 unevenness: Sequence[float] = (0.5,), rhos: Sequence[float] = (PAPER_RHO,), tokens: float = 50e9,
                 steps: int = 200, margin: float = 0.05, intervals: Sequence[int] = (1,)) -> xr.Dataset:
    """Every mixing method of :data:`trainscale.workloads.pruning.METHODS` on the modelled curves for every (alpha, damage,
    unevenness, rho, interval): per-domain loss over the tokens and the sampling mix (every ``steps //
    STORED_POINTS`` steps), the reference each method measured excess against at the end, and the summary
    (worst-domain excess, mean loss at the start mix) from the last step."""
    alphas = check_floats("alphas", alphas, 0.0, 2.0, open_min=True)
    damages = check_floats("damages", damages, 0.0, 10.0, open_min=True)
    unevenness = check_floats("unevenness", unevenness, 0.0, 1.9)
    rhos = check_floats("rhos", rhos, 0.0, 100.0, open_min=True)
    steps = check_int("steps", steps, 1, 100_000)
    if not len(intervals):
        raise SpecError("intervals", list(intervals), "expected at least one interval")
    intervals = [check_int("intervals", i, 1, steps) for i in intervals]
    methods = P.METHODS
    # the trajectories are kept at about STORED_POINTS points (the summary uses the last, unthinned)
    every = max(1, steps // STORED_POINTS)
    kept_loss = np.unique(np.r_[np.arange(0, steps + 1, every), steps])
    kept_mix = np.arange(0, steps, every)
    shape = (len(alphas), len(damages), len(unevenness), len(rhos), len(intervals), len(methods))
    loss = np.empty(shape + (len(kept_loss), len(P.DOMAINS)))
    mix = np.empty(shape + (len(kept_mix), len(P.DOMAINS)))
    refs = np.empty(shape + (len(P.DOMAINS),))
    tok = None
    for i, a in enumerate(alphas):
        for j, d in enumerate(damages):
            for k, u in enumerate(unevenness):
                c = P.curves(size, a, d, u, margin)
                for r, rho in enumerate(rhos):
                    for v, iv in enumerate(intervals):
                        for m, method in enumerate(methods):
                            out = P.train(c, tokens, steps, method, rho, interval=iv)
                            loss[i, j, k, r, v, m] = out["loss"][kept_loss]
                            mix[i, j, k, r, v, m] = out["mix"][kept_mix]
                            refs[i, j, k, r, v, m], tok = out["reference"][-1], out["tokens"][kept_loss]
    ref = P.REFERENCE_LOSS[size]
    dims = ("alpha", "damage", "unevenness", "rho", "interval", "mixing")
    ds = xr.Dataset({"loss": (dims + ("tokens", "domain"), loss), "mix": (dims + ("step", "domain"), mix),
                     "final_reference": (dims + ("domain",), refs)},
                    coords={"alpha": alphas, "damage": damages, "unevenness": unevenness, "rho": rhos,
                            "interval": intervals, "mixing": list(methods), "tokens": tok,
                            "step": kept_mix, "domain": list(P.DOMAINS)})
    ds["reference_loss"] = (("domain",), ref)
    ds["start_mix"] = (("domain",), P.START_MIX)
    ds["sheared_cpt_mix"] = (("domain",), P.SHEARED_CPT_MIX)
    ds["updates"] = (("interval",), [-(-steps // iv) for iv in intervals])
    final = ds["loss"].isel(tokens=-1)
    ds["worst_excess"] = (final - ds["reference_loss"]).max("domain")
    ds["mean_loss"] = (final * ds["start_mix"]).sum("domain")
    # the trajectories of every swept setting are kept for readers (explore draws them) in single precision (7
    # digits; half the 5.6 MB): the records and summaries above are computed in double precision first
    for name in ("loss", "mix"):
        ds[name] = ds[name].astype(np.float32)
    _attrs(ds["loss"], "nats", "modelled per-domain loss (not a trained model; stored in single precision)")
    _attrs(ds["mix"], "1", "sampling mix of the step (stored in single precision)")
    _attrs(ds["final_reference"], "nats", "reference loss the method measured excess against at its last update")
    _attrs(ds["reference_loss"], "nats", f"Sheared-LLaMA's reference loss of the {size} target")
    _attrs(ds["start_mix"], "1", "LLaMA's data mix, the start (and fixed) mix")
    _attrs(ds["sheared_cpt_mix"], "1", "Sheared-LLaMA's continued-pretraining start mix (where its pruning ended)")
    _attrs(ds["updates"], "1", "mix updates over the run")
    _attrs(ds["worst_excess"], "nats", "largest final loss over the reference, over domains")
    _attrs(ds["mean_loss"], "nats", "final loss averaged with the start mix")
    for name, (u, ln) in {"alpha": ("1", "loss-curve exponent"), "damage": ("nats", "mean loss added by pruning"),
                          "unevenness": ("1", "how uneven the damage is across domains (0: even)"),
                          "rho": ("1", "chi-square radius of the robust mix"), "tokens": ("tokens", "tokens trained"),
                          "interval": ("steps", "steps between mix updates"),
                          "step": ("1", "mixing step (kept every few steps)"),
                          "mixing": (None, "data mixing (fixed: the start mix; robust: DRPruning, static reference; "
                                           "robust-dynamic: DRPruning, dynamic reference; dbl: Sheared-LLaMA's "
                                           "dynamic batch loading; dbl-cpt: the same from its continued-pretraining "
                                           "start mix)"),
                          "domain": (None, "RedPajama domain")}.items():
        ds[name].attrs.update({"long_name": ln, **({"units": u} if u else {})})
    ds.attrs.update(provenance({"size": size, "tokens": tokens, "steps": steps, "margin": margin,
                                "intervals": intervals, "stored_every": every,
                                "damage_pattern": P.DAMAGE_PATTERN.tolist(),
                                "n0_tokens": P.N0_TOKENS}))
    return ds


def inference_costs(system: str = "dgx-a100-80gb", context_tokens: int = 1024) -> xr.Dataset:
    """Decode latency, FLOPs per token and weight memory of Llama-2-7B and its pruned sizes on one GPU."""
    context_tokens = check_int("context_tokens", context_tokens, 0, 10**6)
    names = ["7b", "2.7b", "1.3b", "370m"]
    models = ["llama2-7b"] + [P.pruned_model(s) for s in names[1:]]
    dec = [inference.decode(m, system, 1, context_tokens, 1) for m in models]
    ds = xr.Dataset({"decode_s": (("size",), [d.time_s for d in dec]),
                     "flops_per_token": (("size",), [d.flops_per_gpu for d in dec]),
                     "weights_GiB": (("size",), [inference.weight_bytes_per_gpu(m, 1) / 2**30 for m in models])},
                    coords={"size": names})
    _attrs(ds["decode_s"], "s", f"one decode step (batch 1, {context_tokens} cached tokens) on one {system} GPU")
    _attrs(ds["flops_per_token"], "FLOP", "FLOPs of one decode step")
    _attrs(ds["weights_GiB"], "GiB", "16-bit weights")
    ds["size"].attrs["long_name"] = "model (Llama-2-7B and Sheared-LLaMA's pruned shapes)"
    ds.attrs.update(provenance({"system": system, "context_tokens": context_tokens}))
    return ds


def _paper_interval(ds) -> int:
    """The swept interval whose number of mix updates is closest to the codes' (:data:`PAPER_UPDATES`)."""
    return int(ds["interval"].values[int(np.argmin(np.abs(ds["updates"].values - PAPER_UPDATES)))])


def compare(folder) -> list[comparison.Record]:
    """At the paper's rho and the interval nearest the codes' 120 updates (ranges over the curves' free parameters,
    rho, the interval and, against DBL, its start mix): DRPruning (robust mix, dynamic reference) over fixed mixing;
    over Sheared-LLaMA's DBL in perplexity (the paper's 5.59%) and in the worst domain; its dynamic over a static
    reference."""
    ds = tsio.read_dataset(Path(folder) / "mixing.nc")
    q = json.loads(ds.attrs["parameters"])
    if PAPER_RHO not in ds["rho"].values:
        raise SpecError("rho", ds["rho"].values.tolist(), f"compare needs the paper's rho = {PAPER_RHO}")
    missing = sorted(set(P.METHODS) - set(ds["mixing"].values.tolist()))
    if missing:
        raise SpecError("mixing", ds["mixing"].values.tolist(), f"compare needs the methods {', '.join(missing)}")
    at = {"rho": PAPER_RHO, "interval": _paper_interval(ds)}
    n_up = int(ds["updates"].sel(interval=at["interval"]))
    setting = (f"modelled loss curves of the {q['size']} target (not trained), {q['tokens']:.3g} tokens, same start "
               f"mix and tokens for every method; the curves' exponent, the damage's size and unevenness swept")
    paper = ("DRPruning vs fixed mixing / Sheared-LLaMA: lower perplexity after pruning and continued pretraining "
             "(Llama-2-7B to 2.7B, 1.3B, 370M; rho = 0.1)")
    sweep_note = "median over the curve parameters, range over them, rho and the update interval"
    records = []
    # DRPruning as published: the robust mix with its dynamic reference (the static one is the ablation below)
    ratio = {v: ds[v].sel(mixing="robust-dynamic") / ds[v].sel(mixing="fixed") for v in ("worst_excess", "mean_loss")}
    for var, what in (("worst_excess", "worst-domain excess loss"), ("mean_loss", "mean loss (start-mix weights)")):
        records.append(comparison.directional(
            STUDY, f"{what}, DRPruning over fixed mixing at equal tokens", "1", paper_direction=-1,
            paper_setting=paper, our_value=float(ratio[var].sel(**at).median()),
            our_setting=setting + f", rho {PAPER_RHO}, {n_up} updates", neutral=1.0,
            note="the paper gives no number here; " + sweep_note, free_parameter="alpha, damage, unevenness, rho, interval",
            sweep=ratio[var].values.ravel()))
    # DRPruning as published (dynamic reference) against Sheared-LLaMA's DBL: perplexity = exp(mean loss)
    dr = ds["mean_loss"].sel(mixing="robust-dynamic")
    ppl = {m: 100.0 * (1.0 - np.exp(dr - ds["mean_loss"].sel(mixing=m))) for m in ("dbl", "dbl-cpt")}
    sweep = np.concatenate([ppl[m].sel(rho=PAPER_RHO).values.ravel() for m in ppl])
    records.append(comparison.numeric(
        STUDY, "perplexity reduction (exp of the start-mix weighted mean loss), DRPruning against Sheared-LLaMA's "
        "dynamic batch loading", "%", paper_value=PAPER_PPL_REDUCTION,
        paper_setting=("DRPruning vs Sheared-LLaMA, monolingual (Llama-2-7B pruned, RedPajama): -5.59% perplexity, "
                       "as a third-party summary of the paper (en.papernotes.org) quotes it; the table was not read"),
        our_value=float(ppl["dbl"].sel(**at).median()),
        our_setting=setting + f", rho {PAPER_RHO}, {n_up} updates; DBL from LLaMA's mix",
        same_setting=False, neutral=0.0,
        note=("DBL multiplies a lagging domain's weight by e^(excess) at every update and, against a reference the "
              "curves only reach late, piles the mix onto the most damaged domains, so its mean loss suffers: "
              "the size follows the number of updates and the damage; " + sweep_note +
              " and DBL's start mix (LLaMA's or Sheared-LLaMA's continued-pretraining mix)"),
        free_parameter="alpha, damage, unevenness, interval, DBL start mix", sweep=sweep))
    worst = ds["worst_excess"].sel(mixing="robust-dynamic") / ds["worst_excess"].sel(mixing="dbl")
    records.append(comparison.directional(
        STUDY, "worst-domain excess loss, DRPruning over Sheared-LLaMA's dynamic batch loading", "1",
        paper_direction=-1, paper_setting="DRPruning vs Sheared-LLaMA: more balanced domains, robust to the worst",
        our_value=float(worst.sel(**at).median()), our_setting=setting + f", rho {PAPER_RHO}, {n_up} updates",
        neutral=1.0, note="the paper gives no number here; " + sweep_note,
        free_parameter="alpha, damage, unevenness, rho, interval", sweep=worst.values.ravel()))
    dyn = ds["mean_loss"].sel(mixing="robust-dynamic") / ds["mean_loss"].sel(mixing="robust")
    records.append(comparison.directional(
        STUDY, "mean loss (start-mix weights), DRPruning's dynamic over its static reference", "1",
        paper_direction=-1, paper_setting="DRPruning: the scaling-law reference found during training helps",
        our_value=float(dyn.sel(**at).median()), our_setting=setting + f", rho {PAPER_RHO}, {n_up} updates",
        neutral=1.0, note=("the paper gives no number here; the static reference is Sheared-LLaMA's scaling-law "
                           "prediction, which the modelled curves beat by the margin only late; " + sweep_note),
        free_parameter="alpha, damage, unevenness, rho, interval", sweep=dyn.values.ravel()))
    return records


# ---------------------------------------------------------------------------------------------
# figures (drawn from the saved datasets alone; `trainscale verify` redraws and checks them)

def draw_inference(folder):
    """Decode time, FLOPs and weights of each pruned size: one panel each, the quantity as the panel's title
    (wrapped) and its unit on the axis, so that no label runs off the figure."""
    import textwrap

    import matplotlib.pyplot as plt

    costs = tsio.read_dataset(Path(folder) / "inference.nc")
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.3))
    for ax, var in zip(axes, ("decode_s", "flops_per_token", "weights_GiB")):
        ax.bar(costs["size"].values, costs[var].values)
        ax.set_title("\n".join(textwrap.wrap(costs[var].attrs["long_name"], 34)), fontsize=9)
        ax.set_ylabel(costs[var].attrs["units"])
        ax.set_xlabel("model size")
    return fig


def draw_losses(folder):
    """Every domain's loss over its reference as training proceeds, one panel per mix, at the paper's rho, the
    middle of the swept curve parameters and the interval nearest the codes' 120 updates."""
    import matplotlib.pyplot as plt

    mixing = tsio.read_dataset(Path(folder) / "mixing.nc")
    mid = {d: mixing[d].values[len(mixing[d]) // 2] for d in ("alpha", "damage", "unevenness")}
    sel = mixing.sel(**mid, rho=PAPER_RHO, interval=_paper_interval(mixing))
    methods = sel["mixing"].values
    fig, axes = plt.subplots(1, len(methods), figsize=(3.2 * len(methods), 3.6), sharey=True)
    for ax, method in zip(axes, methods):
        excess = sel["loss"].sel(mixing=method) - sel["reference_loss"]
        for i, dom in enumerate(sel["domain"].values):
            ax.plot(sel["tokens"] / 1e9, excess.sel(domain=dom), color=f"C{i}", label=str(dom))
        figurecheck.guide(ax.axhline(0.0, color="0.3", lw=0.8))  # at the reference loss
        ax.set(title=f"{method} mixing", xlabel="tokens (billions)")
    axes[0].set_ylabel("loss over the reference (nats)")
    # one legend for every panel: each draws the same domains in the same colours
    fig.legend(*axes[-1].get_legend_handles_labels(), loc="outside lower center", ncol=len(sel["domain"]),
               fontsize=7)
    return fig


def draw_sweep(folder):
    """Each mix's worst-domain excess and mean loss over the fixed mix's at equal tokens, as box plots over every
    swept curve exponent, damage, unevenness, rho and update interval (below 1: the mix beats the fixed one)."""
    import matplotlib.pyplot as plt

    mixing = tsio.read_dataset(Path(folder) / "mixing.nc")
    others = [m for m in mixing["mixing"].values if m != "fixed"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, (var, what) in zip(axes, (("worst_excess", "worst-domain excess"), ("mean_loss", "mean loss"))):
        ratio = [(mixing[var].sel(mixing=m) / mixing[var].sel(mixing="fixed")).values.ravel() for m in others]
        ax.boxplot(ratio, widths=0.5)
        ax.set_xticks(range(1, len(others) + 1), others, rotation=20, fontsize=8)
        figurecheck.guide(ax.axhline(1.0, color="0.3", lw=0.8))  # as good as the fixed mix
        ax.set(title=what, ylabel="mix / fixed")
    return fig


#: the figures drawn from the saved datasets alone (file name -> function of the output folder)
FIGURES = {"losses.png": draw_losses, "sweep.png": draw_sweep, "inference.png": draw_inference}
