"""low-communication (DiLoCoX, Qi et al. 2025, arXiv 2506.21263): unit tests of the study function and
its comparison records, and the quick workflow's plumbing (the paper comparison is judged on the committed
full datasets by ``trainscale verify``)."""

import numpy as np
import pytest
from trainscale.common import comparison
from trainscale.common import io as tsio
from trainscale.model.specs import SpecError
from trainscale.studies import low_communication as lc

STUDY = "low-communication"
BEST = "diloco-delayed-compressed"


def _dataset(results):
    return tsio.read_dataset(results / "figures" / STUDY / "low_communication.nc")


@pytest.mark.workflow
def test_quick_outputs_are_written_and_consistent(quick_workflow):
    """Plumbing: the quick run writes its dataset, figures and records; the paper comparison itself is
    judged on the committed full datasets (``trainscale verify``)."""
    ds = _dataset(quick_workflow)
    folder = quick_workflow / "figures" / STUDY
    for name in (*lc.OUTPUTS, comparison.RECORDS_FILE):
        assert (folder / name).stat().st_size > 0, name
    assert comparison.diff_records(lc.compare(folder), comparison.read_records(folder / comparison.RECORDS_FILE)) == []
    # the timing model: each technique adds (delayed >= plain DiLoCo, compressed >= delayed), and the
    # advantage over AllReduce grows as the bandwidth falls
    s = ds["speedup"]
    assert np.all(np.diff(s.sel({"method": BEST}).values) < 0)
    assert np.all(s.sel({"method": "diloco-delayed"}).values >= s.sel({"method": "diloco"}).values - 1e-12)
    assert np.all(s.sel({"method": BEST}).values >= s.sel({"method": "diloco-delayed"}).values - 1e-12)
    # every method trains, and compression actually compresses
    loss = ds["loss"]
    assert np.all(loss.isel(step=-1).values < loss.isel(step=0).values)
    assert float(ds["compression_ratio"].sel({"method": BEST})) < 1.0


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


def test_compare_gives_one_well_formed_record_per_claim(tmp_path):
    ds = lc.low_communication(**SMALL)
    tsio.write_dataset(ds, tmp_path / "low_communication.nc")
    records = lc.compare(tmp_path)
    assert len(records) == 2
    assert {r.study for r in records} == {STUDY}
    assert all(r.verdict in comparison.VERDICTS for r in records)
    assert len({r.quantity for r in records}) == len(records)
    speedup, loss = records
    assert speedup.our_value == pytest.approx(float(ds["speedup"].sel({"method": BEST, "bandwidth_GBps": 0.125})))
    assert speedup.paper_value == lc.PAPER_SPEEDUP and not speedup.same_setting
    final = ds["final_loss"]
    assert loss.our_value == pytest.approx(float(final.sel({"method": BEST}) / final.sel({"method": "allreduce"})))
    assert comparison.diff_records(lc.compare(tmp_path), records) == []  # deterministic


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
