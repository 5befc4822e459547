"""big-model-scheduling: kernel machines at scale by random features and block-splitting ADMM (Avron &
Sindhwani, "High-performance Kernel Machines with Implicit Distributed Optimization and Randomization",
arXiv 1409.0940; Technometrics 58(3), 2016; code: libSkylark ``ml/BlockADMM.hpp``).

The paper trains Gaussian-kernel models on millions of examples (MNIST-8M, TIMIT) on two distributed-memory
clusters, one a Blue Gene/Q: random Fourier features make the model linear in a large feature space, and
block-splitting ADMM spreads the examples over nodes and the feature blocks over threads, with a cached
``(Z_ij^T Z_ij + I)^-1`` per block and one broadcast and one reduce of the weights per iteration (rho = 1).

What was read, and where (see :data:`READ`): the paper's title page, abstract and the start of its introduction
(the stored full-text copy at koineu.com/en/posts/2015/04/2015-04-17-1409_0940, the v3 of 17 April 2015, and
scholar.archive.org's arXiv v3 record, pages corpus); a section-by-section summary (bohrium.com paper-details
page, pages corpus) which says the experiments run MNIST and TIMIT on two distributed-memory environments and
measure speed-up and parallel efficiency for strong scaling; libSkylark's ``ml/BlockADMM.hpp`` and
``doc/sphinx/ml.rst`` (github:xdata-skylark/libskylark, fetched): the iteration (broadcast of ``Wbar``, proximal
step, cached block inverses, reduce), rho = 1, and that the random features are recomputed every iteration
unless ``--cachetransforms`` is given. The stored copies of the text stop after ~2,000 characters and this
machine has no web access: the paper's tables (its node counts, numbers of random features, times, speed-ups,
accuracies) could not be read, and none is typed from memory, so every record here is a direction.

Here: (1) test accuracy against the number of random features on a generated problem small enough for exact
kernel ridge regression (:func:`trainscale.workloads.kernelmachines.make_problem`; a different setting, labelled); (2) the
ADMM iterates converging to the direct ridge solve for several splits (a self-check, tested, no record);
(3) time per iteration against Blue Gene/Q nodes at the paper's problem size (MNIST-8M: 8.1 million examples,
784 inputs, 10 classes): each node's FLOPs at a sustained share of the node's peak (swept, 10-50%), the broadcast
and reduce priced by the project's collectives on the 5D torus's link (:data:`BGQ`), strong and weak scaling.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xarray as xr

from ..common import comparison
from ..common import io as tsio
from ..workloads import kernelmachines as km
from ..common.checks import check_float, check_floats, check_int
from ..common.io import provenance
from ..model.specs import SpecError
from ..training.wallclock import Link

__all__ = ["PAPER", "OUTPUTS", "RESOURCES", "PAPER_SETTING", "READ", "BGQ", "MNIST8M", "SUSTAINED_FRACTION",
           "compare", "accuracy_study", "admm_study", "scaling_study", "kernel_error_slope", "MC_RATE", "FIGURES"]

PAPER = ("Avron & Sindhwani, High-performance Kernel Machines with Implicit Distributed Optimization and "
         "Randomization (arXiv 1409.0940; Technometrics 2016)")
OUTPUTS = ("accuracy.nc", "admm.nc", "scaling.nc", "accuracy.png", "admm.png", "scaling.png")
RESOURCES = {"mem_mb": 2000, "runtime_quick_min": 2, "runtime_full_min": 5}
STUDY = "big-model-scheduling"
#: an IBM Blue Gene/Q node and its torus link. peak: 16 compute cores (of 18: one for the OS, one spare) at
#: 1.6 GHz, 4 FMA (8 FLOP) per cycle = 12.8 GFLOP/s a core, 204.8 a node (euroben.nl "The BlueGene/Q processor",
#: pages corpus; IBM J. Res. Dev. 57, 2013); 16 GB DDR3-1333 per node (same), 42.6 GB/s (2 controllers x
#: 21.3 GB/s); link: "2 GBps of raw data, simultaneously, in both directions on all 10 links; at a 10% packet
#: overhead the payload in both directions on a single link is 3.6 GBps" (IBM Redbook SG24-7872, Blue Gene/Q
#: Hardware Overview, ch. 2, pages corpus: oreilly.com), 1.8 GB/s a direction; latency: estimate, a few
#: microseconds per MPI collective step (hops ~0.1 us, the software stack dominates)
BGQ = {"cores": 16, "peak_gflops": 204.8, "memory_GB": 16.0, "memory_GBps": 42.6, "link_GBps": 1.8,
       "latency_s": 3.0e-6}
#: the node's sustained share of peak used for the headline (estimate): the iteration's products with the k = 10
#: columns of the weights read Z once per 2k FLOP (k/4 = 2.5 FLOP/byte in float64: at most 106 GFLOP/s, 52% of
#: peak, on 42.6 GB/s); the feature recomputation X Omega is a GEMM that can run nearer peak. Swept over 10-50%.
SUSTAINED_FRACTION = 0.2
#: MNIST-8M (Loosli, Canu & Bottou's infinite MNIST, 8.1 million 28 x 28 digits; LIBSVM data sets page "mnist8m":
#: 8,100,000 examples, 784 features, 10 classes), the paper's larger MNIST problem
MNIST8M = {"examples": 8_100_000, "inputs": 784, "classes": 10}

PAPER_SETTING = ("Gaussian-kernel models by random Fourier features and block-splitting ADMM (rho = 1) on MNIST-8M "
                 "and TIMIT on two distributed-memory clusters, one a Blue Gene/Q")
READ = ("read: the paper's abstract and introduction (koineu.com full-text copy, v3 2015, and scholar.archive.org, "
        "pages corpus), a section summary (bohrium.com) and libSkylark's BlockADMM.hpp; the stored text stops "
        "before the experiments and there is no web access here, so the paper's tables were not read and no "
        "number of theirs is compared (none typed from memory)")
MC_RATE = -0.5  # Monte Carlo rate of random features (Rahimi & Recht 2007), which the paper's randomization rests on


def _ints(name, values, lo, hi) -> list[int]:
    if isinstance(values, str) or not isinstance(values, Sequence) or not values or len(set(values)) != len(values):
        raise SpecError(name, values, "expected a non-empty list of distinct integers")
    return sorted(check_int(name, v, lo, hi) for v in values)


def _attrs(da, units, long_name):
    da.attrs.update({"units": units, "long_name": long_name})
    return da


def _problem(p):
    return km.make_problem(p["n_train"], p["n_test"], p["dim"], p["classes"], p["clusters_per_class"], 1.0,
                           p["centre_scale"], p["problem_seed"])


def problem_parameters(n_train=2000, n_test=1000, dim=10, classes=3, clusters_per_class=8, centre_scale=1.5,
                       problem_seed=0, lam=0.5) -> dict:
    """The generated problem's parameters, checked (see :func:`trainscale.workloads.kernelmachines.make_problem`)."""
    return {"n_train": check_int("n_train", n_train, 2, 20000), "n_test": check_int("n_test", n_test, 1, 10**5),
            "dim": check_int("dim", dim, 1, 1000), "classes": check_int("classes", classes, 2, 100),
            "clusters_per_class": check_int("clusters_per_class", clusters_per_class, 1, 100),
            "centre_scale": check_float("centre_scale", centre_scale, 0.0, 100.0, open_min=True),
            "problem_seed": check_int("problem_seed", problem_seed, 0, 2**31),
            "lam": check_float("lam", lam, 0.0, 1e6, open_min=True)}


