"""Reproducible, atomic output: datasets (.nc), figures (.png) and their provenance.

Every file a study writes goes through this module, so that rerunning a study with the same code
and parameters rewrites byte-identical files (no wall-clock time anywhere), and an interrupted
write never leaves a half-written file under the final name.

Determinism notes (checked by ``tests/test_io.py``):

- netCDF: written with the ``h5netcdf`` engine (netCDF4/HDF5 format). HDF5 can store object
  modification times, but h5py creates files and datasets with ``track_times=False`` by default,
  and h5netcdf writes only version strings into ``_NCProperties``; with the pinned versions two
  writes of the same Dataset are byte-identical, so no fallback to netCDF3 (``scipy``) is needed.
  Boolean variables are stored by xarray as ``int8`` with a ``dtype: bool`` attribute and decoded
  back to ``bool`` on read. Attributes cannot be ``bool`` or ``None`` in netCDF: ``write_dataset``
  stores a bool attribute as an ``int8`` 0/1 (equal to the bool under ``==``) and ``None`` as the
  string ``"none"``.
- PNG: matplotlib's Agg writer adds no timestamp; the only varying metadata is the ``Software``
  text chunk (the matplotlib version), which ``save_figure`` removes.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

__all__ = ["provenance", "git_commit", "write_dataset", "read_dataset", "reading_once", "save_figure",
           "remove_stale_temporaries"]

NETCDF_ENGINE = "h5netcdf"

# What no figure is computed from: the workflow's own outputs, and the prose, tests, benchmarks and CI
# scripts around the code. Their changes neither make the code "dirty" nor move the provenance, so a
# commit that only edits the README or a test does not make the committed figures stale.
_OUTPUT_PATHSPECS = tuple(f":(exclude){path}" for path in (
    "figures", "README.md", "CITATION.cff", "LICENSE", "tests", "benchmarks", ".ci"))


def _package_version() -> str:
    try:
        import trainscale

        version = getattr(trainscale, "__version__", None)
        if version:
            return str(version)
    except ImportError:  # pragma: no cover - we are inside the package
        pass
    try:
        from importlib.metadata import PackageNotFoundError, version as dist_version

        return dist_version("trainscale")
    except (ImportError, PackageNotFoundError):
        return "unknown"


def _git(args: list[str], cwd: Path) -> str | None:
    """Output of ``git <args>`` in ``cwd``, or None if git is absent or the command fails."""
    git = shutil.which("git")
    if git is None:
        return None
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0", LC_ALL="C")  # status must not write the index
    try:
        proc = subprocess.run(
            [git, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout


def git_commit(path: str | os.PathLike | None = None) -> str:
    """The last commit that changed what the outputs are computed from, in the git repository
    holding ``path`` (default: this package).

    That is the newest commit touching anything the outputs are computed from (everything but the
    ``figures/`` outputs and the README, citation, licence, tests, benchmarks and CI scripts), not
    HEAD: a commit that only adds regenerated figures, or edits the prose or a test, does not change
    the provenance, so regenerating the figures from a fresh checkout writes the same bytes. Returns ``"unknown"`` when git is not installed,
    the package is not in a repository, or the repository has no commit yet. Appends ``"-dirty"``
    when the working tree has changes to those inputs. Never raises.
    """
    where = Path(path) if path is not None else Path(__file__).resolve().parent
    if where.is_file():
        where = where.parent
    top = _toplevel(where)
    head = _git(["log", "-1", "--format=%H", "--", ".", *_OUTPUT_PATHSPECS], top)
    commit = head.strip() if head and head.strip() else "unknown"
    if _git(["rev-parse", "--is-inside-work-tree"], where) is None:
        return commit
    status = _git(["status", "--porcelain", "--", ".", *_OUTPUT_PATHSPECS], _toplevel(where))
    if status is not None and status.strip():
        commit += "-dirty"
    return commit


def _toplevel(where: Path) -> Path:
    top = _git(["rev-parse", "--show-toplevel"], where)
    return Path(top.strip()) if top and top.strip() else where


def provenance(parameters: Mapping[str, Any], seed: int | None = None) -> dict[str, Any]:
    """Provenance attributes for a Dataset built from ``parameters``.

    ``parameters`` must be JSON-serialisable (numpy scalars and arrays are converted); it is
    stored as a JSON string with sorted keys. ``seed`` is stored as an int, or ``"none"`` when
    the computation is not random (netCDF attributes cannot hold None). No timestamps.
    """
    return {
        "trainscale_version": _package_version(),
        "git_commit": git_commit(),
        "parameters": json.dumps(dict(parameters), sort_keys=True, default=_json_default),
        "seed": "none" if seed is None else int(seed),
    }


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (Path, os.PathLike)):
        return os.fspath(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"provenance parameter of type {type(obj).__name__} is not JSON-serialisable")


def _netcdf_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in attrs.items():
        if value is None:
            value = "none"
        elif isinstance(value, (bool, np.bool_)):
            value = np.int8(value)
        out[key] = value
    return out


def _for_netcdf(ds: xr.Dataset) -> xr.Dataset:
    """A shallow copy of ``ds`` whose attributes netCDF can store (see module docstring)."""
    ds = ds.copy(deep=False)
    ds.attrs = _netcdf_attrs(ds.attrs)
    for name in ds.variables:
        ds[name].attrs = _netcdf_attrs(ds[name].attrs)
    return ds


STALE_FOREIGN_TMP_S = 24 * 3600  # a temporary file of another host is stale after a day


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):  # exists (another user's), or cannot tell: keep its file
        return True
    return True


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Remove temporary files that an interrupted write of ``path`` left next to it; return them.

    Writes go to ``.<name>.<host>.<pid>.<random>.tmp`` and are moved into place; a process killed
    mid-write (SIGKILL, a node lost) leaves its file behind. A leftover is stale when its process is
    gone (same host), when it is older than a day (another host: a shared file system), or when it has
    the older name without host and pid. A live writer's file is never touched.
    """
    path = Path(path)
    host = socket.gethostname().replace(".", "_")
    removed = []
    try:
        candidates = list(path.parent.glob(f".{glob.escape(path.name)}.*.tmp"))
    except OSError:
        return removed
    for tmp in candidates:
        middle = tmp.name[len(path.name) + 2: -len(".tmp")].split(".")
        try:
            if len(middle) == 3 and middle[1].isdigit():
                if middle[0] == host:
                    stale = not _pid_alive(int(middle[1]))
                else:
                    stale = time.time() - tmp.stat().st_mtime > STALE_FOREIGN_TMP_S
            else:  # the name mkstemp gave before host and pid were in it
                stale = len(middle) == 1
            if stale:
                tmp.unlink()
                removed.append(tmp)
        except (OSError, ValueError):
            continue
    return removed


