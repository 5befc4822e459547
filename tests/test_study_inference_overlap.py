"""inference-overlap (ISO, Xiao & Su 2024, arXiv 2409.11155): fast unit tests of the study function,
and the paper's effect on the quick workflow's outputs."""

import numpy as np
import pytest
from conftest import notebook_text

from trainscale import inference
from trainscale import io as tsio
from trainscale.specs import SpecError
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


def _dataset(results):
    return tsio.read_dataset(results / "figures" / STUDY / "inference_overlap.nc")


@pytest.mark.workflow
def test_iso_savings_are_larger_on_pcie_than_nvlink(quick_workflow):
    ds = _dataset(quick_workflow)
    tp = 8
    assert {"rtx4090-pcie", "a800-pcie", "dgx-a100-80gb"} <= set(ds["system"].values.tolist())
    sav = ds["savings"].sel(tp=tp)
    fits = ds["fits"].sel(tp=tp)
    assert fits.all(), "the quick model must fit on every system at tp 8"
    nvlink = sav.sel(system="dgx-a100-80gb")
    for pcie in ("rtx4090-pcie", "a800-pcie"):
        # at every prompt length, PCIe saves more, and by at least 10 points on average
        assert (sav.sel(system=pcie) > nvlink).all()
        assert float(sav.sel(system=pcie).mean() - nvlink.mean()) >= 0.10
        # the paper's order of magnitude on PCIe: 15-45%
        assert 0.15 <= float(sav.sel(system=pcie).mean()) <= 0.45
    assert float(nvlink.mean()) < 0.15
    # savings peak where communication and compute are comparable (the bandwidth sweep)
    sweep = ds["sweep_savings"].sel(system="rtx4090-pcie")
    ratio = ds["sweep_comm_to_compute"].sel(system="rtx4090-pcie")
    peak = int(np.argmax(sweep.values))
    assert 0.3 <= float(ratio[peak]) <= 3.0
    assert float(sweep[0]) < float(sweep[peak]) and float(sweep[-1]) < float(sweep[peak])


@pytest.mark.workflow
def test_notebook_prints_the_comparison(quick_workflow):
    ds = _dataset(quick_workflow)
    sav = ds["savings"].sel(tp=8)
    text = notebook_text(quick_workflow, STUDY)
    mean = float(sav.sel(system="rtx4090-pcie").mean())
    assert (f"rtx4090-pcie (tp=8, PCIe): ISO saves {mean:.1%} of prefill time on average over "
            f"{ds.sizes['prompt_tokens']} prompt lengths") in text
    assert "ISO's prefill savings are larger on PCIe" in text
    assert "(paper: about 35% on RTX 4090 vs about 15% on A800)" in text
    for name in ("savings.png", "split_ratio.png", "bandwidth.png", "comm_share.png"):
        assert (quick_workflow / "figures" / STUDY / name).stat().st_size > 0
