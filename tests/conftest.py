"""Shared fixtures. `quick_workflow` runs the whole Snakemake workflow in quick mode, once."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# The test interpreter's bin dir (the project's .venv) first, so snakemake, papermill and the
# Jupyter kernel are the pinned ones.
BIN_DIR = Path(sys.executable).parent
# The tests' quick workflow: one Numba thread per notebook, so that Snakemake runs two notebooks side by side
# on a 2-core machine (every rule asks for numba_threads cores; at the config's 2 they ran one at a time and
# the quick workflow took 3:10 instead of 1:46 of make test's 6 minutes). Every test that runs or dry-runs the
# quick workflow passes the same config, so they agree on what is up to date.
QUICK_CONFIG = ("--config", "mode=quick", "numba_threads=1")


def grid_predictions(ds, model, system, global_batch: int, stack: str = "megatron"):
    """``(index, prediction)`` of every finite entry of an evaluated grid ``ds``: the plan the entry stands for,
    priced by ``predict`` with the closed-form pipeline (the grid's reference)."""
    import dataclasses

    import numpy as np

    from trainscale.model import perfmodel
    from trainscale.model.specs import RunSpec

    for idx in zip(*np.nonzero(np.isfinite(ds["step_time_s"].values))):
        entry = {name: ds[name].values[i] for name, i in zip(perfmodel.grid_axes(ds), idx)}
        entry["dp"] = int(ds["dp"].values[idx])
        plan = dataclasses.replace(perfmodel.plan_from_grid_entry(entry, global_batch), stack=stack)
        yield idx, perfmodel.predict(RunSpec(id="g", model=model, system=system, plan=plan),
                                     pipeline_simulation=False, allow_unrunnable=True, warn=False)


def workflow_env():
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(BIN_DIR), env.get("PATH", "")])
    env.setdefault("NUMBA_CACHE_DIR", str(REPO_ROOT / ".numba_cache"))
    env["MPLBACKEND"] = "Agg"
    return env


def run_snakemake(*args, timeout=1800):
    """Run snakemake from the repository root; returns the CompletedProcess (text, merged output)."""
    snakemake = BIN_DIR / "snakemake"
    if not snakemake.exists():
        pytest.fail(f"snakemake not found next to the test interpreter ({snakemake}); run `make setup`")
    return subprocess.run(
        [str(snakemake), "--snakefile", "workflow/Snakefile", *args],
        cwd=REPO_ROOT,
        env=workflow_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )


def notebook_text(results, study):
    """Everything an executed notebook printed (its stream outputs), to check a study's stated comparison."""
    import nbformat

    nb = nbformat.read(results / "notebooks" / f"{study}.ipynb", as_version=4)
    return "\n".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                     for out in cell.get("outputs", []) if out.get("output_type") == "stream")


def tail(text, lines=60):
    return "\n".join(text.splitlines()[-lines:])


def pytest_collection_modifyitems(config, items):
    """Every test that uses the quick workflow is a ``workflow`` test (make test leaves those to make test-all),
    whether or not its module says so."""
    for item in items:
        if "quick_workflow" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.workflow)


@pytest.fixture(scope="session")
def quick_workflow():
    """Run every study in quick mode (skipped by Snakemake where outputs are up to date).

    Returns the quick results folder, results/quick.
    """
    proc = run_snakemake("--cores", "2", *QUICK_CONFIG)
    if proc.returncode != 0:
        pytest.fail(
            f"quick workflow failed (exit {proc.returncode}); executed notebooks are in "
            f"results/quick/notebooks/. Snakemake output (tail):\n{tail(proc.stdout)}",
            pytrace=False,
        )
    return REPO_ROOT / "results" / "quick"
