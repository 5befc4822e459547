"""survey-map: which study covers which area of Amini et al., "Distributed LLMs and Multimodal Large Language
Models: A Survey on Advances, Challenges, and Future Directions" (arXiv 2503.16585).

The survey reviews distributed training, inference, fine-tuning and deployment of (multimodal) language models
and sorts the literature into six focus areas of decentralization. It has no numbers to reproduce. This study
draws the map of the project against it: the survey's areas (the four stages crossed with the focus areas,
each with its techniques) against every study of the project and the techniques each models, read from the
documented data file ``trainscale/data/survey_map.yaml`` (checked by :func:`trainscale.studies.surveymap.load_map`:
a name that is not a study of the project, or a study missing from the map, is a one-line error), with the
gaps (areas and techniques no study models) shown. Its record is the coverage, not a reproduction.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import xarray as xr

from ..common import comparison, figurecheck, plotting
from ..common import io as tsio
from . import surveymap
from ..common.io import provenance

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
    """The coverage dataset (:func:`trainscale.studies.surveymap.coverage_dataset`) of the checked map ``map_file``
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


# ---------------------------------------------------------------------------------------------
# figures (drawn from the saved datasets alone; `trainscale verify` redraws and checks them)

def draw_survey_map(folder):
    """The survey's areas (rows) against the studies (columns): techniques of the area each study models, the
    areas no study covers shaded, the studies outside the survey greyed."""
    import matplotlib.pyplot as plt

    ds = tsio.read_dataset(Path(folder) / "survey_map.nc")
    STAGE_COLORS = _stage_colors(ds)
    areas, studies = ds["area"].values.astype(str), ds["study"].values.astype(str)
    n_a, n_s = len(areas), len(studies)
    fig, ax = plt.subplots(figsize=(11, 0.36 * n_a + 2.8), layout="constrained")
    fig.get_layout_engine().set(w_pad=0.1, h_pad=0.1)  # the longest labels keep clear of the edges
    ax.grid(False)
    for i, area in enumerate(areas):
        stage = str(ds["stage"].values[i])
        if int(ds["studies_per_area"].values[i]) == 0:
            ax.axhspan(i - 0.5, i + 0.5, color="#D55E00", alpha=0.12, lw=0)
        for j, s in enumerate(studies):
            k = int(ds["techniques_modelled"].values[i, j])
            if k:
                ax.scatter(j, i, s=90 + 40 * k, marker="s", color=STAGE_COLORS[stage], zorder=3)
                ax.text(j, i, str(k), ha="center", va="center", color="white", fontsize=7, zorder=4)
        covered, listed = int(ds["techniques_covered"].values[i]), int(ds["techniques_listed"].values[i])
        gap = int(ds["studies_per_area"].values[i]) == 0
        ax.text(n_s - 0.2, i, f"{covered}/{listed}" + ("  gap" if gap else ""), va="center", fontsize=8,
                color="#D55E00" if gap else "0.2", fontweight="bold" if gap else "normal")
    for j, s in enumerate(studies):
        if int(ds["outside"].values[j]):
            ax.axvspan(j - 0.5, j + 0.5, color="0.85", alpha=0.6, lw=0)
    stages = ds["stage"].values.astype(str)
    for i in range(1, n_a):
        if stages[i] != stages[i - 1]:
            figurecheck.guide(ax.axhline(i - 0.5, color="0.4", lw=0.8))  # between stages
    ax.set_yticks(np.arange(n_a), [f"{stages[i]}: {t}" for i, t in enumerate(ds["title"].values.astype(str))])
    for tick, stage in zip(ax.get_yticklabels(), stages):
        tick.set_color(STAGE_COLORS[stage])
    ax.set_xticks(np.arange(n_s), [s + (" (outside)" if int(o) else "") for s, o in zip(studies, ds["outside"].values)],
                  rotation=90)
    for tick, o in zip(ax.get_xticklabels(), ds["outside"].values):
        if int(o):
            tick.set_color("0.5")
    ax.set_xlim(-0.6, n_s + 2.2)
    ax.set_ylim(-0.5, n_a - 0.5)
    figurecheck.invert_on_purpose(ax, "y")  # the survey's order, top to bottom
    ax.set_title("The survey's areas and the studies that model them (cell: techniques of the area modelled; "
                 "right: covered / listed)", fontsize=9)
    return fig


def _stage_colors(ds: xr.Dataset) -> dict:
    return dict(zip(list(dict.fromkeys(ds["stage"].values.astype(str))), ["#0072B2", "#E69F00", "#009E73", "#CC79A7"]))


def draw_techniques(folder):
    """Studies modelling each technique of the survey (bars coloured by stage, a cross for a gap), grouped by area."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ds = tsio.read_dataset(Path(folder) / "survey_map.nc")
    STAGE_COLORS = _stage_colors(ds)
    areas, stages = ds["area"].values.astype(str), ds["stage"].values.astype(str)
    names = ds["technique_name"].values.astype(str)
    tech_area = ds["technique_area"].values.astype(str)
    count = ds["studies_per_technique"].values
    title_of = dict(zip(areas, ds["title"].values.astype(str)))
    stage_of = dict(zip(areas, stages))
    y = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(8, 0.16 * len(names) + 1.2), layout="constrained")
    ax.grid(True, axis="x")
    ax.grid(False, axis="y")
    colors = [STAGE_COLORS[stage_of[a]] for a in tech_area]
    ax.barh(y, count, color=colors, height=0.7)
    zero = count == 0
    ax.plot(np.zeros(zero.sum()), y[zero], "x", color="#D55E00", ms=5, mew=1.5)
    ax.set_yticks(y, [f"{n}" for n in names], fontsize=6.5)
    for i in range(1, len(names)):
        if tech_area[i] != tech_area[i - 1]:
            figurecheck.guide(ax.axhline(i - 0.5, color="0.7", lw=0.6))  # between areas
    for a in areas:
        rows = np.flatnonzero(tech_area == a)
        ax.text(count.max() + 0.3, rows.mean(), title_of[a], va="center", ha="left", fontsize=7,
                color=STAGE_COLORS[stage_of[a]])
    ax.set_xlim(-0.4, count.max() + 5.5)
    ax.set_ylim(-0.5, len(names) - 0.5)
    figurecheck.invert_on_purpose(ax, "y")  # the survey's order, top to bottom
    ax.set_xlabel(plotting.label(ds["studies_per_technique"]))
    ax.set_xticks(np.arange(0, count.max() + 1, 2))
    handles = [Patch(color=c, label=s) for s, c in STAGE_COLORS.items()]
    handles.append(Line2D([], [], ls="none", marker="x", color="#D55E00", mew=1.5, label="no study (gap)"))
    ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(0.6, 0.01), title="stage")
    return fig


#: the figures drawn from the saved datasets alone (file name -> function of the output folder)
FIGURES = {"survey_map.png": draw_survey_map, "techniques.png": draw_techniques}
