"""Data mixing after pruning: DRPruning's distributionally robust mixing (static or dynamic reference loss) against
a fixed mix and Sheared-LLaMA's dynamic batch loading, on modelled per-domain loss curves (Deng et al., arXiv
2411.14055; code github hexuandeng/DRPruning, read at ac442bb; github princeton-nlp/LLM-Shearing).

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

**Sheared-LLaMA's dynamic batch loading** (:func:`dbl_update`; Xia et al. 2024, arXiv 2310.06694, Algorithm 1,
and ``llmshearing/callbacks/dynamic_loading_callback.py``, copied unchanged into DRPruning's
``drpruning/callbacks/dynamic_loading_callback.py``): at every update the excess ``\\Delta_i = \\max(L_i - \\ell_i, 0)``
against the same scaling-law reference losses, ``w_i \\leftarrow w_i e^{\\eta \\Delta_i}`` normalised (a softmax of
``\\log w + \\eta \\Delta``, ``\\eta = 1``), then smoothed ``(1 - c) w + c / k`` with ``c = 10^{-4}`` (after DoReMi).
The callback itself does not clip ``\\Delta`` at 0 (``diff = losses - target_loss``); the paper's Algorithm 1 does;
``clip`` picks. Sheared-LLaMA updates every 50 of 3,200 batches in pruning and every 400 of 48,000 in continued
pretraining (``llmshearing/scripts/pruning.sh``, ``continue_pretrain.sh``: 64 and 120 updates), and starts
continued pretraining from the mix pruning ended at (:data:`SHEARED_CPT_MIX`), not from LLaMA's.

**DRPruning's dynamic reference loss** (:func:`fit_curve`, :func:`predicted_reference`, :class:`DynamicReference`;
``drpruning/callbacks/DRO_loading_callback.py`` ``eval_end``/``before_train_batch`` and ``DRO_server.py``): from 2%
of training each domain's loss is logged against the tokens it has seen; from 10% (and once a domain has more than
10 points) a curve ``L = E + A n^{-\\alpha}`` is fitted to it (there: Huber loss, delta 1e-3, L-BFGS from a grid of
starts, the best three averaged) and evaluated at the domain's end-of-training tokens, extrapolated linearly
(``n_i \\cdot T / t``); the prediction is capped at the lowest loss seen. The first prediction replaces the static
reference, later ones only lower it (``min``). Here the fit is least squares (the curves are noiseless), in the
curves' own variable ``n + n_0`` (our choice: the form that can fit them exactly), ``alpha`` by a grid and golden
section. The DRPruning code's history cap (64 points, one of the first 32 dropped at random) is kept, dropping
the 16th. As in the released callback, the mix keeps the start mix until the first fitted reference (10% of
training); the callback reads that reference as ``self.target_loss``, which it never sets (read here as its
``reference_loss``). Both codes evaluate before the first step (``eval_first=true``), so DBL updates at step 0.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from ..common.checks import check_float, check_int
from ..model.specs import SpecError

__all__ = ["DOMAINS", "START_MIX", "SHEARED_CPT_MIX", "REFERENCE_LOSS", "DAMAGE_PATTERN", "PRUNED_SHAPES", "METHODS",
           "chi_square", "worst_case_mix", "robust_mix", "follow_base", "dbl_update", "fit_curve", "predicted_reference",
           "DynamicReference", "curves", "train", "pruned_model"]

DOMAINS = ("cc", "github", "book", "stackexchange", "wiki", "arxiv", "c4")
#: LLaMA's pretraining mix over the seven domains (Touvron et al. 2023, Table 1), DRPruning's start mix
START_MIX = np.array([0.67, 0.045, 0.045, 0.02, 0.045, 0.025, 0.15])
#: the mix Sheared-LLaMA's pruning ended at, its start mix of continued pretraining (llmshearing/scripts/
#: continue_pretrain.sh, "final proportion of pruning"; DRPruning's continue_pretrain.sh uses it for update_type sheared)
SHEARED_CPT_MIX = np.array([0.2192, 0.0002, 0.0791, 0.0064, 0.0096, 0.001, 0.6845])
#: Sheared-LLaMA's reference losses per domain (llmshearing/scripts/pruning.sh, DOMAINS order) by target size
REFERENCE_LOSS = {"1.3b": np.array([1.9643, 0.7459, 2.1393, 1.6117, 1.7590, 1.4449, 2.1251]),
                  "2.7b": np.array([1.8712, 0.6883, 2.0325, 1.5353, 1.6297, 1.3560, 2.0328]),
                  "370m": np.array([2.1401, 0.8694, 2.3625, 1.7791, 2.047, 1.6637, 2.3139])}
#: which domains pruning damages more (+) or less (-) than the mean: our choice (code and maths most), swept by u
DAMAGE_PATTERN = np.array([0.0, 1.0, 0.0, 0.5, -0.5, 1.0, -0.5])
#: Sheared-LLaMA's pruned shapes (llmshearing/configs/llama2/*.yaml): hidden, heads, layers, intermediate
PRUNED_SHAPES = {"2.7b": (2560, 20, 32, 6912), "1.3b": (2048, 16, 24, 5504), "370m": (1024, 8, 24, 2816)}
N0_TOKENS = 1e8  # offset of the curves' token count (a finite loss right after pruning)
#: the mixing methods of :func:`train`: fixed (the start mix), robust (DRPruning's mix, static reference),
#: robust-dynamic (DRPruning's mix with its dynamic reference: DRPruning as published), dbl (Sheared-LLaMA's dynamic
#: batch loading from the same start mix), dbl-cpt (the same from Sheared-LLaMA's continued-pretraining start mix)
METHODS = ("fixed", "robust", "robust-dynamic", "dbl", "dbl-cpt")
DBL_ETA = 1.0  # dynamic_loading_callback.py: eta = 1.
DBL_SMOOTHING = 1e-4  # dynamic_loading_callback.py: c = 1e-4, following DoReMi


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


def dbl_update(w, loss, reference, eta: float = DBL_ETA, c: float = DBL_SMOOTHING, clip: bool = True) -> np.ndarray:
    """One step of Sheared-LLaMA's dynamic batch loading: ``Delta = max(L - ref, 0)`` (``clip``; the raw difference
    otherwise, as ``dynamic_loading_callback.py`` has it), ``w' = softmax(log w + eta Delta)`` (``w e^{eta Delta}``
    normalised), then ``(1 - c) w' + c / k``, renormalised."""
    w = np.asarray(w, dtype=float)
    delta = np.asarray(loss, dtype=float) - np.asarray(reference, dtype=float)
    if w.shape != delta.shape or np.any(w <= 0) or not np.all(np.isfinite(delta)):
        raise SpecError("w/loss", (w.tolist(), delta.tolist()), "expected a mix w > 0 and finite losses of its shape")
    if clip:
        delta = np.maximum(delta, 0.0)
    a = np.log(w) + eta * delta
    a = np.exp(a - a.max())
    a /= a.sum()
    out = (1.0 - c) * a + c / len(w)
    return out / out.sum()


