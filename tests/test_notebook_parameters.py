"""Notebook parameters are checked before anything runs: a name the notebook does not take, like a bad value,
stops with one line naming it and the valid names (papermill alone only warns "Passed unknown parameter")."""

import subprocess
from pathlib import Path

import nbformat
import pytest

from conftest import BIN_DIR, REPO_ROOT

import papermill.engines  # noqa: F401  (first: it loads the trainscale engine through its entry point)
from trainscale.interface import papermill_engine
from trainscale.studies import registry

NOTEBOOK = REPO_ROOT / "notebooks" / "survey-map.ipynb"


def _papermill(tmp_path, *args):
    return subprocess.run([str(BIN_DIR / "papermill"), *args, "-k", "python3", "--no-progress-bar", str(NOTEBOOK),
                           str(tmp_path / "out.ipynb"), "-p", "output_dir", str(tmp_path / "figures"),
                           "-p", "map_fle", "pkg/trainscale/data/survey_map.yaml"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def test_the_trainscale_engine_refuses_an_unknown_parameter_before_a_kernel_starts(tmp_path):
    proc = _papermill(tmp_path, "--engine", "trainscale")
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last == "Error: notebook parameter map_fle: unknown; this notebook takes map_file, output_dir"
    assert "Executing notebook" not in proc.stderr and not (tmp_path / "figures").exists()


@pytest.mark.workflow
def test_plain_papermill_is_stopped_by_the_notebook_itself(tmp_path):
    """Any engine: the study notebook's first code cell checks what papermill injected."""
    proc = _papermill(tmp_path)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "ConfigError: notebook parameter map_fle: unknown parameter of survey-map; valid: map_file, output_dir" \
        in out, out[-2000:]
    written = [p for p in (tmp_path / "figures").rglob("*") if p.is_file()]
    assert not written  # stopped before the study wrote anything


def test_injected_names_are_read_from_the_kernel_history():
    injected = "# Parameters\nmap_fle = 'x'\noutput_dir = 'y'\n"
    assert registry.injected_parameter_names({"In": ["", "import os", injected, "x = 1"]}) == {"map_fle", "output_dir"}
    assert registry.injected_parameter_names({"In": ["", "# Parameters: the defaults\nmap_file = 'a'\n"]}) == set()
    assert registry.injected_parameter_names({}) == set()  # no IPython history: nothing injected


def test_check_notebook_parameters_names_the_unknown_one():
    schema = REPO_ROOT / "config" / "schema.yaml"
    namespace = {"map_file": "pkg/trainscale/data/survey_map.yaml", "output_dir": "out",
                 "In": ["", "# Parameters\nmap_file = 'a'\noutput_dir = 'b'\n"]}
    registry.check_notebook_parameters("survey-map", namespace, schema)  # known names: fine
    namespace["In"].append("# Parameters\nmap_fle = 'a'\n")
    with pytest.raises(registry.ConfigError, match=r"^notebook parameter map_fle: unknown parameter of survey-map; "
                                                     r"valid: map_file, output_dir$"):
        registry.check_notebook_parameters("survey-map", namespace, schema)


def test_every_study_notebook_defines_what_its_config_block_sets():
    """The engine's check reads the notebook's parameters cell: the workflow's own parameters must be there."""
    import yaml

    config = yaml.safe_load((REPO_ROOT / "config" / "config.yaml").read_text())
    for study, modes in config["studies"].items():
        nb = nbformat.read(REPO_ROOT / "notebooks" / f"{study}.ipynb", as_version=4)
        names = papermill_engine.notebook_parameter_names(nb)
        for mode, values in modes.items():
            missing = set(values) - names
            assert not missing, f"{study} ({mode}): {sorted(missing)} not in its parameters cell"
        assert "output_dir" in names, study


def test_the_engine_shuts_an_idle_kernel_down_without_an_interrupt(monkeypatch):
    """jupyter_client interrupts before shutting down, which made an idle kernel log a KeyboardInterrupt ERROR."""
    import asyncio

    from jupyter_client.manager import AsyncKernelManager

    sent = []

    async def interrupt(self):
        sent.append("SIGINT")

    monkeypatch.setattr(AsyncKernelManager, "_async_interrupt_kernel", interrupt)
    manager = papermill_engine.EncryptedKernelManager()
    manager.shutting_down = True
    asyncio.run(manager._async_interrupt_kernel())
    assert sent == []
    manager.shutting_down = False
    asyncio.run(manager._async_interrupt_kernel())  # an interrupt asked for (a cell's timeout) still goes out
    assert sent == ["SIGINT"]
