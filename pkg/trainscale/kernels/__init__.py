"""Numba kernels: plain arrays and scalars in, arrays out; no Python objects and no I/O.

``layout`` names the slots of the arrays; ``compute`` and ``collectives`` hold one scalar
function per formula; ``plan`` prices a layer and a whole step; ``grid`` evaluates many plans.

Numba's on-disk cache checks only the source file of the cached function, not the kernels it
inlines from other files, so a changed formula in ``plan.py`` would leave a stale compiled
``grid.evaluate_grid`` behind. The cache therefore lives in a folder named after a hash of all
kernel sources (under ``NUMBA_CACHE_DIR`` if set, else the user's cache folder).

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
_BASE = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "trainscale-numba")
numba.config.CACHE_DIR = os.path.join(_BASE, f"kernels-{_DIGEST}")
