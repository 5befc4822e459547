"""HALoS study (Kim et al. 2025): hierarchical asynchronous local SGD vs synchronous DiLoCo and
asynchronous local SGD over slow inter-region links. Unit tests of the study functions, and the
paper's effect on the quick workflow's outputs."""

import math

import numpy as np
import pytest
from conftest import notebook_text

from trainscale import io as tsio
from trainscale.specs import SpecError
from trainscale.studies import hierarchical_local_sgd as study

STUDY = "hierarchical-local-sgd"
TINY = dict(n_samples=256, dim=4, hidden=4, rounds=6, lrs=[0.01], outer_lrs=[0.5], sweep_fractions=[0.3, 0.5],
            batch_size=4, H=2, updates_per_push=2)




# ---------------------------------------------------------------------------------------------
# unit tests (no workflow)


def test_bad_input_raises_spec_error_naming_the_field():
    with pytest.raises(SpecError) as err:
        study.build_setting(speed_min=0.0)
    assert err.value.field == "speed_min"
    with pytest.raises(SpecError) as err:
        study.build_setting(target_fraction=1.5)
    assert err.value.field == "target_fraction"
    with pytest.raises(SpecError) as err:
        study.build_setting(no_such_parameter=1)
    assert err.value.field == "no_such_parameter"
    with pytest.raises(SpecError) as err:
        study.method_timing(study.build_setting(**TINY), "sync")
    assert err.value.field == "method"


def test_message_times_follow_the_links():
    s = study.build_setting(**TINY)
    nbytes = s["step"].message_bytes
    hier = study.method_timing(s, "hierarchical")
    # a region's push over its own inter-region link: bytes / bandwidth + latency
    expected = nbytes / (s["inter_Gbps"] * 0.125e9) + s["q"]["inter_latency_s"]
    np.testing.assert_allclose(hier["region_comm_s"], expected, rtol=1e-9)
    # workers reach their regional server over the fast link, far sooner
    assert hier["worker_comm_s"].max() < 0.01 * hier["region_comm_s"].min()
    flat = study.method_timing(s, "async_local")
    server = flat["server_region"]
    assert server == int(np.argmax(s["inter_Gbps"]))
    inside = s["region_of"] == server
    np.testing.assert_allclose(flat["worker_comm_s"][inside], hier["worker_comm_s"][inside])
    np.testing.assert_allclose(flat["worker_comm_s"][~inside], hier["region_comm_s"][s["region_of"][~inside]])
    # a shared uplink is slower for the workers outside the server's region
    shared = study.method_timing(study.build_setting(**TINY, uplink_shared=True), "async_local")
    assert (shared["worker_comm_s"][~inside] > flat["worker_comm_s"][~inside]).all()
    # DiLoCo's all-reduce is gated by the slowest region and grows as bandwidth shrinks
    slow = study.method_timing(s, "diloco", scale=0.5)["comm_s"]
    assert slow > study.method_timing(s, "diloco")["comm_s"] > hier["region_comm_s"].min()


def test_comparison_is_deterministic_and_well_formed():
    a = study.halos_comparison(**TINY)
    b = study.halos_comparison(**TINY)
    assert a.identical(b)
    assert list(a["method"].values) == list(study.METHODS)
    for name, var in a.data_vars.items():
        assert "units" in var.attrs and "long_name" in var.attrs, name
    # same budget: every method processes the same examples per evaluation
    np.testing.assert_allclose(a["samples"].values, a["samples"].values[:1].repeat(3, axis=0))
    assert (np.diff(a["time_s"].values, axis=1) > 0).all()
    assert a.attrs["target_loss"] < a.attrs["initial_loss"]
    assert a.attrs["model_params"] > 1e9 and a.attrs["synthetic_params"] == 4 * 4 + 4 + 4 + 1
    sweep = study.bandwidth_sweep(a, [1.0, 4.0])
    ttt = sweep["time_to_target_s"].values
    # the unscaled point reproduces the comparison's times
    np.testing.assert_allclose(ttt[0], a["time_to_target_s"].values, equal_nan=True)
    # more inter-region bandwidth never slows synchronous DiLoCo
    if np.isfinite(ttt[:, 0]).all():
        assert ttt[1, 0] < ttt[0, 0]


# ---------------------------------------------------------------------------------------------
# the paper's effect on the quick workflow's outputs


@pytest.mark.workflow
def test_hierarchical_converges_fastest_in_wall_clock(quick_workflow):
    ds = tsio.read_dataset(quick_workflow / "figures" / STUDY / "comparison.nc")
    ttt = dict(zip(ds["method"].values.tolist(), ds["time_to_target_s"].values.tolist()))
    assert all(math.isfinite(v) for v in ttt.values()), ttt
    # HALoS < asynchronous local SGD < synchronous DiLoCo in time to the target loss
    assert ttt["hierarchical"] < ttt["async_local"] < ttt["diloco"], ttt
    # synchronous DiLoCo is slowed several-fold by all-reduces over the slowest inter-region link
    assert ttt["diloco"] / ttt["hierarchical"] > 5.0
    assert ttt["async_local"] / ttt["hierarchical"] > 1.2
    # and HALoS ends below asynchronous local SGD (stale, non-IID updates stall the flat server)
    final = dict(zip(ds["method"].values.tolist(), ds["final_loss"].values.tolist()))
    assert final["hierarchical"] < final["async_local"]
    # the speed-ups stored are the ratios of the times
    speed = dict(zip(ds["method"].values.tolist(), ds["speedup_of_hierarchical"].values.tolist()))
    assert speed["diloco"] == pytest.approx(ttt["diloco"] / ttt["hierarchical"], rel=1e-12)


@pytest.mark.workflow
def test_speedup_over_diloco_holds_across_bandwidths(quick_workflow):
    sweep = tsio.read_dataset(quick_workflow / "figures" / STUDY / "bandwidth.nc")
    assert (sweep["speedup_vs_diloco"].values > 1.0).all()


@pytest.mark.workflow
def test_notebook_prints_the_comparison(quick_workflow):
    ds = tsio.read_dataset(quick_workflow / "figures" / STUDY / "comparison.nc")
    speed = dict(zip(ds["method"].values.tolist(), ds["speedup_of_hierarchical"].values.tolist()))
    text = notebook_text(quick_workflow, STUDY)
    assert (f"time to target: hierarchical {speed['diloco']:.1f}x faster than synchronous DiLoCo (paper: up to 7.5x), "
            f"{speed['async_local']:.1f}x faster than asynchronous local SGD (paper: up to 2.1x)") in text
