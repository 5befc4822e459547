"""The package's layers read from its imports (issue 39): no module imports a higher floor, none imports in a
circle, every module is on a floor, and the pictures in the README and docs/layout.md are the ones the code draws
(``python -m trainscale.interface.layers [--whole]`` prints them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import trainscale
from trainscale.interface import layers

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mods():
    return layers.modules()


def test_no_module_imports_a_higher_floor(mods):
    assert layers.upward_imports(mods) == []


def test_no_modules_import_each_other_in_a_circle(mods):
    assert layers.circles(mods) == []


def test_every_module_is_on_a_floor(mods):
    assert [m.name for m in mods.values() if not m.floor and m.name != "trainscale"] == []
    assert {m.floor for m in mods.values()} - {""} == set(layers.FLOORS)


def test_no_study_imports_the_kernels(mods):
    assert not [(m.name, t) for m in mods.values() if m.floor == "studies" for t in m.imports
                if t.startswith("trainscale.kernels")]


def _package(tmp_path, files: dict) -> Path:
    root = tmp_path / "trainscale"
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_check_finds_an_upward_arrow_a_late_import_and_a_circle(tmp_path):
    root = _package(tmp_path, {
        "model/__init__.py": "", "studies/__init__.py": "", "common/__init__.py": "", "kernels/__init__.py": "",
        "model/a.py": "from . import b\n",
        "model/b.py": "def f():\n    from .a import x  # late: still an arrow\n",
        "common/io.py": "from ..model import a\n",
        "studies/s.py": "from ..kernels import k\n",
        "kernels/k.py": "",
    })
    mods = layers.modules(root)
    assert layers.circles(mods) == [["trainscale.model.a", "trainscale.model.b"]]
    wrong = layers.upward_imports(mods)
    assert any("trainscale.common.io (common) imports trainscale.model.a (model)" in w for w in wrong)
    assert any("trainscale.studies.s (studies) imports trainscale.kernels.k" in w for w in wrong)
    assert len(wrong) == 2


def test_the_readme_and_docs_show_the_layers_the_code_has(mods):
    short, whole = layers.picture(mods), layers.picture(mods, whole=True)
    hint = "regenerate with: python -m trainscale.interface.layers [--whole]"
    assert short in (ROOT / "README.md").read_text(encoding="utf-8"), hint
    assert whole in (ROOT / "docs" / "layout.md").read_text(encoding="utf-8"), hint + " --whole"


def test_the_module_prints_the_picture_and_no_problem():
    out = subprocess.run([sys.executable, "-m", "trainscale.interface.layers"], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert out == layers.picture() and "problem" not in out


def test_the_public_api_loads_on_first_use():
    from trainscale.model import perfmodel, specs

    assert trainscale.predict is perfmodel.predict and trainscale.search.__module__ == "trainscale.model.planner"
    assert trainscale.PlanSpec is specs.PlanSpec and set(trainscale.__all__) <= set(dir(trainscale))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        trainscale.nothing  # noqa: B018


@pytest.mark.parametrize("old, new", [("perfmodel", "trainscale.model.perfmodel"),
                                      ("io", "trainscale.common.io"), ("cli", "trainscale.interface.cli")])
def test_an_old_flat_path_imports_the_moved_module_with_a_warning(old, new):
    """In a fresh interpreter (the alias stays in sys.modules): the old path is the moved module, with a warning
    naming its new place, and the module keeps its own spec, so its relative imports raise no ImportWarning
    (``__package__ != __spec__.parent``, an error under -W error; the loader let the alias's spec stay until
    the seventh stop)."""
    code = f"""
import importlib, warnings
import trainscale
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    module = importlib.import_module("trainscale.{old}")
    attr = getattr(trainscale, "{old}")
assert module is importlib.import_module("{new}") and attr is module
assert module.__spec__.name == "{new}" and module.__package__ == module.__spec__.parent, module.__spec__
print([str(w.message) for w in caught if w.category is DeprecationWarning][:1])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == str([f"trainscale.{old} moved to {new}; import it from there"])


def test_no_file_of_the_package_is_over_600_lines(mods):
    """Issue 39: a file past about 500 lines holds more than one idea; none may pass 600."""
    lines = {m.path: m.lines for m in mods.values()}  # counted when the imports were read
    lines.update((p, len(p.read_text(encoding="utf-8").splitlines()))
                 for p in layers.package_dir().joinpath("data").rglob("*.py"))  # scripts beside the catalogs
    assert {str(p.relative_to(ROOT)): n for p, n in lines.items() if n > 600} == {}
