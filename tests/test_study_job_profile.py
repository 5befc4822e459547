"""Job-profile study (Lawenda et al., arXiv 2505.22905): fast unit tests of the study functions and of its
paper comparison (records), and the plumbing of the quick workflow's outputs. The comparison with the paper is
judged on the committed full datasets by ``trainscale verify``, not here."""

import numpy as np
import pytest
import math

from trainscale.common import comparison
from trainscale.common import io as tsio
from trainscale.workloads import jobprofile as J
from trainscale.model.specs import SpecError
from trainscale.studies import job_profile

STUDY = "job-profile"

def _read(results, name):
    return tsio.read_dataset(results / "figures" / STUDY / f"{name}.nc")


# --------------------------------------------------------------------------- unit tests
def test_decomposition_dataset():
    ds = job_profile.decomposition("vit-b16", "dgx-a100-80gb", [1, 2], 64, precisions=["bf16-mixed", "fp32"])
    assert ds["time_s"].dims == ("precision", "gpus", "component")
    np.testing.assert_allclose(ds["time_s"].sum("component"), ds["step_time_s"], rtol=1e-12)
    for name in ds.data_vars:
        assert "units" in ds[name].attrs and "long_name" in ds[name].attrs
    assert "parameters" in ds.attrs and ds.attrs["seed"] == "none"
    assert float(ds["step_time_s"].sel(precision="fp32", gpus=1)) > float(ds["step_time_s"].sel(precision="bf16-mixed", gpus=1))


def test_overheads_monotone():
    ds = job_profile.overheads("vit-b16", "dgx-a100-80gb", 8, 64, [0, 1, 2, 4, 8], [150528.0, 602112.0], [1, 64])
    step = ds["step_time_s"]
    assert (step.diff("workers") <= 1e-12).all()  # more workers never slower
    assert (step.sel(host_memory="pinned") <= step.sel(host_memory="pageable") + 1e-12).all()
    assert (step.diff("bytes_per_sample") >= -1e-12).all()  # bigger samples never faster
    assert float(ds["launch_share"].sel(micro_batch=1)) >= float(ds["launch_share"].sel(micro_batch=64))


def test_finetuning_dataset():
    ds = job_profile.finetuning("llama2-7b", "dgx-a100-80gb", [8, 16])
    mem = ds["total_memory_gib"]
    assert (mem.sel(tuning="qlora") < mem.sel(tuning="lora")).all()
    assert (mem.sel(tuning="lora") < mem.sel(tuning="full")).all()
    assert int(ds["trainable_params"].sel(tuning="lora", rank=16)) == J.lora_trainable_params("llama2-7b", 16)
    assert int(ds["trainable_params"].sel(tuning="full", rank=8)) == ds.attrs["total_params"]


def test_study_errors_name_the_field():
    with pytest.raises(SpecError) as e:
        job_profile.decomposition("vit-b16", "dgx-a100-80gb", [], 64)
    assert e.value.field == "gpus"
    with pytest.raises(SpecError) as e:
        job_profile.decomposition("vit-b16", "dgx-a100-80gb", [1], 64, precisions=["fp8"])
    assert e.value.field == "precisions"
    with pytest.raises(SpecError) as e:
        job_profile.finetuning("llama2-7b", "dgx-a100-80gb", [0])
    assert e.value.field == "ranks"


def test_lora_saves_memory_and_time_and_enough_workers_hide_loading():
    ft = job_profile.finetuning("llama2-7b", "dgx-h100", [16], micro_batch=4, seq_len=512, reference_rank=16)
    full, lora, qlora = (ft.sel(tuning=m, rank=16) for m in ("full", "lora", "qlora"))
    # no weight gradients and a tiny optimizer: LoRA is lighter and faster; QLoRA lighter still, dequantising
    assert float(full["total_memory_gib"]) > float(lora["total_memory_gib"]) > float(qlora["total_memory_gib"])
    assert float(full["step_time_s"]) > float(lora["step_time_s"]) and float(qlora["step_time_s"]) > float(lora["step_time_s"])
    ovh = job_profile.overheads("vit-b16", "dgx-h100", 8, 64, [1, 16], [602112.0], [1, 64])
    share = (ovh["data_loading_s"] / ovh["step_time_s"]).sel(host_memory="pinned", bytes_per_sample=602112.0)
    assert float(share.sel(workers=1)) > 0.5 and float(share.sel(workers=16)) == 0.0
    dec = job_profile.decomposition("vit-b16", "dgx-h100", [1, 2, 8], 64, precisions=["bf16-mixed"])
    sync = dec["time_s"].sel(precision="bf16-mixed", component="synchronisation").values
    assert (np.diff(sync) > 0).all()  # waiting for the slowest GPU grows with the GPU count


def test_directional_records_are_never_partly():
    up = comparison.directional("x", "q", "x", paper_direction=1, paper_setting="p", our_value=1.5,
                                 our_setting="o", neutral=1.0, same_setting=True)
    assert up.verdict == "not tested" and math.isnan(up.paper_value)  # a direction alone has no size to weigh
    assert comparison.directional("x", "q", "x", paper_direction=1, paper_setting="p", our_value=1.0,
                                   our_setting="o", neutral=1.0).verdict == "not reproduced"
    assert comparison.directional("x", "q", "x", paper_direction=1, paper_setting="p", our_value=0.9,
                                   our_setting="o", neutral=1.0).verdict == "not reproduced"


def test_compare_records_are_well_formed(tmp_path):
    dec = job_profile.decomposition("vit-b16", "dgx-h100", [1, 2], 64, precisions=["bf16-mixed", "fp32"])
    ovh = job_profile.overheads("vit-b16", "dgx-h100", 8, 64, [0, 1, 16], [150528.0, 602112.0], [1, 64])
    ft = job_profile.finetuning("llama2-7b", "dgx-h100", [8, 16], reference_rank=16)
    for name, ds in (("decomposition", dec), ("overheads", ovh), ("finetuning", ft)):
        tsio.write_dataset(ds, tmp_path / f"{name}.nc")
    records = job_profile.compare(tmp_path)
    assert len(records) == 7 and len({r.quantity for r in records}) == 7
    for r in records:
        assert r.study == STUDY and r.verdict in comparison.VERDICTS and r.verdict != "reproduced"
        assert np.isfinite(r.our_value) and math.isnan(r.paper_value)
    # the CSV round trip keeps the records (NaN paper values included)
    written = comparison.read_records(comparison.write_records(records, tmp_path / comparison.RECORDS_FILE))
    assert comparison.diff_records(records, written) == []
    assert comparison.diff_records(records, job_profile.compare(tmp_path)) == []  # deterministic


# --------------------------------------------------------------------------- quick workflow plumbing
@pytest.mark.workflow
def test_quick_workflow_writes_the_outputs(quick_workflow):
    folder = quick_workflow / "figures" / STUDY
    for name in job_profile.OUTPUTS:
        assert (folder / name).stat().st_size > 0, name
    written = comparison.read_records(folder / comparison.RECORDS_FILE)
    assert comparison.diff_records(job_profile.compare(folder), written) == []
