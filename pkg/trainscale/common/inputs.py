"""Reading what users give: strict YAML, one-line capped messages, finite results, notebook parameters.

The one validation layer every entry point shares (issue 12, part 6):

- :func:`load_yaml` / :func:`load_yaml_text`: YAML that refuses duplicate keys, nesting deeper than
  :data:`MAX_DEPTH` and documents whose aliases expand to more than :data:`MAX_NODES` values (a few
  kilobytes of nested aliases can otherwise stand for billions of values); every failure is an
  :class:`InputError` naming the file, line and column.
- :func:`one_line`: a message on one line, capped at :data:`MAX_MESSAGE` characters (``...`` marks a cut).
- :func:`short_repr`: a value's repr, bounded however large or deep the value is.
- :func:`check_finite`: a result whose numbers are all finite, or an error naming the first field that is not
  (a prediction that overflows is an error, never a silent ``null``).
- :func:`check_parameters`: a notebook's parameters (papermill ``-p``) against the types of their defaults.
- :func:`plausibility_warnings`: one-line warnings for values that are valid but look like a unit slip.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .errors import SpecError, short_repr

__all__ = ["InputError", "MAX_DEPTH", "MAX_NODES", "MAX_MESSAGE", "load_yaml", "load_yaml_text", "one_line",
           "short_repr", "check_finite", "check_parameters", "ParameterError", "plausibility_warnings",
           "check_unique_ids"]

MAX_DEPTH = 64  # nesting levels of a YAML document (runs, clusters and configs use fewer than 10)
MAX_NODES = 1_000_000  # values of a YAML document once its aliases are expanded
MAX_MESSAGE = 300  # characters of one error line


class InputError(SpecError):
    """Unreadable input (a file, not a field): reported as ``<where>: <what is wrong>``."""

    def __init__(self, where: str, message: str):
        ValueError.__init__(self, f"{where}: {message}")
        self.field, self.value, self.valid, self.where = where, None, message, None


# --------------------------------------------------------------------------- messages
def one_line(text: Any, limit: int = MAX_MESSAGE) -> str:
    """``text`` with its whitespace collapsed to single spaces, at most ``limit`` characters."""
    line = " ".join(str(text).split())
    if len(line) > limit:
        line = line[: limit - 3].rstrip() + "..."
    return line


# --------------------------------------------------------------------------- YAML
class _NoDuplicateKeys:
    """A constructor that refuses a mapping's duplicate keys (as ``yaml.YAMLError``)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:  # unhashable: the base class reports it
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found duplicate key {short_repr(key)}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)


class StrictLoader(_NoDuplicateKeys, yaml.SafeLoader):
    """PyYAML's safe loader with duplicate keys and deep nesting refused (as ``yaml.YAMLError``)."""

    _depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, f"nesting deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


# The package's own catalogs (trainscale/data) are parsed by libyaml where PyYAML has it: the pure-Python parser
# took ~0.5 s of every command for them. Duplicate keys are refused the same way and the documents are the same
# (tests/test_inputs.py compares every catalog); the nesting limit is left to StrictLoader, for what users give.
if getattr(yaml, "__with_libyaml__", False):
    class CatalogLoader(_NoDuplicateKeys, yaml.CSafeLoader):
        """:class:`StrictLoader` for the shipped catalogs, on libyaml's parser (no nesting limit)."""
else:  # pragma: no cover - PyYAML built without libyaml
    CatalogLoader = StrictLoader


def _expanded_size(root) -> int:
    """Values in the node tree once every alias is expanded (shared nodes counted at each use)."""
    sizes: dict[int, int] = {}

    def size(node) -> int:
        key = id(node)
        if key not in sizes:
            sizes[key] = 1  # guards a recursive alias (PyYAML refuses those, but stay finite)
            total = 1
            if isinstance(node, yaml.SequenceNode):
                total += sum(size(child) for child in node.value)
            elif isinstance(node, yaml.MappingNode):
                total += sum(size(k) + size(v) for k, v in node.value)
            sizes[key] = total
        return sizes[key]

    return size(root)


