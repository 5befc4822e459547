"""How the workflow keeps committed outputs safe and knows when they are stale.

Two rules, used by ``workflow/rules/studies.smk`` and tested in ``tests/test_workflow_safety.py``:

**Nothing is lost.** A study's notebook writes into a staging folder (``results/<mode>/staging/<study>/``);
only when the notebook, its published copy and its fingerprint are all there does :func:`install` move them
into ``figures/<study>/`` (one ``os.replace`` per file, each file whole). A job that fails, is cancelled, is
killed or is never submitted (a SLURM submission refused) leaves the committed files as they were; the rule's
outputs are also flagged ``update`` so that Snakemake neither deletes them before the job runs nor "cleans
them up" after a failure (it backs them up and restores them instead).

**A study reruns when what it is made from changes, not when git wrote its files in another order.** Its
*fingerprint* (:func:`study_fingerprint`) is the SHA-256 of the contents of the files its outputs are computed
from — its notebook, the package modules the notebook and the study's module import (transitively), the
package's catalogs (``data/*.yaml``, ``*.csv``), ``requirements.txt`` (the pinned libraries draw the bytes)
and the CSV files of its input folders — and of its parameters for the mode. A successful job writes the
fingerprint beside its outputs (``figures/<study>/inputs.json``, committed with them). Before each run,
:func:`sync_fingerprint` writes the current fingerprint to ``results/<mode>/fingerprints/<study>.json``, the
rule's only tracked input besides the notebook, and sets that file's modification time to 0 where it equals
the committed one (the outputs are current: nothing to do, also on a fresh clone) and to now where it differs
(Snakemake's ordinary mtime rule then reruns the study, saying "updated input files: ...fingerprints/...").
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Iterable, Mapping, Sequence

__all__ = ["FINGERPRINT_FILE", "package_modules_imported", "study_input_files", "study_fingerprint",
           "sync_fingerprint", "is_current", "install", "InstallError"]

FINGERPRINT_FILE = "inputs.json"
PACKAGE = "trainscale"


class InstallError(RuntimeError):
    """A staged output is missing: nothing was installed."""


def _module_file(package_dir: Path, module: str) -> Path | None:
    """``trainscale.a.b`` -> ``<package_dir>/a/b.py`` or ``.../a/b/__init__.py`` (None if neither exists)."""
    parts = module.split(".")[1:]
    base = package_dir.joinpath(*parts)
    for candidate in (base.with_suffix(".py") if parts else None, base / "__init__.py"):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def _module_name(package_dir: Path, path: Path) -> str:
    rel = path.relative_to(package_dir).with_suffix("")
    parts = [PACKAGE, *rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_of(source: str, module: str, is_package: bool) -> set[str]:
    """Names of the ``trainscale`` modules a source imports (anywhere in the file), absolute or relative.
    ``from X import a`` yields both ``X`` and ``X.a`` (a may be a module); callers keep those that exist."""
    found: set[str] = set()
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PACKAGE:
                continue
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def package_modules_imported(package_dir: str | os.PathLike, roots: Iterable[str],
                             extra_sources: Iterable[str] = ()) -> list[Path]:
    """The package's source files that ``roots`` (module names) and ``extra_sources`` (code, e.g. a
    notebook's cells) import, transitively, with the ``__init__.py`` of every package on the way."""
    package_dir = Path(package_dir)
    pending = set(roots) | {PACKAGE}
    for source in extra_sources:
        pending |= _imports_of(source, "__main__", False)
    seen: dict[str, Path] = {}
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        path = _module_file(package_dir, module)
        if path is None:
            continue
        seen[module] = path
        parts = module.split(".")
        pending.update(".".join(parts[:i]) for i in range(1, len(parts)))
        pending |= _imports_of(path.read_text(encoding="utf-8"), module, path.name == "__init__.py")
    return sorted(set(seen.values()))


def _notebook_code(notebook: Path) -> list[str]:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    sources = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
               for c in cells if c["cell_type"] == "code"]
    return [s for s in (_without_magics(src) for src in sources) if s is not None]


def _without_magics(source: str) -> str | None:
    text = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    try:
        ast.parse(text)
    except SyntaxError:
        return None
    return text


def study_input_files(root: str | os.PathLike, study: str, notebook: str | os.PathLike,
                      input_folder_files: Iterable[str | os.PathLike] = ()) -> list[Path]:
    """Every file a study's outputs are computed from (see the module docstring), relative to ``root``."""
    root = Path(root)
    package_dir = root / "pkg" / PACKAGE
    notebook = root / notebook
    module = f"{PACKAGE}.studies.{study.replace('-', '_')}"
    modules = package_modules_imported(package_dir, [module], _notebook_code(notebook))
    catalogs = [p for p in (package_dir / "data").rglob("*") if p.is_file() and p.suffix in {".yaml", ".csv"}]
    files = {*modules, *catalogs, notebook, root / "requirements.txt", *(root / f for f in input_folder_files)}
    return sorted(p.relative_to(root) if p.is_relative_to(root) else p for p in files if p.is_file())


