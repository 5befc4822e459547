"""Benchmarks of the performance model; prints lines ``BENCH <name> <value> <unit>``.

Run as ``.venv/bin/python benchmarks/run.py``. Exits non-zero if the jitted grid kernel and the
plain-Python reference (``NUMBA_DISABLE_JIT=1``) disagree on the sampled plans.

* grid throughput: gpt3-175b on dgx-a100-80gb, 4096 GPUs, global batch 1536, over the dense grid's
  benchmark space (:func:`dense_space`: ``perfmodel.default_space`` with power-of-two micro-batches up to 16
  and interleave 1-8, >= 5 million plans); compiled once, then best of 3, for the Numba
  kernel alone (``grid_plans_per_s``) and for ``perfmodel.evaluate_grid``, which also builds the
  xarray Dataset (``grid_dataset_plans_per_s``).
* search pricing: ``searchspace.price_space`` (the search's sparse kernel: only structurally valid layouts)
  over the same space (``search_same_space_s``, beside the dense kernel's time) and over the whole
  ``perfmodel.default_space`` (every micro-batch dividing a local batch, every interleave depth dividing the
  layers): plans in the space, plans priced, and priced plans per second (best of 3).
* plain-Python reference: ~2000 random plans of the same space, evaluated one at a time by the
  same kernels with JIT disabled, in a subprocess.
* search: ``planner.search`` for the same case in a fresh process with an empty Numba cache, so
  the time includes interpreter start, imports and JIT compilation (``search_gpt3_4096_s``), then in another
  fresh process with the cache the first one filled (``search_gpt3_4096_warm_cache_s``: a new shell after
  ``make setup``).
* lean search (issue 38 item 5): :func:`search_lean_section` (warm in the process, the whole command warm and from
  an empty cache, peak memory at 11.3 million plans, plans per second, and the one pass against the brute force).
* validation: MAPE and worst error on the published runs.
* pipeline: 2,000 random non-uniform pipelines (p=8, m=64) each for 1F1B and interleaved (v=2)
  through ``pipeline.simulate_many``, in simulated F/B/W operations per second; a sample of 20 of
  them through the pure-Python ``pipeline.simulate_reference``, which must agree exactly.
* curtailment: the controller of ``curtailment.run_policy`` (four sites, the paper's policy) over the
  whole of a seeded 28-day trace, in simulated site-hours per second, next to the same code as plain
  Python (``NUMBA_DISABLE_JIT=1``, 2 days), which must agree: site states exactly, totals to 1e-12.
* swarm: 20,000 placements of a 20-server volunteer swarm serving BLOOM-176B, each given its least-latency
  chain (the swarm search's inner loop) and priced (``kernels.swarm.evaluate_many``), in chains per second,
  next to ``swarm.reference_evaluate`` (plain Python, 400 of them), which must agree to 1e-12.
* mpc: the DLMPC ADMM of ``trainscale.workloads.mpc`` (256-subsystem chain, locality 2, 200 iterations), serial and
  locality-aware parallel Numba kernels in iterations per second, next to the same update in vectorised NumPy
  (``mpc.admm_numpy``); the final variables must agree to 1e-9.
* optimizer: synchronous data-parallel SGD (``kernels.optim.run_sync``, compressor ``none``) on a
  least-squares problem with 10,000 parameters, 8 workers, per-worker batch 16, the batches of
  ``convergence.run_batches``, for >= 1,000 steps (doubled until the kernel runs >= 0.5 s),
  workers one after another (no ``prange``: it was no faster, kernels/optim.py); in worker-steps x parameters per second
  (``optimizer_param_updates_per_s``), next to the same update in vectorised NumPy (gather each
  worker's rows, ``g_k = X_k^T (X_k w - y_k) / B + lam w``, mean in worker order, ``w -= lr g``;
  ``optimizer_numpy_param_updates_per_s``). Compiled once, then best of 3 each. The kernel's time
  includes its two full-dataset evaluations (``eval_every = steps``: steps 0 and ``steps``, ~25 ms
  each, a few % of it on 2 cores); NumPy does none. The final parameters must agree to 1e-9 (max
  abs difference over max abs value). The problem is built as
  ``make_problem("least_squares", kappa=1, heterogeneity=0)`` would (isotropic Gaussian features,
  unit-norm teacher, label noise 0.1) but without its d x d rotation and closed-form optimum,
  which are O(d^3) and would take minutes at d = 10,000.
* kernel machines: block-splitting ADMM (``kernelmachines.admm_solve``, random Fourier features, 4096 examples
  over 4 workers, 512 features in 4 blocks, 20 iterations) in example-feature updates per second, next to the
  same iterations in NumPy (``kernelmachines.admm_numpy``); the weights must agree to 1e-12.
* recsys meta-learning: first-order MAML outer steps of a DLRM-style model (``metarec.dp_step``: 8 tables of 2,000
  rows, dim 16, hidden 64, 64 tasks of 32 support + 32 query examples, 2 inner steps) in examples processed
  (forward + backward) per second, next to the same step in NumPy (``metarec.outer_step_numpy``) and G-Meta's
  hybrid schedule on 4 workers (``metarec.hybrid_step``); all three must agree to 1e-12.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from trainscale.model import grid, perfmodel, pipeline, validation

from trainscale.model import planner
from trainscale.kernels import layout as K
from trainscale.kernels.grid import evaluate_grid as grid_kernel
from trainscale.model.specs import resolve_model, resolve_system

MODEL, SYSTEM, GPUS, GLOBAL_BATCH = "gpt3-175b", "dgx-a100-80gb", 4096, 1536
SAMPLE = 2000
MIN_PLANS = 5_000_000


def bench(name: str, value: float, unit: str) -> None:
    print(f"BENCH {name} {value:.6g} {unit}", flush=True)


def agreement(name: str, worst: float, failures: list, what: str, tol: float = 1e-12) -> None:
    """``BENCH <name>_max_rel_diff``; a failure (``make bench`` exits non-zero) when ``worst`` exceeds ``tol``."""
    bench(f"{name}_max_rel_diff", worst, "1")
    if not worst <= tol:
        print(f"{what} disagree: max rel diff {worst:.3g} > {tol:g}", file=sys.stderr)
        failures.append(f"{name} reference mismatch")


REFERENCE = r"""
import json, sys, time
import numpy as np
from trainscale.model import grid, perfmodel
from trainscale.kernels import layout as K
from trainscale.kernels.layer import layer_costs
from trainscale.kernels.grid import grid_plan_costs
from trainscale.model.specs import resolve_model, resolve_system

