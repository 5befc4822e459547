"""survey-map: the map file's checks (one-line errors), the coverage arrays against hand counts, compare()."""

import math
import textwrap

import numpy as np
import pytest
import yaml

from trainscale.common import comparison
from trainscale.studies import surveymap
from trainscale.common import io as tsio
from trainscale.model.specs import SpecError
from trainscale.studies import survey_map as study

STUDY = "survey-map"

SMALL = textwrap.dedent("""\
    stages: [training, inference]
    focus: [distributed training, inference and optimization]
    areas:
      - {id: par, stage: training, focus: distributed training, title: parallelism, techniques: [dp, tp, pp]}
      - {id: mem, stage: training, focus: distributed training, title: memory, techniques: [recompute]}
      - {id: srv, stage: inference, focus: inference and optimization, title: serving, techniques: [kv, batching]}
    studies:
      a: {covers: {par: [dp, tp], srv: [kv]}}
      b: {covers: {par: [dp]}}
      c: {outside: "a control workload"}
    """)
KNOWN = ("a", "b", "c")


def write(tmp_path, text, name="map.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_small_map_counts_by_hand(tmp_path):
    ds = surveymap.coverage_dataset(surveymap.load_map(write(tmp_path, SMALL), KNOWN))
    assert ds["techniques_modelled"].sel(study="a").values.tolist() == [2, 0, 1]
    assert ds["studies_per_area"].values.tolist() == [2, 0, 1]
    assert ds["techniques_covered"].values.tolist() == [2, 0, 1]  # dp, tp of par; kv of srv
    assert ds["techniques_listed"].values.tolist() == [3, 1, 2]
    assert ds["studies_per_technique"].values.tolist() == [2, 1, 0, 0, 1, 0]
    assert ds["areas_per_study"].values.tolist() == [2, 1, 0]
    assert ds["outside"].values.tolist() == [0, 0, 1]
    assert study.gaps(ds) == {"areas": ["mem"], "techniques": [("par", "pp"), ("mem", "recompute"), ("srv", "batching")]}


def test_coverage_equals_a_brute_force_count_on_the_package_map():
    """Every count of the dataset against a direct count over the file's entries."""
    raw = yaml.safe_load(surveymap.DEFAULT_MAP.read_text())
    smap = surveymap.load_map(known=list(raw["studies"]))
    ds = surveymap.coverage_dataset(smap)
    for area in raw["areas"]:
        users = [s for s, e in raw["studies"].items() if area["id"] in e.get("covers", {})]
        done = {t for e in raw["studies"].values() for t in e.get("covers", {}).get(area["id"], [])}
        assert int(ds["studies_per_area"].sel(area=area["id"])) == len(users)
        assert int(ds["techniques_covered"].sel(area=area["id"])) == len(done)
    assert int(ds["models"].sum()) == sum(len(t) for e in raw["studies"].values() for t in e.get("covers", {}).values())


def test_the_package_map_lists_every_study_of_the_project():
    smap = surveymap.load_map()  # strict: the project's studies, each once
    assert sorted(smap.studies) == sorted(surveymap.project_studies())
    assert len(smap.studies) >= 23


@pytest.mark.parametrize("edit, field, value", [
    (("c: {outside: \"a control workload\"}", "z: {outside: x}"), "studies.z", "z"),
    (("a: {covers: {par: [dp, tp], srv: [kv]}}", "a: {covers: {par: [dp, xx]}}"), "studies.a.covers.par", "xx"),
    (("b: {covers: {par: [dp]}}", "b: {covers: {nope: [dp]}}"), "studies.b.covers", "nope"),
    (("b: {covers: {par: [dp]}}", "b: {covers: {par: [dp]}, outside: y}"), "studies.b", ["covers", "outside"]),
    (("b: {covers: {par: [dp]}}", "b: {covers: {par: [dp, dp]}}"), "studies.b.covers.par", "dp"),
    (("stage: inference,", "stage: deploy,"), "areas.srv.stage", "deploy"),
    (("id: mem,", "id: par,"), "areas[1].id", "par"),
    (("id: mem,", "id: Mem_1,"), "areas[1].id", "Mem_1"),
    (("techniques: [recompute]", "techniques: []"), "areas.mem.techniques", []),
])
def test_bad_map_gives_one_line_naming_the_field(tmp_path, edit, field, value):
    old, new = edit
    assert old in SMALL
    with pytest.raises(SpecError) as err:
        surveymap.load_map(write(tmp_path, SMALL.replace(old, new)), KNOWN)
    msg = str(err.value)
    assert err.value.field == field and err.value.value == value, msg
    assert "\n" not in msg and "map.yaml" in msg


def test_unknown_and_missing_studies_are_errors(tmp_path):
    path = write(tmp_path, SMALL)
    with pytest.raises(SpecError) as err:
        surveymap.load_map(path, ("a", "b"))
    assert err.value.field == "studies.c" and "not a study of the project" in str(err.value)
    with pytest.raises(SpecError) as err:
        surveymap.load_map(path, KNOWN + ("d",))
    assert err.value.field == "studies" and err.value.value == "d"


@pytest.mark.parametrize("text, field", [("stages: [a]\n", "(top level).focus"), ("- 1\n", "(top level)"),
                                         ("a: [\n", "survey_map"), (SMALL + "extra: 1\n", "(top level).extra")])
def test_malformed_files_give_one_line(tmp_path, text, field):
    with pytest.raises(SpecError) as err:
        surveymap.load_map(write(tmp_path, text), KNOWN)
    assert err.value.field == field and "\n" not in str(err.value)
    with pytest.raises(SpecError, match="no such file"):
        surveymap.load_map(tmp_path / "missing.yaml", KNOWN)


def test_dataset_is_annotated(tmp_path):
    ds = surveymap.coverage_dataset(surveymap.load_map(write(tmp_path, SMALL), KNOWN))
    for name in [*ds.data_vars, *ds.coords]:
        assert ds[name].attrs.get("long_name"), name
        if ds[name].dtype.kind in "iufb":
            assert "units" in ds[name].attrs, name


def test_compare_records_the_coverage(tmp_path, monkeypatch):
    monkeypatch.setattr(surveymap, "project_studies", lambda: KNOWN)
    ds = study.survey_map_study(write(tmp_path, SMALL))
    tsio.write_dataset(ds, tmp_path / "survey_map.nc")
    areas, techniques = study.compare(tmp_path)
    assert areas.our_value == pytest.approx(2 / 3) and techniques.our_value == pytest.approx(3 / 6)
    for r in (areas, techniques):
        assert math.isnan(r.paper_value) and r.verdict == "not tested" and "no numbers" in r.reason
    assert "mem" in areas.reason and "batching (srv)" in techniques.reason
    # a map where no study covers anything is recorded as not reproduced (coverage 0)
    empty = SMALL.replace("a: {covers: {par: [dp, tp], srv: [kv]}}", "a: {outside: x}").replace(
        "b: {covers: {par: [dp]}}", "b: {outside: y}")
    tsio.write_dataset(study.survey_map_study(write(tmp_path, empty, "empty.yaml")), tmp_path / "survey_map.nc")
    assert [r.verdict for r in study.compare(tmp_path)] == ["not reproduced"] * 2


def test_quick_workflow_writes_the_outputs(quick_workflow):
    folder = quick_workflow / "figures" / STUDY
    for name in study.OUTPUTS:
        assert (folder / name).stat().st_size > 0, name
    written = comparison.read_records(folder / comparison.RECORDS_FILE)
    assert comparison.diff_records(study.compare(folder), written) == []
    assert np.isclose(written[0].our_value, float((tsio.read_dataset(folder / "survey_map.nc")["studies_per_area"] > 0).mean()))
