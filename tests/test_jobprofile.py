"""Job profile (trainscale.workloads.jobprofile and its kernels): each formula against a hand computation,
monotonicity of the overheads in their inputs, LoRA/QLoRA parameter counts and memory order."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trainscale.workloads import jobprofile as J
from trainscale.kernels import jobprofile as JK
from trainscale.model.specs import SpecError


# --------------------------------------------------------------------------- formulas by hand
def test_loader_exposed_by_hand():
    # 64 samples of 1 MB, 4 workers at 100 MB/s: 0.16 s to load, 0.1 s of GPU work -> 0.06 s exposed
    assert JK.loader_exposed_s(64, 4, 100e6, 1e6, 16.0, 0.1) == pytest.approx(0.06)
    # capped by the host's cores per GPU: 4 workers on 2 cores load at 200 MB/s
    assert JK.loader_exposed_s(64, 4, 100e6, 1e6, 2.0, 0.1) == pytest.approx(0.32 - 0.1)
    # no workers: the training process decodes in series, nothing hidden
    assert JK.loader_exposed_s(64, 0, 100e6, 1e6, 16.0, 0.1) == pytest.approx(0.64)
    assert JK.loader_exposed_s(64, 16, 100e6, 1e6, 16.0, 0.1) == 0.0


def test_h2d_copy_by_hand():
    assert JK.h2d_copy_s(24e9, 24e9, 1, 2) == pytest.approx(1.0)
    assert JK.h2d_copy_s(24e9, 24e9, 8, 2) == pytest.approx(2.0)  # two GPUs share one switch uplink


def test_launch_by_hand():
    k = JK.kernels_per_step(12, 40, 2.0, 20, 1)
    assert k == 12 * 40 * 3 + 20
    assert JK.launch_exposed_s(k, 1e-5, 0.01) == pytest.approx(k * 1e-5 - 0.01)
    assert JK.launch_exposed_s(k, 1e-5, 1.0) == 0.0


def test_expected_max_normal_closed_forms():
    assert JK.expected_max_normal(1) == 0.0
    assert JK.expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-9)
    assert JK.expected_max_normal(3) == pytest.approx(1.5 / math.sqrt(math.pi), rel=1e-9)
    values = [JK.expected_max_normal(n) for n in range(1, 9)]
    assert all(b > a for a, b in zip(values, values[1:]))
    assert values[-1] == pytest.approx(1.4236, abs=1e-4)  # tabulated E[max of 8]


def test_sync_by_hand():
    assert JK.sync_s(2, 2e-5, 0.01, 0.1, 1) == pytest.approx(4e-5)
    assert JK.sync_s(2, 2e-5, 0.01, 0.1, 2) == pytest.approx(4e-5 + 0.001 / math.sqrt(math.pi))


def test_nf4_bits():
    assert J.nf4_bits_per_param(True) == pytest.approx(4 + 8 / 64 + 32 / (64 * 256))  # QLoRA's 4.127
    assert J.nf4_bits_per_param(False) == pytest.approx(4.5)


# --------------------------------------------------------------------------- monotonicity
@settings(max_examples=200, deadline=None)
@given(samples=st.integers(1, 512), workers=st.integers(0, 32), rate=st.floats(1e6, 1e9),
       nbytes=st.floats(1e3, 1e7), cores=st.floats(1, 64), busy=st.floats(0, 1))
def test_more_workers_never_slower(samples, workers, rate, nbytes, cores, busy):
    a = JK.loader_exposed_s(samples, workers, rate, nbytes, cores, busy)
    b = JK.loader_exposed_s(samples, workers + 1, rate, nbytes, cores, busy)
    assert b <= a + 1e-12 and a >= 0.0


@settings(max_examples=200, deadline=None)
@given(workers=st.integers(0, 16), nbytes=st.floats(1e3, 1e7), gpus=st.integers(1, 8), busy=st.floats(0, 0.5),
       pinned=st.floats(1e9, 64e9), frac=st.floats(0.05, 1.0))
def test_pinned_never_slower(workers, nbytes, gpus, busy, pinned, frac):
    """Step = busy + copy + exposed loading; pinned memory has the higher bandwidth."""
    load, copy = np.zeros((2, 1, 1)), np.zeros((2, 1, 1))
    JK.data_loading_grid(64.0, np.array([workers]), np.array([nbytes]), np.array([pinned, pinned * frac]), 1e8,
                         16.0, gpus, 2, busy, load, copy)
    step = busy + copy + load
    assert step[0, 0, 0] <= step[1, 0, 0] + 1e-12


def test_profile_components_sum_and_grow_with_gpus():
    rs = [J.profile("vit-b16", "dgx-a100-80gb", g, 64, workers=4) for g in (1, 2, 4, 8)]
    for r in rs:
        assert r.step_time_s == pytest.approx(sum(r.components.values()))
        assert all(v >= 0 for v in r.components.values())
    assert rs[0].components["all_reduce"] == 0.0
    sync = [r.components["synchronisation"] for r in rs]
    assert all(b > a for a, b in zip(sync, sync[1:]))
    more = J.profile("vit-b16", "dgx-a100-80gb", 8, 64, workers=16)
    assert more.step_time_s <= rs[-1].step_time_s and more.components["data_loading"] == 0.0


def test_fp32_is_slower_and_heavier():
    bf16, fp32 = (J.profile("vit-b16", "dgx-a100-80gb", 1, 64, workers=16, precision=p) for p in ("bf16-mixed", "fp32"))
    assert fp32.components["compute"] > 5 * bf16.components["compute"]
    assert fp32.memory_gib_per_gpu > bf16.memory_gib_per_gpu


# --------------------------------------------------------------------------- fine-tuning
def test_lora_trainable_params_exact():
    # PEFT's well-known count for Llama-2-7B, r = 8 on q_proj and v_proj: 4,194,304
    assert J.lora_trainable_params("llama2-7b", 8, ["q", "v"]) == 4_194_304
    # a small model by hand: 2 layers, h = 8, 2 heads of 4 with 1 KV head (kv = 4), f = 16, swiglu
    tiny = {"name": "tiny", "layers": 2, "hidden": 8, "heads": 2, "kv_heads": 1, "ffn_hidden": 16,
            "ffn_type": "swiglu", "vocab": 10, "seq_len": 4}
    r = 2
    per_layer = r * ((8 + 8) + (8 + 4) + (8 + 4) + (8 + 8) + (8 + 16) + (8 + 16) + (16 + 8))
    assert J.lora_trainable_params(tiny, r) == 2 * per_layer
    assert J.quantised_params(tiny) == 2 * (64 + 32 + 32 + 64 + 3 * 128)


def test_memory_order_and_lora_time():
    f, l, q = (J.finetune("llama2-7b", "dgx-a100-80gb", m, rank=16, seq_len=512, micro_batch=4) for m in J.METHODS)
    assert q.memory_gib < l.memory_gib < f.memory_gib
    assert not f.fits and l.fits and q.fits
    # LoRA drops the weight gradients: roughly 2/3 of a full step's compute, far less optimizer work
    assert l.step_time_s < f.step_time_s
    assert l.time_s["weight_gradients"] == 0.0 and f.time_s["weight_gradients"] > 0.0
    full_compute = f.time_s["frozen_compute"] + f.time_s["weight_gradients"]
    assert 0.6 < f.time_s["frozen_compute"] / full_compute < 0.8
    # QLoRA: dequantisation on top of LoRA, NF4 weights at 4.127 bits
    assert q.step_time_s > l.step_time_s and q.time_s["dequantisation"] > 0.0
    assert q.trainable_params == l.trainable_params == J.lora_trainable_params("llama2-7b", 16)


def test_errors_name_the_field():
    with pytest.raises(SpecError) as e:
        J.profile("vit-b16", "dgx-a100-80gb", 16, 64)
    assert e.value.field == "gpus"
    with pytest.raises(SpecError) as e:
        J.lora_trainable_params("vit-b16", 8, ["gate"])  # GELU MLP has no gate matrix
    assert e.value.field == "targets"
    with pytest.raises(SpecError) as e:
        J.finetune("llama2-7b", "dgx-a100-80gb", "dpo")
    assert e.value.field == "method"
    with pytest.raises(SpecError) as e:
        J.profile("vit-b16", "dgx-v100", 1, 8, precision="tf32")
    assert e.value.field == "precision"
    with pytest.raises(SpecError) as e:
        J.profile("vit-b16", "dgx-a100-80gb", 1, 8, workers=-1)
    assert e.value.field == "workers"
