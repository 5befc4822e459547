"""Validation of scalar and list inputs at the API boundary, with errors that name the field.

Every function returns the value converted (``int`` or ``float``) or raises
:class:`trainscale.specs.SpecError` with the field name, the value and what would be valid.
Booleans are never accepted as numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .specs import SpecError

__all__ = ["check_choice", "check_float", "check_floats", "check_int", "check_speeds"]


def check_int(name, value, minimum=1, maximum=None) -> int:
    """An integer in ``[minimum, maximum]`` (``maximum=None``: unbounded)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise SpecError(name, value, f"expected an integer >= {minimum}")
    if value < minimum or (maximum is not None and value > maximum):
        rng = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise SpecError(name, value, f"expected an integer {rng}")
    return int(value)


def check_float(name, value, minimum=0.0, maximum=math.inf, open_min=False, open_max=False) -> float:
    """A finite number in the interval from ``minimum`` to ``maximum`` (open ends as flagged)."""
    lo = "(" if open_min else "["
    hi = ")" if open_max else "]"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise SpecError(name, value, f"expected a number in {lo}{minimum}, {maximum}{hi}")
    value = float(value)
    lo_bad = value <= minimum if open_min else value < minimum
    hi_bad = value >= maximum if open_max else value > maximum
    if not math.isfinite(value) or lo_bad or hi_bad:
        raise SpecError(name, value, f"expected a finite number in {lo}{minimum}, {maximum}{hi}")
    return value


def check_floats(name, values, minimum=0.0, maximum=math.inf, open_min=False, open_max=False) -> list[float]:
    """A non-empty list of numbers, each checked by :func:`check_float`."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)) or len(values) == 0:
        raise SpecError(name, values, f"expected a non-empty list of numbers in [{minimum}, {maximum}]")
    return [check_float(name, v, minimum, maximum, open_min, open_max) for v in values]


def check_choice(name, value, choices):
    """One of ``choices``."""
    if value not in choices:
        raise SpecError(name, value, f"expected one of {', '.join(map(str, choices))}")
    return value


def check_speeds(speeds, workers: int) -> np.ndarray:
    """Relative worker speeds: ``workers`` positive finite numbers (``None``: all ones)."""
    if speeds is None:
        return np.ones(workers)
    try:
        arr = np.asarray(speeds, dtype=np.float64)
    except (TypeError, ValueError):
        arr = np.empty(0)
    if arr.shape != (workers,) or not np.all(np.isfinite(arr)) or not np.all(arr > 0):
        raise SpecError("speeds", speeds, f"expected {workers} positive finite numbers (one per worker)")
    return arr