def accuracy_study(problem: dict, sigmas: Sequence[float] = (2.5,), n_features: Sequence[int] = (16, 256, 2048),
                   feature_seeds: Sequence[int] = (0,), kernel_error_rows: int = 500) -> xr.Dataset:
    """Test accuracy of ridge regression on ``D`` random features (direct solve) and of exact kernel ridge
    regression, for every kernel width ``sigma``, ``D`` and feature draw; the kernel approximation error on the
    first ``kernel_error_rows`` training examples; the relative gap of the predictions to the exact ones."""
    sigmas = sorted(check_floats("sigmas", sigmas, 0.0, 1e4, open_min=True))
    Ds = _ints("n_features", n_features, 1, 8192)
    seeds = _ints("feature_seeds", feature_seeds, 0, 2**31)
    rows = check_int("kernel_error_rows", kernel_error_rows, 2, problem["n_train"])
    data = _problem(problem)
    Xtr, T, Xte, yte = data["X_train"], data["T_train"], data["X_test"], data["y_test"]
    shape = (len(sigmas), len(Ds), len(seeds))
    acc, kerr, gap = np.empty(shape), np.empty(shape), np.empty(shape)
    exact = np.empty(len(sigmas))
    for s, sigma in enumerate(sigmas):
        pred_exact = km.exact_krr(Xtr, T, Xte, sigma, problem["lam"])
        exact[s] = km.accuracy(pred_exact, yte)
        Ksub = km.gaussian_kernel(Xtr[:rows], Xtr[:rows], sigma)
        for d, D in enumerate(Ds):
            for e, seed in enumerate(seeds):
                omega, phase = km.random_features(problem["dim"], D, sigma, seed)
                Z = km.features(Xtr, omega, phase)
                pred = km.features(Xte, omega, phase) @ km.ridge_direct(Z, T, problem["lam"])
                acc[s, d, e] = km.accuracy(pred, yte)
                kerr[s, d, e] = km.kernel_error(Z[:rows], Ksub)
                gap[s, d, e] = np.linalg.norm(pred - pred_exact) / np.linalg.norm(pred_exact)
    lin = np.c_[Xtr, np.ones(len(Xtr))]
    linear = km.accuracy(np.c_[Xte, np.ones(len(Xte))] @ km.ridge_direct(lin, T, problem["lam"]), yte)
    dims = ("sigma", "n_features", "feature_seed")
    ds = xr.Dataset({"test_accuracy": (dims, acc), "kernel_error": (dims, kerr), "prediction_gap": (dims, gap),
                     "exact_test_accuracy": (("sigma",), exact), "linear_test_accuracy": ((), linear)},
                    coords={"sigma": sigmas, "n_features": Ds, "feature_seed": seeds})
    _attrs(ds["test_accuracy"], "1", "test accuracy, ridge regression on the random features (direct solve)")
    _attrs(ds["kernel_error"], "1", f"||Z Z^T - K||_F / ||K||_F on the first {rows} training examples")
    _attrs(ds["prediction_gap"], "1", "||f_RFF - f_exact|| / ||f_exact|| on the test set")
    _attrs(ds["exact_test_accuracy"], "1", "test accuracy, exact kernel ridge regression")
    _attrs(ds["linear_test_accuracy"], "1", "test accuracy, linear ridge regression on the raw inputs (no kernel)")
    _attrs(ds["sigma"], "1", "Gaussian kernel width (inputs are in units of the cluster spread)")
    _attrs(ds["n_features"], "1", "number of random Fourier features D")
    _attrs(ds["feature_seed"], "1", "seed of the random feature draw")
    ds.attrs.update(provenance({**problem, "sigmas": sigmas, "n_features": Ds, "feature_seeds": seeds,
                                "kernel_error_rows": rows}))
    return ds


