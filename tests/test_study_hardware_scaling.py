"""hardware-scaling on the quick workflow's outputs: invariants of the best-plan grid (the paper comparison is
judged on the committed full data by tests/test_verify.py)."""

import json

import numpy as np
import pytest

from trainscale import io as tsio
from trainscale.specs import SpecError
from trainscale.studies import hardware_scaling as study


@pytest.fixture(scope="module")
def grid(quick_workflow):
    return tsio.read_dataset(quick_workflow / "figures" / "hardware-scaling" / "hardware_scaling.nc")


@pytest.mark.workflow
def test_every_plan_fits_and_is_consistent(grid):
    fits = grid["fits"].values
    per_gpu = grid["tokens_per_s_per_gpu"].values
    assert np.isfinite(per_gpu[fits]).all() and np.isnan(per_gpu[~fits]).all()
    product = (grid["tp"] * grid["pp"] * grid["dp"] * grid["cp"]).values
    gpus = np.broadcast_to(grid["gpus"].values, product.shape)
    assert (product[fits] == gpus[fits]).all()
    np.testing.assert_allclose(grid["tokens_per_s"].values[fits], (per_gpu * gpus)[fits], rtol=1e-12)
    assert (grid["mfu"].values[fits] < 1).all()
    assert json.loads(grid.attrs["parameters"])["stack"] == "fsdp"


@pytest.mark.workflow
def test_a_newer_gpu_gains_less_than_its_peak_ratio(grid):
    peak = grid["peak_flops_per_gpu"]
    ratio = grid["tokens_per_s_per_gpu"].sel(system="dgx-h100") / grid["tokens_per_s_per_gpu"].sel(system="dgx-a100-80gb")
    flops = float(peak.sel(system="dgx-h100") / peak.sel(system="dgx-a100-80gb"))
    assert (ratio.values[np.isfinite(ratio.values)] < flops).all()


@pytest.mark.workflow
def test_compare_needs_the_papers_gpu_counts(grid, tmp_path):
    tsio.write_dataset(grid.sel(gpus=[8, 128]), tmp_path / "hardware_scaling.nc")
    with pytest.raises(ValueError, match="lacks the paper's 128 and 2048"):
        study.compare(tmp_path)


def test_an_unknown_stack_is_named():
    with pytest.raises(SpecError, match="stack"):
        study.hardware_scaling(["llama2-7b"], ["dgx-h100"], [8], stack="jax")
