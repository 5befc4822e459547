"""low-communication (DiLoCoX, Qi et al. 2025, arXiv 2506.21263): the paper's effects on the quick
workflow's outputs, and fast unit tests of the study function."""

import numpy as np
import pytest
from conftest import notebook_text
from trainscale import io as tsio
from trainscale.specs import SpecError
from trainscale.studies import low_communication as lc

STUDY = "low-communication"
BEST = "diloco-delayed-compressed"


def _dataset(results):
    return tsio.read_dataset(results / "figures" / STUDY / "low_communication.nc")




@pytest.mark.workflow
def test_diloco_speedup_at_1_gbps_and_growing_as_bandwidth_falls(quick_workflow):
    ds = _dataset(quick_workflow)
    speedup = ds["speedup"].sel({"method": BEST})
    assert 0.125 in ds["bandwidth_GBps"].values, "the quick grid must include 1 Gb/s (0.125 GB/s)"
    at_1gbps = float(speedup.sel(bandwidth_GBps=0.125))
    assert at_1gbps >= 10.0, f"speedup at 1 Gb/s {at_1gbps:.1f}x < 10x"
    # bandwidth ascending: the speedup falls (grows as bandwidth falls), strictly over the grid
    assert np.all(np.diff(speedup.values) < 0), speedup.values
    # each technique adds: delayed >= plain DiLoCo >= AllReduce, compressed >= delayed, at every bandwidth
    s = ds["speedup"]
    assert np.all(s.sel({"method": "diloco"}).values > 1.0)
    assert np.all(s.sel({"method": "diloco-delayed"}).values >= s.sel({"method": "diloco"}).values - 1e-12)
    assert np.all(s.sel({"method": BEST}).values >= s.sel({"method": "diloco-delayed"}).values - 1e-12)
    # and it wins in time to the target loss too, by at least 10x at 1 Gb/s
    assert float(ds["time_to_target_speedup"].sel({"method": BEST, "bandwidth_GBps": 0.125})) >= 10.0


@pytest.mark.workflow
def test_loss_cost_at_equal_tokens_is_small(quick_workflow):
    ds = _dataset(quick_workflow)
    change = ds["loss_change"].to_series()
    # plain DiLoCo within 10% of AllReduce's final loss; the full recipe within 35% (quick config)
    assert abs(change["diloco"]) <= 0.10, change
    assert change[BEST] <= 0.35, change
    # every method trains: its final loss is under a tenth of its initial loss
    loss = ds["loss"]
    assert np.all(loss.isel(step=-1).values < 0.1 * loss.isel(step=0).values)
    # compression actually compresses
    assert float(ds["compression_ratio"].sel({"method": BEST})) < 0.1
    # measured against what AllReduce achieved, the gap is small: under 2% of its loss reduction
    lost = ds["progress_lost"].to_series()
    assert lost["allreduce"] == 0.0 and lost[BEST] < 0.02, lost
    loss0, final = float(loss.isel(step=0)[0]), ds["final_loss"].values
    assert lost.values == pytest.approx((final - final[0]) / (loss0 - final[0]), rel=1e-12)


@pytest.mark.workflow
def test_notebook_prints_the_comparison(quick_workflow):
    ds = _dataset(quick_workflow)
    sp = float(ds["speedup"].sel({"method": BEST, "bandwidth_GBps": 0.125}))
    change = float(ds["loss_change"].sel({"method": BEST}))
    text = notebook_text(quick_workflow, STUDY)
    assert (f"at 1 Gb/s: DiLoCo with delayed outer step and compression is {sp:.0f}x AllReduce in tokens/s "
            f"(paper: 357x), final loss {change:+.1%} (paper: negligible)") in text
    lost = float(ds["progress_lost"].sel({"method": BEST}))
    assert f"loss cost: {lost:.2%} of AllReduce's loss reduction not reached" in text
    for name in ("tokens_per_s.png", "loss_vs_tokens.png", "loss_vs_time.png"):
        assert (quick_workflow / "figures" / STUDY / name).stat().st_size > 0


# ---------------------------------------------------------------------------------------------
# unit tests (no workflow)

SMALL = {"dim": 8, "hidden": 4, "n_samples": 512, "steps": 100, "H": 10, "batch_size": 8, "bandwidths_GBps": [0.125, 12.5],
             "model": "llama2-7b", "gpus_per_cluster": 8, "batch_per_cluster": 8}


def test_small_study_is_deterministic_and_annotated():
    a = lc.low_communication(**SMALL)
    b = lc.low_communication(**SMALL)
    assert a.identical(b)
    assert set(a.dims) == {"method", "bandwidth_GBps", "step"}
    assert a["method"].values.tolist() == list(lc.METHODS)
    for name in list(a.data_vars) + list(a.coords):
        assert a[name].attrs.get("units") and a[name].attrs.get("long_name"), name
    assert "parameters" in a.attrs and a.attrs["seed"] == 0
    # AllReduce is its own reference; more bandwidth is never slower
    np.testing.assert_allclose(a["speedup"].sel({"method": "allreduce"}).values, 1.0)
    assert np.all(np.diff(a["tokens_per_s"].values, axis=1) >= -1e-9)
    # tokens/s is tokens over the run's wall-clock time
    t_end = a["time_s"].isel(step=-1)
    np.testing.assert_allclose(a["tokens_per_s"].values, float(a["tokens"][-1]) / t_end.values)


def test_allreduce_time_matches_the_ring_formula():
    ds = lc.low_communication(**SMALL, link_latency_s=0.0)
    S, n = float(ds["message_bytes"]), 4
    expected = 2 * (n - 1) / n * S / 0.125e9
    assert float(ds["comm_s"].sel({"method": "allreduce", "bandwidth_GBps": 0.125})) == pytest.approx(expected)
    # sync: every step pays compute + all-reduce
    per_step = float(ds["compute_s"]) + expected
    last = ds["time_s"].sel({"method": "allreduce", "bandwidth_GBps": 0.125}).values[-1]
    assert last == pytest.approx(per_step * int(ds["step"][-1]))


@pytest.mark.parametrize("kwargs, field", [
    ({"bandwidths_GBps": [0.125, -1.0]}, "bandwidths_GBps"),
    ({"steps": 105}, "steps"),
    ({"clusters": 1}, "clusters"),
    ({"compressor": "zip"}, "compressor"),
    ({"compressor_ratio": 1.5}, "compressor_ratio"),
])
def test_bad_input_raises_spec_error_naming_the_field(kwargs, field):
    with pytest.raises(SpecError) as err:
        lc.low_communication(**{**SMALL, **kwargs})
    assert err.value.field == field
