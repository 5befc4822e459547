"""The catalogs shipped in ``trainscale/data``: systems, models, measured runs, calibration.

Every catalog value carries its source next to it in the YAML; this module only reads them.
"""

from __future__ import annotations

import csv
import functools
from importlib import resources
from pathlib import Path


DATA = resources.files("trainscale") / "data"


def data_path(name: str) -> Path:
    return Path(str(DATA / name))


@functools.lru_cache(maxsize=None)
def _yaml(name: str) -> dict:
    from ..common.inputs import CatalogLoader, load_yaml  # strict: a catalog entry given twice is an error, not an override

    return load_yaml(data_path(name), CatalogLoader)


def systems() -> dict:
    """Catalog systems by name; each field is ``{value, source}``."""
    return _yaml("systems.yaml")["systems"]


def models() -> dict:
    """Catalog model shapes by name."""
    return _yaml("models.yaml")["models"]


def calibration() -> dict:
    """Per accelerator generation: fitted and fixed performance-model parameters."""
    return _yaml("calibration.yaml")


def stack_defaults() -> dict:
    """Per software stack: the plan knobs a plan may leave out, each ``{value, source}``
    (``data/stack_defaults.yaml``; checked by :func:`trainscale.model.specs.stack_defaults`)."""
    return _yaml("stack_defaults.yaml")["stacks"]


def fitted_calibration() -> dict:
    """Values written by ``trainscale calibrate`` (empty before the first fit)."""
    if not data_path("calibration_fitted.yaml").exists():
        return {}
    return _yaml("calibration_fitted.yaml").get("fitted", {})


def stored_cross_validation() -> dict:
    """The cross-validated errors ``trainscale calibrate --cv --write`` stored (``leave_one_dataset_out``,
    ``leave_one_size_out``; empty before the first such fit)."""
    if not data_path("calibration_fitted.yaml").exists():
        return {}
    return _yaml("calibration_fitted.yaml").get("cross_validation", {}) or {}


def reload() -> None:
    """Forget cached catalogs (after ``trainscale calibrate`` rewrites a file)."""
    _yaml.cache_clear()


def generations() -> tuple[str, ...]:
    return tuple(calibration()["generations"])


@functools.lru_cache(maxsize=None)
def published_runs() -> tuple[dict, ...]:
    """The project's transcription of published measured runs (see data/README.md)."""
    with open(data_path("published_runs.csv"), encoding="utf-8") as fh:
        return tuple(csv.DictReader(fh))
