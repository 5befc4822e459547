"""The workflow on a real SLURM cluster, through workflow/profiles/slurm.

Needs a running SLURM whose node is idle (CI: `.ci/slurm-up`); skipped otherwise. Runs the
quick-mode outputs of two studies and a split plan sweep as SLURM jobs in a copy of the working
tree, checks every job ran and completed on SLURM, and that every output equals the local quick
run's (datasets: identical but for the `git_commit` provenance attribute; figures: byte for byte).
Writes a readable report to results/slurm/report.txt.
"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import xarray as xr
import yaml

from conftest import BIN_DIR, QUICK_CONFIG, REPO_ROOT, run_snakemake, tail, workflow_env

pytestmark = [pytest.mark.slurm, pytest.mark.workflow, pytest.mark.slow]

STUDIES = ["validation", "pipeline-planning"]
PROFILE = "workflow/profiles/slurm"
TIMEOUT_S = 900  # the SLURM run; a hung snakemake ignores SIGTERM, so timeout -s INT
REPORT = REPO_ROOT / "results" / "slurm" / "report.txt"


def _cmd(*args, timeout=20):
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, str(exc)
    return proc.returncode, proc.stdout + proc.stderr


def slurm_unavailable():
    """Why the SLURM test cannot run here, or None."""
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        return "snakemake-executor-plugin-slurm is not installed (pip install -r requirements.txt)"
    if shutil.which("sinfo") is None:
        return "no SLURM here (sinfo not found; CI starts one with .ci/slurm-up)"
    rc, out = _cmd("sinfo", "-h", "-o", "%T")
    if rc != 0:
        last = out.strip().splitlines()[-1:] or ["no output"]
        return f"no SLURM running (sinfo: {last[0][:200]}); CI starts one with .ci/slurm-up"
    if "idle" not in out.split():
        return f"no idle SLURM node (sinfo -h -o %T: {out.strip()!r})"
    return None


def study_outputs(study):
    from trainscale.studies import registry

    return [f"results/quick/figures/{study}/{name}" for name in registry.load(study).all_outputs()]


def sweep_targets():
    """The quick output of the first plan sweep in the config, if the workflow can make it."""
    config = yaml.safe_load((REPO_ROOT / "config" / "config.yaml").read_text())
    names = list(config.get("sweeps") or {})
    if not names:
        return [], "no `sweeps:` in config/config.yaml: no split sweep run on SLURM"
    target = f"results/quick/sweeps/{names[0]}.nc"
    proc = run_snakemake(target, "-n", "--nolock", *QUICK_CONFIG)
    if proc.returncode != 0:
        return [], f"the workflow cannot make {target} (dry run failed):\n{tail(proc.stdout, 15)}"
    return [target], None


def copy_working_tree(dest):
    """Tracked and untracked-but-not-ignored files of the working tree (no results, no .git)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = REPO_ROOT / rel
        if not src.is_file():  # deleted in the working tree
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    # data the config reaches outside the repository (validation: ../shared/validation/vtrain)
    shared = REPO_ROOT.parent / "shared"
    if shared.is_dir():
        (dest.parent / "shared").symlink_to(shared)


def parse_submissions(stdout):
    """[(snakemake jobid, SLURM jobid, rule)] from the SLURM plugin's log lines."""
    found = []
    pattern = re.compile(
        r"Job (\d+) has been submitted with SLURM jobid (\d+) \(log: (\S+?)\)\.?$", re.M
    )
    for jobid, slurm_id, logfile in pattern.findall(stdout):
        rule = re.search(r"/(?:rule|group)_([^/]+)/", logfile)
        found.append((int(jobid), slurm_id, rule.group(1) if rule else "?"))
    return found


def executed_rules(stdout):
    """{snakemake jobid: rule} of every job Snakemake ran (`localrule` ones included)."""
    rules = {}
    for block in re.finditer(r"^(local)?rule (\w+):\n((?:    .*\n)+)", stdout, re.M):
        m = re.search(r"^    jobid: (\d+)$", block.group(3), re.M)
        if m:
            rules[int(m.group(1))] = (block.group(2), bool(block.group(1)))
    return rules


def scontrol_job(slurm_id):
    rc, out = _cmd("scontrol", "show", "job", "-o", slurm_id)
    if rc != 0:
        return {}
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def compare(copy_root, rel):
    """None if copy_root/rel equals REPO_ROOT/rel, else what differs."""
    mine, local = copy_root / rel, REPO_ROOT / rel
    if not mine.exists():
        return "not produced on SLURM"
    if not local.exists():
        return "not produced by the local run"
    if rel.endswith((".nc", ".zarr")):
        engine = "zarr" if rel.endswith(".zarr") else "h5netcdf"
        with xr.open_dataset(mine, engine=engine) as a, xr.open_dataset(local, engine=engine) as b:
            a.attrs.pop("git_commit", None)
            b.attrs.pop("git_commit", None)
            try:
                xr.testing.assert_identical(a.load(), b.load())
            except AssertionError as exc:
                return str(exc)[:2000]
        return None
    return None if mine.read_bytes() == local.read_bytes() else "bytes differ"


