"""Independent subnetwork training vs compressed gradient descent (Shulgin & Richtárik, ICML 2024).

Shulgin & Richtárik, "Towards a Better Theoretical Understanding of Independent Subnetwork
Training" (ICML 2024, arXiv 2306.16484) analyse independent subnetwork training (IST) with
permutation sketches on quadratics ``f_i(x) = x'L_i x / 2 - b_i'x`` with exact (full-shard)
gradients and contrast it with distributed gradient descent under communication compression:
IST converges to a neighbourhood of the optimum whose size is set by a bias that does not vanish
with the step size and grows with the heterogeneity of the workers' data, while compressed GD
with an unbiased compressor or with error feedback goes (much) closer to the optimum at the same
number of bits per worker. The paper's results are theorems, so the comparison here is
qualitative: the floor's existence and its growth with heterogeneity.

:func:`ist_vs_compression` runs, for every ``heterogeneity`` of a sweep, one least-squares problem
(:func:`trainscale.training.convergence.make_problem`, ``sigma = 0`` so that with ``heterogeneity = 0`` every
worker's shard is interpolated by the same teacher) with ``full_batch=True`` through

* ``gd``: uncompressed synchronous gradient descent (the reference);
* ``ist``: IST with permutation sketches (``convergence.run(method="ist")``): each step every worker
  gets ``p / W`` coordinates and sends back ``32 p / W`` bits;
* ``rand_k``: Rand-k, unbiased (kept entries scaled by ``p/k``), ``k = p / W``;
* ``rand_k_ef``: Rand-k without the scaling (a contractive compressor) under error feedback;
* ``top_k``: Top-k without error feedback (biased);
* ``top_k_ef``: Top-k under error feedback.

The compression level is matched to IST's: ``k = p / W`` entries per message, each 32 bits of value
plus ``ceil(log2 p)`` of index, so the compressed methods send slightly *more* bits per step than IST.

Step sizes are fractions (``lr_fraction``) of each method's theoretical maximum, computed from the
problem: ``1/L`` for GD, Top-k and the error-feedback methods (``L`` the largest eigenvalue of the
pooled Hessian), ``1/(L (1 + omega/W))`` for unbiased Rand-k (``omega = p/k - 1``, the
compressor's variance) and ``1/lambda_max(M)`` for IST, ``M`` its expected operator
(:func:`ist_fixed_point`).

The synthetic quadratic stands in for no transformer of the catalog: it is the paper's own model (a
quadratic, the local model of any network's loss near a minimum); its size is ``dim`` parameters
(64 in the quick configuration, 256 in the full one: a 10^4-parameter quadratic would need a
10^4 x 10^4 rotation and Hessian in ``make_problem``, far beyond the runtime budget).

Time: the Dataset also carries ``comm_time_s``, the cumulative time of the workers' messages on a
``wallclock.Link`` (``bandwidth_GBps``, ``latency_s``), one message per step
(``wallclock.transfer_time_s`` of the largest message of the step). Compute is left out: on this
quadratic it is a few microseconds, and the IST-vs-data-parallel compute trade (IST computes on a
``1/W`` sub-model) has no counterpart here; bits are the paper's axis.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xarray as xr

from ..common import comparison
from ..training import convergence, wallclock
from ..common import io as tsio
from ..common.checks import check_float as _check_float
from ..common.checks import check_int as _check_int
from ..common.io import provenance
from ..model.specs import SpecError

__all__ = ["METHODS", "PAPER", "OUTPUTS", "RESOURCES", "compare", "compressor_for", "ist_fixed_point",
           "ist_predicted_floor", "ist_vs_compression", "step_size", "draw_suboptimality_vs_steps",
           "draw_suboptimality_vs_bits", "draw_floor_vs_heterogeneity", "FIGURES"]

PAPER = ("Shulgin & Richtárik, Towards a Better Theoretical Understanding of Independent Subnetwork Training "
         "(ICML 2024)")
OUTPUTS = ("ist_vs_compression.nc", "suboptimality_vs_steps.png", "suboptimality_vs_bits.png",
           "floor_vs_heterogeneity.png")
RESOURCES = {"mem_mb": 2000, "runtime_quick_min": 10, "runtime_full_min": 30}

METHODS = ("gd", "ist", "rand_k", "rand_k_ef", "top_k", "top_k_ef")
METHOD_LABELS = {
    "gd": "GD (uncompressed)",
    "ist": "IST (permutation sketch)",
    "rand_k": "Rand-k (unbiased)",
    "rand_k_ef": "Rand-k + EF",
    "top_k": "Top-k",
    "top_k_ef": "Top-k + EF",
}


def compressor_for(method: str, k: int) -> dict | None:
    """The ``convergence.run`` compressor of a compressed method (``None`` for ``gd`` and ``ist``)."""
    return {
        "gd": None,
        "ist": None,
        "rand_k": {"name": "random_k", "k": k, "unbiased": True},
        "rand_k_ef": {"name": "random_k", "k": k, "unbiased": False, "error_feedback": True},
        "top_k": {"name": "top_k", "k": k},
        "top_k_ef": {"name": "top_k", "k": k, "error_feedback": True},
    }[method]


def _shard_quadratics(problem: convergence.Problem) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each worker's ``L_i = X_i'X_i / n_i + lam I`` and ``b_i = X_i'y_i / n_i`` (least squares)."""
    Ls, bs = [], []
    for k in range(problem.workers):
        sl = problem.shard(k)
        Xk, yk = problem.X[sl], problem.y[sl]
        Ls.append(Xk.T @ Xk / len(yk) + problem.lam * np.eye(problem.dim))
        bs.append(Xk.T @ yk / len(yk))
    return Ls, bs


