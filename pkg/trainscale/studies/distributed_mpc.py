"""distributed-mpc: distributed and localized MPC by ADMM, serial vs naive parallel vs locality-aware parallel
(Amo Alonso & Tseng, "Effective GPU Parallelization of Distributed and Localized Model Predictive Control",
arXiv 2103.14990; code github camoalon/DLMPC-GPU).

The paper's plant (a chain of two-state subsystems, its code's scenario) and ADMM (rho 10, tolerances 1e-4 / 1e-3,
horizon 5, locality d) run in :mod:`trainscale.workloads.mpc` (its Numba kernels, three schedules): a
closed loop from a seeded initial state (every schedule, identical iterates), and the wall time of ADMM iterations
for every schedule, chain size ``n`` and locality ``d`` on the Numba threads available. The paper runs on a GPU
(up to 50x over its CPU code, the locality-aware kernels about 2x over the naive ones); ours is the project's
2-core CPU: the speed-ups are measured, in a different setting, and stored with the thread count.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numba
import numpy as np
import xarray as xr

from ..common import comparison
from ..common import figurecheck
from ..common import io as tsio
from ..workloads import mpc as M
from ..common.checks import check_float, check_int
from ..common.io import provenance
from ..model.specs import SpecError

__all__ = ["PAPER", "OUTPUTS", "MEASURED", "RESOURCES", "PAPER_NUMBERS", "compare", "closed_loop_study", "runtime_study",
           "speedups", "FIGURES"]

PAPER = ("Amo Alonso & Tseng, Effective GPU Parallelization of Distributed and Localized Model Predictive Control "
         "(arXiv 2103.14990, 2021)")
OUTPUTS = ("runtime.nc", "closed_loop.nc", "runtime.png", "closed_loop.png", "work_per_subsystem.png")
#: wall-clock timings of the machine that ran the study (they differ from run to run; see the registry)
MEASURED = ("runtime.nc", "runtime.png", "work_per_subsystem.png")
RESOURCES = {"mem_mb": 2000, "runtime_quick_min": 3, "runtime_full_min": 10}
STUDY = "distributed-mpc"
HARDWARE = "the project's 2-core CPU (Numba threads), not the paper's GPU"

# the comparison targets (the paper's abstract): never used in a computation
PAPER_NUMBERS = {"gpu_over_cpu": 50.0, "locality_over_naive": 2.0, "work_per_subsystem_ratio": 1.0}


def _ints(name, values, lo, hi, min_items=1) -> list[int]:
    if (isinstance(values, str) or not isinstance(values, Sequence) or len(values) < min_items
            or len(set(values)) != len(values)):
        raise SpecError(name, values, f"expected a list of at least {min_items} distinct integers in [{lo}, {hi}]")
    return sorted(check_int(name, v, lo, hi) for v in values)


def _admm(rho, eps_p, eps_d, max_iter) -> dict:
    return {"rho": check_float("rho", rho, 0.0, 1e8, open_min=True),
            "eps_p": check_float("eps_p", eps_p, 0.0, 1.0, open_min=True),
            "eps_d": check_float("eps_d", eps_d, 0.0, 1.0, open_min=True),
            "max_iter": check_int("max_iter", max_iter, 1, 10**6)}


def closed_loop_study(n_subsystems: int = 32, localities: Sequence[int] = (2, 3, 4), steps: int = 10, seed: int = 0,
                      x0_scale: float = 2.0, horizon: int = 5, rho: float = 10.0, eps_p: float = 1e-4,
                      eps_d: float = 1e-3, max_iter: int = 10000) -> xr.Dataset:
    """The receding-horizon loop of a chain of ``n_subsystems`` from a seeded state uniform in
    ``[-x0_scale, x0_scale]``, for every locality, with the locality-aware schedule; the serial and naive
    schedules are run too and their largest difference from it stored (identical iterates give 0)."""
    n = check_int("closed_loop_subsystems", n_subsystems, 2, 10**5)
    ds_ = _ints("localities", localities, 2, 64)
    steps = check_int("steps", steps, 1, 1000)
    scale = check_float("x0_scale", x0_scale, 0.0, M.PAPER_PLANT["x_max"])
    admm = _admm(rho, eps_p, eps_d, max_iter)
    x0 = M.initial_state(n, check_int("seed", seed, 0, 2**31), scale)
    out = {k: [] for k in ("x", "u", "iterations", "variant_difference", "active")}
    for d in ds_:
        problem = M.build_problem(n, d, horizon, admm["rho"])
        runs = {v: M.closed_loop(problem, x0, steps, v, admm["eps_p"], admm["eps_d"], admm["max_iter"])
                for v in M.VARIANTS}
        ref = runs["local"]
        out["x"].append(ref["x"])
        out["u"].append(ref["u"])
        out["iterations"].append(ref["iterations"].astype(float))
        out["variant_difference"].append(max(float(np.abs(runs[v]["y"] - ref["y"]).max()) for v in M.VARIANTS))
        states = ref["y"][:, problem.nx: problem.nx * horizon]
        out["active"].append(float((np.abs(states) >= problem.x_max * (1 - 1e-9)).sum()))
    return _closed_loop_dataset(out, ds_, n, steps, x0, {"n_subsystems": n, "localities": ds_, "steps": steps,
                                                         "seed": seed, "x0_scale": scale, "horizon": horizon, **admm})


def _closed_loop_dataset(out, localities, n, steps, x0, params) -> xr.Dataset:
    nx = M.STATES * n
    ds = xr.Dataset(
        {"x": (("locality_d", "time_step", "state"), np.array(out["x"]),
               {"units": "1", "long_name": "closed-loop state (positions and velocities of the chain)"}),
         "u": (("locality_d", "step", "state"), np.array(out["u"]),
               {"units": "1", "long_name": "applied input u_0 of each MPC step"}),
         "iterations": (("locality_d", "step"), np.array(out["iterations"]),
                        {"units": "1", "long_name": "ADMM iterations of each MPC step (warm-started)"}),
         "variant_difference": (("locality_d",), np.array(out["variant_difference"]),
                                {"units": "1", "long_name": "largest difference of the serial and naive schedules' "
                                                            "predicted trajectories from the locality-aware one"}),
         "active_constraints": (("locality_d",), np.array(out["active"]),
                                {"units": "1", "long_name": "predicted states at their bound, over all steps"})},
        coords={"locality_d": np.asarray(localities), "time_step": np.arange(steps + 1), "step": np.arange(steps),
                "state": np.arange(nx)})
    ds["locality_d"].attrs.update({"units": "1", "long_name": "locality d (responses within S^(d-1))"})
    ds["time_step"].attrs.update({"units": "1", "long_name": "time step of the plant (dt = 0.1 s)"})
    ds["step"].attrs.update({"units": "1", "long_name": "MPC step"})
    ds["state"].attrs.update({"units": "1", "long_name": "state index (2 i: position, 2 i + 1: velocity of i)"})
    ds.attrs.update(provenance({**params, "x_max": M.PAPER_PLANT["x_max"], "u_max": M.PAPER_PLANT["u_max"]},
                               seed=params["seed"]))
    return ds


def _iterations_for(problem: M.Problem, flop_budget: float) -> int:
    total = float(M.flops_per_iteration(problem).sum())
    return int(np.clip(np.ceil(flop_budget / total), 3, 2000))


def runtime_study(n_subsystems: Sequence[int] = (16, 64, 256, 1024, 4096), localities: Sequence[int] = (2, 3, 4),
                  flop_budget: float = 2e8, repeats: int = 9, seed: int = 0, x0_scale: float = 2.0,
                  horizon: int = 5, rho: float = 10.0) -> xr.Dataset:
    """Wall time of one ADMM iteration (a fixed number of iterations, about ``flop_budget`` floating-point
    operations, from a cold start with the stopping test run but never met) for the serial schedule and for the
    naive and locality-aware ones on 1..``NUMBA_NUM_THREADS`` threads, for every chain size and locality:
    ``repeats`` timings of each, interleaved (repetition r of every schedule before repetition r + 1 of any), all
    stored, with their medians as the headline timings; all schedules' iterates are checked equal. Timings are
    machine-dependent: the thread count and CPU count are stored with them."""
    ns = _ints("n_subsystems", n_subsystems, 2, 10**5, min_items=2)  # compare: largest over smallest
    ds_ = _ints("localities", localities, 2, 64)
    budget = check_float("flop_budget", flop_budget, 1e3, 1e12)
    repeats = check_int("repeats", repeats, 1, 100)
    scale = check_float("x0_scale", x0_scale, 0.0, M.PAPER_PLANT["x_max"])
    threads = list(range(1, numba.config.NUMBA_NUM_THREADS + 1))
    shape = (len(ds_), len(ns))
    serial = np.full(shape + (repeats,), np.nan)
    parallel = np.full(shape + (2, len(threads), repeats), np.nan)
    timed = np.zeros(shape, dtype=np.int64)
    flops = np.full(shape, np.nan)
    for a, d in enumerate(ds_):
        for j, n in enumerate(ns):
            problem = M.build_problem(n, d, horizon, rho)
            x0 = M.initial_state(n, check_int("seed", seed, 0, 2**31), scale)
            k = _iterations_for(problem, budget)
            timed[a, j] = k
            flops[a, j] = float(M.flops_per_iteration(problem).mean())
            serial[a, j], parallel[a, j] = _time_cell(problem, x0, k, threads, repeats, f"n={n}, d={d}")
    return _runtime_dataset(serial, parallel, timed, flops, ds_, ns, threads,
                            {"n_subsystems": ns, "localities": ds_, "flop_budget": budget, "repeats": repeats,
                             "seed": seed, "x0_scale": scale, "horizon": horizon, "rho": rho,
                             "numba_threads": numba.config.NUMBA_NUM_THREADS, "cpu_count": os.cpu_count(),
                             "threading_layer": _threading_layer(), "hardware": HARDWARE})


def _time_cell(problem, x0, k, threads, repeats, where) -> tuple[np.ndarray, np.ndarray]:
    """Seconds per iteration of ``k`` iterations: serial (repeats,) and parallel (2, threads, repeats), the
    schedules interleaved within each repetition; raises if a schedule's iterates differ from serial's."""
    serial = np.empty(repeats)
    parallel = np.empty((2, len(threads), repeats))
    for r in range(repeats):
        s, _, ref = M.time_once(problem, x0, "serial", 1, 1e-300, 1e-300, k)
        serial[r] = s / k
        for v, variant in enumerate(("naive", "local")):
            for t, th in enumerate(threads):
                s, _, y = M.time_once(problem, x0, variant, th, 1e-300, 1e-300, k)
                if not np.array_equal(y, ref):
                    raise RuntimeError(f"{variant} on {th} threads differs from serial ({where})")
                parallel[v, t, r] = s / k
    return serial, parallel


def _threading_layer() -> str:
    try:
        return str(numba.threading_layer())
    except ValueError:
        return "not initialised"


def _runtime_dataset(serial, parallel, timed, flops, localities, ns, threads, params) -> xr.Dataset:
    dims = ("locality_d", "n_subsystems")
    pdims = dims + ("schedule", "threads")
    ds = xr.Dataset(
        {"serial_s_per_iter_samples": (dims + ("repeat",), serial, {
            "units": "s", "long_name": "serial schedule: wall time per ADMM iteration, each repetition"}),
         "parallel_s_per_iter_samples": (pdims + ("repeat",), parallel, {
             "units": "s", "long_name": "parallel schedules: wall time per ADMM iteration, each repetition"}),
         "serial_s_per_iter": (dims, np.median(serial, axis=-1), {
             "units": "s", "long_name": "serial schedule: wall time per ADMM iteration (median of the repetitions)"}),
         "parallel_s_per_iter": (pdims, np.median(parallel, axis=-1), {
             "units": "s", "long_name": "parallel schedules: wall time per ADMM iteration (median of the repetitions)"}),
         "iterations_timed": (dims, timed.astype(np.int64), {"units": "1", "long_name": "ADMM iterations per timing"}),
         "flops_per_subsystem": (dims, flops, {"units": "flop", "long_name": "floating-point operations per "
                                                                           "subsystem per ADMM iteration (mean)"})},
        coords={"locality_d": np.asarray(localities), "n_subsystems": np.asarray(ns),
                "schedule": ["naive", "local"], "threads": np.asarray(threads), "repeat": np.arange(serial.shape[-1])})
    ds["locality_d"].attrs.update({"units": "1", "long_name": "locality d (responses within S^(d-1))"})
    ds["n_subsystems"].attrs.update({"units": "1", "long_name": "subsystems in the chain (2 states each)"})
    ds["schedule"].attrs.update({"long_name": "parallel schedule (naive: prange over global rows/columns; "
                                              "local: prange over subsystems, fused)"})
    ds["threads"].attrs.update({"units": "1", "long_name": "Numba threads"})
    ds["repeat"].attrs.update({"units": "1", "long_name": "repetition (every schedule timed once in each, in turn)"})
    ds.attrs.update(provenance(params, seed=params["seed"]))
    return ds


# ---------------------------------------------------------------------------------------------
# paper vs ours

def _setting(rt: xr.Dataset) -> tuple[str, dict]:
    p = json.loads(rt.attrs["parameters"])
    th = int(rt["threads"].max())
    ours = (f"chain of {min(p['n_subsystems'])}-{max(p['n_subsystems'])} subsystems, d {min(p['localities'])}-"
            f"{max(p['localities'])}, horizon {p['horizon']}, rho {p['rho']:g}; wall time per ADMM iteration on "
            f"{th} Numba thread(s) of a {p['cpu_count']}-CPU machine ({HARDWARE})")
    return ours, p


def speedups(rt: xr.Dataset) -> dict[str, np.ndarray]:
    """Speed-ups of the locality-aware schedule on the most threads, per repetition (each repetition's timings were
    taken in turn, so their ratio cancels a slower stretch of a shared machine): over serial and over naive,
    each (locality_d, n_subsystems, repeat)."""
    top = rt.sel(threads=rt["threads"].max())
    local = top["parallel_s_per_iter_samples"].sel(schedule="local")
    return {"over_serial": (rt["serial_s_per_iter_samples"] / local).values,
            "over_naive": (top["parallel_s_per_iter_samples"].sel(schedule="naive") / local).values}


def _spread(ratios: np.ndarray) -> tuple[float, float, float]:
    """Median and interquartile range over every cell and repetition."""
    q25, q50, q75 = np.nanpercentile(ratios, [25, 50, 75])
    return float(q50), float(q25), float(q75)


def compare(folder) -> list[comparison.Record]:
    """Speed-ups of the parallel schedules from the saved timings: the median over every chain size, locality and
    repetition (a ratio per repetition), with the interquartile range as our low and high; the largest cell
    median (the paper's 'up to') in the note. And the work per subsystem against chain size."""
    folder = Path(folder)
    rt = tsio.read_dataset(folder / "runtime.nc")
    ours, p = _setting(rt)
    ratios = speedups(rt)
    th, reps = int(rt["threads"].max()), rt.sizes["repeat"]
    serial_mid, serial_lo, serial_hi = _spread(ratios["over_serial"])
    naive_mid, naive_lo, naive_hi = _spread(ratios["over_naive"])
    cell_naive = np.nanmedian(ratios["over_naive"], axis=-1)
    free = f"chain size n, locality d and repetition ({reps} each): the interquartile range"
    paper_gpu = "GPU (OpenCL) vs the same DLMPC on CPU, the paper's chains and localities ('up to 50x')"
    records = [
        comparison.not_tested(
            STUDY, "speed-up, GPU over CPU", "x", paper_value=PAPER_NUMBERS["gpu_over_cpu"], paper_setting=paper_gpu,
            needs="a GPU: this study runs the schedules on CPU threads (Numba prange)",
            our_value=serial_mid,
            our_setting=f"{ours}; locality-aware parallel over serial on the CPU, median over n, d and repetitions",
            note=(f"the nearest quantity we compute, not judged: median {serial_mid:.2f}x (interquartile "
                  f"{serial_lo:.2f}-{serial_hi:.2f}x, largest cell median "
                  f"{np.nanmax(np.nanmedian(ratios['over_serial'], axis=-1)):.2f}x) on {th} CPU thread(s)")),
        comparison.numeric(
            STUDY, "speed-up, locality-aware over naive parallel (median)", "x",
            paper_value=PAPER_NUMBERS["locality_over_naive"],
            paper_setting="fused locality-aware GPU kernels vs one kernel per ADMM step ('could halve the runtime')",
            our_value=naive_mid, our_setting=f"{ours}; median of {reps} interleaved repetitions per cell",
            same_setting=False, neutral=1.0, free_parameter=free, sweep=[naive_lo, naive_hi],
            note=(f"interquartile {naive_lo:.2f}-{naive_hi:.2f}x; cell medians {np.nanmin(cell_naive):.2f}-"
                  f"{np.nanmax(cell_naive):.2f}x, naive faster in {int((cell_naive < 1).sum())} of {cell_naive.size} "
                  "cells; on a CPU the naive schedule pays fork-joins and scattered column reads, not host-device "
                  "copies")),
        _work_record(rt, ours),
    ]
    return records


def serial_time_per_subsystem(rt: xr.Dataset) -> xr.DataArray:
    """Serial wall time per subsystem per ADMM iteration (s), each cell's fastest repetition: the other process on a
    shared machine only adds time, so the minimum is the run it disturbed least (Python's ``timeit`` documentation
    says the same of its repeats). A cell's median moved the work record's ratio from 1.24 to 1.54 and back to 1.14
    between regenerations of the same code, with the workflow running two studies on two cores."""
    return rt["serial_s_per_iter_samples"].min("repeat") / rt["n_subsystems"]


def _work_record(rt: xr.Dataset, ours: str) -> comparison.Record:
    """Serial wall time per subsystem per iteration (:func:`serial_time_per_subsystem`) at the largest chain over
    the same at each smaller one."""
    per = serial_time_per_subsystem(rt)
    largest = per.isel(n_subsystems=-1)
    ratios = (largest / per.isel(n_subsystems=slice(None, -1))).values.ravel()
    d0 = int(rt["locality_d"].values[0])
    at_d0 = float((largest / per.isel(n_subsystems=0)).sel(locality_d=d0))
    ns = rt["n_subsystems"].values
    return comparison.numeric(
        STUDY, "serial time per subsystem, largest chain over smallest", "1",
        paper_value=PAPER_NUMBERS["work_per_subsystem_ratio"],
        paper_setting="DLMPC: each subsystem's subproblem depends on d only, so work per subsystem is flat in N",
        our_value=at_d0, our_setting=f"{ours}; n {ns[-1]} over n {ns[0]} at d {d0}", same_setting=False,
        free_parameter="smaller chain size and locality d", sweep=ratios,
        note=f"measured wall time (cache effects included), each cell's fastest of {rt.sizes['repeat']} repetitions, "
             "not an operation count; the operation count per subsystem is stored as flops_per_subsystem")


# ---------------------------------------------------------------------------------------------- figures

def draw_closed_loop(folder):
    """The closed loop (``closed_loop.nc``): every state of the chain over time at the first locality (grey: beyond
    the state bound), and the ADMM iterations of each MPC step for every locality."""
    import matplotlib.pyplot as plt

    cl = tsio.read_dataset(Path(folder) / "closed_loop.nc")
    params = json.loads(cl.attrs["parameters"])
    x_max = float(params["x_max"])
    d0 = int(cl["locality_d"].values[0])
    c = cl.sel(locality_d=d0)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    t = c["time_step"].values * 0.1
    states = axes[0].plot(t, c["x"].values, lw=0.7, color="C0", alpha=0.6)
    beyond = [axes[0].axhspan(x_max, 1.2 * x_max, color="0.85"), axes[0].axhspan(-1.2 * x_max, -x_max, color="0.85")]
    for line in states:
        line.set_label("a state (position or velocity)")
    for band in beyond:
        band.set_label(f"beyond the bound |x| = {x_max:g}")
    # above the panel: inside, the light band's key would sit on the band itself
    axes[0].legend(handles=[states[0], beyond[0]], loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=2, fontsize=7)
    axes[0].set_ylim(-1.2 * x_max, 1.2 * x_max)
    axes[0].set_xlabel("time (s)")
    axes[0].set_ylabel(f"states (d = {d0}, {int(params['n_subsystems'])} subsystems)")
    for i, d in enumerate(cl["locality_d"].values):
        axes[1].plot(cl["step"].values, cl["iterations"].sel(locality_d=d).values, marker="o", label=f"d = {int(d)}")
    axes[1].set_yscale("log")
    axes[1].set_xlabel("MPC step")
    axes[1].set_ylabel("ADMM iterations")
    axes[1].legend()
    return fig


def draw_runtime(folder):
    """Runtime per MPC step against the number of subsystems for every schedule (solid: most threads, dotted: one
    thread), one panel per locality, at the closed loop's mean ADMM iterations per step (``runtime.nc`` times per
    iteration, ``closed_loop.nc`` iterations); and the locality-aware schedule's speed-ups at the most threads.
    The timings are wall-clock, as saved."""
    import matplotlib.pyplot as plt

    folder = Path(folder)
    rt = tsio.read_dataset(folder / "runtime.nc")
    cl = tsio.read_dataset(folder / "closed_loop.nc")
    ns = rt["n_subsystems"].values
    top = int(rt["threads"].max())
    fig, axes = plt.subplots(1, rt.sizes["locality_d"] + 1, figsize=(3.4 * (rt.sizes["locality_d"] + 1), 3.5))
    for ax, d in zip(axes, rt["locality_d"].values):
        k = float(cl["iterations"].sel(locality_d=d).mean()) if d in cl["locality_d"].values else np.nan
        ax.plot(ns, rt["serial_s_per_iter"].sel(locality_d=d) * k, marker="o", color="0.2", label="serial")
        for j, sched in enumerate(("naive", "local")):
            for th, ls in ((top, "-"), (1, ":")):
                if th == 1 and top == 1 and ls == ":":
                    continue
                y = rt["parallel_s_per_iter"].sel(locality_d=d, schedule=sched, threads=th) * k
                ax.plot(ns, y, ls=ls, marker="o" if ls == "-" else None, color=f"C{j}",
                        label=f"{sched}, {th} thread{'s' if th > 1 else ''}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("subsystems")
        ax.set_title(f"d = {int(d)} ({k:.0f} iterations/step)", fontsize=9)
    axes[0].set_ylabel("runtime per MPC step (s)")
    # one key for the runtime panels (each draws every schedule)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=5, fontsize=7)
    sel = rt.sel(threads=top)
    for a, d in enumerate(rt["locality_d"].values):
        s = sel.sel(locality_d=d)
        local = s["parallel_s_per_iter"].sel(schedule="local")
        axes[-1].plot(ns, s["serial_s_per_iter"] / local, marker="o", color=f"C{a}",
                      label=f"local / serial, d={int(d)}")
        axes[-1].plot(ns, s["parallel_s_per_iter"].sel(schedule="naive") / local, ls="--", marker="s", color=f"C{a}",
                      label=f"local / naive, d={int(d)}")
    figurecheck.guide(axes[-1].axhline(1.0, color="0.5", lw=0.8))  # no speed-up: the axis label's 1
    axes[-1].set_xscale("log")
    axes[-1].set_xlabel("subsystems")
    axes[-1].set_ylabel(f"speed-up ({top} thread{'s' if top > 1 else ''})")
    axes[-1].legend(fontsize=6)
    return fig


def draw_work_per_subsystem(folder):
    """Operations per subsystem per ADMM iteration (the kernels' count) and the serial wall time per subsystem
    per iteration (:func:`serial_time_per_subsystem`, from ``runtime.nc``) against the chain size, per locality."""
    import matplotlib.pyplot as plt

    rt = tsio.read_dataset(Path(folder) / "runtime.nc")
    ns = rt["n_subsystems"].values
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    per = serial_time_per_subsystem(rt)
    for a, d in enumerate(rt["locality_d"].values):
        axes[0].plot(ns, rt["flops_per_subsystem"].sel(locality_d=d), marker="o", color=f"C{a}", label=f"d = {int(d)}")
        axes[1].plot(ns, per.sel(locality_d=d) * 1e6, marker="o", color=f"C{a}", label=f"d = {int(d)}")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("subsystems")
        ax.set_ylim(bottom=0)
    axes[0].set_ylabel("operations per subsystem per iteration")
    axes[1].set_ylabel("serial time per subsystem per iteration (us),\nfastest repetition")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside right upper")  # one key for both panels
    return fig


#: the figures drawn from the saved datasets alone (file name -> function of the output folder)
FIGURES = {"closed_loop.png": draw_closed_loop, "runtime.png": draw_runtime,
           "work_per_subsystem.png": draw_work_per_subsystem}
