"""The survey map: which study covers which area of a survey, read from a small documented data file.

The data file (default: the package's ``data/survey_map.yaml``, its schema in its header) lists the survey's
stages, focus areas and areas, each area with its techniques, and for every study of the project either the
techniques it models in each area it covers (``covers``) or why no area fits (``outside``).
:func:`load_map` reads and checks it: every error is one line (:class:`trainscale.model.specs.SpecError`) naming
the file, the field, the value and what is valid; a study name that is not a study of the project is an
error, and so is a study of the project missing from the map. :func:`coverage_dataset` turns the map into
an xarray Dataset (area x study, technique x study) from which the figures and the coverage are computed.
"""

from __future__ import annotations

import pkgutil
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import xarray as xr
import yaml

from ..model.specs import SpecError

__all__ = ["Area", "SurveyMap", "DEFAULT_MAP", "project_studies", "load_map", "coverage_dataset"]

DEFAULT_MAP = Path(__file__).resolve().parents[1] / "data" / "survey_map.yaml"
TOP_KEYS = ("stages", "focus", "areas", "studies")
AREA_KEYS = ("id", "stage", "focus", "title", "techniques")
_ID = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


@dataclass(frozen=True)
class Area:
    """One area of the survey: an id, the stage and focus area it belongs to, a title, its techniques."""

    id: str
    stage: str
    focus: str
    title: str
    techniques: tuple[str, ...]


@dataclass(frozen=True)
class SurveyMap:
    """A checked survey map: stages and focus areas (in the file's order), areas, and per study either the
    techniques it models by area (``covers``) or the reason it is outside every area (``outside``)."""

    stages: tuple[str, ...]
    focus: tuple[str, ...]
    areas: tuple[Area, ...]
    covers: Mapping[str, Mapping[str, tuple[str, ...]]]
    outside: Mapping[str, str]
    source: str

    @property
    def studies(self) -> tuple[str, ...]:
        """Every study on the map, in the file's order."""
        return tuple(self.covers) + tuple(s for s in self.outside if s not in self.covers)


def project_studies() -> tuple[str, ...]:
    """The project's studies: one per module of :mod:`trainscale.studies` (``registry``, ``surveymap`` and the
    private ``_*`` modules a study splits out, such as its figures, aside), named as the workflow names them
    (``hardware_scaling`` -> ``hardware-scaling``)."""
    from .. import studies

    names = [m.name for m in pkgutil.iter_modules(studies.__path__)
             if m.name not in ("registry", "surveymap") and not m.name.startswith("_") and not m.ispkg]
    return tuple(sorted(n.replace("_", "-") for n in names))


def _strings(value, field: str, where: str, what: str) -> list[str]:
    if (isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value
            or not all(isinstance(v, str) and v.strip() for v in value)):
        raise SpecError(field, value, f"expected a non-empty list of {what}", where)
    if len(set(value)) != len(value):
        dup = next(v for v in value if value.count(v) > 1)
        raise SpecError(field, dup, f"appears twice; expected distinct {what}", where)
    return list(value)


def _mapping(value, field: str, where: str, keys: Sequence[str] | None = None) -> Mapping:
    if not isinstance(value, Mapping) or not value:
        raise SpecError(field, value, "expected a non-empty mapping", where)
    if keys is not None:
        unknown = [k for k in value if k not in keys]
        if unknown:
            raise SpecError(f"{field}.{unknown[0]}", value[unknown[0]], f"unknown key; valid: {', '.join(keys)}", where)
        missing = [k for k in keys if k not in value]
        if missing:
            raise SpecError(f"{field}.{missing[0]}", None, "is required", where)
    return value


def _area(entry, i: int, stages, focus, where: str) -> Area:
    field = f"areas[{i}]"
    _mapping(entry, field, where, AREA_KEYS)
    if not isinstance(entry["id"], str) or not _ID.match(entry["id"]):
        raise SpecError(f"{field}.id", entry["id"], "expected a kebab-case id (e.g. 'edge-devices')", where)
    field = f"areas.{entry['id']}"
    if entry["stage"] not in stages:
        raise SpecError(f"{field}.stage", entry["stage"], f"expected one of {', '.join(stages)}", where)
    if entry["focus"] not in focus:
        raise SpecError(f"{field}.focus", entry["focus"], f"expected one of {', '.join(focus)}", where)
    if not isinstance(entry["title"], str) or not entry["title"].strip():
        raise SpecError(f"{field}.title", entry["title"], "expected a non-empty title", where)
    techniques = _strings(entry["techniques"], f"{field}.techniques", where, "technique names")
    return Area(entry["id"], entry["stage"], entry["focus"], entry["title"].strip(), tuple(techniques))


