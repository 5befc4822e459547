"""trainscale.interface.workflow_outputs: the fingerprint that decides when a study reruns, and the staged install."""

import json
import os
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from trainscale.interface import workflow_outputs as wo


def _package(tmp_path):
    pkg = tmp_path / "pkg" / "trainscale"
    (pkg / "studies").mkdir(parents=True)
    (pkg / "data").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "studies" / "__init__.py").write_text("")
    (pkg / "studies" / "demo.py").write_text("from .. import model\nfrom ..common import io as tsio\n")
    (pkg / "model.py").write_text("def f():\n    from .kernels import plan\n")
    (pkg / "common").mkdir()
    (pkg / "common" / "__init__.py").write_text("")
    (pkg / "common" / "io.py").write_text("import os\n")
    (pkg / "kernels").mkdir()
    (pkg / "kernels" / "__init__.py").write_text("")
    (pkg / "kernels" / "plan.py").write_text("")
    (pkg / "cli.py").write_text("from . import model\n")  # imported by no study
    (pkg / "data" / "systems.yaml").write_text("a: 1\n")
    nb = {"cells": [{"cell_type": "code", "source": ["%matplotlib inline\n", "import trainscale.studies.demo\n"]},
                    {"cell_type": "markdown", "source": "from trainscale import cli"}]}
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "demo.ipynb").write_text(json.dumps(nb))
    (tmp_path / "requirements.txt").write_text("numpy==2\n")
    return tmp_path


def test_a_study_depends_on_what_it_imports_transitively_and_the_catalogs(tmp_path):
    root = _package(tmp_path)
    files = [f.as_posix() for f in wo.study_input_files(root, "demo", "notebooks/demo.ipynb")]
    assert files == ["notebooks/demo.ipynb", "pkg/trainscale/__init__.py", "pkg/trainscale/common/__init__.py",
                     "pkg/trainscale/common/io.py", "pkg/trainscale/data/systems.yaml",
                     "pkg/trainscale/kernels/__init__.py", "pkg/trainscale/kernels/plan.py",
                     "pkg/trainscale/model.py", "pkg/trainscale/studies/__init__.py",
                     "pkg/trainscale/studies/demo.py", "requirements.txt"]  # cli.py (markdown only) is not


def test_the_real_studies_depend_on_their_own_modules():
    files = {f.as_posix() for f in wo.study_input_files(REPO_ROOT, "survey-map", "notebooks/survey-map.ipynb")}
    assert {"pkg/trainscale/studies/survey_map.py", "pkg/trainscale/studies/surveymap.py", "notebooks/survey-map.ipynb",
            "pkg/trainscale/data/survey_map.yaml", "requirements.txt"} <= files
    assert not [f for f in files if f.startswith("pkg/trainscale/interface/cli/")]  # the CLI package: no study's input
    assert "pkg/trainscale/kernels/plan.py" not in files


def test_the_fingerprint_follows_content_and_parameters(tmp_path):
    root = _package(tmp_path)
    files = wo.study_input_files(root, "demo", "notebooks/demo.ipynb")
    first = wo.study_fingerprint(root, files, {"n": 1})
    os.utime(root / "pkg" / "trainscale" / "model.py", (1, 1))  # dates decide nothing
    assert wo.study_fingerprint(root, files, {"n": 1}) == first
    assert wo.study_fingerprint(root, files, {"n": 2})["sha256"] != first["sha256"]
    (root / "pkg" / "trainscale" / "kernels" / "plan.py").write_text("x = 1\n")
    assert wo.study_fingerprint(root, files, {"n": 1})["sha256"] != first["sha256"]


def test_sync_sets_the_date_that_makes_snakemake_rerun_only_stale_outputs(tmp_path):
    fingerprint = {"sha256": "abc", "parameters": {}, "files": {}}
    path, committed = tmp_path / "fp.json", tmp_path / "figures" / "inputs.json"
    assert wo.sync_fingerprint(path, fingerprint, committed) is True  # nothing committed: stale
    assert path.stat().st_mtime > 0
    committed.parent.mkdir()
    committed.write_text(json.dumps(fingerprint))
    assert wo.sync_fingerprint(path, fingerprint, committed) is False  # outputs made from it: date 0
    assert path.stat().st_mtime == 0
    committed.write_text(json.dumps({"sha256": "old"}))  # e.g. older figures checked out
    assert wo.sync_fingerprint(path, fingerprint, committed) is True and path.stat().st_mtime > 0
    assert wo.sync_fingerprint(path, {**fingerprint, "sha256": "old"}, committed) is False
    assert json.loads(path.read_text())["sha256"] == "old" and path.stat().st_mtime == 0