def admm_study(problem: dict, sigma: float = 2.5, n_features: int = 256, workers: Sequence[int] = (1, 4),
               blocks: Sequence[int] = (1, 4), iterations: int = 200, rho: float = 1.0,
               feature_seed: int = 0) -> xr.Dataset:
    """Block-splitting ADMM on ``n_features`` random features of the problem, examples over ``workers`` and
    feature blocks over ``blocks``: distance of the consensus weights to the direct ridge solve per
    iteration, and the test accuracy reached."""
    P = _ints("admm_workers", workers, 1, 1024)
    J = _ints("admm_blocks", blocks, 1, 1024)
    iterations = check_int("admm_iterations", iterations, 1, 100000)
    data = _problem(problem)
    omega, phase = km.random_features(problem["dim"], check_int("admm_features", n_features, 1, 8192),
                                      check_float("sigma", sigma, 0.0, 1e4, open_min=True), feature_seed)
    Z, Zte = km.features(data["X_train"], omega, phase), km.features(data["X_test"], omega, phase)
    W_direct = km.ridge_direct(Z, data["T_train"], problem["lam"])
    dist = np.empty((len(P), len(J), iterations))
    acc = np.empty((len(P), len(J)))
    for a, p in enumerate(P):
        for b, j in enumerate(J):
            run = km.admm_solve(Z, data["T_train"], problem["lam"], p, j, iterations, rho, W_direct)
            dist[a, b] = run["distance"]
            acc[a, b] = km.accuracy(Zte @ run["W"], data["y_test"])
    ds = xr.Dataset({"distance": (("workers", "blocks", "iteration"), dist),
                     "test_accuracy": (("workers", "blocks"), acc),
                     "direct_test_accuracy": ((), km.accuracy(Zte @ W_direct, data["y_test"]))},
                    coords={"workers": P, "blocks": J, "iteration": np.arange(1, iterations + 1)})
    _attrs(ds["distance"], "1", "||W_ADMM - W_direct||_F / ||W_direct||_F")
    _attrs(ds["test_accuracy"], "1", "test accuracy of the ADMM weights after the last iteration")
    _attrs(ds["direct_test_accuracy"], "1", "test accuracy of the direct ridge solve on the same features")
    _attrs(ds["workers"], "1", "workers (examples split over them)")
    _attrs(ds["blocks"], "1", "feature blocks (threads per worker)")
    _attrs(ds["iteration"], "1", "ADMM iteration")
    ds.attrs.update(provenance({**problem, "sigma": sigma, "n_features": n_features, "iterations": iterations,
                                "rho": rho, "feature_seed": feature_seed}))
    return ds


