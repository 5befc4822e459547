"""The validation study's records: one per dataset, judged on the cross-validated error where the dataset was
fitted and on its own error where it never was (synthetic datasets with known errors)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from trainscale.common import io as tsio
from trainscale.studies import validation as study


def synthetic(tmp_path, rel_errors: dict[str, list[float]], left_out: dict[str, float]):
    names = [name for name, errs in rel_errors.items() for _ in errs]
    rel = np.array([e for errs in rel_errors.values() for e in errs])
    ds = xr.Dataset({"rel_error": ("run", rel), "left_out_mape": ("run", [left_out.get(n, np.nan) for n in names])},
                    coords={"run": [f"r{i}" for i in range(len(names))], "dataset": ("run", names)})
    tsio.write_dataset(ds, tmp_path / "validation.nc")
    return {r.quantity.split(":")[0]: r for r in study.compare(tmp_path)}


def test_a_fitted_dataset_is_judged_on_its_left_out_error(tmp_path):
    records = synthetic(tmp_path, {"published": [0.01, -0.03]}, {"published": 0.21})
    rec = records["published"]
    assert rec.our_value == pytest.approx(0.21)  # not the in-sample 2%
    assert rec.paper_value == study.TARGET_MAPE["published"]
    assert rec.verdict == "not reproduced"
    assert "in-sample MAPE 2.0%" in rec.our_setting


def test_the_size_class_reading_is_reported_not_judged(tmp_path):
    ds = xr.Dataset({"rel_error": ("run", [0.01, -0.03]), "left_out_mape": ("run", [0.21, 0.21]),
                     "size_out_mape": ("run", [0.04, 0.04])},
                    coords={"run": ["r0", "r1"], "dataset": ("run", ["published", "published"])})
    tsio.write_dataset(ds, tmp_path / "validation.nc")
    rec = study.compare(tmp_path)[0]
    assert rec.our_value == pytest.approx(0.21) and rec.verdict == "not reproduced"
    assert "4.0% with only each run's model-size class left out" in rec.our_setting


def test_a_left_out_dataset_names_the_separately_fitted_source_of_its_kind(tmp_path):
    """Left out, fsdp-hopper's stack and generation are still fitted on MosaicML's runs (fsdp, hopper): its
    record says so; a dataset of another kind (fsdp-ampere) and the source itself do not."""
    names = ["fsdp-hopper", "fsdp-mosaic", "fsdp-ampere"]
    ds = xr.Dataset({"rel_error": ("run", [0.01, 0.02, 0.03]), "left_out_mape": ("run", [0.06, 0.08, 0.05])},
                    coords={"run": ["r0", "r1", "r2"], "dataset": ("run", names),
                            "stack": ("run", ["fsdp"] * 3), "generation": ("run", ["hopper", "hopper", "ampere"])})
    tsio.write_dataset(ds, tmp_path / "validation.nc")
    records = {r.quantity.split(":")[0]: r for r in study.compare(tmp_path)}
    assert "stay fitted on fsdp-mosaic" in records["fsdp-hopper"].our_setting
    assert records["fsdp-hopper"].our_value == pytest.approx(0.06)
    assert "stay fitted on" not in records["fsdp-ampere"].our_setting
    assert "stay fitted on" not in records["fsdp-mosaic"].our_setting


def test_a_dataset_never_fitted_is_judged_on_its_own_error(tmp_path):
    records = synthetic(tmp_path, {"fsdp-compiled": [0.05, 0.07]}, {})
    assert records["fsdp-compiled"].our_value == pytest.approx(0.06)
    assert records["fsdp-compiled"].verdict == "reproduced"  # the public runs' 8%
    assert "never fitted (held out)" in records["fsdp-compiled"].our_setting
    worse = synthetic(tmp_path, {"fsdp-compiled": [0.10, -0.20]}, {})["fsdp-compiled"]
    assert worse.our_value == pytest.approx(0.15) and worse.verdict == "partly"  # within twice the 8%


def test_a_missing_cross_validation_is_not_reproduced(tmp_path):
    records = synthetic(tmp_path, {"nemo-hopper": [0.01]}, {})
    assert records["nemo-hopper"].verdict == "not reproduced"


def test_every_variable_and_coordinate_is_described():
    """The dataset the notebook saves (public runs, no vTrain): long_name everywhere, units on numbers."""
    from trainscale.model.validation import validation_dataset

    ds = validation_dataset(None)
    for name in list(ds.data_vars) + list(ds.coords):
        assert ds[name].attrs.get("long_name"), name
        if ds[name].dtype.kind in "biuf":
            assert ds[name].attrs.get("units"), name
    assert ds.sizes["run"] > 0 and np.isfinite(ds["rel_error"].values).all()


@pytest.mark.workflow
def test_quick_workflow_writes_described_outputs(quick_workflow):
    from trainscale.common import comparison

    folder = quick_workflow / "figures" / "validation"
    for name in study.OUTPUTS:
        assert (folder / name).stat().st_size > 0, name
    ds = tsio.read_dataset(folder / "validation.nc")
    for name in list(ds.data_vars) + list(ds.coords):
        assert ds[name].attrs.get("long_name"), name
        if ds[name].dtype.kind in "biuf":
            assert ds[name].attrs.get("units"), name
    written = comparison.read_records(folder / comparison.RECORDS_FILE)
    assert comparison.diff_records(study.compare(folder), written) == []


# ----------------------------------------------------------------------------- figures

def test_every_dataset_has_its_own_colour_and_marker_whatever_the_runs_hold():
    """parity.png: no two datasets share a look, and a dataset's look does not depend on which others a run holds
    or in which order (so it is the same in every panel and every mode)."""
    names = [*study.DATASET_STYLE, "zz-new", "aa-new"]
    styles = study.dataset_styles(names)
    assert len(set(styles.values())) == len(names)
    assert study.dataset_styles(names[::-1]) == styles
    assert study.dataset_styles(["aa-new", "bridge-mla"]) == {n: styles[n] for n in ("aa-new", "bridge-mla")}


def test_error_by_run_names_the_error_it_draws(tmp_path):
    """error_by_run.png: the published runs' panel says its bars are in-sample and gives the left-out MAPE the
    record judges; the dataset panel draws the left-out MAPE of a fitted dataset and the error of a never-fitted
    one, and the figure passes the figure check."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trainscale.common import figurecheck, plotting

    names = ["published", "published", "bridge-mla"]
    ds = xr.Dataset({"rel_error": ("run", [0.01, -0.03, 0.4]), "left_out_mape": ("run", [0.21, 0.21, np.nan])},
                    coords={"run": ["a", "b", "c"], "dataset": ("run", names), "model": ("run", ["m1", "m2", "m3"]),
                            "gpus": ("run", [8, 16, 32])})
    tsio.write_dataset(ds, tmp_path / "validation.nc")
    with matplotlib.rc_context(plotting.STYLE):
        fig = study.draw_error_by_run(tmp_path)
        try:
            left, right = fig.axes
            assert "in-sample" in right.get_title() and "21.0% left out of the fit" in right.get_title()
            assert "in-sample" in right.get_xlabel()
            widths = {c.get_label(): [b.get_width() for b in c] for c in left.containers}
            assert widths["left out of the fit (cross-validated): judged"] == pytest.approx([21.0])
            assert widths["never fitted (held out): judged"] == pytest.approx([40.0])
            assert widths["in-sample (fitted on these runs)"] == pytest.approx([2.0])
            assert figurecheck.figure_problems(fig, "error_by_run.png") == []
        finally:
            plt.close(fig)


