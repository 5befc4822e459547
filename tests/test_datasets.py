"""The committed full-mode datasets (figures/<study>/*.nc) as a reader meets them: every variable and
coordinate says its units and long_name, and a dimension has one spelling across studies. Reads the
committed files only (seconds); the quick-workflow tests check the same on fresh runs."""

from __future__ import annotations

import pytest
import xarray as xr
import yaml

from conftest import REPO_ROOT

CONFIG = yaml.safe_load((REPO_ROOT / "config" / "config.yaml").read_text())
DATASETS = sorted(p.relative_to(REPO_ROOT / "figures").as_posix()
                  for study in CONFIG["studies"] for p in (REPO_ROOT / "figures" / study).glob("*.nc"))

#: one name per quantity: a dimension or coordinate spelled otherwise is renamed to the name here
CANONICAL = {"bandwidth": "bandwidth_GBps", "network_GBps": "bandwidth_GBps", "link_GBps": "bandwidth_GBps",
             "network_GBps_per_node": "bandwidth_GBps", "n_gpus": "gpus", "num_gpus": "gpus"}

pytestmark = pytest.mark.verify


def test_every_study_has_committed_datasets():
    studies = {path.split("/")[0] for path in DATASETS}
    assert studies == set(CONFIG["studies"]), set(CONFIG["studies"]) - studies


def required_attrs(var: xr.DataArray) -> tuple[str, ...]:
    """long_name for everything; units for numbers (labels such as a model's name have none)."""
    return ("units", "long_name") if var.dtype.kind in "biufcmM" else ("long_name",)


@pytest.mark.parametrize("relpath", DATASETS)
def test_every_variable_and_coordinate_has_units_and_long_name(relpath):
    with xr.open_dataset(REPO_ROOT / "figures" / relpath, engine="h5netcdf") as ds:
        lacking = {name: [k for k in required_attrs(ds[name]) if not ds[name].attrs.get(k)]
                   for name in [*ds.data_vars, *ds.coords]}
    lacking = [f"{name} ({', '.join(keys)})" for name, keys in lacking.items() if keys]
    assert not lacking, f"{relpath}: without units or long_name: {', '.join(lacking)}"


@pytest.mark.parametrize("relpath", DATASETS)
def test_one_spelling_per_dimension(relpath):
    with xr.open_dataset(REPO_ROOT / "figures" / relpath, engine="h5netcdf") as ds:
        wrong = {name: CANONICAL[name] for name in [*ds.dims, *ds.coords] if name in CANONICAL}
    assert not wrong, f"{relpath}: rename {wrong}"
