# Helpers shared by the study rules. Paths are relative to the repository root, which must be
# the working directory (run `snakemake --snakefile workflow/Snakefile` from there).
import json
import os
from pathlib import Path

import yaml
from snakemake.exceptions import WorkflowError

from trainscale.interface import workflow_outputs
from trainscale.studies import registry

REPO_ROOT = Path(workflow.basedir).resolve().parent
if Path.cwd().resolve() != REPO_ROOT:
    raise WorkflowError(
        f"run snakemake from the repository root {REPO_ROOT} (working directory is {Path.cwd()})"
    )

MODE = config["mode"]
# full: committed figures; other modes: under results/ (git-ignored)
FIGURES_DIR = "figures" if MODE == "full" else f"results/{MODE}/figures"
NOTEBOOKS_DIR = f"results/{MODE}/notebooks"

try:  # the study registry: each study's module declares its outputs and resources
    STUDIES = registry.load_all(config["studies"])
except registry.ConfigError as err:
    raise WorkflowError(f"config/config.yaml: {err}") from None


def study_dir(study):
    return f"{FIGURES_DIR}/{study}"


def staging_dir(study):
    """Where a study's notebook writes; its outputs move to study_dir only when all are there."""
    return f"results/{MODE}/staging/{study}"


# ------------------------------------------------- when a study reruns (trainscale.interface.workflow_outputs)
# A study reruns when its fingerprint (its notebook, the package modules it imports, the catalogs,
# requirements.txt, its input-folder CSVs and its parameters, hashed by content) differs from the one its
# outputs were made from (figures/<study>/inputs.json): the fingerprint file below is the rule's input and
# its mtime is 0 when current, now when not. File dates from a git checkout decide nothing.


def fingerprint_file(study):
    return f"results/{MODE}/fingerprints/{study}.json"


def input_folder_paths(study):
    """The *.csv files in the folders a study's parameters name (INPUT_FOLDER_PARAMETERS), where they exist."""
    found = []
    for parameter in study.input_folder_parameters:
        folder = study_config(study.name).get(parameter)
        if folder and Path(folder).is_dir():
            found += sorted(str(p) for p in Path(folder).glob("*.csv"))
    return found


def sync_study_fingerprint(study):
    files = workflow_outputs.study_input_files(
        REPO_ROOT, study.name, study.notebook, input_folder_paths(study)
    )
    fingerprint = workflow_outputs.study_fingerprint(
        REPO_ROOT, files, study_config(study.name)
    )
    committed = f"{study_dir(study.name)}/{workflow_outputs.FINGERPRINT_FILE}"
    stale = workflow_outputs.sync_fingerprint(
        fingerprint_file(study.name), fingerprint, committed
    )
    # a failed run's kept outputs are on record as made from this fingerprint: forget them
    if stale:
        workflow_outputs.forget_recorded_outputs(
            [f"{study_dir(study.name)}/{name}" for name in study_output_names(study)]
        )


def study_notebook(study):
    return f"notebooks/{study}.ipynb"


def executed_notebook(study):
    """The executed notebook: the rule's log, so Snakemake keeps it when the notebook fails."""
    return f"{NOTEBOOKS_DIR}/{study}.ipynb"


def study_config(study):
    try:
        return config["studies"][study][MODE]
    except KeyError:
        raise WorkflowError(
            f"config/config.yaml has no parameters for study '{study}' in mode '{MODE}' "
            f"(expected studies: {study}: {MODE}: {{...}})"
        ) from None


def notebook_parameters(study):
    """Papermill parameters of a study (YAML): its config for the current mode + output_dir (staging)."""
    parameters = dict(study_config(study), output_dir=staging_dir(study))
    return yaml.safe_dump(
        parameters, sort_keys=True, default_flow_style=True, width=10**6
    ).strip()


def study_runtime_min(quick, full):
    """Runtime resource (minutes) for a SLURM profile."""
    return quick if MODE == "quick" else full


def study_output_names(study):
    """Every file a study's job installs: declared outputs, comparison record, published notebook,
    fingerprint."""
    return [
        *study.all_outputs(),
        f"{study.name}.ipynb",
        workflow_outputs.FINGERPRINT_FILE,
    ]


def all_study_outputs():
    """Outputs of every study in the config (what the study rules install)."""
    return [
        f"{study_dir(study.name)}/{name}"
        for study in STUDIES
        for name in study_output_names(study)
    ]


# ---------------------------------------------------------------- sweeps (rules/sweeps.smk)

SWEEPS_DIR = f"results/{MODE}/sweeps"
# Sweep results (under results/, never committed) rerun when the package changes (by mtime).
PACKAGE_FILES = sorted(
    str(p)
    for p in Path("pkg/trainscale").rglob("*")
    if p.is_file()
    and p.suffix in {".py", ".yaml", ".csv"}
    and "__pycache__" not in p.parts
)


def sweep_spec(name):
    """A plan sweep's spec for the current mode (config: sweeps: <name>: <mode>: ...)."""
    try:
        return config["sweeps"][name][MODE]
    except KeyError:
        raise WorkflowError(
            f"config/config.yaml has no plan sweep '{name}' for mode '{MODE}'"
        ) from None


def sweep_output(name):
    """The gathered dataset: .zarr when the sweep is too large for one netCDF file."""
    from trainscale.model.sweep import output_format

    return f"{SWEEPS_DIR}/{name}.{output_format(sweep_spec(name))}"


def sweep_chunks(wildcards):
    n = int(sweep_spec(wildcards.sweep).get("chunks", 1))
    return [f"{SWEEPS_DIR}/{wildcards.sweep}/chunk-{i}.nc" for i in range(n)]


def notebook_sweep(name):
    try:
        entry = config["notebook_sweeps"][name]
        return entry, entry[MODE]
    except KeyError:
        raise WorkflowError(
            f"config/config.yaml has no notebook sweep '{name}' for mode '{MODE}'"
        ) from None


def notebook_sweep_parameters(wildcards):
    """Papermill parameters of one set: the study's parameters, overridden by the set."""
    entry, sets = notebook_sweep(wildcards.name)
    parameters = dict(study_config(entry["study"]))
    parameters.update(sets[int(wildcards.index)])
    parameters["output_dir"] = f"{SWEEPS_DIR}/{wildcards.name}/set-{wildcards.index}"
    return yaml.safe_dump(
        parameters, sort_keys=True, default_flow_style=True, width=10**6
    ).strip()


def notebook_sweep_sets(wildcards):
    entry, sets = notebook_sweep(wildcards.name)
    return [f"{SWEEPS_DIR}/{wildcards.name}/set-{i}" for i in range(len(sets))]


def all_sweep_outputs():
    plans = [sweep_output(name) for name in config.get("sweeps", {})]
    books = [f"{SWEEPS_DIR}/{name}.nc" for name in config.get("notebook_sweeps", {})]
    return plans + books


PLAN_SWEEPS = "|".join(config.get("sweeps", {})) or "^$"
