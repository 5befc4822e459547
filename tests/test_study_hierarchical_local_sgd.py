"""HALoS study (Kim et al. 2025): hierarchical asynchronous local SGD vs synchronous DiLoCo and
asynchronous local SGD over slow inter-region links. Unit tests of the study functions and of its
comparison records, and the quick workflow's plumbing (the paper comparison is judged on the committed
full datasets by ``trainscale verify``)."""

import math

import numpy as np
import pytest

from trainscale.common import comparison
from trainscale.common import io as tsio
from trainscale.model.specs import SpecError
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


def test_compare_gives_one_well_formed_record_per_claim(tmp_path):
    ds = study.halos_comparison(**TINY)
    tsio.write_dataset(ds, tmp_path / "comparison.nc")
    records = study.compare(tmp_path)
    assert len(records) == 3
    assert {r.study for r in records} == {STUDY}
    assert all(r.verdict in comparison.VERDICTS for r in records)
    assert len({r.quantity for r in records}) == len(records)
    # TINY is not the paper's setting (H = 2, K = 2): no record may claim it is
    assert not any(r.same_setting for r in records)
    ttt = dict(zip(ds["method"].values.tolist(), ds["time_to_target_s"].values.tolist()))
    vs_sync = records[0]
    if math.isfinite(ttt["diloco"] / ttt["hierarchical"]):
        assert vs_sync.our_value == pytest.approx(ttt["diloco"] / ttt["hierarchical"])
    # the swept target is named as a free parameter whenever some swept target is reached
    assert vs_sync.free_parameter.startswith("target fraction") or "no swept target" in vs_sync.reason
    final = dict(zip(ds["method"].values.tolist(), ds["final_loss"].values.tolist()))
    assert records[2].our_value == pytest.approx(final["hierarchical"] / final["diloco"])
    assert comparison.diff_records(study.compare(tmp_path), records) == []  # deterministic


def test_defaults_are_the_papers_setting():
    assert all(study.DEFAULTS[k] == v for k, v in study.PAPER_SETTING.items())


# ---------------------------------------------------------------------------------------------
# the quick workflow's plumbing (the paper comparison is judged on the committed full datasets)


@pytest.mark.workflow
def test_quick_outputs_are_written_and_consistent(quick_workflow):
    folder = quick_workflow / "figures" / STUDY
    for name in (*study.OUTPUTS, comparison.RECORDS_FILE):
        assert (folder / name).stat().st_size > 0, name
    assert comparison.diff_records(study.compare(folder), comparison.read_records(folder / comparison.RECORDS_FILE)) == []
    ds = tsio.read_dataset(folder / "comparison.nc")
    ttt = dict(zip(ds["method"].values.tolist(), ds["time_to_target_s"].values.tolist()))
    # the speed-ups stored are the ratios of the times
    speed = dict(zip(ds["method"].values.tolist(), ds["speedup_of_hierarchical"].values.tolist()))
    assert speed["diloco"] == pytest.approx(ttt["diloco"] / ttt["hierarchical"], rel=1e-12, nan_ok=True)
    sweep = tsio.read_dataset(folder / "bandwidth.nc")
    assert sweep["speedup_vs_diloco"].dims == ("scale",)