def _mark(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""


def load_yaml_text(text: str, where: str = "<input>", loader_class=StrictLoader) -> Any:
    """Parse one YAML document strictly (see the module docstring); errors as :class:`InputError`.
    ``loader_class``: :class:`StrictLoader`, or :class:`CatalogLoader` for the package's own files."""
    loader = None
    try:
        loader = loader_class(text)
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node) > MAX_NODES:
            raise InputError(where, f"malformed YAML: its aliases expand to more than {MAX_NODES:,} values")
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(where, f"malformed YAML: {_mark(exc)}{one_line(problem, 200)}") from None
    except RecursionError:
        raise InputError(where, f"malformed YAML: nesting deeper than {MAX_DEPTH} levels") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml(path: str | Path, loader_class=StrictLoader) -> Any:
    """Read and parse a YAML file strictly; a missing, unreadable or malformed file is an :class:`InputError`
    (``loader_class`` as :func:`load_yaml_text`)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(str(path), "no such file" if not p.exists() else "not a file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(str(path), f"cannot read: {one_line(exc, 200)}") from None
    return load_yaml_text(text, str(path), loader_class)


# --------------------------------------------------------------------------- results
def check_finite(result: Any, where: str | None = None, path: str = "") -> None:
    """Raise :class:`SpecError` naming the first number in ``result`` (nested mappings and lists) that is
    NaN or infinite: a prediction that overflowed (inputs at the edge of their ranges) is an error."""
    if isinstance(result, Mapping):
        for key, value in result.items():
            check_finite(value, where, f"{path}.{key}" if path else str(key))
    elif isinstance(result, (list, tuple)):
        for i, value in enumerate(result):
            check_finite(value, where, f"{path}[{i}]")
    elif isinstance(result, float) or (hasattr(result, "dtype") and getattr(result, "shape", None) == ()):
        try:
            number = float(result)
        except (TypeError, ValueError):
            return
        if not math.isfinite(number):
            raise SpecError(path or "result", number, "the prediction overflowed: this output is not a finite "
                            "number (inputs at the edge of their valid ranges)", where)


def check_unique_ids(ids, what: str = "id", where: str | None = None) -> None:
    """Every id once."""
    seen = set()
    for value in ids:
        if value in seen:
            raise SpecError(what, value, "ids must be unique; this one is given twice", where)
        seen.add(value)


# --------------------------------------------------------------------------- warnings
PLAUSIBLE = {  # field: (lowest plausible value, the unit slip a smaller value suggests)
    "peak_flops_bf16": (1e12, "under 1 TFLOP/s: TFLOP/s given for FLOP/s?"),
    "hbm_bandwidth_GBps": (100.0, "under 100 GB/s: TB/s given for GB/s?"),
    "scale_up_GBps_per_gpu": (1.0, "under 1 GB/s: TB/s given for GB/s?"),
}


def plausibility_warnings(system) -> list[str]:
    """One-line warnings for a system whose values are valid (inside the ranges of
    :attr:`SystemSpec.RANGES`) but look like a unit slip. A peak under 1 TFLOP/s is outside the range
    and already an error; the check stays here for specs built without that range."""
    out = []
    for name, (lowest, slip) in PLAUSIBLE.items():
        value = getattr(system, name, None)
        if isinstance(value, (int, float)) and value < lowest:
            out.append(f"{name} = {value:g} is {slip}")
    return out


# --------------------------------------------------------------------------- notebook parameters
class ParameterError(SpecError):
    """A notebook parameter of the wrong type or out of range."""


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _convert(name: str, value: Any, default: Any, minimum=None, maximum=None, choices=None) -> Any:
    if isinstance(default, bool):
        if isinstance(value, bool):
            out = value
        elif isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            out = value.strip().lower() in _TRUE
        elif isinstance(value, int) and value in (0, 1):
            out = bool(value)
        else:
            raise ParameterError(name, value, "expected true or false")
    elif isinstance(default, int):
        if isinstance(value, bool):
            raise ParameterError(name, value, "expected an integer")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise ParameterError(name, value, "expected an integer") from None
        if not isinstance(value, int):
            raise ParameterError(name, value, "expected an integer")
        if not -(2**63) <= value < 2**63:
            raise ParameterError(name, value, "expected an integer within 64 bits")
        out = value
    elif isinstance(default, float):
        if isinstance(value, bool):
            raise ParameterError(name, value, "expected a number")
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise ParameterError(name, value, "expected a number") from None
        if not isinstance(value, (int, float)):
            raise ParameterError(name, value, "expected a number")
        try:
            out = float(value)
        except OverflowError:
            raise ParameterError(name, value, "expected a finite number") from None
        if not math.isfinite(out):
            raise ParameterError(name, value, "expected a finite number")
    elif isinstance(default, str):
        if not isinstance(value, str):
            raise ParameterError(name, value, "expected a string")
        out = value
    elif isinstance(default, (list, tuple)):
        if not isinstance(value, (list, tuple)):
            raise ParameterError(name, value, "expected a list")
        out = list(value)
    elif isinstance(default, Mapping):
        if not isinstance(value, Mapping):
            raise ParameterError(name, value, "expected a mapping")
        out = dict(value)
    else:  # None or another type: no check
        out = value
    if choices is not None and out not in choices:
        raise ParameterError(name, value, f"expected one of {', '.join(map(str, choices))}")
    if minimum is not None and isinstance(out, (int, float)) and out < minimum:
        raise ParameterError(name, value, f"expected a value >= {minimum}")
    if maximum is not None and isinstance(out, (int, float)) and out > maximum:
        raise ParameterError(name, value, f"expected a value <= {maximum}")
    return out


def check_parameters(namespace: dict, defaults: Mapping[str, Any],
                     bounds: Mapping[str, Mapping] | None = None) -> dict:
    """Check (and convert in place) a notebook's parameters against the types of their defaults.

    Call it in the first code cell after the ``parameters`` cell::

        DEFAULTS = dict(include_vtrain_single=False, gpus=64)       # in the parameters cell: the same values
        from trainscale.common.inputs import check_parameters
        check_parameters(globals(), DEFAULTS, bounds={"gpus": {"minimum": 1}})

    A ``bool`` default takes ``true``/``false`` (also ``yes``/``no``, ``on``/``off``, ``1``/``0``, as text from
    ``papermill -p``); an ``int`` default an integer within 64 bits (or its text); a ``float`` a finite number;
    a ``str``, a list or a mapping the same type. ``bounds[name]`` may hold ``minimum``, ``maximum`` and
    ``choices``. A parameter of the wrong type raises :class:`ParameterError` with one line naming it, e.g.
    ``include_vtrain_single = 'badvalue' is invalid; expected true or false``.
    Returns the converted values.
    """
    bounds = bounds or {}
    out = {}
    for name, default in defaults.items():
        value = namespace.get(name, default)
        out[name] = _convert(name, value, default, **dict(bounds.get(name, {})))
        try:
            namespace[name] = out[name]
        except TypeError:
            pass
    return out
