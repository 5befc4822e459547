"""survey-map: which study covers which area of Amini et al., "Distributed LLMs and Multimodal Large Language
Models: A Survey on Advances, Challenges, and Future Directions" (arXiv 2503.16585).

The survey reviews distributed training, inference, fine-tuning and deployment of (multimodal) language models
and sorts the literature into six focus areas of decentralization. It has no numbers to reproduce. This study
draws the map of the project against it: the survey's areas (the four stages crossed with the focus areas,
each with its techniques) against every study of the project and the techniques each models, read from the
documented data file ``trainscale/data/survey_map.yaml`` (checked by :func:`trainscale.surveymap.load_map`:
a name that is not a study of the project, or a study missing from the map, is a one-line error), with the
gaps (areas and techniques no study models) shown. Its record is the coverage, not a reproduction.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import xarray as xr

from .. import comparison
from .. import io as tsio
from .. import surveymap
from ..io import provenance

__all__ = ["PAPER", "OUTPUTS", "RESOURCES", "compare", "survey_map_study", "gaps"]

PAPER = ("Amini et al., Distributed LLMs and Multimodal Large Language Models: A Survey on Advances, Challenges, "
         "and Future Directions (arXiv 2503.16585, 2025)")
OUTPUTS = ("survey_map.nc", "survey_map.png", "techniques.png")
RESOURCES = {"mem_mb": 500, "runtime_quick_min": 1, "runtime_full_min": 1}
STUDY = "survey-map"
NO_NUMBERS = ("the survey has no numbers to reproduce: this records the project's coverage of its areas (from "
              "the map file), not a reproduction, so it is not tested")
PAPER_SETTING = ("a survey (no experiments): distributed training, inference, fine-tuning and deployment of LLMs "
                 "and MLLMs, sorted into six focus areas of decentralization")


def survey_map_study(map_file: str | Path | None = None) -> xr.Dataset:
    """The coverage dataset (:func:`trainscale.surveymap.coverage_dataset`) of the checked map ``map_file``
    (default: the package's), with the file's name and contents' provenance."""
    smap = surveymap.load_map(map_file)
    ds = surveymap.coverage_dataset(smap)
    ds.attrs.update(provenance({"map_file": str(Path(smap.source).name), "stages": list(smap.stages),
                                "focus": list(smap.focus)}))
    return ds


def gaps(ds: xr.Dataset) -> dict:
    """What no study models: ``areas`` (ids), and ``techniques`` as (area, technique) pairs."""
    areas = [str(a) for a in ds["area"].values[ds["studies_per_area"].values == 0]]
    none = ds["studies_per_technique"].values == 0
    techniques = list(zip(ds["technique_area"].values[none].astype(str), ds["technique_name"].values[none].astype(str)))
    return {"areas": areas, "techniques": techniques}


def compare(folder) -> list[comparison.Record]:
    """The coverage from the saved dataset: areas covered / areas, techniques covered / techniques. The survey
    gives no number, so each is a directional record (never "partly": "not tested" while above zero) whose
    note says so."""
    ds = tsio.read_dataset(Path(folder) / "survey_map.nc")
    n_areas = int(ds.sizes["area"])
    covered = int((ds["studies_per_area"] > 0).sum())
    listed, modelled = int(ds["techniques_listed"].sum()), int(ds["techniques_covered"].sum())
    g = gaps(ds)
    studies = int(ds.sizes["study"])
    outside = [str(s) for s in ds["study"].values[ds["outside"].values == 1]]
    ours = (f"{studies} studies mapped from {json.loads(ds.attrs['parameters'])['map_file']} "
            f"({len(outside)} outside every area: {', '.join(outside)})")
    by_stage = ", ".join(f"{stage} {int((sub['studies_per_area'] > 0).sum())}/{int(sub.sizes['area'])}"
                         for stage, sub in _by_stage(ds))
    return [
        comparison.directional(
            STUDY, "share of the survey's areas covered by at least one study", "1", paper_direction=1,
            paper_setting=PAPER_SETTING, our_value=covered / n_areas, our_setting=ours, neutral=0.0,
            note=f"{covered} of {n_areas} areas (by stage: {by_stage}); gaps: {', '.join(g['areas']) or 'none'}; "
                 + NO_NUMBERS),
        comparison.directional(
            STUDY, "share of the areas' techniques modelled by at least one study", "1", paper_direction=1,
            paper_setting=PAPER_SETTING, our_value=modelled / listed, our_setting=ours, neutral=0.0,
            note=f"{modelled} of {listed} techniques; not modelled: "
                 + "; ".join(f"{t} ({a})" for a, t in g["techniques"]) + "; " + NO_NUMBERS),
    ]


def _by_stage(ds: xr.Dataset):
    seen = list(dict.fromkeys(ds["stage"].values.astype(str)))
    for stage in seen:
        yield stage, ds.isel(area=np.flatnonzero(ds["stage"].values == stage))
