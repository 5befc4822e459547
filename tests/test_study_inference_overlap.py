"""inference-overlap (ISO, Xiao & Su 2024, arXiv 2409.11155): fast unit tests of the study function and
of its paper comparison (records), and the plumbing of the quick workflow's outputs. The comparison with the
paper is judged on the committed full datasets by ``trainscale verify``, not here."""

import numpy as np
import pytest

from trainscale.common import comparison
from trainscale.model import inference
from trainscale.common import io as tsio
from trainscale.model.specs import SpecError
from trainscale.studies import inference_overlap as study
from trainscale.studies.inference_overlap import inference_overlap

STUDY = "inference-overlap"
SMALL = dict(model="llama2-13b", systems=["rtx4090-pcie", "dgx-a100-80gb"], tps=[2, 8], prompt_tokens=[256, 1024],
             split_ratios=[0.0, 0.25, 0.5, 0.75, 1.0], bandwidths_GBps=[10, 300], sweep_tp=8,
             sweep_prompt_tokens=1024)

@pytest.fixture(scope="module")
def small():
    return inference_overlap(**SMALL)


def test_dataset_is_consistent_with_the_api(small):
    for var in small.data_vars.values():
        assert var.attrs["units"] and var.attrs["long_name"]
    p = inference.prefill("llama2-13b", "rtx4090-pcie", 8, 1024, 0.5)
    assert float(small["prefill_s"].sel(system="rtx4090-pcie", tp=8, prompt_tokens=1024, split_ratio=0.5)) == p.time_s
    assert float(small["serial_s"].sel(system="rtx4090-pcie", tp=8, prompt_tokens=1024)) == p.serial_time_s
    # ratio 0 and 1 are both the serial execution; the best split is never worse than serial
    np.testing.assert_array_equal(small["prefill_s"].sel(split_ratio=0.0), small["prefill_s"].sel(split_ratio=1.0))
    assert (small["iso_s"] <= small["serial_s"]).all()
    assert ((small["savings"] >= 0) & (small["savings"] < 0.5)).all()
    # the sweep at the system's own bandwidth is the grid's value
    sav = float(small["sweep_savings"].sel(system="rtx4090-pcie", bandwidth_GBps=10))
    assert sav == pytest.approx(float(small["savings"].sel(system="rtx4090-pcie", tp=8, prompt_tokens=1024)))
    assert small.attrs["seed"] == "none"


def test_iso_saves_more_on_pcie_than_on_nvlink(small):
    sav = small["savings"].sel(tp=8)
    assert (sav.sel(system="rtx4090-pcie") > sav.sel(system="dgx-a100-80gb")).all()


def test_deterministic(small):
    again = inference_overlap(**SMALL)
    for name in small.data_vars:
        np.testing.assert_array_equal(small[name].values, again[name].values)


def test_errors_name_the_field():
    with pytest.raises(SpecError) as err:
        inference_overlap(**{**SMALL, "tps": [3]})
    assert err.value.field == "tps"
    with pytest.raises(SpecError) as err:
        inference_overlap(**{**SMALL, "split_ratios": [0.5]})
    assert err.value.field == "split_ratios"
    with pytest.raises(SpecError) as err:
        inference_overlap(**{**SMALL, "bandwidths_GBps": [0.0]})
    assert err.value.field == "bandwidths_GBps"
    with pytest.raises(SpecError) as err:
        inference_overlap(**{**SMALL, "systems": ["no-such-system"]})
    assert err.value.field == "system"


def test_savings_peak_where_communication_meets_compute():
    ds = inference_overlap(**{**SMALL, "systems": ["rtx4090-pcie"], "bandwidths_GBps": [2, 5, 10, 20, 50, 100, 300, 900],
                              "tps": [8]})
    sweep = ds["sweep_savings"].sel(system="rtx4090-pcie")
    ratio = ds["sweep_comm_to_compute"].sel(system="rtx4090-pcie")
    peak = int(np.argmax(sweep.values))
    assert 0.3 <= float(ratio[peak]) <= 3.0
    assert float(sweep[0]) < float(sweep[peak]) and float(sweep[-1]) < float(sweep[peak])


def test_compare_records_are_well_formed(tmp_path):
    ds = inference_overlap(**{**SMALL, "model": "llama2-70b", "systems": list(study.PAPER_SYSTEMS.values())
                              + [study.ALTERNATIVE_A800], "tps": [8], "prompt_tokens": [1024, 4096]})
    tsio.write_dataset(ds, tmp_path / "inference_overlap.nc")
    records = study.compare(tmp_path)
    assert len(records) == 3
    assert len({r.quantity for r in records}) == len(records)
    for r in records:
        assert r.study == STUDY and r.verdict in comparison.VERDICTS
        assert np.isfinite(r.our_value) and r.free_parameter and r.our_low <= r.our_value <= r.our_high
    by = {r.quantity: r for r in records}
    sav = ds["savings"].sel(tp=8)
    assert by["ISO prefill time saved, RTX 4090 (fraction)"].our_value == pytest.approx(
        float(sav.sel(system="rtx4090-pcie").mean()))
    diff = by["ISO saving on RTX 4090 minus saving on A800 (fraction)"]
    assert diff.our_value == pytest.approx(float((sav.sel(system="rtx4090-pcie") - sav.sel(system="a800-sxm")).mean()))
    # the A800's interconnect is an assumption: never judged as the paper's own setting
    assert not by["ISO prefill time saved, A800 (fraction)"].same_setting and not diff.same_setting
    assert comparison.diff_records(records, study.compare(tmp_path)) == []  # deterministic


@pytest.mark.workflow
def test_quick_workflow_writes_the_outputs(quick_workflow):
    folder = quick_workflow / "figures" / STUDY
    for name in study.OUTPUTS:
        assert (folder / name).stat().st_size > 0, name
    ds = tsio.read_dataset(folder / "inference_overlap.nc")
    assert set(study.PAPER_SYSTEMS.values()) <= set(ds["system"].values.tolist())
    written = comparison.read_records(folder / comparison.RECORDS_FILE)
    assert comparison.diff_records(study.compare(folder), written) == []
