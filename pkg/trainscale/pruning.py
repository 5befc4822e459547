"""Data mixing after pruning: DRPruning's distributionally robust mixing against a fixed mix, on modelled
per-domain loss curves (Deng et al., arXiv 2411.14055; code github hexuandeng/DRPruning).

**Domains and anchors.** The seven RedPajama domains of Sheared-LLaMA (:data:`DOMAINS`), their start mix
``p0`` (LLaMA's data mix: 0.67, .045, .045, .02, .045, .025, .15) and the reference losses of the pruned
target size from Sheared-LLaMA's ``llmshearing/scripts/pruning.sh`` (:data:`REFERENCE_LOSS`; 1.3B, 2.7B and
370M), which DRPruning's excess loss is measured against.

**Loss curves (modelled, not trained).** Domain ``i`` after ``n_i`` tokens of it:

.. math:: L_i(n_i) = E_i + A_i\\,(n_i + n_0)^{-\\alpha},

with ``E_i = (1 - m)\\,\\ell_i`` (``\\ell_i`` the reference loss, ``m`` the margin by which training for long
enough beats it), and ``A_i`` set by the loss right after pruning, ``L_i(0) = \\ell_i + D (1 + u z_i)``: a mean
damage ``D`` made uneven across domains by ``u`` along the pattern :data:`DAMAGE_PATTERN` (code and maths hurt
most: our choice, swept through ``u``). ``alpha``, ``D``, ``u`` and ``m`` are documented free parameters,
swept by the study.

**DRPruning's mixing** (:func:`robust_mix`, following ``DRO_loading_callback.py``): the excess
``e_i = L_i - \\ell_i`` (if every excess is negative, the reference is scaled by 0.9, 0.8, ... until one is not);
``q_i \\propto p_i\\,\\max(0, e_i - \\eta)`` with ``\\eta`` found by bisection so that the chi-square divergence
``\\tfrac12 \\sum_i p_i (q_i/p_i - 1)^2 = \\rho``; ``q_i / p_i`` clamped to at least ``min_ratio`` (0.2) and
renormalised, then ``q`` clamped to at least ``min p``. After 20% of training the base mix ``p`` follows ``q``
by an exponential average (0.1), clamped to ``[p0/2, 2 p0]`` and to ``[min p0, max p0]``
(:func:`follow_base`). Tokens of each step are drawn by ``q``; the fixed mix draws by ``p0`` throughout.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from .checks import check_float, check_int
from .specs import SpecError

__all__ = ["DOMAINS", "START_MIX", "REFERENCE_LOSS", "DAMAGE_PATTERN", "PRUNED_SHAPES", "chi_square", "worst_case_mix", "robust_mix",
           "follow_base", "curves", "train", "pruned_model"]

DOMAINS = ("cc", "github", "book", "stackexchange", "wiki", "arxiv", "c4")
#: LLaMA's pretraining mix over the seven domains (Touvron et al. 2023, Table 1), DRPruning's start mix
START_MIX = np.array([0.67, 0.045, 0.045, 0.02, 0.045, 0.025, 0.15])
#: Sheared-LLaMA's reference losses per domain (llmshearing/scripts/pruning.sh, DOMAINS order) by target size
REFERENCE_LOSS = {"1.3b": np.array([1.9643, 0.7459, 2.1393, 1.6117, 1.7590, 1.4449, 2.1251]),
                  "2.7b": np.array([1.8712, 0.6883, 2.0325, 1.5353, 1.6297, 1.3560, 2.0328]),
                  "370m": np.array([2.1401, 0.8694, 2.3625, 1.7791, 2.047, 1.6637, 2.3139])}
#: which domains pruning damages more (+) or less (-) than the mean: our choice (code and maths most), swept by u
DAMAGE_PATTERN = np.array([0.0, 1.0, 0.0, 0.5, -0.5, 1.0, -0.5])
#: Sheared-LLaMA's pruned shapes (llmshearing/configs/llama2/*.yaml): hidden, heads, layers, intermediate
PRUNED_SHAPES = {"2.7b": (2560, 20, 32, 6912), "1.3b": (2048, 16, 24, 5504), "370m": (1024, 8, 24, 2816)}
N0_TOKENS = 1e8  # offset of the curves' token count (a finite loss right after pruning)


def chi_square(q: np.ndarray, p: np.ndarray) -> float:
    """``1/2 sum_i p_i (q_i/p_i - 1)^2``."""
    return float(0.5 * np.sum(p * (q / p - 1.0) ** 2))


def _q_of(eta: float, excess: np.ndarray, p: np.ndarray) -> np.ndarray:
    w = p * np.maximum(0.0, excess - eta)
    s = w.sum()
    return w / s if s > 0 else p.copy()


def worst_case_mix(excess, p, rho: float = 0.1, tol: float = 1e-12) -> np.ndarray:
    """The chi-square ball's worst case before DRPruning's clamps: ``q_i \\propto p_i max(0, e_i - eta)`` with
    ``eta`` found by bisection so that ``1/2 sum p (q/p - 1)^2 = rho`` (the divergence grows with ``eta``: ``q -> p``
    as ``eta -> -inf``); the base mix when the excesses are uniform."""
    e = np.asarray(excess, dtype=float)
    p = np.asarray(p, dtype=float)
    if e.shape != p.shape or not np.all(np.isfinite(e)) or np.any(p <= 0) or abs(p.sum() - 1) > 1e-9:
        raise SpecError("excess/p", (e.tolist(), p.tolist()), "expected finite excesses and a mix p > 0 summing to 1")
    rho = check_float("rho", rho, 0.0, 100.0, open_min=True)
    if np.allclose(e, e[0]):  # uniform excess: no domain is worse off, the base mix stands
        return p.copy()
    hi = float(e.max())
    lo = min(-abs(hi) / (math.sqrt(2.0 * rho + 1.0) - 1.0), float(e.min())) - 1.0
    while chi_square(_q_of(lo, e, p), p) > rho:  # widen until the bracket holds the root
        lo -= 2.0 * (hi - lo)
    # until the divergence meets rho to ``tol`` (relative), or eta to the resolution of a double: the
    # divergence can swing over an eta interval as small as the gap between the two largest excesses
    for _ in range(400):
        mid = 0.5 * (lo + hi)
        divergence = chi_square(_q_of(mid, e, p), p)
        if divergence > rho:
            hi = mid
        else:
            lo = mid
            if rho - divergence <= tol * rho:
                break
        if hi - lo <= 4.0 * np.finfo(float).eps * max(abs(hi), abs(lo)):
            break
    return _q_of(lo, e, p)


def robust_mix(excess, p, rho: float = 0.1, min_ratio: float = 0.2) -> np.ndarray:
    """DRPruning's sampling mix for per-domain ``excess`` losses and base mix ``p``: :func:`worst_case_mix`, then
    ``q/p`` clamped to at least ``min_ratio`` and renormalised, then ``q`` clamped to at least ``min p``."""
    p = np.asarray(p, dtype=float)
    q = worst_case_mix(excess, p, rho)
    q = np.maximum(q / p, min_ratio) * p
    q /= q.sum()
    q = np.maximum(q, p.min())
    return q / q.sum()


def follow_base(p: np.ndarray, q: np.ndarray, p0: np.ndarray, rate: float = 0.1) -> np.ndarray:
    """The base mix following ``q`` (exponential average ``rate``), clamped to ``[p0/2, 2 p0]`` and to
    ``[min p0, max p0]``, renormalised."""
    p = (1.0 - rate) * p + rate * q
    p = np.clip(p, p0 / 2.0, 2.0 * p0)
    p = np.clip(p, p0.min(), p0.max())
    return p / p.sum()


def curves(size: str = "1.3b", alpha: float = 0.3, damage: float = 1.0, unevenness: float = 0.5,
           margin: float = 0.05) -> dict:
    """The modelled curves' ``E``, ``A`` and ``alpha`` for the target ``size`` (see the module docstring)."""
    if size not in REFERENCE_LOSS:
        raise SpecError("size", size, f"expected one of {', '.join(REFERENCE_LOSS)}")
    alpha = check_float("alpha", alpha, 0.0, 2.0, open_min=True)
    damage = check_float("damage", damage, 0.0, 10.0, open_min=True)
    u = check_float("unevenness", unevenness, 0.0, 1.9)
    m = check_float("margin", margin, 0.0, 0.5)
    ref = REFERENCE_LOSS[size]
    E = (1.0 - m) * ref
    start = ref + damage * (1.0 + u * DAMAGE_PATTERN)
    A = (start - E) * N0_TOKENS ** alpha
    return {"E": E, "A": A, "alpha": alpha, "reference": ref}