def test_a_failed_study_stays_stale_though_snakemake_touches_its_outputs(tmp_path):
    """Snakemake touches a failed job's update() outputs (kept, never deleted: the committed figures), so they
    are newer than a stale fingerprint written before the job, and records them as made from its content (input
    checksums, which outweigh dates); the next parse dates the fingerprint now again and forgets those records, and
    Snakemake reruns the study instead of taking the untouched figures for current (as on 2026-12-07: a
    curtailment run that failed left its figures a fingerprint behind, and `snakemake -n` said nothing to do)."""
    import subprocess
    import sys
    import time

    (tmp_path / "Snakefile").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(wo.__file__.rsplit('/trainscale/', 1)[0])!r})\n"
        "from trainscale.interface import workflow_outputs as wo\n"
        "if wo.sync_fingerprint('fp.json', {'sha256': 'new'}, 'figures/inputs.json'):\n"
        "    wo.forget_recorded_outputs(['figures/out.txt'])\n"
        "rule study:\n"
        "    input: 'fp.json'\n"
        "    output: update('figures/out.txt')\n"
        "    shell: 'exit 1'\n")
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "out.txt").write_text("committed\n")
    (tmp_path / "figures" / "inputs.json").write_text(json.dumps({"sha256": "old"}))
    snakemake = [str(Path(sys.executable).parent / "snakemake"), "--cores", "1", "--keep-incomplete",
                 "--rerun-incomplete", "figures/out.txt"]
    first = subprocess.run(snakemake, cwd=tmp_path, capture_output=True, text=True)
    assert first.returncode != 0  # the study fails
    assert (tmp_path / "figures" / "out.txt").read_text() == "committed\n"  # kept
    assert (tmp_path / "figures" / "out.txt").stat().st_mtime > (tmp_path / "fp.json").stat().st_mtime - 1
    time.sleep(0.01)
    dry = subprocess.run(snakemake + ["-n"], cwd=tmp_path, capture_output=True, text=True)
    assert dry.returncode == 0 and "Nothing to be done" not in dry.stdout + dry.stderr, dry.stdout[-2000:]


def test_install_moves_everything_or_nothing(tmp_path):
    staging, destination = tmp_path / "staging", tmp_path / "figures"
    staging.mkdir()
    destination.mkdir()
    (destination / "a.nc").write_bytes(b"committed")
    (staging / "a.nc").write_bytes(b"new")
    with pytest.raises(wo.InstallError, match="b.png"):
        wo.install(staging, destination, ["a.nc", "b.png"])
    assert (destination / "a.nc").read_bytes() == b"committed" and (staging / "a.nc").exists()
    (staging / "b.png").write_bytes(b"png")
    wo.install(staging, destination, ["a.nc", "b.png"])
    assert (destination / "a.nc").read_bytes() == b"new" and (destination / "b.png").read_bytes() == b"png"
    assert not staging.exists()


def test_the_install_command_says_what_is_missing_in_one_line(tmp_path, capsys):
    from trainscale.interface import cli

    (tmp_path / "staging").mkdir()
    (tmp_path / "staging" / "a.nc").write_bytes(b"x")
    assert cli.main(["install-outputs", str(tmp_path / "staging"), str(tmp_path / "out"), "a.nc", "b.png"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "b.png" in err and "nothing installed" in err
    assert not (tmp_path / "out").exists()


def test_the_published_copy_names_the_outputs_folder_not_the_staging_one(tmp_path):
    from trainscale.common import publish

    executed = tmp_path / "executed.ipynb"
    nb = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [
        {"output_type": "stream", "name": "stdout", "text": "wrote results/full/staging/demo/demo.nc\n"}],
        "source": "output_dir = 'results/full/staging/demo'"}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    executed.write_text(json.dumps(nb))
    out = publish.publish_notebook(executed, tmp_path / "results/full/staging/demo/demo.ipynb",
                                   shown_as=("results/full/staging/demo", "figures/demo"))
    text = out.read_text()
    assert "staging" not in text and "wrote figures/demo/demo.nc" in text
