"""The chiplet-scaling study (Hecaton, arXiv 2407.05784): the Dataset, its invariants, and the
effect on the quick workflow's outputs."""

import json

import numpy as np
import pytest
from trainscale.workloads import chiplet as C
from trainscale.common import io as tsio
from trainscale.model.specs import SpecError
from trainscale.studies.chiplet_scaling import chiplet_scaling

STUDY = "chiplet-scaling"


@pytest.fixture(scope="module")
def small():
    return chiplet_scaling("llama2-7b", ["hecaton-standard", "hecaton-advanced"], [2, 4, 8], 8, 8 * 4096)


def test_dataset_shape_units_and_provenance(small):
    assert dict(small.sizes) == {"chiplet": 2, "scheme": 2, "side": 3}
    assert small["chiplets"].values.tolist() == [4, 16, 64]
    for name in list(small.data_vars) + list(small.coords):
        assert small[name].attrs.get("long_name"), name
        assert small[name].attrs.get("units") or small[name].dtype.kind not in "biuf", name
    params = json.loads(small.attrs["parameters"])
    assert params == {"model": "llama2-7b", "chiplets": ["hecaton-standard", "hecaton-advanced"],
                      "mesh_sides": [2, 4, 8], "reference_side": 8, "tokens_per_step": 32768}
    assert small.attrs["seed"] == "none"


def test_values_match_the_api_and_are_deterministic(small):
    one = C.step("1d-tp", 4, "llama2-7b", "hecaton-advanced", 8 * 4096, reference_side=8)
    sel = small.sel(chiplet="hecaton-advanced", scheme="1d-tp", side=4)
    for key, value in one.items():
        assert float(sel[key]) == pytest.approx(value, rel=1e-12), key
    assert float(sel["compute_comm_ratio"]) == pytest.approx(one["compute_s"] / one["comm_s"], rel=1e-12)
    assert float(small["speedup_2d"].sel(chiplet="hecaton-advanced", side=4)) == pytest.approx(
        one["step_s"] / C.step("2d", 4, "llama2-7b", "hecaton-advanced", 8 * 4096, reference_side=8)["step_s"])
    again = chiplet_scaling("llama2-7b", ["hecaton-standard", "hecaton-advanced"], [2, 4, 8], 8, 8 * 4096)
    assert again.equals(small) and again.attrs == small.attrs
    # the model has its catalog width on the reference mesh, where the swept-reference gain is the plain gain
    assert float(small["hidden"].sel(side=8)) == 4096.0
    for var in ("speedup_2d", "energy_reduction_2d"):
        np.testing.assert_allclose(small[f"{var}_catalog_shape"].sel(side=8), small[var].sel(side=8), rtol=1e-12)


def test_weak_scaling_effect(small):
    ratio = small["compute_comm_ratio"]
    for chip in small["chiplet"].values:
        r1 = ratio.sel(chiplet=chip, scheme="1d-tp").values
        r2 = ratio.sel(chiplet=chip, scheme="2d").values
        assert (np.diff(r1) < 0).all() and r1[-1] / r1[-2] < 0.5  # 1D loses it
        assert r2[-1] / r2[-2] > 0.75  # 2D keeps it (ring factor (n-1)/n and attention share aside)
    # the 2D scheme's FLOP utilisation holds up, 1D's falls
    util = small["flops_utilisation"].sel(chiplet="hecaton-standard")
    assert float(util.sel(scheme="2d", side=8)) > 1.5 * float(util.sel(scheme="1d-tp", side=8))
    assert (small["energy_J"] >= 0).all()


def test_errors_name_the_field():
    with pytest.raises(SpecError) as err:
        chiplet_scaling(mesh_sides=[4, 2])
    assert err.value.field == "mesh_sides"
    with pytest.raises(SpecError) as err:
        chiplet_scaling(mesh_sides=[1, 2])
    assert err.value.field == "mesh_sides"
    with pytest.raises(SpecError) as err:
        chiplet_scaling(chiplets=["no-such-chiplet"])
    assert err.value.field == "chiplet"
    with pytest.raises(SpecError) as err:  # 3 sequences cannot be split into whole-sequence blocks of a 2x2 mesh
        chiplet_scaling(mesh_sides=[2], reference_side=2, tokens_per_step=3 * 4096)
    assert err.value.field == "tokens_per_step"
    with pytest.raises(SpecError) as err:
        chiplet_scaling(model="gpt-9")
    assert err.value.field == "model"


# --------------------------------------------------------------------------- quick workflow
@pytest.mark.workflow
def test_chiplet_scaling_shows_hecatons_effect(quick_workflow):
    ds = tsio.read_dataset(quick_workflow / "figures" / STUDY / "chiplet_scaling.nc")
    setting = json.loads(ds.attrs["parameters"])
    sides = ds["side"].values
    ref = int(setting["reference_side"])
    assert setting["model"] == "llama2-70b" and ref in sides and sides.max() >= 16
    for chip in ds["chiplet"].values:
        r1 = ds["compute_comm_ratio"].sel(chiplet=chip, scheme="1d-tp").values
        r2 = ds["compute_comm_ratio"].sel(chiplet=chip, scheme="2d").values
        # 1D loses its ratio (more than halves per doubling of the side at the large end), 2D keeps it
        assert (np.diff(r1) < 0).all()
        assert r1[-1] / r1[-2] < 0.55
        assert r2[-1] / r2[-2] > 0.8
        # at the largest mesh the 2D scheme computes more per byte communicated than 1D
        assert r2[-1] > 1.5 * r1[-1]
    for name in ("compute_comm_ratio", "step_breakdown", "throughput", "energy", "gain"):
        assert (quick_workflow / "figures" / STUDY / f"{name}.png").stat().st_size > 0


def test_compare_reads_the_reference_mesh_and_records_the_sweep(small, tmp_path):
    from trainscale.studies import chiplet_scaling as study

    tsio.write_dataset(small, tmp_path / "chiplet_scaling.nc")
    records = study.compare(tmp_path)
    assert len(records) == 4
    first = records[0]
    values = small["speedup_2d_catalog_shape"].sel(chiplet="hecaton-standard").values
    assert first.our_value == pytest.approx(float(small["speedup_2d"].sel(chiplet="hecaton-standard", side=8)))
    assert (first.our_low, first.our_high) == (pytest.approx(values.min()), pytest.approx(values.max()))
    assert not first.same_setting