def _study(name, entry, areas: Mapping[str, Area], where: str):
    field = f"studies.{name}"
    _mapping(entry, field, where)
    if sorted(entry) not in (["covers"], ["outside"]):
        raise SpecError(field, sorted(entry), "expected exactly one of 'covers' (area: techniques) or 'outside' "
                        "(why no area fits)", where)
    if "outside" in entry:
        if not isinstance(entry["outside"], str) or not entry["outside"].strip():
            raise SpecError(f"{field}.outside", entry["outside"], "expected a non-empty reason", where)
        return None, entry["outside"].strip()
    covers = {}
    for area_id, techniques in _mapping(entry["covers"], f"{field}.covers", where).items():
        if area_id not in areas:
            raise SpecError(f"{field}.covers", area_id, f"is not an area; valid: {', '.join(areas)}", where)
        listed = _strings(techniques, f"{field}.covers.{area_id}", where, "techniques of the area")
        for t in listed:
            if t not in areas[area_id].techniques:
                raise SpecError(f"{field}.covers.{area_id}", t, "is not a technique of the area; valid: "
                                + ", ".join(areas[area_id].techniques), where)
        covers[area_id] = tuple(listed)
    return covers, None


def _check_studies(names: Sequence[str], known: Sequence[str], where: str) -> None:
    for name in names:
        if name not in known:
            raise SpecError(f"studies.{name}", name, f"is not a study of the project; known: {', '.join(known)}",
                            where)
    missing = [s for s in known if s not in names]
    if missing:
        raise SpecError("studies", missing[0], "is a study of the project missing from the map (add it with "
                        "'covers' or 'outside')", where)


def load_map(path: str | Path | None = None, known: Sequence[str] | None = None) -> SurveyMap:
    """Read and check a survey map (default :data:`DEFAULT_MAP`). ``known``: the study names it must list,
    each exactly once (default :func:`project_studies`). Bad input raises :class:`SpecError` (one line)."""
    path = Path(path) if path is not None else DEFAULT_MAP
    where = str(path)
    if not path.is_file():
        raise SpecError("survey_map", where, "no such file")
    try:
        raw: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f"line {mark.line + 1}" if mark is not None else "unknown line"
        raise SpecError("survey_map", path.name, f"is not valid YAML ({line})", where) from None
    _mapping(raw, "(top level)", where, TOP_KEYS)
    stages = _strings(raw["stages"], "stages", where, "stage names")
    focus = _strings(raw["focus"], "focus", where, "focus area names")
    if not isinstance(raw["areas"], list) or not raw["areas"]:
        raise SpecError("areas", raw["areas"], "expected a non-empty list of areas", where)
    areas: dict[str, Area] = {}
    for i, entry in enumerate(raw["areas"]):
        area = _area(entry, i, stages, focus, where)
        if area.id in areas:
            raise SpecError(f"areas[{i}].id", area.id, "appears twice; expected distinct area ids", where)
        areas[area.id] = area
    entries = _mapping(raw["studies"], "studies", where)
    _check_studies([str(n) for n in entries], tuple(known) if known is not None else project_studies(), where)
    covers, outside = {}, {}
    for name, entry in entries.items():
        c, o = _study(name, entry, areas, where)
        if c is not None:
            covers[name] = c
        else:
            outside[name] = o
    return SurveyMap(tuple(stages), tuple(focus), tuple(areas.values()), covers, outside, where)


def _attrs(da: xr.DataArray, units: str | None, long_name: str) -> xr.DataArray:
    da.attrs.update({"long_name": long_name, **({"units": units} if units else {})})
    return da


