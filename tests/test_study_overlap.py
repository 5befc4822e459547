"""overlap (Lee et al. 2025, arXiv 2507.03114): fast unit tests of the study functions and of its paper
comparison (records), and the plumbing of the quick workflow's outputs. The comparison with the paper is
judged on the committed full datasets by ``trainscale verify``, not here."""

import numpy as np
import pytest
from trainscale.common import comparison
from trainscale.common import io as tsio
from trainscale.model.specs import SpecError
from trainscale.studies import overlap as study

STUDY = "overlap"


def _datasets(results):
    folder = results / "figures" / STUDY
    return tsio.read_dataset(folder / "overlap.nc"), tsio.read_dataset(folder / "message_size.nc")


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


def test_modes_power_and_caps_are_ordered():
    ds = study.overlap_study(**SMALL)
    full = ds.sel(power_cap=1.0)
    valid = full["valid"].values
    step = full["step_time_s"]
    for i in np.argwhere(valid):
        s = step.values[tuple(i)]
        assert s[0] > s[1] > s[2]  # sequential > overlapped > ideal
    assert np.all(full["sequential_over_overlapped"].values[valid] > 0)
    # FP8 on H100 slows down more than BF16 (closer to the memory roof)
    h100 = full.sel(system="dgx-h100")
    assert np.all(h100["compute_slowdown"].sel(precision="fp8") > h100["compute_slowdown"].sel(precision="bf16"))
    # overlap raises mean power; a lower cap slows every mode
    assert np.all(full["power_mean_W"].sel(mode="overlapped").values[valid]
                  > full["power_mean_W"].sel(mode="sequential").values[valid])
    low = ds.sel(power_cap=float(ds["power_cap"].min()))
    assert np.all(low["step_time_s"].values[valid] > step.values[valid])


def test_slowdown_grows_with_message_size():
    sw = study.message_size_sweep("gpt-1.7b", ["dgx-h100"], ["bf16"], [4096.0, 65536.0, 1048576.0, 16777216.0, 1e9])
    slow = sw["contention_slowdown"].sel(precision="bf16")
    assert np.all(np.diff(slow.values, axis=-1) >= -1e-12)


def test_compare_records_are_well_formed(tmp_path):
    ds = study.overlap_study(**{**SMALL, "systems": ["dgx-a100-80gb", "dgx-h100", "mi300x"]})
    tsio.write_dataset(ds, tmp_path / "overlap.nc")
    records = study.compare(tmp_path)
    assert len(records) == 4 and len({r.quantity for r in records}) == 4
    for r in records:
        assert r.study == STUDY and r.verdict in comparison.VERDICTS and np.isfinite(r.our_value)
        assert not r.same_setting  # the paper's models, batch and MI250/MI210 are not ours
    full = ds.sel(power_cap=1.0, system=list(study.PAPER_SYSTEMS))
    slow = full["compute_slowdown"].values[full["valid"].values]
    assert records[0].our_value == pytest.approx(slow.mean()) and records[1].our_value == pytest.approx(slow.max())
    assert comparison.diff_records(records, study.compare(tmp_path)) == []  # deterministic


@pytest.mark.workflow
def test_quick_workflow_writes_the_outputs(quick_workflow):
    folder = quick_workflow / "figures" / STUDY
    for name in study.OUTPUTS:
        assert (folder / name).stat().st_size > 0, name
    written = comparison.read_records(folder / comparison.RECORDS_FILE)
    assert comparison.diff_records(study.compare(folder), written) == []
