"""Compile a Numba kernel in a second process while this one goes on (issue 38: the search from an empty cache).

From an empty Numba cache most of a search's time is compilation, one kernel after another on one core:
Numba compiles under a process-wide lock, so threads cannot share it out. :func:`compile_aside` starts the
biggest kernel's compilation (the search's one pass, :func:`trainscale.kernels.grid.scan_layouts`, about half
of it) in a second Python process as soon as its argument types are known, from placeholders of those types; the
process compiles it for exactly those types (``Dispatcher.compile``) and writes it to the cache every process
shares (``NUMBA_CACHE_DIR``), while this one compiles the kernels it needs before. The first call here then
loads the compiled kernel from the cache. Where the kernel is already compiled or cached, where this machine
has one core, or where anything fails, nothing is started and the call compiles (or loads) in place, as
before: the results are the same machine code either way.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numba

# the second process: a fresh interpreter (not multiprocessing's spawn, which re-runs a script's __main__) that
# reads (sys.path, module, function name, argument types) and compiles; Numba saves it to the cache
_COMPILE = ("import importlib, pickle, sys\n"
            "path, module, name, signature = pickle.load(sys.stdin.buffer)\n"
            "sys.path[:] = path\n"
            "getattr(importlib.import_module(module), name).compile(signature)\n")


def signature_of(args) -> tuple:
    """Numba's argument types of a call with ``args`` (what its dispatcher would compile for)."""
    return tuple(numba.typeof(a) for a in args)


def has_cache(dispatcher) -> bool:
    """Whether ``dispatcher`` has an on-disk cache index (a version compiled for some types), or cannot tell."""
    try:
        return os.path.exists(dispatcher._cache._cache_file._index_path)
    except AttributeError:  # no cache, or a Numba whose internals differ: compile in place
        return True


def compile_aside(dispatcher, args) -> subprocess.Popen | None:
    """Start compiling ``dispatcher`` for the types of ``args`` in a second Python process; ``None`` (nothing
    started) where it is compiled in this process or cached on disk, or with fewer than two CPUs. :func:`wait`
    for it before the first call."""
    try:
        signature = signature_of(args)
        if signature in dispatcher.overloads or has_cache(dispatcher) or (os.cpu_count() or 1) < 2:
            return None
        job = pickle.dumps((list(sys.path), dispatcher.py_func.__module__, dispatcher.py_func.__name__, signature))
        proc = subprocess.Popen([sys.executable, "-c", _COMPILE], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        proc.stdin.write(job)
        proc.stdin.close()
        return proc
    except Exception:  # noqa: BLE001 - any failure: compile in place
        return None


def wait(proc: subprocess.Popen | None) -> None:
    """Wait for :func:`compile_aside`'s process; a failure there only means the call compiles in place."""
    if proc is not None:
        proc.wait()