def scaling_study(workers: Sequence[int] = (64, 128, 256, 512, 1024), strong_examples: int = MNIST8M["examples"],
                  weak_examples: int = 7910, input_dim: int = MNIST8M["inputs"], classes: int = MNIST8M["classes"],
                  n_features: Sequence[int] = (5000, 10000, 20000), blocks: int = BGQ["cores"],
                  sustained_fractions: Sequence[float] = (0.1, 0.2, 0.35, 0.5),
                  bandwidths_GBps: Sequence[float] = (0.9, 3.6), peak_gflops: float = BGQ["peak_gflops"],
                  link_GBps: float = BGQ["link_GBps"], latency_s: float = BGQ["latency_s"],
                  headline_features: int = 10000, headline_fraction: float = SUSTAINED_FRACTION) -> xr.Dataset:
    """Time per iteration against Blue Gene/Q nodes at the paper's problem size (MNIST-8M by default): compute =
    one node's iteration FLOPs (:func:`trainscale.workloads.kernelmachines.iteration_flops` with the random features
    recomputed every iteration, libSkylark's default) at ``sustained_fraction x peak_gflops``; communication =
    broadcast + reduce of the ``D x k`` weights by the project's collectives over one torus link per node
    (``link_GBps``, ``latency_s``; each of ``bandwidths_GBps`` too). Strong scaling: ``strong_examples`` split over
    the nodes; weak scaling: ``weak_examples`` per node. Every random-feature count ``D`` of ``n_features`` and
    every sustained fraction is priced (the paper's ``D`` was not read, and the node's sustained rate is an
    estimate); ``headline_features`` and ``headline_fraction`` pick the headline."""
    P = _ints("workers", workers, 1, 100000)
    strong = check_int("strong_examples", strong_examples, max(P), 10**9)
    weak = check_int("weak_examples", weak_examples, 1, 10**8)
    d = check_int("input_dim", input_dim, 0, 10**6)
    k = check_int("classes", classes, 1, 10**4)
    Ds = _ints("scaling_features", n_features, 1, 10**7)
    J = check_int("scaling_blocks", blocks, 1, min(Ds))
    fr = sorted(check_floats("sustained_fractions", sustained_fractions, 0.0, 1.0, open_min=True))
    peak = check_float("peak_gflops", peak_gflops, 0.0, 1e7, open_min=True)
    link = check_float("link_GBps", link_GBps, 0.0, 1e4, open_min=True)
    lat = check_float("latency_s", latency_s, 0.0, 1.0)
    bws = sorted(set(check_floats("bandwidths_GBps", bandwidths_GBps, 0.0, 1e4, open_min=True)) | {link})
    D0 = check_int("headline_features", headline_features, 1, 10**7)
    f0 = check_float("headline_fraction", headline_fraction, 0.0, 1.0, open_min=True)
    if D0 not in Ds:
        raise SpecError("headline_features", D0, f"expected one of scaling_features {Ds}")
    if f0 not in fr:
        raise SpecError("headline_fraction", f0, f"expected one of sustained_fractions {fr}")
    modes = ["strong", "weak"]
    n_i = np.array([[strong // p for p in P], [weak] * len(P)], dtype=float)
    flops = np.array([[[km.iteration_flops(int(n), D, k, J, d) for D in Ds] for n in row] for row in n_i])
    rate = np.array(fr) * peak * 1e9
    compute = flops[..., None] / rate  # (scaling, workers, D, fraction)
    comm = np.array([[[km.comm_time_s(D, k, p, Link(bw, lat))["total_s"] for bw in bws] for D in Ds] for p in P])
    it = compute[..., None] + comm[None, :, :, None, :]  # (scaling, workers, D, fraction, bandwidth)
    ratio = np.array(P, dtype=float)[:, None, None, None] / P[0]
    eff = np.stack([it[0, :1] / (ratio * it[0]), it[1, :1] / it[1]])
    # one node's memory: its examples, the cached block inverses, the random features of every block in flight
    # (all J blocks at once, one per thread) and the ADMM state of its examples (O, Obar, nu: 3 n_i k)
    mem = np.array([[[(nn * d + J * (D / J) ** 2 + nn * D + 3 * nn * k + 4 * D * k) * km.BYTES_PER_VALUE / 1e9
                      for D in Ds] for nn in row] for row in n_i])
    dims = ("scaling", "workers", "n_features", "sustained_fraction", "bandwidth_GBps")
    ds = xr.Dataset({"compute_s": (dims[:4], compute),
                     "comm_s": (("workers", "n_features", "bandwidth_GBps"), comm),
                     "iteration_s": (dims, it), "comm_share": (dims, comm[None, :, :, None, :] / it),
                     "efficiency": (dims, eff),
                     "speedup": (dims, np.where(np.array(modes)[:, None, None, None, None] == "strong",
                                                it[:, :1] / it, np.nan)),
                     "examples_per_worker": (dims[:2], n_i),
                     "flops_per_worker": (dims[:3], flops),
                     "memory_GB": (dims[:3], mem)},
                    coords={"scaling": modes, "workers": P, "n_features": Ds, "sustained_fraction": fr,
                            "bandwidth_GBps": bws})
    _attrs(ds["compute_s"], "s", "one node's iteration: its FLOPs at the node's sustained rate")
    _attrs(ds["comm_s"], "s", "broadcast + reduce of the D x k weights (collectives over one torus link per node)")
    _attrs(ds["iteration_s"], "s", "time per iteration (compute + communication, not overlapped)")
    _attrs(ds["comm_share"], "1", "communication share of the time per iteration")
    _attrs(ds["efficiency"], "1", f"parallel efficiency against {P[0]} nodes: T(P0) P0 / (P T(P)) strong, "
           "T(P0) / T(P) weak")
    _attrs(ds["speedup"], "1", f"strong-scaling speed-up T({P[0]}) / T(P) (NaN for weak scaling)")
    _attrs(ds["examples_per_worker"], "1", "examples held by one node")
    _attrs(ds["flops_per_worker"], "FLOP", "floating-point operations of one node's iteration (features recomputed)")
    _attrs(ds["memory_GB"], "GB", f"one node's working set (a Blue Gene/Q node has {BGQ['memory_GB']:g} GB)")
    ds["scaling"].attrs["long_name"] = "strong (fixed total examples) or weak (fixed examples per node)"
    _attrs(ds["workers"], "1", "Blue Gene/Q nodes (one MPI process per node)")
    _attrs(ds["n_features"], "1", "random Fourier features D")
    _attrs(ds["sustained_fraction"], "1", f"the node's sustained share of its {peak:g} GFLOP/s peak")
    _attrs(ds["bandwidth_GBps"], "GB/s", "torus bandwidth per node and direction")
    ds.attrs.update(provenance({"workers": P, "strong_examples": strong, "weak_examples": weak, "input_dim": d,
                                "classes": k, "n_features": Ds, "blocks": J, "sustained_fractions": fr,
                                "peak_gflops": peak, "link_GBps": link, "latency_s": lat, "bandwidths_GBps": bws,
                                "headline_features": D0, "headline_fraction": f0}))
    return ds


# ---------------------------------------------------------------------------------------------
# paper vs ours


def kernel_error_slope(ds) -> np.ndarray:
    """Log-log slope of the kernel error against D, per sigma and feature draw."""
    x = np.log(ds["n_features"].values.astype(float))
    y = np.log(ds["kernel_error"].transpose("sigma", "feature_seed", "n_features").values)
    xc = x - x.mean()
    return ((y - y.mean(axis=-1, keepdims=True)) @ xc) / (xc @ xc)


def compare(folder) -> list[comparison.Record]:
    """Records from the saved accuracy, ADMM and scaling datasets."""
    folder = Path(folder)
    acc = tsio.read_dataset(folder / "accuracy.nc")
    sc = tsio.read_dataset(folder / "scaling.nc")
    p = json.loads(acc.attrs["parameters"])
    size = (f"generated problem: {p['n_train']} training / {p['n_test']} test examples, {p['dim']} inputs, "
            f"{p['classes']} classes of {p['clusters_per_class']} Gaussian clusters each, lambda {p['lam']:g}")
    # The D^-1/2 rate of the kernel error and ADMM's convergence to the direct solve are textbook facts and
    # self-checks (tests/test_study_big_model_scheduling.py), not the paper's claims: no records.
    records = []
    a = acc["test_accuracy"].median("feature_seed")
    first, last = a.isel(n_features=0), a.isel(n_features=-1)
    closed = ((last - first) / (acc["exact_test_accuracy"] - first)).values
    records.append(comparison.directional(
        STUDY, "share of the accuracy gap to exact kernel ridge closed from the fewest to the most features", "1",
        paper_direction=1, paper_setting=PAPER_SETTING + ": accuracy grows with the number of random features "
        "towards the exact kernel's", our_value=float(np.median(closed)), neutral=0.0,
        our_setting=f"{size}; D {int(acc['n_features'][0])} -> {int(acc['n_features'][-1])}, direct ridge solves",
        free_parameter="kernel width sigma", sweep=closed, note="a generated problem, not MNIST or TIMIT; " + READ))
    q = json.loads(sc.attrs["parameters"])
    D0, f0, bw = q["headline_features"], q["headline_fraction"], q["link_GBps"]
    P0, Pn = min(q["workers"]), max(q["workers"])
    head = {"n_features": D0, "sustained_fraction": f0, "bandwidth_GBps": bw}
    ours = (f"{q['input_dim']} inputs, {q['classes']} classes, D = {D0} random features in {q['blocks']} blocks "
            f"(features recomputed every iteration, libSkylark's default); compute: one node's FLOPs at {f0:.0%} of "
            f"a Blue Gene/Q node's {q['peak_gflops']:g} GFLOP/s; communication: broadcast + reduce over one 5D-torus "
            f"link ({bw:g} GB/s a direction, {q['latency_s'] * 1e6:g} us a step); {P0} -> {Pn} nodes")
    swept = (f"D in {q['n_features']}, sustained share of peak in {q['sustained_fractions']}, link GB/s in "
             f"{q['bandwidths_GBps']}")
    strong = sc["speedup"].sel(scaling="strong", workers=Pn)
    s_eff = float(sc["efficiency"].sel(scaling="strong", workers=Pn, **head))
    share = float(sc["comm_share"].sel(scaling="strong", workers=Pn, **head))
    mem = float(sc["memory_GB"].sel(scaling="strong", workers=P0, n_features=D0))
    records.append(comparison.directional(
        STUDY, f"strong-scaling speed-up of the time per iteration from {P0} to {Pn} Blue Gene/Q nodes (ideal "
        f"{Pn / P0:g})", "1", paper_direction=1,
        paper_setting=PAPER_SETTING + ": speed-up and parallel efficiency with nodes (strong scaling)",
        our_value=float(strong.sel(**head)), neutral=1.0,
        our_setting=f"the paper's problem size, MNIST-8M: {q['strong_examples']:,} examples split over the nodes; "
                    + ours, free_parameter=swept, sweep=strong.values.ravel(),
        note=(f"parallel efficiency {s_eff:.2f}, communication share {share:.2g} at {Pn} nodes; a node's working set "
              f"at {P0} nodes {mem:.1f} GB (of {BGQ['memory_GB']:g}); " + READ)))
    weak = sc["efficiency"].sel(scaling="weak", workers=Pn)
    records.append(comparison.directional(
        STUDY, f"weak-scaling efficiency from {P0} to {Pn} Blue Gene/Q nodes (above one half: the method scales)",
        "1", paper_direction=1, paper_setting=PAPER_SETTING + ": scaling experiments (direction: the method "
        "scales as nodes and data grow together)", our_value=float(weak.sel(**head)), neutral=0.5,
        our_setting=f"{q['weak_examples']:,} MNIST-8M-sized examples per node; " + ours, free_parameter=swept,
        sweep=weak.values.ravel(), note="the one-half threshold is ours; " + READ))
    return records


# ---------------------------------------------------------------------------------------------- figures

def draw_accuracy(folder):
    """Left: test accuracy of ridge regression on D random features (median and range over the feature draws)
    per kernel width, against exact kernel ridge (dashed) and linear ridge (dotted). Right: the relative kernel
    approximation error ||ZZ^T - K||_F / ||K||_F against D, with the Monte Carlo D^-1/2 rate."""
    import matplotlib.pyplot as plt

    acc = tsio.read_dataset(Path(folder) / "accuracy.nc")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for s, sigma in enumerate(acc["sigma"].values):
        a = acc["test_accuracy"].sel(sigma=sigma)
        med = a.median("feature_seed")
        axes[0].errorbar(acc["n_features"], med, yerr=[med - a.min("feature_seed"), a.max("feature_seed") - med],
                         marker="o", capsize=2, color=f"C{s}", label=f"random features, sigma {sigma:g}")
        axes[0].axhline(float(acc["exact_test_accuracy"].sel(sigma=sigma)), color=f"C{s}", ls="--", lw=1)
        axes[1].loglog(acc["n_features"], acc["kernel_error"].sel(sigma=sigma).median("feature_seed"), "o-",
                       color=f"C{s}", label=f"sigma {sigma:g}")
    axes[0].axhline(float(acc["linear_test_accuracy"]), color="0.4", ls=":", lw=1, label="linear ridge (no kernel)")
    axes[0].plot([], [], "k--", lw=1, label="exact kernel ridge")
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("random features D")
    axes[0].set_ylabel("test accuracy")
    axes[0].legend(fontsize=7)
    d = acc["n_features"].values.astype(float)
    ref = float(acc["kernel_error"].isel(n_features=0).median()) * (d / d[0]) ** -0.5
    axes[1].loglog(d, ref, "k:", lw=1, label="D^-1/2")
    axes[1].set_xlabel("random features D")
    axes[1].set_ylabel("||ZZ^T - K||_F / ||K||_F")
    axes[1].legend(fontsize=7)
    return fig


def draw_admm(folder):
    """The distance of block-splitting ADMM's consensus weights to the direct ridge solution per iteration, for
    each number of workers and feature blocks."""
    import matplotlib.pyplot as plt

    admm = tsio.read_dataset(Path(folder) / "admm.nc")
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for p in admm["workers"].values:
        for j in admm["blocks"].values:
            ax.semilogy(admm["iteration"], admm["distance"].sel(workers=p, blocks=j),
                        label=f"{p} worker(s), {j} block(s)")
    ax.set_xlabel("ADMM iteration")
    ax.set_ylabel("||W - W_direct|| / ||W_direct||")
    ax.legend(fontsize=8)
    return fig


def draw_scaling(folder):
    """Time per iteration, communication share and parallel efficiency against Blue Gene/Q nodes at MNIST-8M
    size, strong (solid) and weak (dashed) scaling, per sustained share of peak, at the headline number of
    features over one torus link."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    sc = tsio.read_dataset(Path(folder) / "scaling.nc")
    setting = json.loads(sc.attrs["parameters"])
    p = sc["workers"].values
    head = dict(n_features=int(setting["headline_features"]), bandwidth_GBps=float(setting["link_GBps"]))
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for f, frac in enumerate(sc["sustained_fraction"].values):
        for mode, ls in (("strong", "-"), ("weak", "--")):
            sel = sc.sel(scaling=mode, sustained_fraction=frac, **head)
            axes[0].loglog(p, sel["iteration_s"], ls, marker="o", color=f"C{f}", label=f"{mode}, {frac:.0%} of peak")
            axes[1].semilogx(p, sel["comm_share"], ls, marker="o", color=f"C{f}", label=f"{mode}, {frac:.0%} of peak")
            axes[2].semilogx(p, sel["efficiency"], ls, marker="o", color=f"C{f}", label=f"{mode}, {frac:.0%} of peak")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("Blue Gene/Q nodes")
    axes[0].set_ylabel("time per iteration (s)")
    axes[1].set_ylabel("communication share")
    axes[2].set_ylabel(f"parallel efficiency (against {p[0]} nodes)")
    # near-ideal: the axis spans the data only, its ticks in percent with two decimals so that a loss of 0.1%
    # reads as such (a 0..1 axis would leave the data a flat line at its top)
    axes[2].yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{100 * v:.2f}%"))
    axes[1].set_yscale("log")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=4, fontsize=7)  # all panels
    fig.suptitle(f"MNIST-8M, D = {head['n_features']}, one torus link ({head['bandwidth_GBps']:g} GB/s)", fontsize=9)
    return fig


#: the figures drawn from the saved datasets alone (file name -> function of the output folder)
FIGURES = {"accuracy.png": draw_accuracy, "admm.png": draw_admm, "scaling.png": draw_scaling}
