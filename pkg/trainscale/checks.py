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

__all__ = ["check_choice", "check_choices", "check_float", "check_floats", "check_int", "check_ints", "check_speeds"]


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


def _non_empty_list(name, values, what: str) -> None:
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)) or len(values) == 0:
        raise SpecError(name, values, f"expected a non-empty list of {what}")


def _distinct(name, values, out: list) -> list:
    if len(set(out)) != len(out):
        dup = next(v for v in out if out.count(v) > 1)
        raise SpecError(name, list(values), f"expected distinct values ({dup!r} appears twice)")
    return out


def check_ints(name, values, minimum=1, maximum=None, distinct=True) -> list[int]:
    """A non-empty list of integers, each checked by :func:`check_int` (NumPy integers accepted), in the
    given order; ``distinct``: no value twice."""
    rng = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
    _non_empty_list(name, values, f"integers {rng}")
    out = [check_int(name, int(v) if isinstance(v, np.integer) else v, minimum, maximum) for v in values]
    return _distinct(name, values, out) if distinct else out


def check_choices(name, values, choices, distinct=True) -> list:
    """A non-empty list of values, each one of ``choices``; ``distinct``: no value twice."""
    _non_empty_list(name, values, f"values of {', '.join(map(str, choices))}")
    out = [check_choice(name, v, choices) for v in values]
    return _distinct(name, values, out) if distinct else out


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
