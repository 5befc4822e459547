"""Batch-size study (Tyagi & Wang, Tula, arXiv 2603.18112): unit tests of the study functions and
of its comparison record, and the quick workflow's plumbing (the paper comparison is judged on the
committed full datasets by ``trainscale verify``)."""

import json
import math

import numpy as np
import pytest
from trainscale.common import comparison
from trainscale.common import io as tsio
from trainscale.model.specs import SpecError
from trainscale.studies import batch_size

STUDY = "batch-size"


def _dataset(results):
    return tsio.read_dataset(results / "figures" / STUDY / "batch_size.nc")


# --------------------------------------------------------------------------- quick workflow plumbing
# (the paper comparison is judged on the committed full datasets by ``trainscale verify``)
@pytest.mark.workflow
def test_quick_outputs_are_written_and_consistent(quick_workflow):
    folder = quick_workflow / "figures" / STUDY
    for name in (*batch_size.OUTPUTS, comparison.RECORDS_FILE):
        assert (folder / name).stat().st_size > 0, name
    assert comparison.diff_records(batch_size.compare(folder),
                                   comparison.read_records(folder / comparison.RECORDS_FILE)) == []
    ds = _dataset(quick_workflow)
    t = ds["time_to_target_s"]
    largest = tuple(ds.attrs["largest"])
    assert largest == (int(ds["global_batch"].max()), int(ds["nodes"].max()))
    # a batch that does not split over the GPUs is NaN with its reason
    reason = ds["reason"].values
    assert (np.isnan(t.values) == (reason != 0)).all()
    assert (reason == 1).any()
    for name in list(ds.data_vars) + list(ds.coords):
        assert "units" in ds[name].attrs and "long_name" in ds[name].attrs, name


# --------------------------------------------------------------------------- unit tests (no workflow)
SMALL = {"n_samples": 256, "dim": 8, "hidden": 4, "global_batches": [4, 64], "lrs": [0.2, 0.8], "budget_steps": 20,
             "budget_samples": 400, "evals_per_run": 20, "seed": 1}


def test_sweep_is_deterministic_and_labelled():
    a = batch_size.steps_to_target_sweep(**SMALL)
    b = batch_size.steps_to_target_sweep(**SMALL)
    assert a.identical(b)
    for name, var in a.data_vars.items():
        assert "units" in var.attrs and "long_name" in var.attrs, name
    assert a["steps_to_target"].dims == ("global_batch", "lr")
    assert int(a.attrs["seed"]) == 1
    # the target lies between the floor and the start
    assert float(a["floor_loss"]) < float(a["target_loss"]) < float(a["initial_loss"])


def test_budget_follows_the_steps_curve():
    steps, every = batch_size._budget(8, 50, 8000, 100)
    assert steps >= 50 + 1000 and steps % every == 0 and every == (50 + 1000) // 100
    steps, every = batch_size._budget(8192, 50, 8000, 100)
    assert steps == 51 and every == 1


def test_step_costs_mark_infeasible_cells_and_scale_with_the_batch():
    ds = batch_size.step_costs("llama2-1b", "dgx-a100-80gb", [8, 64, 512], [1, 8])
    t = ds["step_time_s"]
    assert math.isnan(float(t.sel(global_batch=8, nodes=8)))
    assert int(ds["reason"].sel(global_batch=8, nodes=8)) == 1
    # at a fixed node count a bigger batch takes longer per step; at a fixed batch more nodes are faster
    assert float(t.sel(global_batch=512, nodes=1)) > float(t.sel(global_batch=64, nodes=1))
    assert float(t.sel(global_batch=512, nodes=8)) < float(t.sel(global_batch=512, nodes=1))
    # a slower scale-out network never makes a step faster
    slow = batch_size.step_costs("llama2-1b", "dgx-a100-80gb", [64, 512], [8], scale_out_GBps_per_gpu=1.0)
    assert (slow["step_time_s"].values >= ds["step_time_s"].sel(global_batch=[64, 512], nodes=[8]).values - 1e-12).all()


def test_study_labels_every_variable_and_compare_gives_a_well_formed_record(tmp_path):
    ds = batch_size.batch_size_study(global_batches=[8, 64, 512], nodes=[1, 8], n_samples=512, dim=16, hidden=4,
                                     lrs=[0.4, 1.6], budget_steps=50, budget_samples=4000, evals_per_run=50,
                                     scale_out_sweep_GBps_per_gpu=[3.125, 25.0], sweep_target_gaps=[0.1, 0.2])
    # the merge of the two halves keeps every variable's units and long name
    for name in list(ds.data_vars) + list(ds.coords):
        assert "units" in ds[name].attrs and "long_name" in ds[name].attrs, name
    # no override: the catalog's scale-out bandwidth, and the sweep's point at that bandwidth is the headline
    setting = json.loads(ds.attrs["parameters"])
    assert setting["scale_out_from_catalog"] and setting["scale_out_GBps_per_gpu"] == 25.0
    # the sweep's point at the run's bandwidth and target is the headline; the main target joins the swept ones
    assert ds["target_gap"].values.tolist() == [0.05, 0.1, 0.2]
    np.testing.assert_array_equal(ds["best_steps_by_gap"].sel(target_gap=0.05).values, ds["best_steps"].values)
    assert float(ds["sweep_largest_over_fastest_time"].sel(scale_out_GBps_per_gpu=25.0, target_gap=0.05)) == pytest.approx(
        float(ds["largest_over_fastest_time"]))
    t = ds["time_to_target_s"].values
    assert float(ds["largest_over_fastest_time"]) == pytest.approx(t[-1, -1] / np.nanmin(t))
    tsio.write_dataset(ds, tmp_path / "batch_size.nc")
    records = batch_size.compare(tmp_path)
    assert len(records) == 2 and {r.study for r in records} == {STUDY}
    assert len({r.quantity for r in records}) == 2 and all(r.verdict in comparison.VERDICTS for r in records)
    assert records[0].verdict in comparison.VERDICTS and not records[0].same_setting
    assert records[0].free_parameter.startswith("scale-out bandwidth")
    assert (records[0].our_low, records[0].our_high) == pytest.approx(
        (np.nanmin(ds["sweep_largest_over_fastest_time"].values), np.nanmax(ds["sweep_largest_over_fastest_time"].values)))
    assert comparison.diff_records(batch_size.compare(tmp_path), records) == []


@pytest.mark.parametrize("kwargs, field", [
    ({"global_batches": [64, 4]}, "global_batches"),
    ({"lrs": [0.1, -1.0]}, "lrs"),
    ({"target_gap": 1.5}, "target_gap"),
    ({"budget_steps": 0}, "budget_steps"),
])
def test_bad_sweep_input_names_the_field(kwargs, field):
    with pytest.raises(SpecError) as err:
        batch_size.steps_to_target_sweep(**{**SMALL, **kwargs})
    assert err.value.field == field


def test_bad_study_input_names_the_field():
    with pytest.raises(SpecError) as err:
        batch_size.batch_size_study(price_per_node_hour=-1.0)
    assert err.value.field == "price_per_node_hour"
    with pytest.raises(SpecError) as err:
        batch_size.step_costs("llama2-1b", "dgx-a100-80gb", [8], [0])
    assert err.value.field == "nodes"
