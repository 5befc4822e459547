"""pruning: distributionally robust data mixing after pruning (Deng et al., "DRPruning: Efficient Large Language
Model Pruning through Distributionally Robust Optimization", ACL 2025, arXiv 2411.14055).

DRPruning prunes Llama-2-7B to smaller sizes (Sheared-LLaMA's 2.7B, 1.3B, 370M shapes) and, during pruning and
continued pretraining, samples the seven RedPajama domains by a distributionally robust mix: more of the domains
whose loss lags a reference (the scaling law's prediction) the most, within a chi-square ball of rho = 0.1
around the base mix, the base mix following after 20% of training. Against Sheared-LLaMA's dynamic batch
loading and a fixed mix it reports lower perplexity and better downstream results; STUDIES.md carries no number
of the paper, so the records are directions.

Here training is **modelled, not run** (:mod:`trainscale.pruning`): per-domain loss curves with uneven
pruning damage, anchored at Sheared-LLaMA's reference losses; the robust mix and the fixed mix spend the same
tokens; the curves' exponent, the damage's size and unevenness and rho are swept. The pruned sizes' inference
cost (decode latency, FLOPs and weight memory on one A100) comes from the performance model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xarray as xr

from .. import comparison, inference
from .. import io as tsio
from .. import pruning as P
from ..checks import check_float, check_floats, check_int
from ..io import provenance
from ..specs import SpecError

__all__ = ["PAPER", "OUTPUTS", "RESOURCES", "compare", "mixing_study", "inference_costs"]

PAPER = ("Deng et al., DRPruning: Efficient Large Language Model Pruning through Distributionally Robust "
         "Optimization (ACL 2025)")
OUTPUTS = ("mixing.nc", "inference.nc", "losses.png", "sweep.png", "inference.png")
RESOURCES = {"mem_mb": 1000, "runtime_quick_min": 2, "runtime_full_min": 5}
STUDY = "pruning"
PAPER_RHO = 0.1


def _attrs(da, units, long_name):
    da.attrs.update({"units": units, "long_name": long_name})


def mixing_study(size: str = "1.3b", alphas: Sequence[float] = (0.3,), damages: Sequence[float] = (1.0,),
                 unevenness: Sequence[float] = (0.5,), rhos: Sequence[float] = (PAPER_RHO,), tokens: float = 50e9,
                 steps: int = 200, margin: float = 0.05) -> xr.Dataset:
    """Robust vs fixed mixing on the modelled curves for every (alpha, damage, unevenness, rho): per-domain
    loss over the tokens, the sampling mix, and the summary (worst-domain excess, mean loss at the start mix)."""
    alphas = check_floats("alphas", alphas, 0.0, 2.0, open_min=True)
    damages = check_floats("damages", damages, 0.0, 10.0, open_min=True)
    unevenness = check_floats("unevenness", unevenness, 0.0, 1.9)
    rhos = check_floats("rhos", rhos, 0.0, 100.0, open_min=True)
    steps = check_int("steps", steps, 1, 100_000)
    methods = ("fixed", "robust")
    shape = (len(alphas), len(damages), len(unevenness), len(rhos), len(methods))
    loss = np.empty(shape + (steps + 1, len(P.DOMAINS)))
    mix = np.empty(shape + (steps, len(P.DOMAINS)))
    tok = None
    for i, a in enumerate(alphas):
        for j, d in enumerate(damages):
            for k, u in enumerate(unevenness):
                c = P.curves(size, a, d, u, margin)
                for r, rho in enumerate(rhos):
                    for m, method in enumerate(methods):
                        out = P.train(c, tokens, steps, method, rho)
                        loss[i, j, k, r, m], mix[i, j, k, r, m], tok = out["loss"], out["mix"], out["tokens"]
    ref = P.REFERENCE_LOSS[size]
    dims = ("alpha", "damage", "unevenness", "rho", "mixing")
    ds = xr.Dataset({"loss": (dims + ("tokens", "domain"), loss), "mix": (dims + ("step", "domain"), mix)},
                    coords={"alpha": alphas, "damage": damages, "unevenness": unevenness, "rho": rhos,
                            "mixing": list(methods), "tokens": tok, "step": np.arange(steps),
                            "domain": list(P.DOMAINS)})
    ds["reference_loss"] = (("domain",), ref)
    ds["start_mix"] = (("domain",), P.START_MIX)
    final = ds["loss"].isel(tokens=-1)
    ds["worst_excess"] = (final - ds["reference_loss"]).max("domain")
    ds["mean_loss"] = (final * ds["start_mix"]).sum("domain")
    _attrs(ds["loss"], "nats", "modelled per-domain loss (not a trained model)")
    _attrs(ds["mix"], "1", "sampling mix of the step")
    _attrs(ds["reference_loss"], "nats", f"Sheared-LLaMA's reference loss of the {size} target")
    _attrs(ds["start_mix"], "1", "LLaMA's data mix, the start (and fixed) mix")
    _attrs(ds["worst_excess"], "nats", "largest final loss over the reference, over domains")
    _attrs(ds["mean_loss"], "nats", "final loss averaged with the start mix")
    for name, (u, ln) in {"alpha": ("1", "loss-curve exponent"), "damage": ("nats", "mean loss added by pruning"),
                          "unevenness": ("1", "how uneven the damage is across domains (0: even)"),
                          "rho": ("1", "chi-square radius of the robust mix"), "tokens": ("tokens", "tokens trained"),
                          "step": ("1", "mixing step"), "mixing": (None, "data mixing (fixed: the start mix; robust: DRPruning)"),
                          "domain": (None, "RedPajama domain")}.items():
        ds[name].attrs.update({"long_name": ln, **({"units": u} if u else {})})
    ds.attrs.update(provenance({"size": size, "tokens": tokens, "steps": steps, "margin": margin,
                                "damage_pattern": P.DAMAGE_PATTERN.tolist(), "n0_tokens": P.N0_TOKENS}))
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


def compare(folder) -> list[comparison.Record]:
    """Robust over fixed mixing at the paper's rho (range over the curves' free parameters and rho)."""
    ds = tsio.read_dataset(Path(folder) / "mixing.nc")
    q = json.loads(ds.attrs["parameters"])
    if PAPER_RHO not in ds["rho"].values:
        raise SpecError("rho", ds["rho"].values.tolist(), f"compare needs the paper's rho = {PAPER_RHO}")
    ratio = {v: ds[v].sel(mixing="robust") / ds[v].sel(mixing="fixed") for v in ("worst_excess", "mean_loss")}
    setting = (f"modelled loss curves of the {q['size']} target (not trained), {q['tokens']:.3g} tokens; the curves' "
               "exponent, the damage's size and unevenness swept")
    paper = ("DRPruning vs fixed mixing / Sheared-LLaMA: lower perplexity after pruning and continued pretraining "
             "(Llama-2-7B to 2.7B, 1.3B, 370M; rho = 0.1)")
    records = []
    for var, what in (("worst_excess", "worst-domain excess loss"), ("mean_loss", "mean loss (start-mix weights)")):
        at_paper = ratio[var].sel(rho=PAPER_RHO)
        records.append(comparison.directional(
            STUDY, f"{what}, robust over fixed mixing at equal tokens", "1", paper_direction=-1,
            paper_setting=paper, our_value=float(at_paper.median()), our_setting=setting + f", rho {PAPER_RHO}",
            neutral=1.0, note=("the paper gives no number here; median over the curve parameters, range over them "
                               "and rho"), free_parameter="alpha, damage, unevenness, rho",
            sweep=ratio[var].values.ravel()))
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


#: the figures drawn from the saved datasets alone (file name -> function of the output folder)
FIGURES = {"inference.png": draw_inference}
