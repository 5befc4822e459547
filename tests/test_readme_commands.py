"""Every shell command in README.md and the docs' pages (docs/*.md) works when copy-pasted from the repository root.

The test reads every ```bash block of README.md and docs/*.md (backslash continuations joined, comments after
` #` and blank lines dropped) and compares the commands with COMMANDS below, an explicit table:
each README command is either run here (`Run`: from the repository root, the venv's bin first on
PATH as after `source .venv/bin/activate`, exit status 0, output checked) or listed as not run
here with the reason (`NotRun`; where a cheap stand-in exists, e.g. a dry run, that is run
instead). A command missing from the table, or a table entry no longer in the README or a docs page,
fails the test, so the pages and this file cannot drift apart.
"""

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml

from conftest import BIN_DIR, REPO_ROOT

README = REPO_ROOT / "README.md"
DOC_PAGES = (README, *sorted((REPO_ROOT / "docs").glob("*.md")))
EXAMPLES = REPO_ROOT / "examples"
SHELL_FENCES = ("bash", "sh", "shell", "console")


# ----------------------------------------------------------------------------- README parsing

def _strip_comment(line):
    """`line` without a trailing shell comment (a `#` after whitespace, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def readme_commands(text):
    """The commands of every shell block of `text`, in order, each as one line (as typed)."""
    commands, block, pending = [], None, ""
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if block is None:
            if stripped.startswith("```") and stripped[3:].strip().lower() in SHELL_FENCES:
                block = lineno
            continue
        if stripped.startswith("```"):
            assert not pending, f"README.md:{block}: shell block ends inside a continued line"
            block = None
            continue
        line = _strip_comment(line)
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        command = (pending + line.strip()).strip()
        pending = ""
        if command:
            commands.append(command)
    assert block is None, f"README.md:{block}: shell block never closed"
    return commands


def normalise(command):
    return " ".join(command.split())


# ----------------------------------------------------------------------------- the table

@dataclass(frozen=True)
class Run:
    """Run the command as it is; `check(output)` asserts on stdout + stderr beyond exit 0."""

    check: Callable[[str], None]
    timeout_s: int = 300
    slow: bool = False
    before: Callable[[], None] | None = None  # e.g. remove the outputs the command will write


@dataclass(frozen=True)
class NotRun:
    """Not run here, because `reason`; `stand_in` (a shell command), when given, is run instead."""

    reason: str
    stand_in: str | None = None


def _check_predict_json(out):
    runs = yaml.safe_load((EXAMPLES / "runs.yaml").read_text())["runs"]
    got = json.loads(out)
    assert [r["id"] for r in got] == [r["id"] for r in runs]
    for r in got:
        assert r["fits"] is True, r
        assert r["step_time_s"] > 0 and r["tokens_per_s"] > 0, r
        assert 0 < r["mfu"] < 1, r
        assert 0 < r["memory_gib_per_gpu"] < 80, r
    # the override halves the scale-out bandwidth: never faster than the catalog system
    by_id = {r["id"]: r for r in got}
    assert by_id["gpt3-half-scale-out"]["step_time_s"] >= by_id["gpt3-on-selene"]["step_time_s"]


def _check_search(out):
    assert "gpt3-175b on 4096 GPUs of dgx-a100-80gb, global batch 1536 sequences, stack megatron" in out
    m = re.search(r"plans evaluated: (\d+), feasible: (\d+)", out)
    assert m and int(m.group(2)) > 0, out[:2000]
    assert re.search(r"^\s+1\s+\d+\s+\d+", out, re.M), "no plan ranked 1:\n" + out[:2000]


def _check_search_space(out):
    assert re.search(r"^micro_batch \(20\): 1 2 3 4 6 8 ", out, re.M), out
    assert "space: 41,395,200 plans" in out, out


def _check_search_fixed(out):
    got = json.loads(out)
    assert got["fixed"] == {"tp": 8, "pp": 12} and got["searched"] == ["interleave", "micro_batch", "recompute"]
    assert got["best"], got
    for entry in got["best"]:
        assert entry["plan"]["tp"] == 8 and entry["plan"]["pp"] == 12 and entry["plan"]["dp"] == 4
        assert {"step_time_s", "mfu", "memory_gib_per_gpu", "breakdown", "memory_breakdown_gib"} <= set(entry)
        assert entry["fits"] is True


def _check_scale(out):
    import xarray as xr

    rows = re.findall(r"^\s*(\d+)\s+tp\d+ pp\d+ .*$", out, re.M)
    assert rows == ["64", "128", "256", "512"], out
    assert "(baseline)" in out and "wrote results/scale.nc" in out, out
    with xr.open_dataset(REPO_ROOT / "results" / "scale.nc") as ds:
        assert ds["gpus"].values.tolist() == [64, 128, 256, 512] and bool(ds["has_plan"].all())
        assert all(ds[name].attrs.get("units") for name in ds.data_vars)


def _clear_scale():
    (REPO_ROOT / "results" / "scale.nc").unlink(missing_ok=True)


def _check_plan(out):
    assert "llama2-70b on 16 x dgx-a100-80gb (a100), 16 x dgx-v100 (v100), global batch 256" in out
    m = re.search(r"step ([\d.]+) s", out)
    assert m and float(m.group(1)) > 0, out
    stage_rows = re.findall(r"^\s*\d+\s+(a100|v100)\s+(\d+)\s", out, re.M)
    assert stage_rows, out
    layers = sum(int(n) for _, n in stage_rows)
    assert layers == 80, f"llama2-70b has 80 layers, the stages hold {layers}:\n{out}"


def _check_plan_cluster(out):
    rows = re.findall(r"^(\*?)\s+(64|128|256)\s+\d+\s+\d+\s+\d+", out, re.M)
    assert [gpus for _, gpus in rows] == ["64", "128", "256"], out
    assert any(mark == "*" for mark, _ in rows), "no size on the Pareto front:\n" + out


def _summary_rows(out):
    return {m.group(1): m.group(0) for m in re.finditer(r"^([a-z]+-[a-z]+|published)\s+\d+\s+(yes|no).*$", out, re.M)}


def _check_validate(out):
    rows = _summary_rows(out)
    for name in ("published", "vtrain-multi", "nemo-hopper", "nemo-blackwell", "fsdp-hopper", "megatron-hopper"):
        assert name in rows, f"{name} missing from the summary:\n{out[-3000:]}"
    assert "vtrain-single" in rows and " yes " in rows["vtrain-single"], out[-3000:]  # fitted: in the summary
    assert not re.search(r"^vtrain-single-\d+ ", out, re.M)  # but its 1,440 runs only with --all


def _check_validate_all(out):
    rows = _summary_rows(out)
    assert "fsdp-compiled" in rows and "no (held out)" in rows["fsdp-compiled"], out[-3000:]
    assert re.search(r"^vtrain-single-1439 ", out, re.M), out[-3000:]


def _check_validate_searched(out):
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^([a-z]+-[a-z]+|published)\s+\d+\s+[\d.]+\s.*$", out, re.M)}
    for name in ("published", "megatron-hopper", "nemo-hopper"):
        assert name in rows, f"{name} missing from the summary:\n{out[-3000:]}"
    assert re.search(r"^meglm-h100-ws-70b\s+megatron-hopper\s", out, re.M), out[-3000:]


def _check_systems(out):
    for name in ("dgx-v100", "dgx-a100-80gb", "dgx-h100", "dgx-h200"):  # those the examples use
        assert re.search(rf"^{re.escape(name)}\s", out, re.M), f"{name} not listed:\n{out}"


def _check_system_fields(out):
    # the fields the README and examples/runs.yaml override
    for field in ("scale_out_GBps_per_gpu", "scale_out_leaf_gpus", "scale_out_oversubscription",
                  "scale_out_hop_latency_s"):
        assert re.search(rf"^{field}\s", out, re.M), f"{field} not listed:\n{out}"


def _check_models(out):
    for name in ("gpt3-175b", "llama2-70b", "llama2-7b"):
        assert re.search(rf"^{re.escape(name)}\s", out, re.M), f"{name} not listed:\n{out}"


PAPERMILL_DIR = REPO_ROOT / "results" / "papermill"


def _clear_papermill():
    (PAPERMILL_DIR / "hs-h200.ipynb").unlink(missing_ok=True)
    shutil.rmtree(PAPERMILL_DIR / "hs-h200", ignore_errors=True)


def _check_papermill(out):
    import nbformat
    import xarray as xr

    nb = nbformat.read(PAPERMILL_DIR / "hs-h200.ipynb", as_version=4)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, errors
    with xr.open_dataset(PAPERMILL_DIR / "hs-h200" / "hardware_scaling.nc") as ds:
        assert set(ds["system"].values.tolist()) == {"dgx-h100", "dgx-h200"}
        assert ds["model"].values.tolist() == ["llama2-70b"]
    assert list((PAPERMILL_DIR / "hs-h200").glob("*.png")), "no figure written"


SLURM_REASON = ("needs a SLURM cluster; tests/test_slurm.py runs the profile on one "
                "(CI: .ci/slurm-up); here a dry run (-n) checks the command line and profile")

def _check_search_precisions(out):
    lines = out.splitlines()
    assert lines[0].endswith("; precisions bf16, fp8 (recipe current), ranked together"), lines[0]
    assert re.search(r"^\s+1\s+\d+\s+\d+.*\sfp8\s+current\s", out, re.M), out[:3000]


COMMANDS = {
    # ## The two commands
    "make figures": NotRun(
        "runs every study in full mode (far longer than a test may take); tests/test_workflow.py "
        "runs the same Snakefile in quick mode; here `make -n` checks the target",
        stand_in="make -n figures"),
    "make test": NotRun(
        "runs the whole test suite, this file included (minutes); here `make -n` checks the target",
        stand_in="make -n test"),
    # ## Documentation
    "make docs": NotRun(
        "builds the whole site (20-60 s); tests/test_docs.py builds it and checks every page in Chromium "
        "(slow); here `make -n` checks the target",
        stand_in="make -n docs"),
    # ## The command line
    "trainscale predict examples/runs.yaml --json": Run(_check_predict_json),
    "trainscale search --model gpt3-175b --system dgx-a100-80gb --gpus 4096 --global-batch 1536":
        Run(_check_search),
    "trainscale search --model gpt3-175b --system dgx-a100-80gb --gpus 64 --global-batch 1536 --space":
        Run(_check_search_space),
    "trainscale plan examples/cluster.yaml --model llama2-70b --global-batch 256": Run(_check_plan),
    "trainscale scale --model llama2-7b --system dgx-h100 --gpus 64..512 --global-batch 512 --out results/scale.nc":
        Run(_check_scale, before=_clear_scale),
    "trainscale search --model gpt3-175b --system dgx-a100-80gb --gpus 384 --global-batch 1536 --fix tp=8 "
    "pp=12 --search interleave micro_batch recompute --json": Run(_check_search_fixed),
    "trainscale search --model llama3-70b --system dgx-h100 --gpus 64 --global-batch 128 --precision bf16,fp8 "
    "--top 3": Run(_check_search_precisions),
    "trainscale plan-cluster --model llama2-7b --system dgx-h100 --gpus 64,128,256 --tokens 2e12 --global-batch 512":
        Run(_check_plan_cluster),
    "trainscale validate": Run(_check_validate),
    # slow (9 s under make test; CI runs it): the default run prices the same runs for `trainscale validate`
    "trainscale validate --all": Run(_check_validate_all, slow=True),
    # slow (8 s; CI runs it): the default run checks the same command's table in
    # tests/test_searched_knobs.py::test_validate_prints_the_searched_runs
    "trainscale validate --search-unpublished": Run(_check_validate_searched, slow=True),
    "trainscale calibrate": NotRun(
        "a refit of ~190 runs (20-60 s); tests/test_cli.py::test_calibrate_without_write runs it (slow)"),
    "trainscale systems": Run(_check_systems),
    "trainscale systems --fields": Run(_check_system_fields),
    "trainscale models": Run(_check_models),
    # ## Explore in JupyterLab
    "make lab": NotRun(
        "starts a JupyterLab server that runs until stopped; here `make -n` checks the target",
        stand_in="make -n lab"),
    # ## Sweep with papermill
    "mkdir -p results/papermill && .venv/bin/papermill --engine trainscale -k python3 notebooks/hardware-scaling.ipynb "
    "results/papermill/hs-h200.ipynb -p output_dir results/papermill/hs-h200 "
    "-y '{systems: [dgx-h100, dgx-h200], models: [llama2-70b]}'":
        # slow (11 s; CI runs it): the quick workflow's fixture runs every notebook through the same
        # papermill engine with parameters, in the default run
        Run(_check_papermill, before=_clear_papermill, slow=True),
    # ## Run on a SLURM cluster
    'PATH="$PWD/.venv/bin:$PATH" snakemake --workflow-profile workflow/profiles/slurm': NotRun(
        SLURM_REASON,
        stand_in='PATH="$PWD/.venv/bin:$PATH" snakemake --workflow-profile workflow/profiles/slurm -n'),
    'PATH="$PWD/.venv/bin:$PATH" snakemake --workflow-profile workflow/profiles/slurm --config mode=quick':
        NotRun(SLURM_REASON, stand_in='PATH="$PWD/.venv/bin:$PATH" snakemake --workflow-profile '
                                      'workflow/profiles/slurm --config mode=quick -n'),
    'PATH="$PWD/.venv/bin:$PATH" snakemake --workflow-profile workflow/profiles/slurm sweeps': NotRun(
        SLURM_REASON,
        stand_in='PATH="$PWD/.venv/bin:$PATH" snakemake --workflow-profile workflow/profiles/slurm '
                 'sweeps -n'),
    "snakemake --workflow-profile workflow/profiles/slurm --default-resources slurm_partition=compute "
    "slurm_account=myproject mem_mb=1000 runtime=30": NotRun(
        SLURM_REASON,
        stand_in="snakemake --workflow-profile workflow/profiles/slurm --default-resources "
                 "slurm_partition=compute slurm_account=myproject mem_mb=1000 runtime=30 -n"),
    ".ci/slurm-up && .venv/bin/python -m pytest tests/test_slurm.py -s; .ci/slurm-down": NotRun(
        "needs root: installs slurm-wlm and munge, replaces /etc/slurm/slurm.conf and starts "
        "daemons (CI runs it); here the scripts' syntax is checked",
        stand_in="bash -n .ci/slurm-up && bash -n .ci/slurm-down && test -x .ci/slurm-up "
                 "&& test -x .ci/slurm-down && test -f tests/test_slurm.py"),
}


# ----------------------------------------------------------------------------- running

def shell_env():
    """The environment of a shell after `source .venv/bin/activate` (venv's bin first on PATH)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(BIN_DIR), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(BIN_DIR.parent)
    env.pop("PYTHONHOME", None)
    # share the Numba cache with the rest of the suite (as `make` does); does not change results
    env.setdefault("NUMBA_CACHE_DIR", str(REPO_ROOT / ".numba_cache"))
    return env


def run_shell(command, timeout_s):
    proc = subprocess.run(["bash", "-c", command], cwd=REPO_ROOT, env=shell_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout_s, check=False)
    assert proc.returncode == 0, (
        f"`{command}` exited {proc.returncode}\n--- stdout (tail)\n{proc.stdout[-3000:]}"
        f"\n--- stderr (tail)\n{proc.stderr[-3000:]}")
    return proc


def _readme_raw_commands():
    """README and docs commands keyed by their normalised form (as in COMMANDS), value as typed."""
    return {normalise(c): c for page in DOC_PAGES for c in readme_commands(page.read_text(encoding="utf-8"))}


def _params(kind):
    out = []
    for command, spec in COMMANDS.items():
        if not isinstance(spec, kind):
            continue
        marks = [pytest.mark.slow] if getattr(spec, "slow", False) else []
        if "snakemake" in " ".join((command, getattr(spec, "stand_in", "") or "")):
            marks.append(pytest.mark.workflow)  # runs Snakemake (or a dry run of it): make test-all's, not make test's
        out.append(pytest.param(command, spec, id=command[:60], marks=marks))
    return out


# ----------------------------------------------------------------------------- tests

def test_parser():
    text = "\n".join([
        "```bash", "make a   # comment", "", "# only a comment", "cmd --x \\", "    --y 'a # b' # c",
        "```", "```python", "not = 'a command'", "```", "```yaml", "k: v", "```",
        "```sh", "echo \"x #y\"", "```"])
    assert readme_commands(text) == ["make a", "cmd --x --y 'a # b'", 'echo "x #y"']


def test_every_readme_command_is_in_the_table():
    readme = list(_readme_raw_commands())
    assert readme, "no ```bash block found in README.md"
    missing = [c for c in readme if c not in COMMANDS]
    stale = [c for c in COMMANDS if c not in readme]
    assert not missing, ("README or docs commands not in tests/test_readme_commands.py COMMANDS (add each "
                         "as Run(...) or NotRun(reason)):\n  " + "\n  ".join(missing))
    assert not stale, ("COMMANDS entries no longer in README.md or docs/*.md (remove or update them):\n  "
                       + "\n  ".join(stale))


def test_not_run_commands_give_a_reason():
    for command, spec in COMMANDS.items():
        if isinstance(spec, NotRun):
            assert len(spec.reason.split()) >= 3, f"`{command}`: say why it is not run"


def test_examples_are_documented_and_used():
    readme = "\n".join(page.read_text(encoding="utf-8") for page in DOC_PAGES)
    files = sorted(p for p in EXAMPLES.iterdir() if p.is_file())
    assert files, "examples/ is empty"
    for path in files:
        rel = path.relative_to(REPO_ROOT).as_posix()
        assert rel in readme, f"{rel} is not used by any README or docs command"
        first = path.read_text(encoding="utf-8").lstrip().splitlines()[0]
        assert first.startswith("#"), f"{rel} has no comment header saying what it is"


@pytest.mark.parametrize("command, spec", _params(Run))
def test_readme_command_runs(command, spec):
    raw = _readme_raw_commands().get(command)
    if raw is None:
        pytest.fail(f"`{command}` is not in README.md or docs/*.md (see test_every_readme_command_is_in_the_table)")
    if spec.before:
        spec.before()
    proc = run_shell(raw, spec.timeout_s)
    output = proc.stdout + proc.stderr
    assert output.strip(), f"`{command}` printed nothing"
    spec.check(proc.stdout if proc.stdout.strip() else output)


@pytest.mark.parametrize("command, spec", [p for p in _params(NotRun) if p.values[1].stand_in])
def test_readme_command_stand_in(command, spec):
    run_shell(spec.stand_in, 120)