def _profile(x_log: np.ndarray, loss: np.ndarray, alpha: np.ndarray):
    """Least-squares ``E, A`` of ``L = E + A x^{-alpha}`` for each domain (rows) at its ``alpha``; the residual."""
    x = np.exp(-alpha[:, None] * x_log)
    k = x.shape[1]
    xm, lm = x.sum(axis=1) / k, loss.sum(axis=1) / k
    dx = x - xm[:, None]
    var = np.einsum("ij,ij->i", dx, dx)
    A = np.einsum("ij,ij->i", dx, loss) / np.where(var > 0, var, 1.0) * (var > 0)
    E = lm - A * xm
    r = E[:, None] + A[:, None] * x - loss
    return E, A, np.einsum("ij,ij->i", r, r)


def fit_curve(n, loss, offset: float = N0_TOKENS, alpha_range=(0.01, 2.0)) -> tuple:
    """``L = E + A (n + offset)^{-alpha}`` fitted by least squares to each row of ``loss`` (domains x points,
    ``n`` the same shape): ``E, A`` in closed form for a given ``alpha``, ``alpha`` by a log grid (32 values over
    ``alpha_range``) then golden section between the best point's neighbours. Returns ``(E, A, alpha)`` arrays."""
    n, loss = np.atleast_2d(np.asarray(n, dtype=float)), np.atleast_2d(np.asarray(loss, dtype=float))
    if n.shape != loss.shape or n.shape[1] < 3:
        raise SpecError("n/loss", n.shape, "expected matching histories of at least 3 points")
    x_log = np.log(n + offset)
    grid = np.geomspace(*alpha_range, 32)
    rows = len(n)  # every (domain, grid alpha) pair in one call
    sse = _profile(np.repeat(x_log, len(grid), axis=0), np.repeat(loss, len(grid), axis=0),
                   np.tile(grid, rows))[2].reshape(rows, len(grid))
    best = sse.argmin(axis=1)
    lo, hi = grid[np.maximum(best - 1, 0)], grid[np.minimum(best + 1, len(grid) - 1)]
    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = _profile(x_log, loss, a)[2], _profile(x_log, loss, b)[2]
    for _ in range(48):  # golden section, every domain at once, one new evaluation a step
        left = fa <= fb  # the minimum lies in [lo, b]
        hi, lo = np.where(left, b, hi), np.where(left, lo, a)
        new = np.where(left, hi - g * (hi - lo), lo + g * (hi - lo))
        fnew = _profile(x_log, loss, new)[2]
        a, b, fa, fb = (np.where(left, new, b), np.where(left, a, new),
                        np.where(left, fnew, fb), np.where(left, fa, fnew))
    alpha = 0.5 * (lo + hi)
    E, A, _ = _profile(x_log, loss, alpha)
    return E, A, alpha


def predicted_reference(n, loss, n_final, offset: float = N0_TOKENS) -> np.ndarray:
    """DRPruning's reference from a domain's history (``DRO_server.py``): the fitted curve at ``n_final`` tokens,
    capped at the lowest loss seen and at 0 from below."""
    E, A, alpha = fit_curve(n, loss, offset)
    pred = E + A * (np.asarray(n_final, dtype=float) + offset) ** -alpha
    return np.maximum(np.minimum(pred, np.atleast_2d(loss).min(axis=1)), 0.0)


