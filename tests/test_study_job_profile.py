"""Job-profile study (Lawenda et al., arXiv 2505.22905): fast unit tests of the study functions, and
the paper's effects on the quick workflow's outputs (LoRA's memory and time advantage, data loading
as the bottleneck with few loader workers, pinned memory never slower)."""

import numpy as np
import pytest
from conftest import notebook_text
from trainscale import io as tsio
from trainscale import jobprofile as J
from trainscale.specs import SpecError
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


# --------------------------------------------------------------------------- quick workflow outputs
@pytest.mark.workflow
def test_lora_memory_and_time_advantage(quick_workflow):
    ft = _read(quick_workflow, "finetuning")
    rank = int(ft.attrs["reference_rank"])
    full, lora, qlora = (ft.sel(tuning=m, rank=rank) for m in ("full", "lora", "qlora"))
    mf, ml, mq = (float(x["total_memory_gib"]) for x in (full, lora, qlora))
    tf, tl, tq = (float(x["step_time_s"]) for x in (full, lora, qlora))
    # LoRA: several times less memory and a faster step (no weight gradients, tiny optimizer)
    assert mf / ml > 3.0, f"LoRA memory {ml:.1f} vs full {mf:.1f} GiB"
    assert 1.2 < tf / tl < 2.0, f"LoRA step {tl:.3f} vs full {tf:.3f} s"
    # QLoRA: least memory, slower than LoRA (dequantisation)
    assert mq < ml and tq > tl
    assert bool(lora["fits"]) and bool(qlora["fits"])
    text = notebook_text(quick_workflow, STUDY)
    assert "LoRA vs full fine-tuning" in text
    assert f"({mf / ml:.2f}x less)" in text and f"({tf / tl:.2f}x faster)" in text


@pytest.mark.workflow
def test_data_loading_is_the_bottleneck_with_few_workers(quick_workflow):
    ovh = _read(quick_workflow, "overheads")
    share = (ovh["data_loading_s"] / ovh["step_time_s"]).sel(host_memory="pinned")
    big = float(ovh["bytes_per_sample"].max())
    w = ovh["workers"].values
    few, many = int(w[w > 0].min()), int(w.max())
    assert float(share.sel(workers=few, bytes_per_sample=big)) > 0.5  # loading dominates the iteration
    assert float(share.sel(workers=many, bytes_per_sample=big)) == 0.0  # enough workers hide it
    step = ovh["step_time_s"]
    assert (step.diff("workers") <= 1e-12).all()
    assert (step.sel(host_memory="pinned") <= step.sel(host_memory="pageable") + 1e-12).all()
    dec = _read(quick_workflow, "decomposition")
    sync = dec["time_s"].sel(precision=dec["precision"].values[0], component="synchronisation").values
    assert (np.diff(sync) > 0).all()  # waiting for the slowest GPU grows with the GPU count
    text = notebook_text(quick_workflow, STUDY)
    assert (f"{float(share.sel(workers=few, bytes_per_sample=big)):.0%} of the iteration with {few} worker(s) per GPU"
            in text)