def _searched_row(mape_pct: float) -> "pd.Series":
    import pandas as pd
    return pd.Series({"runs": 3, "no_fitting_plan": 0, "MAPE_searched_%": mape_pct, "worst_searched_%": 2 * mape_pct,
                      "MAPE_default_%": mape_pct + 1, "MAPE_searched_low_%": mape_pct - 1,
                      "MAPE_searched_high_%": mape_pct + 1})


def test_a_searched_record_is_in_sample_only_where_the_dataset_was_fitted():
    """The searched-knob record of a fitted dataset is in-sample, so it carries no verdict; that of a dataset never
    fitted is out of sample: labelled held out and judged on the target (12% against 8%: within twice it)."""
    fitted = study._searched_record("published", _searched_row(3.0))
    assert "in-sample" in fitted.quantity and fitted.verdict == "not tested"
    held = study._searched_record("bridge-hopper", _searched_row(12.0))
    assert "in-sample" not in held.quantity + held.our_setting and "held out" in held.quantity
    assert held.our_value == pytest.approx(0.12) and held.verdict == "partly"
    assert study._searched_record("bridge-hopper", _searched_row(5.0)).verdict == "reproduced"


def test_a_dataset_never_fitted_does_not_call_its_error_in_sample(tmp_path):
    records = synthetic(tmp_path, {"bridge-hopper": [0.05, 0.07]}, {})
    assert "in-sample" not in records["bridge-hopper"].our_setting
    assert "never fitted (held out); MAPE 6.0%" in records["bridge-hopper"].our_setting