def study_fingerprint(root: str | os.PathLike, files: Sequence[str | os.PathLike],
                      parameters: Mapping) -> dict:
    """``{"sha256": ..., "parameters": ..., "files": {path: sha256}}`` of the files (relative to ``root``)
    and the parameters; ``sha256`` covers both, so it changes when any of them does."""
    root = Path(root)
    per_file = {Path(f).as_posix(): hashlib.sha256((root / f).read_bytes()).hexdigest() for f in sorted(files)}
    params = json.dumps(dict(parameters), sort_keys=True, default=str)
    digest = hashlib.sha256(json.dumps([per_file, params], sort_keys=True).encode()).hexdigest()
    return {"sha256": digest, "parameters": json.loads(params), "files": per_file}


def _text(fingerprint: Mapping) -> str:
    return json.dumps(fingerprint, indent=1, sort_keys=True) + "\n"


def _read_sha(path: Path) -> str | None:
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("sha256")
    except (OSError, ValueError, AttributeError):
        return None


def is_current(fingerprint: Mapping, committed: str | os.PathLike) -> bool:
    """Whether the outputs beside ``committed`` (their ``inputs.json``) were made from this fingerprint."""
    return _read_sha(Path(committed)) == fingerprint["sha256"]


def sync_fingerprint(path: str | os.PathLike, fingerprint: Mapping, committed: str | os.PathLike) -> bool:
    """Write ``fingerprint`` to ``path`` if its content differs, and set its modification time: 0 where the
    committed outputs were made from it (not stale), now where they were not (stale), at every call: Snakemake
    touches the ``update()`` outputs of a failed job, so a stale fingerprint dated once would look older than the
    outputs it never made, and the next run would skip the study. Returns stale."""
    path = Path(path)
    stale = not is_current(fingerprint, committed)
    text = _text(fingerprint)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        if not stale:
            os.utime(path, (0, 0))
    elif stale:
        now = time.time()
        os.utime(path, (now, now))
    elif not stale and path.stat().st_mtime != 0:
        os.utime(path, (0, 0))
    return stale


def forget_recorded_outputs(paths: Sequence[str], snakemake_dir: str | os.PathLike = ".snakemake") -> list[Path]:
    """Delete Snakemake's metadata records of ``paths`` (outputs of a stale study): the records it keeps in
    ``.snakemake/metadata`` (file persistence, one file per output named by its urlsafe base64, split into
    254-character parts; snakemake/persistence/file.py ``_record_path``) hold the input checksums of the last
    job, and Snakemake reruns nothing whose input checksums match, however new the input; a failed job's kept
    outputs are recorded so too. Without them the fingerprint's date decides. Returns the records deleted."""
    deleted = []
    metadata = Path(snakemake_dir) / "metadata"
    for path in paths:
        b64 = base64.urlsafe_b64encode(str(path).encode()).decode()
        parts = [b64[i:i + 254] for i in range(0, len(b64), 254)]
        record = metadata.joinpath(*(["@" + part for part in parts[:-1]] + [parts[-1]]))
        if record.is_file():
            record.unlink()
            deleted.append(record)
    return deleted


def install(staging: str | os.PathLike, destination: str | os.PathLike, names: Sequence[str]) -> list[Path]:
    """Move ``names`` from ``staging`` into ``destination`` once all of them are there (else InstallError and
    nothing moves); each file by ``os.replace`` (a copy then a replace across filesystems), so a reader
    never sees half a file. The staging folder is removed afterwards."""
    staging, destination = Path(staging), Path(destination)
    missing = [n for n in names if not (staging / n).is_file()]
    if missing:
        raise InstallError(f"staged outputs missing in {staging}: {', '.join(missing)} (nothing installed; "
                           f"{destination} is unchanged)")
    destination.mkdir(parents=True, exist_ok=True)
    installed = []
    for name in names:
        target = destination / name
        try:
            os.replace(staging / name, target)
        except OSError:  # another filesystem: copy beside the target, then replace
            tmp = target.with_name(f".{name}.{os.getpid()}.tmp")
            shutil.copyfile(staging / name, tmp)
            os.replace(tmp, target)
        installed.append(target)
    shutil.rmtree(staging, ignore_errors=True)
    return installed
