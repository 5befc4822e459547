"""Sweeps that split: chunked evaluation equals the unsplit one; zarr for large results; the
workflow's sweep rules (plan sweep and papermill sweep) in quick mode."""

import json

import numpy as np
import pytest
import xarray as xr
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import QUICK_CONFIG, REPO_ROOT, run_snakemake, tail
from trainscale.common import io as tsio
from trainscale.model import sweep
from trainscale.model.specs import SpecError

SPEC = {"model": "llama2-7b", "systems": ["dgx-a100-80gb", "dgx-h100"], "gpus": [64, 128], "global_batch": 256,
        "space": {"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "micro_batch": [1, 2], "recompute": ["none", "full"],
                  "zero": [0, 3]}}


@pytest.fixture(scope="module")
def unsplit():
    return sweep.evaluate(SPEC)


@settings(max_examples=8, deadline=None)
@given(chunks=st.integers(1, 16))
def test_chunked_equals_unsplit(unsplit, chunks):
    n_units = len(sweep.units(SPEC))
    chunks = min(chunks, n_units)
    parts = [sweep.evaluate_units(SPEC, sweep.chunk_units(SPEC, i, chunks)) for i in range(chunks)]
    assert sum(p.sizes["unit"] for p in parts) == n_units
    xr.testing.assert_identical(sweep.gather(SPEC, parts[::-1]), unsplit)  # order of chunks does not matter


def test_unsplit_equals_the_grid(unsplit):
    from trainscale.model import perfmodel

    grid = perfmodel.evaluate_grid("llama2-7b", "dgx-h100", 128, 256, **SPEC["space"])
    part = unsplit.sel(system="dgx-h100", gpus=128)
    for name in sweep.SWEEP_VARS:
        np.testing.assert_array_equal(part[name].transpose(*grid[name].dims).values, grid[name].values)


def test_gather_rejects_missing_and_duplicate_units():
    parts = [sweep.evaluate_units(SPEC, sweep.chunk_units(SPEC, i, 4)) for i in range(4)]
    with pytest.raises(SpecError, match="missing"):
        sweep.gather(SPEC, parts[:3])
    with pytest.raises(SpecError, match="two chunks"):
        sweep.gather(SPEC, parts + parts[:1])


def test_large_sweeps_go_to_zarr(tmp_path, unsplit, monkeypatch):
    assert sweep.output_format(SPEC) == "nc"
    monkeypatch.setattr(sweep, "ZARR_THRESHOLD_BYTES", 1)
    assert sweep.output_format(SPEC) == "zarr"
    path = sweep.write(unsplit, tmp_path / "s.zarr")
    xr.testing.assert_identical(sweep.read(path), unsplit)
    assert not (tmp_path / "s.zarr.tmp").exists()


@pytest.mark.parametrize("change, field", [
    ({"space": {"pp": [1]}}, "space.tp"),
    ({"space": {"tp": [1], "pipeline": [2]}}, "space.pipeline"),
    ({"systems": ["dgx-z100"]}, "system"),
    ({"gpus": [0]}, "gpus"),
    ({"chunks": 0}, "chunks"),
    ({"colour": "red"}, "colour"),
])
def test_bad_sweep_spec_names_the_field(change, field):
    with pytest.raises(SpecError) as err:
        sweep.check_spec({**SPEC, **change})
    assert err.value.field == field


@pytest.fixture(scope="module")
def quick_sweeps():
    proc = run_snakemake("sweeps", "--cores", "2", *QUICK_CONFIG)
    if proc.returncode != 0:
        pytest.fail(f"quick sweeps failed:\n{tail(proc.stdout)}", pytrace=False)
    return REPO_ROOT / "results" / "quick" / "sweeps"


# slow: runs the split sweep workflow (18 s); CI runs it (make test-all)
@pytest.mark.slow
@pytest.mark.workflow
def test_workflow_plan_sweep_equals_unsplit(quick_sweeps):
    config = yaml.safe_load((REPO_ROOT / "config" / "config.yaml").read_text())
    spec = config["sweeps"]["gpt3-plans"]["quick"]
    assert spec["chunks"] > 1
    chunks = sorted((quick_sweeps / "gpt3-plans").glob("chunk-*.nc"))
    assert len(chunks) == spec["chunks"]
    gathered = sweep.read(quick_sweeps / "gpt3-plans.nc")
    reference = sweep.evaluate(spec)
    xr.testing.assert_equal(gathered, reference)
    assert gathered.attrs["parameters"] == reference.attrs["parameters"]


# slow: shares the split sweep workflow (18 s) with the test above; CI runs it (make test-all)
@pytest.mark.slow
@pytest.mark.workflow
def test_workflow_notebook_sweep_stacks_parameter_sets(quick_sweeps):
    config = yaml.safe_load((REPO_ROOT / "config" / "config.yaml").read_text())
    entry = config["notebook_sweeps"]["hardware-scaling-batch"]
    combined = tsio.read_dataset(quick_sweeps / "hardware-scaling-batch.nc")
    assert combined.sizes["parameter_set"] == len(entry["quick"])
    for i, overrides in enumerate(entry["quick"]):
        alone = tsio.read_dataset(quick_sweeps / "hardware-scaling-batch" / f"set-{i}" / entry["dataset"])
        xr.testing.assert_equal(combined.isel(parameter_set=i, drop=True)["tokens_per_s"], alone["tokens_per_s"])
        assert f'"global_batch_tokens": {overrides["global_batch_tokens"]}' in alone.attrs["parameters"]
        executed = quick_sweeps / "notebooks" / f"hardware-scaling-batch-set-{i}.ipynb"
        assert executed.exists()
    # the swept value is a coordinate: select and plot against it
    assert combined["global_batch_tokens"].values.tolist() == [o["global_batch_tokens"] for o in entry["quick"]]
    # a bigger global batch keeps the GPUs busier: per-GPU throughput at the largest count rises
    per_gpu = combined["tokens_per_s_per_gpu"].sel(strategy="fsdp").isel(gpus=-1)
    assert (per_gpu.isel(parameter_set=-1) >= per_gpu.isel(parameter_set=0)).all()


def test_combine_puts_swept_parameters_on_coordinates(tmp_path):
    paths = []
    for i, (batch, systems) in enumerate([(1024, ["a"]), (2048, ["a", "b"])]):
        ds = xr.Dataset({"tokens_per_s": ("gpus", np.array([1.0, 2.0]) * (i + 1), {"units": "tokens/s",
                                                                                    "long_name": "throughput"})},
                        coords={"gpus": [8, 16]})
        ds.attrs["parameters"] = json.dumps({"global_batch": batch, "systems": systems, "gpus": [8, 16],
                                             "seed": 0})
        paths.append(tsio.write_dataset(ds, tmp_path / f"set-{i}.nc"))
    combined = sweep.combine(paths, "parameter_set", ["0", "1"])
    assert combined["global_batch"].dims == ("parameter_set",)
    assert combined["global_batch"].values.tolist() == [1024, 2048]
    assert combined["systems"].values.tolist() == ['["a"]', '["a", "b"]']  # lists as their JSON text
    assert "seed" not in combined.coords and "swept_gpus" not in combined.coords  # not swept
    by_batch = combined.swap_dims(parameter_set="global_batch")
    np.testing.assert_array_equal(by_batch["tokens_per_s"].sel(global_batch=2048).values, [2.0, 4.0])
    assert sweep.swept_parameters([{"gpus": 1}, {"gpus": 2}]) == {"gpus": [1, 2]}
