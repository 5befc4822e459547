"""big-model-scheduling: kernel machines at scale by random features and block-splitting ADMM (Avron &
Sindhwani, "High-performance Kernel Machines with Implicit Distributed Optimization and Randomization",
arXiv 1409.0940; Technometrics 58(3), 2016; code: libSkylark ``ml/BlockADMM.hpp``).

The paper trains Gaussian-kernel models on millions of examples (MNIST, TIMIT) on two distributed-memory
clusters (BlueGene/Q scale): random Fourier features make the model linear in a large feature space, and
block-splitting ADMM spreads the examples over nodes and the feature blocks over threads, with a cached
``(Z_ij^T Z_ij + I)^-1`` per block and one broadcast and one reduce of the weights per iteration (rho = 1).

Here, scaled down to what 2 CPU cores run in seconds, on a generated classification problem of documented
size (:func:`trainscale.kernelmachines.make_problem`): (1) test accuracy against the number of random features,
approaching exact kernel ridge regression (solvable exactly at this size), and the kernel approximation error;
(2) the ADMM iterates converging to the direct ridge solve on the same features for several splits; (3) time
per iteration against the number of workers, strong and weak scaling: each worker's compute is its iteration's
FLOPs at a Blue Gene/Q node's sustained rate (deterministic, unlike a timing of this machine), the broadcast and
reduce are priced by the project's collectives on a catalog network. The paper's own figures (speed-ups, accuracies on MNIST and TIMIT) were not available to
this study: the records compare directions, and the Monte Carlo rate of the random features, and say so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xarray as xr

from .. import comparison
from .. import io as tsio
from .. import kernelmachines as km
from ..checks import check_float, check_floats, check_int
from ..io import provenance
from ..specs import SpecError, resolve_system
from ..wallclock import Link

__all__ = ["PAPER", "OUTPUTS", "RESOURCES", "PAPER_SETTING", "compare", "accuracy_study", "admm_study",
           "scaling_study", "kernel_error_slope", "MC_RATE"]

PAPER = ("Avron & Sindhwani, High-performance Kernel Machines with Implicit Distributed Optimization and "
         "Randomization (arXiv 1409.0940; Technometrics 2016)")
OUTPUTS = ("accuracy.nc", "admm.nc", "scaling.nc", "accuracy.png", "admm.png", "scaling.png")
RESOURCES = {"mem_mb": 2000, "runtime_quick_min": 2, "runtime_full_min": 5}
STUDY = "big-model-scheduling"
#: sustained GFLOP/s of one worker node: an IBM Blue Gene/Q node (the paper's larger cluster) peaks at 204.8
#: (16 cores x 8 double-precision FLOP per cycle at 1.6 GHz; IBM Blue Gene/Q architecture, IBM J. Res. Dev. 57,
#: 2013); the iteration is matrix-vector products and triangular solves, memory-bound on the node's 42.6 GB/s,
#: taken at 20% of peak (estimate)
NODE_GFLOPS = 41.0

PAPER_SETTING = ("Gaussian-kernel models by random Fourier features and block-splitting ADMM (rho = 1) on MNIST and "
                 "TIMIT (millions of examples) on two distributed-memory clusters (BlueGene/Q scale)")
NOT_READ = ("the paper's figures and tables were not available to this study, so no number of theirs is compared "
            "(none typed from memory)")
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
    """The generated problem's parameters, checked (see :func:`trainscale.kernelmachines.make_problem`)."""
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