@pytest.fixture
def slurm_cluster():
    """Skip (before the quick run) unless a SLURM node is idle."""
    reason = slurm_unavailable()
    if reason:
        pytest.skip(reason)


def test_quick_studies_and_sweep_on_slurm(slurm_cluster, quick_workflow):
    notes = []
    sweeps, note = sweep_targets()
    if note:
        notes.append(note)
    targets = [f for s in STUDIES for f in study_outputs(s)] + sweeps

    # the local outputs to compare with (the studies come from quick_workflow, the sweep may not)
    proc = run_snakemake(*targets, "--cores", "2", *QUICK_CONFIG)
    assert proc.returncode == 0, tail(proc.stdout)

    # A copy of the working tree under /tmp (the one SLURM node is this machine).
    base = Path(tempfile.mkdtemp(prefix="trainscale-slurm-test-"))
    copy_root = base / REPO_ROOT.name
    copy_root.mkdir()
    try:
        copy_working_tree(copy_root)
        env = workflow_env()
        env["PYTHONPATH"] = os.pathsep.join(
            [str(copy_root / "pkg"), *filter(None, [env.get("PYTHONPATH")])]
        )
        env["NUMBA_CACHE_DIR"] = str(copy_root / ".numba_cache")
        cmd = [
            "timeout", "-s", "INT", "-k", "30", str(TIMEOUT_S),
            str(BIN_DIR / "snakemake"), "--workflow-profile", PROFILE,
            *QUICK_CONFIG, "--", *targets,
        ]  # fmt: skip
        start = time.monotonic()
        run = subprocess.run(
            cmd,
            cwd=copy_root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=TIMEOUT_S + 60,
            check=False,
        )
        wall_s = time.monotonic() - start
        (copy_root / "snakemake-slurm.log").write_text(run.stdout)

        submitted = parse_submissions(run.stdout)
        jobs = executed_rules(run.stdout)
        details = {slurm_id: scontrol_job(slurm_id) for _, slurm_id, _ in submitted}
        diffs = {rel: compare(copy_root, rel) for rel in targets}
        _, squeue = _cmd("squeue", "-h", "-o", "%i %j %T")

        write_report(run, cmd, wall_s, submitted, details, diffs, notes, squeue or "")

        assert run.returncode == 0, (
            f"snakemake on SLURM failed (exit {run.returncode}; 124: timed out after {TIMEOUT_S} s)"
            f"; SLURM logs in {copy_root}/.snakemake/slurm_logs\n{tail(run.stdout, 80)}"
        )
        assert submitted, "no job was submitted to SLURM:\n" + tail(run.stdout, 60)
        # every non-local job Snakemake ran went through SLURM, and completed there
        on_slurm = {jobid for jobid, _, _ in submitted}
        remote = {jobid: rule for jobid, (rule, local) in jobs.items() if not local}
        assert remote, "no job found in snakemake's output:\n" + tail(run.stdout, 60)
        assert set(remote) <= on_slurm, f"jobs not submitted to SLURM: {set(remote) - on_slurm}"
        for rule in {rule_name(s) for s in STUDIES} | ({"sweep_chunk"} if sweeps else set()):
            assert rule in {r for _, _, r in submitted}, f"no SLURM job for rule {rule}"
        for slurm_id, info in details.items():
            assert info.get("JobState") == "COMPLETED", f"SLURM job {slurm_id}: {info}"
        assert not squeue.strip(), f"jobs left in the SLURM queue:\n{squeue}"
        bad = {rel: why for rel, why in diffs.items() if why}
        assert not bad, "outputs on SLURM differ from the local run:\n" + "\n".join(
            f"  {rel}: {why}" for rel, why in bad.items()
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


def rule_name(study):
    return study.replace("-", "_")


def write_report(run, cmd, wall_s, submitted, details, diffs, notes, squeue):
    lines = [
        "trainscale on SLURM (tests/test_slurm.py)",
        "",
        "command: " + " ".join(cmd[6:]),
        f"exit status: {run.returncode}   wall time: {wall_s:.0f} s",
        "",
        f"{len(submitted)} SLURM jobs:",
        f"  {'slurm id':>8}  {'rule':<22} {'state':<10} {'run time':>8}  partition/node",
    ]
    for _, slurm_id, rule in sorted(submitted, key=lambda s: int(s[1])):
        info = details.get(slurm_id, {})
        lines.append(
            f"  {slurm_id:>8}  {rule:<22} {info.get('JobState', '?'):<10} "
            f"{info.get('RunTime', '?'):>8}  {info.get('Partition', '?')}/{info.get('NodeList', '?')}"
        )
    lines += ["", "outputs vs the local quick run (datasets without git_commit; PNGs byte for byte):"]
    for rel, why in diffs.items():
        lines.append(f"  {'identical' if why is None else 'DIFFERENT'}  {rel}")
        if why:
            lines += ["      " + line for line in why.splitlines()[:20]]
    lines += ["", "squeue afterwards: " + ("empty" if not squeue.strip() else "\n" + squeue)]
    lines += [f"note: {note}" for note in notes]
    if run.returncode != 0:
        lines += ["", "snakemake output (tail):", tail(run.stdout, 80)]
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text("\n".join(lines) + "\n")
    print("\n" + REPORT.read_text(), file=sys.stderr)
