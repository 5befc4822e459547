"""Nothing is lost: no workflow run deletes or half-writes a committed file, and a fresh clone is up to date.

The workflow runs in a copy of the working tree (tracked and untracked-not-ignored files), so the real
figures/ are never at risk; every file of the copy is hashed before and after (trainscale.interface.workflow_outputs).
"""

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import BIN_DIR, REPO_ROOT, tail

pytestmark = pytest.mark.workflow

SLURM_TOOLS = ("sbatch", "sacct", "squeue", "sinfo", "scancel", "sacctmgr", "scontrol")


def _tracked_files(root: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, check=True,
                         capture_output=True).stdout
    return [f for f in out.decode().split("\0") if f and (root / f).is_file()]


@pytest.fixture
def repo_copy(tmp_path):
    """A copy of the working tree (what git would commit), outside the repository."""
    if not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    copy = tmp_path / "copy"
    for rel in _tracked_files(REPO_ROOT):
        target = copy / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((REPO_ROOT / rel).read_bytes())
    return copy


def _hashes(root: Path) -> dict[str, str]:
    skip = ("results/", ".snakemake/", ".numba_cache/")
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file() and not str(p.relative_to(root)).startswith(skip)}


def _env(root: Path, extra_path: Path | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(root / "pkg"), MPLBACKEND="Agg",
               NUMBA_CACHE_DIR=os.environ.get("NUMBA_CACHE_DIR", str(REPO_ROOT / ".numba_cache")))
    env["PATH"] = os.pathsep.join([*([str(extra_path)] if extra_path else []), str(BIN_DIR), env["PATH"]])
    return env


def _refusing_slurm(folder: Path) -> Path:
    """sbatch, sacct, ... that fail as on a cluster with a wrong partition or account."""
    folder.mkdir()
    for tool in SLURM_TOOLS:
        script = folder / tool
        script.write_text(f"#!/bin/sh\necho '{tool}: error: invalid partition or account' >&2\nexit 1\n")
        script.chmod(0o755)
    return folder


@pytest.mark.parametrize("extra", [[], pytest.param(["--default-resources", "slurm_partition=compute",
                                                      "slurm_account=myproject", "mem_mb=1000", "runtime=30"],
                                                     marks=pytest.mark.slow)],
                         ids=["profile", "default-resources"])
def test_a_refused_slurm_submission_leaves_every_file_byte_identical(repo_copy, tmp_path, extra):
    """The README's SLURM commands where submission fails: every study is submitted (--forceall) and refused."""
    before = _hashes(repo_copy)
    fake = _refusing_slurm(tmp_path / "bin")
    proc = subprocess.run([str(BIN_DIR / "snakemake"), "--workflow-profile", "workflow/profiles/slurm",
                           "--forceall", *extra], cwd=repo_copy, env=_env(repo_copy, fake),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode != 0, tail(proc.stdout)
    assert "Error in rule" in proc.stdout, tail(proc.stdout)  # the jobs were scheduled and refused
    after = _hashes(repo_copy)
    changed = sorted(f for f in before if after.get(f) != before[f])
    assert not changed, f"{len(changed)} files changed or deleted, e.g. {changed[:5]}\n{tail(proc.stdout)}"


def _wait_for_staged_file(staging: Path, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if staging.is_dir() and any(p.suffix in {".nc", ".png"} for p in staging.iterdir()):
            return
        if proc.poll() is not None:
            pytest.fail(f"the workflow ended (exit {proc.returncode}) before the notebook wrote anything")
        time.sleep(0.05)
    pytest.fail("the notebook wrote nothing in its staging folder in time")


@pytest.mark.parametrize("how", ["SIGINT", pytest.param("SIGKILL", marks=pytest.mark.slow)])
def test_a_job_killed_midway_leaves_every_file_byte_identical(repo_copy, how):
    """Ctrl-C (the terminal interrupts Snakemake and the notebook; Snakemake handles the failed job) and kill -9
    of the whole run (a lost node):
    the notebook had written part of its outputs (into staging), none reached figures/."""
    study = "survey-map"  # no kernels to compile; writes its dataset, then draws two figures
    before = _hashes(repo_copy)
    proc = subprocess.Popen([str(BIN_DIR / "snakemake"), "--snakefile", "workflow/Snakefile", "--cores", "1",
                             "--forcerun", study.replace("-", "_"), "--", f"figures/{study}/inputs.json"],
                            cwd=repo_copy, env=_env(repo_copy), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _wait_for_staged_file(repo_copy / "results" / "full" / "staging" / study, proc)
        os.killpg(proc.pid, getattr(signal, how))  # to the whole group, as a terminal's Ctrl-C or kill -9 -PGID
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0, tail(output or "")
    after = _hashes(repo_copy)
    changed = sorted(f for f in before if after.get(f) != before[f])
    assert not changed, f"{how}: {changed[:5]} changed or deleted\n{tail(output or '')}"


def test_a_fresh_clone_has_nothing_to_do(tmp_path):
    """git writes pkg/ after figures/, so file dates would make every study stale; the fingerprints do not.
    Checks the committed HEAD (a clone), as CI's clean clone of main."""
    if not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO_ROOT), str(clone)], check=True)
    proc = subprocess.run([str(BIN_DIR / "snakemake"), "--snakefile", "workflow/Snakefile", "-n"],
                          cwd=clone, env=_env(clone), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)
    assert proc.returncode == 0, tail(proc.stdout)
    assert "Nothing to be done" in proc.stdout, (
        "a fresh clone of HEAD would rerun studies (their committed figures/<study>/inputs.json do not match "
        "the code: run `make figures` and commit):\n" + tail(proc.stdout, 40))
