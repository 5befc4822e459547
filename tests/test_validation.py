"""Accuracy against measured runs, and the calibration that produces it."""

from pathlib import Path

import numpy as np
import pytest

from trainscale import calibration, catalog, perfmodel, validation

VTRAIN_DIR = Path(__file__).resolve().parents[2] / "shared/validation/vtrain"
needs_vtrain = pytest.mark.skipif(not (VTRAIN_DIR / "ground_truth_multi.csv").is_file(),
                                  reason=f"vTrain ground truth not found at {VTRAIN_DIR}")


@pytest.fixture(scope="module")
def published():
    return validation.validation_dataset()


def test_published_runs_accuracy(published):
    ds = published
    assert set(ds["dataset"].values) == {"published"}
    assert ds.sizes["run"] >= 20
    ape = np.abs(ds["rel_error"].values)
    assert np.all(np.isfinite(ape)), ds["run"].values[~np.isfinite(ape)]
    mape, worst = float(ape.mean()), float(ape.max())
    worst_run = str(ds["run"].values[int(ape.argmax())])
    msg = f"published runs: MAPE {100 * mape:.2f}%, worst {100 * worst:.2f}% ({worst_run})"
    assert mape <= 0.10, msg
    assert worst <= 0.20, msg
    assert ds.attrs["mape_published"] == pytest.approx(mape, rel=1e-12)
    assert ds.attrs["max_abs_error_published"] == pytest.approx(worst, rel=1e-12)


@needs_vtrain
def test_vtrain_multi_accuracy():
    ds = validation.validation_dataset(VTRAIN_DIR)
    sel = ds["dataset"].values == "vtrain-multi"
    assert sel.sum() >= 100
    ape = np.abs(ds["rel_error"].values[sel])
    mape = float(ape.mean())
    assert mape <= 0.15, f"vTrain multi-node: MAPE {100 * mape:.2f}%, worst {100 * ape.max():.2f}%"


def test_calibration_values_within_bounds():
    cal = catalog.calibration()
    fitted = catalog.fitted_calibration()
    checked = 0
    for generation, params in cal["fitted"].items():
        for name in perfmodel.FITTED:
            lo, hi = (float(b) for b in params[name]["bounds"])
            start = float(params[name]["value"])
            assert lo <= start <= hi, (generation, name, start, (lo, hi))
            if name in fitted.get(generation, {}):
                value = float(fitted[generation][name])
                assert lo <= value <= hi, (generation, name, value, (lo, hi))
                checked += 1
    assert checked == len(perfmodel.FITTED)  # ampere has a fitted value for every parameter
    # every generation takes its parameters from a generation that has them
    for generation, entry in cal["generations"].items():
        params = perfmodel.calibration_parameters(generation)
        assert set(params) == set(perfmodel.FITTED)
        assert entry["fitted_from"] in cal["fitted"]


@needs_vtrain
def test_calibration_fit_reproduces_stored_values():
    result = calibration.fit(VTRAIN_DIR, "ampere")
    stored = catalog.fitted_calibration()["ampere"]
    assert result["datasets"] == ["published", "vtrain-multi"]
    for name in perfmodel.FITTED:
        assert result["values"][name] == pytest.approx(float(stored[name]), rel=0.02), (
            name, result["values"][name], stored[name])
    assert result["errors"]["published"]["mape"] <= 0.10
    assert result["errors"]["vtrain-multi"]["mape"] <= 0.15