def _loss(c: Mapping, n: np.ndarray) -> np.ndarray:
    return c["E"] + c["A"] * (n + N0_TOKENS) ** -c["alpha"]


def _excess(loss: np.ndarray, ref: np.ndarray) -> np.ndarray:
    e = loss - ref
    scale = 1.0
    while np.all(e < 0) and scale > 0.05:  # DRPruning scales the reference down until one domain lags it
        scale -= 0.1
        e = loss - scale * ref
    return e


def train(c: Mapping, tokens: float = 50e9, steps: int = 500, method: str = "robust", rho: float = 0.1,
          follow_after: float = 0.2) -> dict:
    """Continued pretraining on the modelled curves ``c``: ``tokens`` in ``steps`` steps, each drawn by the
    current mix (``method``: ``robust`` = DRPruning's, ``fixed`` = the start mix). Returns per step the
    ``loss`` (steps x domains), the sampling ``mix`` and the ``tokens`` seen."""
    steps = check_int("steps", steps, 1, 10**6)
    tokens = check_float("tokens", tokens, 0.0, 1e15, open_min=True)
    if method not in ("robust", "fixed"):
        raise SpecError("method", method, "expected robust or fixed")
    per_step = tokens / steps
    n = np.zeros(len(DOMAINS))
    p = START_MIX.copy()
    loss = np.empty((steps + 1, len(DOMAINS)))
    mix = np.empty((steps, len(DOMAINS)))
    loss[0] = _loss(c, n)
    for t in range(steps):
        q = robust_mix(_excess(loss[t], c["reference"]), p, rho) if method == "robust" else START_MIX
        if method == "robust" and t >= follow_after * steps:
            p = follow_base(p, q, START_MIX)
        mix[t] = q
        n = n + per_step * q
        loss[t + 1] = _loss(c, n)
    return {"loss": loss, "mix": mix, "tokens": np.arange(steps + 1) * per_step}


def pruned_model(size: str, vocab: int = 32000, seq_len: int = 4096) -> dict:
    """A Sheared-LLaMA pruned shape as a model mapping for :mod:`trainscale.inference`."""
    if size not in PRUNED_SHAPES:
        raise SpecError("size", size, f"expected one of {', '.join(PRUNED_SHAPES)}")
    h, a, layers, f = PRUNED_SHAPES[size]
    return {"name": f"sheared-llama-{size}", "layers": layers, "hidden": h, "heads": a, "kv_heads": a,
            "ffn_hidden": f, "ffn_type": "swiglu", "vocab": vocab, "seq_len": seq_len,
            "source": "Sheared-LLaMA llmshearing/configs/llama2 (Xia et al. 2024)"}