def ist_fixed_point(problem: convergence.Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IST's expected operator ``M``, ``b`` and the fixed point ``M^-1 b`` of its mean iterate.

    With full shard gradients and a fresh permutation sketch every step (``C_i = W diag(1[owner = i])``,
    blocks of ``q = p/W`` coordinates), ``E x_{t+1} = E x_t - lr (M E x_t - b)`` where
    ``b = mean_i b_i`` and ``M = sum_i (diag L_i + (q-1)/(p-1) offdiag L_i)`` (two coordinates share
    worker ``i``'s block with probability ``(q-1)/(W(p-1))``). The mean iterate therefore goes to
    ``M^-1 b``, not to the optimum ``L^-1 b`` (``L = mean_i L_i``): the bias of IST. Checked by
    ``tests/test_hierarchical.py::test_ist_mean_iterate_reaches_the_biased_fixed_point``.
    Returns ``(M, b, M^-1 b)``; least squares only, ``dim`` divisible by the number of workers.
    """
    if problem.kind != "least_squares":
        raise SpecError("kind", problem.kind, "the closed form needs a quadratic: least_squares")
    p, W = problem.dim, problem.workers
    if p % W:
        raise SpecError("dim", p, f"expected a multiple of workers = {W} (equal sub-networks)")
    q = p // W
    Ls, bs = _shard_quadratics(problem)
    share = (q - 1) / (p - 1) if p > 1 else 0.0
    M = np.zeros((p, p))
    for L in Ls:
        diag = np.diag(np.diag(L))
        M += diag + share * (L - diag)
    b = np.mean(bs, axis=0)
    return M, b, np.linalg.solve(M, b)


def ist_predicted_floor(problem: convergence.Problem) -> float:
    """Suboptimality ``f(M^-1 b) - f*`` of IST's biased fixed point (:func:`ist_fixed_point`).

    The iterates fluctuate around the fixed point, so by convexity the mean suboptimality of the
    iterates is at least this (plus a variance term that shrinks with the step size)."""
    _, _, fixed = ist_fixed_point(problem)
    return float(problem.loss(fixed) - problem.optimum_loss)


def step_size(problem: convergence.Problem, method: str, k: int, lr_fraction: float) -> float:
    """``lr_fraction`` of the method's largest theoretical step size (module docstring)."""
    p, W = problem.n_params, problem.workers
    Ls, _ = _shard_quadratics(problem)
    L = float(np.linalg.eigvalsh(np.mean(Ls, axis=0))[-1])
    if method == "ist":
        M, _, _ = ist_fixed_point(problem)
        return lr_fraction / float(np.linalg.eigvalsh(M)[-1])
    if method == "rand_k":
        omega = p / k - 1.0
        return lr_fraction / (L * (1.0 + omega / W))
    return lr_fraction / L






def ist_vs_compression(heterogeneities: Sequence[float], *, methods: Sequence[str] = METHODS, dim: int = 64,
                       n_samples: int = 512, workers: int = 4, kappa: float = 2.0, steps: int = 1000,
                       evals: int = 100, lr_fraction: float = 0.1, floor_window: float = 0.5,
                       bandwidth_GBps: float = 0.125, latency_s: float = 0.0, seed: int = 0) -> xr.Dataset:
    """IST vs compressed GD on least squares, for every heterogeneity and method.

    ``heterogeneities``: values in ``[0, 1]`` (distinct, increasing); ``methods`` a subset of
    :data:`METHODS`; the problem has ``dim`` parameters (a multiple of ``workers``), ``n_samples``
    examples (a multiple of ``workers``), covariance condition number ``kappa`` and no label
    noise; every method runs ``steps`` full-batch steps, evaluated ``evals`` times (``steps`` a
    multiple of ``evals``). ``floor`` is the mean suboptimality over the last ``floor_window``
    share of the evaluations. ``bandwidth_GBps`` / ``latency_s``: the link of ``comm_time_s``.
    Same arguments, same Dataset.
    """
    hets = list(heterogeneities) if not isinstance(heterogeneities, (str, bytes)) else None
    if not hets:
        raise SpecError("heterogeneities", heterogeneities, "expected a non-empty list of numbers in [0, 1]")
    hets = [_check_float("heterogeneities", h, 0.0, 1.0) for h in hets]
    if any(b <= a for a, b in zip(hets, hets[1:])):
        raise SpecError("heterogeneities", heterogeneities, "expected distinct values in increasing order")
    methods = list(methods) if not isinstance(methods, (str, bytes)) else None
    if not methods or any(m not in METHODS for m in methods) or len(set(methods)) != len(methods):
        raise SpecError("methods", methods, f"expected distinct names among {', '.join(METHODS)}")
    W = _check_int("workers", workers, 2)
    p = _check_int("dim", dim, W)
    if p % W:
        raise SpecError("dim", dim, f"expected a multiple of workers = {W} (IST's equal sub-networks)")
    n = _check_int("n_samples", n_samples, W)
    if n % W:
        raise SpecError("n_samples", n_samples, f"expected a multiple of workers = {W} (full-batch equal shards)")
    kappa = _check_float("kappa", kappa, 1.0, 1e6)
    steps = _check_int("steps", steps, 1)
    evals = _check_int("evals", evals, 1)
    if steps % evals:
        raise SpecError("evals", evals, f"expected a divisor of steps = {steps}")
    lr_fraction = _check_float("lr_fraction", lr_fraction, 0.0, 1.0, open_min=True)
    floor_window = _check_float("floor_window", floor_window, 0.0, 1.0, open_min=True)
    bandwidth_GBps = _check_float("bandwidth_GBps", bandwidth_GBps, 0.0, 1e6, open_min=True)
    latency_s = _check_float("latency_s", latency_s, 0.0, 1e3)
    seed = _check_int("seed", seed, 0)
    link = wallclock.Link(bandwidth_GBps, latency_s)
    k = p // W
    eval_every = steps // evals
    n_eval = evals + 1
    tail = max(1, int(round(floor_window * evals)))

    shape3 = (len(methods), len(hets), n_eval)
    shape2 = (len(methods), len(hets))
    sub = np.empty(shape3)
    gnorm = np.empty(shape3)
    loss = np.empty(shape3)
    bits = np.empty(shape3)
    comm = np.empty(shape3)
    lrs = np.empty(shape2)
    floor = np.empty(shape2)
    bits_step = np.empty(shape2)
    predicted = np.empty(len(hets))
    smooth = np.empty(len(hets))
    optimum_loss = np.empty(len(hets))
    for j, het in enumerate(hets):
        problem = convergence.make_problem("least_squares", n, p, workers=W, heterogeneity=het, seed=seed,
                                           kappa=kappa, sigma=0.0)
        predicted[j] = ist_predicted_floor(problem)
        optimum_loss[j] = problem.optimum_loss
        smooth[j] = lr_fraction / step_size(problem, "gd", k, lr_fraction)
        for i, method in enumerate(methods):
            lr = step_size(problem, method, k, lr_fraction)
            comp = compressor_for(method, k)
            kw = {"compressor": comp} if comp is not None else {}
            ds = convergence.run(problem, "ist" if method == "ist" else "sync", lr=lr, steps=steps,
                                 full_batch=True, eval_every=eval_every, seed=seed, _provenance=False, **kw)
            lrs[i, j] = lr
            sub[i, j] = ds["suboptimality"].values
            gnorm[i, j] = ds["grad_norm"].values
            loss[i, j] = ds["loss"].values
            per_worker = ds["bits_sent_per_worker"].values  # (step, worker), cumulative
            bits[i, j] = per_worker.mean(axis=1)
            # one message per worker per step; the step lasts as long as its largest message
            step_bits = np.diff(per_worker, axis=0).max(axis=1) / eval_every
            bits_step[i, j] = float(step_bits.max()) if step_bits.size else 0.0
            per_step_s = np.array([wallclock.transfer_time_s(b / 8.0, link) for b in step_bits])
            comm[i, j] = np.concatenate([[0.0], np.cumsum(per_step_s * eval_every)])
            floor[i, j] = float(np.mean(ds["suboptimality"].values[-tail:]))

    d3 = ("method", "heterogeneity", "step")
    d2 = ("method", "heterogeneity")
    step = np.arange(n_eval) * eval_every
    ds = xr.Dataset(
        {
            "suboptimality": (d3, sub, {"units": "1", "long_name": "suboptimality f(x) - f*"}),
            "grad_norm": (d3, gnorm, {"units": "1", "long_name": "norm of the full-dataset gradient"}),
            "loss": (d3, loss, {"units": "1", "long_name": "training loss on the pooled dataset"}),
            "bits_sent_per_worker": (d3, bits, {"units": "bit", "long_name": "cumulative bits sent per worker "
                                                                             "(mean over workers)"}),
            "comm_time_s": (d3, comm, {"units": "s", "long_name": "cumulative communication time on the link "
                                                                  "(compute excluded)"}),
            "lr": (d2, lrs, {"units": "1", "long_name": "step size"}),
            "floor": (d2, floor, {"units": "1", "long_name": f"mean suboptimality over the last "
                                                             f"{tail} evaluations"}),
            "bits_per_step_per_worker": (d2, bits_step, {"units": "bit",
                                                         "long_name": "bits one worker sends per step"}),
            "ist_predicted_floor": ("heterogeneity", predicted,
                                    {"units": "1", "long_name": "suboptimality of IST's fixed point M^-1 b"}),
            "smoothness": ("heterogeneity", smooth, {"units": "1", "long_name": "largest Hessian eigenvalue L"}),
            "optimum_loss": ("heterogeneity", optimum_loss, {"units": "1", "long_name": "optimal loss f*"}),
        },
        coords={
            "method": ("method", methods, {"units": "1", "long_name": "optimisation method"}),
            "heterogeneity": ("heterogeneity", np.asarray(hets, dtype=np.float64),
                              {"units": "1", "long_name": "data heterogeneity across workers"}),
            "step": ("step", step, {"units": "1", "long_name": "optimiser steps"}),
        },
    )
    parameters = dict(heterogeneities=hets, methods=methods, dim=p, n_samples=n, workers=W, kappa=kappa,
                      steps=steps, evals=evals, lr_fraction=lr_fraction, floor_window=floor_window,
                      bandwidth_GBps=bandwidth_GBps, latency_s=latency_s, seed=seed)
    ds.attrs.update(provenance(parameters, seed))
    ds.attrs.update(n_params=p, workers=W, k=k, floor_evaluations=tail,
                    method_labels=json.dumps({m: METHOD_LABELS[m] for m in methods}),
                    stands_in_for="the paper's quadratic (least squares); no catalog transformer")
    return ds


def compare(folder) -> list[comparison.Record]:
    """The paper's claims against the saved dataset of ``folder`` (``ist_vs_compression.nc``).

    The paper's results are theorems about quadratics, so its "numbers" are predictions for a given
    problem: IST with permutation sketches and exact shard gradients does not converge to the optimum
    but to a biased fixed point (:func:`ist_fixed_point`, the fixed point of the mean iterate, evaluated
    on our problem), and the bias grows with the heterogeneity of the workers' data. Records: the
    measured floor over the predicted one at the largest heterogeneity, and the floor's growth from the
    most homogeneous to the most heterogeneous data, measured against predicted."""
    ds = tsio.read_dataset(Path(folder) / "ist_vs_compression.nc")
    q = json.loads(ds.attrs["parameters"])
    study = "gradient-compression"
    hets = ds["heterogeneity"].values
    floor = ds["floor"].sel({"method": "ist"}).values
    pred = ds["ist_predicted_floor"].values
    paper_setting = ("analysis of IST on quadratics with exact shard gradients and permutation sketches: a "
                     "neighbourhood of the optimum set by a bias, not the optimum; no number, so the paper "
                     "value is that analysis' prediction for our problem, the fixed point M^-1 b of IST's mean "
                     "iterate (trainscale's closed form, ist_fixed_point)")
    ours = (f"least squares, {q['dim']} parameters, {q['workers']} workers, condition number {q['kappa']:g}, "
            f"{q['steps']} full-batch steps at {q['lr_fraction']:g} of each method's largest step size; floor = "
            f"mean suboptimality over the last {q['floor_window']:g} of the run; heterogeneity "
            f"{hets[0]:g}-{hets[-1]:g}")
    others = {m: float(ds["floor"].sel({"method": m, "heterogeneity": hets[-1]}))
              for m in ds["method"].values.tolist() if m != "ist"}
    records = [comparison.numeric(
        study, f"IST floor (suboptimality) at heterogeneity {hets[-1]:g}", "",
        paper_value=float(pred[-1]), paper_setting=paper_setting,
        our_value=float(floor[-1]), our_setting=ours, neutral=0.0,
        note=("measured over predicted at each heterogeneity: "
              + ", ".join(f"{h:g}: {f / p:.3f}" for h, f, p in zip(hets, floor, pred))
              + "; at matched bits the compressed methods end at "
              + ", ".join(f"{METHOD_LABELS.get(m, m)} {v:.2g}" for m, v in others.items())))]
    if len(hets) > 1:
        records.append(comparison.numeric(
            study, f"growth of IST's floor from heterogeneity {hets[0]:g} to {hets[-1]:g}", "x",
            paper_value=float(pred[-1] / pred[0]), paper_setting=paper_setting + "; the bias grows with "
            "the heterogeneity",
            our_value=float(floor[-1] / floor[0]), our_setting=ours, neutral=1.0))
    return records


# ---------------------------------------------------------------------------------------------
# figures (drawn from the saved dataset alone; `trainscale verify` redraws them)

#: the heterogeneous panel of the curves (the notebook's ``panel_heterogeneity``; the nearest swept value)
PANEL_HETEROGENEITY = 0.5
#: each method's colour and line style (an error-feedback variant: its base's colour, dashed)
_STYLES = {"gd": ("0.3", ":", "o"), "ist": ("C3", "-", "o"), "rand_k": ("C0", "-", "o"), "rand_k_ef": ("C0", "--", "s"),
           "top_k": ("C2", "-", "^"), "top_k_ef": ("C2", "--", "v")}
#: a log axis cannot draw f(x) - f* <= 0 (float64 round-off once a run reaches the optimum): such values are left
#: out, and the legend's title says so
NOT_DRAWN = "not drawn: f(x) − f* ≤ 0\n(float64 round-off at the optimum)"


def _positive(values) -> np.ndarray:
    """``values`` with every value <= 0 masked (NaN): what a log axis can draw honestly."""
    values = np.asarray(values, dtype=float)
    return np.where(values > 0, values, np.nan)


def _log_limits(ax, *arrays) -> None:
    """Whole decades around the positive values of ``arrays`` (matplotlib's 5% pad of 30 decades is 1.5)."""
    values = np.concatenate([np.ravel(a) for a in arrays])
    values = values[np.isfinite(values) & (values > 0)]
    ax.set_ylim(10.0 ** np.floor(np.log10(values.min())), 10.0 ** np.ceil(np.log10(values.max())))


def _setting(folder):
    ds = tsio.read_dataset(Path(folder) / "ist_vs_compression.nc")
    labels = json.loads(ds.attrs["method_labels"])
    title = (f"least squares, {ds.attrs['n_params']} parameters, {ds.attrs['workers']} workers, "
             f"k = p/W = {ds.attrs['k']}")
    return ds, labels, title


def _legend(fig_or_ax, any_masked: bool, **kwargs):
    legend = fig_or_ax.legend(title=NOT_DRAWN if any_masked else None, **kwargs)
    if any_masked:
        legend.get_title().set_fontsize(7)
    return legend


def _curves(folder, x_var: str, xlabel: str, panel_heterogeneity: float, x_scale: float = 1.0):
    """Suboptimality against ``x_var`` per method, at heterogeneity 0 and at ``panel_heterogeneity``, on a log
    axis: values <= 0 are left out (not clipped to a floor), and the legend (right of the panels) says so."""
    import matplotlib.pyplot as plt

    from ..common import plotting

    ds, labels, title = _setting(folder)
    hets = ds["heterogeneity"].values
    h_panel = float(hets[np.argmin(np.abs(hets - float(panel_heterogeneity)))])
    panels = [float(hets[0]), h_panel] if h_panel != hets[0] else [float(hets[0])]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + 1.8, 3.8), squeeze=False)
    masked = False
    for ax, h in zip(axes[0], panels):
        sel = ds.sel({"heterogeneity": h})
        masked |= bool((sel["suboptimality"].values <= 0).any())
        for m in ds["method"].values.tolist():
            color, ls, _ = _STYLES.get(m, ("0.5", "-", "o"))
            one = sel.sel({"method": m})
            ax.plot(one[x_var].values / x_scale, _positive(one["suboptimality"].values), color=color, linestyle=ls,
                    label=labels[m])
        ax.set(yscale="log", xlabel=xlabel, ylabel=plotting.label(ds["suboptimality"]) + " (log)",
               title=f"heterogeneity {h:g}")
        _log_limits(ax, _positive(sel["suboptimality"].values))
    handles, names = axes[0][0].get_legend_handles_labels()
    _legend(fig, masked, handles=handles, labels=names, loc="outside right upper", fontsize=7)
    fig.suptitle(title, fontsize=9)
    return fig


