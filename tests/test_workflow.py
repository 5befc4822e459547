"""The Snakemake workflow: config validation, lint, and the quick run of every study."""

import subprocess

import nbformat
import pytest
import xarray as xr
import yaml

from conftest import BIN_DIR, QUICK_CONFIG, REPO_ROOT, run_snakemake, tail

pytestmark = pytest.mark.workflow

# Outputs each study must declare (relative to its figures folder), with the dims and data
# variables of each dataset.
CONFIG_STUDIES = list(yaml.safe_load((REPO_ROOT / "config" / "config.yaml").read_text())["studies"])
EXPECTED_DATASETS = {
    "validation/validation.nc": (
        {"run"},
        {"measured", "predicted", "rel_error"},
        {"run", "dataset", "metric", "model", "gpus", "tp", "pp", "dp"},
    ),
    "hardware-scaling/hardware_scaling.nc": (
        {"model", "system", "strategy", "gpus"},
        {
            "tokens_per_s",
            "tokens_per_s_per_gpu",
            "mfu",
            "power_W_per_gpu",
            "energy_J_per_token",
            "memory_gib_per_gpu",
            "fits",
            "step_time_s",
            "tp",
            "pp",
            "dp",
            "micro_batch",
        },
        {"model", "system", "strategy", "gpus"},
    ),
    "hardware-scaling/allreduce_busbw.nc": (
        {"system", "nodes", "message_bytes"},
        {"busbw_GBps"},
        {"system", "nodes", "message_bytes"},
    ),
    "pipeline-planning/schedules.nc": (
        {"schedule", "micro_batches"},
        {"makespan_s", "tokens_per_s", "bubble_fraction", "peak_activation_gib"},
        {"schedule", "micro_batches"},
    ),
    "pipeline-planning/timelines.nc": (
        {"schedule", "op_index"},
        {"device", "stage", "micro_batch", "op", "start_s", "end_s"},
        {"schedule", "op_index"},
    ),
    "pipeline-planning/planner.nc": (
        {"global_batch", "bandwidth_GBps", "approach"},
        {"tokens_per_s", "dp", "pp"},
        {"global_batch", "bandwidth_GBps", "approach"},
    ),
    "heterogeneous-cluster/mix.nc": (
        {"bandwidth_GBps", "fraction", "approach", "part"},
        {"tokens_per_s", "fraction_of_sum", "even_fraction_of_sum", "layers_on_first", "alone_fits"},
        {"bandwidth_GBps", "fraction", "approach", "part"},
    ),
}


def declared_outputs(mode="quick"):
    """Every output file the workflow declares in `mode` (from `snakemake --summary`)."""
    proc = run_snakemake("--summary", "--nolock", "--config", f"mode={mode}")
    assert proc.returncode == 0, tail(proc.stdout)
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("output_file\t"))
    return [line.split("\t")[0] for line in lines[start + 1 :] if "\t" in line]


# --- static checks (no study runs) -------------------------------------------------------


def test_lint():
    proc = run_snakemake("--lint", "--nolock")
    assert proc.returncode == 0, tail(proc.stdout)