job = json.load(open(sys.argv[1]))
model, system = resolve_model(job["model"]), resolve_system(job["system"])
mvec, svec = perfmodel.model_vector(model), perfmodel.system_vector(system)
calib = perfmodel.calibration_vector(system.generation)
axes = [grid._axis(job["space"][n], n) for n in grid.GRID_AXES]
gpus, gb = job["gpus"], job["global_batch"]
idx = np.load(sys.argv[2])
out = np.empty((idx.shape[0], K.O_SIZE))
lc = np.empty(K.L_SIZE)
start = time.perf_counter()
for row, ix in enumerate(idx):
    tp, pp, cp, v, mb, rc, sp, zero, shard, ovl, fl, pt, tpo = (a[i] for a, i in zip(axes, ix))
    layer_costs(mvec, svec, calib, tp, cp, mb, rc, sp != 0, fl != 0, lc, 1, tpo != 0)
    grid_plan_costs(mvec, svec, calib, lc, gpus, gb, tp, pp, cp, v, mb, rc, zero, shard, ovl != 0, pt != 0,
                    out[row])
elapsed = time.perf_counter() - start
np.save(sys.argv[3], out)
print(json.dumps({"seconds": elapsed}))
"""

SEARCH = r"""
import json, sys, time
start = time.perf_counter()
from trainscale.model import planner
grid, ranked = planner.search(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), top=5)
elapsed = time.perf_counter() - start
print(json.dumps({"seconds": elapsed, "plans": grid.attrs["space_size"], "best": ranked[0] if ranked else None}))
"""


# the search command with its space replaced (trainscale search takes only --fix / --search narrowings of the
# default space): the whole command, interpreter start to the printed table, as a user runs it
SEARCH_COMMAND = r"""
import contextlib, io, json, resource, sys
from trainscale.interface.cli import main, search as search_command
space = json.loads(sys.argv[1])
search_command.search_space = lambda *args, **kwargs: space  # the module whose cmd_search calls it
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(["search", "--model", sys.argv[2], "--system", sys.argv[3], "--gpus", sys.argv[4],
                 "--global-batch", sys.argv[5], "--top", "5"])
assert code == 0 and "rank" in out.getvalue(), out.getvalue()[-2000:]
# VmHWM: this process's own peak (its address space since exec); ru_maxrss would also count the parent's
# resident memory copied by the fork before the exec (GBs once the bench has priced the dense grid)
with open("/proc/self/status") as status:
    hwm = [line.split()[1] for line in status if line.startswith("VmHWM:")]
peak_kB = int(hwm[0]) if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"max_rss_MB": peak_kB / 1024}))
"""


def lean_space(model, system) -> dict:
    """The lean search's benchmark space (issue 38 item 5): :func:`dense_space` without TP communication overlap,
    5.6 million plans (1.6 million of them priced)."""
    return dict(dense_space(model, system), tp_comm_overlap=[0])


def search_lean_section(failures: list) -> None:
    """The search in one pass (issue 38 item 5; targets on 2 cores in brackets): ``planner.search`` over the
    5.6-million-plan :func:`lean_space` warm in the process (best of 3, <= 1.0 s) and as the whole ``trainscale
    search`` command in a fresh process with the Numba cache warm (best of 3, <= 1.8 s) and empty (a temporary
    cache, removed after; <= 10 s); the peak resident memory of the command over the 11.3-million-plan
    :func:`dense_space` (<= 300 MB); and ``search_topk_equals_bruteforce``: the one pass's counts and first
    5,000 candidates (its kept 2,048 and two refills) equal to pricing every plan and ranking them all
    (``searchspace.price_space``), else a failure."""
    from trainscale.model import searchspace

    model, system = resolve_model(MODEL), resolve_system(SYSTEM)
    space = lean_space(model, system)
    planner.search(model, system, GPUS, GLOBAL_BATCH, top=5, space=space)  # compile / load the cache
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        summary, _ = planner.search(model, system, GPUS, GLOBAL_BATCH, top=5, space=space)
        best = min(best, time.perf_counter() - t0)
    bench("search_plans", summary.attrs["space_size"], "plans")
    bench("search_warm_in_process_s", best, "s")
    bench("search_plans_per_s", summary.attrs["space_size"] / best, "plans/s")

    def command(search_space: dict, env: dict) -> tuple[float, dict]:
        args = [sys.executable, "-c", SEARCH_COMMAND, json.dumps(search_space), MODEL, SYSTEM, str(GPUS),
                str(GLOBAL_BATCH)]
        t0 = time.perf_counter()
        proc = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            failures.append("search command failed")
            return math.nan, {"max_rss_MB": math.nan}
        return seconds, json.loads(proc.stdout.strip().splitlines()[-1])

    command(space, dict(os.environ))  # fills the cache the warm runs load
    bench("search_command_warm_s", min(command(space, dict(os.environ))[0] for _ in range(3)), "s")
    with tempfile.TemporaryDirectory() as cache:
        bench("search_command_empty_cache_s", command(space, dict(os.environ, NUMBA_CACHE_DIR=cache))[0], "s")
    dense = dense_space(model, system)
    bench("search_peak_rss_plans", searchspace.space_size(dense), "plans")
    bench("search_peak_rss_MB", command(dense, dict(os.environ))[1]["max_rss_MB"], "MB")

    calib = perfmodel.calibration_vector(system.generation)
    kw = {"stack_rules": "megatron", "fixed": {"compiled": False}}
    scan = searchspace.scan_space(model, system, calib, GPUS, GLOBAL_BATCH, space, **kw)
    full = searchspace.price_space(model, system, calib, GPUS, GLOBAL_BATCH, space, **kw)
    flat = full.feasible
    brute = flat[np.lexsort((flat, full.step_s[flat]))][:5000]
    first = [entry for _, entry in zip(range(brute.size), scan.ranked())]
    equal = (np.array_equal(scan.plans_by_reason, full.plans_by_reason) and scan.plans_by_rule == full.plans_by_rule
             and scan.plans_feasible == flat.size and brute.size > 2 * searchspace.CANDIDATES
             and [e[0] for e in first] == brute.tolist() and [e[1] for e in first] == full.step_s[brute].tolist()
             and [e[2] for e in first] == full.mem_bytes[brute].tolist())
    bench("search_topk_equals_bruteforce", int(equal), "1")
    if not equal:
        print("the search's one pass and the brute-force rank of every plan disagree", file=sys.stderr)
        failures.append("search top-k differs from the brute force")


def dense_space(model, system) -> dict:
    """The dense grid's benchmark space: the default space with the power-of-two micro-batches (up to 16) and
    interleave depths (1-8) it had before it took every valid one (11.3 million plans, dense: 3.3 GB)."""
    space = perfmodel.default_space(model, system, GPUS, GLOBAL_BATCH)
    return dict(space, interleave=[1, 2, 3, 4, 6, 8],
                micro_batch=[b for b in (1, 2, 4, 8, 16) if b <= GLOBAL_BATCH])


def bench_sweep_spec() -> dict:
    """The grid benchmark's space (>= 5 million plans) as a chunked sweep."""
    model, system = resolve_model(MODEL), resolve_system(SYSTEM)
    space = dense_space(model, system)
    return {"model": MODEL, "systems": [SYSTEM], "gpus": [GPUS], "global_batch": GLOBAL_BATCH, "chunks": 4,
            "space": {k: list(v) for k, v in space.items()}}


