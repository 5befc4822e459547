"""The package's layers read from its imports: which floor each module is on, what it imports, and the picture
the README and ``docs/layout.md`` show (``tests/test_layers.py`` checks that no import runs up a floor, that no
modules import each other in a circle, and that both pictures are the one drawn here).

A module's floor is its subpackage (:data:`FLOORS`, top first); the root ``trainscale/__init__.py`` imports
nothing at import time (its public names load on first use). Every import counts, a function's late import
too: a late import hides a circle or an upward arrow from the interpreter, not from the design.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "trainscale"
# top first; a floor may import its own floor and any floor below it; kernels and common are both the ground
FLOORS = ("interface", "studies", "workloads", "training", "model", "common", "kernels")
GROUND = ("common", "kernels")
# floors below that a floor still never imports: a study reaches the kernels only through the model's API
NEVER = {"studies": ("kernels",)}
WHAT = {
    "interface": "what users run: CLI, explore widgets, docs/report, verify, papermill engine, workflow outputs",
    "studies": "one module per scaling study: its datasets and paper-vs-ours records; the registry",
    "workloads": "the domain models behind single studies (curtailment, swarm, MPC, pruning, ...)",
    "training": "statistical efficiency: convergence, compression, wall-clock time to a target loss",
    "model": "specs, catalogs, the performance model, pipeline, search, stack rules, calibration, validation",
    "common": "errors, checks, inputs, io, progress, plotting, comparison records, publishing",
    "kernels": "Numba kernels: arrays in, arrays out; no Python objects, no I/O",
}


@dataclass(frozen=True)
class Module:
    name: str  # trainscale.model.perfmodel
    path: Path
    lines: int
    imports: frozenset  # names of the package's modules it imports (anywhere in the file)

    @property
    def floor(self) -> str:
        parts = self.name.split(".")
        return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in FLOORS) else ""


def package_dir() -> Path:
    return Path(__file__).resolve().parents[1]


def _name(root: Path, path: Path) -> str:
    parts = [PACKAGE, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.AST, name: str, is_package: bool, known: set[str]) -> set[str]:
    here = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else (node.module or "")
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def modules(root: Path | None = None) -> dict[str, Module]:
    """Every module of the package (``data/`` scripts aside) with the package modules it imports."""
    root = root or package_dir()
    paths = sorted(p for p in root.rglob("*.py") if "data" not in p.relative_to(root).parts[:1])
    known = {_name(root, p) for p in paths}
    found = {}
    for path in paths:
        name = _name(root, path)
        text = path.read_text(encoding="utf-8")
        imports = _imported(ast.parse(text), name, path.name == "__init__.py", known)
        # a subpackage's __init__ is imported with any of its modules: not an edge of its own
        imports = {i for i in imports if i != PACKAGE and not name.startswith(i + ".")}
        found[name] = Module(name, path, len(text.splitlines()), frozenset(imports))
    return found


def upward_imports(mods: dict[str, Module]) -> list[str]:
    """One line for each import of a higher floor, of the other ground floor, of a floor outside :data:`FLOORS`,
    or of a floor :data:`NEVER` forbids."""
    rank = {f: i for i, f in enumerate(FLOORS)}
    wrong = []
    for mod in mods.values():
        if not mod.floor:
            continue
        for target in sorted(mod.imports):
            other = mods[target].floor
            if other not in rank:
                wrong.append(f"{mod.name} imports {target}, which is on no floor")
            elif other != mod.floor and (rank[other] < rank[mod.floor] or
                                         (mod.floor in GROUND and other in GROUND)):
                wrong.append(f"{mod.name} ({mod.floor}) imports {target} ({other}), a floor above or beside it")
            elif other in NEVER.get(mod.floor, ()):
                wrong.append(f"{mod.name} ({mod.floor}) imports {target}: {mod.floor} never import {other}")
    return wrong


def circles(mods: dict[str, Module]) -> list[list[str]]:
    """Groups of modules that import each other, directly or round a circle (Tarjan's strongly connected
    components of more than one module, or a module importing itself)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(mods[v].imports):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(mods):
        if v not in index:
            visit(v)
    return out


def floor_imports(mods: dict[str, Module]) -> dict[str, list[str]]:
    """For each floor, the other floors its modules import (top first)."""
    result = {}
    for floor in FLOORS:
        below = {mods[t].floor for m in mods.values() if m.floor == floor for t in m.imports}
        result[floor] = [f for f in FLOORS if f in below and f != floor]
    return result


def picture(mods: dict[str, Module] | None = None, whole: bool = False) -> str:
    """The layers as text: two lines per floor (how many modules, the floors they import; what the floor is);
    ``whole`` adds a line per module with the other floors it imports."""
    mods = mods or modules()
    reach = floor_imports(mods)
    lines = []
    for floor in FLOORS:
        members = sorted((m for m in mods.values() if m.floor == floor and not m.name.endswith(f".{floor}")),
                         key=lambda m: m.name)
        arrow = ", ".join(reach[floor]) or "nothing"
        lines.append(f"{floor + '/':<12}{len(members):>3} modules  imports {arrow}")
        lines.append(f"{'':<12}{WHAT[floor]}")
        if whole:
            for m in members:
                floors = sorted({mods[t].floor for t in m.imports if mods[t].floor != floor},
                                key=FLOORS.index)
                short = m.name.split(".", 2)[2]
                lines.append(f"{'':<14}{short:<26}-> {', '.join(floors) or '-'}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m trainscale.interface.layers [--whole]
    import sys

    mods = modules()
    print(picture(mods, whole="--whole" in sys.argv[1:]), end="")
    for problem in upward_imports(mods) + [" <-> ".join(c) for c in circles(mods)]:
        print("problem:", problem)
