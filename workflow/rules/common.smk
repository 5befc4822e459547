# Helpers shared by the study rules. Paths are relative to the repository root, which must be
# the working directory (run `snakemake --snakefile workflow/Snakefile` from there).
import json
from pathlib import Path

import yaml
from snakemake.exceptions import WorkflowError

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

# Every study reruns when the package (code or catalogs) changes.
PACKAGE_FILES = sorted(
    str(p)
    for p in Path("pkg/trainscale").rglob("*")
    if p.is_file()
    and p.suffix in {".py", ".yaml", ".csv"}
    and "__pycache__" not in p.parts
)


try:  # the study registry: each study's module declares its outputs and resources
    STUDIES = registry.load_all(config["studies"])
except registry.ConfigError as err:
    raise WorkflowError(f"config/config.yaml: {err}") from None


def study_dir(study):
    return f"{FIGURES_DIR}/{study}"


def study_outputs(study, files):
    """Declared outputs (datasets, figures, comparison.csv) of a study, in the current mode's folder."""
    return [f"{study_dir(study)}/{name}" for name in files]


def study_notebook(study):
    return f"notebooks/{study}.ipynb"


def published_notebook(study):
    """The executed notebook for readers, beside the figures (outputs kept, timestamps dropped)."""
    return f"{study_dir(study)}/{study}.ipynb"


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
    """Papermill parameters of a study (YAML): its config for the current mode + output_dir."""
    parameters = dict(study_config(study), output_dir=study_dir(study))
    return yaml.safe_dump(
        parameters, sort_keys=True, default_flow_style=True, width=10**6
    ).strip()


def study_runtime_min(quick, full):
    """Runtime resource (minutes) for a SLURM profile."""
    return quick if MODE == "quick" else full


def input_folder_files(study):
    """Input function: the *.csv files in the folders a study's parameters name (INPUT_FOLDER_PARAMETERS),
    where those folders exist (the notebook says what it skips otherwise)."""

    def files(wildcards):
        found = []
        for parameter in study.input_folder_parameters:
            folder = study_config(study.name).get(parameter)
            if folder and Path(folder).is_dir():
                found += sorted(str(p) for p in Path(folder).glob("*.csv"))
        return found

    return files


def all_study_outputs():
    """Outputs of every study in the config, with its published notebook."""
    return [
        f
        for study in STUDIES
        for f in [
            *study_outputs(study.name, study.all_outputs()),
            published_notebook(study.name),
        ]
    ]


# ---------------------------------------------------------------- sweeps (rules/sweeps.smk)

SWEEPS_DIR = f"results/{MODE}/sweeps"


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
    from trainscale.sweep import output_format

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