def search_pricing_section(model, system, calib, dense, dense_kernel_s: float) -> None:
    """The search's sparse pricing over the dense benchmark space and over the whole default space."""
    from trainscale.model import searchspace

    for name, space in (("same_space", dense), ("default_space", perfmodel.default_space(model, system, GPUS,
                                                                                           GLOBAL_BATCH))):
        searchspace.price_space(model, system, calib, GPUS, GLOBAL_BATCH, space)  # compile / load the cache
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            prices = searchspace.price_space(model, system, calib, GPUS, GLOBAL_BATCH, space)
            times.append(time.perf_counter() - t0)
        bench(f"search_{name}_plans", prices.size, "plans")
        bench(f"search_{name}_priced_plans", prices.reason.size, "plans")
        bench(f"search_{name}_s", min(times), "s")
        bench(f"search_{name}_priced_plans_per_s", prices.reason.size / min(times), "plans/s")
    bench("search_same_space_dense_kernel_s", dense_kernel_s, "s")


def sweep_section(failures: list) -> None:
    """A chunked plan sweep through the workflow (snakemake, one process per chunk, Numba on one
    thread each), with 1 and then 2 jobs at a time: plans per second of wall time, start-up and
    gathering included. Everything it writes (~1 GB of chunks) is removed afterwards."""
    repo = Path(__file__).resolve().parents[1]
    try:
        _sweep_section(failures, repo)
    finally:
        remove_sweep_outputs(repo)


def remove_sweep_outputs(repo: Path) -> list[Path]:
    """The benchmark sweep's chunks, gathered dataset, logs and config (the only ``bench`` sweep)."""
    sweeps = repo / "results" / "quick" / "sweeps"
    found = [*sweeps.glob("bench*"), *(sweeps / "logs").glob("bench-*"), repo / "results" / "bench"]
    for path in found:
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    return found