def test_snakefmt():
    proc = subprocess.run(
        [str(BIN_DIR / "snakefmt"), "--check", "workflow"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_declared_outputs_per_mode():
    from trainscale.studies import registry

    quick = declared_outputs("quick")
    full = declared_outputs("full")
    for info in registry.load_all(CONFIG_STUDIES):
        for name in [*info.all_outputs(), f"{info.name}.ipynb"]:
            assert f"results/quick/figures/{info.name}/{name}" in quick
            assert f"figures/{info.name}/{name}" in full
    assert all(path.startswith("results/quick/") for path in quick)
    assert not any(path.startswith("results/") for path in full)


def write_config(tmp_path, text):
    path = tmp_path / "override.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "override, field",
    [
        ("mode: fast\n", "fast"),
        ("numba_threads: 0\n", "numba_threads"),
        (
            "studies:\n  validation:\n    quick:\n      include_vtrain_singel: true\n",
            "include_vtrain_singel",
        ),
        (
            "studies:\n  hardware-scaling:\n    full:\n      gpu: [8, 16]\n",
            "gpu",
        ),
        (
            "studies:\n  hardware-scaling:\n    quick:\n      gpus: [8, -64]\n",
            "gpus",
        ),
        (
            "studies:\n  hardware-scaling:\n    quick:\n      global_batch_tokens: 4M\n",
            "global_batch_tokens",
        ),
        ("studies:\n  new-study:\n    quick: {a: 1}\n", "full"),
    ],
    ids=[
        "bad-mode",
        "zero-threads",
        "misspelt-parameter",
        "misspelt-full-parameter",
        "negative-gpus",
        "string-batch",
        "study-without-full",
    ],
)
def test_bad_config_is_rejected_naming_the_field(tmp_path, override, field):
    # --configfile extends config/config.yaml, so the override only holds the mistake.
    proc = run_snakemake("-n", "--nolock", "--configfile", str(write_config(tmp_path, override)))
    assert proc.returncode != 0, tail(proc.stdout)
    assert "Error validating config file" in proc.stdout, tail(proc.stdout)
    assert field in proc.stdout, tail(proc.stdout)


def test_undeclared_study_is_rejected(tmp_path):
    # a study needs its parameters' schema ($defs/params/<study>) and its module (the registry)
    override = "studies:\n  new-study:\n    full: {}\n    quick: {}\n"
    proc = run_snakemake("-n", "--nolock", "--configfile", str(write_config(tmp_path, override)))
    assert proc.returncode != 0
    assert "studies.new-study: config/schema.yaml has no $defs/params/new-study" in proc.stdout, tail(proc.stdout)


def test_config_quick_values_match_notebook_defaults():
    """Each notebook's parameters cell defaults to the config's quick values (runs as-is in Lab)."""
    config = yaml.safe_load((REPO_ROOT / "config" / "config.yaml").read_text())
    for study, modes in config["studies"].items():
        nb = nbformat.read(REPO_ROOT / "notebooks" / f"{study}.ipynb", as_version=4)
        nbformat.validate(nb)
        cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(cells) == 1, f"{study}: one cell tagged 'parameters'"
        defaults = {}
        exec(cells[0].source, {}, defaults)
        expected = dict(modes["quick"], output_dir=f"results/quick/figures/{study}")
        assert defaults == expected, study
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{study}: strip outputs"


def test_papermill_sees_every_notebook_parameter():
    """`papermill --help-notebook` and papermill's type hints read each parameter line; a line it cannot
    parse (an '=' in its comment did) makes papermill warn 'Passed unknown parameter' on every run."""
    import papermill

    config = yaml.safe_load((REPO_ROOT / "config" / "config.yaml").read_text())
    for study in config["studies"]:
        path = REPO_ROOT / "notebooks" / f"{study}.ipynb"
        nb = nbformat.read(path, as_version=4)
        (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        defaults = {}
        exec(cell.source, {}, defaults)
        assert set(papermill.inspect_notebook(str(path))) == set(defaults), study


# --- the quick run ------------------------------------------------------------------------


def test_every_declared_output_exists(quick_workflow):
    outputs = declared_outputs("quick")
    assert outputs
    for path in outputs:
        file = REPO_ROOT / path
        assert file.is_file() and file.stat().st_size > 0, path


@pytest.mark.parametrize("study", CONFIG_STUDIES)
def test_executed_notebook_has_no_errors(quick_workflow, study):
    nb = nbformat.read(quick_workflow / "notebooks" / f"{study}.ipynb", as_version=4)
    tags = [tag for cell in nb.cells for tag in cell.metadata.get("tags", [])]
    assert "parameters" in tags and "injected-parameters" in tags
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        errors = [out for out in cell.get("outputs", []) if out.get("output_type") == "error"]
        assert not errors, f"{study}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    assert nb.metadata["papermill"]["exception"] in (None, False)


@pytest.mark.parametrize("relpath", sorted(EXPECTED_DATASETS))
def test_datasets_have_dims_vars_and_units(quick_workflow, relpath):
    dims, data_vars, coords = EXPECTED_DATASETS[relpath]
    with xr.open_dataset(quick_workflow / "figures" / relpath, engine="h5netcdf") as ds:
        assert set(ds.dims) == dims
        assert data_vars <= set(ds.data_vars), data_vars - set(ds.data_vars)
        assert coords <= set(ds.coords), coords - set(ds.coords)
        missing = [name for name in ds.data_vars if "units" not in ds[name].attrs]
        assert not missing, f"data variables without units: {missing}"
        for key in ("trainscale_version", "git_commit", "parameters", "seed"):
            assert key in ds.attrs, key


def test_rerun_has_nothing_to_do(quick_workflow):
    proc = run_snakemake("-n", "--nolock", *QUICK_CONFIG)
    assert proc.returncode == 0, tail(proc.stdout)
    assert "Nothing to be done" in proc.stdout, tail(proc.stdout)


def test_papermill_runs_without_the_kernel_encryption_warning(tmp_path):
    """The workflow's papermill engine (--engine trainscale) provisions CurveZMQ keys for its kernels, so a run
    prints no "Kernel is running over TCP without encryption" warning (papermill's default engine does)."""
    notebook = tmp_path / "hello.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")],
                                            metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                     "language": "python"}}), notebook)
    proc = subprocess.run([str(BIN_DIR / "papermill"), "--engine", "trainscale", "-k", "python3", str(notebook),
                           str(tmp_path / "out.ipynb")], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "without encryption" not in proc.stdout + proc.stderr
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert out.cells[0].outputs[0]["text"].strip() == "42"
