"""The error every bad input raises (:class:`SpecError`) and the bounded repr its message uses.

Apart from :mod:`trainscale.model.specs` (which re-exports both) so that :mod:`trainscale.common.inputs`, the strict
YAML loader of the catalogs, does not import the specs, which read a catalog when they are imported.
"""

from __future__ import annotations

import reprlib
from typing import Any

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 60, 60, 40
for _attr in ("maxlist", "maxtuple", "maxdict", "maxset", "maxfrozenset", "maxdeque", "maxarray"):
    setattr(_REPR, _attr, 6)


def short_repr(value: Any) -> str:
    """A repr of ``value`` that stays short (and fast) however large or deep the value is."""
    try:
        return _REPR.repr(value)
    except Exception:  # noqa: BLE001 - a repr must never be the error
        return f"<{type(value).__name__}>"


class SpecError(ValueError):
    """Bad input: names where it was found, the field, the value and what is valid (the value's repr
    is bounded: a huge or deeply nested value never makes a huge message)."""

    def __init__(self, field_name: str, value: Any, valid: str, where: str | None = None):
        self.field = field_name
        self.value = value
        self.valid = valid
        self.where = where
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}{field_name} = {short_repr(value)} is invalid; {valid}")