def draw_suboptimality_vs_steps(folder, panel_heterogeneity: float = PANEL_HETEROGENEITY):
    """Suboptimality against the iteration, per method (see :func:`_curves`)."""
    return _curves(folder, "step", "iteration [steps]", panel_heterogeneity)


def draw_suboptimality_vs_bits(folder, panel_heterogeneity: float = PANEL_HETEROGENEITY):
    """Suboptimality against the cumulative bits one worker sent, per method (see :func:`_curves`)."""
    return _curves(folder, "bits_sent_per_worker", "bits sent per worker [Mbit]", panel_heterogeneity, 1e6)


def draw_floor_vs_heterogeneity(folder):
    """Each method's floor (mean suboptimality at the end of the run) against the heterogeneity, with IST's
    predicted floor; a floor <= 0 (round-off) is left out on the log axis and the legend says so."""
    import matplotlib.pyplot as plt

    ds, labels, title = _setting(folder)
    hets = ds["heterogeneity"].values
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    masked = False
    for m in ds["method"].values.tolist():
        floor = ds["floor"].sel({"method": m}).values
        masked |= bool((floor <= 0).any())
        color, ls, marker = _STYLES.get(m, ("0.5", "-", "o"))
        ax.plot(hets, _positive(floor), color=color, linestyle=ls, marker=marker, markersize=4, label=labels[m])
    ax.plot(hets, _positive(ds["ist_predicted_floor"].values), color="k", linestyle="--", linewidth=1,
            label="IST predicted: f(M⁻¹b) − f*")
    _log_limits(ax, _positive(ds["floor"].values), _positive(ds["ist_predicted_floor"].values))
    ax.set(yscale="log", xlabel="heterogeneity of the workers' data (0: identical)",
           ylabel="final suboptimality f(x) − f* (floor, log)", xticks=hets)
    fig.suptitle(f"{title}, {json.loads(ds.attrs['parameters'])['steps']} steps;\nfloor: mean over the last "
                 f"{ds.attrs['floor_evaluations']} evaluations", fontsize=9)
    _legend(fig, masked, loc="outside right center", fontsize=7)
    return fig


#: the figures drawn from the saved dataset alone (file name -> function of the output folder)
FIGURES = {"suboptimality_vs_steps.png": draw_suboptimality_vs_steps,
           "suboptimality_vs_bits.png": draw_suboptimality_vs_bits,
           "floor_vs_heterogeneity.png": draw_floor_vs_heterogeneity}