def scaling_study(workers: Sequence[int] = (1, 4, 16), strong_examples: int = 4096, weak_examples: int = 512,
                  n_features: int = 512, classes: int = 3, blocks: int = 4, network_system: str = "dgx-v100",
                  bandwidths_GBps: Sequence[float] = (1.25,), node_gflops: float = NODE_GFLOPS) -> xr.Dataset:
    """Time per iteration against workers: compute = one worker's iteration FLOPs
    (:func:`trainscale.kernelmachines.iteration_flops`: its share of examples, all feature blocks) at
    ``node_gflops`` sustained GFLOP/s (default: a Blue Gene/Q node, see :data:`NODE_GFLOPS`), communication = broadcast +
    reduce of the ``D x k`` weights by the collectives on ``network_system``'s scale-out link (its latency,
    its bandwidth and each of ``bandwidths_GBps``). Strong scaling: ``strong_examples`` split over the
    workers; weak scaling: ``weak_examples`` per worker."""
    P = _ints("workers", workers, 1, 4096)
    strong = check_int("strong_examples", strong_examples, max(P), 10**6)
    weak = check_int("weak_examples", weak_examples, 1, 10**5)
    D = check_int("scaling_features", n_features, 1, 8192)
    k = check_int("classes", classes, 1, 100)
    J = check_int("scaling_blocks", blocks, 1, D)
    system = resolve_system(network_system)
    catalog_bw = float(system.scale_out_GBps_per_gpu)
    bws = sorted(set(check_floats("bandwidths_GBps", bandwidths_GBps, 0.0, 1e4, open_min=True)) | {catalog_bw})
    n_i = {"strong": [strong // p for p in P], "weak": [weak] * len(P)}
    rate = check_float("node_gflops", node_gflops, 0.0, 1e7, open_min=True) * 1e9
    modes = ["strong", "weak"]
    comm = np.array([[km.comm_time_s(D, k, p, Link(bw, system.scale_out_latency_s))["total_s"] for bw in bws]
                     for p in P])
    comm = np.broadcast_to(comm, (2, len(P), len(bws)))
    workers_col = np.array(P, dtype=float)[:, None]

    def timings(node_rate):
        compute = np.array([[km.iteration_flops(n, D, k, J) / node_rate for n in n_i[m]] for m in modes])
        it = compute[:, :, None] + comm
        return compute, it, np.stack([it[0, :1] / (workers_col * it[0]), it[1, :1] / it[1]])

    compute, it, eff = timings(rate)
    # the node rate is an estimate that decides the efficiencies: the same at 10% and 50% of a node's peak too
    rates = sorted({0.5 * NODE_GFLOPS, NODE_GFLOPS, 2.5 * NODE_GFLOPS, rate / 1e9})
    by_rate = np.stack([timings(r * 1e9)[2][:, -1, bws.index(catalog_bw)] for r in rates])
    dims = ("scaling", "workers", "bandwidth_GBps")
    ds = xr.Dataset({"compute_s": (dims[:2], compute), "comm_s": (dims, comm.copy()), "iteration_s": (dims, it),
                     "comm_share": (dims, comm / it), "efficiency": (dims, eff),
                     "examples_per_worker": (dims[:2], np.array([n_i[m] for m in modes], dtype=float)),
                     "flops_per_worker": (dims[:2], np.array([[km.iteration_flops(n, D, k, J) for n in n_i[m]]
                                                              for m in modes]))},
                    coords={"scaling": modes, "workers": P, "bandwidth_GBps": bws})
    ds["efficiency_by_node_rate"] = (("node_gflops", "scaling"), by_rate)
    ds = ds.assign_coords(node_gflops=("node_gflops", np.array(rates)))
    _attrs(ds["efficiency_by_node_rate"], "1", f"parallel efficiency at {max(P)} workers on the catalog link, "
           "by the node's sustained rate")
    _attrs(ds["node_gflops"], "GFLOP/s", "sustained rate of a worker node (Blue Gene/Q at 10-50% of its peak)")
    ds["speedup"] = (dims, np.where(np.array(modes)[:, None, None] == "strong", it[:, :1] / it, np.nan))
    _attrs(ds["compute_s"], "s", "one worker's iteration: its FLOPs at the node's sustained rate")
    _attrs(ds["comm_s"], "s", "broadcast + reduce of the weights (collectives on the catalog network)")
    _attrs(ds["iteration_s"], "s", "time per iteration (compute + communication, not overlapped)")
    _attrs(ds["comm_share"], "1", "communication share of the time per iteration")
    _attrs(ds["efficiency"], "1", "parallel efficiency: T(1) / (P T(P)) strong, T(1) / T(P) weak")
    _attrs(ds["speedup"], "1", "strong-scaling speed-up T(1) / T(P) (NaN for weak scaling)")
    _attrs(ds["examples_per_worker"], "1", "examples held by one worker")
    _attrs(ds["flops_per_worker"], "FLOP", "floating-point operations of one worker's iteration")
    ds["scaling"].attrs["long_name"] = "strong (fixed total examples) or weak (fixed examples per worker)"
    _attrs(ds["workers"], "1", "workers (one per node, plus the master)")
    _attrs(ds["bandwidth_GBps"], "GB/s", "scale-out bandwidth per node")
    ds.attrs.update(provenance({"workers": P, "strong_examples": strong, "weak_examples": weak, "n_features": D,
                                "classes": k, "blocks": J, "network_system": network_system,
                                "catalog_bandwidth_GBps": catalog_bw, "latency_s": system.scale_out_latency_s,
                                "node_gflops": rate / 1e9}))
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
        free_parameter="kernel width sigma", sweep=closed, note=NOT_READ))
    q = json.loads(sc.attrs["parameters"])
    bw = q["catalog_bandwidth_GBps"]
    ours = (f"{q['n_features']} features x {q['classes']} classes in {q['blocks']} blocks; compute: one worker's "
            f"FLOPs at {q['node_gflops']:g} GFLOP/s (a Blue Gene/Q node at 20% of peak); communication: {q['network_system']} scale-out "
            f"link ({bw:g} GB/s, {q['latency_s'] * 1e6:g} us), up to {max(q['workers'])} workers")
    strong = sc["speedup"].sel(scaling="strong").isel(workers=-1)
    records.append(comparison.directional(
        STUDY, f"strong-scaling speed-up of the time per iteration at {max(q['workers'])} workers", "1",
        paper_direction=1, paper_setting=PAPER_SETTING + ": speed-up with nodes (strong scaling)",
        our_value=float(strong.sel(bandwidth_GBps=bw)), neutral=1.0,
        our_setting=f"{q['strong_examples']} examples split over the workers; " + ours,
        free_parameter="bandwidth_GBps, node rate",
        sweep=np.concatenate([strong.values, sc["efficiency_by_node_rate"].sel(scaling="strong").values * max(q["workers"])]),
        note=f"parallel efficiency {float(sc['efficiency'].sel(scaling='strong', bandwidth_GBps=bw).isel(workers=-1)):.2f}; "
             + NOT_READ))
    weak = sc["efficiency"].sel(scaling="weak").isel(workers=-1)
    records.append(comparison.directional(
        STUDY, f"weak-scaling efficiency at {max(q['workers'])} workers (above one half: the method scales)", "1",
        paper_direction=1, paper_setting=PAPER_SETTING + ": scaling experiments (direction: the method "
        "scales as nodes and data grow together)", our_value=float(weak.sel(bandwidth_GBps=bw)), neutral=0.5,
        our_setting=f"{q['weak_examples']} examples per worker; " + ours, free_parameter="bandwidth_GBps, node rate",
        sweep=np.concatenate([weak.values, sc["efficiency_by_node_rate"].sel(scaling="weak").values]),
        note=("the one-half threshold is ours, and the faster node rates of the sweep fall below it (the node rate "
              "is an estimate: Blue Gene/Q at 10-50% of peak); " + NOT_READ)))
    return records