def _sweep_section(failures: list, repo: Path) -> None:
    from trainscale.model import sweep

    config = repo / "results" / "bench" / "sweep-config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    import yaml

    spec = bench_sweep_spec()
    config.write_text(yaml.safe_dump({"numba_threads": 1, "sweeps": {"bench": {"quick": spec, "full": spec}}}))
    target = "results/quick/sweeps/bench.nc"
    plans = len(spec["systems"]) * len(spec["gpus"]) * int(np.prod([len(v) for v in spec["space"].values()]))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    for jobs in (1, 2):
        t0 = time.perf_counter()
        proc = subprocess.run([str(Path(sys.executable).parent / "snakemake"), target, "--snakefile",
                               "workflow/Snakefile", "--configfile", str(config), "--config", "mode=quick",
                               "--cores", str(jobs), "--forceall", "--quiet"], cwd=repo, env=env,
                              capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0:
            print(proc.stdout[-2000:] + proc.stderr[-2000:], file=sys.stderr)
            failures.append(f"chunked sweep with {jobs} jobs failed")
            return
        bench(f"sweep_chunked_plans_per_s_w{jobs}", plans / elapsed, "plans/s")
    bench("sweep_chunked_plans", plans, "plans")
    gathered = sweep.read(repo / target)
    reference = sweep.evaluate(spec)
    same = all(np.array_equal(gathered[n].values, reference[n].values, equal_nan=gathered[n].dtype.kind == "f")
               for n in sweep.SWEEP_VARS)
    bench("sweep_chunked_equals_unsplit", int(same), "bool")
    if not same:
        failures.append("chunked sweep differs from the unsplit evaluation")


def main() -> int:
    failures = []
    model, system = resolve_model(MODEL), resolve_system(SYSTEM)
    space = dense_space(model, system)
    full = {name: list(space.get(name, [0] if name in ("shard_group", "zero3_per_tensor", "tp_comm_overlap") else [1]))
            for name in perfmodel.GRID_AXES}
    n_plans = perfmodel.grid_size(full)
    if n_plans < MIN_PLANS:
        print(f"default_space has only {n_plans} plans (< {MIN_PLANS})", file=sys.stderr)
        failures.append("space too small")

    # --- grid throughput: the kernel alone, then the Dataset-building wrapper users call
    arrays = [grid._axis(full[name], name) for name in perfmodel.GRID_AXES]
    calib = perfmodel.calibration_vector(system.generation)
    kernel_args = (perfmodel.model_vector(model), perfmodel.system_vector(system), calib, GPUS, GLOBAL_BATCH,
                   *arrays)
    results, _ = grid_kernel(*kernel_args)  # compile / load the cache
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        results, _ = grid_kernel(*kernel_args)
        times.append(time.perf_counter() - t0)
    wrapper_times = []
    for _ in range(2):
        t0 = time.perf_counter()
        perfmodel.evaluate_grid(model, system, GPUS, GLOBAL_BATCH, **space)
        wrapper_times.append(time.perf_counter() - t0)
    bench("grid_plans", n_plans, "plans")
    bench("grid_plans_per_s", n_plans / min(times), "plans/s")
    bench("grid_valid_plans_per_s", np.isfinite(results[:, K.O_STEP]).sum() / min(times), "plans/s")
    bench("grid_dataset_plans_per_s", n_plans / min(wrapper_times), "plans/s")

    search_pricing_section(model, system, calib, space, min(times))

    # --- plain-Python reference on a random sample, compared with the jitted kernel's rows
    shape = tuple(len(a) for a in arrays)
    rng = np.random.default_rng(20240601)
    flat = rng.choice(n_plans, size=min(SAMPLE, n_plans), replace=False)
    # a random sample of this space is mostly invalid plans: add valid ones so both kinds are compared
    valid = np.flatnonzero(np.isfinite(results[:, K.O_STEP]))
    flat = np.unique(np.concatenate([flat, rng.choice(valid, size=min(SAMPLE // 2, valid.size), replace=False)]))
    idx = np.stack(np.unravel_index(flat, shape), axis=1).astype(np.int64)
    with tempfile.TemporaryDirectory() as tmp:
        job, plans, out = Path(tmp, "job.json"), Path(tmp, "plans.npy"), Path(tmp, "out.npy")
        job.write_text(json.dumps({"model": MODEL, "system": SYSTEM, "gpus": GPUS, "global_batch": GLOBAL_BATCH,
                                   "space": full}))
        np.save(plans, idx)
        env = dict(os.environ, NUMBA_DISABLE_JIT="1")
        proc = subprocess.run([sys.executable, "-c", REFERENCE, str(job), str(plans), str(out)], env=env,
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 2
        seconds = json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]
        ref = np.load(out)
    jit = results[flat]
    python_rate = len(flat) / seconds
    bench("grid_python_plans_per_s", python_rate, "plans/s")
    bench("grid_vs_python_ratio", (n_plans / min(times)) / python_rate, "x")
    nan_ok = np.array_equal(np.isnan(ref), np.isnan(jit))
    both = np.isfinite(ref) & np.isfinite(jit)
    denom = np.where(np.abs(ref[both]) > 0, np.abs(ref[both]), 1.0)
    worst = float(np.max(np.abs(jit[both] - ref[both]) / denom)) if both.any() else 0.0
    bench("grid_reference_plans", len(flat), "plans")
    bench("grid_reference_valid_plans", int(np.isfinite(jit[:, K.O_STEP]).sum()), "plans")
    bench("grid_reference_max_rel_diff", worst, "1")
    if not nan_ok or worst > 1e-9:
        print(f"kernel and reference disagree: NaN pattern equal {nan_ok}, worst rel diff {worst:.3g}",
              file=sys.stderr)
        failures.append("reference mismatch")

    # --- search from a fresh process with an empty Numba cache (JIT compilation included), then again from a
    # fresh process with the cache that run filled (what a new shell gets after `make setup`)
    with tempfile.TemporaryDirectory() as cache:
        runs = [subprocess.run([sys.executable, "-c", SEARCH, MODEL, SYSTEM, str(GPUS), str(GLOBAL_BATCH)],
                               env=dict(os.environ, NUMBA_CACHE_DIR=cache), capture_output=True, text=True,
                               check=False) for _ in ("empty", "warm")]
    for proc in runs:
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 2
    found, warm = (json.loads(proc.stdout.strip().splitlines()[-1]) for proc in runs)
    bench("search_gpt3_4096_s", found["seconds"], "s")
    bench("search_gpt3_4096_warm_cache_s", warm["seconds"], "s")
    bench("search_gpt3_4096_plans", found["plans"], "plans")
    if found["best"] is None:
        failures.append("search found no feasible plan")
    search_lean_section(failures)

    # --- accuracy on the published runs
    ds = validation.validation_dataset()
    bench("validate_published_mape", 100 * ds.attrs["mape_published"], "%")
    bench("validate_published_worst", 100 * ds.attrs["max_abs_error_published"], "%")

    pipeline_section(failures)
    optimizer_section(failures)
    curtailment_section(failures)
    swarm_section(failures)
    kernelmachines_section(failures)
    recsys_section(failures)
    mpc_section(failures)
    gear_section(failures)
    sweep_section(failures)

    if failures:
        print("FAILED: " + "; ".join(failures), file=sys.stderr)
        return 1
    return 0


PIPE_BATCH, PIPE_P, PIPE_M, PIPE_SAMPLE = 2000, 8, 64, 10  # PIPE_SAMPLE per schedule


def pipeline_section(failures: list) -> None:
    """Throughput of the pipeline-schedule simulator, and agreement with the Python reference."""
    rng = np.random.default_rng(20240602)
    cases = [("1f1b", 1), ("interleaved", 2)]
    batches = []
    for schedule, v in cases:
        S = PIPE_P * v
        args = {"fwd": rng.uniform(0.5, 1.5, (PIPE_BATCH, S)) / v, "bwd": rng.uniform(1.0, 3.0, (PIPE_BATCH, S)) / v,
                    "wgrad": rng.uniform(0.0, 1.0, (PIPE_BATCH, S)) / v, "send": rng.uniform(0.0, 0.1, (PIPE_BATCH, S - 1)),
                    "act_bytes": rng.uniform(1e8, 1e9, (PIPE_BATCH, S))}
        pipeline.simulate_many(schedule, **{k: a[:2] for k, a in args.items()}, micro_batches=PIPE_M,
                               interleave=v)  # compile / load the cache
        batches.append((schedule, v, args))
    best = {False: math.inf, True: math.inf}  # without / with the full timeline written out
    runs = {}
    for with_timeline in (False, True):
        for _ in range(3):
            t0 = time.perf_counter()
            runs[with_timeline] = [pipeline.simulate_many(schedule, **args, micro_batches=PIPE_M, interleave=v,
                                                          timeline=with_timeline) for schedule, v, args in batches]
            best[with_timeline] = min(best[with_timeline], time.perf_counter() - t0)
    results = runs[True]
    ops = sum(r.ops * PIPE_BATCH for r in results)
    rate = ops / best[False]
    bench("pipeline_pipelines", len(batches) * PIPE_BATCH, "pipelines")
    bench("pipeline_ops", ops, "ops")
    bench("pipeline_ops_per_s", rate, "ops/s")
    bench("pipeline_timeline_ops_per_s", ops / best[True], "ops/s")
    if not all(np.array_equal(a.makespan_s, b.makespan_s) for a, b in zip(runs[False], runs[True])):
        failures.append("pipeline makespans depend on timeline output")

    ref_ops, ref_seconds, worst, mismatched = 0, 0.0, 0.0, 0
    for (schedule, v, args), res in zip(batches, results):
        for row in range(PIPE_SAMPLE):
            one = {k: a[row].tolist() for k, a in args.items()}
            t0 = time.perf_counter()
            ref = pipeline.simulate_reference(schedule, **one, micro_batches=PIPE_M, interleave=v)
            ref_seconds += time.perf_counter() - t0
            ref_ops += res.ops
            starts = np.array([x[4] for x in ref["timeline"]])
            ends = np.array([x[5] for x in ref["timeline"]])
            same = (ref["makespan_s"] == res.makespan_s[row] and np.array_equal(starts, res.start_s[row])
                    and np.array_equal(ends, res.end_s[row])
                    and np.array_equal([x[1] for x in ref["timeline"]], res.op_stage)
                    and np.array_equal([x[2] for x in ref["timeline"]], res.op_micro_batch))
            mismatched += not same
            worst = max(worst, abs(ref["makespan_s"] - res.makespan_s[row]) / ref["makespan_s"])
    python_rate = ref_ops / ref_seconds
    bench("pipeline_python_ops_per_s", python_rate, "ops/s")
    bench("pipeline_vs_python_ratio", rate / python_rate, "x")
    bench("pipeline_reference_pipelines", len(batches) * PIPE_SAMPLE, "pipelines")
    bench("pipeline_reference_max_rel_diff", worst, "1")
    if mismatched:
        print(f"pipeline kernel and reference disagree on {mismatched} pipelines (worst makespan rel diff "
              f"{worst:.3g})", file=sys.stderr)
        failures.append("pipeline reference mismatch")


OPT_DIM, OPT_SAMPLES, OPT_WORKERS, OPT_BATCH = 10_000, 1024, 8, 16
OPT_STEPS, OPT_MIN_SECONDS, OPT_LR, OPT_LAM, OPT_SIGMA = 1000, 0.5, 1e-3, 1e-3, 0.1


def optimizer_problem():
    """A least-squares ``convergence.Problem`` distributed as ``make_problem("least_squares",
    OPT_SAMPLES, OPT_DIM, OPT_WORKERS, kappa=1, heterogeneity=0, sigma=OPT_SIGMA, lam=OPT_LAM)``:
    with ``kappa = 1`` its features ``N(0, I) Q^T`` are ``N(0, I)`` for any rotation ``Q``, so the
    O(d^3) rotation and closed-form optimum (minutes at d = 10,000) are skipped; ``optimum`` is None."""
    from trainscale.training import convergence

    n, d, W = OPT_SAMPLES, OPT_DIM, OPT_WORKERS
    rng = np.random.default_rng(20240603)
    X = rng.normal(size=(n, d))
    teacher = rng.normal(size=d)
    teacher /= np.linalg.norm(teacher)
    y = X @ teacher + OPT_SIGMA * rng.normal(size=n)
    params = {"kind": "least_squares", "n_samples": n, "dim": d, "workers": W, "heterogeneity": 0.0, "kappa": 1.0,
              "sigma": OPT_SIGMA, "lam": OPT_LAM, "hidden": 1, "seed": 20240603}
    return convergence.Problem(kind="least_squares", X=X, y=y,
                               shard_offsets=np.linspace(0, n, W + 1).round().astype(np.int64), dim=d, hidden=1,
                               lam=OPT_LAM, sigma=OPT_SIGMA, kappa=1.0, heterogeneity=0.0, teacher=teacher,
                               worker_teachers=np.tile(teacher, (W, 1)), eigenvalues=np.ones(d), optimum=None,
                               optimum_loss=math.nan, parameters=params)


def sgd_numpy(X, y, lam, x0, batches, lr):
    """Synchronous SGD in vectorised NumPy: per step, every worker's batch gradient by BLAS on its
    gathered rows, the mean over workers summed in worker order, then ``w -= lr g``."""
    W, B = batches.shape[1], batches.shape[2]
    w = x0.copy()
    for idx in batches:
        Xb = X[idx]  # (W, B, d)
        r = np.matmul(Xb, w) - y[idx]  # (W, B) residuals
        G = np.matmul(r[:, None, :], Xb)[:, 0, :] / B + lam * w  # (W, d): g_k = X_k^T r_k / B + lam w
        g = G[0].copy()
        for k in range(1, W):
            g += G[k]
        w -= lr * (g / W)
    return w


def optimizer_section(failures: list) -> None:
    """Throughput of synchronous data-parallel SGD (``kernels.optim.run_sync``) next to NumPy."""
    from trainscale.training import convergence
    from trainscale.training.compression import resolve_compressor
    from trainscale.kernels import optim as KO

    problem = optimizer_problem()
    p, W = problem.n_params, problem.workers
    spec = resolve_compressor("none")
    comp_params, comp_seed = spec.params(p), convergence.compressor_seed(0)
    x0 = problem.initial_params(0)

    def kernel(batches):
        steps = batches.shape[0]
        comp_state = np.zeros((W, spec.state_size(p)))
        x_out, loss, gnorm, bits = np.empty(p), np.empty(2), np.empty(2), np.empty((2, W))
        t0 = time.perf_counter()
        KO.run_sync(problem.code, problem.hidden, problem.lam, problem.X, problem.y, x0, batches, KO.SGD, OPT_LR,
                    0.9, 0.999, 1e-8, steps, spec.code, comp_params, comp_seed, comp_state, x_out, loss, gnorm,
                    bits)
        return time.perf_counter() - t0, x_out, loss

    warm = convergence.run_batches(problem, 2, OPT_BATCH, 0)
    kernel(warm)  # compile / load the cache
    sgd_numpy(problem.X, problem.y, problem.lam, x0, warm, OPT_LR)
    steps = OPT_STEPS
    while True:
        batches = convergence.run_batches(problem, steps, OPT_BATCH, 0)
        seconds, x_kernel, loss = kernel(batches)
        if seconds >= OPT_MIN_SECONDS:
            break
        steps *= 2
    for _ in range(2):  # best of 3, the run above included
        seconds = min(seconds, kernel(batches)[0])
    numpy_seconds = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        x_numpy = sgd_numpy(problem.X, problem.y, problem.lam, x0, batches, OPT_LR)
        numpy_seconds = min(numpy_seconds, time.perf_counter() - t0)
    updates = steps * W * p
    rate, numpy_rate = updates / seconds, updates / numpy_seconds
    scale = float(np.max(np.abs(x_numpy)))
    worst = float(np.max(np.abs(x_kernel - x_numpy))) / (scale if scale > 0 else 1.0)
    bench("optimizer_params", p, "params")
    bench("optimizer_steps", steps, "steps")
    bench("optimizer_param_updates_per_s", rate, "1/s")
    bench("optimizer_numpy_param_updates_per_s", numpy_rate, "1/s")
    bench("optimizer_vs_numpy_ratio", rate / numpy_rate, "x")
    bench("optimizer_max_rel_diff", worst, "1")
    if not (worst <= 1e-9 and np.all(np.isfinite(loss)) and loss[1] < loss[0]):
        print(f"optimizer kernel and NumPy disagree: max rel diff {worst:.3g}, loss {loss[0]:.6g} -> {loss[1]:.6g}",
              file=sys.stderr)
        failures.append("optimizer reference mismatch")


CURTAIL_DAYS, CURTAIL_REF_DAYS = 28, 2  # simulated trace lengths: jitted, and plain-Python reference

CURTAIL_JOB = r"""
import json, sys, time
import numpy as np
from trainscale.workloads import curtailment as C
job = json.loads(sys.argv[1])
trace = C.generate_traces(days=job["days"], seed=job["seed"])
t0 = time.perf_counter()
out = C.run_policy(trace, C.PAPER_POLICY, job["step_s"], job["train_W"], job["idle_W"], 1e12, job["sync_s"])
elapsed = time.perf_counter() - t0
np.savez(sys.argv[2], **{k: np.asarray(v) for k, v in out.items()})
print(json.dumps({"seconds": elapsed}))
"""


def curtailment_section(failures: list) -> None:
    """The curtailment controller (``curtailment.run_policy``: four sites, the paper's policy, 10 s polls)
    over seeded traces, with a target no run reaches so the whole trace is simulated: simulated
    site-hours per second for the Numba kernel (compiled once, best of 3, 28 days) and, in a subprocess
    with ``NUMBA_DISABLE_JIT=1``, for the same code as plain Python (2 days). On the 2-day trace both must
    agree exactly (every per-site total and every site state at every poll)."""
    from trainscale.workloads import curtailment as C

    site = C.site_step()
    sites = 4
    job = {"seed": 7, "step_s": [site["step_s"]] * sites, "train_W": [site["power_W"]] * sites,
           "idle_W": [0.25 * site["power_W"]] * sites,
           "sync_s": [C.averaging_time_s(site["params"], max(n, 1), 1.25, 0.05) for n in range(sites + 1)]}

    def run(days):
        trace = C.generate_traces(days=days, seed=job["seed"])
        t0 = time.perf_counter()
        out = C.run_policy(trace, C.PAPER_POLICY, job["step_s"], job["train_W"], job["idle_W"], 1e12, job["sync_s"])
        return out, time.perf_counter() - t0

    run(1)  # compile / load the cache
    seconds = min(run(CURTAIL_DAYS)[1] for _ in range(3))
    jit_rate = sites * CURTAIL_DAYS * 24 / seconds
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "ref.npz")
        proc = subprocess.run([sys.executable, "-c", CURTAIL_JOB, json.dumps({**job, "days": CURTAIL_REF_DAYS}),
                               str(path)], env=dict(os.environ, NUMBA_DISABLE_JIT="1"), capture_output=True,
                              text=True, check=False)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            failures.append("curtailment reference failed")
            return
        ref_seconds = json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]
        ref = dict(np.load(path))
    jit, _ = run(CURTAIL_REF_DAYS)
    python_rate = sites * CURTAIL_REF_DAYS * 24 / ref_seconds
    bench("curtailment_site_hours_per_s", jit_rate, "site-h/s")
    bench("curtailment_python_site_hours_per_s", python_rate, "site-h/s")
    bench("curtailment_vs_python_ratio", jit_rate / python_rate, "x")
    def agree(k):  # the site states exactly; the float totals to 1e-12 (JIT and interpreter may round apart)
        a = np.asarray(jit[k])
        if k == "states":
            return np.array_equal(a, ref[k])
        return np.allclose(a, ref[k], rtol=1e-12, atol=0.0, equal_nan=True)

    bad = [k for k in ref if not agree(k)]
    bench("curtailment_reference_equal", float(not bad), "1")
    if bad:
        print(f"curtailment kernel and plain Python disagree on {bad}", file=sys.stderr)
        failures.append("curtailment reference mismatch")


KM_EXAMPLES, KM_FEATURES, KM_WORKERS, KM_BLOCKS, KM_ITERATIONS = 4096, 512, 4, 4, 20


def kernelmachines_section(failures: list) -> None:
    """Block-splitting ADMM (``kernelmachines.admm_solve``: random Fourier features of a generated problem,
    4096 examples over 4 workers, 512 features in 4 blocks, 3 classes, cached Cholesky block solves) for 20
    iterations, in example-feature updates per second (examples x features x iterations / s), next to the same
    iterations in NumPy (``kernelmachines.admm_numpy``, block solves by ``numpy.linalg.solve``, BLAS). Both
    include their one-time block set-up (Cholesky factors / Gram matrices). Compiled once, then best of 3 each; the weights must agree to 1e-12 (max abs difference over max abs value)."""
    from trainscale.workloads import kernelmachines as km

    p = km.make_problem(KM_EXAMPLES, 10, 10, 3, 8, 1.0, 1.5, seed=0)
    omega, phase = km.random_features(10, KM_FEATURES, 2.5, seed=0)
    Z, T = km.features(p["X_train"], omega, phase), p["T_train"]
    args = (Z, T, 0.5, KM_WORKERS, KM_BLOCKS)
    km.admm_solve(*args, 2)  # compile / load the cache

    def best(call):
        out, seconds = None, math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            out = call()
            seconds = min(seconds, time.perf_counter() - t0)
        return out, seconds

    no_ref = np.zeros((KM_FEATURES, T.shape[1]))  # skip the direct solve admm_solve would make for its distances
    W_kernel, seconds = best(lambda: km.admm_solve(*args, KM_ITERATIONS, W_ref=no_ref)["W"])
    W_numpy, numpy_seconds = best(lambda: km.admm_numpy(*args, KM_ITERATIONS))
    updates = KM_EXAMPLES * KM_FEATURES * KM_ITERATIONS
    worst = float(np.max(np.abs(W_kernel - W_numpy))) / max(float(np.max(np.abs(W_numpy))), 1e-300)
    bench("kernelmachines_updates_per_s", updates / seconds, "1/s")
    bench("kernelmachines_numpy_updates_per_s", updates / numpy_seconds, "1/s")
    bench("kernelmachines_vs_numpy_ratio", numpy_seconds / seconds, "x")
    agreement("kernelmachines", worst, failures, "kernel machines: Numba ADMM and NumPy")


SWARM_PLACEMENTS, SWARM_SAMPLE = 20000, 400


def swarm_section(failures: list) -> None:
    """The swarm search's inner loop: placements of a 20-server volunteer swarm serving BLOOM-176B, each routed
    to its least-latency chain (``swarm.pareto_search``'s default) and priced (``kernels.swarm.evaluate_many``),
    in chains per second (compiled once, best of 3), next to ``swarm.reference_evaluate`` (the same model in
    plain Python) on a sample, which must agree to 1e-12."""
    from trainscale.workloads import swarm as W
    from trainscale.kernels import swarm as KS
    from trainscale.studies import heterogeneous_swarm as H

    gpus, bw, rtt = H.mixed_swarm(20, 0.43, [100.0, 1000.0], 20.0)
    spec = W.SwarmSpec(W.make_swarm(gpus, bw, rtt).servers, int8_slowdown=2.0, int8_overhead_s=0.002)
    a = W.server_arrays(spec)
    rng = np.random.default_rng(11)
    pop = np.stack([W._random_tiling(rng, a["spans"], a["L"]) for _ in range(SWARM_PLACEMENTS)])
    out = np.empty((pop.shape[0], 3))
    weight, hop_s = W.route_costs(a, "optimal")
    args = (a["spans"], a["rtt_s"], a["dec_s"], a["bw_Bps"], hop_s, weight, a["tput"], a["L"], a["act_bytes"], out)
    KS.evaluate_many(pop[:10], *args[:-1], out[:10])  # compile / load the cache
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        KS.evaluate_many(pop, *args)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    ref = [W.reference_evaluate(row, a, "optimal") for row in pop[:SWARM_SAMPLE]]
    python_s = time.perf_counter() - t0
    rate, python_rate = pop.shape[0] / min(times), SWARM_SAMPLE / python_s
    bench("swarm_chains_per_s", rate, "chains/s")
    bench("swarm_python_chains_per_s", python_rate, "chains/s")
    bench("swarm_vs_python_ratio", rate / python_rate, "x")
    worst = max(max(abs(o[0] - r[0]) / r[0], abs(o[1] - r[1]) / max(r[1], 1e-300)) for o, r in zip(out, ref))
    agreement("swarm_reference", worst, failures, "swarm kernel and plain Python")


RS_FIELDS, RS_ROWS, RS_DIM, RS_HIDDEN, RS_TASKS, RS_SUPPORT, RS_QUERY, RS_INNER = 8, 2000, 16, 64, 64, 32, 32, 2


def recsys_section(failures: list) -> None:
    """First-order MAML outer steps of the recsys-meta-learning model (``metarec.dp_step``, one worker: the Numba
    task kernel over the tasks in ``prange``) in forward + backward examples per second (tasks x (support x
    (inner steps + 1) + query) / s; the support loss before adaptation counts as one pass), next to the same
    step in NumPy (``metarec.outer_step_numpy``, one task at a time, BLAS GEMMs) and the hybrid schedule on 4
    workers (``metarec.hybrid_step``: row shards, all-to-all lookups). Compiled once, then best of 3 each; the
    parameters after the step must agree to 1e-12 (max abs difference over max abs value)."""
    from trainscale.workloads import metarec as M

    prob = M.make_problem(RS_FIELDS, RS_ROWS, RS_DIM, 256, 50, 1.5, 3.0, seed=0)
    rng = np.random.default_rng(0)
    batch = M.sample_batch(prob, rng.integers(0, 256, RS_TASKS), RS_SUPPORT, RS_QUERY, rng)
    start = M.init_params(RS_FIELDS, RS_ROWS, RS_DIM, RS_HIDDEN, seed=0)
    step = (RS_HIDDEN, 0.5, RS_INNER, 1.0)

    def best(run):
        out, seconds = None, math.inf
        for _ in range(3):
            table, dense = start[0].copy(), start[1].copy()
            t0 = time.perf_counter()
            table = run(table, dense)
            seconds = min(seconds, time.perf_counter() - t0)
            out = np.concatenate([table.ravel(), dense])
        return out, seconds

    def dp(table, dense):
        M.dp_step(table, dense, batch, 1, *step)
        return table

    def hybrid(table, dense):
        shards = M.shard_table(table, 4)
        M.hybrid_step(shards, dense, batch, *step)
        return M.unshard(shards)

    def numpy(table, dense):
        M.outer_step_numpy(table, dense, batch, *step)
        return table

    dp(start[0].copy(), start[1].copy())  # compile / load the cache
    kernel, seconds = best(dp)
    hyb, hybrid_seconds = best(hybrid)
    ref, numpy_seconds = best(numpy)
    examples = RS_TASKS * (RS_SUPPORT * (RS_INNER + 1) + RS_QUERY)
    scale = max(float(np.max(np.abs(ref))), 1e-300)
    worst = max(float(np.max(np.abs(kernel - ref))), float(np.max(np.abs(hyb - ref)))) / scale
    bench("recsys_meta_examples_per_s", examples / seconds, "1/s")
    bench("recsys_meta_hybrid_examples_per_s", examples / hybrid_seconds, "1/s")
    bench("recsys_meta_numpy_examples_per_s", examples / numpy_seconds, "1/s")
    bench("recsys_meta_vs_numpy_ratio", numpy_seconds / seconds, "x")
    agreement("recsys_meta", worst, failures, "recsys meta-learning: kernel, hybrid and NumPy steps")



MPC_N, MPC_D, MPC_ITERATIONS = 256, 2, 200  # chain size, locality, ADMM iterations timed


def mpc_section(failures: list) -> None:
    """DLMPC ADMM (``trainscale.workloads.mpc``): the paper's chain of 256 subsystems at locality 2, 200 iterations from a
    cold start, in ADMM iterations per second for the serial kernel and the locality-aware parallel one
    (Numba threads as configured), next to the same update in vectorised NumPy (``mpc.admm_numpy``); compiled
    once, best of 3. The kernels' final variables must equal NumPy's to 1e-9 (relative to the largest entry)."""
    from trainscale.workloads import mpc

    problem = mpc.build_problem(MPC_N, MPC_D)
    x0 = mpc.initial_state(MPC_N, 0, 1.0)
    rates, states = {}, {}
    for variant in ("serial", "local"):
        mpc.solve_step(problem, x0, variant, eps_p=1e-300, eps_d=1e-300, max_iter=2)  # compile / load the cache
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            _, _, states[variant] = mpc.solve_step(problem, x0, variant, eps_p=1e-300, eps_d=1e-300,
                                                   max_iter=MPC_ITERATIONS)
            best = min(best, time.perf_counter() - t0)
        rates[variant] = MPC_ITERATIONS / best
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        ref = mpc.admm_numpy(problem, x0, MPC_ITERATIONS)
        best = min(best, time.perf_counter() - t0)
    mask = np.arange(problem.colrows.shape[1]) < problem.collen[:, None]
    worst = 0.0
    for name in ("phi", "psi", "lam"):
        a = getattr(ref, name)
        scale = max(float(np.max(np.abs(a))), 1e-300)
        worst = max(worst, float(np.max(np.abs(getattr(states["serial"], name) - a))) / scale)
        local = getattr(states["local"], name)[problem.colpos_csc[mask]]
        worst = max(worst, float(np.max(np.abs(local - a[problem.colpos_csr[mask]]))) / scale)
    bench("mpc_serial_iterations_per_s", rates["serial"], "1/s")
    bench("mpc_local_iterations_per_s", rates["local"], "1/s")
    bench("mpc_numpy_iterations_per_s", MPC_ITERATIONS / best, "1/s")
    bench("mpc_serial_vs_numpy_ratio", rates["serial"] * best / MPC_ITERATIONS, "x")
    bench("mpc_max_rel_diff", worst, "1")
    if not worst <= 1e-9:
        print(f"mpc kernels and NumPy disagree: max rel diff {worst:.3g}", file=sys.stderr)
        failures.append("mpc reference mismatch")

GEAR_DIMS, GEAR_STEPS, GEAR_BATCH = [16, 32, 32, 16, 1], 2000, 16  # the study's network, steps timed, batch


def gear_section(failures: list) -> None:
    """Gear training (``trainscale.workloads.gear``): the study's 4-part network (2,145 parameters) on its generated
    regression, 2,000 steps of gear training (periods 2-4-2-1) in the Numba kernel, in steps per second, next to
    the same update rule in NumPy (``gear.train_numpy``); compiled once, best of 3. The final parameters must
    agree to 1e-12 (max abs difference over max abs value)."""
    from trainscale.workloads import gear as G

    problem = G.make_problem(GEAR_DIMS, 4096, 512, 0.1, 0)
    theta0 = G.init_params(GEAR_DIMS, 1)
    batches = G.schedule(problem, GEAR_STEPS, GEAR_BATCH, 0)
    args = (problem, theta0, batches, 0.2, [2, 4, 2, 1], [0, 0, 0, 0])
    G.train(*args[:2], batches[:2], *args[3:], GEAR_STEPS)  # compile / load the cache
    best, numpy_best = math.inf, math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        theta = G.train(*args, GEAR_STEPS)["theta"]
        best = min(best, time.perf_counter() - t0)
    for _ in range(3):
        t0 = time.perf_counter()
        ref = G.train_numpy(*args)
        numpy_best = min(numpy_best, time.perf_counter() - t0)
    worst = float(np.max(np.abs(theta - ref))) / max(float(np.max(np.abs(ref))), 1e-300)
    bench("gear_steps_per_s", GEAR_STEPS / best, "1/s")
    bench("gear_numpy_steps_per_s", GEAR_STEPS / numpy_best, "1/s")
    bench("gear_vs_numpy_ratio", numpy_best / best, "x")
    agreement("gear", worst, failures, "gear training: Numba kernel and NumPy")


if __name__ == "__main__":
    sys.exit(main())
