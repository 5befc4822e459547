"""Batch-size study (Tyagi & Wang, Tula, arXiv 2603.18112): the critical-batch knee and the
largest configuration against the fastest and cheapest, on the quick workflow's outputs; and
fast unit tests of the study functions."""

import math

import numpy as np
import pytest
from conftest import notebook_text
from trainscale import io as tsio
from trainscale.specs import SpecError
from trainscale.studies import batch_size

STUDY = "batch-size"


def _dataset(results):
    return tsio.read_dataset(results / "figures" / STUDY / "batch_size.nc")




# --------------------------------------------------------------------------- quick workflow outputs
@pytest.mark.workflow
def test_knee_is_near_the_gradient_noise_scale(quick_workflow):
    ds = _dataset(quick_workflow)
    b_crit, b_simple = float(ds["B_crit"]), float(ds["B_simple_mean"])
    assert b_crit > 0 and b_simple > 0
    # McCandlish et al.: the critical batch is of the order of the gradient noise scale
    assert 1 / 4 <= b_crit / b_simple <= 4, f"B_crit {b_crit:.0f} vs B_simple {b_simple:.0f}"
    # and B_simple grows from the start towards the target, bracketing the knee
    assert float(ds["B_simple_start"]) < b_crit < float(ds["B_simple_target"])
    B = ds["global_batch"].values.astype(float)
    assert B.min() < b_crit < B.max(), "the batch grid must straddle the knee"


@pytest.mark.workflow
def test_steps_fall_as_one_over_b_below_the_knee_and_flatten_above(quick_workflow):
    ds = _dataset(quick_workflow)
    B = ds["global_batch"].values.astype(float)
    S = ds["best_steps"].values
    assert np.isfinite(S).all(), "every batch reached the target"
    assert (np.diff(S) <= 0).all(), "more batch never takes more steps (at the best lr)"
    b_crit = float(ds["B_crit"])
    below = np.flatnonzero(B <= b_crit / 4)
    above = np.flatnonzero(B >= 4 * b_crit)
    assert below.size >= 2 and above.size >= 1
    # well below the knee: steps ~ 1/B (4x the batch cuts the steps by at least 2.5x per factor of 4)
    i, j = below[0], below[-1]
    assert S[i] / S[j] >= (B[j] / B[i]) ** 0.66, f"steps {S[i]} -> {S[j]} for B {B[i]:.0f} -> {B[j]:.0f}"
    # well above: within 30% of the fewest steps measured, and the last 4x of batch buys under 25% fewer steps
    assert (S[above] <= 1.3 * S.min()).all()
    assert S[-2] / S[-1] < 1.25


@pytest.mark.workflow
def test_largest_configuration_is_neither_fastest_nor_cheapest(quick_workflow):
    ds = _dataset(quick_workflow)
    t = ds["time_to_target_s"]
    c = ds["cost_to_target"]
    largest = tuple(ds.attrs["largest"])
    assert largest == (int(ds["global_batch"].max()), int(ds["nodes"].max()))
    t_large = float(t.sel(global_batch=largest[0], nodes=largest[1]))
    c_large = float(c.sel(global_batch=largest[0], nodes=largest[1]))
    assert t_large >= 1.5 * float(t.min()), "the largest configuration should be clearly slower than the fastest"
    assert c_large >= 2.0 * float(c.min())
    assert tuple(ds.attrs["fastest"]) != largest and tuple(ds.attrs["cheapest"]) != largest
    # the fastest configuration is near the knee, not at the largest batch
    assert ds.attrs["fastest"][0] < int(ds["global_batch"].max())
    # a batch that does not split over the GPUs is NaN with its reason
    reason = ds["reason"].values
    assert (np.isnan(t.values) == (reason != 0)).all()
    assert (reason == 1).any()


@pytest.mark.workflow
def test_notebook_prints_the_comparison(quick_workflow):
    ds = _dataset(quick_workflow)
    text = notebook_text(quick_workflow, STUDY)
    assert f"critical batch: fitted B_crit = {float(ds['B_crit']):.0f}, gradient noise scale B_simple = " \
           f"{float(ds['B_simple_mean']):.0f}" in text
    fb, fn = ds.attrs["fastest"]
    lb, ln = ds.attrs["largest"]
    assert f"fastest: B={fb}, N={fn}" in text
    assert f"largest (B={lb}, N={ln}) is " in text and "x slower and " in text and "x costlier" in text
    assert "7.5-14%" in text


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
