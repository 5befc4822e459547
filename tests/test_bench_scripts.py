"""``make bench`` (benchmarks/run.py) names only what the package has: its own imports and the scripts it runs in
fresh interpreters (``REFERENCE``, ``SEARCH``, ``SEARCH_COMMAND``, ``CURTAIL_JOB``) are read here, every module
they import is imported and every ``module.attribute`` they use looked up, and the scripts' undefined names are
listed; and, marked slow (CI runs it, about 4 minutes on 2 cores), the whole bench runs and exits 0, which it does
only where every kernel agrees with its reference. After the package moved into floors the bench failed on
``perfmodel._axis`` (moved to ``model.grid``) and on ``planner`` used without its import, which no test caught
(found 2026-12-07)."""

import ast
import builtins
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "run.py"
SCRIPTS = ("REFERENCE", "SEARCH", "SEARCH_COMMAND", "CURTAIL_JOB")


def _sources() -> dict[str, str]:
    tree = ast.parse(RUN.read_text(encoding="utf-8"))
    out = {"run.py": RUN.read_text(encoding="utf-8")}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in SCRIPTS:
                    out[target.id] = node.value.value
    return out


def _imported_modules(tree) -> dict:
    """Local name -> imported module object, for every trainscale import in ``tree`` (late imports included)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainscale"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                try:
                    names[alias.asname or alias.name] = importlib.import_module(full)
                except ModuleNotFoundError:  # a function or class imported from a module
                    assert hasattr(importlib.import_module(node.module), alias.name), full
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("trainscale"):
                    names[alias.asname or alias.name.split(".")[0]] = importlib.import_module(alias.name)
    return names


def test_the_bench_finds_all_four_scripts():
    assert set(_sources()) == {"run.py", *SCRIPTS}


@pytest.mark.parametrize("name", ["run.py", *SCRIPTS])
def test_every_module_attribute_the_bench_uses_exists(name):
    tree = ast.parse(_sources()[name])
    modules = _imported_modules(tree)
    missing = sorted({f"{node.value.id}.{node.attr}" for node in ast.walk(tree)
                      if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                      and node.value.id in modules and not hasattr(modules[node.value.id], node.attr)})
    assert not missing, missing


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_defines_every_name_it_reads(name):
    """The scripts are flat module code: a name read must be a builtin, imported or assigned in the script."""
    tree = ast.parse(_sources()[name])
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    read = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    assert not read - bound, sorted(read - bound)


@pytest.mark.slow
def test_make_bench_runs_and_every_kernel_agrees_with_its_reference(tmp_path):
    """``make bench``'s script, whole: exit 0 (a kernel that disagrees with its reference fails it), one BENCH line
    per measurement (``BENCH <name> <value> <unit>``), the reference checks among them, nothing left in the repository."""
    root = RUN.parents[1]
    before = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout
    env = dict(os.environ, TMPDIR=str(tmp_path))
    out = subprocess.run([sys.executable, str(RUN)], cwd=root, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line.split() for line in out.stdout.splitlines() if line.startswith("BENCH ")]
    assert len(lines) > 40 and all(len(parts) == 4 for parts in lines)
    values = {parts[1]: float(parts[2]) for parts in lines}
    assert values["grid_reference_max_rel_diff"] <= 1e-9 and values["search_topk_equals_bruteforce"] == 1
    after = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout
    assert after == before
