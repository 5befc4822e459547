"""What the command modules share: the input error (:class:`CLIError`: one line on stderr, exit status 2), the
output (aligned text tables, JSON, warnings on stderr, progress bars), reading a YAML input or a catalog name,
argparse's value types, and the parser that reports a usage error in one line (:class:`OneLineParser`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

PROG = "trainscale"


class CLIError(Exception):
    """An input error reported as one line with exit status 2."""


# --------------------------------------------------------------------------- helpers
def _one_line(text: str) -> str:
    """One line, at most ``inputs.MAX_MESSAGE`` characters (``...`` marks a cut)."""
    from ...common.inputs import one_line

    return one_line(text)


def _warn(message: str) -> None:
    print(f"{PROG}: warning: {_one_line(message)}", file=sys.stderr)


def _progress(iterable, total: int | None = None, desc: str = ""):
    from ...common.progress import progress

    return progress(iterable, total, desc)


def _clean(obj: Any) -> Any:
    """JSON-safe copy: non-finite floats become None, numpy scalars become Python ones."""
    if isinstance(obj, Mapping):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        try:
            obj = obj.item()
        except (TypeError, ValueError):
            pass
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _dump_json(obj: Any) -> None:
    print(json.dumps(_clean(obj), indent=2, allow_nan=False))


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        if value == 0:
            return "0"
        if 1e4 <= abs(value) < 1e12:
            return f"{value:,.0f}"
        if abs(value) >= 1e12 or abs(value) < 1e-3:
            return f"{value:.3e}"
        return f"{value:.4g}"
    return str(value)


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Plain aligned text table (numbers right-aligned)."""
    if not rows:
        return "(none)"
    columns = list(columns or rows[0].keys())
    cells = [[_fmt(row.get(c)) for c in columns] for row in rows]
    numeric = [all(isinstance(row.get(c), (int, float)) and not isinstance(row.get(c), bool)
                   for row in rows) for c in columns]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]

    def line(values):
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [line(columns), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _load_yaml(path: str) -> Any:
    """A YAML file read strictly: duplicate keys, deep nesting and alias bombs are errors
    (:func:`trainscale.common.inputs.load_yaml`)."""
    from ...common.inputs import load_yaml

    return load_yaml(path)


def _spec_arg(value: str, what: str):
    """A catalog name, or a YAML file holding the spec (a model's shape; a system's name + overrides)."""
    if value.endswith((".yaml", ".yml")) or Path(value).is_file():
        doc = _load_yaml(value)
        if not isinstance(doc, dict):
            raise CLIError(f"--{what} = {value!r} is invalid; the file must hold a mapping")
        return doc
    return value


def _require_file(path: str, option: str) -> None:
    if not os.path.isfile(path):
        raise CLIError(f"{option}: {path!r} is not a file")


# --------------------------------------------------------------------------- argument types, parser
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1 or value > 2**40:
        raise argparse.ArgumentTypeError(f"expected a positive integer up to 2^40, got {text!r}")
    return value


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share in [0, 1], got {text!r}")
    return value


def _imbalance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a ratio >= 1, got {text!r}") from None
    if not value >= 1.0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a ratio >= 1 (1: balanced), got {text!r}")
    return value


def _recompute_modules(text: str) -> str:
    from ...common.errors import SpecError
    from ...model.plan_spec import recompute_modules_text
    from ...model.spec_fields import RECOMPUTE_MODULES

    try:
        return recompute_modules_text(text)
    except SpecError:
        raise argparse.ArgumentTypeError(f"expected distinct names, comma-separated, of {', '.join(RECOMPUTE_MODULES)}; "
                                         f"got {text!r}") from None


def _bounded_int(maximum: int):
    def parse(text: str) -> int:
        value = _positive_int(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"expected a positive integer up to {maximum}, got {text!r}")
        return value

    return parse


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error in the CLI's one-line format (exit 2), without the
    usage block: ``trainscale <command>: error: <what is wrong>`` (``--help`` shows the usage)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {_one_line(message)}\n")
