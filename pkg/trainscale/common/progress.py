"""Progress bars (tqdm) on long searches, plans and sweeps, shown only when stderr is a terminal.

Under a workflow, a test or a pipe (stderr not a terminal) :func:`progress` returns the iterable
unchanged, so logs and captured output carry no bar. ``TRAINSCALE_PROGRESS=0`` turns bars off on a
terminal too; ``TRAINSCALE_PROGRESS=1`` forces them (for a terminal multiplexer that is not a tty).
"""

from __future__ import annotations

import os
import sys
from typing import Iterable, TypeVar

T = TypeVar("T")

__all__ = ["enabled", "progress"]


def enabled() -> bool:
    """Whether bars are shown: stderr is a terminal, unless ``TRAINSCALE_PROGRESS`` says otherwise."""
    forced = os.environ.get("TRAINSCALE_PROGRESS", "").strip().lower()
    if forced in ("0", "false", "no", "off"):
        return False
    if forced in ("1", "true", "yes", "on"):
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


def progress(iterable: Iterable[T], total: int | None = None, desc: str = "") -> Iterable[T]:
    """``iterable`` with a tqdm bar on stderr when :func:`enabled`; the bare iterable otherwise."""
    if not enabled():
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is pinned in requirements.txt
        return iterable
    return tqdm(iterable, total=total, desc=desc, leave=False, file=sys.stderr, dynamic_ncols=True)