class DynamicReference:
    """DRPruning's dynamic reference loss over a run of ``steps`` (``DRO_loading_callback.py``): ``log`` each
    update's per-domain tokens and losses from ``start`` (2%) of training; from ``fit_from`` (10%), with more than
    ``min_points`` (10) points, ``update`` refits (:func:`predicted_reference` at the tokens extrapolated to the end,
    ``n T / t``): the first prediction replaces the static reference, later ones can only lower it. The history
    keeps ``history`` (64) points, as DRPruning's does."""

    def __init__(self, reference, steps: int, start: float = 0.02, fit_from: float = 0.1, min_points: int = 10,
                 history: int = 64):
        self.reference = np.array(reference, dtype=float)
        self.steps, self.start, self.fit_from, self.min_points = steps, start, fit_from, min_points
        self.replaced = False
        self.history = history
        self.n, self.loss = [], []

    def update(self, t: int, n: np.ndarray, loss: np.ndarray) -> np.ndarray:
        """The reference to use at step ``t`` (1-based count of steps done), after logging ``n`` and ``loss``."""
        if t >= self.start * self.steps:
            self.n.append(np.array(n, dtype=float))
            self.loss.append(np.array(loss, dtype=float))
            if len(self.loss) > self.history:  # DRPruning drops one of the first 32 at random; here the 16th
                del self.n[16], self.loss[16]
        if t >= self.fit_from * self.steps and len(self.loss) > self.min_points:
            hist_n, hist_l = np.array(self.n).T, np.array(self.loss).T
            new = predicted_reference(hist_n, hist_l, hist_n[:, -1] * self.steps / t)
            self.reference = new if not self.replaced else np.minimum(self.reference, new)
            self.replaced = True
        return self.reference


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
          follow_after: float = 0.2, interval: int = 1, clip: bool = True) -> dict:
    """Continued pretraining on the modelled curves ``c``: ``tokens`` in ``steps`` steps, each drawn by the
    current mix (``method``, one of :data:`METHODS`), the mix updated every ``interval`` steps from the losses then
    (as the callbacks update at each evaluation). Returns per step the ``loss`` (steps x domains), the sampling
    ``mix``, the ``reference`` the method measured excess against, and the ``tokens`` seen."""
    steps = check_int("steps", steps, 1, 10**6)
    tokens = check_float("tokens", tokens, 0.0, 1e15, open_min=True)
    interval = check_int("interval", interval, 1, steps)
    if method not in METHODS:
        raise SpecError("method", method, f"expected one of {', '.join(METHODS)}")
    per_step = tokens / steps
    n = np.zeros(len(DOMAINS))
    p = START_MIX.copy()
    q = SHEARED_CPT_MIX.copy() if method == "dbl-cpt" else START_MIX.copy()
    reference = np.array(c["reference"], dtype=float)
    dynamic = DynamicReference(reference, steps) if method == "robust-dynamic" else None
    loss = np.empty((steps + 1, len(DOMAINS)))
    mix = np.empty((steps, len(DOMAINS)))
    refs = np.empty((steps, len(DOMAINS)))
    loss[0] = _loss(c, n)
    for t in range(steps):
        if t % interval == 0:
            if dynamic is not None and t > 0:
                reference = dynamic.update(t, n, loss[t])
            # the released DRPruning callback moves the mix only once a fitted reference has come back (from 10%
            # of training; before_train_batch -> update_proportion): until then robust-dynamic keeps the start mix
            if method == "robust" or (method == "robust-dynamic" and dynamic.replaced):
                q = robust_mix(_excess(loss[t], reference), p, rho)
                if t >= follow_after * steps:
                    p = follow_base(p, q, START_MIX)
            elif method in ("dbl", "dbl-cpt"):  # eval_first=true in continue_pretrain.sh: an update at step 0
                q = dbl_update(q, loss[t], reference, clip=clip)
        mix[t], refs[t] = q, reference
        n = n + per_step * q
        loss[t + 1] = _loss(c, n)
    return {"loss": loss, "mix": mix, "reference": refs, "tokens": np.arange(steps + 1) * per_step}


def pruned_model(size: str, vocab: int = 32000, seq_len: int = 4096) -> dict:
    """A Sheared-LLaMA pruned shape as a model mapping for :mod:`trainscale.model.inference`."""
    if size not in PRUNED_SHAPES:
        raise SpecError("size", size, f"expected one of {', '.join(PRUNED_SHAPES)}")
    h, a, layers, f = PRUNED_SHAPES[size]
    return {"name": f"sheared-llama-{size}", "layers": layers, "hidden": h, "heads": a, "kv_heads": a,
            "ffn_hidden": f, "ffn_type": "swiglu", "vocab": vocab, "seq_len": seq_len,
            "source": "Sheared-LLaMA llmshearing/configs/llama2 (Xia et al. 2024)"}