def coverage_dataset(smap: SurveyMap) -> xr.Dataset:
    """The map as arrays: ``models`` (technique x study: the study models the technique),
    ``techniques_modelled`` (area x study), ``covers`` (area x study: at least one technique),
    ``studies_per_area`` and ``techniques_covered`` / ``techniques_listed`` (area), ``studies_per_technique``
    (technique), ``areas_per_study`` (study). Areas carry their ``stage``, ``focus`` and ``title``;
    techniques their ``technique_area``; studies ``outside`` (no area of the survey fits)."""
    studies = list(smap.studies)
    techniques = [(a.id, t) for a in smap.areas for t in a.techniques]
    models = np.zeros((len(techniques), len(studies)), dtype=np.int8)
    index = {key: i for i, key in enumerate(techniques)}
    for j, study in enumerate(studies):
        for area_id, listed in smap.covers.get(study, {}).items():
            for t in listed:
                models[index[(area_id, t)], j] = 1
    area_ids = [a.id for a in smap.areas]
    tech_area = np.array([a for a, _ in techniques])
    per_area = np.stack([models[tech_area == a].sum(axis=0) for a in area_ids]).astype(np.int64)
    ds = xr.Dataset(coords={"area": area_ids, "study": studies, "technique": np.arange(len(techniques))})
    ds["models"] = _attrs(xr.DataArray(models, dims=("technique", "study")), "1",
                          "the study models the technique (1) or not (0)")
    ds["techniques_modelled"] = _attrs(xr.DataArray(per_area, dims=("area", "study")), "1",
                                       "techniques of the area the study models")
    ds["covers"] = _attrs(xr.DataArray((per_area > 0).astype(np.int8), dims=("area", "study")), "1",
                          "the study covers the area (models at least one of its techniques)")
    ds["studies_per_area"] = _attrs(ds["covers"].sum("study").astype(np.int64), "1", "studies covering the area")
    ds["techniques_covered"] = _attrs(_covered(models, tech_area, area_ids), "1",
                                      "techniques of the area modelled by at least one study")
    ds["techniques_listed"] = _attrs(xr.DataArray([len(a.techniques) for a in smap.areas], dims="area"), "1",
                                     "techniques the map lists for the area")
    ds["studies_per_technique"] = _attrs(xr.DataArray(models.sum(axis=1).astype(np.int64), dims="technique"), "1",
                                         "studies modelling the technique")
    ds["areas_per_study"] = _attrs(ds["covers"].sum("area").astype(np.int64), "1", "areas the study covers")
    _attrs(ds["area"], None, "area of the survey (id)")
    _attrs(ds["study"], None, "trainscale study")
    _attrs(ds["technique"], "1", "technique (index; name in technique_name)")
    ds.coords["stage"] = _attrs(xr.DataArray([a.stage for a in smap.areas], dims="area"), None,
                                "stage of the (M)LLM pipeline the area belongs to")
    ds.coords["focus"] = _attrs(xr.DataArray([a.focus for a in smap.areas], dims="area"), None,
                                "the survey's focus area the area belongs to")
    ds.coords["title"] = _attrs(xr.DataArray([a.title for a in smap.areas], dims="area"), None, "area title")
    ds.coords["technique_name"] = _attrs(xr.DataArray([t for _, t in techniques], dims="technique"), None,
                                         "technique name")
    ds.coords["technique_area"] = _attrs(xr.DataArray(tech_area, dims="technique"), None,
                                         "area the technique belongs to")
    ds.coords["outside"] = _attrs(xr.DataArray([int(s in smap.outside) for s in studies], dims="study"), "1",
                                  "no area of the survey fits the study (1)")
    ds.coords["outside_reason"] = _attrs(xr.DataArray([smap.outside.get(s, "") for s in studies], dims="study"),
                                         None, "why no area of the survey fits the study (empty: it covers one)")
    ds.attrs["survey_map"] = Path(smap.source).name
    return ds


def _covered(models: np.ndarray, tech_area: np.ndarray, area_ids: Sequence[str]) -> xr.DataArray:
    any_study = models.max(axis=1) if models.shape[1] else np.zeros(models.shape[0], dtype=models.dtype)
    return xr.DataArray([int(any_study[tech_area == a].sum()) for a in area_ids], dims="area")
