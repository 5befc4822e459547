"""Compiling a kernel in a second process (trainscale.common.jitaside, issue 38's search from an empty cache)."""

import json
import os
import subprocess
import sys
import textwrap

from trainscale.common import jitaside
from trainscale.kernels.collectives import group_split

CHILD = textwrap.dedent("""
    import json
    from trainscale.common import jitaside
    from trainscale.kernels.collectives import group_split

    args = (16, 2, 8)
    cold = not jitaside.has_cache(group_split)
    proc = jitaside.compile_aside(group_split, args)
    started = proc is not None
    jitaside.wait(proc)
    value = group_split(*args)
    hits = sum(group_split.stats.cache_hits.values())
    again = jitaside.compile_aside(group_split, args)
    print(json.dumps({"cold": cold, "started": started, "value": list(value), "hits": hits,
                      "again": again is not None, "rc": proc.returncode if proc else None}))
""")


def test_a_kernel_compiled_aside_is_loaded_from_the_cache_it_wrote(tmp_path):
    """From an empty cache the kernel is compiled by the second process (exit 0), this one loads it from the cache
    (one cache hit, no compilation here) and gets the same value; compiled, nothing is started again."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True,
                         timeout=120)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"cold": True, "started": True, "value": [4, 4], "hits": 1, "again": False, "rc": 0}
    assert tuple(result["value"]) == group_split.py_func(16, 2, 8)


def test_nothing_is_started_for_a_kernel_already_compiled():
    group_split(8, 1, 8)
    assert jitaside.compile_aside(group_split, (8, 1, 8)) is None
    jitaside.wait(None)  # nothing to wait for


def test_signature_is_what_the_dispatcher_compiles_for():
    group_split(8, 1, 8)
    assert jitaside.signature_of((8, 1, 8)) in group_split.overloads
