"""Numba kernels: plain arrays and scalars in, arrays out; no Python objects and no I/O.

``layout`` names the slots of the arrays; ``compute`` and ``collectives`` hold one scalar
function per formula; ``layer`` prices a layer and ``plan`` a whole step, with ``moe``, ``pipesplit``,
``memory``, ``zero3``, ``dpsync`` and ``power`` for their parts; ``grid`` evaluates many plans.

Numba's on-disk cache checks only the source file of the cached function, not the kernels it
inlines from other files, so a changed formula in ``layer.py`` would leave a stale compiled
``grid.evaluate_grid`` behind. The cache therefore lives in a folder named after a hash of all
kernel sources, under :func:`cache_base`: ``NUMBA_CACHE_DIR`` if set, else the checkout's
``.numba_cache/`` when the package runs from a source checkout (what ``make setup`` warms: the same folder
for make, an activated venv, JupyterLab, papermill and a SLURM job on a shared filesystem), else the
user's cache folder (an installed wheel).

A cached function must not call a ``parallel=True`` kernel: when the callee was loaded from the
cache while the caller compiled, the cached caller crashes the next process that loads it (seen
with ``make figures`` then ``make test`` then ``make bench``). Such callers are plain Python or
``cache=False`` (tests/test_kernels.py checks it).
"""

import hashlib
import os
from pathlib import Path

import numba

_HERE = Path(__file__).parent
_DIGEST = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(_HERE.glob("*.py")))).hexdigest()[:16]


def source_checkout_root(here: Path = _HERE) -> Path | None:
    """The repository root when this package runs from a source checkout (``<root>/pkg/trainscale``
    beside ``<root>/pyproject.toml``), else None (an installed wheel)."""
    root = here.parents[2]
    if here.parent.name == "trainscale" and here.parents[1].name == "pkg" and (root / "pyproject.toml").is_file():
        return root
    return None


def cache_base(environ=os.environ, here: Path = _HERE) -> str:
    """Where the compiled kernels live: ``NUMBA_CACHE_DIR`` if set, else ``<checkout>/.numba_cache``,
    else ``$XDG_CACHE_HOME/trainscale-numba`` (``~/.cache`` by default)."""
    if environ.get("NUMBA_CACHE_DIR"):
        return environ["NUMBA_CACHE_DIR"]
    root = source_checkout_root(here)
    if root is not None:
        return str(root / ".numba_cache")
    user_cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(user_cache, "trainscale-numba")


numba.config.CACHE_DIR = os.path.join(cache_base(), f"kernels-{_DIGEST}")
