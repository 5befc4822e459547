"""What the curtailment study takes from its paper (Wiesner et al., arXiv 2602.22760) and re-runs: the numbers it
reports (:data:`PAPER_NUMBERS`, comparison targets only), its policy (:data:`PAPER_POLICY`), its run log
(:data:`PAPER_RUN_LOG`) and measured step time (:data:`PAPER_STEP_S`), and the re-run of that policy on a window
of a saved trace (:func:`paper_policy_run`). Shared by :mod:`.curtailment` (the averaging study and the records)
and :mod:`._curtailment_figures` (the timeline), so that the figures need not import the study module; a private
module (``_``), not a study of its own.
"""

from __future__ import annotations

import xarray as xr

from ..workloads import curtailment as C

# the comparison targets (the paper's abstract and results): never used in a computation
PAPER_NUMBERS = {"multi_emissions_kg": 1.38, "single_emissions_kg": {"CA": 11.41, "TX": 14.55, "SA": 12.33, "DE": 27.07},
                 "multi_wall_h": 14.6, "single_wall_h": 17.8, "multi_energy_kWh": 37.7, "single_energy_kWh": 36.0,
                 "multi_perplexity": 14.64, "single_perplexity": 14.73}
PAPER_POLICY = {"threshold": 100.0, "sites": 3, "round_s": 600.0}
#: Read from the paper's run log (exalsius/curtail-llm at 017258ff2d0f, evaluation/results/exp1): the median
#: two-site round (events.csv, AGGREGATION to AGGREGATION, 35 rounds) and its training part (client_2.csv, the
#: median segment of steps without a gap over 60 s); inputs of a swept case, never comparison targets.
PAPER_RUN_LOG = {"round_s": 648.2, "round_training_s": 513.0, "round_overhead_s": 135.2}
#: The paper's measured step time: its single-site run, 17.8 h for 23,400 iterations (the controller check only).
PAPER_STEP_S = 17.8 * 3600 / 23400


def trace_window(trace: xr.Dataset, hour: int, days: int) -> xr.Dataset:
    """``days`` of ``trace`` from UTC ``hour`` of its first day (the sweep's start hours)."""
    first = hour * C.SLOTS_PER_DAY // 24
    return trace.isel(time=slice(first, first + days * C.SLOTS_PER_DAY))


def paper_policy(p: dict) -> "C.Policy":
    """The paper's policy (:data:`PAPER_POLICY`: threshold, all sites, round length) with the controller's
    timings of a run's parameters ``p`` (``runs.nc``'s ``parameters``): the one policy both the loss study
    and the timeline figure re-run."""
    return C.Policy(PAPER_POLICY["threshold"], p["poll_s"], p["provision_s"], p["hysteresis_s"],
                    PAPER_POLICY["round_s"])


def paper_policy_run(traces: xr.Dataset, p: dict, seed: int, hour: int) -> tuple[xr.Dataset, dict]:
    """(trace window, :func:`trainscale.workloads.curtailment.run_policy` result) of the paper's policy on every site
    of ``p`` for trace ``seed`` from UTC ``hour``, over the run's ``days`` (the controller is
    deterministic, so this is the run the sweep saved)."""
    window = trace_window(traces.sel(seed=seed), hour, int(p["days"]))
    window = xr.Dataset({"intensity": window["intensity"].sel(site=p["sites"])})
    n = len(p["sites"])
    r = C.run_policy(window, paper_policy(p), [p["step_s"]] * n, [p["train_kW"] * 1e3] * n,
                     [p["idle_kW"] * 1e3] * n, p["iterations"], p["sync_s"][: n + 1])
    return window, r
