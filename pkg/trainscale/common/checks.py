"""Validation of scalar and list inputs at the API boundary, with errors that name the field.

Every function returns the value converted (``int`` or ``float``) or raises
:class:`trainscale.model.specs.SpecError` with the field name, the value and what would be valid.
Booleans are never accepted as numbers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from .errors import short_repr
from .errors import SpecError

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


GPU_COUNTS_SYNTAX = ("expected GPU counts such as 256,512,1024, a range START..STOP (START doubled up to STOP, "
                     "e.g. 256..8192), or both (96,128..512)")


def _gpu_range(name: str, given, part: str) -> list[int] | None:
    """``START..STOP`` as START, 2 START, 4 START, ... STOP (STOP must be START times a power of two); None when
    ``part`` is not a range."""
    m = re.fullmatch(r"(\d{1,15})\s*\.\.\s*(\d{1,15})", part)
    if not m:
        return None
    start, stop = int(m.group(1)), int(m.group(2))
    ratio = stop // start if 0 < start <= stop else 0
    if ratio == 0 or stop % start or ratio & (ratio - 1):
        raise SpecError(name, given, f"the range {part!r} needs 0 < START <= STOP and STOP = START times a power "
                        f"of two; {GPU_COUNTS_SYNTAX}")
    return [start << k for k in range(ratio.bit_length())]


def parse_gpu_counts(value, name: str = "gpus", maximum: int = 2**40) -> list[int]:
    """GPU counts, ascending, none twice: a list of positive integers, an integer, or text (the CLI's
    ``--gpus``): ``"256,512,1024"``, ``"256..8192"`` (:func:`_gpu_range`), or both mixed (``"96,128..512"``).
    Anything else is one :class:`SpecError` naming ``name``, the value and the syntax."""
    given = value
    if isinstance(value, str):
        counts: list = []
        for part in value.split(","):
            part = part.strip()
            spanned = _gpu_range(name, given, part)
            if spanned is not None:
                counts += spanned
            elif re.fullmatch(r"\d{1,15}", part):
                counts.append(int(part))
            else:
                raise SpecError(name, given, (f"{part!r} is not a size; " if part else "an empty size; ")
                                + GPU_COUNTS_SYNTAX)
        value = counts
    elif isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        value = [value]
    try:
        counts = check_ints(name, value, 1, maximum)
    except SpecError as err:
        if isinstance(err.value, list):  # a count twice: check_ints names it
            why = err.valid.removeprefix("expected distinct values ").strip("()")
        else:
            why = f"{short_repr(err.value)} is not a size in [1, {maximum}]"
        raise SpecError(name, given, f"{why}; {GPU_COUNTS_SYNTAX}") from None
    return sorted(counts)