def _atomic_target(path: str | os.PathLike) -> tuple[Path, Path]:
    """Create the parent folder and an empty temporary file next to ``path`` (named after this host
    and process, so that the next write can remove it if this process is killed before the move)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    host = socket.gethostname().replace(".", "_")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{host}.{os.getpid()}.", suffix=".tmp")
    os.close(fd)
    # mkstemp creates the file 0600; give the final file the usual permissions (umask applied).
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    return path, Path(tmp)


def write_dataset(ds: xr.Dataset, path: str | os.PathLike) -> Path:
    """Write ``ds`` to ``path`` (netCDF4 via h5netcdf), atomically and byte-reproducibly.

    The file is written to a temporary name in the same folder and moved into place with
    ``os.replace``; parent folders are created. On any error the temporary file is removed and
    an existing file at ``path`` is left untouched. Returns the path.
    """
    path, tmp = _atomic_target(path)
    try:
        _for_netcdf(ds).to_netcdf(tmp, mode="w", engine=NETCDF_ENGINE)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


#: inside :func:`reading_once`: the Datasets read so far, by file (path, inode, modification time, size)
_read_once: dict | None = None


def read_dataset(path: str | os.PathLike) -> xr.Dataset:
    """Read a Dataset written by :func:`write_dataset`, fully loaded, with the file closed (inside
    :func:`reading_once`, a file already read is not read again: a deep copy of what it held is returned)."""
    if _read_once is None:
        return _read_netcdf(path)
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_ino, stat.st_mtime_ns, stat.st_size)
    if key not in _read_once:
        _read_once[key] = _read_netcdf(path)
    return _read_once[key].copy(deep=True)


def _read_netcdf(path: str | os.PathLike) -> xr.Dataset:
    with xr.open_dataset(path, engine=NETCDF_ENGINE) as ds:
        return ds.load()


@contextlib.contextmanager
def reading_once():
    """Within this block :func:`read_dataset` reads each file once and hands out deep copies of it (a file
    replaced meanwhile is read again: the key holds its inode, modification time and size). ``trainscale
    verify`` checks a study's records and redraws its figures from the same datasets: h5netcdf spends about
    0.15 s opening a small file (its dimension lookups), most of the time a figure takes to draw."""
    global _read_once
    outer = _read_once
    _read_once = {} if outer is None else outer
    try:
        yield
    finally:
        _read_once = outer


def save_figure(fig, path: str | os.PathLike, dpi: int = 150, after_draw=None) -> Path:
    """Save a matplotlib figure as PNG at ``path``, atomically and byte-reproducibly; close it.

    The ``Software`` metadata (the matplotlib version) is dropped so that identical figures give
    identical bytes (:func:`trainscale.common.figurecheck.render_png`, drawn in memory). ``after_draw(fig)``, if
    given, runs on the figure as drawn for the file, before the file is written (a check that reads the drawn
    figure without drawing it again). Parent folders are created. Returns the path.
    """
    import matplotlib.pyplot as plt

    from .figurecheck import render_png

    try:
        png = render_png(fig, dpi)
        if after_draw is not None:
            after_draw(fig)
        path, tmp = _atomic_target(path)
        try:
            tmp.write_bytes(png)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    finally:
        plt.close(fig)
    return path
