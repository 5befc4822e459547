"""overlap (Lee et al. 2025, arXiv 2507.03114): the paper's effects on the quick workflow's outputs,
and fast unit tests of the study functions."""

import numpy as np
import pytest
from conftest import notebook_text
from trainscale import io as tsio
from trainscale.specs import SpecError
from trainscale.studies import overlap as study

STUDY = "overlap"


def _datasets(results):
    folder = results / "figures" / STUDY
    return tsio.read_dataset(folder / "overlap.nc"), tsio.read_dataset(folder / "message_size.nc")


@pytest.mark.workflow
def test_overlap_slows_compute_but_beats_sequential(quick_workflow):
    ds, _ = _datasets(quick_workflow)
    full = ds.sel(power_cap=1.0)
    valid = full["valid"].values
    assert valid.sum() >= 6
    slow = full["compute_slowdown"].values[valid]
    seq = full["sequential_over_overlapped"].values[valid]
    # the paper: 18.9% mean slowdown (max 40%), sequential 10.2% slower (max 26.6%); same size here
    assert 0.10 <= slow.mean() <= 0.35 and slow.max() <= 0.45, slow
    assert 0.03 <= seq.mean() <= 0.25 and np.all(seq > 0), seq
    step = full["step_time_s"]
    for i in np.argwhere(valid):
        s = step.values[tuple(i)]
        assert s[0] > s[1] > s[2]  # sequential > overlapped > ideal
    # FP8 on H100 slows down more than BF16 (closer to the memory roof)
    h100 = full.sel(system="dgx-h100")
    assert np.all(h100["compute_slowdown"].sel(precision="fp8") > h100["compute_slowdown"].sel(precision="bf16"))
    # overlap raises mean power; a lower cap slows every mode
    assert np.all(full["power_mean_W"].sel(mode="overlapped").values[valid]
                  > full["power_mean_W"].sel(mode="sequential").values[valid])
    low = ds.sel(power_cap=float(ds["power_cap"].min()))
    assert np.all(low["step_time_s"].values[valid] > step.values[valid])


@pytest.mark.workflow
def test_slowdown_grows_with_message_size(quick_workflow):
    _, sw = _datasets(quick_workflow)
    slow = sw["contention_slowdown"].sel(precision="bf16")
    assert np.all(np.diff(slow.values, axis=-1) >= -1e-12)
    assert float(slow.isel(message_bytes=0).max()) < 0.02 and float(slow.isel(message_bytes=-1).min()) > 0.1


@pytest.mark.workflow
def test_notebook_prints_the_comparison(quick_workflow):
    ds, _ = _datasets(quick_workflow)
    full = ds.sel(power_cap=1.0)
    valid = full["valid"].values
    slow = full["compute_slowdown"].values[valid]
    seq = full["sequential_over_overlapped"].values[valid]
    text = notebook_text(quick_workflow, STUDY)
    assert (f"overlapped compute slowdown: mean {slow.mean():.1%}, max {slow.max():.1%} (paper: 18.9% mean, up to 40.0%); "
            f"sequential slower than overlapped: mean {seq.mean():.1%}, max {seq.max():.1%} "
            f"(paper: 10.2% mean, up to 26.6%)") in text
    for name in ("step_time.png", "compute_slowdown.png", "power_cap.png", "message_size.png"):
        assert (quick_workflow / "figures" / STUDY / name).stat().st_size > 0


# ---------------------------------------------------------------------------------------------
# unit tests (no workflow)

SMALL = {"models": ["gpt-1.7b"], "systems": ["dgx-a100-80gb", "dgx-h100"], "precisions": ["bf16", "fp8"],
         "power_caps": [1.0, 0.7]}


def test_small_study_is_deterministic_and_annotated():
    a = study.overlap_study(**SMALL)
    b = study.overlap_study(**SMALL)
    assert a.identical(b)
    assert a["mode"].values.tolist() == ["sequential", "overlapped", "ideal"]
    for name in list(a.data_vars) + list(a.coords):
        assert a[name].attrs.get("units") and a[name].attrs.get("long_name"), name
    assert "parameters" in a.attrs
    # A100 has no FP8: masked, not an error
    assert not bool(a["valid"].sel(system="dgx-a100-80gb", precision="fp8").any())
    assert np.isnan(a["step_time_s"].sel(system="dgx-a100-80gb", precision="fp8")).all()
    # tokens/s is tokens over the step
    tokens = 32 * 2048
    np.testing.assert_allclose(a["tokens_per_s"].values, tokens / a["step_time_s"].values)


def test_message_sweep_small_messages_hold_few_sms():
    sw = study.message_size_sweep("gpt-1.7b", ["dgx-h100"], ["bf16"], [4096.0, 1e9])
    assert sw["channels"].values.ravel().tolist() == [1.0, 24.0]
    slow = sw["contention_slowdown"].values.ravel()
    assert slow[0] < 0.02 < slow[1]


@pytest.mark.parametrize("kwargs, field", [
    ({"precisions": ["fp4"]}, "precisions"),
    ({"power_caps": [1.0, 0.05]}, "power_caps"),
    ({"power_caps": [1.5]}, "power_caps"),
    ({"gpus": 1}, "gpus"),
    ({"global_batch": 30}, "global_batch"),
    ({"models": []}, "models"),
    ({"systems": ["nope"]}, "system"),
])
def test_bad_input_raises_spec_error_naming_the_field(kwargs, field):
    with pytest.raises(SpecError) as err:
        study.overlap_study(**{**SMALL, **kwargs})
    assert err.value.field == field
